"""preprocess_jsonl / tools/preprocess_data.py: round trips through megatron-core IndexedDataset."""

import importlib.util
import json
import os
import subprocess
import sys

import numpy
import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from helpers.paths import ROOT
from megatron.data.preprocess import output_prefix_for_key, preprocess_jsonl
from megatron.tokenizer import ByteLevelTokenizer
from megatron.tokenizer.types import tokenizer_config

TEXTS = ["Hello world.", "Zoë visited Kraków — 日本語!", "", "def f(x):\n    return x * 2\n",
         "a" * 1000, '{"json": "inside text"}']
BYTE = tokenizer_config(tokenizer_type="ByteLevelTokenizer")


def write_jsonl(path, records, blank_lines=False):
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
            if blank_lines:
                f.write("\n")
    return str(path)


def read_docs(prefix):
    """All documents of an indexed dataset as lists of ints (one sequence per document)."""
    ds = IndexedDataset(prefix)
    assert len(ds.document_indices) - 1 == len(ds)  # one sequence per document
    return [ds[i].tolist() for i in range(len(ds))], ds


def expected(texts, eod):
    tok = ByteLevelTokenizer()
    return [tok.tokenize(t) + ([tok.eod] if eod else []) for t in texts]


@pytest.mark.parametrize("append_eod", [False, True])
def test_text_round_trip(tmp_path, append_eod):
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": t, "other": 1} for t in TEXTS],
                       blank_lines=True)
    res = preprocess_jsonl(path, str(tmp_path / "out"), ["text"], BYTE, append_eod=append_eod,
                           log_interval=0)
    prefix = output_prefix_for_key(str(tmp_path / "out"), "text")
    assert res.prefixes == {"text": prefix} and prefix.endswith("out_text_document")
    docs, ds = read_docs(prefix)
    assert docs == expected(TEXTS, append_eod)
    assert ds[0].dtype == numpy.uint16
    assert res.num_documents == len(TEXTS)
    assert res.num_tokens["text"] == sum(map(len, docs))
    tok = ByteLevelTokenizer()
    assert tok.detokenize(docs[1]).startswith(TEXTS[1])
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "out_text_document.bin",
                                            "out_text_document.idx"]


def test_inputs_targets_same_document_count(tmp_path):
    recs = [{"inputs": f"Question {i}: what is {i} + {i}?", "targets": f"{2 * i}"}
            for i in range(50)]
    path = write_jsonl(tmp_path / "t0.jsonl", recs)
    res = preprocess_jsonl(path, str(tmp_path / "t0"), ["inputs", "targets"], BYTE,
                           append_eod=True, log_interval=0)
    inputs, _ = read_docs(res.prefixes["inputs"])
    targets, _ = read_docs(res.prefixes["targets"])
    assert len(inputs) == len(targets) == res.num_documents == 50
    assert inputs == expected([r["inputs"] for r in recs], True)
    assert targets == expected([r["targets"] for r in recs], True)
    assert os.path.exists(str(tmp_path / "t0_inputs_document.idx"))
    assert os.path.exists(str(tmp_path / "t0_targets_document.bin"))


def test_workers_preserve_order_and_bytes(tmp_path):
    recs = [{"text": f"document {i} " + "xyz" * (i % 7)} for i in range(300)]
    path = write_jsonl(tmp_path / "in.jsonl", recs)
    one = preprocess_jsonl(path, str(tmp_path / "w1"), ["text"], BYTE, append_eod=True,
                           workers=1, log_interval=0)
    two = preprocess_jsonl(path, str(tmp_path / "w2"), ["text"], BYTE, append_eod=True,
                           workers=2, chunk_size=4, log_interval=0)
    for ext in (".bin", ".idx"):
        with open(one.prefixes["text"] + ext, "rb") as a, open(two.prefixes["text"] + ext,
                                                               "rb") as b:
            assert a.read() == b.read()


def test_bpe_tokenizer_dtype_and_eod(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXTS * 3, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(tmp_path / "tokenizer.json"))
    args = tokenizer_config(tokenizer_type="HuggingFaceTokenizer",
                            tokenizer_model=str(tmp_path / "tokenizer.json"))
    path = write_jsonl(tmp_path / "in.jsonl", [{"text": t} for t in TEXTS])
    res = preprocess_jsonl(path, str(tmp_path / "hf"), ["text"], args, append_eod=True,
                           log_interval=0)
    docs, _ = read_docs(res.prefixes["text"])
    eod = tok.token_to_id("<|endoftext|>")
    assert all(d[-1] == eod for d in docs)
    assert [tok.decode(d[:-1]) for d in docs] == TEXTS


@pytest.mark.parametrize("workers", [1, 2])
def test_missing_json_key_names_key_and_line(tmp_path, workers):
    recs = [{"text": "ok", "inputs": "a"}] * 3 + [{"inputs": "no text here"}]
    path = write_jsonl(tmp_path / "in.jsonl", recs)
    with pytest.raises(ValueError) as err:
        preprocess_jsonl(path, str(tmp_path / "out"), ["inputs", "text"], BYTE,
                         workers=workers, log_interval=0)
    msg = str(err.value)
    assert "'text'" in msg and "line 4" in msg
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]  # no partial outputs left behind


def test_bad_json_and_missing_input(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"text": "fine"}\n{"text": broken\n')
    with pytest.raises(ValueError, match="line 2"):
        preprocess_jsonl(str(path), str(tmp_path / "out"), ["text"], BYTE, log_interval=0)
    with pytest.raises(ValueError, match="--input.*nope.jsonl"):
        preprocess_jsonl(str(tmp_path / "nope.jsonl"), str(tmp_path / "out"), ["text"], BYTE)


def _load_tool():
    spec = importlib.util.spec_from_file_location(
        "preprocess_data_tool", os.path.join(ROOT, "tools", "preprocess_data.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_cli_main_error_is_reported(tmp_path, capsys):
    tool = _load_tool()
    path = write_jsonl(tmp_path / "in.jsonl", [{"inputs": "x"}])
    rc = tool.main(["--input", path, "--output-prefix", str(tmp_path / "o"),
                    "--json-keys", "targets"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "'targets'" in err and "line 1" in err


@pytest.mark.launch
def test_cli_subprocess_with_workers(tmp_path):
    recs = [{"inputs": f"in {i} ünïcode", "targets": f"out {i}"} for i in range(40)]
    path = write_jsonl(tmp_path / "in.jsonl", recs)
    out = str(tmp_path / "cli")
    proc = subprocess.run(
        [sys.executable, os.path.join("tools", "preprocess_data.py"), "--input", path,
         "--output-prefix", out, "--json-keys", "inputs", "targets",
         "--tokenizer-type", "ByteLevelTokenizer", "--append-eod", "--workers", "2",
         "--log-interval", "10"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "docs/s" in proc.stderr and "MB/s" in proc.stderr
    inputs, _ = read_docs(out + "_inputs_document")
    targets, _ = read_docs(out + "_targets_document")
    assert inputs == expected([r["inputs"] for r in recs], True)
    assert targets == expected([r["targets"] for r in recs], True)
