"""End to end: a run trained on mix X, stopped by --phase-transition-iterations, resumed on mix Y
with --override-data-mix, for the three ways of giving training data: every (dataset, sample) of
both parts, read back with tools/data_provenance.py, continues each dataset's ledger (no sample
twice, none skipped) and equals a pure reference (megatron-core's blending rule per stage, each
dataset numbered on from its ledger position); provenance is checked against the tokens the
training batches really held; without the flag the edit is one error naming every change.

* a blend file (weights changed, one dataset added, one removed, a stage appended, a validation
  group added), trained on 2 ranks at data-parallel 2 and resumed at tensor-parallel 2, every
  group evaluated on its own and an offline W&B run holding the records (ledger included);
* a ``--data-path`` blend (two phase transitions, then its weights edited, then the global batch
  halved at one more resume: issue 45's "begin outside [0, num_samples]"), one rank;
* T0 weighted split paths (finetune_t0.py: an item replaced, a weight changed), one rank;
* the seed files users bring (energon's metadataset, Levanter's staged LR), verbatim apart from
  the data paths: previewed and trained.

(An unchanged mix resumes bitwise: tests/e2e/test_exact_resume_e2e.py, whose records include the
ledger's ``samples_drawn``.)
"""
import json
import os
import shutil
import sys

import numpy as np
import pytest

from helpers.curriculum import megatron_blend_indices
from helpers.launch import read_jsonl, run_deepspeed, run_single_process
from helpers.paths import DATA, ROOT
from helpers.wandb_offline import assert_wandb_run_holds_the_records, wandb_env

pytestmark = pytest.mark.launch

SEEDS = os.path.join(DATA, "seeds")
GBS, MBS, SEQ = 8, 2, 32


def base_flags(run_dir, iters):
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", str(SEQ), "--micro-batch-size", str(MBS), "--global-batch-size",
            str(GBS), "--train-iters", str(iters), "--lr", "1e-3", "--log-interval", "1",
            "--eval-interval", "4", "--eval-iters", "1", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--data-cache-path", str(run_dir / "cache"),
            "--save", str(run_dir / "ckpt"), "--metrics-jsonl", str(run_dir / "metrics.jsonl")]


def provenance(flags, first, last, out):
    """tools/data_provenance.py over iterations first..last (in this process): its records."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import data_provenance

    data_provenance.main(flags + ["--iterations", f"{first}:{last}", "--output", str(out)])
    return read_jsonl(out)


def reference(stages, names):
    """[(dataset, sample)] per global sample: each stage ``(first, end, {name: weight})`` is
    megatron-core's blend over its samples (``helpers.build_blending_indices``), every dataset
    numbered on from the samples it gave before."""
    out, counts = [], {}
    for first, end, weights in stages:
        order = list(weights)
        ids, samples = megatron_blend_indices([weights[n] for n in order], end - first)
        start = {n: counts.get(n, 0) for n in order}
        for d, k in zip(ids, samples, strict=True):
            out.append((order[d], start[order[d]] + int(k)))
        for n in order:
            counts[n] = start[n] + int(np.sum(ids == order.index(n)))
    assert set(n for n, _ in out) <= set(names)
    return out


def assert_ledger_continues(pairs):
    """Every dataset's samples, in the order drawn: 0, 1, 2, ... (none twice, none skipped)."""
    for name in {n for n, _ in pairs}:
        numbers = [k for n, k in pairs if n == name]
        assert numbers == list(range(len(numbers))), name


def drawn(pairs):
    out = {}
    for name, _ in pairs:
        out[name] = out.get(name, 0) + 1
    return out


def sample_tokens(record, prefixes):
    """The ``seq_length + 1`` tokens of a provenance record, read from the dataset's .bin."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefixes[record["dataset"]])
    return np.concatenate([ds.get(doc, offset=first, length=last - first + 1)
                           for doc, first, last in record["documents"]]).tolist()


def recorded_rows(out_dir, start_sample, dp):
    """{global sample: tokens + last label} of the micro batches tests/scripts/record_batches.py
    wrote, placed by Megatron's sampler rule: micro batch m of an iteration holds, on data-parallel
    rank r, the samples m * MBS * dp + r * MBS + j of that iteration's global batch."""
    rows = {}
    per_iteration = GBS // (MBS * dp)
    for name in os.listdir(out_dir):
        for k, line in enumerate(read_jsonl(os.path.join(out_dir, name))):
            it, m = divmod(k, per_iteration)
            for j, (tokens, last) in enumerate(zip(line["tokens"], line["last_labels"], strict=True)):
                i = start_sample + it * GBS + m * MBS * dp + line["dp"] * MBS + j
                assert i not in rows
                rows[i] = tokens + [last]
    return rows


