"""The curriculum index's on-disk cache: one directory per index (``curriculum-<key>`` under the
cache dir) holding ``dataset_index.npy``, ``dataset_sample_index.npy``, ``description.json`` (what
the key hashes, megatron/data/cache_key.py) and ``meta.json`` (written last: a complete
directory), published atomically."""
import json
import os
import shutil
import tempfile
from typing import List

import numpy as np

__all__ = ["cache_directory", "try_load_index", "save_index"]


def cache_directory(cache_dir: str, key: str) -> str:
    """The cache directory of the index with cache key ``key`` under ``cache_dir``."""
    return os.path.join(cache_dir, f"curriculum-{key}")


def try_load_index(path: str, num_samples: int, length: int, id_dtype, sample_dtype):
    """The cached index arrays ``(dataset_index, dataset_sample_index)`` (memory-mapped) in the
    directory ``path``, or None when it is missing, incomplete or not of this shape
    (``num_samples`` of the run, ``length`` samples, the given dtypes)."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            meta = json.load(f)
        ids = np.load(os.path.join(path, "dataset_index.npy"), mmap_mode="r")
        samples = np.load(os.path.join(path, "dataset_sample_index.npy"), mmap_mode="r")
        if (meta.get("num_samples") != num_samples or ids.shape != (length,)
                or samples.shape != (length,) or ids.dtype != id_dtype
                or samples.dtype != sample_dtype):
            return None
        return ids, samples
    except (OSError, ValueError, json.JSONDecodeError, KeyError):
        return None


def save_index(path: str, ids: np.ndarray, samples: np.ndarray, description: str,
               num_samples: int, names: List[str]) -> None:
    """Write the index arrays to the directory ``path`` (built aside, then renamed into place; a
    broken one there is replaced, one another rank published first is kept)."""
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(path) + ".tmp-", dir=parent)
    try:
        np.save(os.path.join(tmp, "dataset_index.npy"), ids)
        np.save(os.path.join(tmp, "dataset_sample_index.npy"), samples)
        with open(os.path.join(tmp, "description.json"), "w") as f:
            f.write(description)
        # meta.json last: its presence marks a complete directory
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump({"num_samples": num_samples, "names": names}, f)
        if os.path.exists(path):  # a broken/partial one: move it aside first
            aside = tempfile.mkdtemp(prefix=os.path.basename(path) + ".old-", dir=parent)
            try:
                os.replace(path, os.path.join(aside, "x"))
            except OSError:
                pass
            shutil.rmtree(aside, ignore_errors=True)
        try:
            os.rename(tmp, path)
        except OSError:  # another rank published it first
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
