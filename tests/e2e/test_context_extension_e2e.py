"""End to end: a context-extension stage (docs/context_extension.md), in one run and by resume.

A RoPE model trains 6 iterations at --seq-length 64 (16 sequences per step) on a blend file of
three small datasets with a validation group; then the context stage: --seq-length 256,
--rotary-base 500000, 4 sequences per step (tokens per step kept), to iteration 30.

* In one run: the stage in the --lr-schedule-config file (``context_stages``) switches in process
  after iteration 6; the launch stops at 18 (inside the stage) and is resumed to 30 with the same
  flags.
* By resume: its checkpoint at 6 (the stage before's, as a first launch leaves it) resumed with
  the stage's flags, --extend-context and --override-opt_param-scheduler.

Iterations 7-30 and the evaluations equal bit for bit (loss, grad norm, LR, per-dataset losses
and samples drawn), and so do both checkpoints' model context and data ledger at 30. Then
tools/data_provenance.py --coverage shows every dataset's first epoch, begun at 64 tokens and
finished at 256, drawn as one contiguous token range with nothing twice; every sample's tokens
are those of a pure reference of the dataset's token stream (megatron-core's document order and
reader); and the iterations after the stop at 18 are those the checkpoint there predicted (the
data continue bitwise). Three launches of a 1-layer model."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from helpers.curriculum import write_corpus
from helpers.launch import read_jsonl, run_single_process
from helpers.paths import ROOT

pytestmark = pytest.mark.launch

SEED = 1234
BLEND = """\
train:
  blend:
    - {{path: {short}, weight: 1}}
    - {{path: {mid}, weight: 2}}
    - {{path: {long}, weight: 3}}
valid:
  - {{name: heldout, path: {long}}}
"""
LR = """\
lr_schedule:
  - {start: 0, schedule: {type: linear, from: 0.0, to: 2.0e-3}}
  - {start: 2, schedule: {type: cosine, from: 2.0e-3, to: 2.0e-4}}
"""
STAGE = """\
context_stages:
  - {start: 6, seq_length: 256, max_position_embeddings: 256, rotary_base: 500000, global_batch_size: 4}
"""
COMPARED = ("lm_loss", "grad_norm", "lr", "consumed_samples", "seq_length", "samples_drawn",
            "per_dataset_loss")


def flags(tmp_path, run, seq, gbs, schedule, *extra):
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--position-embedding-type", "rope", "--seq-length", str(seq),
            "--max-position-embeddings", str(seq), "--micro-batch-size", "2",
            "--global-batch-size", str(gbs), "--train-iters", "30", "--lr", "1e-3",
            "--lr-schedule-config", str(tmp_path / schedule), "--log-interval", "1",
            "--eval-iters", "1", "--eval-interval", "6", "--save-interval", "6",
            "--seed", str(SEED), "--data-blend-config", str(tmp_path / "blend.yaml"),
            "--data-cache-path", str(tmp_path / "cache"), "--save", str(tmp_path / run / "ckpt"),
            "--metrics-jsonl", str(tmp_path / run / "metrics.jsonl"), *extra]


def provenance(argv, out, coverage=None):
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import data_provenance

    data_provenance.main(argv + ["--output", str(out)]
                         + (["--coverage", str(coverage)] if coverage else []))
    return read_jsonl(out)


def stream(prefix):
    """The pure reference of a dataset's token stream: its documents in megatron-core's one-epoch
    order (a RandomState(seed) shuffle), read with megatron-core's reader."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    indexed = IndexedDataset(prefix, multimodal=False, mmap=True)
    order = np.arange(len(indexed), dtype=np.int32)
    np.random.RandomState(SEED).shuffle(order)
    return np.concatenate([indexed.get(int(d)) for d in order]).astype(np.int64)


def records(path):
    rows = read_jsonl(path)
    return ([{k: r.get(k) for k in ("iteration",) + COMPARED} for r in rows if "split" not in r],
            [r for r in rows if "split" in r])


