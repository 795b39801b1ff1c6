"""Tokenizers: byte-level (the embedded default), Hugging Face, and GPT-2 BPE files.

Every tokenizer subclasses megatron-core's abstract tokenizer from
``megatron.core.datasets.megatron_tokenizer`` (called ``MegatronTokenizer`` in older releases and
``MegatronLegacyTokenizer`` in megatron-core 0.16), so megatron-core datasets accept them directly.

All of them provide ``tokenize(text) -> list[int]``, ``detokenize(ids) -> str``, ``vocab_size``,
``vocab``, ``inv_vocab``, ``eod``, ``pad``, ``bos`` and ``eos``. ``tokenize`` never adds special
tokens; ``--append-eod`` (preprocessing) or the dataset adds the end-of-document token.
"""

import argparse
import json
import os
from collections import OrderedDict
from typing import Any, Dict, Iterable, List, Optional

from megatron.core.datasets import megatron_tokenizer as _mt

from megatron.errors import ConfigError

# megatron-core renamed the abstract base class; accept either name.
_MegatronTokenizerBase = getattr(_mt, "MegatronTokenizer", None) or _mt.MegatronLegacyTokenizer

from megatron.tokenizer.flags import DEFAULT_TOKENIZER_TYPE, TOKENIZER_TYPES  # noqa: E402

ENDOFTEXT = "<|endoftext|>"
# Tokens accepted as end-of-document when a Hugging Face tokenizer declares no eos token, in order.
EOD_CANDIDATES = (ENDOFTEXT, "</s>", "<|end_of_text|>", "<eos>", "<|eos|>")


def _require_file(path: Optional[str], flag: str, what: str, allow_dir: bool = False) -> str:
    """Return ``path`` if it names an existing file (or directory when ``allow_dir``).

    Raises ValueError naming the command-line ``flag`` and the path otherwise.
    """
    if not path:
        raise ConfigError(f"{what} needs {flag} to be given (got none)")
    if os.path.isfile(path) or (allow_dir and os.path.isdir(path)):
        return path
    kind = "file or directory" if allow_dir else "file"
    raise ConfigError(f"{flag} {path!r}: no such {kind} ({what})")


class _TokenizerBase(_MegatronTokenizerBase):
    """Common base: megatron-core's identifiers without its per-instance deprecation warning.

    megatron-core 0.16's legacy base class logs a deprecation warning from ``__init__``; this
    project builds tokenizers in every preprocessing worker, so it sets the same
    ``unique_identifiers``/``unique_description`` attributes itself instead of calling it.
    """

    def __init__(self, *tokenizer_paths: str, **tokenizer_options: Any):
        self.unique_identifiers = OrderedDict()
        self.unique_identifiers["class"] = type(self).__name__
        self.unique_identifiers["tokenizer_path"] = list(tokenizer_paths)
        for option in tokenizer_options:
            self.unique_identifiers[option] = str(tokenizer_options[option])
        self.unique_description = json.dumps(self.unique_identifiers, indent=4)

    @property
    def name(self) -> str:
        """The tokenizer type name, as given to ``--tokenizer-type``."""
        return type(self).__name__

    def __repr__(self) -> str:
        return f"{self.name}(vocab_size={self.vocab_size}, eod={self.eod})"


