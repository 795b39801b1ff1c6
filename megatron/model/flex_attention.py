"""Core attention on FlexAttention (``torch.nn.attention.flex_attention``, ``--attention-backend flex``).

The batch's structure becomes a ``BlockMask`` (megatron/model/masks.py ``block_mask``: tiles no query
of a block may see are skipped, so packed documents cost what they contain) and ALiBi a ``score_mod``
(``score + slope[h] * (k - q)``). The block mask is built once per micro batch and shared by all
layers. On GPU the kernel is ``torch.compile``d; on CPU torch's FlexAttention has no backward, so
this backend serves CPU forward passes only (evaluation, tests) and training never selects it there.
FlexAttention has no attention dropout (``--attention-dropout`` must be 0).
"""
from typing import Dict, Optional, Tuple

import torch
from torch import Tensor

from megatron.model.core_attention import StructuredCoreAttention
from megatron.model.masks import AttentionStructure, block_mask


class _CompiledFlex:
    """``torch.compile(flex_attention)``, compiled on first GPU use (eager on CPU)."""

    def __init__(self):
        self._compiled = None

    def __call__(self, q, k, v, **kwargs):
        from torch.nn.attention.flex_attention import flex_attention

        if q.device.type == "cpu":
            return flex_attention(q, k, v, **kwargs)
        if self._compiled is None:
            self._compiled = torch.compile(flex_attention, dynamic=False)
        return self._compiled(q, k, v, **kwargs)


flex_attention_kernel = _CompiledFlex()


def alibi_score_mod(slopes: Tensor):
    """FlexAttention ``score_mod`` adding ALiBi: ``score + slopes[h] * (kv_idx - q_idx)``."""

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx).to(torch.float32)

    return score_mod


def flex_attend(q: Tensor, k: Tensor, v: Tensor, structure: Optional[AttentionStructure],
                scale: float, slopes: Optional[Tensor] = None, mask=None) -> Tensor:
    """FlexAttention of ``[b, n, s, h]`` q, k, v under ``structure`` (causal when None) with
    optional ALiBi ``slopes``; ``mask`` is a prebuilt ``BlockMask`` of the structure."""
    if mask is None:
        mask = block_mask(structure, q.shape[2], q.device)
    score_mod = alibi_score_mod(slopes) if slopes is not None else None
    return flex_attention_kernel(q, k, v, block_mask=mask, score_mod=score_mod, scale=scale)


class FlexCoreAttention(StructuredCoreAttention):
    """FlexAttention core attention for megatron-core layer specs (see the module docstring)."""

    backend_name = "flex"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.attention_dropout.p > 0:
            raise ValueError(f"FlexAttention has no attention dropout; --attention-dropout "
                             f"{self.attention_dropout.p} must be 0 with --attention-backend flex")
        self._causal_masks: Dict[Tuple[int, torch.device], object] = {}

    def attend(self, q, k, v, structure):
        s = q.shape[2]
        if structure is None:
            key = (s, q.device)
            if key not in self._causal_masks:
                self._causal_masks[key] = block_mask(None, s, q.device)
            mask = self._causal_masks[key]
        else:
            mask = structure.cached(("block_mask", q.device), lambda: block_mask(structure, s, q.device))
        return flex_attend(q, k, v, structure, self.softmax_scale, self.alibi_slopes(q.device), mask)
