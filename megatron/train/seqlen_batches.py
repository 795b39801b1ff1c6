"""Training micro batches at the sequence-length curriculum's length (docs/seqlen_curriculum.md).

:func:`cut_batch` gives a collated micro batch (host tensors, ``[b, s]`` per-token fields) at ``k``
tokens per sample:

* ``truncate`` (Microsoft Megatron-DeepSpeed's ``get_batch``/``get_batch_pipe``): every per-token
  field keeps its first ``k`` positions (tokens, labels, loss mask, positions, and a packed
  batch's segment ids and prefix flags, which stay consistent: a prefix of contiguous segments is
  contiguous);
* ``split`` (OLMo-core's ``melt_batch``): every sample becomes ``s / k`` samples of ``k`` tokens,
  in order (per-sample fields repeat for each); each new sample's positions restart at 0 for the
  document it begins inside (later documents keep their own positions), so the model sees it as
  a sample of its own, as rotary embeddings do.

The attention structure of a packed batch (megatron/model/masks.py) is recomputed for the cut
batch. :class:`SeqLengthBatches` wraps the loop's training iterator; the loop sets the length
before each iteration. Evaluation reads its own iterators and runs at the full length.
"""
from typing import Dict, Iterator, Optional

import torch

from megatron.model.masks import (
    CU_SEQLENS_KEY,
    SEGMENT_GATHER_INDEX_KEY,
    SEGMENT_LAYOUT_KEY,
    with_segment_layout,
)
from megatron.schedules.seqlen_plan import SeqLengthPlan

_LAYOUT_KEYS = (CU_SEQLENS_KEY, SEGMENT_GATHER_INDEX_KEY, SEGMENT_LAYOUT_KEY)


def _split_positions(positions: torch.Tensor) -> torch.Tensor:
    """``[rows, k]`` position ids of rows cut from longer samples: the run that continues from
    the row before (up to the row's first position reset) restarts at 0."""
    steps = positions[:, 1:] != positions[:, :-1] + 1
    before_reset = torch.cat([torch.ones_like(positions[:, :1], dtype=torch.bool),
                              torch.cumsum(steps.long(), dim=1) == 0], dim=1)
    return torch.where(before_reset, positions - positions[:, :1], positions)


def cut_batch(batch: Dict, length: int, mode: str) -> Dict:
    """``batch`` with ``length`` tokens per sample (``mode`` ``truncate`` or ``split``; see the
    module docstring). Per-token fields are the ``[b, s]`` tensors with the batch's ``tokens``
    width ``s``; ``[b]`` tensors are per-sample fields. ``length >= s``: unchanged."""
    width = batch["tokens"].shape[1]
    if length >= width:
        return batch
    out = {key: value for key, value in batch.items() if key not in _LAYOUT_KEYS}
    if mode == "split" and width % length:
        raise ValueError(f"split mode: {width} tokens per sample is not a multiple of {length}")
    parts = width // length
    for key, value in out.items():
        if not isinstance(value, torch.Tensor):
            continue
        if value.dim() == 2 and value.shape[1] == width:
            value = value[:, :length] if mode == "truncate" else value.reshape(-1, length)
            out[key] = value.contiguous()
        elif mode == "split" and value.dim() >= 1 and value.shape[0] == batch["tokens"].shape[0]:
            out[key] = value.repeat_interleave(parts, dim=0)
    if mode == "split" and "position_ids" in out:
        out["position_ids"] = _split_positions(out["position_ids"])
    return with_segment_layout(out)


class SeqLengthBatches:
    """The training iterator's micro batches cut to the plan's length of the current iteration
    (:meth:`start_iteration` sets it; full-length batches pass unchanged)."""

    def __init__(self, iterator: Iterator[Dict], plan: SeqLengthPlan):
        self.iterator = iterator
        self.plan = plan
        self.length: Optional[int] = None

    def start_iteration(self, completed: int) -> int:
        """Set and return the length (tokens per sample) of the iteration after ``completed``
        completed iterations."""
        self.length = self.plan.length_at(completed)
        return self.length

    def __iter__(self):
        return self

    def __next__(self) -> Dict:
        batch = next(self.iterator)
        if self.length is None or self.length >= self.plan.full_length:
            return batch
        return cut_batch(batch, self.length, self.plan.mode)
