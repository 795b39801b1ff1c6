"""User-facing errors: bad flags, files, blend configs or checkpoints.

Entry points catch :class:`ConfigError` and print its message (which names the flag, file, key and
value) instead of a stack trace (megatron/runtime/process_exit.py ``run_entry_point``); anything
else is a bug and keeps its traceback. A leaf: imports no module of the project.
"""
import os
import sys
import time
from typing import NoReturn

# Exit statuses of the entry points (docs/robustness.md lists them).
EXIT_CONFIG_ERROR = 1  # bad file, blend config, checkpoint, busy port ... (ConfigError)
EXIT_FLAG_ERROR = 2  # bad or unknown flag (argparse's status)
EXIT_LOST_PEER = 3  # a node or rank stopped answering in a collective (megatron/runtime/lost_peers.py)
# Under a launcher every rank meets the same flag error; rank 0 reports it and the launcher then
# stops the others, which report theirs only after this many seconds (should rank 0 not exit).
NONZERO_RANK_REPORT_DELAY_S = 10.0


class ConfigError(ValueError):
    """Bad input from the user; the message says what was given and what is allowed."""


class ArgumentError(ConfigError):
    """A bad flag value or flag combination; the message names the flags and the values."""


class CheckpointError(ConfigError):
    """A checkpoint that cannot be used: missing, incomplete, corrupt or incompatible."""


class ReshardError(ConfigError):
    """The checkpoint cannot be resumed on this layout / model (the message says why)."""


def _first_to_report(message: str) -> bool:
    """Whether no other rank of this launch has reported ``message`` yet (counted in the process
    group's key-value store, which needs no collective); True without a process group."""
    import hashlib

    try:
        import torch.distributed as dist

        key = "megatron_error_" + hashlib.sha1(message.encode()).hexdigest()
        return dist.distributed_c10d._get_default_store().add(key, 1) == 1
    except Exception:  # the store is gone (rank 0 exited): report rather than stay silent
        return True


def exit_with_error(message: str, status: int = EXIT_CONFIG_ERROR) -> NoReturn:
    """Print ``error: MESSAGE`` as one line on stderr, once per launch, and exit with ``status``.

    Without a launcher (``$WORLD_SIZE`` unset or 1) the line is printed at once. Under a launcher,
    before torch.distributed starts (flag errors, the same on every rank) rank 0 and the first
    rank of every other node (``$LOCAL_RANK`` 0: each node's launcher has a log of its own) print
    it and any other rank waits ``NONZERO_RANK_REPORT_DELAY_S`` first (its launcher stops it when
    its node's first rank exits); afterwards each distinct message is printed once, by the first rank that meets it, as
    ``[rank N] error: ...``.
    """
    rank = int(os.environ.get("RANK", "0") or 0)
    prefix = ""
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        dist = sys.modules.get("torch.distributed")  # never imported: never initialized
        if dist is not None and dist.is_available() and dist.is_initialized():
            prefix = f"[rank {rank}] "
            if not _first_to_report(message):
                sys.exit(status)
        elif rank != 0:
            # the first rank of another node reports at once (its launcher's log is its own)
            if int(os.environ.get("LOCAL_RANK", rank) or 0) != 0:
                time.sleep(NONZERO_RANK_REPORT_DELAY_S)
            prefix = f"[rank {rank}] "
    sys.stderr.write(f"{prefix}error: {message}\n")  # one write: lines of ranks never run together
    sys.stderr.flush()
    sys.exit(status)
