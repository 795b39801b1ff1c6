"""Core attention on ``torch.nn.functional.scaled_dot_product_attention`` (``--attention-backend
sdpa``, and ``local``): the reference backend, and the one CPU training uses.

Forms built on the device from the batch's :class:`~megatron.model.masks.AttentionStructure`, once
per micro batch (cached on the structure, so all layers share them):

- no structure: SDPA's own causal masking (flash / memory-efficient kernels on GPU); with ALiBi the
  causal bias ``[1, n, s, s]``, which depends on the sequence length only and is built once for all
  layers and micro batches (:class:`~megatron.model.core_attention.SharedAttentionForms`);
- packed segments with their host layout (megatron/model/segment_layout.py, computed by the loader):
  segments of similar length run together, each padded to its bucket's length (at most 25% or 64
  tokens longer), in one SDPA call per bucket (:func:`sdpa_segmentwise`): a sample of ``k``
  documents costs about the sum of their squared lengths, not ``seq_length**2``, in a handful of
  calls, with no host sync;
- a prefix without segments, or segments without a host layout (a pipeline stage, which receives
  only device tensors): the dense ``[b, 1, s, s]`` mask (:func:`sdpa_dense`).

ALiBi enters as a float ``attn_mask`` (bias, ``-inf`` where masked). Attention dropout draws from
megatron-core's model-parallel RNG stream (core_attention.py ``dropout_rng``), as megatron-core's
``DotProductAttention`` does, so tensor-parallel ranks drop different elements of their heads.
"""
import dataclasses
from typing import List, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from megatron.model.alibi import alibi_bias
from megatron.model.core_attention import StructuredCoreAttention
from megatron.model.masks import AttentionStructure, dense_allowed_mask


def dense_sdpa_mask(structure: Optional[AttentionStructure], seq_length: int, device,
                    slopes: Optional[Tensor], dtype: torch.dtype) -> Optional[Tensor]:
    """SDPA's ``attn_mask`` for the whole sequence: bool ``[b|1, 1, s, s]`` (True = attend), or,
    with ALiBi ``slopes`` [n], float ``[b|1, n, s, s]`` bias with ``-inf`` where masked; None when
    plain causal SDPA suffices."""
    if structure is None and slopes is None:
        return None
    allowed = dense_allowed_mask(structure, seq_length, device)
    if slopes is None:
        return allowed
    bias = alibi_bias(slopes, seq_length, seq_length).to(device=device, dtype=dtype)[None]
    return bias.masked_fill(~allowed, float("-inf"))


def sdpa_dense(q: Tensor, k: Tensor, v: Tensor, structure: Optional[AttentionStructure],
               scale: float, dropout_p: float = 0.0, slopes: Optional[Tensor] = None,
               shared=None) -> Tensor:
    """One SDPA call over the whole sequence with the dense mask of ``structure`` (q, k, v
    ``[b, n, s, h]``; ALiBi when ``slopes`` is given). The dense reference form. The mask is cached
    on ``structure``, or, for plain causal attention with ALiBi, on ``shared`` (a
    :class:`~megatron.model.core_attention.SharedAttentionForms`) when given."""
    s = q.shape[2]
    key = ("sdpa_dense", s, q.device, q.dtype, slopes is not None)
    build = lambda: dense_sdpa_mask(structure, s, q.device, slopes, q.dtype)  # noqa: E731
    if structure is not None:
        mask = structure.cached(key, build)
    elif shared is not None:
        mask = shared.cached(key, build)
    else:
        mask = build()
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


@dataclasses.dataclass
class SegmentBuckets:
    """The device side of a layout's SDPA buckets: ``source`` [R] (the token each padded slot reads;
    padding slots read their segment's start), ``token_slot`` [b*s] (the slot holding each token's
    output) and, per bucket, the ``[count, padded length]`` prefix flags (None without prefix)."""

    source: Tensor
    token_slot: Tensor
    prefix: List[Optional[Tensor]]


