"""pretrain_gpt.py whose training forward step also writes every micro batch it trains on to
``OUT/rank{R}.jsonl`` (tests/e2e/test_mix_edit_e2e.py checks tools/data_provenance.py against them):

    deepspeed ... tests/scripts/record_batches.py OUT [pretrain_gpt.py flags]

One line per training micro batch of this rank, in order: ``{"dp": data-parallel rank, "tokens":
[[...], ...], "last_labels": [...]}`` (the rows' tokens and the label of their last position, the
``seq_length + 1``-th token a sample reads). Only tensor-parallel rank 0 writes (its peers hold
the same batch); evaluation batches are not written.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import pretrain_gpt  # noqa: E402
from megatron.runtime.process_exit import run_entry_point  # noqa: E402


def recording_forward_step(out_dir: str):
    """``gpt_forward_step`` that first appends the training batch to this rank's file."""
    import torch
    from megatron.core import parallel_state

    from megatron.train.steps import gpt_forward_step

    def forward_step(engine, batch):
        if engine.module.training and parallel_state.get_tensor_model_parallel_rank() == 0:
            path = os.path.join(out_dir, f"rank{torch.distributed.get_rank()}.jsonl")
            with open(path, "a") as f:
                f.write(json.dumps({"dp": parallel_state.get_data_parallel_rank(),
                                    "tokens": batch["tokens"].tolist(),
                                    "last_labels": batch["labels"][:, -1].tolist()}) + "\n")
        return gpt_forward_step(engine, batch)

    return forward_step


def main(out_dir: str, argv):
    from megatron.config.parser import parse_args
    from megatron.config.tokenizer_flags import apply_tokenizer_setup
    from megatron.train.loop import pretrain

    os.makedirs(out_dir, exist_ok=True)
    args = parse_args(argv)
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    return pretrain(args, pretrain_gpt.datasets_provider, pretrain_gpt.model_provider,
                    forward_step=recording_forward_step(out_dir), notes=setup.notes)


if __name__ == "__main__":
    # the launcher puts --local_rank=N first; the output directory is the first other argument
    argv = sys.argv[1:]
    position = next(i for i, a in enumerate(argv) if not a.startswith("--local_rank"))
    out = argv.pop(position)
    run_entry_point(lambda: main(out, argv))
