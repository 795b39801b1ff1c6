"""Transformer Engine core attention that honours the batch's attention structure.

megatron-core's ``TEDotProductAttention`` runs the mask type fixed in the layer spec (causal for
GPT), which would silently let packed documents and prefix-LM inputs attend causally across the
whole sample. :class:`TEStructuredAttention` (built by :func:`te_structured_attention_class`, as
TE imports only on GPU installs) instead derives TE's arguments from the
:class:`~megatron.model.masks.AttentionStructure` of each batch (:func:`te_forward_kwargs`):

- no structure: ``attn_mask_type="causal"`` (flash / cuDNN fused kernels);
- segments without prefixes (packed pretraining, causal T0): TE's packed ``thd`` format, every
  segment (padding included) one sequence of ``cu_seqlens``, ``attn_mask_type="padding_causal"``
  (flash / fused varlen kernels; q, k, v are reshaped ``[s, b, h, d] -> [b * s, h, d]`` and back);
- prefixes (``--prefix-lm``): ``attn_mask_type="arbitrary"`` with the dense mask (True = masked),
  built once per micro batch on the device;
- ALiBi: ``core_attention_bias_type="alibi"`` with this rank's slopes (TE builds the bias,
  ``-slope * |q - k|``, which equals this package's ``slope * (k - q)`` wherever attention is
  causal); with a prefix, where keys after the query are visible, the bias
  ``slope * (k - q)`` itself as ``post_scale_bias`` (``[1, heads, s, s]``), so every backend
  computes the same function.

``--attention-backend flash|fused|unfused`` restrict TE to one kernel family through TE's
``NVTE_FLASH_ATTN`` / ``NVTE_FUSED_ATTN`` / ``NVTE_UNFUSED_ATTN`` switches (as Megatron-LM does).
"""
from typing import Dict, Optional

import torch
from torch import Tensor

from megatron.model.alibi import alibi_bias, alibi_slope_list
from megatron.model.masks import AttentionStructure, dense_allowed_mask

TE_KERNEL_ENV = {"flash": "NVTE_FLASH_ATTN", "fused": "NVTE_FUSED_ATTN", "unfused": "NVTE_UNFUSED_ATTN"}


def te_kernel_environment(kernel: Optional[str]) -> Dict[str, str]:
    """The environment switches that restrict TE's attention to ``kernel`` (flash, fused or
    unfused): that one on, the others off; empty for None (TE chooses)."""
    if kernel is None:
        return {}
    if kernel not in TE_KERNEL_ENV:
        raise ValueError(f"unknown Transformer Engine attention kernel {kernel!r}")
    return {env: "1" if name == kernel else "0" for name, env in TE_KERNEL_ENV.items()}


def thd_sequences(structure: AttentionStructure, device) -> Dict:
    """TE's ``thd`` description of a segments-only batch flattened sample-major to ``b * s`` tokens:
    ``cu_seqlens`` (int32, on ``device``: the start of every segment, then ``b * s``) and
    ``max_seqlen`` (the longest segment), from the host layout the loader computed, with no host
    sync. Without a layout (a pipeline stage receives device tensors only) the fixed-length
    ``cu_seqlens`` (zero-length sequences after the last segment) and the sequence length as the
    ``max_seqlen`` bound."""
    cu_seqlens = structure.cu_seqlens.to(device)
    layout = structure.layout
    if layout is None:
        return {"cu_seqlens": cu_seqlens, "max_seqlen": structure.seq_length}
    return {"cu_seqlens": cu_seqlens[:layout.num_segments + 1], "max_seqlen": layout.max_seqlen}


