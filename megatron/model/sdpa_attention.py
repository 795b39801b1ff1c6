"""Core attention built on ``torch.nn.functional.scaled_dot_product_attention``.

megatron-core's local ``DotProductAttention`` allocates CUDA buffers; this module keeps its
constructor (head partitioning, softmax scale, dropout probability) and replaces the forward with
SDPA, which runs on CPU and GPU alike and dispatches to flash / memory-efficient kernels on GPU.
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


class SDPAttention(DotProductAttention):
    """Drop-in core attention for megatron-core layer specs.

    Inputs follow megatron-core's layout: query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]``.
    ``attention_mask`` follows megatron-core's convention: a bool tensor broadcastable to
    ``[b, np, sq, sk]`` where ``True`` means *masked out*. When it is ``None`` and the layer is
    causal, SDPA's built-in causal masking is used. Returns ``[sq, b, np * hn]``.
    """

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Optional[Tensor],
        attn_mask_type: Optional[AttnMaskType] = None,
        attention_bias: Optional[Tensor] = None,
        packed_seq_params: Optional[PackedSeqParams] = None,
    ) -> Tensor:
        """Compute softmax(q k^T * scale + mask) v over all heads of this partition."""
        if packed_seq_params is not None:
            raise NotImplementedError("SDPAttention takes packed samples as an explicit attention_mask")
        if attention_bias is not None:
            raise NotImplementedError("SDPAttention does not support an attention bias")
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        # [s, b, n, h] -> [b, n, s, h]
        q = query.permute(1, 2, 0, 3)
        k = key.permute(1, 2, 0, 3)
        v = value.permute(1, 2, 0, 3)
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        dropout_p = self.attention_dropout.p if self.training else 0.0
        if attention_mask is None:
            is_causal = mask_type == AttnMaskType.causal
            context = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=self.softmax_scale
            )
        else:
            allowed = ~attention_mask.to(torch.bool)
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=allowed, dropout_p=dropout_p, scale=self.softmax_scale
            )
            # A query row with no allowed key (pure padding) yields NaN in SDPA; zero it.
            empty_rows = ~allowed.any(dim=-1, keepdim=True)
            if bool(empty_rows.any()):
                context = context.masked_fill(empty_rows, 0.0)
        # [b, n, s, h] -> [s, b, n * h]
        b, n, s, h = context.shape
        return context.permute(2, 0, 1, 3).reshape(s, b, n * h)
