"""Run control through the real ``deepspeed`` launcher (2 CPU ranks, a tiny BLOOM-style model:
ALiBi, ``--embed-layernorm``, ``--pad-vocab-size-to``):

1. ``--kill-switch-path``: the file created mid-run makes both ranks save after the same
   iteration and exit 0;
2. ``--eval-only`` on that checkpoint evaluates it exactly as the training run did at that
   iteration, trains nothing and saves nothing;
3. ``--reset-progress`` from it with Microsoft's ``--train-samples`` = twice ``--train-tokens``:
   counters and LR schedule start at 0 and the run stops at the token budget.
"""
import os
import subprocess
import time

import numpy as np
import pytest

from helpers.launch import deepspeed_launcher, read_jsonl, run_deepspeed
from helpers.paths import ROOT
from helpers.ports import free_port

pytestmark = pytest.mark.launch

SEQ, GBS = 64, 4


def model_flags(demo_data, run_dir, extra=()):
    return ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2",
            "--seq-length", str(SEQ), "--micro-batch-size", "2", "--global-batch-size", str(GBS),
            "--position-embedding-type", "alibi", "--embed-layernorm", "--pad-vocab-size-to", "384",
            "--hidden-dropout", "0", "--attention-dropout", "0", "--lr", "1e-3",
            "--data-path", demo_data["web"], "--split", "98,1,1",
            "--data-cache-path", str(run_dir / "cache"), "--eval-iters", "1",
            "--log-interval", "1", "--metrics-jsonl", str(run_dir / "metrics.jsonl"), *extra]


@pytest.fixture(scope="module")
def killed_run(demo_data, tmp_path_factory):
    """A run of 2000 iterations (evaluating every iteration) whose kill switch is created once
    two iterations are logged."""
    run_dir = tmp_path_factory.mktemp("kill_switch")
    kill = run_dir / "kill-switch"
    flags = model_flags(demo_data, run_dir, ["--train-iters", "2000", "--eval-interval", "1",
                                             "--save", str(run_dir / "ckpt"),
                                             "--kill-switch-path", str(kill)])
    cmd = [deepspeed_launcher(), "--num_gpus", "2", "--master_port", str(free_port()),
           os.path.join(ROOT, "pretrain_gpt.py")] + flags
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    try:
        while time.time() < deadline and not (
                metrics.exists() and sum("lm_loss" in r and "split" not in r
                                         for r in read_jsonl(metrics)) >= 2):
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        kill.touch()
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    return {"dir": run_dir, "proc": proc, "out": out, "records": read_jsonl(metrics),
            "ckpt": run_dir / "ckpt"}


def test_kill_switch_saves_after_the_same_iteration_on_every_rank(killed_run):
    assert killed_run["proc"].returncode == 0, killed_run["out"][-4000:]
    train = [r for r in killed_run["records"] if "split" not in r]
    saved = int((killed_run["ckpt"] / "latest_checkpointed_iteration.txt").read_text())
    assert 2 <= saved == train[-1]["iteration"] < 2000
    assert f"kill switch {killed_run['dir'] / 'kill-switch'} found (--kill-switch-path)" \
        in killed_run["out"]
    assert f"exiting at iteration {saved}" in killed_run["out"]
    # each rank wrote its part of the same checkpoint: both stopped after iteration `saved`
    directory = killed_run["ckpt"] / f"iter_{saved:07d}"
    assert (directory / "rng_state_rank0.pt").is_file()
    assert (directory / "rng_state_rank1.pt").is_file()
    assert sorted(p.name for p in killed_run["ckpt"].iterdir() if p.name.startswith("iter_")) \
        == [directory.name]


def test_eval_only_evaluates_the_loaded_checkpoint(killed_run, demo_data, tmp_path):
    saved = int((killed_run["ckpt"] / "latest_checkpointed_iteration.txt").read_text())
    proc = run_deepspeed("pretrain_gpt.py", model_flags(demo_data, tmp_path, [
        "--train-iters", "2000", "--eval-interval", "1", "--load", str(killed_run["ckpt"]),
        "--eval-only", "True"]))
    records = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r for r in records if "split" not in r] == []  # no training step
    assert {(r["split"], r["iteration"]) for r in records} == {("valid", saved), ("test", saved)}
    # the training run evaluated the same weights on the same window at that iteration
    trained = [r for r in killed_run["records"]
               if r.get("split") == "valid" and r["iteration"] == saved]
    got = [r for r in records if r["split"] == "valid"]
    assert len(trained) == 1 and len(got) == 1
    assert got[0]["lm_loss"] == pytest.approx(trained[0]["lm_loss"], rel=1e-6)
    assert "--eval-only/--skip-train: evaluating the model of iteration" in proc.stdout
    assert int((killed_run["ckpt"] / "latest_checkpointed_iteration.txt").read_text()) == saved


def test_reset_progress_with_a_token_budget(killed_run, demo_data, tmp_path):
    """Microsoft's script shape: --train-samples twice the budget; the budget (2.5 iterations of
    tokens) stops the run after iteration 3. Iterations, consumed samples and the LR schedule
    start from 0 although the checkpoint is at iteration k; the final checkpoint is iteration 3."""
    from megatron.config.parser import parse_args
    from megatron.optim import learning_rates as lrs
    from megatron.schedules.units import batch_schedule

    saved = int((killed_run["ckpt"] / "latest_checkpointed_iteration.txt").read_text())
    budget = int(2.5 * GBS * SEQ)
    length = ["--train-samples", str(2 * 3 * GBS), "--train-tokens", str(budget),
              "--lr-decay-style", "cosine", "--lr-warmup-samples", str(GBS), "--min-lr", "1e-4"]
    proc = run_deepspeed("pretrain_gpt.py", model_flags(demo_data, tmp_path, [
        *length, "--eval-iters", "0", "--load", str(killed_run["ckpt"]), "--reset-progress",
        "--save", str(tmp_path / "ckpt")]))
    train = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["iteration"] for r in train] == [1, 2, 3]
    assert [r["consumed_samples"] for r in train] == [GBS, 2 * GBS, 3 * GBS]
    assert [r["consumed_tokens"] for r in train] == [GBS * SEQ, 2 * GBS * SEQ, 3 * GBS * SEQ]
    # the LR of each step is the fresh schedule's, which ends at the budget (3 iterations)
    args = parse_args(model_flags(demo_data, tmp_path, length), world_size=2)
    config = args.run_config.schedule
    bs = batch_schedule(config.batch)
    lr, _ = lrs.build_schedules(lrs.scheduler_params(config, bs), lrs.schedule_context(config, bs))
    steps = np.arange(3)
    want = lr(lrs.progress_in(lr.unit, steps, bs.samples_at_iterations(steps), bs))
    assert [r["lr"] for r in train] == pytest.approx(list(want), rel=1e-12)
    assert want[0] == 0.0 and want[1] == pytest.approx(1e-3)  # warmup again, then the peak
    assert lr(lrs.progress_in(lr.unit, np.array([3]), bs.samples_at_iterations([3]), bs))[0] \
        == pytest.approx(1e-4)
    assert (f"--reset-progress: loaded the model and optimizer state of iteration {saved}"
            in proc.stdout)
    assert "--train-tokens 640: training stops after iteration 3" in proc.stdout
    assert int((tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text()) == 3
