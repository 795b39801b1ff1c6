"""How errors reach the user through the deepspeed launcher: a bad flag value is printed once (not
once per rank) without the usage text, exit status 2; a busy master port is one line, exit status
1 (in process: tests/unit/test_error_reporting.py; docs/robustness.md)."""
import socket

import pytest

from helpers.flags import tiny_run_flags
from helpers.launch import run_deepspeed

pytestmark = pytest.mark.launch

BASE = tiny_run_flags(hidden_size=32, seq_length=16, global_batch_size=4, train_iters=4,
                      data_path="unused")


def _errors_in(proc):
    log = proc.stdout + proc.stderr
    return [line for line in log.splitlines() if "error: " in line and "[ERROR]" not in line], log


def test_launcher_bad_flag_value_printed_once_without_usage():
    proc = run_deepspeed("pretrain_gpt.py", BASE + ["--lr", "abc"], check=False)
    lines, log = _errors_in(proc)
    assert proc.returncode == 2, log[-3000:]
    assert lines == ["error: argument --lr: invalid float value: 'abc' (see pretrain_gpt.py --help)"], \
        log[-3000:]
    assert "usage:" not in log and "Traceback" not in log


def test_launcher_busy_master_port_is_one_line(demo_data):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run_deepspeed("pretrain_gpt.py", BASE[:-1] + [demo_data["web"]], check=False,
                             master_port=port)
    lines, log = _errors_in(proc)
    assert proc.returncode == 1, log[-3000:]
    assert lines == [f"error: MASTER_PORT {port} on 127.0.0.1 is already in use by another process; "
                     "pick a free port: --master_port PORT for the deepspeed launcher, "
                     "MASTER_PORT=PORT for the example scripts"], log[-3000:]
    assert "Traceback" not in log and "EADDRINUSE" not in log
