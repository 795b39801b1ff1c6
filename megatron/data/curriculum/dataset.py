"""The curriculum dataset: :class:`CurriculumDataset` (global sample -> a constituent's sample,
following a :class:`~megatron.data.curriculum.index.CurriculumIndex`), :class:`Continuation`
(where a mix continues a resumed run), the constituents' epoch-shuffled GPT sources
(:func:`gpt_epoch_source`) and the builders from a blend (:func:`build_mix_dataset`,
:func:`build_curriculum_dataset`, :func:`build_blend_config_datasets`)."""
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import numpy as np
import torch

from megatron.data.best_fit_dataset import BinShuffledSamples, best_fit_one_epoch, packing_of
from megatron.data.blend_config import SplitBlend
from megatron.data.cache_key import array_digest
from megatron.data.curriculum.constituents import (
    Constituent,
    at_seq_length,
    resolve_constituents,
    short_dataset_note,
)
from megatron.data.curriculum.index import CurriculumIndex
from megatron.data.document_packing import BEST_FIT
from megatron.data.epoch_order import EpochShuffledSamples
from megatron.data.index_pack import IndexPack, PackedGPTDataset
from megatron.data.length_change import LengthChangedSamples, ReplaySamples, epoch_in_progress, seen_tokens
from megatron.data.mix_ledger import LengthSegment
from megatron.data.rank0_first import rank0_builds_first
from megatron.data.source_pool import LazySource, SourcePool, check_file_limit, pool_capacity
from megatron.errors import ConfigError
from megatron.schedules.units import BatchSchedule
from megatron.utils.rank_utils import print_rank_0

__all__ = ["Continuation", "CurriculumDataset", "gpt_source_label", "one_epoch_gpt_dataset",
           "gpt_epoch_source", "build_mix_dataset",
           "build_curriculum_dataset", "build_blend_config_datasets"]


@dataclass(frozen=True)
class Continuation:
    """Where a mix starts when it continues a run (megatron/data/mix_resume.py): at global sample
    ``begin``, each dataset at its ledger position ``base[ledger key]`` (absent: 0, a new dataset);
    ``drawn_before(s)`` gives the ledger at an earlier global sample ``s`` (the run's history, for
    an epochized stage running at ``begin``), or None."""

    begin: int
    base: Dict[Tuple[str, float, float, str], int]
    drawn_before: Optional[Callable[[int], Dict[Tuple[str, float, float, str], int]]] = None


class CurriculumDataset(torch.utils.data.Dataset):
    """Samples ``{"dataset_id": id, **constituent[sample]}`` following a :class:`CurriculumIndex`
    (same shape as megatron-core's ``BlendedDataset``), for global samples ``index.begin`` to
    ``len() - 1``; ``sources[d]`` serves dataset ``d``'s samples by their ledger number (None for
    a dataset this index never draws)."""

    def __init__(self, index: CurriculumIndex, sources: Sequence[Optional[torch.utils.data.Dataset]],
                 constituents: Optional[Sequence[Constituent]] = None):
        self.index = index
        self.datasets = list(sources)
        self.constituents = list(constituents if constituents is not None else index.constituents)
        self.begin = index.begin
        # plain ndarray views of the (possibly memory-mapped) index: fast scalar indexing
        self.dataset_index = np.asarray(index.dataset_index)
        self.dataset_sample_index = np.asarray(index.dataset_sample_index)
        self.names = index.names
        self.epochs = index.epochs
        self.counts = index.counts
        self._ledger_cache: Tuple[int, np.ndarray] = (index.begin, index.base.copy())
        self._make_views()

    def _make_views(self) -> None:
        # memoryviews of the index arrays: an item is a Python int, several times faster than
        # numpy's scalar indexing (made again after unpickling: a memoryview is not picklable)
        self._ids = memoryview(self.dataset_index)
        self._samples = memoryview(self.dataset_sample_index)

    def __len__(self) -> int:
        return self.index.num_samples

    def locate(self, idx: int) -> Tuple[int, int]:
        """(dataset id, that dataset's sample number) of global sample ``idx`` (an integer)."""
        j = idx - self.begin
        if j >= 0:  # a negative position would count from the end
            try:
                return self._ids[j], self._samples[j]
            except IndexError:
                pass
        raise IndexError(f"global sample {idx} is outside this mix's samples [{self.begin}, "
                         f"{self.index.num_samples})")

    def __getitem__(self, idx: int) -> Dict[str, Any]:
        dataset_id, sample = self.locate(idx)
        return {"dataset_id": dataset_id, **self.datasets[dataset_id][sample]}

    def drawn_before(self, sample: int) -> np.ndarray:
        """Samples drawn per dataset before global sample ``sample`` (the ledger there); cheap
        when called with growing ``sample`` (counts only the samples since the last call), and
        otherwise the index's count of the shorter side (:meth:`CurriculumIndex.drawn_before`)."""
        last, counts = self._ledger_cache
        s = int(sample)
        stop, length = s - self.begin, len(self.dataset_index)
        if 0 <= stop <= length and (s < last or s - last > min(stop, length - stop)):
            counts = self.index.drawn_before(s)
        else:
            if s < last:
                last, counts = self.begin, self.index.base.copy()
            if stop > last - self.begin:
                counts = counts + np.bincount(self.dataset_index[last - self.begin:stop],
                                              minlength=len(self.names))
        self._ledger_cache = (s, counts)
        return counts.copy()

    def target_weights(self, sample_indices) -> np.ndarray:
        return self.index.target_weights(sample_indices)

    def __getstate__(self):  # DataLoader workers: the index arrays are shared, not the cache
        state = dict(self.__dict__)
        state["_ledger_cache"] = (self.index.begin, self.index.base.copy())
        del state["_ids"], state["_samples"]  # memoryviews: not picklable, made again
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._make_views()