class ByteLevelTokenizer(_TokenizerBase):
    """UTF-8 bytes as tokens: ids 0..255 are byte values, 256 is end-of-document, 257 is padding.

    Needs no files, so it is the embedded default. ``vocab_size`` is 258 (unpadded).
    """

    NUM_BYTES = 256
    EOD_ID = 256
    PAD_ID = 257
    EOD_TOKEN = ENDOFTEXT
    PAD_TOKEN = "<pad>"

    def __init__(self):
        super().__init__()
        # Byte tokens are named by their Latin-1 character so every one is a 1-char string.
        self._inv_vocab = {i: bytes([i]).decode("latin-1") for i in range(self.NUM_BYTES)}
        self._inv_vocab[self.EOD_ID] = self.EOD_TOKEN
        self._inv_vocab[self.PAD_ID] = self.PAD_TOKEN
        self._vocab = {tok: i for i, tok in self._inv_vocab.items()}

    def tokenize(self, text: str) -> List[int]:
        """Token ids of ``text``: its UTF-8 bytes, one id (0..255) per byte."""
        return list(text.encode("utf-8"))

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of token ``ids``: bytes decoded as UTF-8 (invalid sequences become U+FFFD);
        the special ids are written as ``<|endoftext|>`` and ``<pad>``."""
        out: List[str] = []
        buf = bytearray()
        for raw in ids:
            i = int(raw)
            if 0 <= i < self.NUM_BYTES:
                buf.append(i)
                continue
            if i not in (self.EOD_ID, self.PAD_ID):
                raise ValueError(f"token id {i} is outside the byte-level vocabulary [0, 258)")
            out.append(buf.decode("utf-8", errors="replace"))
            buf = bytearray()
            out.append(self._inv_vocab[i])
        out.append(buf.decode("utf-8", errors="replace"))
        return "".join(out)

    @property
    def vocab_size(self) -> int:
        """Number of token ids (258), before padding."""
        return self.NUM_BYTES + 2

    @property
    def vocab(self) -> Dict[str, int]:
        """Token string -> id (bytes as Latin-1 characters)."""
        return self._vocab

    @property
    def inv_vocab(self) -> Dict[int, str]:
        """Id -> token string."""
        return self._inv_vocab

    @property
    def eod(self) -> int:
        """End-of-document id (256)."""
        return self.EOD_ID

    @property
    def eos(self) -> int:
        """End-of-sequence id; the same as ``eod``."""
        return self.EOD_ID

    @property
    def bos(self) -> int:
        """Beginning-of-sequence id; byte-level has none, so it is ``eod`` as in GPT-2."""
        return self.EOD_ID

    @property
    def pad(self) -> int:
        """Padding id (257)."""
        return self.PAD_ID


class _TokenizersLibTokenizer(_TokenizerBase):
    """Shared code for tokenizers backed by a ``tokenizers.Tokenizer`` object."""

    def __init__(self, tokenizer, eod_id: int, *paths: str, **options: Any):
        super().__init__(*paths, **options)
        self._tok = tokenizer
        self._eod = int(eod_id)
        self._vocab: Optional[Dict[str, int]] = None
        self._inv_vocab: Optional[Dict[int, str]] = None

    def tokenize(self, text: str) -> List[int]:
        """Token ids of ``text``, without any added special tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of token ``ids`` (special tokens kept as their strings)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included, before padding."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def vocab(self) -> Dict[str, int]:
        """Token string -> id."""
        if self._vocab is None:
            self._vocab = self._tok.get_vocab(with_added_tokens=True)
        return self._vocab

    @property
    def inv_vocab(self) -> Dict[int, str]:
        """Id -> token string."""
        if self._inv_vocab is None:
            self._inv_vocab = {i: t for t, i in self.vocab.items()}
        return self._inv_vocab

    @property
    def eod(self) -> int:
        """End-of-document id."""
        return self._eod

    @property
    def eos(self) -> int:
        """End-of-sequence id; the same as ``eod``."""
        return self._eod


class GPT2BPETokenizer(_TokenizersLibTokenizer):
    """GPT-2 byte-level BPE from ``--vocab-file`` (vocab.json) and ``--merge-file`` (merges.txt).

    ``eod`` (= ``eos`` = ``bos`` = ``pad``) is the id of ``<|endoftext|>``. As in Megatron-LM, the
    literal text ``<|endoftext|>`` inside a document is tokenized as ordinary text.
    """

    def __init__(self, vocab_file: Optional[str], merge_file: Optional[str]):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab_file = _require_file(vocab_file, "--vocab-file", "GPT2BPETokenizer vocab.json")
        merge_file = _require_file(merge_file, "--merge-file", "GPT2BPETokenizer merges.txt")
        try:
            bpe = models.BPE.from_file(vocab_file, merge_file)
        except Exception as exc:  # the tokenizers library raises its own exception type
            raise ConfigError(
                f"could not read GPT-2 BPE from --vocab-file {vocab_file!r} and "
                f"--merge-file {merge_file!r}: {exc}"
            ) from exc
        tok = Tokenizer(bpe)
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        eod = tok.token_to_id(ENDOFTEXT)
        if eod is None:
            raise ConfigError(f"--vocab-file {vocab_file!r} has no {ENDOFTEXT!r} token")
        super().__init__(tok, eod, vocab_file, merge_file)

    @property
    def bos(self) -> int:
        """Beginning-of-sequence id; GPT-2 uses ``<|endoftext|>``."""
        return self._eod

    @property
    def pad(self) -> int:
        """Padding id; GPT-2 has none, so ``<|endoftext|>`` (never counted in the loss)."""
        return self._eod


