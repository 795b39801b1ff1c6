"""DeepSpeed's CPU shared-memory all-reduce buffers (megatron/cpu_comm.py) and the notice before a
one-time op build (megatron/jit_ops.py)."""
import glob
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from conftest import ROOT, free_port
from e2e_helpers import deepspeed_launcher

from megatron import cpu_comm, jit_ops

FLAGS = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length",
         "32", "--micro-batch-size", "2", "--global-batch-size", "4", "--lr", "1e-3",
         "--log-interval", "1", "--eval-iters", "0"]


def _own_buffers(port: int):
    pattern = f"{cpu_comm.SHM_PREFIX}_{os.getuid()}_*_{port}_*"
    return glob.glob(os.path.join(cpu_comm.SHM_DIR, pattern))


def test_buffer_path_is_named_as_deepspeed_names_it():
    """shm.cpp: "%s_%d_%s_%s" (prefix, uid, MASTER_ADDR, MASTER_PORT) then "_%d" (rank)."""
    import deepspeed

    source = os.path.join(os.path.dirname(deepspeed.__file__), "ops", "csrc", "cpu", "comm",
                          "shm.cpp")
    with open(source) as f:
        text = f.read()
    assert f'#define SHM_BUFFER_NAME "{cpu_comm.SHM_PREFIX}"' in text
    assert '"%s_%d_%s_%s",\n             SHM_BUFFER_NAME,\n             getuid(),' in text
    assert cpu_comm.shm_buffer_path(1, "127.0.0.1", "29501") == \
        f"/dev/shm/{cpu_comm.SHM_PREFIX}_{os.getuid()}_127.0.0.1_29501_1"


def test_stale_buffers_are_removed_and_live_or_new_ones_kept(tmp_path):
    """Looked at from ``later`` (ten staleness periods from now): the unmapped file is stale and
    removed, the mapped one kept, and one written at ``later`` kept. The files' real ages stay
    young, so launches of other tests running meanwhile leave them alone."""
    tag = f"test{os.getpid()}"
    stale, live, new = (cpu_comm.shm_buffer_path(0, tag, kind) for kind in ("stale", "live", "new"))
    later = time.time() + 10 * cpu_comm.STALE_AFTER_S
    for path in (stale, live, new):
        with open(path, "wb") as f:
            f.write(b"\0" * 4096)
    os.utime(new, (later, later))
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import mmap, sys, time
        f = open({live!r}, "r+b"); m = mmap.mmap(f.fileno(), 4096)
        print("mapped", flush=True); time.sleep(120)""")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        removed = cpu_comm.remove_stale_shm_buffers(now=later)
        assert stale in removed and not os.path.exists(stale)
        assert os.path.exists(live) and live not in removed  # a live job maps its buffers
        assert os.path.exists(new) and new not in removed  # may be on its way to being mapped
    finally:
        holder.kill()
        holder.wait()
        for path in (stale, live, new):
            if os.path.exists(path):
                os.remove(path)


def test_unlink_own_buffer(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", f"test{os.getpid()}")
    monkeypatch.setenv("MASTER_PORT", "unlink")
    path = cpu_comm.shm_buffer_path(3)
    open(path, "wb").close()
    assert cpu_comm.unlink_own_shm_buffer(3) and not os.path.exists(path)
    assert not cpu_comm.unlink_own_shm_buffer(3)  # GPU / multi-node launches have none


def test_build_notice_only_before_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = cpu_comm.shm_op_build_directory()
    assert directory == str(tmp_path / cpu_comm.SHM_OP_NAME)
    line = jit_ops.build_notice(cpu_comm.SHM_OP_NAME, directory, "DeepSpeed's op", "about 1 minute")
    assert line.startswith(f"building DeepSpeed's op into {directory}: once per environment")
    assert "about 1 minute" in line
    open(os.path.join(directory, cpu_comm.SHM_OP_NAME + ".so"), "wb").close()
    assert jit_ops.build_notice(cpu_comm.SHM_OP_NAME, directory, "x", "y") is None


def test_build_notice_once_per_launch_whichever_rank_looks_first(tmp_path, capsys):
    """Another rank may look (and build) before local rank 0: the first rank of the launch to find
    the op unbuilt prints the notice, the others of the same launch print nothing."""
    directory = str(tmp_path / "op")
    first = jit_ops.announce_build("op", directory, "the op", "1 s")
    assert capsys.readouterr().out.startswith(f"building the op into {directory}")
    assert jit_ops.announce_build("op", directory, "the op", "1 s") is None  # same launch
    assert capsys.readouterr().out == ""
    open(os.path.join(directory, "op.so"), "wb").close()  # the first rank's build
    jit_ops.build_done(first)
    assert os.listdir(directory) == ["op.so"]  # the claim is gone
    assert jit_ops.announce_build("op", directory, "the op", "1 s") is None  # built: no notice
    os.remove(os.path.join(directory, "op.so"))  # a later launch that must build again
    assert jit_ops.announce_build("op", directory, "the op", "1 s") is not None
    assert capsys.readouterr().out.startswith("building the op")


def _mapped_buffers(pid: int):
    """The DeepSpeed all-reduce buffers (of this user) that process ``pid`` maps, from
    /proc/PID/maps, each as ``(path, unlinked)``."""
    prefix = os.path.join(cpu_comm.SHM_DIR, f"{cpu_comm.SHM_PREFIX}_{os.getuid()}_")
    found = set()
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(prefix):
                path, _, deleted = fields[5].strip().partition(" ")
                found.add((path, deleted == "(deleted)"))
    return found


def test_launch_leaves_no_buffers_after_sigterm(demo_data, tmp_path):
    """pretrain_gpt.py, stopped by SIGTERM in the middle of training, leaves none of its launch's
    DeepSpeed all-reduce buffers in /dev/shm. The control: while it trains, each rank maps both
    ranks' buffers of this launch (DeepSpeed made them, and never unlinks them itself), already
    unlinked (megatron/cpu_comm.py)."""
    import psutil

    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    port = free_port()
    cmd = [deepspeed_launcher(), "--num_gpus", "2", "--master_port", str(port),
           os.path.join(ROOT, "pretrain_gpt.py")] + FLAGS + [
        "--train-iters", "100000", "--data-path", demo_data["web"], "--split", "90,5,5",
        "--data-cache-path", str(tmp_path / "cache")]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if " iteration " in line:
                break
        else:
            pytest.fail("no training iteration logged")
        ranks = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if any(a.startswith("--local_rank=") for a in p.cmdline())]
        assert len(ranks) == 2
        unlinked = {(cpu_comm.shm_buffer_path(r, "127.0.0.1", str(port)), True) for r in range(2)}
        for rank in ranks:
            assert _mapped_buffers(rank.pid) == unlinked
        os.killpg(proc.pid, signal.SIGTERM)  # launcher and ranks, as a job scheduler does
        proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert _own_buffers(port) == []
