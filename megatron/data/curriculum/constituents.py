"""The constituent datasets of a curriculum: :class:`Constituent` (a prefix and a document range,
its samples per epoch and files' fingerprint) and :func:`resolve_constituents`, the distinct
datasets of a split blend.

An epoch of a dataset is one pass over its documents, except for a dataset of fewer tokens than
one sample (a one-document test split of Megatron-LM's ``--split 949,50,1`` on a small corpus):
there an epoch is the fewest passes whose tokens hold a sample (:func:`passes_per_epoch`), and its
samples run from one pass into the next, as megatron-core's ``GPTDataset`` builds samples over its
document index repeated for as many epochs as the samples need. Under ``--pack-documents
best-fit`` an epoch is always one pass: its samples are the best-fit bins of the documents
(megatron/data/document_packing.py), at least one however few the tokens."""
from dataclasses import dataclass, replace
from typing import Dict, List, Optional, Tuple

import numpy as np

from megatron.data.blend_config import REPLAY_SUFFIX, BlendConfigError, SplitBlend, blend_key, check_dataset_prefix
from megatron.data.document_packing import CONCAT, best_fit_bin_count, bin_capacity
from megatron.data.mix_ledger import gpt_files_fingerprint, ledger_key

REPLAY_FINGERPRINT = " replay"  # a replay's fingerprint: its dataset's and this

__all__ = ["REPLAY_FINGERPRINT", "Constituent", "at_seq_length", "passes_per_epoch", "resolve_constituents", "short_dataset_note"]


@dataclass(frozen=True)
class Constituent:
    """One dataset of the curriculum: a prefix and a document range [doc_begin, doc_end).
    ``samples_per_epoch`` is None for datasets whose epochs differ in length (packed T0 data);
    ``fingerprint`` tells its files apart from others at the same path (the data ledger,
    megatron/data/mix_ledger.py); ``passes`` is the passes over its documents one epoch makes
    (:func:`passes_per_epoch`: 1 unless the range holds fewer tokens than one sample);
    ``packing`` how its samples are made (``--pack-documents``: ``"concat"``, megatron-core's
    windows, or ``"best-fit"`` bins, megatron/data/document_packing.py), which
    ``samples_per_epoch`` counts."""

    path: str
    split: Tuple[float, float]
    name: str
    doc_begin: int
    doc_end: int
    num_documents: int
    tokens: int
    samples_per_epoch: Optional[int]
    fingerprint: str = ""
    passes: int = 1
    packing: str = CONCAT
    replay: bool = False

    @property
    def ledger_key(self) -> Tuple[str, float, float, str]:
        """Its identity in the data ledger (megatron/data/mix_ledger.py ``ledger_key``; a replay's
        fingerprint ends in :data:`REPLAY_FINGERPRINT`)."""
        return ledger_key(self.path, self.split, self.fingerprint)

    @property
    def blend_key(self) -> Tuple:
        """Its identity in a blend (:func:`~megatron.data.blend_config.blend_key`)."""
        return blend_key(self.path, self.split, self.replay)

    def replayed(self) -> "Constituent":
        """The dataset this replay draws again from (itself when it is not a replay)."""
        if not self.replay:
            return self
        return replace(self, name=self.name[:-len(REPLAY_SUFFIX)], replay=False,
                       fingerprint=self.fingerprint[:-len(REPLAY_FINGERPRINT)])