def segment_buckets(structure: AttentionStructure, device) -> SegmentBuckets:
    """:class:`SegmentBuckets` of ``structure`` (which has a layout) on ``device``, from its
    ``segment_gather_index``, with device operations only."""
    layout = structure.layout
    index = structure.segment_gather_index.to(device)
    valid = index >= 0
    source = torch.where(valid, index, 0)
    total = layout.batch_size * layout.seq_length
    slots = torch.arange(index.numel(), device=device)
    token_slot = torch.zeros(total + 1, dtype=torch.long, device=device).scatter_(
        0, torch.where(valid, index, total), slots)[:total]  # padding slots land on the dropped last
    prefix, offset = [], 0
    flags = None
    if structure.is_prefix is not None:
        flags = structure.is_prefix.to(device).reshape(-1).index_select(0, source) & valid
    for length, count, has_prefix in layout.buckets:
        rows = slice(offset, offset + count * length)
        prefix.append(flags[rows].view(count, length) if has_prefix else None)
        offset += count * length
    return SegmentBuckets(source, token_slot, prefix)


def bucket_masks(structure: AttentionStructure, buckets: SegmentBuckets, device,
                 slopes: Optional[Tensor], dtype: torch.dtype) -> List[Optional[Tensor]]:
    """Per bucket, SDPA's ``attn_mask`` over its padded segments (None: plain causal SDPA): causal,
    and both-prefix pairs bidirectional, bool ``[count|1, 1, L, L]``; with ALiBi the float bias
    ``slope * (k - q)`` with ``-inf`` where masked, ``[count|1, n, L, L]``. Positions are the
    segment's own, so a segment attends exactly as it would alone."""
    masks = []
    for (length, _, _), prefix in zip(structure.layout.buckets, buckets.prefix, strict=True):
        if prefix is None and slopes is None:
            masks.append(None)
            continue
        allowed = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        if prefix is not None:
            allowed = allowed | (prefix[:, :, None] & prefix[:, None, :])
        allowed = allowed.view(-1, 1, length, length)
        if slopes is not None:
            bias = alibi_bias(slopes, length, length).to(device=device, dtype=dtype)[None]
            allowed = bias.masked_fill(~allowed, float("-inf"))
        masks.append(allowed)
    return masks


def sdpa_segmentwise(q: Tensor, k: Tensor, v: Tensor, structure: AttentionStructure, scale: float,
                     dropout_p: float = 0.0, slopes: Optional[Tensor] = None) -> Tensor:
    """SDPA per segment, vectorised (q, k, v ``[b, n, s, h]``): the same result as
    :func:`sdpa_dense`, at the cost of the segments' (bucket-padded) lengths, one SDPA call per
    bucket of the structure's host layout. Without a layout (device tensors only) the dense form."""
    layout = structure.layout
    if layout is None:
        return sdpa_dense(q, k, v, structure, scale, dropout_p, slopes)
    b, n, s, h = q.shape
    buckets = structure.cached(("sdpa_buckets", q.device),
                               lambda: segment_buckets(structure, q.device))
    masks = structure.cached(("sdpa_bucket_masks", q.device, q.dtype, slopes is not None),
                             lambda: bucket_masks(structure, buckets, q.device, slopes, q.dtype))
    sizes = [count * length for length, count, _ in layout.buckets]
    # split, not slices: its backward concatenates the buckets' gradients instead of filling a
    # zero tensor of all slots per bucket
    parts = [t.transpose(1, 2).reshape(b * s, n, h).index_select(0, buckets.source).split(sizes)
             for t in (q, k, v)]
    outputs = []
    for (length, count, _), mask, *qkv in zip(layout.buckets, masks, *parts, strict=True):
        qs, ks, vs = (t.view(count, length, n, h).transpose(1, 2) for t in qkv)
        if mask is None:
            out = F.scaled_dot_product_attention(qs, ks, vs, dropout_p=dropout_p, is_causal=True,
                                                 scale=scale)
        else:
            out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, dropout_p=dropout_p,
                                                 scale=scale)
        outputs.append(out.transpose(1, 2).reshape(count * length, n, h))
    out = torch.cat(outputs).index_select(0, buckets.token_slot)
    return out.view(b, s, n, h).transpose(1, 2)


class SDPAttention(StructuredCoreAttention):
    """SDPA core attention for megatron-core layer specs (see the module docstring)."""

    backend_name = "sdpa"

    def attend(self, q, k, v, structure):
        slopes = self.alibi_slopes(q.device)
        with self.dropout_rng():
            if structure is not None and structure.segment_ids is not None:
                return sdpa_segmentwise(q, k, v, structure, self.softmax_scale, self.dropout_p(),
                                        slopes)
            return sdpa_dense(q, k, v, structure, self.softmax_scale, self.dropout_p(), slopes,
                              shared=self.shared_forms)