def _split_enum(split: str):
    from megatron.core.datasets.utils import Split

    return {"train": Split.train, "valid": Split.valid, "test": Split.test}[split]


def gpt_source_label(constituent: Constituent, lengths: np.ndarray) -> str:
    """The name megatron-core's ``GPTDataset`` of ``constituent`` is built under: its path, its
    split range, and a digest of its documents' lengths (``lengths``). megatron-core keys its
    cached document, sample and shuffle indices on this name, the samples, the split and its
    config, not on the files: with the lengths in it, a dataset rewritten at the same path never
    reads the indices of the old one."""
    c = constituent
    label = c.path if c.split == (0.0, 1.0) else f"{c.path}[{c.split[0]:g}:{c.split[1]:g}]"
    return f"{label} (lengths {array_digest(lengths)['sha256'][:16]})"


def one_epoch_gpt_dataset(constituent: Constituent, gpt_config, split: str,
                          pack: Optional[IndexPack] = None):
    """Dataset ``constituent``'s megatron-core ``GPTDataset`` built for exactly one epoch
    (``constituent.samples_per_epoch`` samples of ``gpt_config.sequence_length`` tokens, seeded
    ``gpt_config.random_seed``), its indices read from (or added to) ``pack`` when given rather
    than megatron-core's four cache files per dataset. A ``constituent`` packed ``best-fit``
    (``--pack-documents``) gives its bins instead: megatron/data/best_fit_dataset.py
    ``BestFitGPTDataset``."""
    from megatron.core.datasets.gpt_dataset import GPTDataset
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    c = constituent
    low_level = IndexedDataset(c.path, multimodal=False, mmap=True)
    indices = np.arange(c.doc_begin, c.doc_end, dtype=np.int32)
    label = gpt_source_label(c, low_level.sequence_lengths[c.doc_begin:c.doc_end])
    args = (low_level, label, indices, int(c.samples_per_epoch), _split_enum(split), gpt_config)
    if c.packing == BEST_FIT:
        return best_fit_one_epoch(pack, *args)
    return GPTDataset(*args) if pack is None else PackedGPTDataset(pack, *args)


