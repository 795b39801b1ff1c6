"""Shared by the layout benchmarks: run ``pretrain_gpt.py`` through the real ``deepspeed`` launcher
on CPU ranks and read back its ``--metrics-jsonl`` training records; or run a benchmark's own
per-rank worker through the launcher and read back each rank's JSON record."""
import glob
import json
import os
import signal
import subprocess
import sys
import tempfile
from typing import List, Optional, Sequence

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from megatron.runtime.ports import launch_with_port_retry  # noqa: E402


def launch_pretraining(flags: List[str], ranks: int, metrics: str, name: str, device: str = "cpu",
                       timeout: Optional[float] = None) -> List[dict]:
    """Run ``pretrain_gpt.py FLAGS`` on ``ranks`` CPU ranks (gloo, one thread each; ``device``
    ``cuda``: on ``ranks`` GPUs) and return the training records (one per logged iteration) of
    ``metrics``; exits with the log when the run fails or takes over ``timeout`` seconds."""
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if device == "cpu":
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    def launch(port: int) -> subprocess.CompletedProcess:
        cmd = [launcher, "--num_gpus", str(ranks), "--master_port", str(port),
               os.path.join(ROOT, "pretrain_gpt.py")] + flags + ["--metrics-jsonl", metrics]
        # its own process group, ended whole on a timeout (or Ctrl-C): the ranks too, not only
        # the launcher
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
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
        return subprocess.CompletedProcess(cmd, proc.returncode, out, err)

    # a port below the ephemeral range; a launch whose port was taken first runs once more
    proc = launch_with_port_retry(launch)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {' '.join(proc.args)}\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [r for r in records if "split" not in r]


def _shm_buffers(port: int) -> List[str]:
    """DeepSpeed's CPU all-reduce buffers of the launch on ``port`` (megatron/runtime/cpu_comm.py)."""
    from megatron.runtime.cpu_comm import SHM_DIR, SHM_PREFIX

    return glob.glob(os.path.join(SHM_DIR, f"{SHM_PREFIX}_{os.getuid()}_*_{port}_*"))


def launch_workers(script: str, argv: Sequence[str], ranks: int, work: str, name: str,
                   threads: int = 1, timeout: Optional[float] = None) -> List[dict]:
    """Run ``script ARGV --worker --out DIR`` on ``ranks`` CPU ranks through the ``deepspeed``
    launcher (gloo, ``threads`` torch threads each, a free port: retried once on another when the
    launch lost it first), each rank writing ``DIR/rank{R}.json``; returns those records in rank
    order, or exits with the log when the launch fails or takes over ``timeout`` seconds."""
    out = tempfile.mkdtemp(dir=work)
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS=str(threads),
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")

    def run(port: int) -> subprocess.CompletedProcess:
        cmd = [launcher, "--num_gpus", str(ranks), "--master_port", str(port),
               os.path.abspath(script), *argv, "--worker", "--out", out]
        try:
            return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        finally:  # the ranks unlink their buffers after start-up; a launch that died early may not
            for path in _shm_buffers(port):
                os.remove(path)

    proc = launch_with_port_retry(run)
    if proc.returncode:
        raise SystemExit(f"{name} failed: {' '.join(proc.args)}\n{proc.stdout[-3000:]}\n"
                         f"{proc.stderr[-3000:]}")
    records = []
    for rank in range(ranks):
        with open(os.path.join(out, f"rank{rank}.json")) as f:
            records.append(json.load(f))
    return records
