"""The launch port (megatron/runtime/ports.py): drawn below the kernel's ephemeral range read from
the range file (Linux's default range when it is unreadable or garbled), free when drawn, never
DeepSpeed's default; and the one retry of a launch whose port another process took first, which
no other failure gets. Fake launches only; the shell side (tools/cpu_env.sh) is
tests/e2e/test_port_retry_e2e.py."""
import socket
import subprocess

import pytest

from megatron.runtime import ports


class Draws:
    """A stand-in for the random source: ``randint`` returns ``values`` in turn."""

    def __init__(self, *values):
        self.values, self.calls = list(values), []

    def randint(self, first, last):
        self.calls.append((first, last))
        return self.values.pop(0)


def range_file(tmp_path, text: str) -> str:
    path = tmp_path / "ip_local_port_range"
    path.write_text(text)
    return str(path)


@pytest.fixture
def listening():
    """A port something listens on (below the ephemeral range, as a launch's would be)."""
    s = socket.socket()
    s.bind(("127.0.0.1", ports.launch_port()))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_the_ephemeral_range_is_read_from_the_file(tmp_path):
    assert ports.ephemeral_range(range_file(tmp_path, "40000\t50000\n")) == (40000, 50000)


@pytest.mark.parametrize("text", ["", "garbled", "40000", "40000 50000 60000", "50000 40000",
                                  "0 50000", "40000 70000", "4e4 5e4"])
def test_a_garbled_range_file_gives_linux_default(tmp_path, text):
    assert ports.ephemeral_range(range_file(tmp_path, text)) == (32768, 60999)


def test_an_unreadable_range_file_gives_linux_default(tmp_path):
    assert ports.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
    assert ports.ephemeral_range(str(tmp_path)) == (32768, 60999)  # a directory


@pytest.mark.parametrize("text, span", [
    ("32768 60999", (10000, 32767)),  # Linux's default: 10000 up to the range
    ("11000 60999", (10000, 10999)),  # 1000 ports below: still enough
    ("10500 60999", (61000, 65535)),  # too few below: above the range
    ("5000 65000", (1024, 4999)),  # too few above too: below 10000
    ("1500 65000", None),  # nowhere: the kernel's choice
])
def test_the_ports_drawn_from(tmp_path, text, span):
    assert ports.launch_port_range(range_file(tmp_path, text)) == span


def test_launch_ports_are_drawn_below_the_ephemeral_low_bound_of_the_file(tmp_path):
    path = range_file(tmp_path, "20000 60999")
    drawn = {ports.launch_port(path) for _ in range(30)}
    assert all(10000 <= p < 20000 for p in drawn), drawn
    assert not drawn & set(ports.AVOIDED_PORTS)
    assert len(drawn) > 20  # drawn at random, not counted up


def test_the_draws_ignore_the_process_random_seed(tmp_path):
    import random

    path = range_file(tmp_path, "32768 60999")
    random.seed(0)
    first = [ports.launch_port(path) for _ in range(3)]
    random.seed(0)
    assert [ports.launch_port(path) for _ in range(3)] != first


def test_a_port_in_use_is_never_returned(tmp_path, listening):
    path = range_file(tmp_path, "32768 60999")
    free = ports.launch_port(path)
    draws = Draws(listening, 29500, free)
    assert ports.launch_port(path, rng=draws) == free
    assert draws.calls == [(10000, 32767)] * 3  # the listener, DeepSpeed's default, then free


def test_a_port_bound_without_listening_is_never_returned(tmp_path):
    path = range_file(tmp_path, "32768 60999")
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", ports.launch_port(path)))
        taken = bound.getsockname()[1]
        assert not ports.port_is_free(taken)
        free = ports.launch_port(path)
        assert ports.launch_port(path, rng=Draws(taken, free)) == free


def test_port_is_free(listening):
    assert not ports.port_is_free(listening)
    assert ports.port_is_free(ports.launch_port())


def test_after_the_tries_the_kernel_chooses(tmp_path, listening):
    path = range_file(tmp_path, "32768 60999")
    port = ports.launch_port(path, rng=Draws(listening, listening, listening), tries=3)
    assert port != listening and port >= 32768  # the kernel's ephemeral range


