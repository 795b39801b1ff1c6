"""Failures of a multi-node run in one line: --distributed-timeout-minutes, the lost host named by a
roll call on the rendezvous store (megatron/runtime/lost_peers.py), and the rendezvous' errors
(megatron/parallel/initialize.py), checkpoints across nodes (megatron/checkpoint/multinode.py).
The two-node launches: tests/e2e/test_two_nodes_e2e.py."""
from datetime import timedelta

import pytest
import torch.distributed as dist

from helpers.flags import parse as parse_tiny
from helpers.flags import tiny_run_flags
from helpers.ports import free_port
from megatron.errors import ArgumentError
from megatron.parallel.initialize import rendezvous_problem
from megatron.runtime import lost_peers


def test_timeout_flag_defaults_to_megatron_lms_ten_minutes_and_takes_fractions():
    args = parse_tiny([], 1, base=tiny_run_flags())
    assert args.run_config.distributed.distributed_timeout_minutes == 10.0
    args = parse_tiny(["--distributed-timeout-minutes", "0.1"], 1, base=tiny_run_flags())
    assert args.run_config.distributed.distributed_timeout_minutes == 0.1


def test_timeout_flag_must_be_positive():
    with pytest.raises(ArgumentError, match=r"--distributed-timeout-minutes 0.0 must be positive"):
        parse_tiny(["--distributed-timeout-minutes", "0"], 1, base=tiny_run_flags())


def test_ranges_and_timeouts_read_as_a_person_writes_them():
    assert lost_peers.rank_ranges([3, 2, 0, 5, 6, 7]) == "0, 2-3, 5-7"
    assert lost_peers.describe_timeout(0.1) == "6 s (--distributed-timeout-minutes 0.1)"
    assert lost_peers.describe_timeout(10) == "10 min (--distributed-timeout-minutes 10)"


class _Store:
    """A rendezvous store where ``answering`` ranks have written their roll-call key."""

    def __init__(self, answering, dead=False):
        self.keys = {lost_peers._ROLL_CALL_KEY.format(r) for r in answering}
        self.dead = dead

    def set_timeout(self, timeout):
        pass

    def set(self, key, value):
        if self.dead:
            raise dist.DistNetworkError("Connection reset by peer")
        self.keys.add(key)

    def check(self, keys):
        return all(k in self.keys for k in keys)


@pytest.fixture
def four_ranks_on_two_hosts(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "12345")
    monkeypatch.setattr(lost_peers, "ROLL_CALL_S", 0.3)
    monkeypatch.setattr(lost_peers, "_world", {})
    lost_peers.record_world(["node0", "node0", "node1", "node1"], 0.1)

    def with_store(store):
        monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    return with_store


def test_a_killed_node_is_named_with_its_ranks(four_ranks_on_two_hosts):
    four_ranks_on_two_hosts(_Store(answering=[1]))
    error = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [10.0.0.2]:4321")
    assert lost_peers.is_lost_peer_failure(error)
    message = lost_peers.failure_message(error)
    assert message.startswith("lost host node1 (ranks 2-3): its connections closed"), message


def test_a_hung_node_is_named_with_the_timeout(four_ranks_on_two_hosts):
    four_ranks_on_two_hosts(_Store(answering=[1]))
    message = lost_peers.failure_message(RuntimeError(
        "[gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting 6000ms for recv operation"))
    assert message.startswith("lost host node1 (ranks 2-3): no answer within the collective "
                              "timeout of 6 s (--distributed-timeout-minutes 0.1)"), message


def test_the_masters_node_is_named_when_the_store_is_gone(four_ranks_on_two_hosts):
    four_ranks_on_two_hosts(_Store(answering=[], dead=True))
    message = lost_peers.failure_message(RuntimeError("[gloo] Connection closed by peer"))
    assert message.startswith("lost host node0 (ranks 0-1), which holds rank 0 and the rendezvous "
                              "store at 10.0.0.1:12345"), message


