"""megatron/data/rank0_first.py in a DataLoader worker (a sampling mixer's worker building the phase
its rank built, megatron/train/mixer_loader.py): it builds nothing and joins no collective, which
in a forked copy of its rank's process group would hang or corrupt the rank's own (a DP 2 mixer
run with loader workers hung at its first update before). The ranks' own order: the e2e
tests/e2e/test_rank0_wait_e2e.py."""
from types import SimpleNamespace

import pytest
import torch

from megatron.data.rank0_first import rank0_builds_first


@pytest.fixture
def two_ranks(monkeypatch):
    """torch.distributed as rank 1 of 2 would see it, every collective refused."""
    def collective(*args, **kwargs):
        raise AssertionError("a collective in a loader worker")

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda *a, **k: 2)
    monkeypatch.setattr(torch.distributed, "get_rank", lambda *a, **k: 1)
    for name in ("barrier", "broadcast_object_list", "all_gather_object", "all_reduce"):
        monkeypatch.setattr(torch.distributed, name, collective)


@pytest.mark.parametrize("cache_dir", [None, "cache"])
def test_a_loader_worker_reads_what_its_rank_built_and_joins_no_collective(two_ranks, monkeypatch,
                                                                           tmp_path, cache_dir):
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: SimpleNamespace(id=0))
    with rank0_builds_first(cache_dir and str(tmp_path / cache_dir), "a blend") as builds:
        assert builds is False
    assert not (tmp_path / "cache").exists()  # nothing written, no marker waited for


def test_a_rank_still_orders_its_build_by_a_collective(two_ranks):
    with pytest.raises(AssertionError, match="a collective in a loader worker"):
        with rank0_builds_first(None, "a blend"):
            pass
