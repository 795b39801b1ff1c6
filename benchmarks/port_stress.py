"""Launch ports under connection churn: the old picker (bind port 0: a port of the kernel's
ephemeral range) against megatron/runtime/ports.py's ``launch_port`` (drawn at random below that
range), by hand, never in the tests.

A launch picks its port, starts (the launcher's start-up: seconds), and only then does its rank 0
bind the port; in between, another process can take it. The load stands in for the other jobs of a
busy machine, the parallel test launches whose gloo groups start and end: a separate process that
opens ``--rate`` listeners per second on port 0 (as gloo's pair listeners are), connects to each
(an outgoing connection: another ephemeral port) and holds both ``--hold`` seconds, then resets
them (no TIME_WAIT left behind). ``--rounds`` rounds each start one launch per picker side by side
(two at a time, under the same load). A launch:

* ``--launch bind`` (default, cheap): pick, wait ``--delay`` seconds (the launcher's start-up),
  then bind the port as torch's TCPStore does (SO_REUSEADDR, every address) and listen;
* ``--launch deepspeed``: the real ``deepspeed --num_gpus 2 --master_port P`` launcher (CPU, gloo)
  on this file in ``--rank`` mode, which only starts torch.distributed (the run's one-line error,
  exit status 1, if its port is taken) and exits.

A launch that lost its port is retried once on another port of the same picker
(``launch_with_port_retry``); both counts are printed.

    .venv/bin/python benchmarks/port_stress.py [--rounds 50 --rate 500 --hold 3 --delay 2]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/port_stress.py --launch deepspeed --rounds 10
"""
import argparse
import collections
import errno
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from megatron.runtime.ports import (  # noqa: E402
    PORT_TAKEN_STATUS,
    busy_port_message,
    ephemeral_range,
    kernel_port,
    launch_port,
    launch_with_port_retry,
)

PICKERS = {"old: bind port 0": kernel_port, "new: launch_port": launch_port}


def churn(rate: float, hold: float) -> None:
    """The load (runs until killed): ``rate`` port-0 listeners a second, each with one connection
    to it, held ``hold`` seconds, then reset."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    linger = struct.pack("ii", 1, 0)  # close with a reset: no TIME_WAIT
    held = collections.deque()
    start, opened = time.monotonic(), 0
    while True:
        now = time.monotonic()
        while held and held[0][0] <= now:
            for s in held.popleft()[1:]:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, linger)
                s.close()
        due = int((now - start) * rate) - opened
        for _ in range(max(0, min(due, 100))):
            listener = socket.socket()
            listener.bind(("127.0.0.1", 0))
            listener.listen(8)
            client = socket.create_connection(listener.getsockname())
            served, _ = listener.accept()
            held.append((now + hold, client, served, listener))
            opened += 1
        time.sleep(0.002)


def bind_like_tcpstore(port: int) -> bool:
    """Whether a listener binds ``port`` as torch's TCPStore does (SO_REUSEADDR, every address:
    IPv6 dual-stack where there is IPv6, else IPv4)."""
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((host, port))
                s.listen()
                return True
            except OSError as e:
                if family == socket.AF_INET6 and e.errno != errno.EADDRINUSE:  # no IPv6: try IPv4
                    continue
                return False
    return False


def bind_launch(delay: float):
    def launch(port: int) -> subprocess.CompletedProcess:
        time.sleep(delay)
        if bind_like_tcpstore(port):
            return subprocess.CompletedProcess([], 0, "", "")
        return subprocess.CompletedProcess([], PORT_TAKEN_STATUS, "", "error: " + busy_port_message(
            "127.0.0.1", port))
    return launch


def deepspeed_launch(timeout: float):
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")

    def launch(port: int) -> subprocess.CompletedProcess:
        return subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(port),
                               "--no_local_rank", os.path.abspath(__file__), "--rank"], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    return launch


def rank() -> int:
    """``--rank``: what a launched rank does first (torch.distributed over gloo), then exit."""
    import torch.distributed as dist

    try:
        dist.init_process_group("gloo")
    except dist.DistNetworkError as e:
        if "EADDRINUSE" not in str(e):
            raise
        print("error: " + busy_port_message(os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"]),
              file=sys.stderr, flush=True)
        return PORT_TAKEN_STATUS
    dist.barrier()
    dist.destroy_process_group()
    return 0


def one_launch(launch, pick, counts, name, lock) -> None:
    ports = []

    def recorded(port):
        ports.append(port)
        return launch(port)

    result = launch_with_port_retry(recorded, pick=pick)
    with lock:
        counts[name]["lost"] += len(ports) > 1
        counts[name]["failed"] += result.returncode != 0
        counts[name]["ports"] += ports


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=50, help="launches per picker")
    parser.add_argument("--rate", type=float, default=500, help="load: listeners opened a second")
    parser.add_argument("--hold", type=float, default=3.0, help="load: seconds each is held")
    parser.add_argument("--delay", type=float, default=2.0,
                        help="--launch bind: seconds from the pick to the bind")
    parser.add_argument("--launch", choices=["bind", "deepspeed"], default="bind")
    parser.add_argument("--timeout", type=float, default=120, help="--launch deepspeed: per launch")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.rank:
        return rank()
    launch = bind_launch(opts.delay) if opts.launch == "bind" else deepspeed_launch(opts.timeout)
    low, high = ephemeral_range()
    load = subprocess.Popen([sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                             "import port_stress; port_stress.churn(float(sys.argv[2]), "
                             "float(sys.argv[3]))", os.path.dirname(os.path.abspath(__file__)),
                             str(opts.rate), str(opts.hold)])
    counts = {name: {"lost": 0, "failed": 0, "ports": []} for name in PICKERS}
    lock = threading.Lock()
    start = time.monotonic()
    try:
        time.sleep(opts.hold + 1)  # the load at its steady state
        with ThreadPoolExecutor(len(PICKERS)) as pool:
            for _ in range(opts.rounds):  # one launch per picker side by side, the next round after
                list(pool.map(lambda item: one_launch(launch, item[1], counts, item[0], lock),
                              PICKERS.items()))
                if load.poll() is not None:
                    raise SystemExit(f"the load stopped (exit {load.returncode})")
    finally:
        load.kill()
        load.wait()
    what = (f"{opts.delay:g} s from pick to a TCPStore-like bind" if opts.launch == "bind" else
            "the real deepspeed launcher, 2 gloo ranks")
    print(f"ephemeral range {low}-{high}; load: {opts.rate:g} port-0 listeners/s, each with a "
          f"connection, held {opts.hold:g} s (~{int(opts.rate * opts.hold)} listeners and as many "
          f"connections at a time); {opts.rounds} launches per picker, two at a time ({what}); "
          f"{time.monotonic() - start:.0f} s")
    print(f"{'picker':20s} {'lost the port':>14s} {'failed after one retry':>23s}  ports drawn")
    for name, c in counts.items():
        print(f"{name:20s} {c['lost']:>10d}/{opts.rounds:<3d} {c['failed']:>19d}/{opts.rounds:<3d}"
              f"  {min(c['ports'])}-{max(c['ports'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