def gpt_epoch_source(constituent: Constituent, num_samples: int, gpt_config, split: str,
                     pack: Optional[IndexPack] = None,
                     prior: Sequence[LengthSegment] = (),
                     replay_of: Sequence[LengthSegment] = ()):
    """Dataset ``constituent``'s samples ``0..num_samples - 1`` (by ledger number):
    :class:`~megatron.data.epoch_order.EpochShuffledSamples` over its one-epoch megatron-core
    ``GPTDataset`` (:func:`one_epoch_gpt_dataset`; ``constituent.passes`` passes over its
    documents for a dataset shorter than one sample: megatron-core sizes them from the samples
    asked; its ``start_up_note`` says so, printed once by :func:`build_mix_dataset`). With a
    length history ``prior`` (the samples it gave at earlier sequence lengths, from the data
    ledger), the samples since its last length change:
    :class:`~megatron.data.length_change.LengthChangedSamples`, which first finish the epoch in
    progress from the tokens it has not drawn. A replay (``constituent.replay``) draws again from
    what its dataset had given by the history ``replay_of``:
    :class:`~megatron.data.length_change.ReplaySamples`. A best-fit ``constituent`` serves its
    bins, reshuffled per epoch alike (:class:`~megatron.data.best_fit_dataset.BinShuffledSamples`;
    never with a length history or as a replay: a best-fit run keeps its length)."""
    extra = gpt_config.add_extra_token_to_sequence
    if constituent.packing == BEST_FIT:
        if prior or replay_of or constituent.replay:
            raise ConfigError(f"--pack-documents {BEST_FIT}: {constituent.name} cannot continue "
                              "across a --seq-length change or be replayed (replay: true): its "
                              "bins are packed for one length; give --pack-documents concat")
        return BinShuffledSamples(one_epoch_gpt_dataset(constituent, gpt_config, split, pack),
                                  gpt_config.random_seed, num_samples)
    if constituent.replay:
        constituent = at_seq_length(constituent.replayed(), gpt_config.sequence_length, extra)
    one_epoch = one_epoch_gpt_dataset(constituent, gpt_config, split, pack)
    if prior or replay_of:
        opened: Dict[Tuple[int, int], Any] = {}

        def open_epoch(seq_length: int, seed: int):
            if (seq_length, seed) == (gpt_config.sequence_length, gpt_config.random_seed):
                return one_epoch
            if (seq_length, seed) not in opened:
                config = replace(gpt_config, sequence_length=int(seq_length), random_seed=int(seed))
                opened[(seq_length, seed)] = one_epoch_gpt_dataset(
                    at_seq_length(constituent, seq_length, extra), config, split, pack)
            return opened[(seq_length, seed)]

        if replay_of:
            seen, stream = seen_tokens(replay_of, open_epoch, gpt_config.sequence_length,
                                       gpt_config.random_seed)
            opened.clear()
            return ReplaySamples(seen, one_epoch, stream, gpt_config.random_seed, num_samples)
        state = epoch_in_progress(prior, open_epoch)
        stream = one_epoch
        if state.remainder is not None:
            stream = open_epoch(state.stream_length, state.stream_seed)
            if np.array_equal(np.asarray(stream.document_index), np.asarray(one_epoch.document_index)):
                stream = one_epoch  # the same stream: one dataset held, not two
        opened.clear()
        return LengthChangedSamples(state, one_epoch, stream, gpt_config.random_seed, num_samples)
    source = EpochShuffledSamples(one_epoch, gpt_config.random_seed, num_samples)
    c = constituent
    if c.passes > 1:
        source.start_up_note = short_dataset_note(c, split, gpt_config.sequence_length,
                                                  gpt_config.add_extra_token_to_sequence)
    return source


def _prepare(sources: Sequence[Optional[LazySource]], pack: Optional[IndexPack]) -> None:
    """Open (building what megatron-core caches for it, into ``pack`` when given: one new segment
    per cache directory) and drop each dataset of ``sources`` in turn, printing its start-up note
    once; progress every 10 s when there are many."""
    todo = [s for s in sources if s is not None]
    last = time.monotonic()
    with pack.writing() if pack is not None else nullcontext():
        for k, source in enumerate(todo):
            note = getattr(source.opener(), "start_up_note", None)  # not kept open: built, dropped
            if note:
                print_rank_0(note)
            if len(todo) > 64 and time.monotonic() - last > 10:
                last = time.monotonic()
                print_rank_0(f"data: {k + 1} of {len(todo)} datasets' indices ready")


