"""Tokenizers: byte-level round trips, GPT-2 BPE files, HF tokenizer.json, clear errors."""

import argparse
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron.core.datasets import megatron_tokenizer as mt
from megatron.tokenizer import (
    TOKENIZER_TYPES,
    ByteLevelTokenizer,
    GPT2BPETokenizer,
    HuggingFaceTokenizer,
    build_tokenizer,
    padded_vocab_size,
)

BASE = getattr(mt, "MegatronTokenizer", None) or mt.MegatronLegacyTokenizer

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello tokenizer! Numbers: 12345 and 678.",
    "def add(a, b):\n    return a + b\n",
    "Zoë and José visited Kraków and Montréal; 日本語 text too.",
]
SAMPLE = "Hello wörld, 日本語 — def f(x):\n\treturn x  # ok\n"


def ns(**kw):
    """Tokenizer arguments with every attribute build_tokenizer reads."""
    base = dict(tokenizer_type="ByteLevelTokenizer", vocab_file=None, merge_file=None,
                tokenizer_model=None)
    base.update(kw)
    return argparse.Namespace(**base)


def train_bpe(vocab_size=320, special_tokens=("<|endoftext|>",)):
    """A tiny byte-level BPE tokenizer trained on SENTENCES."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
    )
    tok.train_from_iterator(SENTENCES * 5, trainer)
    return tok


@pytest.fixture(scope="module")
def bpe_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("bpe")
    tok = train_bpe()
    tok.model.save(str(d))
    tok.save(str(d / "tokenizer.json"))
    return d


# --------------------------------------------------------------------------- byte level

def test_byte_level_round_trip_and_specials():
    tok = build_tokenizer(ns())
    assert isinstance(tok, ByteLevelTokenizer) and isinstance(tok, BASE)
    ids = tok.tokenize(SAMPLE)
    assert isinstance(ids, list) and all(0 <= i < 256 for i in ids)
    assert ids == list(SAMPLE.encode("utf-8"))
    assert tok.detokenize(ids) == SAMPLE
    assert (tok.vocab_size, tok.eod, tok.pad, tok.eos) == (258, 256, 257, 256)
    assert tok.detokenize(ids + [tok.eod]) == SAMPLE + "<|endoftext|>"
    assert len(tok.vocab) == len(tok.inv_vocab) == 258
    assert all(tok.vocab[t] == i for i, t in tok.inv_vocab.items())
    with pytest.raises(ValueError, match="outside"):
        tok.detokenize([300])


def test_default_type_and_padded_vocab_size_attribute():
    args = argparse.Namespace(tokenizer_type=None, vocab_file=None, merge_file=None,
                              tokenizer_model=None, make_vocab_size_divisible_by=128,
                              tensor_model_parallel_size=2)
    tok = build_tokenizer(args)
    assert isinstance(tok, ByteLevelTokenizer)
    assert args.padded_vocab_size == 512  # 258 rounded up to a multiple of 128 * 2


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_byte_level_round_trip_property(text):
    tok = ByteLevelTokenizer()
    assert tok.detokenize(tok.tokenize(text)) == text


# --------------------------------------------------------------------------- padding

@pytest.mark.parametrize("raw,div,tp,expected", [
    (258, 128, 1, 384), (256, 128, 1, 256), (257, 128, 1, 384), (50257, 128, 1, 50304),
    (50257, 128, 8, 51200), (1, 1, 1, 1), (100, 64, 2, 128),
])
def test_padded_vocab_size(raw, div, tp, expected):
    assert padded_vocab_size(raw, div, tp) == expected


def test_padded_vocab_size_rejects_bad_values():
    with pytest.raises(ValueError, match="make_vocab_size_divisible_by"):
        padded_vocab_size(258, 0, 1)


# --------------------------------------------------------------------------- GPT-2 BPE

def test_gpt2_bpe_from_vocab_and_merges(bpe_files):
    args = ns(tokenizer_type="GPT2BPETokenizer", vocab_file=str(bpe_files / "vocab.json"),
              merge_file=str(bpe_files / "merges.txt"))
    tok = build_tokenizer(args)
    assert isinstance(tok, GPT2BPETokenizer) and isinstance(tok, BASE)
    vocab = json.loads((bpe_files / "vocab.json").read_text())
    assert tok.eod == vocab["<|endoftext|>"] == tok.eos == tok.pad
    for text in SENTENCES + [SAMPLE]:
        ids = tok.tokenize(text)
        assert tok.detokenize(ids) == text
    # merges were learned: common words take fewer tokens than bytes
    assert len(tok.tokenize(SENTENCES[0])) < len(SENTENCES[0].encode())
    assert tok.vocab_size == len(vocab)
    assert args.padded_vocab_size == padded_vocab_size(len(vocab), 128, 1)
    assert tok.inv_vocab[tok.eod] == "<|endoftext|>"


def test_gpt2_bpe_without_endoftext_is_an_error(tmp_path):
    tok = train_bpe(special_tokens=())
    tok.model.save(str(tmp_path))
    with pytest.raises(ValueError, match="<\\|endoftext\\|>"):
        build_tokenizer(ns(tokenizer_type="GPT2BPETokenizer",
                           vocab_file=str(tmp_path / "vocab.json"),
                           merge_file=str(tmp_path / "merges.txt")))


# --------------------------------------------------------------------------- Hugging Face

def test_hf_tokenizer_json(bpe_files):
    tok = build_tokenizer(ns(tokenizer_type="HuggingFaceTokenizer",
                             tokenizer_model=str(bpe_files / "tokenizer.json")))
    assert isinstance(tok, HuggingFaceTokenizer) and isinstance(tok, BASE)
    assert tok.eod == tok.vocab["<|endoftext|>"]
    for text in SENTENCES + [SAMPLE]:
        assert tok.detokenize(tok.tokenize(text)) == text


def test_hf_tokenizer_eos_from_config_and_directory(tmp_path):
    tok = train_bpe(special_tokens=("<s>", "</s>", "<pad>"))
    tok.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "</s>", "bos_token": "<s>",
        "pad_token": "<pad>",
    }))
    vocab = tok.get_vocab()
    from_file = build_tokenizer(ns(tokenizer_type="HuggingFaceTokenizer",
                                   tokenizer_model=str(tmp_path / "tokenizer.json")))
    from_dir = build_tokenizer(ns(tokenizer_type="HuggingFaceTokenizer",
                                  tokenizer_model=str(tmp_path)))
    for t in (from_file, from_dir):
        assert (t.eod, t.bos, t.pad) == (vocab["</s>"], vocab["<s>"], vocab["<pad>"])
        assert t.detokenize(t.tokenize(SAMPLE)) == SAMPLE
        assert t.vocab_size == len(vocab)
    assert from_file.tokenize(SAMPLE) == from_dir.tokenize(SAMPLE)


def test_hf_tokenizer_without_eod_is_an_error(tmp_path):
    tok = train_bpe(special_tokens=("[UNK]",))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    with pytest.raises(ValueError, match="end-of-document"):
        build_tokenizer(ns(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(path)))


# --------------------------------------------------------------------------- errors

@pytest.mark.parametrize("kw,flag", [
    (dict(tokenizer_type="GPT2BPETokenizer", vocab_file="VOCAB", merge_file="MERGES"),
     "--vocab-file"),
    (dict(tokenizer_type="GPT2BPETokenizer", vocab_file=None, merge_file="MERGES"),
     "--vocab-file"),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model="MODEL"), "--tokenizer-model"),
    (dict(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=None), "--tokenizer-model"),
])
def test_missing_files_name_the_flag(tmp_path, kw, flag):
    kw = {k: (str(tmp_path / v) if isinstance(v, str) and v.isupper() else v)
          for k, v in kw.items()}
    with pytest.raises(ValueError) as err:
        build_tokenizer(ns(**kw))
    msg = str(err.value)
    assert flag in msg
    path = kw.get("vocab_file") if flag == "--vocab-file" else kw.get("tokenizer_model")
    if path:
        assert path in msg


def test_missing_merge_file_names_the_flag(bpe_files, tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(ValueError) as err:
        build_tokenizer(ns(tokenizer_type="GPT2BPETokenizer",
                           vocab_file=str(bpe_files / "vocab.json"), merge_file=missing))
    assert "--merge-file" in str(err.value) and missing in str(err.value)


def test_unknown_type_lists_allowed():
    with pytest.raises(ValueError) as err:
        build_tokenizer(ns(tokenizer_type="SentencePieceTokenizer"))
    for name in TOKENIZER_TYPES:
        assert name in str(err.value)


def test_tiny_tokenizers_tool(hf_tokenizer_dir, sentencepiece_model, tmp_path):
    """tools/make_tiny_tokenizers.py: an HF directory transformers loads with BLOOM's special ids
    and a sentencepiece model with Llama's, both of vocab 384 and deterministic; a too-small
    --vocab-size is refused naming the flag."""
    import sentencepiece as spm
    from transformers import AutoTokenizer

    from tools.make_tiny_tokenizers import main, make_tiny_tokenizers

    hf = AutoTokenizer.from_pretrained(hf_tokenizer_dir, local_files_only=True)
    assert (len(hf), hf.unk_token_id, hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (
        384, 0, 1, 2, 3)
    assert hf.decode(hf.encode(SAMPLE, add_special_tokens=False)) == SAMPLE
    sp = spm.SentencePieceProcessor(model_file=sentencepiece_model)
    assert (sp.vocab_size(), sp.unk_id(), sp.bos_id(), sp.eos_id(), sp.pad_id()) == (
        384, 0, 1, 2, -1)
    assert sp.decode(sp.encode(SAMPLE)) == SAMPLE  # byte fallback covers unseen characters
    again = make_tiny_tokenizers(str(tmp_path / "again"))
    with open(sentencepiece_model, "rb") as a, open(again["sentencepiece"], "rb") as b:
        assert a.read() == b.read()
    with open(f"{hf_tokenizer_dir}/tokenizer.json") as a, open(f"{again['hf']}/tokenizer.json") as b:
        assert a.read() == b.read()
    with pytest.raises(SystemExit):
        main(["--output-dir", str(tmp_path / "bad"), "--vocab-size", "100"])
