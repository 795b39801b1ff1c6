"""Rank 0 builds the data indices first; the other ranks wait for it on a file in the cache
directory, not at a collective, so a build longer than the process group's timeout (10 to 30
minutes: a blend of thousands of prefixes, a billion samples) fails no rank (bigcode Megatron-LM
#15). On a cache directory that is each node's own disk (the same path, not shared), the first
rank of every node builds for its node instead (Megatron-LM #907, Megatron-DeepSpeed #356: no
indices on the other nodes)."""
import os
import socket
import time
import uuid
from contextlib import contextmanager
from typing import Iterator, Optional

from megatron.runtime.shared_dirs import rank0_file_seen

__all__ = ["READY_PREFIX", "WAIT_REPORT_S", "rank0_builds_first"]

READY_PREFIX = ".built-by-rank-0-"
WAIT_REPORT_S = 30.0  # a waiting rank says so this often (seconds)


def _wait_for_rank0(ready: str, what: str, rank: int, report_s: float, builder: int = 0) -> None:
    """Block until the ``builder`` rank publishes ``ready`` (or ``ready + '.failed'``, then raise
    with its text); the rank after the builder says every ``report_s`` seconds that it waits."""
    start = last = time.monotonic()
    while not os.path.exists(ready):
        failed = ready + ".failed"
        if os.path.exists(failed):
            with open(failed) as f:
                raise RuntimeError(f"{what}: rank {builder} failed to build the data indices: "
                                   f"{f.read()}")
        now = time.monotonic()
        if rank == builder + 1 and now - last >= report_s:
            last = now
            print(f"data: {what}: ranks {builder + 1}+ wait for rank {builder} to build the data "
                  f"indices ({now - start:.0f} s so far; a file wait, no collective timeout)",
                  flush=True)
        time.sleep(0.2)


def _node_builders(cache_dir: str, host: str) -> "tuple[int, bool]":
    """Collective: (the global rank that builds for this rank, whether any node builds for
    itself). Rank 0 builds for every rank that sees the files it writes into ``cache_dir`` (a
    shared filesystem); the first rank of a node that does not see them (``--data-cache-path`` on
    the node's own disk) builds for its node. One gather of the host names; across hosts, one
    probe (megatron/runtime/shared_dirs.py) that each node's first rank looks for."""
    import torch

    hosts = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(hosts, host)
    if len(set(hosts)) == 1:
        return 0, False
    leaders = {}
    for r, h in enumerate(hosts):
        leaders.setdefault(h, r)
    seen = rank0_file_seen(cache_dir, looks=torch.distributed.get_rank() == leaders[host])
    own = {h: not seen[r] for h, r in leaders.items()}
    return (leaders[host] if own[host] else 0), any(own.values())


@contextmanager
def rank0_builds_first(cache_dir: Optional[str], what: str, report_s: float = WAIT_REPORT_S,
                       host: Optional[str] = None) -> Iterator[bool]:
    """Run the body on the rank that builds first, then on every other rank (which reads what
    was cached in ``cache_dir``); yields whether this rank builds. The builder is global rank 0
    when every rank sees the files it writes into ``cache_dir``; on a cache directory private to
    each node (a node-local disk at the same path), the first rank of each node that does not see
    them builds for its node (:func:`_node_builders`; ``host``: this rank's node, default its host
    name). The other ranks wait for a file their builder writes into ``cache_dir`` when its body
    is done, not at a collective, so a build longer than the process group's timeout (10 to 30
    minutes) fails no rank; a body that fails on a builder writes its error there for the ranks it
    builds for to raise. Without ``cache_dir``, or without torch.distributed, a barrier orders
    rank 0 before the others. In a DataLoader worker (a sampling mixer's worker building the phase
    its rank has built, megatron/train/mixer_loader.py) nothing is built or waited for: the worker
    reads what its rank cached, and never joins its rank's collectives (a forked copy of the
    rank's process group would corrupt the rank's own)."""
    import torch.utils.data

    if torch.utils.data.get_worker_info() is not None:
        yield False
        return
    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    if not distributed or torch.distributed.get_world_size() == 1:
        yield True
        return
    if not cache_dir:
        if rank != 0:
            torch.distributed.barrier()
        try:
            yield rank == 0
        finally:
            if rank == 0:
                torch.distributed.barrier()
        return
    token = [uuid.uuid4().hex if rank == 0 else None]
    torch.distributed.broadcast_object_list(token, src=0)  # quick: before the long build
    builder, per_node = _node_builders(cache_dir, host or socket.gethostname())
    if per_node and rank == 0:
        print(f"data: {what}: the cache directory {cache_dir} is not shared by every node (a "
              "node-local disk): the first rank of each node that does not see rank 0's files "
              "builds the indices there", flush=True)
    ready = os.path.join(cache_dir, READY_PREFIX + token[0])
    if rank != builder:
        _wait_for_rank0(ready, what, rank, report_s, builder)
        yield False
    else:
        os.makedirs(cache_dir, exist_ok=True)
        try:
            yield True
        except BaseException as exc:
            with open(ready + ".failed", "w") as f:
                f.write(f"{type(exc).__name__}: {exc}")
            raise
        with open(ready, "w"):
            pass
    torch.distributed.barrier()  # every rank past the wait: the marker can go
    if rank == builder:
        try:
            os.remove(ready)
        except OSError:
            pass
