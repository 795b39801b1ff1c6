"""Tokenizer command-line flags; kept free of heavy imports so parsers build fast."""
import argparse

TOKENIZER_TYPES = ("ByteLevelTokenizer", "HuggingFaceTokenizer", "GPT2BPETokenizer")
DEFAULT_TOKENIZER_TYPE = "ByteLevelTokenizer"


def add_tokenizer_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the tokenizer flag group (``--tokenizer-type``, ``--vocab-file``, ``--merge-file``,
    ``--tokenizer-model``) to ``parser`` and return it."""
    group = parser.add_argument_group(title="tokenizer")
    group.add_argument(
        "--tokenizer-type", type=str, default=DEFAULT_TOKENIZER_TYPE, choices=TOKENIZER_TYPES,
        help="What type of tokenizer to use (default: the embedded ByteLevelTokenizer).",
    )
    group.add_argument("--vocab-file", type=str, default=None,
                       help="GPT-2 BPE vocab.json (GPT2BPETokenizer).")
    group.add_argument("--merge-file", type=str, default=None,
                       help="GPT-2 BPE merges.txt (GPT2BPETokenizer).")
    group.add_argument("--tokenizer-model", type=str, default=None,
                       help="tokenizer.json file or local tokenizer directory "
                            "(HuggingFaceTokenizer).")
    return parser