def build_mix_dataset(blend: SplitBlend, constituents: Sequence[Constituent], num_samples: int,
                      batch_schedule: BatchSchedule, seed: int, make_source: Callable,
                      cache_dir: Optional[str] = None,
                      continuation: Optional[Continuation] = None,
                      order: str = "auto",
                      index_pack: Optional[IndexPack] = None) -> CurriculumDataset:
    """The :class:`CurriculumDataset` of ``blend`` over ``constituents`` for a run of
    ``num_samples`` global samples (from ``continuation.begin`` on when given), its index built
    in ``order`` (``--data-index-order``: megatron/data/curriculum/blocked.py);
    ``make_source(constituent, n)`` opens a dataset's samples ``0..n - 1`` (reading its indices
    from ``index_pack`` when it was made with one). Rank 0 (on a node-local ``cache_dir``, each
    node's first rank) builds and caches the index and every dataset's own indices first (opening
    each and dropping it again; into ``index_pack``), the other ranks then load, having waited on
    a file in ``cache_dir`` rather than at a collective (a build longer than the process group's
    timeout fails no rank: megatron/data/rank0_first.py); every rank opens
    its datasets on first use, a bounded number at a time (megatron/data/source_pool.py), so a
    blend of thousands of prefixes runs under the default ``ulimit -n``."""
    # rank 0 first; the others wait on a file in the cache, not at a collective (rank0_first.py)
    with rank0_builds_first(cache_dir, blend.where) as builds:
        begin, base, drawn_before = 0, None, None
        if continuation is not None:
            keys = [c.ledger_key for c in constituents]
            begin = continuation.begin
            base = [int(continuation.base.get(k, 0)) for k in keys]
            if continuation.drawn_before is not None:
                history = continuation.drawn_before
                drawn_before = (lambda s: np.asarray([int(history(s).get(k, 0)) for k in keys],
                                                     dtype=np.int64))
        index = CurriculumIndex(blend, constituents, num_samples, batch_schedule, seed=seed,
                                cache_dir=cache_dir, write_cache=builds, begin=begin, base=base,
                                drawn_before=drawn_before, order=order)
        drawn = int(np.count_nonzero(index.counts))
        check_file_limit(drawn, blend.where)
        pool = SourcePool(pool_capacity(drawn))
        sources = [LazySource(d, int(total), partial(make_source, c, int(total)), pool)
                   if count > 0 else None
                   for d, (c, count, total) in enumerate(zip(constituents, index.counts,
                                                             index.totals, strict=True))]
        if builds:  # each dataset's own indices built (and cached) now, one open at a time
            _prepare(sources, index_pack)
    return CurriculumDataset(index, sources, constituents)


def build_curriculum_dataset(blend: SplitBlend, num_samples: int, gpt_config,
                             batch_schedule: BatchSchedule, split: str = "train",
                             cache_dir: Optional[str] = None,
                             continuation: Optional[Continuation] = None,
                             order: str = "auto") -> CurriculumDataset:
    """The :class:`CurriculumDataset` of ``blend`` for ``num_samples`` samples (from
    ``continuation.begin`` on, each dataset at its ledger position, when given).

    Each constituent is a megatron-core ``GPTDataset`` over the documents of its split range,
    built for one epoch, repeated with a fresh order per epoch
    (megatron/data/epoch_order.py), or its best-fit bins under ``--pack-documents best-fit``
    (megatron/data/document_packing.py). ``gpt_config`` is a ``GPTDatasetConfig`` (seed,
    seq_length, tokenizer, masks; its ``pack_documents`` where it has one); ``cache_dir``
    defaults to ``gpt_config.path_to_cache``; ``order``: the index's order
    (``--data-index-order``).
    """
    if int(gpt_config.sequence_length) != int(batch_schedule.seq_length):
        raise ValueError(f"seq_length differs: GPTDatasetConfig {gpt_config.sequence_length} vs "
                         f"BatchSchedule {batch_schedule.seq_length}")
    cache_dir = cache_dir or gpt_config.path_to_cache
    constituents = resolve_constituents(blend, gpt_config.sequence_length,
                                        gpt_config.add_extra_token_to_sequence,
                                        packing_of(gpt_config))
    pack = IndexPack()
    return build_mix_dataset(
        blend, constituents, num_samples, batch_schedule, gpt_config.random_seed,
        lambda c, n: gpt_epoch_source(c, n, gpt_config, split, pack), cache_dir, continuation,
        order, pack)


def build_blend_config_datasets(config, num_samples: Tuple[int, int, int], gpt_config,
                                batch_schedule: BatchSchedule, cache_dir: Optional[str] = None,
                                continuation: Optional[Continuation] = None, order: str = "auto"):
    """All datasets of a :class:`~megatron.data.blend_config.BlendConfig`:
    ``(train or None, [(name, valid dataset)], [(name, test dataset)])``; ``num_samples`` is
    (train, per valid group, per test group), e.g. from ``train_valid_test_num_samples(config)``;
    ``continuation``: where the training mix starts (a resumed run's ledger); ``order``: the
    indices' order (``--data-index-order``)."""
    train = None
    if config.train is not None and num_samples[0] > 0:
        train = build_curriculum_dataset(config.train, num_samples[0], gpt_config, batch_schedule,
                                         "train", cache_dir, continuation, order)
    valid = [(g.name, build_curriculum_dataset(g, num_samples[1], gpt_config, batch_schedule,
                                               "valid", cache_dir, order=order))
             for g in config.valid] if num_samples[1] > 0 else []
    test = [(g.name, build_curriculum_dataset(g, num_samples[2], gpt_config, batch_schedule,
                                              "test", cache_dir, order=order))
            for g in config.test] if num_samples[2] > 0 else []
    return train, valid, test
