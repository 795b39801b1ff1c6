"""End to end: every data path trains on a small corpus whose validation or test split holds fewer
tokens than one sample (Megatron-LM's default-style three-way splits ``949,50,1`` and ``969,30,1``
on 600 documents leave the test split one short document), through the deepspeed launcher with 2
CPU ranks: such a split's epochs span several passes over its documents, as megatron-core's
GPTDataset builds them, with one start-up note, and the run trains and evaluates it.

One launch per data path: ``--data-path`` with one and with several prefixes,
``--{train,valid,test}-data-path``, a blend file, weighted split paths (two validation groups
from a ``-path`` file, each logged on its own). The compat scripts' launches
(tests/e2e/test_compat_scripts.py) cover the same with Megatron-LM's and Microsoft's flags: their
corpus ends with a short document (tools/make_compat_data.py)."""
import json

import numpy as np
import pytest

from helpers.curriculum import write_corpus
from helpers.launch import read_jsonl, run_deepspeed

pytestmark = pytest.mark.launch

SEQ = 128
ITERS = 3
NOTE = "less than one sample of seq_length 128 (129 tokens): each of its epochs is"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """Two 600-document corpora whose last document is short (68 and 30 tokens: the one-document
    test split of both three-way splits), and a 2-document one of 40 tokens in all."""
    d = tmp_path_factory.mktemp("small_corpus")
    rng = np.random.default_rng(0)
    out = {}
    for k, (name, last) in enumerate((("pile", 68), ("wiki", 30))):
        lengths = list(rng.integers(40, 300, 599)) + [last]
        out[name] = write_corpus(str(d / f"{name}_text_document"), lengths, k)
    out["tiny"] = write_corpus(str(d / "tiny_text_document"), [25, 15], 9)
    return out


def _flags(run_dir, data_flags):
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", str(ITERS),
            "--lr", "1e-3", "--log-interval", "1", "--eval-interval", str(ITERS),
            "--eval-iters", "1", "--data-cache-path", str(run_dir / "cache"),
            "--metrics-jsonl", str(run_dir / "m.jsonl"), *data_flags]


def _train(run_dir, data_flags):
    """Launch; returns (stdout, training records, {(split, group): its evaluation records})."""
    proc = run_deepspeed("pretrain_gpt.py", _flags(run_dir, data_flags))
    records = read_jsonl(run_dir / "m.jsonl")
    train = [r for r in records if "split" not in r]
    assert [r["iteration"] for r in train] == list(range(1, ITERS + 1)), proc.stdout[-3000:]
    assert all(np.isfinite(r["lm_loss"]) for r in train)
    evals = {}
    for r in records:
        if "split" in r:
            assert np.isfinite(r["lm_loss"]), r
            evals.setdefault((r["split"], r["group"]), []).append(r)
    return proc.stdout, train, evals


def _notes(stdout):
    return [line for line in stdout.splitlines() if NOTE in line]


def test_data_path_one_prefix_949_50_1(corpus, tmp_path):
    """The issue's command: one prefix, ``--split 949,50,1``, ``--seq-length 128``: the test
    split (document 599, 68 tokens) is drawn in epochs of 2 passes, and evaluated."""
    stdout, _, evals = _train(tmp_path, ["--data-path", corpus["pile"], "--split", "949,50,1"])
    notes = _notes(stdout)
    assert len(notes) == 1 and notes[0].startswith(
        f"test data {corpus['pile']!r} (documents 599:600) has 68 tokens"), notes
    assert "each of its epochs is 2 passes over its documents (1 sample)" in notes[0]
    assert set(evals) == {("valid", "valid"), ("test", "test")}


def test_data_path_several_prefixes_969_30_1(corpus, tmp_path):
    stdout, train, evals = _train(tmp_path, ["--data-path", "0.7", corpus["pile"], "0.3",
                                             corpus["wiki"], "--split", "969,30,1"])
    notes = _notes(stdout)
    assert len(notes) == 2, notes  # each prefix's test split: 68 tokens (2 passes), 30 (5)
    assert "each of its epochs is 5 passes" in notes[1] and "(documents 599:600) has 30" in notes[1]
    assert set(evals) == {("valid", "valid"), ("test", "test")}
    assert set(train[-1]["samples_drawn"]) == {"pile", "wiki"}


def test_train_valid_test_data_paths(corpus, tmp_path):
    """``--valid-data-path`` and ``--test-data-path`` of a whole corpus of 40 tokens."""
    stdout, _, evals = _train(tmp_path, ["--train-data-path", corpus["pile"],
                                         "--valid-data-path", corpus["tiny"],
                                         "--test-data-path", corpus["tiny"]])
    notes = _notes(stdout)
    assert len(notes) == 2 and all("has 40 tokens" in n and "4 passes" in n for n in notes), notes
    assert {n.split(" ")[0] for n in notes} == {"valid", "test"}
    assert set(evals) == {("valid", "valid"), ("test", "test")}


def test_blend_file(corpus, tmp_path):
    """A blend file whose test group is the last document of a corpus and whose training blend
    draws a 30-token range too (the training split follows the same rule)."""
    config = {"train": {"blend": [{"path": corpus["pile"], "split": "0:0.949", "weight": 1},
                                  {"path": corpus["wiki"], "split": "0.999:1", "weight": 0.1}]},
              "valid": [{"name": "pile_valid", "path": corpus["pile"], "split": "0.949:0.999"}],
              "test": [{"name": "pile_tail", "path": corpus["pile"], "split": "0.999:1"}]}
    (tmp_path / "blend.json").write_text(json.dumps(config))
    stdout, train, evals = _train(tmp_path, ["--data-blend-config", str(tmp_path / "blend.json")])
    notes = _notes(stdout)
    assert sorted(n.split(" ")[0] for n in notes) == ["test", "train"], notes
    assert set(evals) == {("valid", "pile_valid"), ("test", "pile_tail")}
    assert sum(train[-1]["samples_drawn"].values()) == 4 * ITERS


def test_weighted_split_paths(corpus, tmp_path):
    """BigScience's weighted split paths: a ``-path`` file of two validation groups, one of them
    the short last document; each group is evaluated and logged under its own name."""
    groups = tmp_path / "valid_groups.txt"
    groups.write_text(f'"VALID_PILE: 1 0.949:0.999 {corpus["pile"]}" '
                      f'"VALID_TAIL: 1 0.999:1 {corpus["wiki"]}"\n')
    stdout, train, evals = _train(tmp_path, [
        "--train-weighted-split-paths",
        f"TRAIN: 0.6 0:0.949 {corpus['pile']}, 0.4 0:0.949 {corpus['wiki']}",
        "--valid-weighted-split-paths-path", str(groups)])
    notes = _notes(stdout)
    assert len(notes) == 1 and notes[0].startswith("valid data") and "30 tokens" in notes[0], notes
    assert [g for _, g in evals] == ["VALID_PILE", "VALID_TAIL"]
    assert set(train[0]["per_dataset_loss"]) <= {"pile", "wiki"}
