"""Datasets opened on first use and kept open in a bounded pool: a blend of thousands of prefixes
holds files open for the few it is reading, not for all of them.

Each open GPT dataset holds about :data:`FILES_PER_SOURCE` file descriptors and memory maps (its
``.idx`` and ``.bin``; its three index arrays are views of a pack segment every dataset of the
blend shares, megatron/data/index_pack.py, where megatron-core maps three files per dataset).
Opening every one at
start-up, as megatron-core's builders do, stops a blend of about 200 prefixes under the common
default ``ulimit -n 1024`` ("Too many open files", Megatron-LM #929/#930). Here a
:class:`LazySource` opens its dataset when a sample is first read and a :class:`SourcePool` (one
per blend and process, DataLoader workers each with their own) closes the least recently read
one beyond its capacity, which the process's descriptor limit sets (:func:`pool_capacity`).
"""
import resource
from collections import OrderedDict
from typing import Any, Callable, Optional

import torch

from megatron.errors import ConfigError

__all__ = ["FILES_PER_SOURCE", "RESERVED_FILES", "POOLS_PER_PROCESS", "pool_capacity",
           "check_file_limit", "SourcePool", "LazySource"]

FILES_PER_SOURCE = 3     # .idx, .bin, and one for the open in progress (indices: shared maps)
RESERVED_FILES = 192     # what a training process holds besides its datasets (torch, gloo, logs)
POOLS_PER_PROCESS = 4    # a training blend and up to three evaluation blends reading at once
MAX_OPEN = 4096          # the most a pool keeps open, whatever the limit (memory maps: 2 each)
MIN_OPEN = 4             # the fewest that still serve a batch without reopening in a loop


def _soft_file_limit() -> int:
    """The process's soft limit on open files (``ulimit -n``)."""
    return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])


def pool_capacity(num_datasets: int, soft_limit: Optional[int] = None) -> int:
    """How many of a blend's ``num_datasets`` datasets one pool keeps open under the soft file
    limit ``soft_limit`` (default: this process's ``ulimit -n``): its share of what the limit
    leaves beyond :data:`RESERVED_FILES`, at most :data:`MAX_OPEN`, at least :data:`MIN_OPEN`
    (and never more than the blend has)."""
    limit = _soft_file_limit() if soft_limit is None else int(soft_limit)
    share = (limit - RESERVED_FILES) // (FILES_PER_SOURCE * POOLS_PER_PROCESS)
    return max(1, min(int(num_datasets), MAX_OPEN, max(share, MIN_OPEN)))


def check_file_limit(num_datasets: int, what: str, soft_limit: Optional[int] = None) -> None:
    """Raise a :class:`ConfigError` naming ``ulimit -n`` and the number needed when the soft
    file limit cannot hold even :data:`MIN_OPEN` open datasets of ``what`` (a blend of
    ``num_datasets``) beside what a training process holds."""
    limit = _soft_file_limit() if soft_limit is None else int(soft_limit)
    need = RESERVED_FILES + FILES_PER_SOURCE * POOLS_PER_PROCESS * min(int(num_datasets), MIN_OPEN)
    if limit < need:
        raise ConfigError(
            f"{what}: the open-file limit (ulimit -n) is {limit}, too low to read its "
            f"{num_datasets} datasets: a training process needs at least {need} (about "
            f"{RESERVED_FILES} of its own and {FILES_PER_SOURCE} per open dataset); raise it, "
            f"e.g. 'ulimit -n {max(need, 1024)}' in the launch script")


class SourcePool:
    """The open datasets of one blend in one process, least recently read first; at most
    ``capacity`` stay open (the one read longest ago is closed to open another)."""

    def __init__(self, capacity: int):
        self.capacity = max(1, int(capacity))
        self._open: "OrderedDict[Any, Any]" = OrderedDict()
        self.opened = 0  # datasets opened so far (a reopen counts again)

    def get(self, key, opener: Callable[[], Any]):
        """The open dataset of ``key``, opened with ``opener()`` if it is not open."""
        dataset = self._open.get(key)
        if dataset is not None:
            self._open.move_to_end(key)
            return dataset
        while len(self._open) >= self.capacity:
            self._open.popitem(last=False)  # its memory maps close with it
        dataset = opener()
        self.opened += 1
        self._open[key] = dataset
        return dataset

    def close_all(self) -> None:
        """Close every open dataset of the pool."""
        self._open.clear()

    def __len__(self) -> int:
        return len(self._open)

    def __getstate__(self):  # a DataLoader worker started by pickling opens its own
        return {"capacity": self.capacity, "_open": OrderedDict(), "opened": 0}


class LazySource(torch.utils.data.Dataset):
    """A dataset of ``length`` samples opened by ``opener()`` when a sample is first read, and
    kept open in ``pool`` under ``key``; what it delegates (``epoch_and_position``,
    ``sample_documents``, any attribute) opens it too."""

    def __init__(self, key, length: int, opener: Callable[[], Any], pool: SourcePool):
        self.key = key
        self.length = int(length)
        self.opener = opener
        self.pool = pool

    def open(self):
        """The opened dataset (from the pool, or opened now)."""
        return self.pool.get(self.key, self.opener)

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, k):
        return self.open()[k]

    def __getattr__(self, name):
        if name in ("key", "length", "opener", "pool") or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.open(), name)
