"""C++ ops built at first use with torch.utils.cpp_extension, announced before they are built.

torch builds each op once into ``$TORCH_EXTENSIONS_DIR/NAME`` (default under ``~/.cache``; the
project's scripts put it beside the venv), reuses the build while the sources are unchanged and
locks it against concurrent builds by other ranks. A build takes from seconds to minutes with no
output, so a line saying what is built, that it happens once, and about how long it takes is
printed first, once per launch: by the first rank of the launch to find the op unbuilt (not always
local rank 0: another rank may start first and finish a quick build before rank 0 looks). Ranks
agree through a claim file in the build directory named after the launch (the launcher's pid),
removed once the op is loaded.

torch's own build lock (``NAME/lock``, created by the builder and removed when it is done) names no
process, so a build killed midway (Ctrl-C or SIGKILL in a first launch) left it behind and every
later run waited on it forever, silently. Each load here first takes an exclusive ``flock`` on
``NAME/.build.flock`` (the kernel drops it when its process dies): holding it, a torch lock still
present can only be a dead build's, and is removed with a line saying so.
"""
import contextlib
import fcntl
import hashlib
import logging
import os
from typing import List, Optional

logger = logging.getLogger(__name__)


def build_directory(name: str) -> str:
    """The directory torch.utils.cpp_extension builds the op ``name`` in."""
    from torch.utils.cpp_extension import _get_build_directory  # what load() itself uses

    return _get_build_directory(name, verbose=False)


def build_notice(name: str, directory: str, what: str, duration: str) -> Optional[str]:
    """The line to print before building op ``name`` (``what``, taking ``duration``) into
    ``directory``, or None when it is already built there."""
    if os.path.exists(os.path.join(directory, name + ".so")):
        return None
    return (f"building {what} into {directory}: once per environment (TORCH_EXTENSIONS_DIR "
            f"moves it), {duration}; later runs reuse it")


def _claim_path(name: str, directory: str) -> str:
    """The file the ranks of one launch (same parent: the launcher) race to create for ``name``."""
    return os.path.join(directory, f".announce-{name}-{os.getppid()}")


def announce_build(name: str, directory: str, what: str, duration: str) -> Optional[str]:
    """Print :func:`build_notice` when the op still has to be built and no other rank of this
    launch has printed it. Returns the claim file to pass to :func:`build_done` (None when this
    rank printed nothing)."""
    notice = build_notice(name, directory, what, duration)
    if notice is None:
        return None
    claim = _claim_path(name, directory)
    try:
        os.makedirs(directory, exist_ok=True)
        os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # another rank of this launch announced it
        return None
    except OSError:  # build directory not writable: torch will say so; announce anyway
        claim = None
    print(notice, flush=True)
    return claim


def build_done(claim: Optional[str]) -> None:
    """Remove the claim file :func:`announce_build` returned, once the op is loaded."""
    if claim is not None:
        try:
            os.remove(claim)
        except FileNotFoundError:
            pass


TORCH_BUILD_LOCK = "lock"  # torch.utils.cpp_extension's FileBaton in the build directory
BUILD_FLOCK = ".build.flock"


@contextlib.contextmanager
def exclusive_build(directory: str):
    """Hold an exclusive ``flock`` on ``directory/.build.flock`` (waiting for another process's
    build or load of the op to finish); inside it, remove torch's build lock when one is left, a
    build that died before removing it (the module docstring)."""
    os.makedirs(directory, exist_ok=True)
    fd = os.open(os.path.join(directory, BUILD_FLOCK), os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        stale = os.path.join(directory, TORCH_BUILD_LOCK)
        if os.path.exists(stale):
            print(f"removing {stale}: a build of this op stopped before it finished (torch would "
                  "wait on the lock forever); building it again", flush=True)
            with contextlib.suppress(FileNotFoundError):
                os.remove(stale)
        yield
    finally:
        os.close(fd)  # releases the flock


def load_op(name: str, sources: List[str], extra_cflags: List[str], what: str, duration: str):
    """Build (first use, announced) or reuse the op ``name`` from ``sources`` and import it."""
    from torch.utils.cpp_extension import load

    directory = build_directory(name)
    claim = announce_build(name, directory, what, duration)
    try:
        with exclusive_build(directory):
            return load(name=name, sources=sources, extra_cflags=extra_cflags, verbose=False)
    finally:
        build_done(claim)


def load_op_or_none(name: str, sources: List[str], extra_cflags: List[str], what: str,
                    duration: str):
    """:func:`load_op`, or None where the op cannot be built (no compiler or ninja, a failed
    build), with a warning naming ``what``: the caller's pure-Python twin then gives the same
    results, slowly."""
    try:
        return load_op(name, sources, extra_cflags, what, duration)
    except Exception as exc:  # no compiler or ninja, or a failed build
        logger.warning("cannot build %s (%s); using its slow Python twin", what, exc)
        return None


def source_digest(path: str) -> str:
    """The SHA-1 (hex) of the source file ``path``: an op's build rule, for cache keys of what
    the op computes."""
    with open(path, "rb") as f:
        return hashlib.sha1(f.read()).hexdigest()
