"""Pretrain a GPT model (megatron-core GPTModel on a DeepSpeed engine).

Launch: ``deepspeed --num_gpus N pretrain_gpt.py [Megatron flags]`` (see README.md).
"""
import os

from megatron.runtime.known_warnings import quiet_known_warnings

quiet_known_warnings()

from megatron.config.parser import parse_args
from megatron.config.tokenizer_flags import apply_tokenizer_setup
from megatron.data.builder import build_pretraining_data
from megatron.data.document_segments import with_document_segments
from megatron.data.train_data import TrainData
from megatron.model.gpt_model_pipe import gpt_model_for_layout
from megatron.runtime.process_exit import run_entry_point
from megatron.train.loop import pretrain


def model_provider(args):
    """The GPT model for ``args`` (vocab padded for the tokenizer): ``GPTModel``, or this rank's
    ``GPTModelPipe`` stage with --pipeline-model-parallel-size > 1."""
    run = args.run_config
    return gpt_model_for_layout(run.transformer, run.model, args.padded_vocab_size, args.vocab_size)


def datasets_provider(args, resume=None) -> TrainData:
    """Training set and evaluation groups from the data flags (static blend, curriculum blend
    file, or weighted split paths); ``resume``: the checkpoint whose data ledger a resumed run
    continues (megatron/data/mix_resume.py)."""
    data = build_pretraining_data(args.run_config.data, args.tokenizer, resume)
    if args.reset_attention_mask:
        data = with_document_segments(data, args.tokenizer.eod)
    return data


def main(argv=None, after_checkpoint_files_written=None):
    """Parse flags, build the tokenizer, train (``after_checkpoint_files_written``: see
    ``megatron.train.loop.pretrain``)."""
    args = parse_args(argv)
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    return pretrain(args, datasets_provider, model_provider,
                    after_checkpoint_files_written=after_checkpoint_files_written,
                    notes=setup.notes)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_entry_point(main)
