"""Pretrain a GPT model (megatron-core GPTModel on a DeepSpeed engine).

Launch: ``deepspeed --num_gpus N pretrain_gpt.py [Megatron flags]`` (see README.md).
"""
import os

from megatron.arguments import parse_args
from megatron.errors import run_entry_point
from megatron.data.builder import build_train_valid_test_datasets, dataset_names
from megatron.model.gpt_model import build_gpt_model
from megatron.tokenizer import build_tokenizer
from megatron.training import EvalGroup, TrainData, pretrain


def model_provider(args):
    """The GPT model for ``args`` (vocab padded for the tokenizer)."""
    return build_gpt_model(args)


def datasets_provider(args) -> TrainData:
    """Static blends from ``--data-path``/``--split`` or ``--{train,valid,test}-data-path``."""
    train, valid, test = build_train_valid_test_datasets(args, args.tokenizer)
    groups = []
    if valid is not None:
        groups.append(EvalGroup("valid", valid, "valid"))
    if test is not None:
        groups.append(EvalGroup("test", test, "test"))
    return TrainData(train=train, eval_groups=groups, dataset_names=dataset_names(args))


def main(argv=None):
    """Parse flags, build the tokenizer, train."""
    args = parse_args(argv)
    args.tokenizer = build_tokenizer(args)  # also sets args.padded_vocab_size
    return pretrain(args, datasets_provider, model_provider)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_entry_point(main)
