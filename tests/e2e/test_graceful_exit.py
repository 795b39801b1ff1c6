"""--exit-signal-handler and --exit-duration-in-mins: save a checkpoint and exit 0, leaving none of
the launch's shared-memory buffers (megatron/runtime/cpu_comm.py)."""
import os
import signal
import subprocess
import time

import psutil
import pytest

from helpers.launch import deepspeed_launcher, mapped_shm_buffers, own_shm_buffers, read_jsonl, run_deepspeed
from helpers.paths import ROOT
from helpers.ports import free_port
from megatron.runtime import cpu_comm

pytestmark = pytest.mark.launch


def flags(demo_data, run_dir, extra=()):
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", "100000", "--lr", "1e-3", "--data-path", demo_data["web"],
            "--split", "98,1,1", "--data-cache-path", str(run_dir / "cache"), "--eval-iters", "0",
            "--log-interval", "1", "--save", str(run_dir / "ckpt"),
            "--metrics-jsonl", str(run_dir / "metrics.jsonl"), *extra]


def test_sigterm_to_every_rank_saves_exits_zero_and_leaves_no_buffers(demo_data, tmp_path):
    """SIGTERM to every rank (as a cluster scheduler does) with --exit-signal-handler: the ranks
    save a checkpoint of the same iteration and the launch exits 0. And none of the launch's
    DeepSpeed all-reduce buffers is left in /dev/shm: while it trains, each rank already maps both
    ranks' buffers unlinked (DeepSpeed made them and never unlinks them; megatron/runtime/cpu_comm.py
    does once every rank has mapped them), so no way the launch ends can leave them."""
    port = free_port()
    cmd = [deepspeed_launcher(), "--num_gpus", "2", "--master_port", str(port),
           os.path.join(ROOT, "pretrain_gpt.py")] + flags(demo_data, tmp_path, ["--exit-signal-handler"])
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    metrics = tmp_path / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and not (metrics.exists() and len(read_jsonl(metrics)) >= 3):
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
             if any(a.startswith("--local_rank=") for a in p.cmdline())]
    assert len(ranks) == 2
    unlinked = {(cpu_comm.shm_buffer_path(r, "127.0.0.1", str(port)), True) for r in range(2)}
    # read each rank's maps until both show the buffers (a snapshot under load once read none
    # for one rank; the claim is about the training ranks, not one instant), at most 60 s
    mapped = [mapped_shm_buffers(rank.pid) for rank in ranks]
    deadline = time.time() + 60
    while mapped != [unlinked, unlinked] and time.time() < deadline:
        time.sleep(0.5)
        mapped = [mapped_shm_buffers(rank.pid) for rank in ranks]
    assert mapped == [unlinked, unlinked]
    for rank in ranks:  # as a cluster scheduler does: every task gets the signal
        rank.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-4000:]
    assert "exit signal received" in out
    saved = int((tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text())
    assert saved >= 3
    assert saved == read_jsonl(metrics)[-1]["iteration"]
    assert (tmp_path / "ckpt" / f"iter_{saved:07d}").is_dir()
    assert own_shm_buffers(port) == []


def test_exit_duration_saves_and_exits_zero(demo_data, tmp_path):
    proc = run_deepspeed("pretrain_gpt.py", flags(demo_data, tmp_path, ["--exit-duration-in-mins", "0.05"]))
    assert "time limit reached" in proc.stdout
    saved = int((tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text())
    assert saved == read_jsonl(tmp_path / "metrics.jsonl")[-1]["iteration"] < 100000
