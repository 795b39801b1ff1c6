"""Tokenizers: byte-level round trips, GPT-2 BPE files, megatron-core's Hugging Face and
sentencepiece tokenizers against their libraries, preprocessing with them, clear errors."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.tokenizers import MegatronTokenizerBase as BASE

from helpers.flags import tiny_run_flags
from megatron.config.tokenizer_flags import apply_tokenizer_setup, tokenizer_setup_from_args
from megatron.errors import ConfigError
from megatron.tokenizer import (
    ByteLevelTokenizer,
    GPT2BPETokenizer,
    HuggingFaceTokenizer,
    build_tokenizer,
    padded_vocab_size,
)
from megatron.tokenizer.types import TOKENIZER_TYPES, tokenizer_config

# a tiny model's flags naming a data prefix no tokenizer flag touches
RUN_FLAGS = tiny_run_flags(seq_length=64, micro_batch_size=1, train_iters=3,
                           data_path="x_text_document")
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello world, hello tokenizer! Numbers: 12345 and 678.",
    "def add(a, b):\n    return a + b\n",
    "Zoë and José visited Kraków and Montréal; 日本語 text too.",
]
SAMPLE = "Hello wörld, 日本語 — def f(x):\n\treturn x  # ok\n"


def choice(**flags):
    """The TokenizerConfig of these tokenizer flag values (the byte-level type unless named)."""
    flags.setdefault("tokenizer_type", "ByteLevelTokenizer")
    return tokenizer_config(**flags)


def run_args(*flags, world_size=1):
    """The validated flags of a tiny run with these (tokenizer) flags, as the entry points parse
    them."""
    from megatron.config.parser import parse_args

    return parse_args(RUN_FLAGS + list(flags), world_size=world_size)


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
    tok = build_tokenizer(choice())
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
    args = run_args("--tensor-model-parallel-size", "2", world_size=2)
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    tok = setup.tokenizer
    assert isinstance(tok, ByteLevelTokenizer)
    assert args.padded_vocab_size == 512  # 258 rounded up to a multiple of 128 * 2
    assert list(setup.notes) == ["tokenizer: ByteLevelTokenizer, 258 tokens (eod 256, pad 257); "
                                  "embedding rows 512 (254 dummy tokens of padding, which take no probability)"]


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
    args = run_args("--tokenizer-type", "GPT2BPETokenizer", "--vocab-file",
                    str(bpe_files / "vocab.json"), "--merge-file", str(bpe_files / "merges.txt"))
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    tok = setup.tokenizer
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
    assert not any(n.startswith("tokenizer:") for n in args.run_config.notes)  # setup.notes
    assert tok.inv_vocab[tok.eod] == "<|endoftext|>"


def test_gpt2_bpe_without_endoftext_is_an_error(tmp_path):
    tok = train_bpe(special_tokens=())
    tok.model.save(str(tmp_path))
    with pytest.raises(ValueError, match="<\\|endoftext\\|>"):
        build_tokenizer(choice(tokenizer_type="GPT2BPETokenizer",
                           vocab_file=str(tmp_path / "vocab.json"),
                           merge_file=str(tmp_path / "merges.txt")))


# --------------------------------------------------------------------------- Hugging Face

def test_hf_tokenizer_json(bpe_files):
    tok = build_tokenizer(choice(tokenizer_type="HuggingFaceTokenizer",
                             tokenizer_model=str(bpe_files / "tokenizer.json")))
    assert isinstance(tok, HuggingFaceTokenizer) and isinstance(tok, BASE)
    assert tok.eod == tok.pad == tok.bos == tok._tokenizer.tokenizer.convert_tokens_to_ids(
        "<|endoftext|>")  # no eos, bos or pad declared: the conventional end-of-text token
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
    from_file = build_tokenizer(choice(tokenizer_type="HuggingFaceTokenizer",
                                   tokenizer_model=str(tmp_path / "tokenizer.json")))
    from_dir = build_tokenizer(choice(tokenizer_type="HuggingFaceTokenizer",
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
        build_tokenizer(choice(tokenizer_type="HuggingFaceTokenizer", tokenizer_model=str(path)))


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
        build_tokenizer(choice(**kw))
    msg = str(err.value)
    assert flag in msg
    path = kw.get("vocab_file") if flag == "--vocab-file" else kw.get("tokenizer_model")
    if path:
        assert path in msg


def test_missing_merge_file_names_the_flag(bpe_files, tmp_path):
    missing = str(tmp_path / "nope.txt")
    with pytest.raises(ValueError) as err:
        build_tokenizer(choice(tokenizer_type="GPT2BPETokenizer",
                           vocab_file=str(bpe_files / "vocab.json"), merge_file=missing))
    assert "--merge-file" in str(err.value) and missing in str(err.value)


def test_unknown_type_lists_allowed():
    with pytest.raises(ValueError) as err:
        build_tokenizer(choice(tokenizer_type="SentencePiece"))
    assert "unknown --tokenizer-type 'SentencePiece'" in str(err.value)
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
    with open(f"{hf_tokenizer_dir}/tokenizer.json") as a:
        with open(f"{again['hf']}/tokenizer.json") as b:
            assert a.read() == b.read()
    with pytest.raises(SystemExit):
        main(["--output-dir", str(tmp_path / "bad"), "--vocab-size", "100"])


# ------------------------------------------ megatron-core HF / sentencepiece (tiny tokenizers)

def _demo_texts(n=6):
    """A few demo documents of each domain plus the unicode/whitespace SAMPLE."""
    from tools.make_demo_data import DOMAINS, generate_domain

    return [d for dom in DOMAINS for d in generate_domain(dom, 2000, seed=7)[:n]] + [SAMPLE]


@pytest.mark.parametrize("ttype,flag", [("PretrainedFromHF", "tokenizer_name_or_path"),
                                        ("HuggingFaceTokenizer", "tokenizer_model")])
@pytest.mark.parametrize("as_file", [False, True], ids=["directory", "tokenizer.json"])
def test_hf_types_match_transformers_and_tokenizers(hf_tokenizer_dir, ttype, flag, as_file):
    """PretrainedFromHF (BigScience) and HuggingFaceTokenizer (Megatron-LM), from the directory or
    its tokenizer.json: megatron-core's GPTTokenizer giving the ids of transformers (no special
    tokens added) and of the tokenizers library; vocab_size = len(tokenizer), eod = eos_token_id,
    pad = pad_token_id, bos = bos_token_id (BigScience's definitions)."""
    from megatron.core.tokenizers.text.models import GPTTokenizer
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    path = f"{hf_tokenizer_dir}/tokenizer.json" if as_file else hf_tokenizer_dir
    args = run_args("--tokenizer-type", ttype, "--" + flag.replace("_", "-"), path)
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    tok = setup.tokenizer
    assert isinstance(tok, GPTTokenizer) and isinstance(tok, HuggingFaceTokenizer)
    assert tok.name == ttype
    hf = AutoTokenizer.from_pretrained(hf_tokenizer_dir, local_files_only=True)
    lib = Tokenizer.from_file(f"{hf_tokenizer_dir}/tokenizer.json")
    assert (tok.vocab_size, tok.eod, tok.eos, tok.pad, tok.bos) == (
        len(hf), hf.eos_token_id, hf.eos_token_id, hf.pad_token_id, hf.bos_token_id) == (
        384, 2, 2, 3, 1)
    assert args.padded_vocab_size == 384
    for text in _demo_texts():
        ids = tok.tokenize(text)
        assert ids == hf.encode(text, add_special_tokens=False) == lib.encode(
            text, add_special_tokens=False).ids
        assert tok.detokenize(ids) == text
    # the special token's text inside a document is the special token, as in transformers
    assert tok.tokenize("a</s>b") == hf.encode("a</s>b", add_special_tokens=False)


def test_hf_without_pad_token_pads_with_eod(hf_tokenizer_dir, tmp_path):
    """A tokenizer declaring eos but no pad: pad = eod (BigScience's PretrainedFromHF)."""
    import shutil

    shutil.copy(f"{hf_tokenizer_dir}/tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    tok = build_tokenizer(choice(tokenizer_type="PretrainedFromHF",
                             tokenizer_name_or_path=str(tmp_path)))
    assert (tok.eod, tok.pad, tok.bos) == (2, 2, 2)


