"""The tokenizer types a run can name and the files each reads; :class:`TokenizerConfig`, the
resolved choice ``build_tokenizer`` takes, and :func:`tokenizer_config`, which resolves it from the
flags' values as Megatron-LM does. No heavy imports: parsers and tools use it.

Names and meanings follow Megatron-LM (``--tokenizer-type``, ``--vocab-file``, ``--merge-file``,
``--tokenizer-model``) and BigScience's Megatron-DeepSpeed (``--tokenizer-type PretrainedFromHF
--tokenizer-name-or-path``).
"""
from dataclasses import dataclass
from typing import Optional

from megatron.errors import ConfigError

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


@dataclass(frozen=True)
class TokenizerConfig:
    """A resolved tokenizer choice (fields are the flags' argparse dests): the type, its files
    (None: not given) and ``tokenizer_type_note``, why the type is what it is when no
    ``--tokenizer-type`` was given (for the start-up line), or None."""

    tokenizer_type: str
    vocab_file: Optional[str]
    merge_file: Optional[str]
    tokenizer_model: Optional[str]
    tokenizer_name_or_path: Optional[str]
    tokenizer_type_note: Optional[str]

    def file_flags(self) -> dict:
        """``{flag: value}`` of the file flags given, in flag order."""
        return {flag: getattr(self, attr) for flag, attr in FILE_FLAG_ATTRS.items()
                if getattr(self, attr)}


def tokenizer_config(tokenizer_type: Optional[str] = None, vocab_file: Optional[str] = None,
                     merge_file: Optional[str] = None, tokenizer_model: Optional[str] = None,
                     tokenizer_name_or_path: Optional[str] = None) -> TokenizerConfig:
    """The :class:`TokenizerConfig` of the tokenizer flags' values (None: the flag not given).

    Without ``--tokenizer-type``: ``--vocab-file``/``--merge-file`` mean ``GPT2BPETokenizer``
    (Megatron-LM's and Microsoft Megatron-DeepSpeed's ``pretrain_gpt.py`` default, which their
    public scripts rely on), said in ``tokenizer_type_note``; no file flag means the embedded
    byte-level tokenizer; other file flags alone (``--tokenizer-model``,
    ``--tokenizer-name-or-path``) are an error, since several types read them. A type that needs
    files needs its flags. Whether the files exist is checked when the tokenizer is built.
    Raises ConfigError naming the flags, their values and what is allowed."""
    config = TokenizerConfig(tokenizer_type, vocab_file, merge_file, tokenizer_model,
                             tokenizer_name_or_path, None)
    given = config.file_flags()
    ttype, note = tokenizer_type, None
    if ttype is None:
        if "--vocab-file" in given or "--merge-file" in given:
            ttype = GPT2_FILES_DEFAULT_TYPE
            note = ("no --tokenizer-type: --vocab-file/--merge-file mean "
                    f"{GPT2_FILES_DEFAULT_TYPE}, as in Megatron-LM")
        elif given:
            flags = " ".join(f"{flag} {value!r}" for flag, value in given.items())
            raise ConfigError(
                f"{flags} given without --tokenizer-type: name the tokenizer these files are for "
                f"(e.g. --tokenizer-type HuggingFaceTokenizer for a Hugging Face tokenizer, "
                f"SentencePieceTokenizer for a .model file); allowed types: "
                f"{', '.join(TOKENIZER_TYPES)}")
        else:
            ttype = DEFAULT_TOKENIZER_TYPE
    if ttype not in TOKENIZER_FILE_FLAGS:
        raise ConfigError(
            f"unknown --tokenizer-type {ttype!r}; allowed: {', '.join(TOKENIZER_TYPES)}")
    needed = TOKENIZER_FILE_FLAGS[ttype] or ()
    missing = [flag for flag in needed if flag not in given]
    if missing:
        raise ConfigError(f"--tokenizer-type {ttype} needs {' and '.join(needed)}")
    return TokenizerConfig(ttype, vocab_file, merge_file, tokenizer_model, tokenizer_name_or_path,
                           note)
