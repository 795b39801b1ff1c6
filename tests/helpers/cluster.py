"""A two-node cluster on one machine, launched the way users launch one.

Each node is a process tree in its own namespaces:

* **network** (``mode == "netns"``, needs root and ``ip``): a network namespace per node joined by
  a veth pair, node K at ``10.X.Y.(K+1)`` on interface ``mtnZ_K``; the master address is node 0's;
* **UTS + mount**: its own hostname (``node0``, ``node1``) and a private bind mount of its own
  directory (``node_dirs[K]``) at one path, :attr:`TwoNodeCluster.local` (its node-local disk,
  readable from the test through ``node_dirs[K]``).

Where network namespaces cannot be made (or ``TEST_CLUSTER_MODE=loopback`` asks for it), the nodes
fall back to UTS + mount namespaces on the loopback interface (``mode == "loopback"``, master
address 127.0.0.1); where not even those can be made, :func:`cluster_or_skip` skips the test with
one line saying why.

Each node runs ``deepspeed --hostfile H --no_ssh --node_rank K --master_addr ADDR --master_port P
SCRIPT FLAGS`` with ``GLOO_SOCKET_IFNAME`` set to its interface (``NCCL_SOCKET_IFNAME`` is the
GPU equivalent), in a session of its own (so a test can signal a whole node). :meth:`close` kills
whatever is left of both nodes, unmounts (the mounts die with their namespaces), deletes the
network namespaces and removes the launch's DeepSpeed buffers from /dev/shm; the tests use the
cluster as a context manager.
"""
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import psutil
import pytest

from helpers.launch import deepspeed_launcher, own_shm_buffers
from helpers.paths import ROOT
from megatron.runtime.ports import launch_port

RANKS_PER_NODE = 2
NODES = 2


def _run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)


def _can_unshare() -> Optional[str]:
    """None when UTS + mount namespaces can be made, else why not."""
    if shutil.which("unshare") is None:
        return "no unshare(1)"
    probe = _run(["unshare", "--uts", "--mount", "--propagation", "private", "true"])
    if probe.returncode != 0:
        return f"unshare --uts --mount failed: {probe.stderr.strip()[:200]}"
    return None


def _netns_problem() -> Optional[str]:
    """None when network namespaces and veth pairs can be made here, else why not."""
    if os.geteuid() != 0:
        return "not root"
    if shutil.which("ip") is None:
        return "no ip(8)"
    return None


