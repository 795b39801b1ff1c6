"""Core attention on ``torch.nn.functional.scaled_dot_product_attention`` (``--attention-backend
sdpa``, and ``local``): the reference backend, and the one CPU training uses.

Forms built on the device from the batch's :class:`~megatron.model.masks.AttentionStructure`:

- no structure: SDPA's own causal masking (flash / memory-efficient kernels on GPU);
- packed segments: one SDPA call per segment (each causal, with a small dense mask only where the
  segment has a prefix or ALiBi), so a sample of ``k`` documents costs the sum of their squared
  lengths, not ``seq_length**2``, in time and memory;
- a prefix without segments: the dense ``[b, 1, s, s]`` mask (:func:`sdpa_dense`).

ALiBi enters as a float ``attn_mask`` (bias, ``-inf`` where masked).
"""
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from megatron.model.alibi import alibi_bias
from megatron.model.core_attention import StructuredCoreAttention
from megatron.model.masks import AttentionStructure, dense_allowed_mask, segment_runs


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
               scale: float, dropout_p: float = 0.0, slopes: Optional[Tensor] = None) -> Tensor:
    """One SDPA call over the whole sequence with the dense mask of ``structure`` (q, k, v
    ``[b, n, s, h]``; ALiBi when ``slopes`` is given). The dense reference form."""
    mask = dense_sdpa_mask(structure, q.shape[2], q.device, slopes, q.dtype)
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


Run = Tuple[int, int, int, Optional[Tensor]]  # (sample, start, end, attn_mask or None = causal)


def segment_sdpa_runs(structure: AttentionStructure, device, slopes: Optional[Tensor],
                      dtype: torch.dtype) -> List[Run]:
    """Every segment of the batch as ``(sample, start, end, mask)``: ``mask`` is the segment's own
    dense SDPA mask (prefix and/or ALiBi), or None where plain causal attention is exact."""
    runs = []
    # decide on the host (one copy) which segments have a prefix; build their masks on the device
    host_prefix = None if structure.is_prefix is None else structure.is_prefix.cpu()
    for b, sample_runs in enumerate(segment_runs(structure)):
        for start, end in sample_runs:
            prefix = None
            if host_prefix is not None and bool(host_prefix[b, start:end].any()):
                prefix = structure.is_prefix[b:b + 1, start:end].to(device)
            local = AttentionStructure(is_prefix=prefix) if prefix is not None else None
            runs.append((b, start, end, dense_sdpa_mask(local, end - start, device, slopes, dtype)))
    return runs


def sdpa_segmentwise(q: Tensor, k: Tensor, v: Tensor, structure: AttentionStructure, scale: float,
                     dropout_p: float = 0.0, slopes: Optional[Tensor] = None) -> Tensor:
    """SDPA per segment (q, k, v ``[b, n, s, h]``): the same result as :func:`sdpa_dense`, at the
    cost of the segments' lengths. The runs are built once per structure (all layers share them)."""
    # every layer of one rank has the same heads, hence the same slopes
    key = ("sdpa_runs", q.device, q.dtype, slopes is not None)
    runs = structure.cached(key, lambda: segment_sdpa_runs(structure, q.device, slopes, q.dtype))
    rows, parts, row = [], [], 0
    for b, start, end, mask in runs:
        if b != row:
            rows.append(torch.cat(parts, dim=2))
            parts, row = [], b
        qs, ks, vs = (t[b:b + 1, :, start:end] for t in (q, k, v))
        if mask is None:
            parts.append(F.scaled_dot_product_attention(qs, ks, vs, dropout_p=dropout_p,
                                                        is_causal=True, scale=scale))
        else:
            parts.append(F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask,
                                                        dropout_p=dropout_p, scale=scale))
    rows.append(torch.cat(parts, dim=2))
    return torch.cat(rows, dim=0)


class SDPAttention(StructuredCoreAttention):
    """SDPA core attention for megatron-core layer specs (see the module docstring)."""

    backend_name = "sdpa"

    def attend(self, q, k, v, structure):
        slopes = self.alibi_slopes(q.device)
        if structure is not None and structure.segment_ids is not None:
            return sdpa_segmentwise(q, k, v, structure, self.softmax_scale, self.dropout_p(), slopes)
        return sdpa_dense(q, k, v, structure, self.softmax_scale, self.dropout_p(), slopes)