@pytest.mark.parametrize("ttype", ["GPTSentencePieceTokenizer", "SentencePieceTokenizer"])
def test_sentencepiece_types_match_sentencepiece(sentencepiece_model, ttype):
    """GPTSentencePieceTokenizer / SentencePieceTokenizer: megatron-core's sentencepiece
    GPTTokenizer giving sentencepiece's own ids (no BOS/EOS added); vocab_size = piece count,
    eod = eos_id (Megatron-LM), pad = eod because the model has no pad piece (pad_id -1)."""
    import sentencepiece as spm
    from megatron.core.tokenizers.text.models import GPTTokenizer

    args = run_args("--tokenizer-type", ttype, "--tokenizer-model", sentencepiece_model)
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    tok = setup.tokenizer
    assert isinstance(tok, GPTTokenizer) and tok.name == ttype
    sp = spm.SentencePieceProcessor(model_file=sentencepiece_model)
    assert sp.pad_id() == -1
    assert (tok.vocab_size, tok.eod, tok.eos, tok.bos, tok.pad) == (
        sp.get_piece_size(), sp.eos_id(), sp.eos_id(), sp.bos_id(), sp.eos_id()) == (
        384, 2, 2, 1, 2)
    assert args.padded_vocab_size == 384
    assert list(setup.notes) == [
        f"tokenizer: {ttype}, 384 tokens (eod 2, pad 2); embedding rows 384 (0 dummy tokens of "
        "padding, which take no probability)"]
    for text in _demo_texts():
        ids = tok.tokenize(text)
        assert ids == sp.encode(text)
        assert tok.detokenize(ids) == text