def test_the_run_error_is_the_one_the_retry_looks_for():
    line = "error: " + ports.busy_port_message("127.0.0.1", 12345)
    assert line == ("error: MASTER_PORT 12345 on 127.0.0.1 is already in use by another process; "
                    "pick a free port: --master_port PORT for the deepspeed launcher, "
                    "MASTER_PORT=PORT for the example scripts")  # test_error_reporting_e2e's
    assert ports.port_was_taken(1, f"noise\n{line}\nmore noise\n", 12345)
    assert ports.port_was_taken(1, f"[rank 0] {line}\n", 12345)


@pytest.mark.parametrize("status, stderr", [
    (2, "error: " + ports.busy_port_message("127.0.0.1", 12345)),  # another status
    (1, "error: " + ports.busy_port_message("127.0.0.1", 12346)),  # another port's
    (1, "error: --data-path: no such file"),  # another error
    (1, "Traceback ...\nOSError: [Errno 98] Address already in use"),  # not the run's error
    (1, ""),
    (0, "error: " + ports.busy_port_message("127.0.0.1", 12345)),
    (-9, "error: " + ports.busy_port_message("127.0.0.1", 12345)),
])
def test_only_the_busy_port_failure_counts_as_taken(status, stderr):
    assert not ports.port_was_taken(status, stderr, 12345)


def fake_launches(outcomes):
    """A launch function returning ``outcomes`` in turn (each "taken", "other" or "ok"), and the
    ports it was called with."""
    called = []

    def launch(port):
        called.append(port)
        outcome = outcomes[len(called) - 1]
        if outcome == "taken":
            return subprocess.CompletedProcess([], 1, "", "error: " + ports.busy_port_message(
                "127.0.0.1", port) + "\n")
        if outcome == "other":
            return subprocess.CompletedProcess([], 1, "", "error: something else\n")
        return subprocess.CompletedProcess([], 0, "trained\n", "")
    return launch, called


@pytest.fixture
def drawn(monkeypatch):
    """launch_port draws 21001, 21002, ... in turn."""
    counter = iter(range(21001, 21100))
    monkeypatch.setattr(ports, "launch_port", lambda *a, **k: next(counter))


def test_a_launch_that_lost_its_port_is_retried_once_saying_so(drawn, capsys):
    launch, called = fake_launches(["taken", "ok"])
    result = ports.launch_with_port_retry(launch)
    assert result.returncode == 0 and called == [21001, 21002]
    assert capsys.readouterr().err.splitlines() == [
        "[launch] MASTER_PORT 21001 was taken before the launcher bound it; retrying once on "
        "port 21002"]


def test_the_retry_is_once(drawn, capsys):
    launch, called = fake_launches(["taken", "taken", "ok"])
    assert ports.launch_with_port_retry(launch).returncode == 1
    assert called == [21001, 21002]
    assert len(capsys.readouterr().err.splitlines()) == 1


@pytest.mark.parametrize("outcome", ["other", "ok"])
def test_no_other_outcome_is_retried(drawn, capsys, outcome):
    launch, called = fake_launches([outcome, "ok"])
    assert ports.launch_with_port_retry(launch).returncode == (outcome != "ok")
    assert called == [21001] and capsys.readouterr().err == ""


def test_a_port_the_caller_fixed_is_never_retried(drawn, capsys):
    launch, called = fake_launches(["taken", "ok"])
    assert ports.launch_with_port_retry(launch, master_port=12345).returncode == 1
    assert called == [12345] and capsys.readouterr().err == ""


def test_merged_output_is_read_where_there_is_no_stderr(drawn, capsys):
    def launch(port):
        return subprocess.CompletedProcess([], 1 if port == 21001 else 0, (
            "error: " + ports.busy_port_message("127.0.0.1", port)).encode(), None)

    assert ports.launch_with_port_retry(launch).returncode == 0
    assert "retrying once on port 21002" in capsys.readouterr().err


def test_the_command_line(tmp_path, drawn, capsys):
    assert ports.main([]) == 0 and capsys.readouterr().out == "21001\n"
    log = tmp_path / "stderr"
    log.write_text("noise\nerror: " + ports.busy_port_message("127.0.0.1", 12345) + "\n")
    assert ports.main(["--retry", "12345", "1", str(log)]) == 0
    out, err = capsys.readouterr()
    assert out == "21002\n"
    assert err == ("[launch] MASTER_PORT 12345 was taken before the launcher bound it; retrying "
                   "once on port 21002\n")
    for args in (["12345", "2", str(log)], ["12346", "1", str(log)],
                 ["12345", "1", str(tmp_path / "missing")], ["x", "1", str(log)]):
        assert ports.main(["--retry", *args]) == 1
    assert capsys.readouterr() == ("", "")
