"""Tensor-parallel shards and vocabulary rows: merging megatron-core's shards into the full
(tensor-parallel 1) tensor, cutting a full tensor into one rank's or every rank's shard, and
resizing the padded vocabulary rows.

megatron-core splits a parameter along ``partition_dim`` with ``partition_stride``: rank r holds
chunks r, r + TP, ... (``stride`` of them, each 1/stride of its shard) of the full tensor
(``_initialize_affine_weight_cpu``); SwiGLU's ``linear_fc1`` has stride 2 (each shard
``[gate_r; up_r]``).
"""
from typing import List, Optional, Sequence, Tuple

import torch


def merge_shards(shards: List[torch.Tensor], dim: int, stride: int) -> torch.Tensor:
    """The full tensor of tensor-parallel ``shards`` (rank order) split along ``dim`` with
    ``stride``: each shard is ``stride`` chunks; the full tensor is chunk 0 of every rank, then
    chunk 1 of every rank ... (inverse of megatron-core's ``_initialize_affine_weight_cpu``)."""
    if len(shards) == 1:
        return shards[0]
    if stride == 1:
        return torch.cat(shards, dim=dim)
    per_rank = [torch.split(s, s.shape[dim] // stride, dim=dim) for s in shards]
    return torch.cat([chunks[k] for k in range(stride) for chunks in per_rank], dim=dim)


def merge_tp_shards(shards: Sequence[torch.Tensor], dim: Optional[int],
                    stride: int = 1) -> torch.Tensor:
    """:func:`merge_shards`, where a replicated parameter (``dim`` None) is its first shard."""
    return shards[0] if dim is None else merge_shards(list(shards), dim, stride)


def split_full(full: torch.Tensor, dim: int, stride: int, tp_size: int) -> List[torch.Tensor]:
    """Inverse of :func:`merge_shards`: the ``tp_size`` shards megatron-core gives each rank."""
    chunks = torch.split(full, full.shape[dim] // (stride * tp_size), dim=dim)
    return [torch.cat(chunks[r::tp_size], dim=dim).clone() for r in range(tp_size)]


def tp_shard(full: torch.Tensor, dim: Optional[int], stride: int, tp_rank: int,
             tp_size: int) -> torch.Tensor:
    """Rank ``tp_rank``'s shard of ``full`` out of ``tp_size``, as megatron-core splits it (only
    this rank's shard is built, unlike :func:`split_full`)."""
    if dim is None or tp_size == 1:
        return full
    chunks = torch.chunk(full, stride * tp_size, dim=dim)
    return torch.cat(chunks[tp_rank::tp_size], dim=dim)


def resize_vocab_rows(full: torch.Tensor, rows: int) -> torch.Tensor:
    """``full`` with ``rows`` rows along dim 0: truncated (dropping padding rows only, as both
    padded sizes hold every real token) or extended with zero rows."""
    if full.shape[0] >= rows:
        return full[:rows]
    return torch.cat([full, full.new_zeros((rows - full.shape[0], *full.shape[1:]))])


def full_shape(shape: Sequence[int], dim: Optional[int], tp_size: int) -> Tuple[int, ...]:
    """The tensor-parallel-1 shape of a local shard of ``shape`` split along ``dim``."""
    shape = list(shape)
    if dim is not None:
        shape[dim] *= tp_size
    return tuple(shape)