def test_sentencepiece_pad_piece_is_the_pad(tmp_path):
    """A sentencepiece model with a pad piece: pad is its id (as Megatron-LM's pad_id)."""
    import io

    import sentencepiece as spm

    from tools.make_tiny_tokenizers import training_texts

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(training_texts(8000)), model_writer=model, vocab_size=400,
        byte_fallback=True, pad_id=3, num_threads=1, minloglevel=2)
    path = tmp_path / "pad.model"
    path.write_bytes(model.getvalue())
    tok = build_tokenizer(choice(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model=str(path)))
    assert (tok.eod, tok.pad) == (2, 3)


# ------------------------------------------------------------------ preprocessing with them

@pytest.mark.parametrize("kind", ["hf", "sentencepiece"])
def test_preprocess_data_writes_the_library_ids(demo_data, tiny_tokenizers, tmp_path, kind):
    """tools/preprocess_data.py --append-eod with PretrainedFromHF / GPTSentencePieceTokenizer:
    the .bin/.idx read back by megatron-core's IndexedDataset hold, per document, the library's
    own ids followed by eos."""
    import os

    import numpy as np
    import sentencepiece as spm
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from transformers import AutoTokenizer

    from tools.preprocess_data import main

    src = os.path.join(os.path.dirname(demo_data["web"]), "math.jsonl")
    with open(src, encoding="utf-8") as f:
        lines = [next(f) for _ in range(12)]
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(lines), encoding="utf-8")
    texts = [json.loads(line)["text"] for line in lines]
    if kind == "hf":
        flags = ["--tokenizer-type", "PretrainedFromHF",
                 "--tokenizer-name-or-path", tiny_tokenizers["hf"]]
        hf = AutoTokenizer.from_pretrained(tiny_tokenizers["hf"], local_files_only=True)
        expected = [hf.encode(t, add_special_tokens=False) + [hf.eos_token_id] for t in texts]
    else:
        flags = ["--tokenizer-type", "GPTSentencePieceTokenizer",
                 "--tokenizer-model", tiny_tokenizers["sentencepiece"]]
        sp = spm.SentencePieceProcessor(model_file=tiny_tokenizers["sentencepiece"])
        expected = [sp.encode(t) + [sp.eos_id()] for t in texts]
    prefix = str(tmp_path / "out")
    assert main(["--input", str(jsonl), "--output-prefix", prefix, "--json-keys", "text",
                 "--append-eod", "--workers", "2", "--log-interval", "0", *flags]) == 0
    ds = IndexedDataset(prefix + "_text_document")
    assert len(ds) == len(texts)
    for k, ids in enumerate(expected):
        np.testing.assert_array_equal(ds[k], np.asarray(ids))


