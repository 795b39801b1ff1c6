"""C++ ops built at first use with torch.utils.cpp_extension, announced before they are built.

torch builds each op once into ``$TORCH_EXTENSIONS_DIR/NAME`` (default under ``~/.cache``; the
project's scripts put it beside the venv), reuses the build while the sources are unchanged and
locks it against concurrent builds by other ranks. A build takes from seconds to minutes with no
output, so a line saying what is built, that it happens once, and about how long it takes is
printed first (by local rank 0 only).
"""
import os
from typing import List, Optional


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


def announce_build(name: str, directory: str, what: str, duration: str) -> None:
    """Print :func:`build_notice` on local rank 0 when the op still has to be built."""
    notice = build_notice(name, directory, what, duration)
    if notice and os.environ.get("LOCAL_RANK", "0") == "0":
        print(notice, flush=True)


def load_op(name: str, sources: List[str], extra_cflags: List[str], what: str, duration: str):
    """Build (first use, announced) or reuse the op ``name`` from ``sources`` and import it."""
    from torch.utils.cpp_extension import load

    announce_build(name, build_directory(name), what, duration)
    return load(name=name, sources=sources, extra_cflags=extra_cflags, verbose=False)
