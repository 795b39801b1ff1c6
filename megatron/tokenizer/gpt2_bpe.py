"""GPT-2 byte-level BPE from a vocab.json/merges.txt pair (``--tokenizer-type GPT2BPETokenizer``).

Kept here rather than taken from megatron-core because megatron-core 0.16's ``build_tokenizer``
sends ``GPT2BPETokenizer`` to ``MegatronHFTokenizer`` (megatron/core/tokenizers/text/libraries/
megatron_hf_tokenizer.py), which loads ``AutoTokenizer.from_pretrained("gpt2", ...)``: that reads
the ``gpt2`` repository from the Hugging Face Hub (so it fails offline) and passes the merges file
under a keyword transformers ignores (``merge_files``). This one reads only the two given files,
with the ``tokenizers`` library's BPE model, as Megatron-LM's own GPT-2 tokenizer does.
"""
import os
from collections import OrderedDict
from typing import Dict, Iterable, List, Optional

from megatron.core.tokenizers import MegatronTokenizerBase

from megatron.errors import ConfigError

ENDOFTEXT = "<|endoftext|>"


def require_file(path: Optional[str], flag: str, what: str, allow_dir: bool = False) -> str:
    """Return ``path`` if it names an existing file (or directory when ``allow_dir``).

    Raises ConfigError naming the command-line ``flag`` and the path otherwise.
    """
    if not path:
        raise ConfigError(f"{what} needs {flag} to be given (got none)")
    if os.path.isfile(path) or (allow_dir and os.path.isdir(path)):
        return path
    kind = "file or directory" if allow_dir else "file"
    raise ConfigError(f"{flag} {path!r}: no such {kind} ({what})")


class GPT2BPETokenizer(MegatronTokenizerBase):
    """GPT-2 byte-level BPE from ``--vocab-file`` (vocab.json) and ``--merge-file`` (merges.txt).

    ``eod`` (= ``eos`` = ``bos`` = ``pad``) is the id of ``<|endoftext|>``. As in Megatron-LM, the
    literal text ``<|endoftext|>`` inside a document is tokenized as ordinary text.
    """

    def __init__(self, vocab_file: Optional[str], merge_file: Optional[str]):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab_file = require_file(vocab_file, "--vocab-file", "GPT2BPETokenizer vocab.json")
        merge_file = require_file(merge_file, "--merge-file", "GPT2BPETokenizer merges.txt")
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
        super().__init__(vocab_file, {"library": "tokenizers", "model_type": "gpt"})
        self._tok = tok
        self._eod = int(eod)
        self._paths = [vocab_file, merge_file]
        self._vocab: Optional[Dict[str, int]] = None
        self._inv_vocab: Optional[Dict[int, str]] = None

    @property
    def name(self) -> str:
        """The tokenizer type name, as given to ``--tokenizer-type``."""
        return type(self).__name__

    @property
    def unique_identifiers(self) -> OrderedDict:
        """What identifies this tokenizer in megatron-core dataset cache descriptions."""
        return OrderedDict([("class", self.name), ("tokenizer_path", list(self._paths))])

    def __repr__(self) -> str:
        return f"{self.name}(vocab_size={self.vocab_size}, eod={self.eod})"

    def tokenize(self, text: str) -> List[int]:
        """Token ids of ``text``, without any added special tokens."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def detokenize(self, ids: Iterable[int]) -> str:
        """Text of token ``ids`` (special tokens kept as their strings)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def apply_chat_template(self, *args, **kwargs):
        """Not supported: GPT-2 BPE files carry no chat template."""
        raise NotImplementedError("GPT2BPETokenizer has no chat template")

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
        """End-of-document id: ``<|endoftext|>``."""
        return self._eod

    @property
    def eos(self) -> int:
        """End-of-sequence id; the same as ``eod``."""
        return self._eod

    @property
    def bos(self) -> int:
        """Beginning-of-sequence id; GPT-2 uses ``<|endoftext|>``."""
        return self._eod

    @property
    def pad(self) -> int:
        """Padding id; GPT-2 has none, so ``<|endoftext|>`` (never counted in the loss)."""
        return self._eod
