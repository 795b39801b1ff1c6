"""Evaluation loss by position bucket (``--eval-position-buckets`` / ``--eval-position-bucket-edges``,
megatron/config/eval_flags.py): which tokens of a sample fall in which range of positions, and the
loss sum and loss-token count of each range, so a context extension can be judged by the loss past
the old context length next to the loss inside it.

The loss of the token at position ``p`` (0-based) is that of predicting the token after it from the
``p + 1`` tokens of its context, so bucket ``[lo, hi)`` holds the predictions made with ``lo + 1`` to
``hi`` tokens of context. Positions are counted per ``basis``:

- ``context``: within the tokens the token attends to: within its document (its segment) when the
  batch carries document masks (``segment_ids``: ``--reset-attention-mask``, packed T0 samples),
  else within the sequence;
- ``sequence``: within the sequence, whatever the masks.

Plain torch; of the project it imports only the records' tag prefix (megatron/metrics/records.py)."""
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from megatron.metrics.records import POSITION_LOSS_PREFIX

BASES = ("context", "sequence")


@dataclass(frozen=True)
class PositionBuckets:
    """The buckets ``[bounds[i], bounds[i+1])`` of token positions (``bounds``: increasing, from 0
    to the sequence length, in tokens) and how positions are counted (``basis``, module
    docstring)."""

    bounds: Tuple[int, ...]
    basis: str = "context"

    def __post_init__(self):
        if len(self.bounds) < 2 or self.bounds[0] != 0 or any(
                b <= a for a, b in zip(self.bounds, self.bounds[1:], strict=False)):
            raise ValueError(f"position bucket bounds {list(self.bounds)} must increase from 0")
        if self.basis not in BASES:
            raise ValueError(f"position bucket basis {self.basis!r}: one of {', '.join(BASES)}")

    @property
    def count(self) -> int:
        """The number of buckets."""
        return len(self.bounds) - 1

    @property
    def ranges(self) -> Tuple[Tuple[int, int], ...]:
        """``(lo, hi)`` of each bucket, positions ``lo <= p < hi``."""
        return tuple(zip(self.bounds[:-1], self.bounds[1:], strict=True))

    def positions(self, shape: Tuple[int, int], segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The position of each token of a ``[b, s]`` batch (int64, tokens from 0): the index in
        the sequence, or, under the ``context`` basis with ``segment_ids`` (each segment one
        contiguous run of tokens), the index within the token's segment."""
        b, s = shape
        index = torch.arange(s, dtype=torch.int64).expand(b, s)
        if self.basis == "sequence" or segment_ids is None:
            return index.clone()
        segments = torch.as_tensor(segment_ids).to("cpu")
        starts = torch.ones(b, s, dtype=torch.bool)
        starts[:, 1:] = segments[:, 1:] != segments[:, :-1]
        first = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
        return index - first

    def bucket_ids(self, shape: Tuple[int, int], segment_ids: Optional[torch.Tensor] = None) -> torch.Tensor:
        """The bucket of each token of a ``[b, s]`` batch (int64 in ``[0, count)``); positions at
        or past the last bound fall in the last bucket."""
        inner = torch.tensor(self.bounds[1:-1], dtype=torch.int64)
        return torch.bucketize(self.positions(shape, segment_ids), inner, right=True)

    def sums(self, per_token: torch.Tensor, loss_mask: torch.Tensor, bucket_ids: torch.Tensor) -> torch.Tensor:
        """``[2, count]`` float64 on ``per_token``'s device: row 0 the sum of ``per_token x
        loss_mask`` (nats) of each bucket's tokens, row 1 the sum of ``loss_mask`` (loss tokens; a
        weighted mask weighs each token) of each bucket. Masked tokens add nothing."""
        device = per_token.device
        mask = loss_mask.to(device).double().reshape(-1)
        ids = bucket_ids.to(device).reshape(-1)
        out = torch.zeros(2, self.count, dtype=torch.float64, device=device)
        out[0].index_add_(0, ids, per_token.detach().double().reshape(-1) * mask)
        out[1].index_add_(0, ids, mask)
        return out


def bucket_tag(lo: int, hi: int) -> str:
    """The record key of bucket ``[lo, hi)``'s loss: ``lm_loss_pos_{lo}_{hi}``."""
    return f"{POSITION_LOSS_PREFIX}{lo}_{hi}"


def bucket_tokens_tag(lo: int, hi: int) -> str:
    """The record key of bucket ``[lo, hi)``'s loss-token count: ``tokens_pos_{lo}_{hi}``."""
    return f"tokens_pos_{lo}_{hi}"


def bucket_fields(buckets: PositionBuckets, totals: torch.Tensor) -> dict:
    """The record fields of ``totals`` (``[2, count]``: loss sums in nats and loss tokens, summed
    over the replicas): each bucket's mean loss (nats per loss token, :func:`bucket_tag`) and its
    loss tokens (:func:`bucket_tokens_tag`); a bucket without loss tokens is left out."""
    fields = {}
    for i, (lo, hi) in enumerate(buckets.ranges):
        tokens = float(totals[1, i])
        if tokens > 0:
            fields[bucket_tag(lo, hi)] = float(totals[0, i]) / tokens
            fields[bucket_tokens_tag(lo, hi)] = tokens
    return fields
