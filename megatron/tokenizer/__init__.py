"""Tokenizers for this training stack; ``build_tokenizer(args)`` is the entry point."""

from .tokenizer import (
    DEFAULT_TOKENIZER_TYPE,
    TOKENIZER_TYPES,
    ByteLevelTokenizer,
    GPT2BPETokenizer,
    HuggingFaceTokenizer,
    add_tokenizer_args,
    build_tokenizer,
    padded_vocab_size,
)

__all__ = [
    "DEFAULT_TOKENIZER_TYPE",
    "TOKENIZER_TYPES",
    "ByteLevelTokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "add_tokenizer_args",
    "build_tokenizer",
    "padded_vocab_size",
]
