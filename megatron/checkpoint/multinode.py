"""Checkpoints of a run on several nodes: ``--save`` must be a directory every node sees, and every
rank must resume the same iteration from ``--load``.

Every rank writes its shards into ``--save``, but the tracker (``latest_checkpointed_iteration.txt``)
is written by global rank 0 alone (megatron/checkpoint/engine.py, as DeepSpeed and Megatron-LM do),
so on disks of their own the other nodes would hold shards without a tracker and, on a restart,
start from scratch while node 0 resumes (DeepSpeed's ``use_node_local_storage`` does exactly that).
Both are checked at start-up, in one collective, before anything is built
(:func:`check_checkpoint_dirs`): rank 0 writes a probe into ``--save`` and every rank looks for it
(megatron/runtime/shared_dirs.py);
every rank reads the tracker of ``--load``. A ``--save`` some rank cannot see, or a ``--load`` whose
iteration differs between ranks (minimum != maximum), stops the run with one line naming the ranks,
their hosts and what they see. ``load_checkpoint`` checks the iteration once more as it loads
(:func:`require_same_iteration`). Copies of one checkpoint on every node's own disk are fine for
``--load``.
"""
import socket
from typing import Dict, List, Optional, Sequence, Tuple

from megatron.checkpoint.format import TRACKER_FILENAME, read_tracker
from megatron.errors import CheckpointError
from megatron.runtime.lost_peers import rank_ranges
from megatron.runtime.shared_dirs import rank0_file_seen

VISIBILITY_WAIT_S = 3.0  # network filesystems may show a new file a moment late


def _by_value(values: Sequence[Tuple[str, object]]) -> str:
    """``ranks 0-1 (host node0) iteration 6; ranks 2-3 (host node1) none``."""
    groups: Dict[object, List[int]] = {}
    for rank, (_, value) in enumerate(values):
        groups.setdefault(value, []).append(rank)
    parts = []
    for value, ranks in groups.items():
        hosts = ", ".join(dict.fromkeys(values[r][0] for r in ranks))
        shown = "none (no tracker)" if value is None else f"iteration {value}"
        parts.append(f"ranks {rank_ranges(ranks)} (host {hosts}) {shown}")
    return "; ".join(parts)


def iteration_disagreement(load_dir: str, views: Sequence[Tuple[str, Optional[int]]]) -> Optional[str]:
    """The error when the ranks' ``(host, iteration)`` views of ``load_dir`` differ, else None."""
    if len({iteration for _, iteration in views}) <= 1:
        return None
    return (f"--load {load_dir}: the ranks do not resume the same iteration ({_by_value(views)}; "
            f"from its {TRACKER_FILENAME}); every node must see the same checkpoint: a directory "
            "on a filesystem all nodes share, or the same copy on each node's disk")


def unshared_save_error(save_dir: str, views: Sequence[Tuple[str, bool]]) -> Optional[str]:
    """The error when some rank does not see the marker rank 0 wrote into ``save_dir``."""
    if not views[0][1]:
        return None  # rank 0 could not write there: saving reports it
    blind = [r for r, (_, seen) in enumerate(views) if not seen]
    if not blind:
        return None
    hosts = ", ".join(dict.fromkeys(views[r][0] for r in blind))
    return (f"--save {save_dir}: ranks {rank_ranges(blind)} (host {hosts}) do not see the files "
            f"rank 0 (host {views[0][0]}) writes there. Every rank writes its shards there and "
            f"rank 0 alone the tracker ({TRACKER_FILENAME}), so on disks of their own the other "
            "nodes would resume nothing: give --save a directory on a filesystem all nodes share")


def _gather(value) -> list:
    import torch

    out = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, value)
    return out


def require_same_iteration(load_dir: str, iteration: Optional[int]) -> None:
    """Collective: raise CheckpointError unless every rank read ``iteration`` from ``load_dir``."""
    import torch

    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return
    error = iteration_disagreement(load_dir, _gather((socket.gethostname(), iteration)))
    if error:
        raise CheckpointError(error)


def check_checkpoint_dirs(save_dir: Optional[str], load_dir: Optional[str]) -> None:
    """Collective over the world, at start-up: raise CheckpointError naming every problem (one
    line) when some rank cannot see what rank 0 writes into ``save_dir``, or the ranks read
    different iterations from ``load_dir``'s tracker. Nothing to check in a 1-rank run; the
    ``--save`` check only when the ranks span several hosts."""
    import torch

    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1 \
            or not (save_dir or load_dir):
        return
    host = socket.gethostname()
    hosts = _gather(host)
    seen = None
    if save_dir and len(set(hosts)) > 1:
        seen = rank0_file_seen(save_dir, VISIBILITY_WAIT_S)
    unreadable = None
    try:
        iteration = read_tracker(load_dir) if load_dir else None
    except CheckpointError as e:  # raised after the gather, so no rank waits for this one
        iteration, unreadable = "unreadable", e
    iterations = _gather(iteration)
    problems = [unshared_save_error(save_dir, list(zip(hosts, seen, strict=True)))
                if seen is not None else None,
                iteration_disagreement(load_dir, list(zip(hosts, iterations, strict=True)))
                if load_dir else None]
    problems = [p for p in problems if p]
    if unreadable is not None and not problems:
        raise unreadable
    if problems:
        raise CheckpointError("; and ".join(problems))