class TwoNodeCluster:
    """Two nodes x :data:`RANKS_PER_NODE` ranks (module docstring). ``run_dir``: where the hostfile,
    the node-local directories (``node_dirs``) and the nodes' logs go."""

    def __init__(self, run_dir: Path, mode: str):
        self.run_dir = Path(run_dir)
        self.mode = mode
        self.tag = f"mtn{os.getpid() % 100000}{int(time.time() * 1000) % 1000}"
        self.local = self.run_dir / "local"  # each node's private mount point
        self.local.mkdir(parents=True, exist_ok=True)
        self.node_dirs = [self.run_dir / f"node{k}_disk" for k in range(NODES)]
        for d in self.node_dirs:
            d.mkdir(parents=True, exist_ok=True)
        self.hostnames = [f"node{k}" for k in range(NODES)]
        self.hostfile = self.run_dir / "hostfile"
        self.hostfile.write_text("".join(f"{h} slots={RANKS_PER_NODE}\n" for h in self.hostnames))
        self.namespaces: List[str] = []
        self.procs: List[Optional[subprocess.Popen]] = [None] * NODES
        self.logs: List[Path] = [self.run_dir / f"node{k}.log" for k in range(NODES)]
        self.port: Optional[int] = None
        self.started: List[float] = [0.0] * NODES
        if mode == "netns":
            self._make_network()
            self.addresses = [f"{self._subnet}.{k + 1}" for k in range(NODES)]
            self.interfaces = [f"{self.tag}_{k}"[-15:] for k in range(NODES)]
        else:
            self.addresses = ["127.0.0.1"] * NODES
            self.interfaces = ["lo"] * NODES

    @property
    def master_addr(self) -> str:
        return self.addresses[0]

    def _make_network(self) -> None:
        pid = os.getpid()
        self._subnet = f"10.{200 + pid % 50}.{(pid // 50) % 250}"
        names = [f"{self.tag}n{k}" for k in range(NODES)]
        ifaces = [f"{self.tag}_{k}"[-15:] for k in range(NODES)]
        try:
            for name in names:
                self._ip("netns", "add", name)
                self.namespaces.append(name)
            self._ip("link", "add", ifaces[0], "netns", names[0], "type", "veth",
                     "peer", "name", ifaces[1], "netns", names[1])
            hosts = "127.0.0.1 localhost\n" + "".join(
                f"{self._subnet}.{k + 1} node{k}\n" for k in range(NODES))
            for name in names:  # `ip netns exec` bind-mounts /etc/netns/NAME/hosts on /etc/hosts
                os.makedirs(f"/etc/netns/{name}", exist_ok=True)
                with open(f"/etc/netns/{name}/hosts", "w") as f:
                    f.write(hosts)
            for k, (name, iface) in enumerate(zip(names, ifaces, strict=True)):
                self._ip("-n", name, "addr", "add", f"{self._subnet}.{k + 1}/24", "dev", iface)
                self._ip("-n", name, "link", "set", iface, "up")
                self._ip("-n", name, "link", "set", "lo", "up")
        except Exception:
            self.close()
            raise

    @staticmethod
    def _ip(*args: str) -> None:
        done = _run(["ip", *args])
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")

    def node_command(self, k: int, argv: Sequence[str]) -> List[str]:
        """``argv`` run on node ``k``: in its namespaces, with its hostname and its private mount
        of ``node_dirs[k]`` at :attr:`local`."""
        setup = (f'hostname {self.hostnames[k]} && mount --bind "{self.node_dirs[k]}" '
                 f'"{self.local}" && exec "$@"')
        inner = ["unshare", "--uts", "--mount", "--propagation", "private",
                 "sh", "-c", setup, "node"] + list(argv)
        if self.mode == "netns":
            return ["ip", "netns", "exec", self.namespaces[k]] + inner
        return inner

    def launch_node(self, k: int, script: str, flags: Sequence[str], port: Optional[int] = None,
                    master_addr: Optional[str] = None, env: Optional[Dict[str, str]] = None
                    ) -> subprocess.Popen:
        """Start node ``k``'s launcher (not waiting): ``deepspeed --hostfile --no_ssh --node_rank k
        --master_addr ADDR --master_port P SCRIPT FLAGS``, its output in ``logs[k]``."""
        if port is None:
            port = self.port or launch_port()
        self.port = port
        run_env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
                       TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                       GLOO_SOCKET_IFNAME=self.interfaces[k])
        run_env.update(env or {})
        argv = [deepspeed_launcher(), "--hostfile", str(self.hostfile), "--no_ssh",
                "--node_rank", str(k), "--master_addr", master_addr or self.master_addr,
                "--master_port", str(port), os.path.join(ROOT, script)] + list(flags)
        log = open(self.logs[k], "w")
        self.procs[k] = subprocess.Popen(self.node_command(k, argv), cwd=ROOT, env=run_env,
                                         stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        log.close()
        self.started[k] = time.time()
        return self.procs[k]

    def launch(self, script: str, flags: Sequence[str], port: Optional[int] = None,
               env: Optional[Dict[str, str]] = None) -> None:
        """Start both nodes."""
        for k in range(NODES):
            self.launch_node(k, script, flags, port=port, env=env)

    def wait(self, timeout: float = 600) -> List[int]:
        """Wait for every started node's launcher; their exit statuses (node order)."""
        deadline = time.time() + timeout
        codes = []
        for proc in self.procs:
            if proc is None:
                continue
            codes.append(proc.wait(timeout=max(1.0, deadline - time.time())))
        return codes

    def run(self, script: str, flags: Sequence[str], timeout: float = 600, check: bool = True
            ) -> List[int]:
        """Launch both nodes and wait; with ``check``, raise with both logs unless both exit 0."""
        self.launch(script, flags)
        codes = self.wait(timeout)
        if check and codes != [0] * NODES:
            raise AssertionError(f"nodes exited {codes}\n{self.output()}")
        return codes

    def output(self, k: Optional[int] = None) -> str:
        """Node ``k``'s log (both, labelled, when None)."""
        if k is not None:
            return self.logs[k].read_text() if self.logs[k].exists() else ""
        return "\n".join(f"--- node{i} ---\n{self.output(i)[-6000:]}" for i in range(NODES))

    def node_processes(self, k: int) -> List[psutil.Process]:
        """Every live process of node ``k`` (its session)."""
        proc = self.procs[k]
        if proc is None:
            return []
        try:
            root = psutil.Process(proc.pid)
            return [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def rank_processes(self, k: int) -> List[psutil.Process]:
        """Node ``k``'s training ranks (the processes the launcher gave ``--local_rank=``)."""
        found = []
        for p in self.node_processes(k):
            try:
                if any(a.startswith("--local_rank=") for a in p.cmdline()):
                    found.append(p)
            except psutil.NoSuchProcess:
                continue
        return found

    def signal_node(self, k: int, sig: int) -> None:
        """``sig`` to every process of node ``k`` (its launcher, ``launch.py`` and the ranks), as a
        node failure or a scheduler does."""
        try:
            os.killpg(self.procs[k].pid, sig)
        except ProcessLookupError:
            pass

    def close(self) -> None:
        """Kill what is left of both nodes, delete the network namespaces (their veth pair goes
        with them; the private mounts die with the nodes' mount namespaces) and remove this
        launch's DeepSpeed buffers from /dev/shm."""
        for k, proc in enumerate(self.procs):
            if proc is None:
                continue
            for p in self.node_processes(k):
                try:
                    p.resume()  # a stopped process cannot die of SIGKILL until it is reaped
                except psutil.Error:
                    pass
            self.signal_node(k, signal.SIGKILL)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        for name in self.namespaces:
            _run(["ip", "netns", "del", name])
            shutil.rmtree(f"/etc/netns/{name}", ignore_errors=True)
        self.namespaces = []
        if self.port is not None:
            for path in own_shm_buffers(self.port):
                os.remove(path)

    def leftovers(self) -> List[str]:
        """What the last launch left: live processes of either node, DeepSpeed buffers in
        /dev/shm."""
        left = [f"node{k} pid {p.pid} {p.name()}" for k in range(NODES)
                for p in self.node_processes(k) if p.status() != psutil.STATUS_ZOMBIE]
        if self.port is not None:
            left += own_shm_buffers(self.port)
        return left

    def __enter__(self) -> "TwoNodeCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cluster_or_skip(run_dir: Path) -> TwoNodeCluster:
    """A :class:`TwoNodeCluster` in ``run_dir``: on network namespaces where they can be made, on
    loopback with UTS + mount namespaces otherwise; skips the test (one line, why) where neither."""
    why_not_uts = _can_unshare()
    if why_not_uts is not None:
        pytest.skip(f"two-node cluster: cannot make UTS + mount namespaces here ({why_not_uts})")
    why_not_net = _netns_problem()
    if os.environ.get("TEST_CLUSTER_MODE") == "loopback":  # to run the fallback where both work
        why_not_net = "TEST_CLUSTER_MODE=loopback"
    if why_not_net is None:
        try:
            return TwoNodeCluster(run_dir, "netns")
        except RuntimeError as e:
            why_not_net = str(e)
    cluster = TwoNodeCluster(run_dir, "loopback")
    cluster.why_not_netns = why_not_net
    return cluster


def cluster_or_none(run_dir: Path) -> Optional[TwoNodeCluster]:
    """:func:`cluster_or_skip` that returns None (printing why) instead of skipping."""
    try:
        return cluster_or_skip(run_dir)
    except pytest.skip.Exception as e:
        print(f"{e}: one node x 4 ranks instead")
        return None


def run_on_two_nodes(script: str, flags: Sequence[str], run_dir: Path, timeout: float = 900
                     ) -> subprocess.CompletedProcess:
    """``script`` on two nodes x 2 ranks (raising with both logs unless both exit 0); where no
    cluster can be made here, on one node x 4 ranks (:func:`helpers.launch.run_deepspeed`), so a
    test that compares numbers still runs. The CompletedProcess' stdout is both nodes' logs."""
    from helpers.launch import run_deepspeed

    cluster = cluster_or_none(Path(run_dir) / "cluster")
    if cluster is None:
        return run_deepspeed(script, list(flags), num_ranks=NODES * RANKS_PER_NODE)
    with cluster:
        cluster.run(script, flags, timeout=timeout)
        leftovers = cluster.leftovers()
    assert leftovers == [], leftovers
    return subprocess.CompletedProcess(cluster.procs[0].args, 0,
                                       stdout=cluster.output(0) + cluster.output(1), stderr="")
