"""How the entry points end: :func:`run_entry_point` (a user error as one line, then a fast exit)
and :func:`skip_shutdown_collection`, a faster interpreter exit.

At exit CPython clears every module and runs its cycle collector over what is left: with torch,
megatron-core and DeepSpeed imported that is a few million objects and about 1.5 s per process, paid
by every rank of every launch (and, on a 2-core machine, mostly in series).
:func:`skip_shutdown_collection` collects the garbage the run made (so objects in reference cycles
are still finalised: files flushed, temporary directories removed) and then moves every live object
to the permanent generation (``gc.freeze``), which the shutdown collection skips. ``atexit`` handlers
and ``weakref.finalize`` callbacks still run; memory is returned to the OS as the process ends.
"""
import gc
from typing import Callable

from megatron.errors import EXIT_CONFIG_ERROR, EXIT_LOST_PEER, ConfigError, exit_with_error
from megatron.runtime import lost_peers


def skip_shutdown_collection() -> None:
    """Collect garbage now, then exempt every live object from the collections the interpreter runs
    while shutting down (call it once the process has nothing left to do but exit)."""
    gc.collect()
    gc.freeze()


def run_entry_point(main: Callable[[], object]) -> None:
    """Run ``main()``; a :class:`~megatron.errors.ConfigError` prints ``error: MESSAGE`` once per
    launch (see :func:`megatron.errors.exit_with_error`) and exits with status 1; a collective
    whose peer died or hung (megatron/runtime/lost_peers.py) prints one line naming the lost host
    and ranks and exits with status 3. However it ends,
    the interpreter then exits without its slow shutdown collection
    (:func:`skip_shutdown_collection`)."""
    try:
        main()
    except ConfigError as e:
        exit_with_error(str(e), EXIT_CONFIG_ERROR)
    except RuntimeError as e:
        if not lost_peers.is_lost_peer_failure(e):
            raise
        exit_with_error(lost_peers.failure_message(e), EXIT_LOST_PEER)
    finally:
        skip_shutdown_collection()
