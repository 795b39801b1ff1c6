"""Shared by the layout benchmarks: run ``pretrain_gpt.py`` through the real ``deepspeed`` launcher
on CPU ranks and read back its ``--metrics-jsonl`` training records."""
import json
import os
import signal
import subprocess
import sys
from typing import List, Optional

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
