"""The embedded default tokenizer: UTF-8 bytes, with end-of-document and padding ids after them.

Kept here rather than megatron-core's ``ByteLevelTokenizer`` (megatron/core/tokenizers/text/
libraries/bytelevel_tokenizer.py) because that one numbers its special tokens inside the byte range
(eos 0 and pad 1 by default, so the NUL and U+0001 bytes read as end-of-document), has a 512-id
vocabulary, and strips trailing whitespace on decode. Datasets this project tokenized (the demo
corpus) use eod 256 and pad 257 in a 258-id vocabulary.
"""
from collections import OrderedDict
from typing import Dict, Iterable, List

from megatron.core.tokenizers import MegatronTokenizerBase

ENDOFTEXT = "<|endoftext|>"


class ByteLevelTokenizer(MegatronTokenizerBase):
    """UTF-8 bytes as tokens: ids 0..255 are byte values, 256 is end-of-document, 257 is padding.

    Needs no files, so it is the embedded default. ``vocab_size`` is 258 (unpadded).
    """

    NUM_BYTES = 256
    EOD_ID = 256
    PAD_ID = 257
    EOD_TOKEN = ENDOFTEXT
    PAD_TOKEN = "<pad>"

    def __init__(self):
        super().__init__(None, {"library": "byte-level", "model_type": "gpt"})
        # Byte tokens are named by their Latin-1 character so every one is a 1-char string.
        self._inv_vocab = {i: bytes([i]).decode("latin-1") for i in range(self.NUM_BYTES)}
        self._inv_vocab[self.EOD_ID] = self.EOD_TOKEN
        self._inv_vocab[self.PAD_ID] = self.PAD_TOKEN
        self._vocab = {tok: i for i, tok in self._inv_vocab.items()}

    @property
    def name(self) -> str:
        """The tokenizer type name, as given to ``--tokenizer-type``."""
        return type(self).__name__

    @property
    def unique_identifiers(self) -> OrderedDict:
        """What identifies this tokenizer in megatron-core dataset cache descriptions."""
        return OrderedDict([("class", self.name), ("tokenizer_path", [])])

    def __repr__(self) -> str:
        return f"{self.name}(vocab_size={self.vocab_size}, eod={self.eod})"

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

    def apply_chat_template(self, *args, **kwargs):
        """Not supported: the byte-level tokenizer has no chat template."""
        raise NotImplementedError("ByteLevelTokenizer has no chat template")

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
