"""Rank 0 builds the data indices while the other ranks wait on a file in the cache, not at a
collective (megatron/data/rank0_first.py ``rank0_builds_first``): two gloo ranks whose process
group times out after 2 s, rank 0 building for 4 s (a barrier, as before, times out there). The
file wait passes; a build that fails on rank 0 is raised on rank 1 with its text."""
import datetime
import json
import multiprocessing
import os
import time

import pytest

pytestmark = pytest.mark.launch  # two processes

BUILD_S = 4.0  # twice the process group's timeout


def _rank(rank: int, store: str, cache, mode: str, out: str) -> None:
    import torch.distributed as dist

    from megatron.data.rank0_first import rank0_builds_first

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=2))
    result = {"rank": rank}
    try:
        with rank0_builds_first(cache, "train", report_s=2.0) as me:
            if me == 0:
                time.sleep(BUILD_S)
                if mode == "fail":
                    raise ValueError("the blend is broken")
                with open(os.path.join(cache or out, "built"), "w") as f:
                    f.write("x")
            else:
                result["saw_build"] = os.path.exists(os.path.join(cache or out, "built"))
        result["ok"] = True
    except Exception as exc:  # noqa: BLE001 - reported to the test
        result["error"] = f"{type(exc).__name__}: {exc}"
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    if result.get("ok"):
        dist.destroy_process_group()


def _run(tmp_path, mode: str, with_cache: bool):
    cache = str(tmp_path / "cache") if with_cache else None
    context = multiprocessing.get_context("spawn")
    ranks = [context.Process(target=_rank, args=(r, str(tmp_path / "store"), cache, mode,
                                                 str(tmp_path)))
             for r in range(2)]
    for process in ranks:
        process.start()
    for process in ranks:
        process.join(timeout=120)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_a_build_longer_than_the_collective_timeout_fails_no_rank(tmp_path):
    ranks = _run(tmp_path, "ok", with_cache=True)
    assert ranks[0].get("ok") and ranks[1].get("ok"), ranks
    assert ranks[1]["saw_build"]  # rank 1 ran its body after rank 0's
    assert os.listdir(tmp_path / "cache") == ["built"]  # the marker is gone


def test_a_failed_build_on_rank_0_is_raised_on_the_others(tmp_path):
    ranks = _run(tmp_path, "fail", with_cache=True)
    assert ranks[0]["error"] == "ValueError: the blend is broken"
    assert ranks[1]["error"] == ("RuntimeError: train: rank 0 failed to build the data indices: "
                                 "ValueError: the blend is broken")
