"""The constituent datasets of a curriculum: :class:`Constituent` (a prefix and a document range,
its samples per epoch and files' fingerprint) and :func:`resolve_constituents`, the distinct
datasets of a split blend."""
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from megatron.data.blend_config import BlendConfigError, SplitBlend, check_dataset_prefix
from megatron.data.mix_ledger import gpt_files_fingerprint, ledger_key

__all__ = ["Constituent", "resolve_constituents"]


@dataclass(frozen=True)
class Constituent:
    """One dataset of the curriculum: a prefix and a document range [doc_begin, doc_end).
    ``samples_per_epoch`` is None for datasets whose epochs differ in length (packed T0 data);
    ``fingerprint`` tells its files apart from others at the same path (the data ledger,
    megatron/data/mix_ledger.py)."""

    path: str
    split: Tuple[float, float]
    name: str
    doc_begin: int
    doc_end: int
    num_documents: int
    tokens: int
    samples_per_epoch: Optional[int]
    fingerprint: str = ""

    @property
    def ledger_key(self) -> Tuple[str, float, float, str]:
        """Its identity in the data ledger (megatron/data/mix_ledger.py ``ledger_key``)."""
        return ledger_key(self.path, self.split, self.fingerprint)


def _samples_per_epoch(tokens: int, seq_length: int, add_extra_token: bool = True) -> int:
    return max(0, (int(tokens) - int(add_extra_token)) // int(seq_length))


def resolve_constituents(blend: SplitBlend, seq_length: int, add_extra_token: bool = True,
                         low_level: Optional[Dict[str, Any]] = None) -> List[Constituent]:
    """The distinct (path, split range) datasets of ``blend`` in order of first appearance, with
    their document range (megatron-core's rounding) and samples per epoch."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    low_level = {} if low_level is None else low_level
    out: Dict[Tuple[str, float, float], Constituent] = {}
    names = set()
    for stage in blend.stages:
        for entry in stage.entries:
            if entry.key in out:
                continue
            check_dataset_prefix(entry.path, entry.where + ".path")
            if entry.path not in low_level:
                low_level[entry.path] = IndexedDataset(entry.path, multimodal=False, mmap=True)
            lengths = low_level[entry.path].sequence_lengths
            n = int(lengths.shape[0])
            beg = int(round(entry.split[0] * float(n)))
            end = int(round(entry.split[1] * float(n)))
            if end <= beg:
                raise BlendConfigError(f"{entry.where}.split: range {entry.split[0]:g}:"
                                       f"{entry.split[1]:g} of {entry.path!r} ({n} documents) "
                                       "selects no document: a stage with nothing to draw")
            tokens = int(np.sum(lengths[beg:end], dtype=np.int64))
            spe = _samples_per_epoch(tokens, seq_length, add_extra_token)
            if spe <= 0:
                raise BlendConfigError(f"{entry.where}: {entry.path!r} (documents {beg}:{end}) has "
                                       f"{tokens} tokens, less than one sample of seq_length "
                                       f"{seq_length}: nothing to draw")
            name = entry.name if entry.name not in names else entry.qualified_name
            base, k = name, 2
            while name in names:
                name, k = f"{base}#{k}", k + 1
            names.add(name)
            out[entry.key] = Constituent(entry.path, entry.split, name, beg, end, n, tokens, spe,
                                         gpt_files_fingerprint(entry.path))
    return list(out.values())
