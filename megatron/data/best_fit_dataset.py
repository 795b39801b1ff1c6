"""``--pack-documents best-fit``'s datasets: :class:`BestFitGPTDataset`, megatron-core's
``GPTDataset`` whose samples are the best-fit bins of megatron/data/document_packing.py, and its
source reshuffled per epoch (:class:`BinShuffledSamples`); :class:`PackingGPTDatasetConfig`,
the ``GPTDatasetConfig`` that carries the packing to the builders.

A sample is megatron-core's ``GPTDataset.__getitem__`` of the bin's tokens (``tokens``,
``labels``, ``loss_mask``, ``position_ids``: the same keys and dtypes; masks and positions from
its ``_get_ltor_masks_and_position_ids``, so ``--reset-position-ids`` and
``--reset-attention-mask`` treat each document of a bin as its own, exactly as in a window; the
pads' labels take no loss, as megatron-core's own padding). The bins are cached where
megatron-core's windows are, in the index pack (megatron/data/index_pack.py), keyed by the
dataset's class and a name that says ``best-fit v{BEST_FIT_VERSION}``.
"""
from dataclasses import dataclass
from typing import List, Tuple

import numpy as np
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

from megatron.data import document_packing
from megatron.data.document_packing import BEST_FIT, BEST_FIT_VERSION, BINS_TAG, CONCAT, bin_capacity
from megatron.data.epoch_order import EpochShuffledSamples
from megatron.data.index_pack import PackedGPTDataset
from megatron.runtime.mcore_compat import window_query_returns_document_lengths

__all__ = ["PackingGPTDatasetConfig", "packing_of", "BestFitGPTDataset", "PackedBestFitGPTDataset",
           "BinShuffledSamples", "best_fit_one_epoch"]


@dataclass
class PackingGPTDatasetConfig(GPTDatasetConfig):
    """megatron-core's ``GPTDatasetConfig`` with ``pack_documents`` (``--pack-documents``:
    ``"concat"`` or ``"best-fit"``), which megatron-core never reads: the builders of this
    project pick the dataset class by it (:func:`packing_of`)."""

    pack_documents: str = CONCAT


def packing_of(gpt_config) -> str:
    """The packing mode of a ``GPTDatasetConfig`` (``"concat"`` for megatron-core's own)."""
    return getattr(gpt_config, "pack_documents", CONCAT)


def _narrow(a: np.ndarray) -> np.ndarray:
    """``a`` (non-negative integers) as int32 where its values fit, else int64."""
    return a.astype(np.int32 if (a.size == 0 or int(a.max()) < 2 ** 31) else np.int64)