# --------------------------------------------------------------------------- bad inputs

@pytest.mark.parametrize("value", ["bigscience/tokenizer", "gpt2"])
def test_hub_name_is_refused(value):
    """A name that is not a local path is refused naming the flag and value: no Hub download."""
    with pytest.raises(ConfigError) as err:
        build_tokenizer(choice(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=value))
    msg = str(err.value)
    assert f"--tokenizer-name-or-path {value!r}: no such file or directory" in msg
    assert "never downloaded from the Hugging Face Hub" in msg


@pytest.mark.parametrize("kw,fragment", [
    (dict(tokenizer_type="PretrainedFromHF"), "--tokenizer-type PretrainedFromHF needs "
                                              "--tokenizer-name-or-path"),
    (dict(tokenizer_type="GPTSentencePieceTokenizer"),
     "--tokenizer-type GPTSentencePieceTokenizer needs --tokenizer-model"),
    (dict(tokenizer_type="GPTSentencePieceTokenizer", tokenizer_model="MISSING"),
     "--tokenizer-model {MISSING!r}: no such file (GPTSentencePieceTokenizer .model file)"),
    (dict(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path="MISSING"),
     "--tokenizer-name-or-path {MISSING!r}: no such file or directory"),
], ids=["hf-no-path", "spm-no-model", "spm-missing-model", "hf-missing-path"])
def test_missing_tokenizer_paths(tmp_path, kw, fragment):
    """Missing flags and missing files: one error naming the flag (and path)."""
    missing = str(tmp_path / "missing" / "tokenizer.model")
    kw = {k: (missing if v == "MISSING" else v) for k, v in kw.items()}
    with pytest.raises(ConfigError) as err:
        build_tokenizer(choice(**kw))
    assert fragment.replace("{MISSING!r}", repr(missing)) in str(err.value)


def test_bad_tokenizer_files(hf_tokenizer_dir, tmp_path):
    """A file that is not a sentencepiece model, a tokenizers JSON not named tokenizer.json, and a
    directory without a tokenizer: each refused naming the flag and the path."""
    import shutil

    not_spm = tmp_path / "tokenizer.model"
    not_spm.write_text("not a model")
    with pytest.raises(ConfigError, match=r"--tokenizer-model '.*tokenizer\.model' is not a "
                                          r"sentencepiece model"):
        build_tokenizer(choice(tokenizer_type="GPTSentencePieceTokenizer",
                           tokenizer_model=str(not_spm)))
    renamed = tmp_path / "bloom.json"
    shutil.copy(f"{hf_tokenizer_dir}/tokenizer.json", renamed)
    with pytest.raises(ConfigError, match=r"--tokenizer-name-or-path '.*bloom\.json': a tokenizer "
                                          r"file must be named tokenizer\.json"):
        build_tokenizer(choice(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(renamed)))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ConfigError, match=r"--tokenizer-name-or-path '.*empty': could not load a "
                                          r"tokenizer from it"):
        build_tokenizer(choice(tokenizer_type="PretrainedFromHF", tokenizer_name_or_path=str(empty)))


