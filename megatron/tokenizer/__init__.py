"""Tokenizers for this training stack; ``build_tokenizer(config)`` is the entry point, and
``tokenizer_setup(config, vocab)`` adds the embedding rows (padded vocabulary) the model needs.

Names are resolved lazily, so that only the runs that use the Hugging Face or sentencepiece
tokenizers import transformers (``core_tokenizers``). The tokenizer flags and their checks are
megatron/config/tokenizer_flags.py.
"""
import importlib

_CORE_TOKENIZERS = ("HuggingFaceTokenizer", "SentencePieceTokenizer")
__all__ = [
    "ByteLevelTokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "SentencePieceTokenizer",
    "TokenizerSetup",
    "VocabConfig",
    "build_tokenizer",
    "padded_vocab_size",
    "tokenizer_setup",
]


def __getattr__(name):
    if name not in __all__:
        raise AttributeError(f"module 'megatron.tokenizer' has no attribute {name!r}")
    module = importlib.import_module(
        "megatron.tokenizer.core_tokenizers" if name in _CORE_TOKENIZERS
        else "megatron.tokenizer.tokenizer")
    return getattr(module, name)
