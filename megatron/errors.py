"""User-facing errors: bad flags, files, blend configs or checkpoints.

Entry points catch :class:`ConfigError` and print its message (which names the flag, file, key and
value) instead of a stack trace; anything else is a bug and keeps its traceback.
"""
import sys
from typing import Callable


class ConfigError(ValueError):
    """Bad input from the user; the message says what was given and what is allowed."""


def run_entry_point(main: Callable[[], object]) -> None:
    """Run ``main()``; a :class:`ConfigError` prints ``error: MESSAGE`` (with the rank under a
    launcher) and exits with status 1."""
    try:
        main()
    except ConfigError as e:
        import os

        rank = os.environ.get("RANK")
        prefix = f"[rank {rank}] " if rank is not None and os.environ.get("WORLD_SIZE", "1") != "1" else ""
        print(f"{prefix}error: {e}", file=sys.stderr, flush=True)
        sys.exit(1)
