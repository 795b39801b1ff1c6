"""Rank 0 builds the data indices first; the other ranks wait for it on a file in the cache
directory, not at a collective, so a build longer than the process group's timeout (10 to 30
minutes: a blend of thousands of prefixes, a billion samples) fails no rank (bigcode Megatron-LM
#15). Imports nothing of the project."""
import os
import time
import uuid
from contextlib import contextmanager
from typing import Iterator, Optional

__all__ = ["READY_PREFIX", "WAIT_REPORT_S", "rank0_builds_first"]

READY_PREFIX = ".built-by-rank-0-"
WAIT_REPORT_S = 30.0  # a waiting rank says so this often (seconds)


def _wait_for_rank0(ready: str, what: str, rank: int, report_s: float) -> None:
    """Block until rank 0 publishes ``ready`` (or ``ready + '.failed'``, then raise with its
    text); rank 1 says every ``report_s`` seconds that it waits."""
    start = last = time.monotonic()
    while not os.path.exists(ready):
        failed = ready + ".failed"
        if os.path.exists(failed):
            with open(failed) as f:
                raise RuntimeError(f"{what}: rank 0 failed to build the data indices: {f.read()}")
        now = time.monotonic()
        if rank == 1 and now - last >= report_s:
            last = now
            print(f"data: {what}: ranks 1+ wait for rank 0 to build the data indices "
                  f"({now - start:.0f} s so far; a file wait, no collective timeout)", flush=True)
        time.sleep(0.2)


@contextmanager
def rank0_builds_first(cache_dir: Optional[str], what: str,
                       report_s: float = WAIT_REPORT_S) -> Iterator[int]:
    """Run the body on global rank 0 first, then on every other rank (which reads what rank 0
    cached in ``cache_dir``); yields this rank. The other ranks wait for a file rank 0 writes
    into ``cache_dir`` when its body is done, not at a collective, so a build longer than the
    process group's timeout (10 to 30 minutes) fails no rank; a body that fails on rank 0 writes
    its error there for the others to raise. Without ``cache_dir``, or without torch.distributed,
    a barrier orders them."""
    import torch

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    if not distributed or torch.distributed.get_world_size() == 1:
        yield rank
        return
    if not cache_dir:
        if rank != 0:
            torch.distributed.barrier()
        try:
            yield rank
        finally:
            if rank == 0:
                torch.distributed.barrier()
        return
    token = [uuid.uuid4().hex if rank == 0 else None]
    torch.distributed.broadcast_object_list(token, src=0)  # quick: before the long build
    ready = os.path.join(cache_dir, READY_PREFIX + token[0])
    if rank != 0:
        _wait_for_rank0(ready, what, rank, report_s)
        yield rank
    else:
        os.makedirs(cache_dir, exist_ok=True)
        try:
            yield rank
        except BaseException as exc:
            with open(ready + ".failed", "w") as f:
                f.write(f"{type(exc).__name__}: {exc}")
            raise
        with open(ready, "w"):
            pass
    torch.distributed.barrier()  # every rank past the wait: the marker can go
    if rank == 0:
        try:
            os.remove(ready)
        except OSError:
            pass
