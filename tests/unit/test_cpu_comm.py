"""DeepSpeed's CPU shared-memory all-reduce buffers (megatron/runtime/cpu_comm.py) and the notice before a
one-time op build (megatron/runtime/jit_ops.py). Stale buffers removed, live ones kept (a child
process maps one): tests/e2e/test_cpu_comm_e2e.py. A launch through the deepspeed launcher maps
its buffers already unlinked and leaves none when it ends: tests/e2e/test_graceful_exit.py."""
import os

from megatron.runtime import cpu_comm, jit_ops


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


def test_a_dead_builds_lock_is_removed_and_a_live_build_is_waited_for(tmp_path, capsys):
    """torch's build lock left by a killed build (it names no process) is removed under the
    project's flock, with a line; a build in progress (holding the flock on its own open file, as
    another process does, its torch lock present) is waited for, and its lock, removed by it when
    done, is not touched."""
    import fcntl
    import threading
    import time

    directory = str(tmp_path / "op")
    os.makedirs(directory)
    stale = os.path.join(directory, jit_ops.TORCH_BUILD_LOCK)
    open(stale, "w").close()  # a build killed midway
    with jit_ops.exclusive_build(directory):
        assert not os.path.exists(stale)
    assert capsys.readouterr().out.startswith(f"removing {stale}: a build of this op stopped")

    holding = threading.Event()

    def live_build():  # flock is per open file: this one excludes the test's own open below
        fd = os.open(os.path.join(directory, jit_ops.BUILD_FLOCK), os.O_CREAT | os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        open(stale, "w").close()
        holding.set()
        time.sleep(1.5)
        os.remove(stale)
        os.close(fd)

    builder = threading.Thread(target=live_build)
    builder.start()
    assert holding.wait(timeout=30)  # it holds the flock and torch's lock
    start = time.monotonic()
    with jit_ops.exclusive_build(directory):
        waited = time.monotonic() - start
        assert not os.path.exists(stale)  # removed by its builder, after it finished
    builder.join()
    assert waited > 0.5 and capsys.readouterr().out == ""  # waited; nothing removed
