"""Shared by the layout benchmarks: run ``pretrain_gpt.py`` through the real ``deepspeed`` launcher
on CPU ranks and read back its ``--metrics-jsonl`` training records."""
import json
import os
import socket
import subprocess
import sys
from typing import List

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))


def free_port() -> int:
    """A TCP port on localhost that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_pretraining(flags: List[str], ranks: int, metrics: str, name: str) -> List[dict]:
    """Run ``pretrain_gpt.py FLAGS`` on ``ranks`` CPU ranks (gloo) and return the training records
    (one per logged iteration) of ``metrics``; exits with the log when the run fails."""
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [launcher, "--num_gpus", str(ranks), "--master_port", str(free_port()),
           os.path.join(ROOT, "pretrain_gpt.py")] + flags + ["--metrics-jsonl", metrics]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {' '.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if "split" not in r]
