"""Rank 0 builds the data indices while the other ranks wait on a file in the cache, not at a
collective (megatron/data/rank0_first.py ``rank0_builds_first``): two gloo ranks whose process
group times out after 2 s, rank 0 building for 4 s (a barrier, as before, times out there). The
file wait passes; a build that fails on rank 0 is raised on rank 1 with its text. With the two
ranks on two hosts, a shared cache directory is still built by rank 0 alone, and a directory
each host has for itself (rank 1's is another directory: it never sees rank 0's files) is built
by both, each for its node."""
import datetime
import json
import multiprocessing
import os
import time

import pytest

pytestmark = pytest.mark.launch  # two processes

BUILD_S = 4.0  # twice the process group's timeout


def _round(rank: int, cache: str, mode: str, host=None) -> dict:
    """One build under ``rank0_builds_first``: a builder takes ``BUILD_S`` and fails for
    ``fail``; ``host``: the rank's node (default: this machine's name, one host)."""
    from megatron.data.rank0_first import rank0_builds_first

    result = {"rank": rank}
    try:
        with rank0_builds_first(cache, "train", report_s=2.0, host=host) as builds:
            result["built"] = builds
            if builds:
                time.sleep(BUILD_S)
                if mode == "fail":
                    raise ValueError("the blend is broken")
                with open(os.path.join(cache, "built"), "w") as f:
                    f.write("x")
            else:
                result["saw_build"] = os.path.exists(os.path.join(cache, "built"))
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(exc).__name__}: {exc}"
    return result


def _rank(rank: int, store: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=2))
    results = {mode: _round(rank, os.path.join(out, f"cache-{mode}"), mode)
               for mode in ("ok", "fail")}
    node = f"node{rank}"  # two hosts: a shared directory, then one of each node's own
    results["shared"] = _round(rank, os.path.join(out, "cache-shared"), "ok", node)
    results["local"] = _round(rank, os.path.join(out, f"cache-local-{node}"), "ok", node)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(results, f)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """Both rounds on two spawned gloo ranks: {mode: [rank 0's result, rank 1's]}."""
    out = tmp_path_factory.mktemp("rank0_first")
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_rank, args=(r, str(out / "store"), str(out)))
                 for r in range(2)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return {mode: [r[mode] for r in results] for mode in ("ok", "fail", "shared", "local")}, out


def test_a_build_longer_than_the_collective_timeout_fails_no_rank(ranks):
    results, out = ranks
    assert results["ok"][0].get("ok") and results["ok"][1].get("ok"), results["ok"]
    assert results["ok"][1]["saw_build"]  # rank 1 ran its body after rank 0's
    assert os.listdir(out / "cache-ok") == ["built"]  # the marker is gone


def test_a_failed_build_on_rank_0_is_raised_on_the_others(ranks):
    results, _ = ranks
    assert results["fail"][0]["error"] == "ValueError: the blend is broken"
    assert results["fail"][1]["error"] == ("RuntimeError: train: rank 0 failed to build the data "
                                           "indices: ValueError: the blend is broken")


def test_a_shared_directory_is_built_once_and_a_node_local_one_once_per_node(ranks):
    results, out = ranks
    shared, local = results["shared"], results["local"]
    assert all(r.get("ok") for r in shared + local), (shared, local)
    assert [r["built"] for r in shared] == [True, False] and shared[1]["saw_build"]
    assert [r["built"] for r in local] == [True, True]  # each node's first rank built its own
    assert os.listdir(out / "cache-shared") == ["built"]  # no marker or probe left
    assert os.listdir(out / "cache-local-node0") == os.listdir(out / "cache-local-node1") == ["built"]