class BestFitGPTDataset(GPTDataset):
    """megatron-core's ``GPTDataset`` whose samples are best-fit bins (module docstring) of the
    documents ``indexed_indices``, ``num_samples`` of them (the bin count: one epoch). Its three
    index arrays keep megatron-core's names, with the bins' meaning:

    - ``document_index`` [items, 2]: (``.idx`` sequence, chunk) of every item, bin after bin;
    - ``sample_index`` [bins + 1]: where each bin's items begin in it (int64);
    - ``shuffle_index`` [bins]: the bin at each position of epoch 0.
    """

    @property
    def capacity(self) -> int:
        """Tokens per bin (``seq_length`` + the extra label token)."""
        return bin_capacity(self.config.sequence_length, self.config.add_extra_token_to_sequence)

    def _build_document_sample_shuffle_indices(self):
        indices = np.asarray(self.indices, dtype=np.int64)
        lengths = np.asarray(self.dataset.sequence_lengths, dtype=np.int64)[indices]
        seed = int(self.config.random_seed)
        documents, chunks, offsets = document_packing.best_fit_bins(lengths, self.capacity, seed)
        bins = len(offsets) - 1
        if self.num_samples is not None and bins != int(self.num_samples):
            raise ValueError(f"{self.dataset_path}: best-fit packing made {bins} bins, "
                             f"{self.num_samples} were asked (the documents changed since their "
                             "samples per epoch were counted)")
        items = _narrow(np.stack([indices[documents], chunks], axis=1))
        order = _narrow(np.random.default_rng([seed, BINS_TAG]).permutation(bins))
        return items, offsets.astype(np.int64), order

    def _bin_items(self, position: int):
        """``[(sequence, first token, tokens), ...]`` of the bin at ``position`` of epoch 0."""
        b = int(self.shuffle_index[position])
        lo, hi = int(self.sample_index[b]), int(self.sample_index[b + 1])
        capacity = self.capacity
        lengths = self.dataset.sequence_lengths
        out = []
        for sequence, chunk in self.document_index[lo:hi].tolist():
            first = chunk * capacity
            out.append((sequence, first, min(capacity, int(lengths[sequence]) - first)))
        return out

    def _query_document_sample_shuffle_indices(self, idx: int) -> tuple:
        """(the ``capacity`` tokens of the bin at position ``idx``, padded with the pad id; its
        ``.idx`` sequences; with megatron-core 0.19, each document part's token count before the
        padding), as the installed megatron-core's window query returns them."""
        items = self._bin_items(idx)
        parts = [self.dataset.get(sequence, offset=first, length=n) for sequence, first, n in items]
        filled = sum(n for _, _, n in items)
        if filled < self.capacity:
            parts.append(np.full(self.capacity - filled, self._pad_token_id, dtype=np.int64))
        text = np.concatenate(parts, dtype=np.int64)
        sequences = np.array([sequence for sequence, _, _ in items], dtype=np.int64)
        if window_query_returns_document_lengths():
            return text, sequences, [n for _, _, n in items]
        return text, sequences

    _stream_starts = None  # where each bin's tokens begin in the token stream (built on first use)

    def bin_token_range(self, position: int) -> Tuple[int, int]:
        """``[start, end)`` of the bin at ``position`` of epoch 0 in the dataset's token stream:
        its documents' tokens, bin after bin in creation order (every token once: bins do not
        overlap, so a bin's range holds its last label too)."""
        if self._stream_starts is None:
            items = np.asarray(self.document_index, dtype=np.int64)
            lengths = np.asarray(self.dataset.sequence_lengths, dtype=np.int64)
            sizes = np.minimum(self.capacity, lengths[items[:, 0]] - items[:, 1] * self.capacity)
            offsets = np.asarray(self.sample_index, dtype=np.int64)
            self._stream_starts = np.concatenate(
                [[0], np.cumsum(np.add.reduceat(sizes, offsets[:-1]))]) if len(sizes) else np.zeros(1, np.int64)
        b = int(self.shuffle_index[position])
        return int(self._stream_starts[b]), int(self._stream_starts[b + 1])

    def bin_documents(self, position: int) -> List[List[int]]:
        """``[[sequence_id, first_token, last_token], ...]`` of the bin at ``position`` of epoch 0
        (as megatron/data/epoch_order.py ``gpt_sample_documents`` gives a window's)."""
        return [[sequence, first, first + n - 1] for sequence, first, n in self._bin_items(position)]


class PackedBestFitGPTDataset(PackedGPTDataset, BestFitGPTDataset):
    """:class:`BestFitGPTDataset` with its arrays read from (or built into) an
    :class:`~megatron.data.index_pack.IndexPack`; ``pack`` comes first."""


class BinShuffledSamples(EpochShuffledSamples):
    """:class:`~megatron.data.epoch_order.EpochShuffledSamples` over a :class:`BestFitGPTDataset`:
    the bins reshuffled per epoch; ``sample_documents`` names a bin's documents and
    ``token_ranges`` its place in the token stream (tools/data_provenance.py)."""

    def sample_documents(self, k: int) -> List[List[int]]:
        return self.epoch_dataset.bin_documents(self.epoch_position(k))

    def token_ranges(self, k: int) -> Tuple[int, List[List[int]]]:
        """(epoch, ``[[start, end)]``): sample ``k``'s bin in the dataset's token stream
        (:meth:`BestFitGPTDataset.bin_token_range`; megatron/data/provenance.py's coverage)."""
        start, end = self.epoch_dataset.bin_token_range(self.epoch_position(k))
        return int(k) // self.samples_per_epoch, [[start, end]]


def best_fit_one_epoch(pack, low_level, label: str, indices: np.ndarray, bins: int, split,
                       gpt_config) -> BestFitGPTDataset:
    """The ``bins`` best-fit bins (one epoch) of documents ``indices`` of ``low_level`` (a
    megatron-core ``IndexedDataset``), named ``label`` with its packing appended; indices kept in
    ``pack`` (an :class:`~megatron.data.index_pack.IndexPack`, or None: built in memory)."""
    args = (low_level, f"{label} [{BEST_FIT} v{BEST_FIT_VERSION}]", indices, int(bins), split,
            gpt_config)
    return BestFitGPTDataset(*args) if pack is None else PackedBestFitGPTDataset(pack, *args)
