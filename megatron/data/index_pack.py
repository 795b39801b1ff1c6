"""Every dataset's cached indices in a few pack files per cache directory, not three or four
files per dataset: megatron-core's ``GPTDataset`` indices and the T0 pack indices
(megatron/data/mtf_dataset.py).

megatron-core caches each ``GPTDataset``'s document, sample and shuffle indices as three ``.npy``
files and a description beside them: a blend of 4,096 prefixes leaves about 16,000 files, and a
process reading it holds three memory maps per open dataset. Here a build (rank 0's, before the
other ranks read: megatron/data/rank0_first.py) appends the indices of every dataset it builds to
one *segment* per cache directory: ``index-pack-<key>.bin`` (the arrays, back to back, 64-byte
aligned) and ``index-pack-<key>.json`` (its catalog: where each dataset's arrays lie), written
last, so a segment whose catalog exists is complete. A later build (another split, an edited mix)
adds a segment holding only what the earlier ones lack. A process maps each segment once and
serves every dataset's arrays as views of it.

The GPT arrays are megatron-core's own: :class:`PackedGPTDataset` is a ``GPTDataset`` whose
``_build_document_sample_shuffle_indices`` looks its indices up in the pack and, on a miss, has
megatron-core build them in memory (``path_to_cache=""``: built, not saved) and adds them to the
segment being written. An entry is keyed as megatron-core keys its cache files: the dataset's
``unique_description_hash`` (its path label, split, samples and config); a T0 dataset's by its
pack index's cache key.
"""
import copy
import glob
import hashlib
import json
import logging
import os
from contextlib import contextmanager
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np
from megatron.core.datasets.gpt_dataset import GPTDataset

__all__ = ["SEGMENT_PREFIX", "IndexPack", "PackedGPTDataset", "pack_directory"]

SEGMENT_PREFIX = "index-pack-"
ARRAYS = ("document_index", "sample_index", "shuffle_index")
_ALIGN = 64
_FORMAT = 1


def pack_directory(config, path_prefix: str) -> Optional[str]:
    """The directory the indices of a dataset at ``path_prefix`` are packed in under the
    ``GPTDatasetConfig`` ``config``: its ``path_to_cache``, else megatron-core's default beside
    the prefix (``<prefix>/cache/GPTDataset_indices``), or None where megatron-core caches nothing
    (a config without a blend, ``mock``: the indices are built in memory by every process)."""
    if config.path_to_cache:
        return config.path_to_cache
    if config.mock:
        return None
    return os.path.join(path_prefix, "cache", "GPTDataset_indices")


class _Segment:
    """One published segment, mapped on first use."""

    def __init__(self, bin_path: str, catalog: Dict[str, dict]):
        self.bin_path = bin_path
        self.catalog = catalog
        self._map: Optional[np.memmap] = None

    def arrays(self, key: str) -> Tuple[np.ndarray, ...]:
        if self._map is None:
            self._map = np.memmap(self.bin_path, dtype=np.uint8, mode="r")
        return tuple(np.ndarray(tuple(shape), dtype=np.dtype(dtype), buffer=self._map,
                                offset=int(offset))
                     for offset, dtype, shape in self.catalog[key]["arrays"])


class _SegmentWriter:
    """A segment being written into one directory: arrays appended to a temporary ``.bin``."""

    def __init__(self, directory: str):
        os.makedirs(directory, exist_ok=True)
        self.directory = directory
        self.tmp = os.path.join(directory, f".{SEGMENT_PREFIX}{os.getpid()}-{id(self):x}.tmp")
        self.file = open(self.tmp, "wb")
        self.catalog: Dict[str, dict] = {}

    def add(self, key: str, label: str, arrays) -> None:
        placed = []
        for a in arrays:
            a = np.ascontiguousarray(a)
            pad = -self.file.tell() % _ALIGN
            if pad:
                self.file.write(b"\0" * pad)
            placed.append([self.file.tell(), a.dtype.str, list(a.shape)])
            a.tofile(self.file)
        self.catalog[key] = {"dataset": label, "arrays": placed}

    def publish(self) -> Optional[_Segment]:
        """Close the ``.bin``, move it into place and write the catalog last (atomically);
        None (and nothing left behind) when nothing was added."""
        self.file.close()
        if not self.catalog:
            os.remove(self.tmp)
            return None
        name = SEGMENT_PREFIX + hashlib.sha256(
            "\n".join(sorted(self.catalog)).encode()).hexdigest()[:16]
        bin_path = os.path.join(self.directory, name + ".bin")
        os.replace(self.tmp, bin_path)
        tmp_json = os.path.join(self.directory, f".{name}.json.tmp-{os.getpid()}")
        with open(tmp_json, "w") as f:
            json.dump({"format": _FORMAT, "bin": name + ".bin", "entries": self.catalog}, f)
        os.replace(tmp_json, os.path.join(self.directory, name + ".json"))
        return _Segment(bin_path, self.catalog)

    def discard(self) -> None:
        self.file.close()
        try:
            os.remove(self.tmp)
        except OSError:
            pass


