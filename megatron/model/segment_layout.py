"""Where a batch's packed segments lie, worked out on the host before the batch reaches the device.

A backend that runs segments separately (TE's packed ``thd`` format, SDPA's per-segment path) needs
their boundaries as host integers to size its kernels. Reading them back from ``segment_ids`` on the
device would stall the GPU once per micro batch (megatron-core's ``PackedSeqParams`` come from the
data pipeline for the same reason), so the loader's collate computes them on the CPU
(:func:`segment_layout`, called by ``megatron.model.masks.with_segment_layout``):

- ``cu_seqlens`` int32 ``[b*s + 1]`` (tensor, sent to the device with the batch): the start of every
  segment in the ``b * s`` tokens taken sample-major, then ``b * s``, then ``b * s`` repeated up to the
  fixed length ``b*s + 1`` (zero-length sequences), so pipeline stages can send it along as a
  fixed-shape tensor. Its first ``num_segments + 1`` entries are TE's ``cu_seqlens``.
- ``segment_gather_index`` int64 ``[R]`` (tensor, sent with the batch): SDPA's vectorised segment path
  (megatron/model/sdpa_attention.py) runs segments of similar length together, each padded to its
  *bucket* length (:func:`bucket_lengths`: at most 25% or ``BUCKET_GRANULE`` tokens longer); this
  is, bucket after bucket and segment after segment, the token each padded slot reads, -1 for
  padding slots.
- :class:`SegmentLayout` (host integers only): each segment's start, length and prefix length, the
  longest segment (``max_seqlen``) and the buckets.

Segments are maximal runs of one segment id; a segment id that comes back after another segment is
refused (ValueError), as every backend treats segments as contiguous runs.
"""
import dataclasses
from typing import Optional, Tuple

import numpy as np
import torch
from torch import Tensor

BUCKET_GRANULE = 64  # tokens: SDPA's segment buckets pad lengths to multiples of this (or coarser)


@dataclasses.dataclass(frozen=True)
class SegmentLayout:
    """The segments of a ``[batch_size, seq_length]`` batch in host integers (see the module doc).

    ``starts``, ``lengths`` and ``prefix_lengths`` hold one entry per segment, in token order
    (``starts`` index the ``batch_size * seq_length`` tokens sample-major; a prefix length counts the
    segment's ``is_prefix`` tokens, 0 without prefixes). ``buckets`` are ``(padded length, number of
    segments, whether they have a prefix)`` in the order of ``segment_gather_index``."""

    batch_size: int
    seq_length: int
    starts: Tuple[int, ...]
    lengths: Tuple[int, ...]
    prefix_lengths: Tuple[int, ...]
    buckets: Tuple[Tuple[int, int, bool], ...]

    @property
    def num_segments(self) -> int:
        """How many segments the batch holds (padding runs count as segments)."""
        return len(self.starts)

    @property
    def max_seqlen(self) -> int:
        """Tokens in the longest segment."""
        return max(self.lengths)


def padded_cu_seqlens(segment_ids: Tensor) -> Tensor:
    """``cu_seqlens`` int32 ``[b*s + 1]`` of ``segment_ids`` ``[b, s]`` (see the module doc), computed
    where the tensor is, with no host synchronisation (a sort instead of ``nonzero``): the segment
    starts in ascending order, then ``b * s`` for the rest."""
    b, s = segment_ids.shape
    total = b * s
    starts = torch.ones_like(segment_ids, dtype=torch.bool)
    starts[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    position = torch.arange(total, dtype=torch.int32, device=segment_ids.device)
    keyed = torch.where(starts.reshape(-1), position, total)
    end = torch.full((1,), total, dtype=torch.int32, device=segment_ids.device)
    return torch.cat([torch.sort(keyed).values.to(torch.int32), end])


def _check_contiguous(segment_ids: np.ndarray, starts: np.ndarray) -> None:
    s = segment_ids.shape[1]
    sample, run_id = starts // s, segment_ids.reshape(-1)[starts]
    if len(np.unique(np.stack([sample, run_id.astype(np.int64)], axis=1), axis=0)) == len(starts):
        return
    for n in range(segment_ids.shape[0]):
        ids = run_id[sample == n].tolist()
        repeated = next((i for i in ids if ids.count(i) > 1), None)
        if repeated is not None:
            raise ValueError(f"segment_ids of sample {n}: segment {repeated} is split into separate "
                             "runs; each segment must be one contiguous run of tokens")


def bucket_lengths(lengths: np.ndarray, seq_length: int) -> np.ndarray:
    """The padded length of each segment's SDPA bucket: its length rounded up to a multiple of
    :data:`BUCKET_GRANULE` tokens, or, for segments longer than ``8 * BUCKET_GRANULE``, of a quarter
    of the power of two at or below its length (so less than 25% padding, and four buckets per
    doubling of length), at most ``seq_length``."""
    lengths = np.maximum(lengths, 1)
    granule = np.maximum(BUCKET_GRANULE, np.left_shift(1, np.floor(np.log2(lengths)).astype(np.int64)) // 4)
    return np.minimum(-(-lengths // granule) * granule, seq_length)


def segment_layout(segment_ids: Tensor, is_prefix: Optional[Tensor] = None
                   ) -> Tuple[SegmentLayout, Tensor, Tensor]:
    """``(layout, cu_seqlens, segment_gather_index)`` of CPU ``segment_ids`` ``[b, s]`` (and
    ``is_prefix`` ``[b, s]``), as the module doc describes them. Raises ValueError for a segment that
    is not one contiguous run."""
    if segment_ids.device.type != "cpu":
        raise ValueError(f"segment_layout runs on the host before the transfer; segment_ids is on "
                         f"{segment_ids.device}")
    if segment_ids.dim() != 2:
        raise ValueError(f"segment_ids must be [batch, seq], got {tuple(segment_ids.shape)}")
    if is_prefix is not None and is_prefix.shape != segment_ids.shape:
        raise ValueError(f"is_prefix has shape {tuple(is_prefix.shape)}, expected "
                         f"{tuple(segment_ids.shape)}")
    seg = segment_ids.numpy()
    b, s = seg.shape
    change = np.ones((b, s), dtype=bool)
    change[:, 1:] = seg[:, 1:] != seg[:, :-1]
    starts = np.flatnonzero(change)
    _check_contiguous(seg, starts)
    lengths = np.diff(np.append(starts, b * s))
    if is_prefix is not None:
        prefix = np.add.reduceat(is_prefix.reshape(-1).numpy().astype(np.int64), starts)
    else:
        prefix = np.zeros(len(starts), dtype=np.int64)
    padded = bucket_lengths(lengths, s)
    has_prefix = prefix > 0
    buckets, gather = [], []
    for length, with_prefix in sorted(set(zip(padded.tolist(), has_prefix.tolist(), strict=True))):
        members = np.flatnonzero((padded == length) & (has_prefix == with_prefix))
        slots = np.arange(length)[None, :]
        index = starts[members, None] + slots
        index[slots >= lengths[members, None]] = -1
        buckets.append((int(length), len(members), bool(with_prefix)))
        gather.append(index.reshape(-1))
    layout = SegmentLayout(b, s, tuple(starts.tolist()), tuple(lengths.tolist()),
                           tuple(prefix.tolist()), tuple(buckets))
    return layout, padded_cu_seqlens(segment_ids), torch.from_numpy(np.concatenate(gather))
