"""A dataset's samples after its sequence length changes (a context-extension stage,
docs/context_extension.md): the token ledger.

Every epoch of a dataset reads one *token stream*: its documents in megatron-core's one-epoch
document order, which depends only on the seed and the documents (not on ``seq_length``, for a
dataset holding at least one sample). An epoch at length ``L`` covers the stream's input tokens
``[0, n_L * L)``, cut into ``n_L`` windows ``[j L, j L + L)``, each read with the next token as its
last label, and drawn in a shuffled order (megatron/data/epoch_order.py).

When a dataset's length changes from ``L`` to ``L'`` after ``d`` of its samples (one
:class:`LengthSegment` of its history, kept in the data ledger), the epoch in progress is
finished at the new length: its input tokens not drawn yet, in stream order, are cut into
*transition samples* of ``L'`` input tokens (drawn in a shuffled order; the last one padded, its
padding masked from the loss), then whole epochs follow at ``L'``. Over both lengths every input
token of an epoch is drawn exactly once: none is repeated or skipped. Each input token keeps its
own label (the token after it in the stream), also where a transition sample joins two pieces of
the stream. A dataset that changes length again later (64 -> 256 -> 1024) finishes the same way
whatever its epoch in progress holds, transition samples included.

:func:`epoch_in_progress` replays a history to what is left of the epoch in progress (a
:class:`TokenRanges`); :class:`LengthChangedSamples` serves a dataset's samples at the new length,
numbered from 0 at the change (the ledger's ``drawn`` after it).
"""
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from megatron.data.epoch_order import EpochShuffledSamples, epoch_permutation
from megatron.data.mix_ledger import LengthSegment

__all__ = ["TokenRanges", "EpochInProgress", "epoch_in_progress", "window_order",
           "transition_permutation", "StreamReader", "LengthChangedSamples", "sample_of_ranges",
           "seen_tokens", "ReplaySamples"]

_TRANSITION_TAG = 0x7472  # "tr": keeps the transition orders apart from the epoch orders
_REPLAY_TAG = 0x7270  # "rp": the replays' orders


