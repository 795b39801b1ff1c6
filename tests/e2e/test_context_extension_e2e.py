"""End to end: a context-extension stage by resume (docs/context_extension.md). A RoPE model
trained 6 iterations at --seq-length 64 on a blend file of three datasets is resumed with
--extend-context at --seq-length 256, --rotary-base 500000 and a quarter of the sequences per step
(tokens per step kept), on 2 ranks, stopped inside the long stage and resumed unchanged.
tools/data_provenance.py --coverage then shows every dataset's first epoch, begun at 64 tokens
and finished at 256, drawn as one contiguous token range with nothing twice; every sample's
tokens are those of a pure reference of the dataset's token stream (megatron-core's document
order and reader); and the resume inside the long stage draws exactly what the checkpoint before
it said it would (the data continue bitwise)."""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from helpers.curriculum import write_corpus
from helpers.launch import read_jsonl, run_deepspeed, run_single_process
from helpers.paths import ROOT

pytestmark = pytest.mark.launch

SEED = 1234
BLEND = """\
train:
  blend:
    - {{path: {short}, weight: 1}}
    - {{path: {mid}, weight: 2}}
    - {{path: {long}, weight: 3}}
"""


def flags(tmp_path, seq, gbs, iters, *extra):
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--position-embedding-type", "rope", "--seq-length", str(seq),
            "--max-position-embeddings", str(seq), "--micro-batch-size", "2",
            "--global-batch-size", str(gbs), "--train-iters", str(iters), "--lr", "1e-3",
            "--log-interval", "1", "--eval-iters", "0", "--seed", str(SEED),
            "--data-blend-config", str(tmp_path / "blend.yaml"),
            "--data-cache-path", str(tmp_path / "cache"), "--save", str(tmp_path / "ckpt"),
            "--metrics-jsonl", str(tmp_path / "metrics.jsonl"), *extra]


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


def test_an_extension_stage_covers_each_token_stream_once(tmp_path, capfd):
    rng = np.random.default_rng(3)
    data = {name: write_corpus(str(tmp_path / name), rng.integers(20, 300, docs), seed=k)
            for k, (name, docs) in enumerate((("short", 12), ("mid", 24), ("long", 36)))}
    (tmp_path / "blend.yaml").write_text(BLEND.format(**data))
    load = ["--load", str(tmp_path / "ckpt")]
    run_single_process("pretrain_gpt.py", flags(tmp_path, 64, 16, 6), check=True)
    # the LR's spans count samples of the new batch: --override-opt_param-scheduler
    stage2 = flags(tmp_path, 256, 4, 30, "--rotary-base", "500000", "--extend-context",
                   "--override-opt_param-scheduler") + load
    # (without --extend-context the resume is one error: tests/unit/test_context_extension.py)
    first = run_deepspeed("pretrain_gpt.py", stage2 + ["--exit-interval", "18"])
    assert "--extend-context: a context-extension stage" in first.stdout
    assert "the training data continues at --seq-length 256 from global sample 96" in first.stdout
    # what the checkpoint at 18 says the rest of the stage draws, then the unchanged resume
    predicted = provenance(stage2 + ["--iterations", "19:30"], tmp_path / "predicted.jsonl")
    run_single_process("pretrain_gpt.py", stage2, check=True)
    capfd.readouterr()
    records = provenance(stage2 + ["--iterations", "1:30"], tmp_path / "provenance.jsonl",
                         tmp_path / "coverage.json")
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("coverage:")]
    assert [r for r in records if r["iteration"] >= 19] == predicted
    assert [r["global_sample"] for r in records] == list(range(96 + 24 * 4))
    assert {r["seq_length"] for r in records[:96]} == {64} and {r["seq_length"] for r in records[96:]} == {256}

    # each record's tokens are the stream's at the ranges it names (the training batches'
    # tokens are those records': tests/e2e/test_mix_edit_e2e.py)
    streams = {name: stream(prefix) for name, prefix in data.items()}
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    readers = {name: IndexedDataset(prefix) for name, prefix in data.items()}  # held: views of maps
    for r in records:
        idx = np.concatenate([np.arange(a, b) for a, b in r["tokens"]])
        read = np.concatenate([readers[r["dataset"]].get(doc, offset=first, length=last - first + 1)
                               for doc, first, last in r["documents"]])
        # the documents hold the inputs and each range's last label
        labels = np.concatenate([np.arange(a + 1, b + 1) for a, b in r["tokens"]])
        want = np.unique(np.concatenate([idx, labels]))
        assert np.array_equal(np.sort(read), np.sort(streams[r["dataset"]][want])), r

    with open(tmp_path / "coverage.json") as f:
        coverage = json.load(f)
    with open(tmp_path / "ckpt" / "iter_0000030" / "data_mix.json") as f:
        ledger = {e["name"]: e for e in json.load(f)["ledger"]}
    for name in data:
        tokens = len(streams[name])
        n64 = (tokens - 1) // 64
        epoch0 = coverage[name]["0"]
        assert epoch0["ranges"] == [[0, n64 * 64]] and epoch0["repeated"] == [], name
        assert set(epoch0["samples"]) == {"64", "256"}, name  # begun at 64, finished at 256
        assert [(p["seq_length"], p["drawn"]) for p in ledger[name]["prior"]] == [
            (64, epoch0["samples"]["64"])]
        assert any(f"{name} epoch 0: tokens [0, {n64 * 64}) contiguous" in line and
                   "none drawn twice" in line for line in lines), lines
        for epoch, c in coverage[name].items():
            assert c["repeated"] == [], (name, epoch)
    # losses stayed finite across the change
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert [r["iteration"] for r in train][-1] == 30 and all(np.isfinite(r["lm_loss"]) for r in train)


