"""The rendezvous port of a launch (``--master_port`` / ``MASTER_PORT``), and the one retry when
another process takes it first.

Why not the kernel's choice (bind port 0): that port comes from the ephemeral range
(``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), the range every outgoing TCP
connection and every other port-0 listener draws from, gloo's pair connections of the other
launches on the machine included. Between the probe that found it free and rank 0 binding it
seconds later (the launcher's start-up), any of them can take it, and the launch fails with
``MASTER_PORT P ... is already in use by another process``. :func:`launch_port` draws at random
from below that range instead, 10000 up to the range's low bound: the kernel never hands out a port
there by itself, so only a process binding that very port on purpose can take it. Below 10000 are
the privileged ports (< 1024) and the ports services are commonly run on (databases, web servers,
Jupyter, TensorBoard); 29400-29599 are left out too (torchrun's rendezvous 29400, DeepSpeed's and
torch.distributed's default master port 29500, and the ports jobs count up from them).

Should a launch still lose the race, :func:`launch_with_port_retry` launches once more on another
port, saying so in one line; only that failure is retried (:func:`port_was_taken`). The shell side
(``tools/cpu_env.sh``: ``master_port``, ``launch_with_port_retry``) calls this module's command line:

    python -m megatron.runtime.ports                          # print a port for the next launch
    python -m megatron.runtime.ports --retry PORT STATUS FILE # exit 0 printing a new port (and
                                                              # the retry line on stderr) when the
                                                              # launch on PORT failed because PORT
                                                              # was taken; else exit 1
"""
import argparse
import errno
import random
import socket
import sys
from typing import Callable, Optional, Tuple, TypeVar

from megatron.errors import EXIT_CONFIG_ERROR

EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
DEFAULT_EPHEMERAL_RANGE = (32768, 60999)  # Linux's default, when the file cannot be read
LOWEST_LAUNCH_PORT = 10000
AVOIDED_PORTS = range(29400, 29600)
MIN_SPAN = 1000  # fewer candidate ports than this: look elsewhere (see launch_port_range)
TRIES = 100
PORT_TAKEN = "is already in use by another process"  # in megatron's one-line busy-port error
# The busy-port error is a ConfigError: the run exits with its status (megatron/errors.py)
PORT_TAKEN_STATUS = EXIT_CONFIG_ERROR
# The draws: independent of the process's `random` seed (tests and runs seed it; two workers
# seeded alike would otherwise draw the same ports in the same order)
_RANDOM = random.SystemRandom()

R = TypeVar("R")


def ephemeral_range(range_file: str = EPHEMERAL_RANGE_FILE) -> Tuple[int, int]:
    """The kernel's ephemeral port range ``(low, high)`` read from ``range_file`` (two numbers);
    Linux's default ``(32768, 60999)`` when the file cannot be read or does not hold a range of
    ports (1 <= low <= high <= 65535)."""
    try:
        with open(range_file) as f:
            low, high = (int(field) for field in f.read().split())
    except (OSError, ValueError):
        return DEFAULT_EPHEMERAL_RANGE
    if not 1 <= low <= high <= 65535:
        return DEFAULT_EPHEMERAL_RANGE
    return low, high


def launch_port_range(range_file: str = EPHEMERAL_RANGE_FILE) -> Optional[Tuple[int, int]]:
    """The ports ``(first, last)`` :func:`launch_port` draws from: ``LOWEST_LAUNCH_PORT`` (10000)
    up to just below the ephemeral range of ``range_file``; where that leaves fewer than
    ``MIN_SPAN`` ports (a widened ephemeral range), the ports above the range, then those from
    1024 up to it; None when none of them has ``MIN_SPAN`` ports (then the kernel chooses)."""
    low, high = ephemeral_range(range_file)
    for first, last in ((LOWEST_LAUNCH_PORT, low - 1), (high + 1, 65535), (1024, low - 1)):
        if last - first + 1 >= MIN_SPAN:
            return first, last
    return None


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``port`` is free for a launcher to listen on now: a socket binds it on ``host``,
    on every IPv4 address and (where the machine has IPv6) on every address of both families, as
    torch's TCPStore binds it, and nothing answers a connection to ``host:port``."""
    binds = [(socket.AF_INET, host), (socket.AF_INET, "0.0.0.0")]
    if socket.has_ipv6:
        binds.append((socket.AF_INET6, "::"))
    for family, address in binds:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((address, port))
        except OSError as e:
            if family == socket.AF_INET6 and e.errno != errno.EADDRINUSE:
                continue  # no IPv6 on this machine: the IPv4 binds decide
            return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        return s.connect_ex((host, port)) != 0