class TokenRanges:
    """Disjoint ranges of a token stream, in stream order: ``starts`` and ``lengths`` (int64,
    tokens). Their *flat* offsets number their tokens one after the other (0 to ``total``)."""

    def __init__(self, starts: np.ndarray, lengths: np.ndarray):
        self.starts = np.asarray(starts, dtype=np.int64)
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.flat = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)

    @property
    def total(self) -> int:
        """Tokens in the ranges."""
        return int(self.flat[-1])

    @classmethod
    def of_windows(cls, windows: np.ndarray, seq_length: int) -> "TokenRanges":
        """The input tokens of windows ``windows`` (window ``j``: ``[j L, j L + L)``, ``L`` =
        ``seq_length``), adjacent windows merged."""
        j = np.unique(np.asarray(windows, dtype=np.int64))
        if j.size == 0:
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64))
        breaks = np.flatnonzero(np.diff(j) != 1) + 1
        first = np.concatenate([[0], breaks])
        last = np.concatenate([breaks, [j.size]])
        return cls(j[first] * seq_length, (last - first) * int(seq_length))

    def pieces(self, lo: int, hi: int) -> List[Tuple[int, int]]:
        """``[(stream start, tokens), ...]`` of flat offsets ``[lo, hi)``, in order."""
        out = []
        i = int(np.searchsorted(self.flat, lo, side="right")) - 1
        while lo < hi:
            take = min(hi, int(self.flat[i + 1])) - lo
            out.append((int(self.starts[i]) + lo - int(self.flat[i]), take))
            lo += take
            i += 1
        return out

    def select(self, flat_starts: np.ndarray, flat_ends: np.ndarray) -> "TokenRanges":
        """The stream ranges of the flat ranges ``[flat_starts[i], flat_ends[i])`` (sorted,
        disjoint), adjacent ones merged."""
        fs = np.asarray(flat_starts, dtype=np.int64)
        fe = np.asarray(flat_ends, dtype=np.int64)
        points = np.union1d(self.flat, np.concatenate([fs, fe]))
        lo, hi = points[:-1], points[1:]
        k = np.searchsorted(fs, lo, side="right") - 1
        inside = (k >= 0) & (lo < fe[np.maximum(k, 0)]) & (hi > lo)
        lo, hi = lo[inside], hi[inside]
        piece = np.searchsorted(self.flat, lo, side="right") - 1
        starts = self.starts[piece] + lo - self.flat[piece]
        lengths = hi - lo
        if starts.size:
            keep = np.concatenate([[True], starts[1:] != starts[:-1] + lengths[:-1]])
            group = np.cumsum(keep) - 1
            lengths = np.bincount(group, weights=lengths).astype(np.int64)
            starts = starts[keep]
        return TokenRanges(starts, lengths)

    def without_slots(self, slots: np.ndarray, seq_length: int) -> "TokenRanges":
        """These ranges less the flat slots ``slots`` (slot ``q``: flat ``[q L, q L + L)``, the
        last one cut at ``total``)."""
        L = int(seq_length)
        m = -(-self.total // L)
        drawn = np.zeros(m, dtype=bool)
        drawn[np.asarray(slots, dtype=np.int64)] = True
        free = np.flatnonzero(~drawn)
        if free.size == 0:
            return TokenRanges(np.zeros(0, np.int64), np.zeros(0, np.int64))
        breaks = np.flatnonzero(np.diff(free) != 1) + 1
        first = free[np.concatenate([[0], breaks])]
        last = free[np.concatenate([breaks, [free.size]]) - 1] + 1
        return self.select(first * L, np.minimum(last * L, self.total))

    def complement(self, end: int) -> "TokenRanges":
        """The tokens of ``[0, end)`` not in these ranges."""
        bounds = np.concatenate([[0], (self.starts + self.lengths)])
        nexts = np.concatenate([self.starts, [int(end)]])
        keep = nexts > bounds
        return TokenRanges(bounds[keep], (nexts - bounds)[keep])

    def to_list(self) -> List[List[int]]:
        """``[[start, end), ...]``: the ranges as stream offsets."""
        return [[int(s), int(s + n)] for s, n in zip(self.starts, self.lengths, strict=True)]


@dataclass(frozen=True)
class EpochInProgress:
    """What is left of a dataset's epoch ``epoch`` when its length changes: ``remainder`` (None:
    the epoch has not begun, all of it is left) in the stream of the one-epoch dataset at
    ``stream_length`` seeded ``stream_seed``."""

    epoch: int
    remainder: Optional[TokenRanges] = None
    stream_length: int = 0
    stream_seed: int = 0


def window_order(one_epoch, seed: int, epoch: int) -> np.ndarray:
    """The windows of a one-epoch GPT dataset ``one_epoch`` (megatron-core ``GPTDataset``) in
    the order epoch ``epoch`` draws them (epoch 0: its own sample shuffle; later epochs: that
    shuffle permuted, megatron/data/epoch_order.py)."""
    shuffle = np.asarray(one_epoch.shuffle_index)[:len(one_epoch)]
    if epoch == 0:
        return shuffle
    return shuffle[epoch_permutation(seed, epoch, len(one_epoch))]


def transition_permutation(seed: int, epoch: int, seq_length: int, count: int) -> np.ndarray:
    """The order the ``count`` transition samples of epoch ``epoch`` at ``seq_length`` are drawn
    in: a permutation from numpy's generator seeded ``(seed, epoch, tag, seq_length)``."""
    rng = np.random.default_rng([int(seed), int(epoch), _TRANSITION_TAG, int(seq_length)])
    return rng.permutation(int(count))


def epoch_in_progress(segments: Sequence[LengthSegment],
                      open_epoch: Callable[[int, int], Any]) -> EpochInProgress:
    """Replay a dataset's length history ``segments`` (oldest first) to the epoch it was in at
    the last change and what of it was not drawn. ``open_epoch(seq_length, seed)`` gives its
    one-epoch GPT dataset at that length and seed (its ``shuffle_index`` orders the windows)."""
    state = EpochInProgress(0)
    for seg in segments:
        L, d = int(seg.seq_length), int(seg.drawn)
        one_epoch = open_epoch(L, seg.seed)
        per_epoch = len(one_epoch)
        epoch = state.epoch
        if state.remainder is not None:
            m = -(-state.remainder.total // L)
            if d < m:
                drawn = transition_permutation(seg.seed, epoch, L, m)[:d]
                state = EpochInProgress(epoch, state.remainder.without_slots(drawn, L),
                                        state.stream_length, state.stream_seed)
                continue
            d, epoch = d - m, epoch + 1
        epoch, position = epoch + d // per_epoch, d % per_epoch
        if position == 0:
            state = EpochInProgress(epoch)
        else:
            rest = np.ones(per_epoch, dtype=bool)
            rest[window_order(one_epoch, seg.seed, epoch)[:position]] = False
            state = EpochInProgress(epoch, TokenRanges.of_windows(np.flatnonzero(rest), L),
                                    L, int(seg.seed))
    return state


class StreamReader:
    """Tokens of a one-epoch GPT dataset's stream (its documents in its document order) by
    offset, and the documents a range of it reads."""

    def __init__(self, one_epoch):
        self.indexed = one_epoch.dataset
        self.doc_ids = np.asarray(one_epoch.document_index)
        lengths = np.asarray(self.indexed.sequence_lengths)[self.doc_ids].astype(np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

    def _spans(self, start: int, count: int):
        i = int(np.searchsorted(self.offsets, start, side="right")) - 1
        while count > 0:
            first = start - int(self.offsets[i])
            take = min(count, int(self.offsets[i + 1]) - start)
            yield int(self.doc_ids[i]), first, take
            start, count, i = start + take, count - take, i + 1

    def read(self, start: int, count: int) -> np.ndarray:
        """Tokens ``[start, start + count)`` of the stream (int64)."""
        parts = [self.indexed.get(doc, first, take) for doc, first, take in self._spans(start, count)]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def documents(self, start: int, count: int) -> List[List[int]]:
        """``[[sequence_id, first_token, last_token], ...]`` that tokens ``[start, start +
        count)`` are read from (last inclusive), as megatron/data/epoch_order.py names a sample's."""
        return [[doc, first, first + take - 1] for doc, first, take in self._spans(start, count)]


class _StreamSamples(torch.utils.data.Dataset):
    """Shared by the samples cut from ranges of a stream: reading them (the stream of
    ``_stream_epoch``, opened on first use) and naming their documents."""

    seq_length: int
    _stream_epoch: Any
    _reader: Optional["StreamReader"] = None

    def _stream(self) -> "StreamReader":
        if self._reader is None:
            self._reader = StreamReader(self._stream_epoch)
        return self._reader

    def _slot(self, ranges: TokenRanges, q: int) -> List[List[int]]:
        """The stream ranges of sample slot ``q`` of ``ranges`` cut in samples of ``seq_length``."""
        lo = int(q) * self.seq_length
        hi = min(lo + self.seq_length, ranges.total)
        return [[a, a + n] for a, n in ranges.pieces(lo, hi)]

    def _documents(self, ranges: List[List[int]]) -> List[List[int]]:
        out = []
        for start, end in ranges:
            out += self._stream().documents(start, end - start + 1)
        return out

    _CACHES: Tuple[str, ...] = ("_reader",)  # made again on first use

    def __getstate__(self):  # DataLoader workers: no reader or order to copy
        state = dict(self.__dict__)
        state.update({k: None for k in self._CACHES})
        return state


class LengthChangedSamples(_StreamSamples):
    """A dataset's samples at a new length, numbered from 0 at its last length change: first
    the ``m`` transition samples finishing the epoch in progress (``state``), then the whole
    epochs that follow, at the new length (``new_epoch``, its one-epoch megatron-core
    ``GPTDataset``, reshuffled per epoch with ``seed``). ``stream_epoch`` is the one-epoch
    dataset whose stream the remainder's offsets refer to (``new_epoch`` where the two streams
    are the same). ``len()`` is ``num_samples``."""

    _CACHES = ("_reader", "_order")

    def __init__(self, state: EpochInProgress, new_epoch, stream_epoch, seed: int,
                 num_samples: int):
        self.state = state
        self.seq_length = int(new_epoch.config.sequence_length)
        self.samples_per_epoch = len(new_epoch)
        self.new_epoch = new_epoch
        self.seed = int(seed)
        self.num_samples = int(num_samples)
        rest = state.remainder
        self.transition = 0 if rest is None else -(-rest.total // self.seq_length)
        self.first_epoch = state.epoch + (1 if rest is not None else 0)
        later = max(0, self.num_samples - self.transition)
        self.later = EpochShuffledSamples(new_epoch, seed,
                                          self.first_epoch * self.samples_per_epoch + later)
        self._stream_epoch = stream_epoch
        self._reader: Optional[StreamReader] = None
        self._order: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return self.num_samples

    def _transition_slot(self, k: int) -> int:
        if self._order is None:
            self._order = transition_permutation(self.seed, self.state.epoch, self.seq_length,
                                                 self.transition)
        return int(self._order[k])

    def epoch_and_position(self, k: int) -> Tuple[int, int]:
        """(epoch, samples drawn before it in that epoch at this length) of sample ``k``."""
        if k < self.transition:
            return self.state.epoch, int(k)
        e, p = divmod(int(k) - self.transition, self.samples_per_epoch)
        return self.first_epoch + e, p

    def token_ranges(self, k: int) -> Tuple[int, List[List[int]]]:
        """(epoch, ``[[start, end), ...]``): the stream offsets of sample ``k``'s input tokens."""
        if k < self.transition:
            return self.state.epoch, self._slot(self.state.remainder, self._transition_slot(k))
        inner = self.first_epoch * self.samples_per_epoch + int(k) - self.transition
        epoch = inner // self.samples_per_epoch
        j = int(self.new_epoch.shuffle_index[self.later.epoch_position(inner)])
        return epoch, [[j * self.seq_length, (j + 1) * self.seq_length]]

    def __getitem__(self, k: int) -> Dict[str, Any]:
        if not 0 <= int(k) < self.num_samples:
            raise IndexError(f"sample {k} outside [0, {self.num_samples})")
        if k >= self.transition:
            return self.later[self.first_epoch * self.samples_per_epoch + int(k) - self.transition]
        return self._transition_sample(self.token_ranges(k)[1])

    def _transition_sample(self, ranges: List[List[int]]) -> Dict[str, Any]:
        return sample_of_ranges(self._stream(), ranges, self.new_epoch)

    def sample_documents(self, k: int) -> List[List[int]]:
        """``[[sequence_id, first_token, last_token], ...]`` sample ``k`` is read from."""
        if k >= self.transition:
            return self.later.sample_documents(self.first_epoch * self.samples_per_epoch
                                               + int(k) - self.transition)
        return self._documents(self.token_ranges(k)[1])


def sample_of_ranges(reader: "StreamReader", ranges: List[List[int]], like) -> Dict[str, Any]:
    """The sample (the keys and dtypes of megatron-core ``GPTDataset`` ``like``'s, its masks from
    megatron-core's ``_get_ltor_masks_and_position_ids`` under ``like``'s config) whose input
    tokens are the stream ranges ``ranges`` of ``reader``, one after the other, each token
    labelled with the token after it in the stream; padded to ``like``'s sequence length, the
    padding masked from the loss."""
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    inputs, labels = [], []
    for start, end in ranges:
        text = reader.read(start, end - start + 1)  # the last input's label too
        inputs.append(text[:-1])
        labels.append(text[1:])
    config = like.config
    length = int(config.sequence_length)
    real = sum(len(x) for x in inputs)
    filler = np.full(length - real, int(like._pad_token_id), dtype=np.int64)
    tokens = torch.from_numpy(np.concatenate(inputs + [filler])).long()
    label_ids = torch.from_numpy(np.concatenate(labels + [filler])).long()
    attention_mask, loss_mask, position_ids = _get_ltor_masks_and_position_ids(
        tokens, config.tokenizer.eod, config.reset_position_ids, config.reset_attention_mask,
        config.eod_mask_loss, config.create_attention_mask)
    loss_mask[real:] = 0.0  # padding
    tokens[real:] = 0
    label_ids[real:] = 0
    if config.create_attention_mask:
        return {"tokens": tokens, "labels": label_ids, "attention_mask": attention_mask,
                "loss_mask": loss_mask, "position_ids": position_ids}
    return {"tokens": tokens, "labels": label_ids, "loss_mask": loss_mask,
            "position_ids": position_ids}


def seen_tokens(segments: Sequence[LengthSegment], open_epoch: Callable[[int, int], Any],
                seq_length: int, seed: int) -> Tuple[TokenRanges, Any]:
    """What a dataset with the length history ``segments`` has drawn, as ranges of a stream, and
    the one-epoch dataset whose stream they refer to: all of the stream at ``seq_length`` (and
    ``seed``) once it finished an epoch, else the part of its first epoch drawn so far. Empty
    when it drew nothing."""
    state = epoch_in_progress(segments, open_epoch)
    if state.epoch >= 1:
        one_epoch = open_epoch(seq_length, seed)
        return TokenRanges(np.zeros(1, np.int64), np.asarray([len(one_epoch) * int(seq_length)])), one_epoch
    if state.remainder is None:
        return TokenRanges(np.zeros(0, np.int64), np.zeros(0, np.int64)), open_epoch(seq_length, seed)
    stream = open_epoch(state.stream_length, state.stream_seed)
    return state.remainder.complement(len(stream) * state.stream_length), stream


class ReplaySamples(_StreamSamples):
    """A declared replay (a blend entry with ``replay: true``): samples of ``new_epoch``'s length
    cut from ``seen`` (ranges of ``stream_epoch``'s stream a dataset gave before), an epoch being
    all of them in an order seeded ``(seed, epoch)``, the last one of each padded; ``len()`` is
    ``num_samples``."""

    _CACHES = ("_reader", "_orders")

    def __init__(self, seen: TokenRanges, new_epoch, stream_epoch, seed: int, num_samples: int):
        self.seen = seen
        self.new_epoch = new_epoch
        self.seq_length = int(new_epoch.config.sequence_length)
        self.per_epoch = -(-seen.total // self.seq_length)
        if self.per_epoch == 0:
            raise ValueError("a replay of a dataset that gave no token")
        self.seed = int(seed)
        self.num_samples = int(num_samples)
        self._stream_epoch = stream_epoch
        self._reader: Optional[StreamReader] = None
        self._orders: Dict[int, np.ndarray] = {}

    def __len__(self) -> int:
        return self.num_samples

    def epoch_and_position(self, k: int) -> Tuple[int, int]:
        """(replay epoch, position in it) of sample ``k``."""
        return divmod(int(k), self.per_epoch)

    def token_ranges(self, k: int) -> Tuple[int, List[List[int]]]:
        """(replay epoch, ``[[start, end), ...]``): sample ``k``'s input tokens in the stream."""
        epoch, position = self.epoch_and_position(k)
        if self._orders is None or epoch not in self._orders:
            self._orders = {epoch: np.random.default_rng(
                [self.seed, epoch, _REPLAY_TAG, self.seq_length]).permutation(self.per_epoch)}
        return epoch, self._slot(self.seen, self._orders[epoch][position])

    def __getitem__(self, k: int) -> Dict[str, Any]:
        if not 0 <= int(k) < self.num_samples:
            raise IndexError(f"sample {k} outside [0, {self.num_samples})")
        return sample_of_ranges(self._stream(), self.token_ranges(k)[1], self.new_epoch)

    def sample_documents(self, k: int) -> List[List[int]]:
        """``[[sequence_id, first_token, last_token], ...]`` sample ``k`` is read from."""
        return self._documents(self.token_ranges(k)[1])
