"""Two nodes x 2 ranks on one machine (tests/helpers/cluster.py: each node in its own network, UTS
and mount namespaces, launched as users do: ``deepspeed --hostfile H --no_ssh --node_rank K
--master_addr ADDR --master_port P``, ``GLOO_SOCKET_IFNAME`` of its interface).

* The same numbers as one node x 4 ranks, bitwise (DP 4 across the nodes, the layout comparison's
  context-extended model (YaRN past its original length), a curriculum blend, a
  sequence-length warmup: loss, gradient norm, per-dataset losses, consumed samples and tokens,
  every validation group), through a SIGTERM to one node (every rank saves one checkpoint, exit
  0) and a killed node (one line naming the lost host and ranks within 60 s), each resumed
  bitwise. Other layouts across two nodes are compared with one rank where they were compared
  before: TP 2 x PP 2 (tests/e2e/test_pipeline_parallel.py ``tp2_pp2_run``), TP 2 x DP 2 x EP 2
  (tests/e2e/test_moe_e2e.py), T0 under PP 2 x DP 2 x EP 2 (test_pipeline_parallel.py).
* A hung node (SIGSTOP): the others exit within the timeout (``--distributed-timeout-minutes``,
  here 15 s) plus a small slack, naming the timeout and the host.
* A node that never arrives, and a node given a wrong master address: one line each, naming the
  world size expected and the address, within the timeout.
* ``--save`` on node-local disks, and a ``--load`` only one node has: refused at start-up in one
  line naming ranks, hosts and iterations.
* The data cache on node-local disks (in the SIGTERM and kill chain): built once per node,
  byte-identical on both, nothing built again by a relaunch.
"""
import signal
import time

import pytest

from helpers.cluster import cluster_or_skip
from helpers.launch import read_jsonl, run_deepspeed, written_train_records
from helpers.parallel import layout_flags

pytestmark = pytest.mark.launch

ITERS = 20  # the layout comparison's: evaluations at 10 and 20
COMPARED = ("consumed_samples", "consumed_tokens", "seq_length", "lr", "lm_loss", "grad_norm",
            "per_dataset_loss", "samples_drawn")
KILL_EXIT_S = 60  # the bound for the survivors of a killed node
# 15 s: short, yet longer than the start-up skew of two nodes' ranks on a loaded 2-core machine
# (the rendezvous waits for every rank that long too)
HANG_TIMEOUT_MIN = 0.25
HANG_SLACK_S = 20  # the roll call (5 s), the launcher's poll (1 s) and the exit, on a loaded machine


def train_records(path):
    return [r for r in read_jsonl(path) if "split" not in r] if path.exists() else []


def valid_losses(path):
    return [(r["iteration"], r["group"], r["lm_loss"]) for r in read_jsonl(path)
            if r.get("split") == "valid"]


def assert_same_records(got, want):
    assert [r["iteration"] for r in got] == [r["iteration"] for r in want]
    for g, w in zip(got, want, strict=True):
        for key in COMPARED:
            assert g[key] == w[key], (g["iteration"], key, g[key], w[key])


def wait_for_iteration(cluster, metrics, iteration, timeout=300):
    deadline = time.time() + timeout
    while not any(r["iteration"] >= iteration for r in written_train_records(metrics)):
        for k, proc in enumerate(cluster.procs):
            assert proc.poll() is None, f"node{k} exited {proc.returncode}\n{cluster.output()}"
        assert time.time() < deadline, cluster.output()
        time.sleep(0.1)


def flags(demo_data, run_dir, extra=()):
    """The layout comparison's model and curriculum (tests/helpers/parallel.py), DP 4, a shared
    data cache."""
    return layout_flags(demo_data, run_dir, ["--distributed-timeout-minutes", "0.5", *extra],
                        iters=ITERS)


def chain_flags(demo_data, run_dir, metrics: str, extra=(), cache=None):
    """:func:`flags` with the metrics in ``run_dir / metrics`` (and the data cache in ``cache``)."""
    out = flags(demo_data, run_dir, extra)
    out[out.index("--metrics-jsonl") + 1] = str(run_dir / metrics)
    if cache is not None:
        out[out.index("--data-cache-path") + 1] = str(cache)
    return out


def node_cache_files(cluster):
    """Each node's data cache on its own disk: ``[{relative path: (sha256, mtime_ns)}]``."""
    import hashlib

    out = []
    for disk in cluster.node_dirs:
        root = disk / "cache"
        files = {}
        for path in sorted(root.rglob("*")) if root.exists() else []:
            if path.is_file():
                files[str(path.relative_to(root))] = (
                    hashlib.sha256(path.read_bytes()).hexdigest(), path.stat().st_mtime_ns)
        out.append(files)
    return out


@pytest.fixture(scope="module")
def one_node(demo_data, tmp_path_factory):
    """1 node x 4 ranks, uninterrupted: the reference (run directory)."""
    run_dir = tmp_path_factory.mktemp("one_node_dp4")
    run_deepspeed("pretrain_gpt.py", flags(demo_data, run_dir), num_ranks=4)
    assert [r["iteration"] for r in train_records(run_dir / "metrics.jsonl")] == \
        list(range(1, ITERS + 1))
    return run_dir


