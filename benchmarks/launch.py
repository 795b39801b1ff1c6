"""Shared by the layout benchmarks: run ``pretrain_gpt.py`` through the real ``deepspeed`` launcher
on CPU ranks and read back its ``--metrics-jsonl`` training records."""
import json
import os
import signal
import socket
import subprocess
import sys
from typing import List, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_pretraining(flags: List[str], ranks: int, metrics: str, name: str, device: str = "cpu",
                       timeout: Optional[float] = None) -> List[dict]:
    """Run ``pretrain_gpt.py FLAGS`` on ``ranks`` CPU ranks (gloo, one thread each; ``device``
    ``cuda``: on ``ranks`` GPUs) and return the training records (one per logged iteration) of
    ``metrics``; exits with the log when the run fails or takes over ``timeout`` seconds."""
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if device == "cpu":
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    cmd = [launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
           os.path.join(ROOT, "pretrain_gpt.py")] + flags + ["--metrics-jsonl", metrics]
    # its own process group, ended whole on a timeout (or Ctrl-C): the ranks too, not only the launcher
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as e:
        os.killpg(proc.pid, signal.SIGTERM)  # the ranks unlink their shared-memory buffers
        try:
            proc.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        if isinstance(e, subprocess.TimeoutExpired):
            raise SystemExit(f"{name} timed out after {timeout} s: {' '.join(cmd)}") from None
        raise
    if proc.returncode:
        raise SystemExit(f"{name} failed: {' '.join(cmd)}\n{out[-3000:]}\n{err[-3000:]}")
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if "split" not in r]
