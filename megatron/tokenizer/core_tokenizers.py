"""Hugging Face and sentencepiece tokenizers: megatron-core's, with the project's special ids.

Both classes are megatron-core ``GPTTokenizer``s (megatron/core/tokenizers/text), built from a
local path only. They change what megatron-core leaves undefined or unusable for GPT training:

* ``eod`` must exist (documents are separated by it): a tokenizer without one is an error at
  start-up rather than ``None`` in the middle of preprocessing;
* ``pad`` is always a real token id. megatron-core returns ``None`` (Hugging Face without a pad
  token) or ``-1`` (sentencepiece models without a pad piece, e.g. Llama's); T0 packing pads token
  ids with it, and an embedding cannot look up -1. Like BigScience's ``PretrainedFromHF`` (and its
  ``_AutoTokenizer.pad``), a missing pad token falls back to ``eod``; padding never counts in the
  loss, so which id pads changes no result.

Token ids are megatron-core's (and the libraries'): ``tokenize`` adds no special tokens
(``--append-eod`` adds ``eod``). BigScience's ``PretrainedFromHF`` calls
``tokenizer.encode(text)``, which is the same for BLOOM's tokenizer (its post-processor adds
nothing); for a tokenizer whose post-processor adds BOS/EOS the project's ids omit them, as
Megatron-LM's ``HuggingFaceTokenizer`` does.
"""
import json
import os
from typing import List, Optional

from megatron.core.tokenizers.text.models import GPTTokenizer

from megatron.errors import ConfigError

# Tokens accepted as end-of-document when a Hugging Face tokenizer declares no eos token, in order.
EOD_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")
HF_TOKENIZER_FILE = "tokenizer.json"


def local_tokenizer_path(path: Optional[str], flag: str, what: str) -> str:
    """``path`` if it names an existing local file or directory, else a ConfigError naming
    ``flag`` and the value. Names that are not local paths (Hub repository ids such as
    ``bigscience/tokenizer``) are errors too: this stack never downloads tokenizers."""
    if not path:
        raise ConfigError(f"{what} needs {flag} to be given (got none)")
    if os.path.isfile(path) or os.path.isdir(path):
        return path
    raise ConfigError(
        f"{flag} {path!r}: no such file or directory ({what}); tokenizers are read from local "
        "files only, never downloaded from the Hugging Face Hub: download it first (e.g. "
        f"`huggingface-cli download {path} --local-dir DIR`) and give DIR")