def kernel_port(host: str = "127.0.0.1") -> int:
    """A port the kernel gives a socket bound to port 0 on ``host`` (from the ephemeral range: the
    old choice, and the fallback of :func:`launch_port`)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def launch_port(range_file: str = EPHEMERAL_RANGE_FILE, rng=None, tries: int = TRIES) -> int:
    """A port for the next launch's rendezvous: drawn at random (``rng``, default the system's
    random source) from :func:`launch_port_range` of ``range_file``, never one of
    ``AVOIDED_PORTS``, and free now (:func:`port_is_free`); after ``tries`` draws that were not,
    or without such a range, the kernel's choice (:func:`kernel_port`)."""
    rng = rng or _RANDOM
    span = launch_port_range(range_file)
    if span is not None:
        for _ in range(tries):
            port = rng.randint(*span)
            if port not in AVOIDED_PORTS and port_is_free(port):
                return port
    return kernel_port()


def busy_port_message(addr: str, port) -> str:
    """Megatron's one-line error for a rendezvous port another process holds (the run raises it as
    a ConfigError in megatron/parallel/initialize.py; :func:`port_was_taken` looks for it)."""
    return (f"MASTER_PORT {port} on {addr} {PORT_TAKEN}; pick a free port: --master_port PORT "
            f"for the deepspeed launcher, MASTER_PORT=PORT for the example scripts")


def port_was_taken(returncode: int, stderr: str, port: int) -> bool:
    """Whether a launch on ``port`` failed because another process held that port when rank 0
    bound it: it exited with ``PORT_TAKEN_STATUS`` (1) and its ``stderr`` holds the one-line
    :func:`busy_port_message` for ``port``, which the run prints before any training. Any other
    failure (another error, another status, the same error for another port) is not."""
    if returncode != PORT_TAKEN_STATUS:
        return False
    start = f"error: MASTER_PORT {port} on "
    return any(start in line and PORT_TAKEN in line for line in stderr.splitlines())


def retry_note(taken: int, port: int) -> str:
    """The one line a retried launch prints."""
    return (f"[launch] MASTER_PORT {taken} was taken before the launcher bound it; retrying once "
            f"on port {port}")


def _output(result) -> str:
    """The stderr of a finished launch (its stdout where stderr went there)."""
    text = result.stderr if result.stderr is not None else result.stdout
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text or ""


def launch_with_port_retry(launch: Callable[[int], R], master_port: Optional[int] = None,
                           pick: Optional[Callable[[], int]] = None) -> R:
    """``launch(port)``, a finished launch with ``returncode`` and ``stderr`` (a
    ``subprocess.CompletedProcess``; its ``stdout`` is read where ``stderr`` is None), on
    ``master_port``, or when that is None on a port of ``pick()`` (default :func:`launch_port`).
    When a launch on a port chosen here failed because the port was taken (:func:`port_was_taken`),
    :func:`retry_note` goes to stderr and ``launch`` runs once more on another port; its result is
    returned. A port the caller fixed is never retried (its error stands), nor is any other
    failure."""
    pick = pick or launch_port
    port = master_port or pick()
    result = launch(port)
    if master_port is None and port_was_taken(result.returncode, _output(result), port):
        retry = pick()
        print(retry_note(port, retry), file=sys.stderr, flush=True)
        result = launch(retry)
    return result


def main(argv=None) -> int:
    """The command line of the shell scripts (see the module's docstring)."""
    parser = argparse.ArgumentParser(prog="python -m megatron.runtime.ports",
                                     description="A port for the next launch (stdout).")
    parser.add_argument("--retry", nargs=3, metavar=("PORT", "STATUS", "STDERR_FILE"),
                        help="only when the launch on PORT exited STATUS because PORT was taken "
                             "(STDERR_FILE: its stderr): print the retry line on stderr and a new "
                             "port; else exit 1")
    opts = parser.parse_args(argv)
    if opts.retry:
        port, status, path = opts.retry
        try:
            with open(path, errors="replace") as f:
                stderr = f.read()
            taken = port_was_taken(int(status), stderr, int(port))
        except (OSError, ValueError):
            taken = False
        if not taken:
            return 1
        retry = launch_port()
        print(retry_note(int(port), retry), file=sys.stderr, flush=True)
        print(retry)
        return 0
    print(launch_port())
    return 0


if __name__ == "__main__":
    sys.exit(main())