def _samples_per_epoch(tokens: int, seq_length: int, add_extra_token: bool = True) -> int:
    return max(0, (int(tokens) - int(add_extra_token)) // int(seq_length))


def passes_per_epoch(tokens: int, seq_length: int, add_extra_token: bool = True) -> int:
    """The passes over a dataset of ``tokens`` tokens that one of its epochs makes: 1 when the
    dataset holds a sample (``seq_length + add_extra_token`` tokens), else the fewest passes whose
    tokens together hold one (megatron-core's ``GPTDataset._get_num_epochs`` for one sample).
    ``tokens`` must be positive."""
    need = int(seq_length) + int(add_extra_token)
    return max(1, -(-need // int(tokens)))


def at_seq_length(constituent: Constituent, seq_length: int,
                  add_extra_token: bool = True) -> Constituent:
    """``constituent`` with its passes and samples per epoch at ``seq_length`` (a dataset of an
    earlier sequence length, megatron/data/length_change.py). Windows only: a best-fit dataset
    never changes its length (megatron/config/data_flags.py ``check_packing_resume``)."""
    if constituent.packing != CONCAT:
        raise ValueError(f"{constituent.name}: packed {constituent.packing}: its samples at another "
                         f"--seq-length than the run's are not defined (--pack-documents)")
    passes = passes_per_epoch(constituent.tokens, seq_length, add_extra_token)
    return replace(constituent, passes=passes,
                   samples_per_epoch=_samples_per_epoch(passes * constituent.tokens, seq_length,
                                                        add_extra_token))


def short_dataset_note(constituent: "Constituent", split: str, seq_length: int,
                       add_extra_token: bool = True) -> str:
    """The start-up note of a dataset shorter than one sample (``constituent.passes > 1``): what
    its ``split`` ("train", "valid", "test") draws instead of stopping."""
    c = constituent
    return (f"{split} data {c.path!r} (documents {c.doc_begin}:{c.doc_end}) has {c.tokens} "
            f"tokens, less than one sample of seq_length {seq_length} "
            f"({int(seq_length) + int(add_extra_token)} tokens): each of its epochs is {c.passes} "
            f"passes over its documents ({c.samples_per_epoch} sample"
            f"{'s' if c.samples_per_epoch != 1 else ''}), samples running from one pass into the "
            "next, as megatron-core's GPTDataset builds them")


def resolve_constituents(blend: SplitBlend, seq_length: int, add_extra_token: bool = True,
                         packing: str = CONCAT) -> List[Constituent]:
    """The distinct (path, split range) datasets of ``blend`` in order of first appearance, with
    their document range (megatron-core's rounding) and samples per epoch: ``seq_length``-token
    windows for ``packing`` ``"concat"`` (megatron-core's), best-fit bins of ``seq_length +
    add_extra_token`` tokens for ``"best-fit"`` (megatron/data/document_packing.py; one pass per
    epoch, however few the tokens). Each prefix's ``.idx`` is opened in turn and closed again: a
    blend of thousands holds no file open."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    out: Dict[Tuple[str, float, float], Constituent] = {}
    names = set()
    for stage in blend.stages:
        for entry in stage.entries:
            if entry.key in out:
                continue
            check_dataset_prefix(entry.path, entry.where + ".path")
            indexed = IndexedDataset(entry.path, multimodal=False, mmap=True)  # held: lengths is
            lengths = indexed.sequence_lengths                                # a view of its map
            n = int(lengths.shape[0])
            beg = int(round(entry.split[0] * float(n)))
            end = int(round(entry.split[1] * float(n)))
            if end <= beg:
                raise BlendConfigError(f"{entry.where}.split: range {entry.split[0]:g}:"
                                       f"{entry.split[1]:g} of {entry.path!r} ({n} documents) "
                                       "selects no document: a stage with nothing to draw; give "
                                       "it a wider range (--split) or more documents")
            tokens = int(np.sum(lengths[beg:end], dtype=np.int64))
            bins = None
            if packing != CONCAT and tokens > 0:
                bins = best_fit_bin_count(lengths[beg:end], bin_capacity(seq_length, add_extra_token))
            header_counts = (n, len(indexed.document_indices))  # the fingerprint's, read once
            del lengths, indexed  # the view first, then its map closes
            if tokens <= 0:
                raise BlendConfigError(f"{entry.where}: {entry.path!r} (documents {beg}:{end}) has "
                                       "no token: a stage with nothing to draw; give it a wider "
                                       "range (--split) or more data")
            if bins is None:
                passes = passes_per_epoch(tokens, seq_length, add_extra_token)
                spe = _samples_per_epoch(passes * tokens, seq_length, add_extra_token)
            else:
                passes, spe = 1, bins
            name = entry.name if entry.name not in names else entry.qualified_name
            base, k = name, 2
            while name in names:
                name, k = f"{base}#{k}", k + 1
            names.add(name)
            fingerprint = gpt_files_fingerprint(entry.path, header_counts)
            if entry.replay:  # its samples per epoch depend on what was drawn before
                spe, fingerprint = None, fingerprint + REPLAY_FINGERPRINT
            out[entry.key] = Constituent(entry.path, entry.split, name, beg, end, n, tokens, spe,
                                         fingerprint, passes, packing, entry.replay)
    return list(out.values())
