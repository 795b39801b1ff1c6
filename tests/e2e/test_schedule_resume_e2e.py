"""Resuming never silently changes the LR/WD schedule (through the deepspeed launcher, 2 CPU
ranks): a checkpoint records the training length, batch schedule, sequence length and the
--lr-schedule-config content; a resume that changes any of them stops with one error naming each
change, and --use-checkpoint-opt_param-scheduler continues the checkpoint's schedule exactly, in
the same (offline) Weights & Biases run, whose id the checkpoint directory keeps."""
import os
import sys

import pytest

from helpers.launch import read_jsonl, run_deepspeed, run_ranks
from helpers.paths import ROOT
from helpers.resume import make_pretrain_data, pretrain_flags
from helpers.wandb_offline import offline_runs, read_run, wandb_env

sys.path.insert(0, os.path.join(ROOT, "tools"))
import preview_schedule  # noqa: E402

pytestmark = pytest.mark.launch

SCHEDULE = """\
lr_schedule:
  - start: 0
    schedule: {{type: linear, from: 0.0, to: 3.0e-3}}
  - start: 2
    schedule: {{type: cosine, from: 3.0e-3, to: {end}}}
"""


def _flags(data, run_dir, schedule, train_iters, extra=()):
    # later flags win (argparse): a shorter run, its own schedule, stop after iteration 3
    return pretrain_flags(data, run_dir, ["--lr-schedule-config", str(schedule),
                                          "--train-iters", str(train_iters), "--save-interval", "3",
                                          "--eval-interval", "100", *extra])


def test_resume_refuses_a_changed_schedule_and_can_continue_the_checkpoints(tmp_path):
    data = make_pretrain_data(tmp_path / "data")
    original, changed = tmp_path / "lr.yaml", tmp_path / "lr_changed.yaml"
    original.write_text(SCHEDULE.format(end="3.0e-4"))
    changed.write_text(SCHEDULE.format(end="1.0e-4"))
    # W&B files under --save/wandb/wandb (no --wandb-save-dir, Megatron-LM's default); the
    # resume below names the run with llm-jp's spelling of --wandb-exp-name
    run_deepspeed("pretrain_gpt.py", _flags(data, tmp_path, original, 6, [
        "--exit-interval", "3", "--wandb-project", "resume", "--wandb-exp-name", "staged"]),
        env=wandb_env(tmp_path))
    ckpt = tmp_path / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"

    # a longer run with an edited schedule file: one error naming both changes, no training
    resumed = _flags(data, tmp_path, changed, 8, ["--load", str(ckpt)])
    resumed[resumed.index("--metrics-jsonl") + 1] = str(tmp_path / "refused.jsonl")
    proc = run_ranks("pretrain_gpt.py", resumed, num_ranks=1, check=False)  # stops at start-up
    errors = [line for line in proc.stderr.splitlines() if "error: " in line]
    assert proc.returncode != 0 and errors, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for line in errors:
        assert line.count("differs from the checkpoint's") == 1
        assert "(train_iters): checkpoint 6, now 8" in line
        assert "--lr-schedule-config lr_schedule[1].schedule.to: checkpoint 0.0003, now 0.0001" in line
        assert "--use-checkpoint-opt_param-scheduler" in line
    assert not [r for r in read_jsonl(tmp_path / "refused.jsonl") if "split" not in r] \
        if (tmp_path / "refused.jsonl").exists() else True

    # --use-checkpoint-opt_param-scheduler: the checkpoint's schedule (its file and its 6
    # iterations) drives iterations 4..8, whatever the new flags say
    proc = run_deepspeed("pretrain_gpt.py", resumed + [
        "--use-checkpoint-opt_param-scheduler", "--wandb-project", "resume", "--wandb-name",
        "staged"], env=wandb_env(tmp_path))
    got = [r for r in read_jsonl(tmp_path / "refused.jsonl") if "split" not in r]
    assert [r["iteration"] for r in got] == [4, 5, 6, 7, 8]
    want = preview_schedule.preview(preview_schedule.parse_preview_args(
        _flags(data, tmp_path, original, 6)))["lr"]
    # record i logs the lr of step i, the value after i - 1 completed iterations; past the
    # checkpoint's end of training (6) its schedule stays at its final value
    assert [r["lr"] for r in got] == [want[min(i - 1, 6)] for i in range(4, 9)]
    assert got[-1]["lr"] == 3.0e-4

    # the resume continued the W&B run of the first launch (its id kept in --save), logging
    # iterations 4..8 with the lr metrics.jsonl has
    first, second = (read_run(path) for path in offline_runs(ckpt / "wandb"))
    run_id = (ckpt / "wandb_run_id.txt").read_text().splitlines()[0]
    assert first["id"] == second["id"] == run_id and second["name"] == "staged"
    before = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert {i: row["train/lm_loss"] for i, row in first["history"].items()} == \
        {r["iteration"]: r["lm_loss"] for r in before}
    assert sorted(first["history"]) == [1, 2, 3]
    assert {i: row["train/lr"] for i, row in second["history"].items()} == \
        {r["iteration"]: r["lr"] for r in got}