def test_an_extension_stage_in_one_run_equals_the_resume_and_covers_each_stream_once(tmp_path, capfd):
    rng = np.random.default_rng(3)
    data = {name: write_corpus(str(tmp_path / name), rng.integers(20, 300, docs), seed=k)
            for k, (name, docs) in enumerate((("short", 12), ("mid", 24), ("long", 36)))}
    (tmp_path / "blend.yaml").write_text(BLEND.format(**data))
    (tmp_path / "lr.yaml").write_text(LR)
    (tmp_path / "staged.yaml").write_text(LR + STAGE)
    one, two = tmp_path / "one", tmp_path / "two"
    staged = flags(tmp_path, "one", 64, 16, "staged.yaml")
    log = run_single_process("pretrain_gpt.py", staged + ["--exit-interval", "18"], check=True).stdout
    assert "context stages in one run" in log and "context stage 1 (" in log, log[-3000:]
    assert "the training data continues at --seq-length 256 from global sample 96" in log
    # the checkpoint at the stage's start is the stage before's, as a first launch leaves it
    assert json.loads((one / "ckpt" / "iter_0000006" / "model_args.json").read_text())[
        "defaults"]["seq_length"] == 64
    (two / "ckpt").mkdir(parents=True)
    shutil.copytree(one / "ckpt" / "iter_0000006", two / "ckpt" / "iter_0000006")
    (two / "ckpt" / "latest_checkpointed_iteration.txt").write_text("6")
    # what the checkpoint at 18 says the rest of the run draws, then the unchanged resume (no
    # --extend-context: the checkpoint is the stage's)
    loaded = staged + ["--load", str(one / "ckpt")]
    predicted = provenance(loaded + ["--iterations", "19:30"], tmp_path / "predicted.jsonl")
    log = run_single_process("pretrain_gpt.py", loaded, check=True).stdout
    assert "resumed from --load" in log and "context stage 1 (" not in log
    # by resume: the stage's flags and the directive (the LR spans count samples of the new batch)
    resumed = flags(tmp_path, "two", 256, 4, "lr.yaml", "--rotary-base", "500000",
                    "--extend-context", "--override-opt_param-scheduler", "--load",
                    str(two / "ckpt"))
    log = run_single_process("pretrain_gpt.py", resumed, check=True).stdout
    assert "--extend-context: a context-extension stage" in log

    train_one, eval_one = records(one / "metrics.jsonl")
    train_two, eval_two = records(two / "metrics.jsonl")
    assert [r["iteration"] for r in train_one] == list(range(1, 31))
    assert [r["seq_length"] for r in train_one] == [64] * 6 + [256] * 24
    assert train_one[6:] == train_two and all(np.isfinite(r["lm_loss"]) for r in train_two)
    assert [r["iteration"] for r in eval_one] == [6, 12, 18, 24, 30] and eval_one[1:] == eval_two
    # the one run counts each stage's samples at its length
    tokens = [r["consumed_tokens"] for r in read_jsonl(one / "metrics.jsonl") if "split" not in r]
    assert tokens[5:7] == [96 * 64, 96 * 64 + 4 * 256]
    for record in ("model_args.json", "data_mix.json"):
        a, b = (json.loads((d / "ckpt" / "iter_0000030" / record).read_text()) for d in (one, two))
        assert a == b, record

    capfd.readouterr()
    drawn = provenance(resumed + ["--iterations", "1:30"], tmp_path / "provenance.jsonl",
                       tmp_path / "coverage.json")
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("coverage:")]
    assert [r for r in drawn if r["iteration"] >= 19] == predicted
    assert [r["global_sample"] for r in drawn] == list(range(96 + 24 * 4))
    assert {r["seq_length"] for r in drawn[:96]} == {64} and {r["seq_length"] for r in drawn[96:]} == {256}
    # each record's tokens are the stream's at the ranges it names (the training batches'
    # tokens are those records': tests/e2e/test_mix_edit_e2e.py)
    streams = {name: stream(prefix) for name, prefix in data.items()}
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    readers = {name: IndexedDataset(prefix) for name, prefix in data.items()}  # held: views of maps
    for r in drawn:
        idx = np.concatenate([np.arange(a, b) for a, b in r["tokens"]])
        read = np.concatenate([readers[r["dataset"]].get(doc, offset=first, length=last - first + 1)
                               for doc, first, last in r["documents"]])
        # the documents hold the inputs and each range's last label
        labels = np.concatenate([np.arange(a + 1, b + 1) for a, b in r["tokens"]])
        want = np.unique(np.concatenate([idx, labels]))
        assert np.array_equal(np.sort(read), np.sort(streams[r["dataset"]][want])), r
    with open(tmp_path / "coverage.json") as f:
        coverage = json.load(f)
    ledger = {e["name"]: e for e in json.loads((two / "ckpt" / "iter_0000030" / "data_mix.json")
                                               .read_text())["ledger"]}
    for name in data:
        n64 = (len(streams[name]) - 1) // 64
        epoch0 = coverage[name]["0"]
        assert epoch0["ranges"] == [[0, n64 * 64]] and epoch0["repeated"] == [], name
        assert set(epoch0["samples"]) == {"64", "256"}, name  # begun at 64, finished at 256
        assert [(p["seq_length"], p["drawn"]) for p in ledger[name]["prior"]] == [
            (64, epoch0["samples"]["64"])]
        assert any(f"{name} epoch 0: tokens [0, {n64 * 64}) contiguous" in line and
                   "none drawn twice" in line for line in lines), lines
        assert all(c["repeated"] == [] for c in coverage[name].values()), name