def saved_ledger(run_dir):
    """The ledger entries of the last checkpoint's data_mix.json."""
    tracker = (run_dir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip()
    with open(run_dir / "ckpt" / f"iter_{int(tracker):07d}" / "data_mix.json") as f:
        return json.load(f)["ledger"]


def write_yaml(path, text):
    path.write_text(text)
    return str(path)


# ------------------------------------------------------------------ a blend file
X = """\
train:
  sequential:
    - blend:
        - {{path: {web}, split: "0:0.9", weight: 1}}
        - {{path: {code}, split: "0:0.9", weight: 1}}
        - {{path: {math}, split: "0:0.9", weight: 2}}
      until: {{iterations: 6}}
    - blend:
        - {{path: {web}, split: "0:0.9", weight: 1}}
        - {{path: {code}, split: "0:0.9", weight: 1}}
valid:
  - {{name: web, path: {web}, split: "0.9:1"}}
"""
# math removed, code re-weighted, extra added, a stage appended, a validation group added
Y = """\
train:
  sequential:
    - blend:
        - {{path: {web}, split: "0:0.9", weight: 1}}
        - {{path: {code}, split: "0:0.9", weight: 3}}
      until: {{iterations: 6}}
    - blend:
        - {{path: {web}, split: "0:0.9", weight: 1}}
        - {{path: {code}, split: "0:0.9", weight: 1}}
        - {{path: {extra}, weight: 2}}
      until: {{iterations: 9}}
    - blend:
        - {{path: {extra}, weight: 1}}
        - {{path: {code}, split: "0:0.9", weight: 1}}
valid:
  - {{name: web, path: {web}, split: "0.9:1"}}
  - {{name: code, path: {code}, split: "0.9:1"}}
"""


@pytest.fixture(scope="module")
def data(demo_data, tmp_path_factory):
    """The demo corpus plus a fourth dataset, ``extra`` (another seed's math problems)."""
    from tools.make_demo_data import make_demo_data

    d = tmp_path_factory.mktemp("mix_data")
    other = make_demo_data(str(d / "other"), size_mb=0.05, seed=7, verbose=False)["math"]
    for ext in (".bin", ".idx"):
        shutil.copy(other + ext, str(d / "extra_text_document") + ext)
    return dict(demo_data, extra=str(d / "extra_text_document"), dir=d)


def test_blend_file_edit_continues_the_ledger_across_a_layout_change(data, tmp_path):
    iters = 12
    x = write_yaml(tmp_path / "x.yaml", X.format(**data))
    y = write_yaml(tmp_path / "y.yaml", Y.format(**data))
    flags = base_flags(tmp_path, iters)
    # mix X on data-parallel 2 until the phase ends at iteration 4
    first = run_deepspeed("tests/scripts/record_batches.py", [str(tmp_path / "rec1")] + flags + [
        "--data-blend-config", x, "--phase-transition-iterations", "4"])
    assert "exiting at iteration 4: --phase-transition-iterations" in first.stdout
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "4"

    # mix Y without --override-data-mix: one error naming every change, nothing written
    refused = run_single_process("pretrain_gpt.py", flags + ["--data-blend-config", y, "--load",
                                                             str(tmp_path / "ckpt")])
    assert refused.returncode == 1
    errors = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, refused.stderr[-3000:]
    for phrase in ("the training data mix differs", "iteration 4, global sample 32",
                   "stage 0: math[0:0.9] removed (weight 2)", "stage 0: code[0:0.9] weight 1 -> 3",
                   "stage 1: extra added (weight 2)", "stage 1: until the end of the run -> "
                   "iterations 9", "stage 2: added (blend of extra, code[0:0.9]",
                   "--override-data-mix"):
        assert phrase in errors[0], (phrase, errors[0])
    assert [p for p in os.listdir(tmp_path / "ckpt") if p.startswith("iter_")] == ["iter_0000004"]

    # mix Y with it, at tensor-parallel 2, logging to an offline W&B run as well (with the
    # validation loss per half sequence: --eval-position-buckets)
    second = run_deepspeed("tests/scripts/record_batches.py", [str(tmp_path / "rec2")] + flags + [
        "--data-blend-config", y, "--load", str(tmp_path / "ckpt"), "--override-data-mix",
        "--tensor-model-parallel-size", "2", "--wandb-project", "mix", "--wandb-exp-name", "edit",
        "--wandb-save-dir", str(tmp_path / "wandb_runs"),
        "--eval-position-buckets", str(SEQ // 2)], env=wandb_env(tmp_path))
    assert "tensor-parallel 2, pipeline-parallel 1, data-parallel 1" in second.stdout
    assert "--override-data-mix: the training data mix changes at iteration 4" in second.stdout
    assert "valid group 'code' is new at this resume" in second.stdout
    table = second.stdout[second.stdout.index("  dataset"):].splitlines()[:5]
    assert [row.split()[0] for row in table] == ["dataset", "web", "code", "math", "extra"]
    assert table[3].split()[1:3] == ["0.5000", "0.0000"]  # math: 2 / 4 before, gone after

    records = provenance(flags + ["--data-blend-config", y, "--load", str(tmp_path / "ckpt")], 1,
                         iters, tmp_path / "provenance.jsonl")
    assert [r["global_sample"] for r in records] == list(range(iters * GBS))
    assert [r["iteration"] for r in records] == [i // GBS + 1 for i in range(iters * GBS)]
    pairs = [(r["dataset"], r["sample"]) for r in records]
    assert_ledger_continues(pairs)
    want = reference([(0, 32, {"web": 1, "code": 1, "math": 2}),
                      (32, 48, {"web": 1, "code": 3}),
                      (48, 72, {"web": 1, "code": 1, "extra": 2}),
                      (72, 96, {"extra": 1, "code": 1})], ["web", "code", "math", "extra"])
    assert pairs == want
    # the preview from the checkpoint: its mixture is the fraction each iteration drew, before
    # and after the edit, from the same history
    import preview_schedule

    shown = preview_schedule.preview(preview_schedule.parse_preview_args(
        flags + ["--data-blend-config", y, "--load", str(tmp_path / "ckpt")]))
    assert (shown["resume_iteration"], shown["mix_changes"]) == (iters, [4])
    for it in range(iters):
        batch = [name for name, _ in want[it * GBS:(it + 1) * GBS]]
        assert {n: v[it] for n, v in shown["mixture"].items()} == {
            n: batch.count(n) / GBS for n in ("web", "code", "math", "extra")}, it
    spe = {e["name"]: e["samples_per_epoch"] for e in saved_ledger(tmp_path)}
    assert shown["epochs"] == pytest.approx({n: c / spe[n] for n, c in drawn(want).items()})
    # the training batches held exactly those tokens
    prefixes = {name: data[name] for name in ("web", "code", "math", "extra")}
    rows = {**recorded_rows(tmp_path / "rec1", 0, dp=2), **recorded_rows(tmp_path / "rec2", 32, dp=1)}
    assert sorted(rows) == list(range(iters * GBS))
    for r in records:
        assert rows[r["global_sample"]] == sample_tokens(r, prefixes), r
    # the ledger in the logs and in the last checkpoint
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert train[-1]["iteration"] == iters and train[-1]["samples_drawn"] == drawn(want)
    assert train[3]["samples_drawn"] == drawn(want[:32])
    with open(tmp_path / "ckpt" / "iter_0000012" / "data_mix.json") as f:
        saved = json.load(f)
    assert [p["begin"] for p in saved["phases"]] == [0, 32]
    assert {e["name"]: e["drawn"] for e in saved["ledger"]} == drawn(want)
    assert all("math" not in r["per_dataset_loss"] for r in train[4:])  # removed at iteration 4
    assert any("extra" in r["per_dataset_loss"] for r in train[6:])
    records = read_jsonl(tmp_path / "metrics.jsonl")
    evals = [(r["iteration"], r["group"]) for r in records if r.get("split") == "valid"]
    assert evals == [(4, "web"), (8, "web"), (8, "code"), (12, "web"), (12, "code")]
    halves = [f"lm_loss_pos_0_{SEQ // 2}", f"lm_loss_pos_{SEQ // 2}_{SEQ}"]
    assert all(set(halves) <= set(r) for r in records if r.get("split") == "valid" and r["iteration"] > 4)
    assert_wandb_run_holds_the_records(tmp_path / "wandb_runs", records, "mix", "edit",
                                       range(5, iters + 1), {"data_blend_config": y,
                                                             "tensor_model_parallel_size": 2})


# ------------------------------------------------------------------ --data-path
def test_data_path_weights_edited_after_two_phase_transitions(data, tmp_path):
    iters = 8
    flags = base_flags(tmp_path, iters) + ["--split", "90,5,5"]
    x = ["--data-path", "1", data["web"], "1", data["code"], "2", data["math"],
         "--phase-transition-iterations", "2,4"]
    first = run_single_process("pretrain_gpt.py", flags + x, check=True)
    assert "exiting at iteration 2: --phase-transition-iterations" in first.stdout
    again = run_single_process("pretrain_gpt.py", flags + x + ["--load", str(tmp_path / "ckpt")],
                               check=True)
    assert "resumed from" in again.stdout and "exiting at iteration 4" in again.stdout
    y = ["--data-path", "1", data["web"], "3", data["code"], "--load", str(tmp_path / "ckpt")]
    run_single_process("pretrain_gpt.py", flags + y + ["--override-data-mix"], check=True)
    assert sorted(p for p in os.listdir(tmp_path / "ckpt") if p.startswith("iter_")) == [
        "iter_0000002", "iter_0000004", "iter_0000008"]
    records = provenance(flags + y, 1, iters, tmp_path / "provenance.jsonl")
    pairs = [(r["dataset"], r["sample"]) for r in records]
    assert_ledger_continues(pairs)
    # one phase while the mix stays the same (the transitions only stop and resume it)
    assert pairs == reference([(0, 32, {"web": 1, "code": 1, "math": 2}),
                               (32, 64, {"web": 1, "code": 3})], ["web", "code", "math"])
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert [r["iteration"] for r in train] == list(range(1, iters + 1))
    assert train[-1]["samples_drawn"] == drawn(pairs)
    # issue 45: the global batch halves at a resume (8 -> 4 sequences) for 4 more iterations.
    # The index must hold 64 + 4 x 4 = 80 samples, not 12 x 4 = 48 (which stopped with
    # "begin 64 outside [0, num_samples 48]"); every dataset continues where it stood.
    smaller = list(flags)
    smaller[smaller.index("--global-batch-size") + 1] = "4"
    smaller[smaller.index("--train-iters") + 1] = "12"
    run_single_process("pretrain_gpt.py", smaller + y + ["--override-opt_param-scheduler"],
                       check=True)
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert [r["iteration"] for r in train] == list(range(1, 13))
    after = train[-1]["samples_drawn"]
    assert sum(after.values()) == 64 + 4 * 4 and after["math"] == drawn(pairs)["math"]
    assert all(after[n] >= k for n, k in drawn(pairs).items())
    with open(tmp_path / "ckpt" / "iter_0000012" / "data_mix.json") as f:
        assert {e["name"]: e["drawn"] for e in json.load(f)["ledger"]} == after


# ------------------------------------------------------------------ T0 weighted split paths
def test_t0_weighted_split_items_edited(tmp_path):
    from tools.make_toy_multitask import make_toy_multitask

    toy = make_toy_multitask(str(tmp_path / "toy"), examples_per_task=60, preprocess=True,
                             rank_eval_per_task=2, pretrain_docs=5)
    iters = 8
    flags = base_flags(tmp_path, iters)
    flags[flags.index("--seq-length") + 1] = "96"
    flags += ["--valid-weighted-split-paths", f"copy_valid: 1 0:1 {toy['valid_copy']}"]
    x = [f"T: 1 0:1 {toy['train_sentiment']}, 1 0:1 {toy['train_copy']}"]
    y = [f"T: 1 0:1 {toy['train_sentiment']}, 3 0:1 {toy['train_addition']}"]
    run_single_process("finetune_t0.py", flags + ["--train-weighted-split-paths"] + x + [
        "--phase-transition-iterations", "4"], check=True)
    resumed = y + ["--load", str(tmp_path / "ckpt")]
    refused = run_single_process("finetune_t0.py", flags + ["--train-weighted-split-paths"] + resumed)
    assert refused.returncode == 1 and "train_copy removed (weight 1)" in refused.stderr
    assert "train_addition added (weight 3)" in refused.stderr
    run_single_process("finetune_t0.py", flags + ["--train-weighted-split-paths"] + resumed + [
        "--override-data-mix"], check=True)
    records = provenance(flags + ["--train-weighted-split-paths"] + resumed, 1, iters,
                         tmp_path / "provenance.jsonl")
    pairs = [(r["dataset"], r["sample"]) for r in records]
    assert_ledger_continues(pairs)
    names = ["train_sentiment", "train_copy", "train_addition"]
    assert pairs == reference([(0, 32, {"train_sentiment": 1, "train_copy": 1}),
                               (32, 64, {"train_sentiment": 1, "train_addition": 3})], names)
    assert all(r["documents"] for r in records)
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert train[-1]["samples_drawn"] == drawn(pairs)


# ------------------------------------------------------------------ the seeds' own spellings
def _seed(name, **paths):
    with open(os.path.join(SEEDS, name)) as f:
        text = f.read()
    for key, path in paths.items():
        text = text.replace(f"path: {key}", f"path: {path}")
    return text


def test_seed_yamls_preview_and_train(data, tmp_path):
    """energon's three metadataset files and Levanter's staged LR file, as the seeds write them
    (only ``path: dsN`` replaced): the preview shows the energon weights in global iterations, and
    a run trains with the sequential one and Levanter's schedule."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import preview_schedule

    paths = {"ds1": data["web"], "ds2": data["code"], "ds3": data["math"]}
    common = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
              "--seq-length", str(SEQ), "--micro-batch-size", str(MBS), "--global-batch-size",
              "4", "--lr", "1e-4", "--min-lr", "1e-5", "--data-cache-path", str(tmp_path / "cache")]
    blend = write_yaml(tmp_path / "blend.yaml", _seed("energon_blend.yaml", **paths))
    preview = preview_schedule.preview(preview_schedule.parse_preview_args(
        common + ["--train-iters", "1200", "--data-blend-config", blend]))
    wanted = preview["target_mixture"]["code"]
    for it, weight in ((0, 100), (50, 55), (100, 10), (550, 5), (1000, 0)):
        assert wanted[it] == pytest.approx(weight / (weight + 1)), it
    epochized = write_yaml(tmp_path / "epochized.yaml", _seed("energon_epochized_blend.yaml", **paths))
    shown = preview_schedule.preview(preview_schedule.parse_preview_args(
        common + ["--train-iters", "1200", "--data-blend-config", epochized]))
    assert set(shown["mixture"]) == {"web", "code"} and shown["epochs"]["code"] > 0

    # the sequential one with Levanter's schedule (stages at 0, 1000, 100000): previewed, trained
    sequential = write_yaml(tmp_path / "sequential.yaml",
                            _seed("energon_sequential_schedule.yaml", **paths))
    flags = common + ["--train-iters", "120000", "--data-blend-config", sequential,
                      "--lr-schedule-config", os.path.join(SEEDS, "levanter_lr_schedule.yaml")]
    shown = preview_schedule.preview(preview_schedule.parse_preview_args(flags))
    assert shown["lr"][500] == pytest.approx(0.5e-4) and shown["lr"][50000] == 1e-4
    assert shown["lr"][-1] == pytest.approx(1e-5)  # inv down to --min-lr
    assert shown["mixture"]["math"][0] == 0 and shown["mixture"]["math"][-1] == 1  # stage 2
    run = run_single_process("pretrain_gpt.py", flags + [
        "--exit-interval", "3", "--log-interval", "1", "--eval-iters", "0",
        "--metrics-jsonl", str(tmp_path / "seed.jsonl")], check=True)
    assert "exiting at iteration 3: --exit-interval 3" in run.stdout
    train = read_jsonl(tmp_path / "seed.jsonl")
    assert [r["lr"] for r in train] == pytest.approx([0.0, 1e-7, 2e-7])  # Levanter's warmup
    assert set(train[0]["per_dataset_loss"]) <= {"web", "code"}  # stage 1: the epochized blend
    assert all(np.isfinite(r["lm_loss"]) for r in train)