@pytest.mark.parametrize("extra,named", [
    (["--vocab-file", "gpt2-vocab.json"], "--tokenizer-type GPT2BPETokenizer needs --vocab-file "
                                          "and --merge-file"),
    (["--tokenizer-model", "tok.model"], "--tokenizer-model 'tok.model' given without "
                                         "--tokenizer-type"),
], ids=["vocab-only", "tokenizer-model"])
def test_tokenizer_files_without_type_are_an_error(extra, named, capsys):
    """File flags without --tokenizer-type that name no tokenizer: a vocabulary without merges
    (GPT-2 BPE needs both), or a --tokenizer-model that several types read. pretrain_gpt's flags
    exit 2 naming the flags and values, preprocess_data.py and build_tokenizer likewise."""
    from megatron.config.parser import parse_args
    from tools.preprocess_data import main

    with pytest.raises(SystemExit) as info:
        parse_args(RUN_FLAGS + extra, world_size=1)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert named in err
    with pytest.raises(SystemExit) as info:
        main(["--input", "in.jsonl", "--output-prefix", "out", *extra])
    assert info.value.code == 2
    assert named in capsys.readouterr().err
    kw = {"--vocab-file": "vocab_file", "--merge-file": "merge_file",
          "--tokenizer-model": "tokenizer_model"}
    with pytest.raises(ConfigError, match=named):
        build_tokenizer(choice(tokenizer_type=None,
                           **{kw[f]: v for f, v in zip(extra[::2], extra[1::2], strict=False)}))


def test_vocab_and_merge_files_without_type_mean_gpt2_bpe(bpe_files, tmp_path, capsys):
    """--vocab-file/--merge-file without --tokenizer-type: GPT-2 BPE, as Megatron-LM's and
    Microsoft's pretrain_gpt.py (args_defaults={'tokenizer_type': 'GPT2BPETokenizer'}), in
    pretrain_gpt's flags (the start-up line says why), preprocess_data.py and build_tokenizer."""
    from megatron.config.parser import parse_args
    from tools.preprocess_data import main

    files = ["--vocab-file", str(bpe_files / "vocab.json"),
             "--merge-file", str(bpe_files / "merges.txt")]
    args = parse_args(RUN_FLAGS + files, world_size=1)
    assert args.tokenizer_type == "GPT2BPETokenizer"
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    tok = setup.tokenizer
    assert isinstance(tok, GPT2BPETokenizer)
    assert setup.notes[-1].startswith(
        "tokenizer: GPT2BPETokenizer (no --tokenizer-type: --vocab-file/--merge-file mean "
        "GPT2BPETokenizer, as in Megatron-LM), ")
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"text": "hello world"}\n')
    assert main(["--input", str(docs), "--output-prefix", str(tmp_path / "out"), *files]) == 0
    assert "tokenizer: GPT2BPETokenizer (no --tokenizer-type" in capsys.readouterr().err
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    dataset = IndexedDataset(str(tmp_path / "out_text_document"))  # kept: its mmap backs ds[0]
    assert dataset[0].tolist() == tok.tokenize("hello world")


def test_no_tokenizer_flags_mean_byte_level():
    """No tokenizer flag at all: the byte-level default, resolved by validation."""
    from megatron.config.parser import parse_args

    args = parse_args(RUN_FLAGS, world_size=1)
    assert args.tokenizer_type == "ByteLevelTokenizer"
    assert isinstance(build_tokenizer(choice(tokenizer_type=None)), ByteLevelTokenizer)


def test_file_flags_another_type_ignores_are_noted(hf_tokenizer_dir):
    """Tokenizer file flags the chosen type does not read (a script written for another
    tokenizer): accepted as Megatron-LM does, with one start-up warning naming them."""
    args = run_args("--tokenizer-type", "PretrainedFromHF", "--tokenizer-name-or-path",
                    hf_tokenizer_dir, "--vocab-file", "gpt2-vocab.json")
    assert tokenizer_setup_from_args(args).notes[1] == ("warning: --vocab-file 'gpt2-vocab.json' not used by "
                                     "--tokenizer-type PretrainedFromHF (it reads "
                                     "--tokenizer-name-or-path)")
    args = run_args("--tokenizer-type", "ByteLevelTokenizer", "--tokenizer-model", "tok.model")
    assert tokenizer_setup_from_args(args).notes[1] == ("warning: --tokenizer-model 'tok.model' not used by "
                                     "--tokenizer-type ByteLevelTokenizer (it reads no files)")
    args = run_args("--tokenizer-type", "ByteLevelTokenizer")
    assert len(tokenizer_setup_from_args(args).notes) == 1
