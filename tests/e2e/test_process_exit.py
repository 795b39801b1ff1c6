"""The entry points' fast exit (megatron/runtime/process_exit.py): nothing is lost by skipping the
interpreter's shutdown collection."""
import subprocess
import sys
import textwrap

import pytest

from helpers.paths import ROOT

pytestmark = pytest.mark.launch

PROGRAM = textwrap.dedent("""
    import gc, sys
    from megatron.errors import ConfigError
    from megatron.runtime.process_exit import run_entry_point

    class Holder:
        def __del__(self):  # what a writer that flushes when finalised does
            with open(sys.argv[1], "w") as f:
                f.write("finalised\\n")

    def main():
        # An object reachable only from a reference cycle: only the cycle collector finalises it.
        holder = Holder()
        holder.me = holder
        del holder
        if sys.argv[2] == "error":
            raise ConfigError("bad thing")

    run_entry_point(main)
    print("frozen", gc.get_freeze_count() > 0)
""")


def _run(tmp_path, outcome):
    target = tmp_path / f"{outcome}.txt"
    proc = subprocess.run([sys.executable, "-c", PROGRAM, str(target), outcome], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    return proc, target


def test_garbage_in_cycles_is_finalised_and_the_rest_frozen(tmp_path):
    proc, target = _run(tmp_path, "ok")
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() == "finalised\n"
    assert "frozen True" in proc.stdout


def test_the_same_on_an_error_exit(tmp_path):
    proc, target = _run(tmp_path, "error")
    assert proc.returncode == 1 and proc.stderr.strip() == "error: bad thing", proc.stderr
    assert target.read_text() == "finalised\n"
