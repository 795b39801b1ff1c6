"""Tokenizer command-line flags and their checks; kept free of heavy imports so parsers build fast.
The types, the files each reads and how the type is resolved: megatron/tokenizer/types.py.
"""
import argparse
import dataclasses

from megatron.errors import ArgumentError, ConfigError
from megatron.tokenizer.types import (
    DEFAULT_TOKENIZER_TYPE,
    GPT2_FILES_DEFAULT_TYPE,
    TOKENIZER_TYPES,
    TokenizerConfig,
    tokenizer_config,
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


def tokenizer_config_from_args(args) -> TokenizerConfig:
    """:func:`tokenizer_config` of the five tokenizer flags of parsed ``args`` (every dest must be
    there: a parser with the tokenizer flag group, whose ``tokenizer_type_note`` defaults to
    None); a type validation resolved keeps its note."""
    config = tokenizer_config(args.tokenizer_type, args.vocab_file, args.merge_file,
                              args.tokenizer_model, args.tokenizer_name_or_path)
    return dataclasses.replace(config,
                               tokenizer_type_note=config.tokenizer_type_note or args.tokenizer_type_note)


def tokenizer_setup_from_args(args):
    """megatron/tokenizer/tokenizer.py ``tokenizer_setup`` of the run's typed configs
    (``args.run_config.tokenizer`` and ``.vocab``): the tokenizer, its embedding rows and the
    start-up lines; nothing is written into ``args`` (:func:`apply_tokenizer_setup` does)."""
    from megatron.tokenizer.tokenizer import tokenizer_setup  # lazy: megatron-core (seconds); parsers build fast

    return tokenizer_setup(args.run_config.tokenizer, args.run_config.vocab)


def apply_tokenizer_setup(args):
    """:func:`tokenizer_setup_from_args`, assigned to ``args.tokenizer``,
    ``args.padded_vocab_size`` and ``args.vocab_size`` (what the entry points' model and datasets
    providers read), and returned (its notes are the caller's to print: the entry points hand
    them to the training loop)."""
    setup = tokenizer_setup_from_args(args)
    args.tokenizer = setup.tokenizer
    args.padded_vocab_size = setup.padded_vocab_size
    args.vocab_size = setup.vocab_size
    return setup


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
