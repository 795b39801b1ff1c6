"""DeepSpeed's CPU shared-memory all-reduce: a notice before its one-time build, and its buffers.

On the CPU accelerator ``deepspeed.init_distributed`` JIT-builds the ``deepspeed_shm_comm`` op (once
per environment, into ``$TORCH_EXTENSIONS_DIR``) and, when every rank runs on one machine, each rank
creates a POSIX shared-memory buffer ``/dev/shm/deepspeed_allreduce_buffer_{uid}_{MASTER_ADDR}_
{MASTER_PORT}_{rank}`` (about 69 MB; see DeepSpeed's ``csrc/cpu/comm/shm.cpp``) that every other
rank maps. DeepSpeed never unlinks these names, so every launch would leave them behind.

Here each rank unlinks its own name as soon as all ranks have mapped every buffer (the mappings stay
valid until the processes exit, as POSIX shared memory guarantees), so nothing is left after a
normal exit, an error, SIGTERM or SIGKILL once training has started. Buffers of a launch killed
during start-up are removed by the next launch: a buffer no live process maps is stale.
"""
import glob
import os
import time
from typing import List, Optional, Set

from megatron.runtime.jit_ops import announce_build, build_directory

SHM_DIR = "/dev/shm"
SHM_PREFIX = "deepspeed_allreduce_buffer"
SHM_OP_NAME = "deepspeed_shm_comm"
# A buffer is mapped by its creator right after creation; one younger than this may still be on its
# way to being mapped, so it is never treated as stale.
STALE_AFTER_S = 30.0


def shm_buffer_path(rank: int, addr: Optional[str] = None, port: Optional[str] = None) -> str:
    """The ``/dev/shm`` path of ``rank``'s all-reduce buffer for the launch at ``addr:port``
    (default ``$MASTER_ADDR:$MASTER_PORT``), named as DeepSpeed's ``shm_initialize`` names it."""
    addr = os.environ.get("MASTER_ADDR", "") if addr is None else addr
    port = os.environ.get("MASTER_PORT", "") if port is None else port
    return os.path.join(SHM_DIR, f"{SHM_PREFIX}_{os.getuid()}_{addr}_{port}_{rank}")


def _mapped_paths() -> Set[str]:
    """Every file path some process readable by this user currently maps (``/proc/*/maps``)."""
    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                for line in f:
                    if SHM_PREFIX in line:
                        mapped.add(line.split(None, 5)[-1].strip())
        except OSError:  # the process ended, or belongs to another user
            continue
    return mapped


def remove_stale_shm_buffers(now: Optional[float] = None) -> List[str]:
    """Remove this user's DeepSpeed all-reduce buffers that no live process maps (left by a launch
    that was killed before it could unlink them) and that are older than ``STALE_AFTER_S`` seconds;
    a live job's buffers are always mapped, so they are never touched. Returns the removed paths."""
    now = time.time() if now is None else now
    candidates = glob.glob(os.path.join(SHM_DIR, f"{SHM_PREFIX}_{os.getuid()}_*"))
    if not candidates:
        return []
    mapped = _mapped_paths()
    removed = []
    for path in candidates:
        try:
            if path in mapped or now - os.stat(path).st_mtime < STALE_AFTER_S:
                continue
            os.remove(path)
            removed.append(path)
        except OSError:  # removed meanwhile by its own job or another launch
            continue
    return removed


def unlink_own_shm_buffer(rank: int) -> bool:
    """Unlink this rank's all-reduce buffer name (the mappings of every rank stay valid). Call once
    all ranks have mapped every buffer, i.e. after ``deepspeed.init_distributed`` returned on all
    ranks (a barrier). Returns whether there was a buffer to unlink."""
    try:
        os.remove(shm_buffer_path(rank))
        return True
    except FileNotFoundError:  # no shm all-reduce in this launch (GPU, several nodes, 1 rank)
        return False


def shm_op_build_directory() -> Optional[str]:
    """Where DeepSpeed would JIT-build its CPU shm op, or None when this run needs no build (not the
    CPU accelerator, op not compatible, or installed prebuilt)."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops

    if get_accelerator().device_name() != "cpu":
        return None
    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False) \
            or installed_ops.get(builder.NAME, False):
        return None
    return build_directory(builder.name)


def announce_shm_op_build() -> Optional[str]:
    """Print, once per launch, one line before DeepSpeed JIT-builds its CPU communication op
    (``deepspeed.init_distributed`` does it silently, once per environment). Returns the claim
    file to pass to ``jit_ops.build_done`` after ``init_distributed`` (None: nothing printed)."""
    directory = shm_op_build_directory()
    if directory is None:
        return None
    return announce_build(SHM_OP_NAME, directory,
                          f"DeepSpeed's CPU communication op ({SHM_OP_NAME})", "about 1-2 minutes")
