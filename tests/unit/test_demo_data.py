"""tools/make_demo_data.py: deterministic bytes, >= 3 distinguishable domains, loadable datasets."""

import importlib.util
import json
import os
import re

import pytest
from megatron.core.datasets.indexed_dataset import IndexedDataset

from helpers.paths import ROOT
from megatron.tokenizer import ByteLevelTokenizer

SIZE_MB = 0.1  # small corpus for speed; the default is larger


def _load_tool():
    spec = importlib.util.spec_from_file_location(
        "make_demo_data_tool", os.path.join(ROOT, "tools", "make_demo_data.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


tool = _load_tool()


def _read_all(directory):
    return {name: open(os.path.join(directory, name), "rb").read()
            for name in sorted(os.listdir(directory))}


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("demo_a"))
    tool.make_demo_data(d, size_mb=SIZE_MB, verbose=False)
    return d


def test_same_bytes_every_run(demo_dir, tmp_path):
    other = str(tmp_path / "demo_b")
    tool.make_demo_data(other, size_mb=SIZE_MB, verbose=False)
    first, second = _read_all(demo_dir), _read_all(other)
    assert sorted(first) == sorted(second)
    assert first == second
    expected = sorted(os.path.basename(p) for p in tool.demo_output_files(demo_dir))
    assert sorted(first) == expected


def test_different_seed_changes_text(tmp_path):
    a = tool.generate_domain("web", 20000, seed=1)
    b = tool.generate_domain("web", 20000, seed=2)
    assert a != b and a == tool.generate_domain("web", 20000, seed=1)


def test_domains_are_distinct_and_loadable(demo_dir):
    assert len(tool.DOMAINS) >= 3
    tok = ByteLevelTokenizer()
    texts = {}
    for domain in tool.DOMAINS:
        with open(os.path.join(demo_dir, f"{domain}.jsonl"), encoding="utf-8") as f:
            records = [json.loads(line) for line in f]
        assert records and all(r["domain"] == domain for r in records)
        total = sum(len(r["text"].encode()) for r in records)
        assert SIZE_MB * 2**20 <= total < SIZE_MB * 2**20 + 20000
        ds = IndexedDataset(os.path.join(demo_dir, f"{domain}_text_document"))
        assert len(ds) == len(records)
        for i in (0, len(records) - 1):
            ids = ds[i].tolist()
            assert ids[-1] == tok.eod
            assert tok.detokenize(ids[:-1]) == records[i]["text"]
        texts[domain] = "".join(r["text"] for r in records)
    assert "def " in texts["code"] and "def " not in texts["web"]
    assert "Answer:" in texts["math"] and "Answer:" not in texts["web"]
    assert not re.search(r"\d+ [-+*/] \d+ =", texts["web"])


def test_code_compiles_and_math_is_correct(demo_dir):
    with open(os.path.join(demo_dir, "code.jsonl"), encoding="utf-8") as f:
        for line in f:
            compile(json.loads(line)["text"], "<demo>", "exec")
    checked = 0
    with open(os.path.join(demo_dir, "math.jsonl"), encoding="utf-8") as f:
        for line in f:
            text = json.loads(line)["text"]
            for a, op, b, c in re.findall(r"(-?\d+) ([-+*/]) (\d+) = (-?\d+)", text):
                assert eval(f"{a} {op} {b}") == int(c), (a, op, b, c)
                checked += 1
            pattern = r"Solve for x: (\d+)x ([-+]) (\d+) = (-?\d+)\.\n.*The answer is (-?\d+)\."
            for m, sign, c, rhs, x in re.findall(pattern, text):
                assert int(m) * int(x) + int(f"{sign}{c}") == int(rhs)
                checked += 1
    assert checked > 100


def test_skips_existing_unless_forced(demo_dir, capsys):
    stamp = {p: os.stat(p).st_mtime_ns for p in tool.demo_output_files(demo_dir)}
    tool.make_demo_data(demo_dir, size_mb=SIZE_MB)
    assert "up to date" in capsys.readouterr().out
    assert stamp == {p: os.stat(p).st_mtime_ns for p in tool.demo_output_files(demo_dir)}
    before = _read_all(demo_dir)
    tool.make_demo_data(demo_dir, size_mb=SIZE_MB, force=True)
    assert "wrote" in capsys.readouterr().out
    assert _read_all(demo_dir) == before