def test_hung_node_ends_the_run_within_the_timeout(demo_data, tmp_path):
    run_flags = layout_flags(demo_data, tmp_path, ["--distributed-timeout-minutes",
                                                   str(HANG_TIMEOUT_MIN)], iters=1000)
    with cluster_or_skip(tmp_path) as cluster:
        cluster.launch("pretrain_gpt.py", run_flags)
        wait_for_iteration(cluster, tmp_path / "metrics.jsonl", 2)
        cluster.signal_node(1, signal.SIGSTOP)
        stopped = time.time()
        code = cluster.procs[0].wait(timeout=HANG_TIMEOUT_MIN * 60 + HANG_SLACK_S + 60)
        exit_s = time.time() - stopped
        print(f"node0 exited {code} {exit_s:.1f} s after node1 was stopped ({cluster.mode})")
        assert code != 0 and exit_s < HANG_TIMEOUT_MIN * 60 + HANG_SLACK_S, (code, exit_s)
        log = cluster.output(0)
        lines = [line for line in log.splitlines() if "error: lost host node1 (ranks 2-3)" in line]
        assert len(lines) == 1, log[-6000:]
        assert "within the collective timeout of 15 s (--distributed-timeout-minutes 0.25)" in lines[0]
        assert "Traceback" not in log
        assert [p for p in cluster.leftovers() if p.startswith("node0")] == []
    assert cluster.leftovers() == []  # the stopped node too, once the test let it go


def test_node_that_never_arrives_and_a_wrong_master_address(demo_data, tmp_path):
    # 6 s: the rendezvous cannot complete anyway, and node 0's two ranks start together
    run_flags = layout_flags(demo_data, tmp_path, ["--distributed-timeout-minutes", "0.1"])
    with cluster_or_skip(tmp_path) as cluster:
        wrong = "10.255.255.1" if cluster.mode == "netns" else "127.0.0.2"
        started = time.time()
        cluster.launch_node(0, "pretrain_gpt.py", run_flags)
        cluster.launch_node(1, "pretrain_gpt.py", run_flags, master_addr=wrong)
        codes = cluster.wait(timeout=300)
        print(f"both nodes exited {codes} {time.time() - started:.1f} s after launch")
        assert codes[0] != 0 and codes[1] != 0
        node0, node1 = cluster.output(0), cluster.output(1)
        assert [line for line in node0.splitlines() if "of the 4 ranks (WORLD_SIZE 4" in line
                and "within 6 s (--distributed-timeout-minutes 0.1)" in line], node0[-4000:]
        # one line per node: node1's first rank reports, its launcher then stops the other
        assert len([line for line in node1.splitlines() if f"cannot reach the master at {wrong}:"
                    in line and "(--master_addr / MASTER_ADDR, --master_port)" in line]) == 1, \
            node1[-4000:]
        assert "Traceback" not in node0 + node1
        assert cluster.leftovers() == []


def test_node_local_save_and_a_checkpoint_one_node_lacks_are_refused_at_start_up(demo_data, tmp_path):
    """--save on each node's own disk, and a --load whose tracker only node 0 has (DeepSpeed's
    use_node_local_storage case: node 1 would start from scratch): one line naming both, before
    anything is built."""
    with cluster_or_skip(tmp_path) as cluster:
        local = cluster.local / "ckpt"
        (cluster.node_dirs[0] / "ckpt").mkdir()
        (cluster.node_dirs[0] / "ckpt" / "latest_checkpointed_iteration.txt").write_text("3\n")
        codes = cluster.run("pretrain_gpt.py", flags(demo_data, tmp_path, [
            "--save", str(local), "--load", str(local)]), check=False)
        log = cluster.output(0) + cluster.output(1)
        assert codes[0] != 0 and codes[1] != 0
        assert ("2 nodes: node0 (ranks 0-1), node1 (ranks 2-3); collective timeout 30 s "
                "(--distributed-timeout-minutes 0.5)") in cluster.output(0)
        lines = [line for line in log.splitlines() if "error: --save" in line]
        assert len(lines) == 1, log[-6000:]
        assert (f"--save {local}: ranks 2-3 (host node1) do not see the files rank 0 (host node0) "
                "writes there") in lines[0]
        assert (f"--load {local}: the ranks do not resume the same iteration (ranks 0-1 (host "
                "node0) iteration 3; ranks 2-3 (host node1) none (no tracker)") in lines[0]
        assert "Traceback" not in log and "iteration        1/" not in log
        assert cluster.leftovers() == []


