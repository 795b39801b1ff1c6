"""Which ranks see the files rank 0 writes into a directory: one probe, for the checks of a run on
several nodes whose directories may be each node's own disk at the same path (a checkpoint's
``--save``: megatron/checkpoint/multinode.py; a data index cache: megatron/data/rank0_first.py)."""
import os
import time
import uuid
from typing import List, Optional

__all__ = ["PROBE_PREFIX", "rank0_file_seen"]

PROBE_PREFIX = ".is-this-shared-"


def _appears(path: str, wait_s: float) -> bool:
    """Whether ``path`` exists now or within ``wait_s`` seconds (polled every 0.1 s)."""
    deadline = time.monotonic() + wait_s
    while not os.path.exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def rank0_file_seen(directory: str, wait_s: float = 0.0, looks: bool = True) -> List[Optional[bool]]:
    """Collective over the world: rank 0 writes a probe file into ``directory`` (made if missing;
    when it cannot write, its own answer is False) and every rank for which ``looks`` is true says
    whether it sees the file, a rank other than 0 waiting up to ``wait_s`` seconds for it (a
    network filesystem may show a new file a moment late). Returns each rank's answer, None for a
    rank that did not look. The probe is removed."""
    import torch

    rank = torch.distributed.get_rank()
    token = [uuid.uuid4().hex if rank == 0 else None]
    torch.distributed.broadcast_object_list(token, src=0)
    probe = os.path.join(directory, PROBE_PREFIX + token[0])
    if rank == 0:
        try:
            os.makedirs(directory, exist_ok=True)
            with open(probe, "w"):
                pass
        except OSError:
            pass  # not written: rank 0's own answer says so
    torch.distributed.barrier()
    seen = _appears(probe, wait_s if rank else 0.0) if looks else None
    answers: List[Optional[bool]] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(answers, seen)  # every rank has looked: the probe can go
    if rank == 0:
        try:
            os.remove(probe)
        except OSError:
            pass
    return answers