# ---- in one run: the stage in the schedule file (docs/context_extension.md#in-one-run) ----

LR = """\
lr_schedule:
  - {start: 0, schedule: {type: linear, from: 0.0, to: 2.0e-3}}
  - {start: 2, schedule: {type: cosine, from: 2.0e-3, to: 2.0e-4}}
"""
STAGE = """\
context_stages:
  - {start: 3, seq_length: 256, max_position_embeddings: 256, rotary_base: 500000, global_batch_size: 4}
"""
BLEND_VALID = BLEND + """\
valid:
  - {{name: heldout, path: {long}}}
"""
COMPARED = ("lm_loss", "grad_norm", "lr", "consumed_samples", "seq_length", "samples_drawn",
            "per_dataset_loss")


def _records(path):
    records = read_jsonl(path)
    return ([{k: r.get(k) for k in ("iteration",) + COMPARED} for r in records if "split" not in r],
            [r for r in records if "split" in r])


def test_a_stage_in_the_schedule_file_equals_the_two_launch_extension(tmp_path):
    """6 iterations, the context stage after iteration 3 (64 -> 256 tokens per sample, RoPE
    base 10000 -> 500000, 16 -> 4 sequences per step), on three datasets with a validation
    group. One launch with the stage in --lr-schedule-config switches in process at iteration 3
    and stops at 4; resumed there (inside the stage, same flags), it runs to 6. Iterations 4-6
    and the evaluations at 3 and 6 equal bit for bit (loss, grad norm, LR, per-dataset losses
    and samples drawn) the two-launch version's second launch: the stage-1 checkpoint of
    iteration 3 resumed with the stage-2 flags and --extend-context. The checkpoints of
    iteration 6 record the same model context and data ledger. (The first launch of the
    two-launch version is the one launch up to iteration 3: stage 0 is the command line,
    tests/unit/test_context_stages.py.) Three launches of a 1-layer model."""
    rng = np.random.default_rng(3)
    data = {name: write_corpus(str(tmp_path / name), rng.integers(20, 300, docs), seed=k)
            for k, (name, docs) in enumerate((("short", 12), ("mid", 24), ("long", 36)))}
    (tmp_path / "blend.yaml").write_text(BLEND_VALID.format(**data))
    (tmp_path / "lr.yaml").write_text(LR)
    (tmp_path / "staged.yaml").write_text(LR + STAGE)

    def run(name, seq, gbs, schedule, *extra):
        out = tmp_path / name
        renamed = {str(tmp_path / "ckpt"): str(out / "ckpt"),
                   str(tmp_path / "metrics.jsonl"): str(out / "metrics.jsonl")}
        argv = [renamed.get(a, a) for a in flags(
            tmp_path, seq, gbs, 6, "--lr-schedule-config", str(tmp_path / schedule),
            "--eval-iters", "1", "--eval-interval", "3", "--save-interval", "3", *extra)]
        return run_single_process("pretrain_gpt.py", argv, check=True).stdout

    one, two = tmp_path / "one", tmp_path / "two"
    log = run("one", 64, 16, "staged.yaml", "--exit-interval", "4")
    assert "context stages in one run" in log and "context stage 1 (" in log, log
    assert "the training data continues at --seq-length 256 from global sample 48" in log
    # the checkpoint at the stage's start is the stage before's, as a first launch leaves it
    assert json.loads((one / "ckpt" / "iter_0000003" / "model_args.json").read_text())[
        "defaults"]["seq_length"] == 64
    shutil.copytree(one / "ckpt", two / "ckpt")
    shutil.rmtree(two / "ckpt" / "iter_0000004")
    (two / "ckpt" / "latest_checkpointed_iteration.txt").write_text("3")
    log = run("one", 64, 16, "staged.yaml", "--load", str(one / "ckpt"))  # no --extend-context
    assert "resumed from --load" in log and "context stage 1 (" not in log
    run("two", 256, 4, "lr.yaml", "--rotary-base", "500000", "--extend-context",
        "--override-opt_param-scheduler", "--load", str(two / "ckpt"))
    train_one, eval_one = _records(one / "metrics.jsonl")
    train_two, eval_two = _records(two / "metrics.jsonl")
    assert [r["iteration"] for r in train_one] == list(range(1, 7))
    assert [r["seq_length"] for r in train_one] == [64] * 3 + [256] * 3
    assert train_one[3:] == train_two and all(r["lm_loss"] for r in train_two)
    assert [r["iteration"] for r in eval_one] == [3, 6] and eval_one[1:] == eval_two
    # the one launch counts each stage's samples at its length
    tokens = [r["consumed_tokens"] for r in read_jsonl(one / "metrics.jsonl") if "split" not in r]
    assert tokens == [16 * 64, 32 * 64, 48 * 64, 48 * 64 + 4 * 256, 48 * 64 + 8 * 256,
                      48 * 64 + 12 * 256]
    for record in ("model_args.json", "data_mix.json"):
        a, b = (json.loads((d / "ckpt" / "iter_0000006" / record).read_text()) for d in (one, two))
        assert a == b, record
