"""Tokenizer command-line flags and their checks; kept free of heavy imports so parsers build fast.

Names and meanings follow Megatron-LM (``--tokenizer-type``, ``--vocab-file``, ``--merge-file``,
``--tokenizer-model``) and BigScience's Megatron-DeepSpeed (``--tokenizer-type PretrainedFromHF
--tokenizer-name-or-path``).
"""
import argparse

from megatron.errors import ArgumentError, ConfigError

DEFAULT_TOKENIZER_TYPE = "ByteLevelTokenizer"
# The type --vocab-file/--merge-file mean without --tokenizer-type (Megatron-LM's pretrain_gpt.py
# passes args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}).
GPT2_FILES_DEFAULT_TYPE = "GPT2BPETokenizer"
# --tokenizer-type value -> the flag naming its files (None: needs no files).
TOKENIZER_FILE_FLAGS = {
    "ByteLevelTokenizer": None,
    "GPT2BPETokenizer": ("--vocab-file", "--merge-file"),
    "HuggingFaceTokenizer": ("--tokenizer-model",),  # Megatron-LM's name
    "PretrainedFromHF": ("--tokenizer-name-or-path",),  # BigScience's name
    "SentencePieceTokenizer": ("--tokenizer-model",),
    "GPTSentencePieceTokenizer": ("--tokenizer-model",),
}
TOKENIZER_TYPES = tuple(TOKENIZER_FILE_FLAGS)
FILE_FLAG_ATTRS = {"--vocab-file": "vocab_file", "--merge-file": "merge_file",
                    "--tokenizer-model": "tokenizer_model",
                    "--tokenizer-name-or-path": "tokenizer_name_or_path"}


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
    return parser


def check_tokenizer_args(args: argparse.Namespace) -> None:
    """Check the tokenizer flags of ``args`` and resolve ``args.tokenizer_type``.

    Without ``--tokenizer-type``: ``--vocab-file``/``--merge-file`` mean ``GPT2BPETokenizer``
    (Megatron-LM's and Microsoft Megatron-DeepSpeed's ``pretrain_gpt.py`` default, which their
    public scripts rely on), noted in ``args.tokenizer_type_note`` for the start-up line; no file
    flag means the embedded byte-level tokenizer; other file flags alone (``--tokenizer-model``,
    ``--tokenizer-name-or-path``) are an error, since several types read them. A type that needs
    files needs its flags. Whether the files exist is checked when the tokenizer is built.
    Raises ConfigError naming the flags, their values and what is allowed.
    """
    given = {flag: getattr(args, attr, None) for flag, attr in FILE_FLAG_ATTRS.items()
             if getattr(args, attr, None)}
    ttype = getattr(args, "tokenizer_type", None)
    args.tokenizer_type_note = getattr(args, "tokenizer_type_note", None)  # kept on a re-check
    if ttype is None:
        if "--vocab-file" in given or "--merge-file" in given:
            ttype = args.tokenizer_type = GPT2_FILES_DEFAULT_TYPE
            args.tokenizer_type_note = ("no --tokenizer-type: --vocab-file/--merge-file mean "
                                        f"{GPT2_FILES_DEFAULT_TYPE}, as in Megatron-LM")
        elif given:
            flags = " ".join(f"{flag} {value!r}" for flag, value in given.items())
            raise ConfigError(
                f"{flags} given without --tokenizer-type: name the tokenizer these files are for "
                f"(e.g. --tokenizer-type HuggingFaceTokenizer for a Hugging Face tokenizer, "
                f"SentencePieceTokenizer for a .model file); allowed types: "
                f"{', '.join(TOKENIZER_TYPES)}")
        else:
            args.tokenizer_type = DEFAULT_TOKENIZER_TYPE
            return
    if ttype not in TOKENIZER_FILE_FLAGS:
        raise ConfigError(
            f"unknown --tokenizer-type {ttype!r}; allowed: {', '.join(TOKENIZER_TYPES)}")
    needed = TOKENIZER_FILE_FLAGS[ttype] or ()
    missing = [flag for flag in needed if flag not in given]
    if missing:
        raise ConfigError(f"--tokenizer-type {ttype} needs {' and '.join(needed)}")


def validate_tokenizer(args) -> None:
    """Tokenizer flags (:func:`check_tokenizer_args`, its ConfigError as an ArgumentError);
    resolves the default --tokenizer-type."""
    try:
        check_tokenizer_args(args)
    except ConfigError as e:
        raise ArgumentError(str(e)) from e
