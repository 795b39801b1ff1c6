"""A lost or hung node in one line: which host and ranks stopped answering, in place of gloo's (or
NCCL's) traceback.

At start-up every rank records the host of every rank and the collective timeout
(:func:`record_world`, after one all-gather: megatron/parallel/initialize.py). When a collective
then fails (a peer's connection closed, or no answer within ``--distributed-timeout-minutes``),
the entry point (megatron/runtime/process_exit.py) asks :func:`failure_message`, which holds a roll
call on the rendezvous store: each surviving rank writes its key and waits up to
:data:`ROLL_CALL_S` for the others'. The hosts none of whose ranks answered are the lost ones; if
the store itself does not answer, the node that holds it (rank 0's, the master address) is the
lost one. The line names the hosts, their ranks, the cause (connections closed, or the timeout and
its flag) and what to do; each distinct line is printed once per launch where the store still
answers (megatron/errors.py ``exit_with_error``).
"""
import os
import time
from datetime import timedelta
from typing import Dict, List, Optional, Sequence, Tuple

ROLL_CALL_S = 5.0  # how long the survivors of a failed collective wait for each other's answer
# Messages of a failed collective whose peer went away or never answered (gloo, NCCL, the store)
_LOST_PEER_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                      "Connection refused", "Timed out waiting", "timed out", "Timeout",
                      "NCCL communicator was aborted", "remote process exited")
# ... and where they come from: a torch.distributed error, or a backend's message
_BACKEND_MARKERS = ("gloo", "NCCL", "c10d", "ProcessGroup", "TCPStore")
_ROLL_CALL_KEY = "megatron_roll_call_{}"

_world: Dict[str, object] = {}  # "hosts": host of each rank, "timeout_minutes": the flag's value


def record_world(hosts: Sequence[str], timeout_minutes: float) -> None:
    """Remember the host of every rank (index = global rank) and the collective timeout."""
    _world["hosts"] = list(hosts)
    _world["timeout_minutes"] = timeout_minutes


def describe_timeout(minutes: float) -> str:
    """``6 s (--distributed-timeout-minutes 0.1)``."""
    seconds = minutes * 60
    shown = f"{seconds:g} s" if seconds < 120 else f"{minutes:g} min"
    return f"{shown} (--distributed-timeout-minutes {minutes:g})"


def rank_ranges(ranks: Sequence[int]) -> str:
    """``2-3``, ``0, 2``: sorted ranks with runs joined."""
    ranks = sorted(ranks)
    parts, start = [], None
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            parts.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(parts)


def is_lost_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a failed collective or store operation of a started process group whose
    peer went away or did not answer (nothing else is: a bug keeps its traceback)."""
    if not _world or not isinstance(exc, RuntimeError):
        return False
    import torch.distributed as dist

    text = str(exc)
    from_backend = isinstance(exc, dist.DistError) or any(m in text for m in _BACKEND_MARKERS)
    return from_backend and any(marker in text for marker in _LOST_PEER_MARKERS)


def _roll_call(rank: int, world: int) -> Tuple[Optional[List[int]], bool]:
    """Write this rank's roll-call key and wait up to ROLL_CALL_S for every other rank's: (the
    ranks that did not answer, False), or (None, True) when the store itself does not answer."""
    import torch.distributed as dist

    try:
        store = dist.distributed_c10d._get_default_store()
        store.set_timeout(timedelta(seconds=ROLL_CALL_S))
        store.set(_ROLL_CALL_KEY.format(rank), "1")
        missing = [r for r in range(world) if r != rank]
        deadline = time.monotonic() + ROLL_CALL_S
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not store.check([_ROLL_CALL_KEY.format(r)])]
            if missing:
                time.sleep(0.2)
        return missing, False
    except Exception:  # the store's node died or hangs (its connection closed or timed out)
        return None, True


def failure_message(exc: BaseException) -> str:
    """The one line for a failed collective (``exc``: :func:`is_lost_peer_failure`)."""
    hosts: List[str] = _world["hosts"]
    minutes = _world["timeout_minutes"]
    rank = int(os.environ.get("RANK", "0") or 0)
    timed_out = any(m in str(exc) for m in ("Timed out", "timed out", "Timeout"))
    cause = (f"no answer within the collective timeout of {describe_timeout(minutes)}: it hangs "
             f"or its network is down" if timed_out else
             "its connections closed: its processes died or the node went down")
    missing, store_lost = _roll_call(rank, len(hosts))
    by_host: Dict[str, List[int]] = {}
    for r, host in enumerate(hosts):
        by_host.setdefault(host, []).append(r)
    advice = ("the other ranks stop; relaunch every node with --load to resume from the last "
              "checkpoint")
    if store_lost:
        if int(os.environ.get("LOCAL_RANK", "0") or 0) != 0:
            # no store to report once per launch: local rank 0 reports for this node, and the
            # launcher stops this rank when it exits
            time.sleep(3.0)
        host = hosts[0]
        master = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
        return (f"lost host {host} (ranks {rank_ranges(by_host[host])}), which holds rank 0 and "
                f"the rendezvous store at {master}: {cause}; {advice}")
    lost_hosts = [h for h, ranks in by_host.items() if set(ranks) <= set(missing)]
    if lost_hosts:
        named = "; ".join(f"{h} (ranks {rank_ranges(by_host[h])})" for h in lost_hosts)
        noun = "host" if len(lost_hosts) == 1 else "hosts"
        return f"lost {noun} {named}: {cause}; {advice}"
    if missing:
        named = ", ".join(f"{r} (host {hosts[r]})" for r in missing)
        return (f"ranks {named} stopped answering in a collective ({cause}; see their own error "
                f"above); {advice}")
    return (f"a collective failed on rank {rank} (host {hosts[rank]}) although every rank "
            f"answered the roll call: {str(exc).splitlines()[0][:300]}")
