"""Skipping a step on a gradient spike (docs/skip_step.md) end to end: 4 CPU ranks through the
real deepspeed launcher, pipeline-parallel 2 x data-parallel 2 under --bf16 (DeepSpeed's
BF16_Optimizer at ZeRO stage 1: fp32 masters and Adam moments partitioned over the two
data-parallel ranks of each stage). In-process checks of every optimizer wrapper are in
tests/unit/test_skip_step.py.

The data makes two spikes: the curriculum puts a document of one repeated character (whose
gradient all points one way) into every sample of iteration 2 and into a quarter of iteration 8's
samples; the other samples are the demo corpus's prose. The prose iterations' gradient norms are
1.3-1.8, iteration 2's ~10 and iteration 8's ~3.3. With --grad-norm-skip-threshold 6 iteration 2
is skipped by the threshold; iteration 8, below it, by the z-score rule (window 4: iterations
4-7, about 35 standard deviations above). Resumed from the checkpoint of iteration 6, iteration 8
is only skipped again when the window of iterations 3-6 came back from the checkpoint (without it
the window would hold one value, too few to judge)."""
import json
import os
import shutil

import pytest
import torch

from helpers.launch import own_shm_buffers, read_jsonl, run_deepspeed
from helpers.ports import free_port
from helpers.tensors import tensors_by_path
from helpers.wandb_offline import offline_runs, read_run, wandb_env

pytestmark = pytest.mark.launch

ITERS = 10
THRESHOLD = 6.0
SKIPPED = (2, 8)  # by the threshold, by the z-score rule
RESUME_FROM = 6
COMPARED = ("consumed_samples", "lr", "weight_decay", "lm_loss", "grad_norm", "per_dataset_loss",
            "skipped", "skipped_total")


def _flags(data, run_dir, extra=()):
    blend = run_dir / "blend.json"
    blend.write_text(json.dumps({"train": {"blend": [
        {"path": data["web"],
         "weight": {"type": "step", "unit": "iterations", "points": {0: 1, 1: 0, 2: 1, 7: 3, 8: 1}}},
        {"path": data["spike"],
         "weight": {"type": "step", "unit": "iterations", "points": {0: 0, 1: 1, 2: 0, 7: 1, 8: 0}}},
    ]}}))
    return [
        "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", str(ITERS), "--lr", "3e-3", "--hidden-dropout", "0",
        "--attention-dropout", "0", "--seed", "7", "--transformer-impl", "local",
        "--pipeline-model-parallel-size", "2", "--bf16",
        "--data-blend-config", str(blend), "--data-cache-path", str(run_dir / "cache"),
        "--eval-iters", "0", "--log-interval", "1", "--metrics-jsonl", str(run_dir / "m.jsonl"),
        "--grad-norm-skip-threshold", str(THRESHOLD),
        "--skip-step-zscore-threshold", "4", "--skip-step-zscore-window", "4", *extra]


def _launch(flags, **kwargs):
    port = free_port()
    proc = run_deepspeed("pretrain_gpt.py", flags, num_ranks=4, master_port=port, **kwargs)
    # the launch's CPU all-reduce buffers are gone from /dev/shm (megatron/runtime/cpu_comm.py)
    assert own_shm_buffers(port) == []
    return proc


@pytest.fixture(scope="module")
def spike_data(demo_data, tmp_path_factory):
    """The demo prose and a dataset of documents of one repeated character."""
    from megatron.data.preprocess import preprocess_jsonl

    out = tmp_path_factory.mktemp("spike")
    with open(out / "spike.jsonl", "w") as f:
        for _ in range(100):
            f.write(json.dumps({"text": "~" * 300}) + "\n")
    preprocess_jsonl(str(out / "spike.jsonl"), str(out / "spike"), append_eod=True)
    return dict(demo_data, spike=str(out / "spike_text_document"))


@pytest.fixture(scope="module")
def skip_run(spike_data, tmp_path_factory):
    """10 iterations saving a checkpoint after each."""
    run_dir = tmp_path_factory.mktemp("skip_run")
    proc = _launch(_flags(spike_data, run_dir, ["--save", str(run_dir / "ckpt"),
                                                "--save-interval", "1"]))
    records = [r for r in read_jsonl(run_dir / "m.jsonl") if "split" not in r]
    assert [r["iteration"] for r in records] == list(range(1, ITERS + 1))
    return run_dir, records, proc


def _applied(iteration: int) -> int:
    """Optimizer steps applied in iterations 1..``iteration``."""
    return iteration - sum(s <= iteration for s in SKIPPED)


def _checkpoint_tensors(ckpt, iteration):
    """Every tensor of every model and optimizer file of the checkpoint (layer files of both
    stages, the four ranks' BF16_Optimizer partitions: fp32 masters, Adam moments and counts),
    by file and path; the generator states are left out."""
    directory = ckpt / f"iter_{iteration:07d}"
    files = sorted(f for f in os.listdir(directory) if f.endswith(".pt")
                   and not f.startswith("rng_state"))
    assert any("optim_states" in f for f in files) and any(f.startswith("layer_") for f in files)
    return {f: tensors_by_path(torch.load(directory / f, map_location="cpu", weights_only=False))
            for f in files}