def test_one_crashed_rank_is_named_without_its_host(four_ranks_on_two_hosts):
    four_ranks_on_two_hosts(_Store(answering=[1, 2]))
    message = lost_peers.failure_message(RuntimeError("Connection closed by peer"))
    assert message.startswith("ranks 3 (host node1) stopped answering"), message


def test_other_errors_keep_their_traceback(four_ranks_on_two_hosts):
    assert not lost_peers.is_lost_peer_failure(RuntimeError("shape mismatch"))
    assert not lost_peers.is_lost_peer_failure(ValueError("Connection closed by peer"))
    assert not lost_peers.is_lost_peer_failure(RuntimeError("DataLoader timed out"))
    assert lost_peers.is_lost_peer_failure(dist.DistBackendError("Connection reset by peer"))


def test_roll_call_on_a_real_store_finds_who_did_not_answer(monkeypatch):
    store = dist.TCPStore("127.0.0.1", free_port(), 1, True, timeout=timedelta(seconds=5))
    store.set(lost_peers._ROLL_CALL_KEY.format(2), "1")
    monkeypatch.setattr(dist.distributed_c10d, "_get_default_store", lambda: store)
    monkeypatch.setattr(lost_peers, "ROLL_CALL_S", 0.5)
    assert lost_peers._roll_call(0, 4) == ([1, 3], False)


def test_rendezvous_errors_in_one_line(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "12345")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    master = rendezvous_problem("Timed out after 7 seconds waiting for clients. 2/4 clients joined.", 0.1)
    assert master.startswith("only 2 of the 4 ranks (WORLD_SIZE 4") and "10.0.0.1:12345" in master
    waiting = rendezvous_problem("wait timeout after 6000ms, keys: /default_pg/0//cpu//0/0", 0.1)
    assert waiting.startswith("not all of the 4 ranks (WORLD_SIZE 4")
    unreachable = rendezvous_problem("TCP client failed to connect/validate to host 10.0.0.1:12345"
                                     " - timed out (try=1, timeout=6000ms)", 0.1)
    assert unreachable.startswith("rank 2 cannot reach the master at 10.0.0.1:12345 (--master_addr")
    assert "within 6 s (--distributed-timeout-minutes 0.1)" in unreachable
    assert rendezvous_problem("something else", 0.1) is None


def test_checkpoint_iterations_that_differ_between_ranks_are_named():
    from megatron.checkpoint.multinode import iteration_disagreement

    load = "/node-local/ckpt"
    views = [("node0", 6), ("node0", 6), ("node1", None), ("node1", None)]
    assert iteration_disagreement(load, views).startswith(
        "--load /node-local/ckpt: the ranks do not resume the same iteration (ranks 0-1 (host "
        "node0) iteration 6; ranks 2-3 (host node1) none (no tracker)")
    assert iteration_disagreement(load, [("node0", 6), ("node1", 6)]) is None
    assert iteration_disagreement(load, [("node0", None), ("node1", None)]) is None


def test_a_save_directory_some_node_cannot_see_is_named():
    from megatron.checkpoint.multinode import unshared_save_error

    error = unshared_save_error("/local/ckpt", [("node0", True), ("node0", True),
                                                ("node1", False), ("node1", False)])
    assert error.startswith("--save /local/ckpt: ranks 2-3 (host node1) do not see the files rank 0 "
                            "(host node0) writes there")
    assert "a filesystem all nodes share" in error
    assert unshared_save_error("/shared", [("node0", True), ("node1", True)]) is None
    assert unshared_save_error("/unwritable", [("node0", False), ("node1", False)]) is None


def test_the_start_up_line_of_a_run_on_several_nodes():
    from megatron.parallel.initialize import nodes_line

    assert nodes_line(["a", "a", "b", "b"], 10) == (
        "2 nodes: a (ranks 0-1), b (ranks 2-3); collective timeout 10 min "
        "(--distributed-timeout-minutes 10)")
