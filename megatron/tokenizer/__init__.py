"""Tokenizers for this training stack; ``build_tokenizer(args)`` is the entry point, and
``tokenizer_setup(args)`` adds the embedding rows (padded vocabulary) a model of ``args`` needs.

Names are resolved lazily, so importing ``megatron.tokenizer.flags`` (argument parsing) does not
import megatron-core, and only the runs that use the Hugging Face or sentencepiece tokenizers
import transformers (``core_tokenizers``).
"""
import importlib

_FLAGS = ("DEFAULT_TOKENIZER_TYPE", "TOKENIZER_TYPES", "add_tokenizer_args",
          "check_tokenizer_args")
_CORE_TOKENIZERS = ("HuggingFaceTokenizer", "SentencePieceTokenizer")
__all__ = [
    "DEFAULT_TOKENIZER_TYPE",
    "TOKENIZER_TYPES",
    "ByteLevelTokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "add_tokenizer_args",
    "check_tokenizer_args",
    "TokenizerSetup",
    "build_tokenizer",
    "padded_vocab_size",
    "tokenizer_setup",
]


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module 'megatron.tokenizer' has no attribute {name!r}")
    module = importlib.import_module(
        "megatron.tokenizer.flags" if name in _FLAGS
        else "megatron.tokenizer.core_tokenizers" if name in _CORE_TOKENIZERS
        else "megatron.tokenizer.tokenizer")
    return getattr(module, name)
