"""Train two tiny tokenizers on the project's own demo text (nothing downloaded) for tests, demos.

    python tools/make_tiny_tokenizers.py [--output-dir data/tiny_tokenizers] [--vocab-size 384]

Writes into the output directory:
  hf/                      a Hugging Face tokenizer directory: a byte-level BPE trained with the
                           ``tokenizers`` library, saved by ``transformers.PreTrainedTokenizerFast
                           .save_pretrained`` (tokenizer.json, tokenizer_config.json, ...). Special
                           tokens as BLOOM's: ``<unk>`` 0, ``<s>`` 1 (bos), ``</s>`` 2 (eos),
                           ``<pad>`` 3. Use with ``--tokenizer-type PretrainedFromHF
                           --tokenizer-name-or-path DIR``.
  spm/tokenizer.model      a sentencepiece BPE model trained by sentencepiece's own trainer, ids and
                           options as Llama's: ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2, no pad id (-1),
                           byte fallback, no normalization (decode(encode(text)) == text).
                           Use with ``--tokenizer-type GPTSentencePieceTokenizer
                           --tokenizer-model FILE``.

Same arguments, same files (single-threaded training over a deterministic corpus). Takes seconds.
"""

import argparse
import io
import os
import sys
from typing import Dict, Iterator, List

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

from tools.make_demo_data import DOMAINS, generate_domain  # noqa: E402

DEFAULT_OUTPUT_DIR = os.path.join("data", "tiny_tokenizers")
DEFAULT_VOCAB_SIZE = 384
# Demo text per domain the tokenizers are trained on, in bytes (a few hundred documents in all).
TRAIN_BYTES_PER_DOMAIN = 64 * 1024
HF_SPECIAL_TOKENS = {"unk_token": "<unk>", "bos_token": "<s>", "eos_token": "</s>",
                     "pad_token": "<pad>"}


def training_texts(size_bytes: int = TRAIN_BYTES_PER_DOMAIN) -> List[str]:
    """Demo documents (tools/make_demo_data.py, default seed) of every domain, about
    ``size_bytes`` bytes of UTF-8 text per domain."""
    docs: List[str] = []
    for domain in DOMAINS:
        docs += generate_domain(domain, size_bytes)
    return docs


def _lines(docs: List[str]) -> Iterator[str]:
    """Non-empty lines of ``docs`` (sentencepiece trains on sentences, not whole documents)."""
    for doc in docs:
        for line in doc.split("\n"):
            if line.strip():
                yield line


def make_hf_tokenizer(output_dir: str, docs: List[str],
                      vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
    """Train a byte-level BPE of ``vocab_size`` tokens (special tokens included) on ``docs`` and
    save it as a transformers tokenizer directory ``output_dir``; returns ``output_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=HF_SPECIAL_TOKENS["unk_token"]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False,
        special_tokens=list(HF_SPECIAL_TOKENS.values()),  # ids 0..3 in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(docs, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, **HF_SPECIAL_TOKENS)
    os.makedirs(output_dir, exist_ok=True)
    fast.save_pretrained(output_dir)
    return output_dir


def make_sentencepiece_model(model_path: str, docs: List[str],
                             vocab_size: int = DEFAULT_VOCAB_SIZE) -> str:
    """Train a sentencepiece BPE model of ``vocab_size`` pieces on the lines of ``docs`` and
    write it to ``model_path``; returns ``model_path``."""
    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=_lines(docs), model_writer=model, model_type="bpe",
        vocab_size=vocab_size, character_coverage=1.0, byte_fallback=True,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1,
        # Lossless, as Llama's model: no NFKC, whitespace and newlines kept.
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        minloglevel=2,  # warnings and errors only
    )
    os.makedirs(os.path.dirname(os.path.abspath(model_path)), exist_ok=True)
    tmp = model_path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(model.getvalue())
    os.replace(tmp, model_path)
    return model_path


def make_tiny_tokenizers(output_dir: str = DEFAULT_OUTPUT_DIR,
                         vocab_size: int = DEFAULT_VOCAB_SIZE) -> Dict[str, str]:
    """Write both tiny tokenizers under ``output_dir``; returns ``{"hf": directory,
    "sentencepiece": model file}``."""
    docs = training_texts()
    return {
        "hf": make_hf_tokenizer(os.path.join(output_dir, "hf"), docs, vocab_size),
        "sentencepiece": make_sentencepiece_model(
            os.path.join(output_dir, "spm", "tokenizer.model"), docs, vocab_size),
    }


def main(argv=None) -> int:
    """Command-line entry point; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output-dir", default=DEFAULT_OUTPUT_DIR,
                        help=f"Where to write (default {DEFAULT_OUTPUT_DIR}).")
    parser.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                        help="Tokens in each vocabulary, special and byte tokens included "
                             f"(default {DEFAULT_VOCAB_SIZE}; at least 300).")
    args = parser.parse_args(argv)
    if args.vocab_size < 300:
        parser.error(f"--vocab-size must be at least 300 (256 byte tokens and the special "
                     f"tokens), got {args.vocab_size}")
    paths = make_tiny_tokenizers(args.output_dir, args.vocab_size)
    print(f"wrote {paths['hf']} (--tokenizer-type PretrainedFromHF --tokenizer-name-or-path) "
          f"and {paths['sentencepiece']} (--tokenizer-type GPTSentencePieceTokenizer "
          "--tokenizer-model)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