def _check_tokenizer_file(path: str, flag: str) -> str:
    """The directory transformers should load for the tokenizer file ``path``: the file must be
    a ``tokenizer.json`` holding JSON, and a ``tokenizer_config.json`` beside it (which supplies
    the eos/bos/pad tokens) must hold a JSON object. Raises ConfigError naming ``flag``."""
    try:
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{flag} {path!r} is not a tokenizers JSON file: {exc}") from exc
    if os.path.basename(path) != HF_TOKENIZER_FILE:
        raise ConfigError(
            f"{flag} {path!r}: a tokenizer file must be named {HF_TOKENIZER_FILE} (transformers "
            "reads it from its directory, with the tokenizer_config.json beside it); rename it "
            "or give its directory")
    directory = os.path.dirname(os.path.abspath(path))
    cfg_path = os.path.join(directory, "tokenizer_config.json")
    if os.path.isfile(cfg_path):
        try:
            with open(cfg_path, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{flag} {path!r}: {cfg_path!r} beside it is not valid JSON: {exc}") from exc
        if not isinstance(cfg, dict):
            raise ConfigError(
                f"{flag} {path!r}: {cfg_path!r} beside it must hold a JSON object, got "
                f"{type(cfg).__name__}")
    return directory


class HuggingFaceTokenizer(GPTTokenizer):
    """A Hugging Face tokenizer from a local directory or ``tokenizer.json`` file, loaded by
    megatron-core (``transformers.AutoTokenizer``, fast tokenizer).

    ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model PATH`` (Megatron-LM) and
    ``--tokenizer-type PretrainedFromHF --tokenizer-name-or-path PATH`` (BigScience) both build it.
    ``vocab_size`` is ``len(tokenizer)`` (added tokens included), ``eod`` = ``eos`` is the eos
    token (else the first of ``EOD_CANDIDATES`` in the vocabulary), ``pad`` the pad token (else
    ``eod``), ``bos`` the bos token (else ``eod``).
    """

    def __init__(self, path: Optional[str], flag: str = "--tokenizer-model",
                 type_name: str = "HuggingFaceTokenizer"):
        path = local_tokenizer_path(path, flag, f"{type_name} directory or tokenizer.json")
        directory = path if os.path.isdir(path) else _check_tokenizer_file(path, flag)
        self.type_name = type_name
        try:
            # use_fast: what AutoTokenizer.from_pretrained gives by default (and BigScience used);
            # megatron-core's default would pick a slow (Python) tokenizer where one exists.
            super().__init__(directory, config={"library": "huggingface"}, use_fast=True)
        except Exception as exc:  # megatron-core wraps every transformers failure in ValueError
            raise ConfigError(
                f"{flag} {path!r}: could not load a tokenizer from it: {exc}") from exc
        hf = self._tokenizer.tokenizer
        vocab = hf.get_vocab()
        if hf.eos_token_id is not None:
            self._eod = int(hf.eos_token_id)
        else:
            found = [vocab[t] for t in EOD_CANDIDATES if t in vocab]
            if not found:
                raise ConfigError(
                    f"{flag} {path!r} has no end-of-document token: it declares no eos token "
                    f"and has none of {list(EOD_CANDIDATES)}")
            self._eod = int(found[0])
        self._pad = self._eod if hf.pad_token_id is None else int(hf.pad_token_id)
        self._bos = self._eod if hf.bos_token_id is None else int(hf.bos_token_id)

    @property
    def name(self) -> str:
        """The tokenizer type name, as given to ``--tokenizer-type``."""
        return self.type_name

    def __repr__(self) -> str:
        return f"{self.name}(vocab_size={self.vocab_size}, eod={self.eod}, pad={self.pad})"

    def tokenize(self, text: str) -> List[int]:
        """Token ids of ``text``, without added special tokens: transformers'
        ``encode(text, add_special_tokens=False)``.

        megatron-core's ``text_to_ids`` gives the same ids through token strings
        (``tokenize`` then ``convert_tokens_to_ids``), 1.5x slower in preprocessing (0.32 vs
        0.48 MB/s of demo text, one process), so the encoding is asked for directly.
        """
        return self._tokenizer.tokenizer.encode(text, add_special_tokens=False)

    @property
    def eod(self) -> int:
        """End-of-document id (the eos token, or a conventional end-of-text token)."""
        return self._eod

    @property
    def eos(self) -> int:
        """End-of-sequence id; the same as ``eod``."""
        return self._eod

    @property
    def eos_id(self) -> int:
        """End-of-sequence id; the same as ``eod``."""
        return self._eod

    @property
    def bos(self) -> int:
        """Beginning-of-sequence id (the declared bos token, else ``eod``)."""
        return self._bos

    @property
    def pad(self) -> int:
        """Padding id (the declared pad token, else ``eod`` as BigScience's PretrainedFromHF)."""
        return self._pad

    @property
    def pad_id(self) -> int:
        """Padding id; the same as ``pad``."""
        return self._pad


class SentencePieceTokenizer(GPTTokenizer):
    """A sentencepiece ``.model`` file, loaded by megatron-core's sentencepiece library.

    ``--tokenizer-type GPTSentencePieceTokenizer`` or ``SentencePieceTokenizer`` with
    ``--tokenizer-model FILE`` (megatron-core 0.16's ``build_tokenizer`` treats both names alike,
    without adding special tokens). As Megatron-LM's ``GPTSentencePieceTokenizer``:
    ``vocab_size`` is the model's piece count, ``eod`` = ``eos`` is the model's eos id and
    ``tokenize`` adds neither BOS nor EOS; ``pad`` is the model's pad id, or ``eod`` when the model
    has none (Megatron-LM returns -1 there, which no embedding can look up).
    """

    def __init__(self, model_file: Optional[str], type_name: str = "GPTSentencePieceTokenizer"):
        flag = "--tokenizer-model"
        what = f"{type_name} .model file"
        if not model_file:
            raise ConfigError(f"{what} needs {flag} to be given (got none)")
        if not os.path.isfile(model_file):
            raise ConfigError(f"{flag} {model_file!r}: no such file ({what})")
        self.type_name = type_name
        try:
            super().__init__(model_file, config={"library": "sentencepiece"})
        except Exception as exc:  # sentencepiece raises RuntimeError/OSError on a bad file
            raise ConfigError(
                f"{flag} {model_file!r} is not a sentencepiece model: {exc}") from exc
        sp = self._tokenizer.tokenizer
        if sp.eos_id() < 0:
            raise ConfigError(
                f"{flag} {model_file!r} has no end-of-document token: the sentencepiece model "
                "defines no eos piece (train it with eos_id >= 0)")
        self._eod = int(sp.eos_id())
        self._pad = self._eod if sp.pad_id() < 0 else int(sp.pad_id())

    @property
    def name(self) -> str:
        """The tokenizer type name, as given to ``--tokenizer-type``."""
        return self.type_name

    def __repr__(self) -> str:
        return f"{self.name}(vocab_size={self.vocab_size}, eod={self.eod}, pad={self.pad})"

    @property
    def eod(self) -> int:
        """End-of-document id: the model's eos id."""
        return self._eod

    @property
    def pad(self) -> int:
        """Padding id: the model's pad id, else ``eod``."""
        return self._pad

    @property
    def pad_id(self) -> int:
        """Padding id; the same as ``pad``."""
        return self._pad
