"""Where things are: the repository root and the tests' folders; a directory shared by the
pytest-xdist workers of one session."""
import contextlib
import fcntl
import os
import shutil

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
DATA = os.path.join(TESTS, "data")  # committed inputs (data/seeds: blend and schedule files)
SCRIPTS = os.path.join(TESTS, "scripts")  # child scripts the e2e tests launch


@contextlib.contextmanager
def shared_session_dir(tmp_path_factory, name: str):
    """A directory ``name`` made once per test session and shared by its pytest-xdist workers
    (session fixtures are per worker): yields (directory, done), with the other workers waiting on
    a file lock meanwhile; ``done`` says an earlier holder finished it (the body writes it and then
    touches ``directory / "DONE"``; a body that raises leaves it to the next holder, on an emptied
    directory). Without xdist the directory is the session's own."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        yield tmp_path_factory.mktemp(name), False
        return
    root = tmp_path_factory.getbasetemp().parent  # pytest-N/, the workers' basetemps' parent
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        directory = root / name
        done = (directory / "DONE").exists()
        if not done:  # new, or left unfinished by a worker whose body failed
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
        yield directory, done
        (directory / "DONE").touch()