def test_skipped_steps_change_nothing_and_are_logged(skip_run):
    run_dir, records, proc = skip_run
    assert ("tensor-parallel 1, pipeline-parallel 2, data-parallel 2, ZeRO stage 1"
            in proc.stdout) and "DeepSpeed BF16_Optimizer" in proc.stdout
    assert [r["skipped"] for r in records] == [int(r["iteration"] in SKIPPED) for r in records]
    assert [r["skipped_total"] for r in records] == [0, 1, 1, 1, 1, 1, 1, 2, 2, 2]
    norms = {r["iteration"]: r["grad_norm"] for r in records}
    assert norms[2] > THRESHOLD > norms[8] > max(n for i, n in norms.items() if i not in SKIPPED)
    assert (f" iteration 2: optimizer step skipped (grad norm {norms[2]:.6g} > "
            f"--grad-norm-skip-threshold 6)") in proc.stdout
    assert (f" iteration 8: optimizer step skipped (grad norm {norms[8]:.6g} is ") in proc.stdout
    assert "standard deviations above the mean of the last 4 iterations > " \
           "--skip-step-zscore-threshold 4)" in proc.stdout
    assert "| skipped iterations: 1 (total 2)" in proc.stdout
    # data consumed and the LR schedule advanced through the skipped iterations
    assert [r["consumed_samples"] for r in records] == [8 * i for i in range(1, ITERS + 1)]
    lrs = [r["lr"] for r in records]
    assert lrs == sorted(lrs, reverse=True) and len(set(lrs)) == ITERS
    ckpt = run_dir / "ckpt"
    for skipped in SKIPPED:
        before, after = _checkpoint_tensors(ckpt, skipped - 1), _checkpoint_tensors(ckpt, skipped)
        assert before.keys() == after.keys()
        for name in before:
            assert before[name].keys() == after[name].keys(), name
            changed = [k for k in before[name] if not torch.equal(before[name][k], after[name][k])]
            assert not changed, (skipped, name, changed)
        # the next step trains: every file's tensors change; Adam counted the applied steps only
        trained = _checkpoint_tensors(ckpt, skipped + 1)
        for name in (n for n in after if after[n]):  # the pipe's mp_rank files hold none
            assert any(not torch.equal(after[name][k], trained[name][k]) for k in after[name]), name
            counts = [(float(after[name][k]), float(trained[name][k])) for k in after[name]
                      if k.endswith("/step")]
            assert counts == [(_applied(skipped), _applied(skipped + 1))] * len(counts), name


def test_resume_across_a_skip_is_bitwise(skip_run, spike_data, tmp_path):
    """From the checkpoint of iteration 6 (the window of iterations 3-6 in its training state),
    iterations 7-10 log bitwise what the uninterrupted run logged, iteration 8 skipped again and
    the running count continued; TensorBoard and the offline W&B run get the same counts."""
    run_dir, records, _ = skip_run
    ckpt = tmp_path / "ckpt"
    shutil.copytree(run_dir / "ckpt" / f"iter_{RESUME_FROM:07d}", ckpt / f"iter_{RESUME_FROM:07d}")
    (ckpt / "latest_checkpointed_iteration.txt").write_text(f"{RESUME_FROM}\n")
    state = torch.load(ckpt / f"iter_{RESUME_FROM:07d}" / "mp_rank_00_model_states.pt",
                       map_location="cpu", weights_only=False)["megatron_training_state"]
    window = state["extra"]["skip_step"]
    assert window["skipped_total"] == 1 and len(window["grad_norms"]) == 4
    assert window["grad_norms"] == [r["grad_norm"] for r in records[2:RESUME_FROM]]
    flags = _flags(spike_data, tmp_path, [
        "--load", str(ckpt), "--tensorboard-dir", str(tmp_path / "tb"),
        "--wandb-project", "skip", "--wandb-save-dir", str(tmp_path / "wandb_runs")])
    flags[flags.index("--data-cache-path") + 1] = str(run_dir / "cache")
    proc = _launch(flags, env=wandb_env(tmp_path))
    assert f"resumed from --load {ckpt} at iteration {RESUME_FROM}," in proc.stdout
    resumed = [r for r in read_jsonl(tmp_path / "m.jsonl") if "split" not in r]
    want = records[RESUME_FROM:]
    assert [r["iteration"] for r in resumed] == [r["iteration"] for r in want]
    for got, ref in zip(resumed, want, strict=True):
        for key in COMPARED:
            assert got[key] == ref[key], (got["iteration"], key, got[key], ref[key])
    assert " iteration 8: optimizer step skipped (grad norm" in proc.stdout

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    for key in ("skipped", "skipped_total"):
        assert [(e.step, e.value) for e in events.Scalars(f"train/{key}")] == [
            (r["iteration"], r[key]) for r in want]
    runs = offline_runs(tmp_path / "wandb_runs")
    assert len(runs) == 1, runs
    history = read_run(runs[0])["history"]
    assert [(step, history[step]["train/skipped"], history[step]["train/skipped_total"])
            for step in sorted(history)] == [(r["iteration"], r["skipped"], r["skipped_total"])
                                             for r in want]
