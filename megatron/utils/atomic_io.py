"""Write files so that a reader (or a resumed run) never sees half of one."""
import os
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def atomic_path(path: str) -> Iterator[str]:
    """Yield a temporary path beside ``path``; when the block succeeds it is renamed onto ``path``
    (atomic on POSIX), when it fails it is removed and ``path`` is left as it was."""
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def atomic_write_text(path: str, text: str, fsync: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically; ``fsync`` makes it durable before the rename."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
