"""Starting runs as the e2e tests do: an entry point or a child script (tests/scripts/) through the
real ``deepspeed`` launcher (:func:`run_deepspeed`; killed with SIGKILL once its metrics reach an
iteration: :func:`run_and_sigkill`) or as one plain rank
(:func:`run_single_process`), each on its own free port; and what a run leaves (its ``--metrics-jsonl`` records, DeepSpeed's CPU
all-reduce buffers in /dev/shm). A test that calls these carries the ``launch`` marker
(tests/unit/test_suite_layout.py checks it)."""
import glob
import json
import os
import signal
import subprocess
import sys
import time
from typing import Dict, List, Set, Tuple

import psutil

from helpers.paths import ROOT
from helpers.ports import free_port
from megatron.runtime.ports import launch_with_port_retry


def deepspeed_launcher() -> str:
    """The ``deepspeed`` launcher installed beside this Python."""
    return os.path.join(os.path.dirname(sys.executable), "deepspeed")


def _run_as_group(cmd: List[str], cwd, env: Dict[str, str], timeout: float
                  ) -> subprocess.CompletedProcess:
    """``subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)``, the command in a
    process group of its own: on a timeout (a hung run) or an interrupt the whole group is
    SIGKILLed, the launcher's ranks and their loader workers with it, so none is left behind
    blocked in a collective (killing the launcher alone orphans its ranks)."""
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except BaseException:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def run_deepspeed(script: str, flags: List[str], num_ranks: int = 2, timeout: int = 600,
                  env: Dict[str, str] = None, check: bool = True,
                  master_port: int = None) -> subprocess.CompletedProcess:
    """Launch ``script`` with ``num_ranks`` CPU ranks (gloo) on ``master_port`` (default: a free
    one below the ephemeral range; should another process take it before the launcher binds it,
    the launch is repeated once on another, saying so in one line:
    megatron.runtime.ports.launch_with_port_retry); with ``check``, raise with the log when it
    fails."""
    run_env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
                   TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    run_env.update(env or {})
    cmds = []

    def launch(port: int) -> subprocess.CompletedProcess:
        cmds.append([deepspeed_launcher(), "--num_gpus", str(num_ranks), "--master_port",
                     str(port), os.path.join(ROOT, script)] + flags)
        return _run_as_group(cmds[-1], ROOT, run_env, timeout)

    proc = launch_with_port_retry(launch, master_port)
    if check:
        _raise_if_failed(cmds[-1], proc)
    return proc


def _raise_if_failed(cmd: List[str], proc: subprocess.CompletedProcess) -> None:
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout ---\n"
                             f"{proc.stdout[-8000:]}\n--- stderr ---\n{proc.stderr[-8000:]}")


def run_single_process(script: str, flags: List[str], cwd=ROOT, timeout: int = 300,
                       check: bool = False) -> subprocess.CompletedProcess:
    """Run ``script`` as a plain 1-process job (rank 0 of 1: WORLD_SIZE, RANK, LOCAL_RANK and the
    master address set as the launcher sets them, gloo on a free port, retried once on another as
    :func:`run_deepspeed` does), without the launcher's own start-up (two Python processes
    importing DeepSpeed before the rank starts): for runs that stop at start-up or need no second
    rank, such as the one-rank references the layouts are compared with; with ``check``, raise
    with the log when it fails."""
    cmd = [sys.executable, os.path.join(ROOT, script)] + flags

    def launch(port: int) -> subprocess.CompletedProcess:
        env = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", DS_ACCELERATOR="cpu",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                   TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
        return _run_as_group(cmd, str(cwd), env, timeout)

    proc = launch_with_port_retry(launch)
    if check:
        _raise_if_failed(cmd, proc)
    return proc


def run_ranks(script: str, flags: List[str], num_ranks: int, check: bool = True
              ) -> subprocess.CompletedProcess:
    """``num_ranks`` CPU ranks of ``script``: through the deepspeed launcher (:func:`run_deepspeed`)
    for two or more, as one plain process (:func:`run_single_process`) for one."""
    if num_ranks == 1:
        return run_single_process(script, flags, timeout=600, check=check)
    return run_deepspeed(script, flags, num_ranks=num_ranks, check=check)


def _cmdline(process: psutil.Process) -> List[str]:
    """``process``'s command line; none once it has exited (a loader worker a rank just stopped)."""
    try:
        return process.cmdline()
    except psutil.NoSuchProcess:  # also a zombie not yet reaped
        return []


def run_and_sigkill(script: str, flags: List[str], metrics, after_iteration: int,
                    log_path, num_ranks: int = 2, timeout: float = 300) -> int:
    """Launch ``script`` through ``deepspeed`` with ``num_ranks`` CPU ranks, its output to
    ``log_path``; once its ``--metrics-jsonl`` file ``metrics`` shows ``after_iteration``, SIGKILL
    every rank, their children (loader workers) and the launcher at once (no clean exit, no signal
    handler). Returns the launch's port (:func:`own_shm_buffers`)."""
    port = free_port()
    cmd = [deepspeed_launcher(), "--num_gpus", str(num_ranks), "--master_port", str(port),
           os.path.join(ROOT, script)] + flags
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + timeout
            while not any(r["iteration"] >= after_iteration for r in written_train_records(metrics)):
                assert proc.poll() is None, open(log_path).read()[-4000:]
                assert time.time() < deadline, "run did not reach the kill point in time"
                time.sleep(0.02)
            victims = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
            # every rank is among them (a loader worker forked by a rank shows the rank's command)
            assert {a for p in victims for a in _cmdline(p) if a.startswith("--local_rank=")} \
                == {f"--local_rank={rank}" for rank in range(num_ranks)}
            for p in victims:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            proc.wait(timeout=30)
            _, alive = psutil.wait_procs(victims[1:], timeout=30)
            assert not alive, alive
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.returncode
    return port


def read_jsonl(path) -> List[dict]:
    """All records of a ``--metrics-jsonl`` file."""
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def written_train_records(path) -> List[dict]:
    """The training records (no ``split`` key) of a ``--metrics-jsonl`` file a run may still be
    writing: a partial last line is left out; none when the file does not exist yet."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            record = json.loads(line)
            if "split" not in record:
                records.append(record)
    return records


def own_shm_buffers(port: int) -> List[str]:
    """DeepSpeed's CPU all-reduce buffers (of this user) of the launch on ``port`` that are in
    /dev/shm (megatron/runtime/cpu_comm.py)."""
    from megatron.runtime import cpu_comm

    pattern = f"{cpu_comm.SHM_PREFIX}_{os.getuid()}_*_{port}_*"
    return glob.glob(os.path.join(cpu_comm.SHM_DIR, pattern))


def mapped_shm_buffers(pid: int) -> Set[Tuple[str, bool]]:
    """DeepSpeed's CPU all-reduce buffers (of this user) that process ``pid`` maps, from
    /proc/PID/maps, each as ``(path, unlinked)``."""
    from megatron.runtime import cpu_comm

    prefix = os.path.join(cpu_comm.SHM_DIR, f"{cpu_comm.SHM_PREFIX}_{os.getuid()}_")
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(prefix):
                path, _, deleted = fields[5].strip().partition(" ")
                found.add((path, deleted == "(deleted)"))
    return found
