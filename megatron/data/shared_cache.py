"""Multi-node runs: the dataset index caches must be on a filesystem every rank sees.

megatron-core's ``GPTDataset`` (every pretraining dataset here: static blends, curriculum
constituents, weighted splits) builds its document/sample/shuffle indices on global rank 0 and
saves them in the cache directory; every other rank waits, then loads them from there
(``gpt_dataset.py``: only ``torch.distributed.get_rank() == 0`` builds). A rank on another node
whose cache directory is a different disk finds no files and fails. So the cache directory must
be shared by all nodes: ``--data-cache-path`` on a shared filesystem, or data on one (the default
cache is megatron-core's ``PREFIX/cache/GPTDataset_indices`` beside each data prefix).

:func:`require_shared_cache_dirs` checks this at start-up, before any index is built, when the
ranks span more than one host: rank 0 writes a marker file into each cache directory, every rank
looks for it, and a directory some rank cannot see stops the run with one error naming
``--data-cache-path``, the directory and the hosts that do not see it. (T0 packing indices,
megatron/data/mtf_dataset.py, are built or loaded by each rank on its own and need no sharing.)
"""
import os
import socket
import time
import uuid
from typing import Callable, Iterable, List, Optional, Sequence, Tuple

from megatron.data.data_config import DataConfig
from megatron.errors import ConfigError

MARKER_PREFIX = ".shared-cache-check-"
VISIBILITY_WAIT_S = 3.0  # network filesystems may show a new file a moment late
# megatron-core's GPTDataset default when no cache path is given
DEFAULT_CACHE_SUBDIR = os.path.join("cache", "GPTDataset_indices")


def dataset_prefixes(config: DataConfig) -> List[str]:
    """Every ``.bin``/``.idx`` prefix the pretraining data flags name (static blends, the blend
    file, weighted split groups), in order, without repeats."""
    from megatron.core.datasets.utils import get_blend_from_list

    prefixes: List[str] = []
    for flag in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        paths = getattr(config, flag)
        if paths:
            prefixes += get_blend_from_list(paths)[0]
    blend = config.data_blend
    if blend is not None:
        for split in ([blend.train] if blend.train is not None else []) + list(blend.valid) + list(blend.test):
            prefixes += [entry.path for stage in split.stages for entry in stage.entries]
    for groups in (config.weighted_split_groups or {}).values():
        prefixes += [item.prefix for group in groups for item in group.items]
    return list(dict.fromkeys(prefixes))


def index_cache_dirs(config: DataConfig) -> List[str]:
    """The directories megatron-core caches this run's dataset indices in: ``--data-cache-path``,
    or its default beside each data prefix."""
    if config.data_cache_path:
        return [os.path.abspath(config.data_cache_path)]
    return list(dict.fromkeys(os.path.abspath(os.path.join(prefix, DEFAULT_CACHE_SUBDIR))
                              for prefix in dataset_prefixes(config)))


def _rank_ranges(ranks: Sequence[int]) -> str:
    """``0-7, 9`` for [0, 1, ..., 7, 9]."""
    out, start = [], None
    ranks = sorted(ranks)
    for i, r in enumerate(ranks):
        if start is None:
            start = r
        if i + 1 == len(ranks) or ranks[i + 1] != r + 1:
            out.append(str(start) if start == r else f"{start}-{r}")
            start = None
    return ", ".join(out)


def unshared_cache_error(directories: Sequence[str], views: Sequence[Tuple[str, Sequence[bool]]],
                         flag_given: bool) -> Optional[str]:
    """The error for the first of ``directories`` that rank 0 could write its marker into (its
    own view says it sees it) but some rank does not see, or None. ``views[r]`` is rank r's
    (host name, [marker seen in each directory]); ``flag_given``: ``--data-cache-path`` was given
    (else the directories are megatron-core's defaults beside the data)."""
    for k, directory in enumerate(directories):
        if not views[0][1][k]:  # rank 0 could not write there: megatron-core reports that itself
            continue
        blind = [r for r, (_, seen) in enumerate(views) if not seen[k]]
        if not blind:
            continue
        hosts = ", ".join(dict.fromkeys(views[r][0] for r in blind))
        where = (f"--data-cache-path {directory}" if flag_given else
                 f"the dataset index cache {directory} (megatron-core's default beside the data, "
                 "as no --data-cache-path is given)")
        return (f"{where}: ranks {_rank_ranges(blind)} (host {hosts}) do not see the files rank 0 "
                f"(host {views[0][0]}) writes there. Rank 0 builds the dataset indices and every "
                "other rank reads them from the cache directory, so it must be on a filesystem "
                "all nodes share: give --data-cache-path a shared directory")
    return None


def _seen(path: str, wait_s: float, exists: Callable[[str], bool]) -> bool:
    deadline = time.monotonic() + wait_s
    while not exists(path):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


def require_shared_cache_dirs(directories: Iterable[str], flag_given: bool,
                              single_host_skip: bool = True,
                              exists: Callable[[str], bool] = os.path.exists) -> None:
    """Collective over the world: raise ConfigError (:func:`unshared_cache_error`) when some rank
    does not see a file rank 0 writes into one of ``directories``. Nothing to check in a 1-rank
    run or, with ``single_host_skip``, when every rank is on one host. The markers are removed."""
    import torch

    directories = list(directories)
    if not directories or not torch.distributed.is_initialized() \
            or torch.distributed.get_world_size() == 1 and single_host_skip:
        return
    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    hosts: List[Optional[str]] = [None] * world
    torch.distributed.all_gather_object(hosts, socket.gethostname())
    if single_host_skip and len(set(hosts)) == 1:
        return
    token = [uuid.uuid4().hex if rank == 0 else None]
    torch.distributed.broadcast_object_list(token, src=0)
    markers = [os.path.join(d, MARKER_PREFIX + token[0]) for d in directories]
    if rank == 0:
        for marker in markers:
            try:
                os.makedirs(os.path.dirname(marker), exist_ok=True)
                with open(marker, "w"):
                    pass
            except OSError:
                continue  # unwritable: rank 0's own view says so; megatron-core reports it
    torch.distributed.barrier()
    seen = [_seen(m, VISIBILITY_WAIT_S if rank else 0.0, exists) for m in markers]
    views: List[Optional[Tuple[str, List[bool]]]] = [None] * world
    torch.distributed.all_gather_object(views, (hosts[rank], seen))
    if rank == 0:
        for marker in markers:
            try:
                os.remove(marker)
            except OSError:
                pass
    error = unshared_cache_error(directories, views, flag_given)
    if error:
        raise ConfigError(error)

