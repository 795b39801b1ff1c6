"""DeepSpeed's CPU shared-memory all-reduce buffers (megatron/runtime/cpu_comm.py): a stale buffer
is removed, while one a live process maps (a child process holding it here) or one just written
is kept. The buffers' names and the build notice: tests/unit/test_cpu_comm.py."""
import os
import subprocess
import sys
import textwrap
import time

import pytest

from megatron.runtime import cpu_comm

pytestmark = pytest.mark.launch


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