def te_forward_kwargs(structure: Optional[AttentionStructure], seq_length: int, device,
                      alibi_slopes: Optional[Tensor], dtype: torch.dtype = torch.float32) -> Dict:
    """Keyword arguments for TE ``DotProductAttention.forward`` after q, k, v (see the module
    docstring): ``attention_mask``, ``attn_mask_type`` (with ``qkv_format="thd"`` and the
    ``cu_seqlens`` / ``max_seqlen`` of each segment for segments-only batches) and, with ALiBi, the
    bias type and slopes (or the bias itself, in ``dtype``)."""
    if structure is None:
        kwargs = {"attention_mask": None, "attn_mask_type": "causal"}
    elif structure.is_prefix is None:
        thd = structure.cached(("te_thd", device), lambda: thd_sequences(structure, device))
        kwargs = {"attention_mask": None, "attn_mask_type": "padding_causal", "qkv_format": "thd",
                  "cu_seqlens_q": thd["cu_seqlens"], "cu_seqlens_kv": thd["cu_seqlens"],
                  "max_seqlen_q": thd["max_seqlen"], "max_seqlen_kv": thd["max_seqlen"]}
    else:
        masked = structure.cached(("te_masked", device),
                                  lambda: ~dense_allowed_mask(structure, seq_length, device))
        kwargs = {"attention_mask": masked, "attn_mask_type": "arbitrary"}
    if alibi_slopes is None:
        return kwargs
    if structure is not None and structure.is_prefix is not None:
        bias = structure.cached(("te_alibi", device, dtype), lambda: alibi_bias(
            alibi_slopes.to(device), seq_length, seq_length)[None].to(dtype))
        kwargs.update(core_attention_bias_type="post_scale_bias", core_attention_bias=bias)
    else:
        kwargs.update(core_attention_bias_type="alibi", alibi_slopes=alibi_slopes)
    return kwargs


def te_structured_attention_class():
    """The TE core-attention class (imports Transformer Engine; call only when it is installed)."""
    import transformer_engine.pytorch as te_pytorch
    from megatron.core.extensions.transformer_engine import TEDotProductAttention

    class TEStructuredAttention(TEDotProductAttention):
        """megatron-core's TE core attention driven by the batch's AttentionStructure."""

        backend_name = "te"

        def __init__(self, config, layer_number, attn_mask_type, attention_type, *args,
                     alibi: bool = False, **kwargs):
            super().__init__(config, layer_number, attn_mask_type, attention_type, *args, **kwargs)
            self.alibi_slope_values = None
            if alibi:
                from megatron.core import parallel_state

                tp_size = parallel_state.get_tensor_model_parallel_world_size()
                tp_rank = parallel_state.get_tensor_model_parallel_rank()
                per_rank = config.num_attention_heads // tp_size
                self.alibi_slope_values = alibi_slope_list(config.num_attention_heads)[
                    tp_rank * per_rank:(tp_rank + 1) * per_rank]
            self._slopes_on = {}  # device -> the slopes tensor, built once

        def forward(self, query, key, value, attention_mask, attn_mask_type=None,
                    attention_bias=None, packed_seq_params=None, **unused):
            if attention_mask is not None or attention_bias is not None:
                raise ValueError("TEStructuredAttention takes the batch's AttentionStructure, not a "
                                 "dense attention_mask / attention_bias")
            if packed_seq_params is not None and not isinstance(packed_seq_params, AttentionStructure):
                raise ValueError("TEStructuredAttention expects an AttentionStructure in packed_seq_params")
            slopes = None
            if self.alibi_slope_values is not None:
                if query.device not in self._slopes_on:
                    self._slopes_on[query.device] = torch.tensor(
                        self.alibi_slope_values, dtype=torch.float32, device=query.device)
                slopes = self._slopes_on[query.device]
            s, b = query.shape[:2]
            kwargs = te_forward_kwargs(packed_seq_params, s, query.device, slopes, query.dtype)
            if kwargs.get("qkv_format") != "thd":
                return te_pytorch.DotProductAttention.forward(self, query, key, value, **kwargs)
            # [s, b, h, d] -> [b * s, h, d] (sample-major, as cu_seqlens counts) and back
            q, k, v = (t.transpose(0, 1).reshape(b * s, *t.shape[2:]) for t in (query, key, value))
            out = te_pytorch.DotProductAttention.forward(self, q, k, v, **kwargs)
            return out.reshape(b, s, -1).transpose(0, 1).contiguous()

    return TEStructuredAttention