class IndexPack:
    """The packed indices of the cache directories one blend's datasets read (a GPT dataset's
    directory: :func:`pack_directory`). Read by every process (a DataLoader worker loads the
    catalogs again on first use); written only inside :meth:`writing`, by the rank that builds."""

    def __init__(self):
        self._segments: Dict[str, List[_Segment]] = {}   # directory -> its published segments
        self._scanned: Dict[str, int] = {}                # directory -> its mtime when last read
        self._writers: Optional[Dict[str, _SegmentWriter]] = None

    def __getstate__(self):  # a DataLoader worker maps the segments again itself
        return {"_segments": {}, "_scanned": {}, "_writers": None}

    def _scan(self, directory: str) -> None:
        """Read the catalogs of ``directory``'s segments not read yet (when it changed)."""
        try:
            mtime = os.stat(directory).st_mtime_ns
        except OSError:
            return
        if self._scanned.get(directory) == mtime:
            return
        segments = self._segments.setdefault(directory, [])
        known = {s.bin_path for s in segments}
        for path in sorted(glob.glob(os.path.join(directory, SEGMENT_PREFIX + "*.json"))):
            try:
                with open(path) as f:
                    catalog = json.load(f)
            except (OSError, ValueError):
                continue
            bin_path = os.path.join(directory, catalog.get("bin", ""))
            if catalog.get("format") != _FORMAT or bin_path in known:
                continue
            segments.append(_Segment(bin_path, catalog["entries"]))
            known.add(bin_path)
        self._scanned[directory] = mtime

    def lookup(self, directory: str, key: str) -> Optional[Tuple[np.ndarray, ...]]:
        """The (document, sample, shuffle) index arrays of the dataset keyed ``key`` packed in
        ``directory``, as read-only views of its segment; None when no segment holds it."""
        for attempt in range(2):
            for segment in self._segments.get(directory, ()):
                if key in segment.catalog:
                    return segment.arrays(key)
            if attempt == 0:
                self._scan(directory)
        return None

    def add(self, directory: str, key: str, label: str, arrays) -> bool:
        """Append a dataset's index ``arrays`` (keyed ``key``, ``label``: its path for a reader
        of the catalog) to the segment being written into ``directory``; False (nothing kept)
        outside :meth:`writing`."""
        if self._writers is None:
            return False
        writer = self._writers.get(directory)
        if writer is None:
            writer = self._writers[directory] = _SegmentWriter(directory)
        writer.add(key, label, arrays)
        return True

    @contextmanager
    def writing(self) -> Iterator["IndexPack"]:
        """Within it, indices built on a miss are added to one new segment per directory,
        published when it ends (on an error, nothing is published and nothing left behind)."""
        self._writers = {}
        try:
            yield self
        except BaseException:
            for writer in self._writers.values():
                writer.discard()
            raise
        finally:
            writers, self._writers = self._writers, None
        for directory, writer in writers.items():
            segment = writer.publish()
            if segment is not None:
                self._segments.setdefault(directory, []).append(segment)

    def segment_files(self) -> List[str]:
        """The files of every segment this pack has read or written (``.bin`` and ``.json``)."""
        return sorted(p for segments in self._segments.values() for s in segments
                      for p in (s.bin_path, s.bin_path[:-4] + ".json"))


class _DropUnsavedWarning(logging.Filter):
    def filter(self, record):  # megatron-core's "Unable to save ... indexes" for each dataset
        return "Unable to save" not in record.getMessage()


@contextmanager
def _built_in_memory(dataset) -> Iterator[None]:
    """``dataset.config`` with ``path_to_cache=""`` (megatron-core builds the indices and saves
    none) and its warning that it saved none silenced, for the body."""
    logger = logging.getLogger("megatron.core.datasets.gpt_dataset")
    quiet = _DropUnsavedWarning()
    config = dataset.config
    in_memory = copy.copy(config)  # a shallow copy: no __post_init__ (its log lines) again
    in_memory.path_to_cache = ""
    dataset.config = in_memory
    logger.addFilter(quiet)
    try:
        yield
    finally:
        logger.removeFilter(quiet)
        dataset.config = config


class PackedGPTDataset(GPTDataset):
    """megatron-core's ``GPTDataset`` with its three index arrays read from (or, when missing,
    built and added to) a :class:`IndexPack`: the same arrays, samples and ``__getitem__``;
    ``pack`` comes first, then ``GPTDataset``'s arguments."""

    def __init__(self, pack: IndexPack, *args, **kwargs):
        self.pack = pack
        super().__init__(*args, **kwargs)

    def _build_document_sample_shuffle_indices(self):
        directory = pack_directory(self.config, self.dataset.path_prefix)
        if directory is None or self.config.defer_npy_index_mmap:
            return super()._build_document_sample_shuffle_indices()
        key = self.unique_description_hash
        arrays = self.pack.lookup(directory, key)
        if arrays is not None:
            return arrays
        with _built_in_memory(self):
            arrays = super()._build_document_sample_shuffle_indices()
        self.pack.add(directory, key, self.dataset_path, arrays)
        return arrays
