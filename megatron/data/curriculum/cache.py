"""The curriculum index's on-disk cache: one directory per index (``curriculum-<key>`` under the
cache dir) holding ``dataset_index.npy``, ``dataset_sample_index.npy``, ``description.json`` (what
the key hashes, megatron/data/cache_key.py) and ``meta.json`` (written last: a complete
directory), published atomically. A build writes straight into the arrays' files, so an index of
a billion samples never sits whole in the process's memory."""
import json
import mmap
import os
import shutil
import tempfile
from typing import List, Optional, Sequence

import numpy as np

__all__ = ["cache_directory", "try_load_index", "new_index_files", "publish_index",
           "release_written"]


def cache_directory(cache_dir: str, key: str) -> str:
    """The cache directory of the index with cache key ``key`` under ``cache_dir``."""
    return os.path.join(cache_dir, f"curriculum-{key}")


def try_load_index(path: str, num_samples: int, length: int, id_dtype, sample_dtype):
    """The cached index in the directory ``path``: ``(dataset_index, dataset_sample_index,
    counts)``, the arrays memory-mapped and ``counts`` the samples it draws from each dataset as
    its ``meta.json`` records them (None for an entry written before they were); or None when the
    entry is missing, incomplete or not of this shape (``num_samples`` of the run, ``length``
    samples, the given dtypes)."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        ids = np.load(os.path.join(path, "dataset_index.npy"), mmap_mode="r")
        samples = np.load(os.path.join(path, "dataset_sample_index.npy"), mmap_mode="r")
        if (meta.get("num_samples") != num_samples or ids.shape != (length,)
                or samples.shape != (length,) or ids.dtype != id_dtype
                or samples.dtype != sample_dtype):
            return None
        counts = meta.get("counts")
        counts = np.asarray(counts, dtype=np.int64) if isinstance(counts, list) else None
        return ids, samples, counts
    except (OSError, ValueError, json.JSONDecodeError, KeyError):
        return None


def new_index_files(path: str, length: int, id_dtype, sample_dtype):
    """A fresh directory beside ``path`` (to be published there by :func:`publish_index`) holding
    the two index arrays of ``length`` samples as writable memory maps: a build writes straight
    into the cache, and :func:`release_written` keeps the process's resident memory bounded.
    Returns ``(directory, dataset_index, dataset_sample_index)``."""
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(path) + ".tmp-", dir=parent)
    try:
        ids = np.lib.format.open_memmap(os.path.join(tmp, "dataset_index.npy"), mode="w+",
                                        dtype=id_dtype, shape=(length,))
        samples = np.lib.format.open_memmap(os.path.join(tmp, "dataset_sample_index.npy"),
                                            mode="w+", dtype=sample_dtype, shape=(length,))
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp, ids, samples


def release_written(arrays, lo: int, hi: int) -> None:
    """Drop the whole pages of samples ``[lo, hi)`` of each memory-mapped array in ``arrays``
    from this process's resident memory: the mapping is shared, so what was written stays in the
    page cache and reaches the file (:func:`publish_index` flushes); plain in-memory arrays are
    left as they are."""
    page = mmap.PAGESIZE
    for a in arrays:
        mm = getattr(a, "_mmap", None)
        if mm is None or hi <= lo:
            continue
        skew = a.offset % mmap.ALLOCATIONGRANULARITY  # where the array's data starts in ``mm``
        first = (skew + lo * a.itemsize) // page * page
        last = (skew + hi * a.itemsize) // page * page
        if last > first:  # a shared mapping: dirty pages go to the page cache, not lost
            mm.madvise(mmap.MADV_DONTNEED, first, last - first)


def publish_index(tmp: str, path: str, arrays, description: str, num_samples: int,
                  names: List[str], counts: Optional[Sequence[int]] = None) -> None:
    """Flush the arrays :func:`new_index_files` made in ``tmp``, write the description and
    ``meta.json`` (last: a complete directory; with ``counts``, the samples the index draws from
    each dataset, so a load needs no pass over it) and rename ``tmp`` to ``path`` (one another
    rank published first is kept; ``tmp`` is removed on failure)."""
    try:
        for a in arrays:
            a.flush()
        with open(os.path.join(tmp, "description.json"), "w") as f:
            f.write(description)
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            meta = {"num_samples": num_samples, "names": names}
            if counts is not None:
                meta["counts"] = [int(c) for c in counts]
            json.dump(meta, f)
        _replace_broken(path)
        try:
            os.rename(tmp, path)
        except OSError:  # another rank published it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _replace_broken(path: str) -> None:
    """Move a broken or partial index directory at ``path`` out of the way."""
    if os.path.exists(path):
        parent = os.path.dirname(path)
        aside = tempfile.mkdtemp(prefix=os.path.basename(path) + ".old-", dir=parent)
        try:
            os.replace(path, os.path.join(aside, "x"))
        except OSError:
            pass
        shutil.rmtree(aside, ignore_errors=True)
