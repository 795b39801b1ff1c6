"""Tokenizer command-line flags and their checks; kept free of heavy imports so parsers build fast.
The types, the files each reads and how the type is resolved: megatron/tokenizer/types.py.
"""
import argparse

from megatron.errors import ArgumentError, ConfigError
from megatron.tokenizer.types import (
    DEFAULT_TOKENIZER_TYPE,
    GPT2_FILES_DEFAULT_TYPE,
    TOKENIZER_TYPES,
    tokenizer_config_from_args,
)


def add_tokenizer_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the tokenizer flag group (``--tokenizer-type``, ``--vocab-file``, ``--merge-file``,
    ``--tokenizer-model``, ``--tokenizer-name-or-path``) to ``parser`` and return it."""
    group = parser.add_argument_group(title="tokenizer")
    group.add_argument(
        "--tokenizer-type", type=str, default=None, choices=TOKENIZER_TYPES,
        help=f"What type of tokenizer to use (default: {GPT2_FILES_DEFAULT_TYPE} when "
             f"--vocab-file/--merge-file are given, as in Megatron-LM, else the embedded "
             f"{DEFAULT_TOKENIZER_TYPE}, which needs no files).",
    )
    group.add_argument("--vocab-file", type=str, default=None,
                       help="GPT-2 BPE vocab.json (GPT2BPETokenizer).")
    group.add_argument("--merge-file", type=str, default=None,
                       help="GPT-2 BPE merges.txt (GPT2BPETokenizer).")
    group.add_argument("--tokenizer-model", type=str, default=None,
                       help="sentencepiece .model file (SentencePieceTokenizer, "
                            "GPTSentencePieceTokenizer), or a local Hugging Face tokenizer "
                            "directory or tokenizer.json file (HuggingFaceTokenizer).")
    group.add_argument("--tokenizer-name-or-path", type=str, default=None,
                       help="Local Hugging Face tokenizer directory or tokenizer.json file "
                            "(PretrainedFromHF); never downloaded from the Hub.")
    parser.set_defaults(tokenizer_type_note=None)  # set by check_tokenizer_args
    return parser


def check_tokenizer_args(args: argparse.Namespace) -> None:
    """Check the tokenizer flags of ``args`` and resolve ``args.tokenizer_type`` (and
    ``args.tokenizer_type_note``, why, for the start-up line) as megatron/tokenizer/types.py
    ``tokenizer_config`` does. Raises ConfigError naming the flags, their values and what is
    allowed."""
    config = tokenizer_config_from_args(args)
    args.tokenizer_type = config.tokenizer_type
    args.tokenizer_type_note = config.tokenizer_type_note


def validate_tokenizer(args) -> None:
    """Tokenizer flags (:func:`check_tokenizer_args`, its ConfigError as an ArgumentError);
    resolves the default --tokenizer-type."""
    try:
        check_tokenizer_args(args)
    except ConfigError as e:
        raise ArgumentError(str(e)) from e
