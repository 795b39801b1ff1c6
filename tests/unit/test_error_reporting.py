"""How errors reach the user: one line per error, all flag problems of a command line together,
once per launch (not once per rank), exit status 2 for flags and 1 for other input
(docs/robustness.md). Through the launcher: tests/e2e/test_error_reporting_e2e.py."""
import os
import sys

import pytest

from helpers.flags import tiny_run_flags
from megatron import errors
from megatron.config.parser import parse_args

BASE = tiny_run_flags(hidden_size=32, seq_length=16, global_batch_size=4, train_iters=4,
                      data_path="unused")


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and "usage:" not in err, err
    return lines[0]


def test_unknown_flags_and_bad_values_reported_together(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(BASE + ["--foo", "1", "--lr", "abc", "--lr-decay-style", "cosinus",
                           "--num-layers", "two", "--bar"], world_size=1)
    assert info.value.code == errors.EXIT_FLAG_ERROR == 2
    line = _one_error_line(capsys)
    assert line.startswith("error: unrecognized arguments: --foo 1 --bar; ")
    for fragment in ("argument --lr: invalid float value: 'abc'",
                     "argument --lr-decay-style: invalid choice: 'cosinus'",
                     "argument --num-layers: invalid int value: 'two'"):
        assert fragment in line, line
    assert line.endswith(" --help)")


def test_bad_value_then_missing_value_reported_together(capsys):
    with pytest.raises(SystemExit):
        parse_args(BASE + ["--seed", "x", "--lr"], world_size=1)
    line = _one_error_line(capsys)
    assert "argument --seed: invalid int value: 'x'" in line
    assert "argument --lr: expected one argument" in line


def test_validation_errors_reported_together(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(BASE + ["--global-batch-size", "5", "--hidden-size", "33", "--fp16", "--bf16"],
                   world_size=1)
    assert info.value.code == 2
    line = _one_error_line(capsys)
    for fragment in ("--global-batch-size 5 is not divisible by --micro-batch-size 2",
                     "--hidden-size 33 is not divisible by --num-attention-heads 4",
                     "--fp16 and --bf16 are mutually exclusive"):
        assert fragment in line, line


def test_nonzero_rank_reports_a_startup_error_only_late(capsys, monkeypatch):
    """Before torch.distributed starts every rank has the same (flag) error: rank 0 prints it at
    once; rank 1 waits (the launcher stops it when rank 0 exits), then prints it with its rank."""
    slept = []
    monkeypatch.setattr(errors.time, "sleep", slept.append)
    # Before start-up: hide a process group an earlier test of this session may have started.
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    with pytest.raises(SystemExit):
        errors.exit_with_error("bad thing", 1)
    assert capsys.readouterr().err == "error: bad thing\n" and slept == []
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit):
        errors.exit_with_error("bad thing", 1)
    assert capsys.readouterr().err == "[rank 1] error: bad thing\n"
    assert slept == [errors.NONZERO_RANK_REPORT_DELAY_S]
    # the first rank of another node (its launcher's log is its own) reports at once
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(SystemExit):
        errors.exit_with_error("bad thing", 1)
    assert capsys.readouterr().err == "[rank 2] error: bad thing\n"
    assert slept == [errors.NONZERO_RANK_REPORT_DELAY_S]


def test_each_distinct_error_printed_once_after_startup(capsys, monkeypatch, dist_group):
    """After torch.distributed starts, the first rank to meet an error prints it; a rank meeting
    the same one stays silent (counted in the process group's store); another one is printed."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    message = f"checkpoint broken {os.getpid()}"
    with pytest.raises(SystemExit):
        errors.exit_with_error(message, 1)
    assert capsys.readouterr().err == f"[rank 1] error: {message}\n"
    with pytest.raises(SystemExit):
        errors.exit_with_error(message, 1)  # as another rank would
    assert capsys.readouterr().err == ""
    with pytest.raises(SystemExit):
        errors.exit_with_error(message + " elsewhere", 1)
    assert capsys.readouterr().err == f"[rank 1] error: {message} elsewhere\n"
