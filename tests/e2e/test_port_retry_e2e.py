"""tools/cpu_env.sh's ``launch_with_port_retry`` (the example scripts' launch) with a fake launcher:
a launch that failed with the run's busy-port error is launched once more on another port, saying
so in one line; another failure, or a port the user fixed with MASTER_PORT, is not; the launch's
output still reaches stdout and stderr. The retry decision itself: tests/unit/test_ports.py."""
import os
import re
import subprocess
import sys

import pytest

from helpers.paths import ROOT
from megatron.runtime.ports import busy_port_message, ephemeral_range

pytestmark = pytest.mark.launch

# --master_port P ARGS...: records P; MODE says how each call ends (taken: the run's busy-port
# error on the first call; always: on every call; other: another error)
FAKE_LAUNCHER = r"""#!/usr/bin/env bash
port=$2; shift 2
echo "$port" >> "$CALLS"
echo "launch on $port: $*"
echo "a warning of the launch" >&2
n=$(wc -l < "$CALLS")
if { [ "$MODE" = taken ] && [ "$n" = 1 ]; } || [ "$MODE" = always ]; then
  echo "error: $(printf %s "$BUSY" | sed "s/PORT_HERE/$port/")" >&2; exit 1
fi
if [ "$MODE" = other ]; then echo "error: --data-path x: no such file" >&2; exit 1; fi
echo trained
"""


@pytest.fixture
def fake(tmp_path):
    """The fake launcher, and a venv tools/setup_env.sh takes as installed (nothing installed)."""
    launcher = tmp_path / "launcher"
    launcher.write_text(FAKE_LAUNCHER)
    launcher.chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (venv / "bin" / "python").chmod(0o755)
    stamp = subprocess.run(["sha1sum", os.path.join(ROOT, "pyproject.toml")], capture_output=True,
                           text=True, check=True).stdout[:12]
    (venv / f".installed-{stamp}").touch()
    return launcher, venv


def run(tmp_path, fake, mode, **env):
    launcher, venv = fake
    calls = tmp_path / "calls"
    script = (f'set -euo pipefail\nsource "{ROOT}/tools/cpu_env.sh"\n'
              f'launch_with_port_retry "{launcher}" --num_gpus 2 pretrain_gpt.py --flag "a b"\n'
              'echo "script went on"\n')
    run_env = {k: v for k, v in os.environ.items() if k != "MASTER_PORT"}
    run_env.update(VENV=str(venv), CALLS=str(calls), MODE=mode, TMPDIR=str(tmp_path),
                   BUSY=busy_port_message("127.0.0.1", "PORT_HERE"), **env)
    proc = subprocess.run(["bash", "-c", script], env=run_env, capture_output=True, text=True,
                          timeout=60)
    ports = [int(p) for p in calls.read_text().split()] if calls.exists() else []
    assert list(tmp_path.glob("launch_stderr.*")) == []  # the captured stderr is removed
    return proc, ports


def test_a_launch_whose_port_was_taken_runs_once_more_on_another(tmp_path, fake):
    proc, ports = run(tmp_path, fake, "taken")
    assert proc.returncode == 0, proc.stderr
    assert len(ports) == 2 and ports[0] != ports[1]
    assert all(10000 <= p < ephemeral_range()[0] for p in ports)
    retry = [line for line in proc.stderr.splitlines() if line.startswith("[launch]")]
    assert retry == [f"[launch] MASTER_PORT {ports[0]} was taken before the launcher bound it; "
                     f"retrying once on port {ports[1]}"]
    assert proc.stdout.splitlines() == [f"launch on {ports[0]}: --num_gpus 2 pretrain_gpt.py "
                                        "--flag a b", f"launch on {ports[1]}: --num_gpus 2 "
                                        "pretrain_gpt.py --flag a b", "trained", "script went on"]
    assert proc.stderr.count("a warning of the launch") == 2  # stderr streams through


def test_the_retry_is_once_and_its_failure_stops_the_script(tmp_path, fake):
    proc, ports = run(tmp_path, fake, "always")
    assert proc.returncode == 1 and len(ports) == 2
    assert proc.stderr.count("[launch]") == 1 and "script went on" not in proc.stdout


def test_another_failure_is_not_retried(tmp_path, fake):
    proc, ports = run(tmp_path, fake, "other")
    assert proc.returncode == 1 and len(ports) == 1
    assert "[launch]" not in proc.stderr and "error: --data-path x: no such file" in proc.stderr
    assert "script went on" not in proc.stdout


def test_a_port_the_user_set_is_used_and_never_changed(tmp_path, fake):
    proc, ports = run(tmp_path, fake, "taken", MASTER_PORT="12345")
    assert proc.returncode == 1 and ports == [12345]
    assert "[launch]" not in proc.stderr
    assert re.search(r"error: MASTER_PORT 12345 on 127.0.0.1 is already in use", proc.stderr)