def test_two_nodes_equal_one_node_bitwise_through_a_sigterm_and_a_killed_node(
        one_node, demo_data, tmp_path):
    """Three launches of 2 nodes x 2 ranks, DP 4 across the nodes, a curriculum blend and a
    sequence-length warmup, whose records together are the uninterrupted 1 node x 4 ranks run's,
    bitwise (loss, gradient norm, per-dataset losses, consumed samples and tokens, validation
    groups):

    1. SIGTERM to node 1's launcher and ranks (as a scheduler does) with --exit-signal-handler:
       the ranks of both nodes agree, save one checkpoint of the last iteration and exit 0; node 0's
       launcher exits 0 (node 1's: DeepSpeed's launch.py exits 1 after a SIGTERM whatever its ranks
       did, and the runner dies of the signal: a scheduler reads the ranks');
    2. relaunched with --load, saving every 3 iterations: node 1 killed (SIGKILL) mid-run; node 0's
       ranks and launcher exit non-zero within 60 s with one line naming node1 and ranks 2-3, no
       traceback, no orphan, nothing in /dev/shm, the tracker on a complete checkpoint;
    3. relaunched with --load: on to the end.

    The data cache is on each node's own disk (``--data-cache-path`` at one path, a private mount
    per node): each node's first rank builds the indices for its node, the two nodes' files are
    byte-identical, and the relaunches build nothing on either node."""
    ckpt = tmp_path / "ckpt"
    nodes = tmp_path / "nodes"  # the same node-local disks for the three launches
    with cluster_or_skip(nodes) as cluster:
        cache = cluster.local / "cache"
        cluster.launch("pretrain_gpt.py", chain_flags(demo_data, tmp_path, "run1.jsonl", [
            "--save", str(ckpt), "--save-interval", "100", "--exit-signal-handler"], cache))
        wait_for_iteration(cluster, tmp_path / "run1.jsonl", 3)
        cluster.signal_node(1, signal.SIGTERM)  # node1's runner, launch.py and ranks
        codes = cluster.wait(timeout=120)
        log0, log1 = cluster.output(0), cluster.output(1)
        assert codes[0] == 0, log0[-6000:]
        assert "exit signal received" in log0
        assert "Traceback" not in log0 + log1
        assert "exits with return code" not in log1  # node1's ranks exited 0
        assert cluster.leftovers() == []
        assert (f"the cache directory {cache} is not shared by every node (a node-local disk)"
                in log0)
    built = node_cache_files(cluster)
    assert built[0] and {k: v[0] for k, v in built[0].items()} == \
        {k: v[0] for k, v in built[1].items()}  # every node's files, byte for byte
    assert any(name.startswith("index-pack-") for name in built[0])
    run1 = train_records(tmp_path / "run1.jsonl")
    saved = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert saved == run1[-1]["iteration"] >= 3
    print(f"SIGTERM: both nodes saved iteration {saved}")

    with cluster_or_skip(nodes) as cluster:
        cluster.launch("pretrain_gpt.py", chain_flags(demo_data, tmp_path, "run2.jsonl", [
            "--save", str(ckpt), "--save-interval", "3", "--load", str(ckpt)], cache))
        wait_for_iteration(cluster, tmp_path / "run2.jsonl", saved + 4)
        cluster.signal_node(1, signal.SIGKILL)
        killed = time.time()
        code = cluster.procs[0].wait(timeout=KILL_EXIT_S + 30)
        exit_s = time.time() - killed
        print(f"node0 exited {code} {exit_s:.1f} s after node1 was killed ({cluster.mode})")
        assert code != 0 and exit_s < KILL_EXIT_S, (code, exit_s)
        log = cluster.output(0)
        lines = [line for line in log.splitlines() if "error: lost host node1 (ranks 2-3)" in line]
        assert len(lines) == 1, log[-6000:]
        assert "connections closed" in lines[0]
        assert "Traceback" not in log, log[-6000:]
        time.sleep(1)  # node0's launcher has exited; its ranks are gone with it
        assert [p for p in cluster.leftovers() if p.startswith("node0") or "/dev/shm" in p] == []
    run2 = train_records(tmp_path / "run2.jsonl")
    tracker = int((ckpt / "latest_checkpointed_iteration.txt").read_text())
    assert tracker % 3 == 0 and saved < tracker <= run2[-1]["iteration"] < ITERS
    assert any(p.name.endswith("model_states.pt") for p in (ckpt / f"iter_{tracker:07d}").iterdir())

    with cluster_or_skip(nodes) as cluster:
        cluster.run("pretrain_gpt.py", chain_flags(demo_data, tmp_path, "run3.jsonl", [
            "--load", str(ckpt)], cache))
    assert f"resumed from --load {ckpt} at iteration {tracker}," in cluster.output(0)
    assert node_cache_files(cluster) == built  # the relaunches built (and rewrote) nothing
    run3 = train_records(tmp_path / "run3.jsonl")
    want = train_records(one_node / "metrics.jsonl")
    assert_same_records(run1, want[:saved])
    assert_same_records(run2, want[saved:len(run2) + saved])
    assert_same_records(run3, want[tracker:])
    chain_valid = {(it, group): loss for name in ("run1", "run2", "run3")
                   for it, group, loss in valid_losses(tmp_path / f"{name}.jsonl")}
    want_valid = {(it, group): loss for it, group, loss in valid_losses(one_node / "metrics.jsonl")}
    assert (ITERS, "web") in chain_valid and chain_valid.items() <= want_valid.items()