def _find_eod(vocab: Dict[str, int], eos_token: Optional[str], source: str) -> int:
    """Id of the end-of-document token: ``eos_token`` if given and known, else the first of
    ``EOD_CANDIDATES`` found in ``vocab``. Raises ValueError naming ``source`` if none."""
    if eos_token and eos_token in vocab:
        return vocab[eos_token]
    for cand in EOD_CANDIDATES:
        if cand in vocab:
            return vocab[cand]
    raise ConfigError(
        f"--tokenizer-model {source!r} has no end-of-document token: it declares no eos token "
        f"and has none of {list(EOD_CANDIDATES)}"
    )


def _special_token_text(value: Any) -> Optional[str]:
    """The token string of a tokenizer_config.json special-token entry (str or AddedToken dict)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return value.get("content")
    return None


class HuggingFaceTokenizer(_TokenizerBase):
    """A Hugging Face tokenizer from a local ``tokenizer.json`` file or a local directory.

    A file is loaded with ``tokenizers.Tokenizer.from_file``; a ``tokenizer_config.json`` beside it
    supplies the eos/bos/pad tokens if present. A directory is loaded with
    ``transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)``.
    ``eod`` is the eos token if any, else ``<|endoftext|>`` or ``</s>`` (see ``EOD_CANDIDATES``).
    """

    def __init__(self, tokenizer_model: Optional[str]):
        path = _require_file(
            tokenizer_model, "--tokenizer-model", "HuggingFaceTokenizer tokenizer.json",
            allow_dir=True,
        )
        super().__init__(path)
        self._path = path
        self._hf = None  # transformers tokenizer (directory input)
        self._tok = None  # tokenizers.Tokenizer (file input)
        specials: Dict[str, Optional[str]] = {}
        if os.path.isdir(path):
            try:
                from transformers import AutoTokenizer

                self._hf = AutoTokenizer.from_pretrained(path, local_files_only=True)
            except Exception as exc:
                raise ConfigError(
                    f"--tokenizer-model {path!r}: could not load a tokenizer from this "
                    f"directory: {exc}"
                ) from exc
            vocab = self._hf.get_vocab()
            for key in ("eos_token", "bos_token", "pad_token"):
                specials[key] = getattr(self._hf, key, None)
        else:
            from tokenizers import Tokenizer

            try:
                self._tok = Tokenizer.from_file(path)
            except Exception as exc:
                raise ConfigError(
                    f"--tokenizer-model {path!r} is not a tokenizers JSON file: {exc}"
                ) from exc
            vocab = self._tok.get_vocab(with_added_tokens=True)
            cfg_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
            if os.path.isfile(cfg_path):
                try:
                    with open(cfg_path, encoding="utf-8") as f:
                        cfg = json.load(f)
                except (OSError, ValueError) as exc:
                    raise ConfigError(
                        f"--tokenizer-model {path!r}: {cfg_path!r} beside it is not valid JSON: {exc}"
                    ) from exc
                if not isinstance(cfg, dict):
                    raise ConfigError(
                        f"--tokenizer-model {path!r}: {cfg_path!r} beside it must hold a JSON "
                        f"object, got {type(cfg).__name__}"
                    )
                for key in ("eos_token", "bos_token", "pad_token"):
                    specials[key] = _special_token_text(cfg.get(key))
        self._vocab = vocab
        self._inv_vocab: Optional[Dict[int, str]] = None
        self._eod = _find_eod(vocab, specials.get("eos_token"), path)
        bos = specials.get("bos_token")
        pad = specials.get("pad_token")
        self._bos = vocab[bos] if bos in vocab else self._eod
        self._pad = vocab[pad] if pad in vocab else self._eod

    def tokenize(self, text: str) -> List[int]:
        """Token ids of ``text``, without added special tokens (no BOS/EOS)."""
        if self._tok is not None:
            return self._tok.encode(text, add_special_tokens=False).ids
        return self._hf.encode(text, add_special_tokens=False)

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of token ``ids`` (special tokens kept)."""
        ids = [int(i) for i in ids]
        if self._tok is not None:
            return self._tok.decode(ids, skip_special_tokens=False)
        return self._hf.decode(ids, skip_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included, before padding."""
        if self._tok is not None:
            return self._tok.get_vocab_size(with_added_tokens=True)
        return len(self._hf)

    @property
    def vocab(self) -> Dict[str, int]:
        """Token string -> id."""
        return self._vocab

    @property
    def inv_vocab(self) -> Dict[int, str]:
        """Id -> token string."""
        if self._inv_vocab is None:
            self._inv_vocab = {i: t for t, i in self._vocab.items()}
        return self._inv_vocab

    @property
    def eod(self) -> int:
        """End-of-document id (the eos token, or a conventional end-of-text token)."""
        return self._eod

    @property
    def eos(self) -> int:
        """End-of-sequence id; the same as ``eod``."""
        return self._eod

    @property
    def bos(self) -> int:
        """Beginning-of-sequence id (the declared bos token, else ``eod``)."""
        return self._bos

    @property
    def pad(self) -> int:
        """Padding id (the declared pad token, else ``eod``)."""
        return self._pad


def padded_vocab_size(
    raw_vocab_size: int, make_vocab_size_divisible_by: int = 128, tensor_model_parallel_size: int = 1
) -> int:
    """Vocabulary size (number of embedding rows) padded up to the next multiple of
    ``make_vocab_size_divisible_by * tensor_model_parallel_size``, as Megatron-LM's
    ``_vocab_size_with_padding``."""
    for name, value in (
        ("raw_vocab_size", raw_vocab_size),
        ("make_vocab_size_divisible_by", make_vocab_size_divisible_by),
        ("tensor_model_parallel_size", tensor_model_parallel_size),
    ):
        if int(value) != value or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    multiple = int(make_vocab_size_divisible_by) * int(tensor_model_parallel_size)
    return -(-int(raw_vocab_size) // multiple) * multiple


def build_tokenizer(args: argparse.Namespace):
    """Build the tokenizer named by ``args.tokenizer_type`` (``ByteLevelTokenizer`` if unset).

    Reads ``args.vocab_file``, ``args.merge_file``, ``args.tokenizer_model`` as the type needs.
    As Megatron-LM does, also sets ``args.padded_vocab_size`` (number of embedding rows) from
    ``make_vocab_size_divisible_by`` (default 128) and ``tensor_model_parallel_size`` (default 1).
    Raises ValueError for an unknown type or a missing file (naming the flag and the path).
    """
    ttype = getattr(args, "tokenizer_type", None) or DEFAULT_TOKENIZER_TYPE
    if ttype == "ByteLevelTokenizer":
        tokenizer = ByteLevelTokenizer()
    elif ttype == "HuggingFaceTokenizer":
        tokenizer = HuggingFaceTokenizer(getattr(args, "tokenizer_model", None))
    elif ttype == "GPT2BPETokenizer":
        tokenizer = GPT2BPETokenizer(
            getattr(args, "vocab_file", None), getattr(args, "merge_file", None)
        )
    else:
        raise ConfigError(
            f"unknown --tokenizer-type {ttype!r}; allowed: {', '.join(TOKENIZER_TYPES)}"
        )
    divisible_by = getattr(args, "make_vocab_size_divisible_by", None) or 128
    tp = getattr(args, "tensor_model_parallel_size", None) or 1
    args.padded_vocab_size = padded_vocab_size(tokenizer.vocab_size, divisible_by, tp)
    return tokenizer
