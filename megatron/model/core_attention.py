"""The core-attention interface every backend of this package implements on top of megatron-core's.

megatron-core's ``SelfAttention`` calls its core attention with query ``[sq, b, np, hn]``, key/value
``[sk, b, ng, hn]``, an ``attention_mask`` and ``packed_seq_params``, and expects ``[sq, b, np * hn]``
back. Here ``attention_mask`` is always None: the batch's structure arrives as an
:class:`~megatron.model.masks.AttentionStructure` in ``packed_seq_params`` (None = plain causal), and
each backend builds its own form of it (see megatron/model/masks.py). With ALiBi the module adds
the slopes of the heads this tensor-parallel rank holds. Attention dropout draws from megatron-core's
model-parallel RNG stream (:meth:`StructuredCoreAttention.dropout_rng`), as its
``DotProductAttention`` does.
"""
import contextlib
from typing import Callable, Dict, Optional, Tuple

import torch
from megatron.core import tensor_parallel
from megatron.core.packed_seq_params import PackedSeqParams
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from torch import Tensor

from megatron.model.alibi import alibi_slope_list_for_partition
from megatron.model.masks import AttentionStructure


class SharedAttentionForms:
    """Forms that depend on shapes only, not on the batch (the causal ALiBi bias of a sequence
    length), built once and shared by every layer of a model: the layer spec hands all its core
    attentions one instance (``core_attention_spec``)."""

    def __init__(self):
        self._forms: Dict = {}

    def cached(self, key, build: Callable[[], object]):
        """``build()``, computed once per key."""
        if key not in self._forms:
            self._forms[key] = build()
        return self._forms[key]


class StructuredCoreAttention(DotProductAttention):
    """Base class: megatron-core's constructor (head partitioning, softmax scale, dropout) plus
    ``alibi`` (ALiBi slopes of this rank's heads), ``sequence_shard`` ((rank, size) in the
    DeepSpeed-Ulysses group: this module then attends with that share of the tensor-parallel
    rank's heads, megatron/parallel/ulysses.py) and ``shared_forms`` (a
    :class:`SharedAttentionForms` shared with the other layers; a private one when not given);
    subclasses implement :meth:`attend`."""

    backend_name = "?"

    def __init__(self, config, layer_number: int, attn_mask_type: AttnMaskType, attention_type: str,
                 attention_dropout: Optional[float] = None, softmax_scale: Optional[float] = None,
                 cp_comm_type: Optional[str] = None, pg_collection=None, alibi: bool = False,
                 shared_forms: Optional[SharedAttentionForms] = None,
                 sequence_shard: Tuple[int, int] = (0, 1)):
        super().__init__(config, layer_number, attn_mask_type, attention_type,
                         attention_dropout=attention_dropout, softmax_scale=softmax_scale,
                         cp_comm_type=cp_comm_type, pg_collection=pg_collection)
        self.shared_forms = shared_forms if shared_forms is not None else SharedAttentionForms()
        self.alibi_slope_values = None
        if alibi:
            sp_rank, sp_size = sequence_shard
            self.alibi_slope_values = alibi_slope_list_for_partition(
                config.num_attention_heads, self.tp_group.size(), self.tp_group.rank(),
                sp_size, sp_rank)
        self._slopes_on: Dict[torch.device, Tensor] = {}

    def alibi_slopes(self, device) -> Optional[Tensor]:
        """``[heads of this rank]`` float32 slopes on ``device`` (None without ALiBi). Kept as a
        Python list, not a buffer, so a bf16/fp16 cast of the model never rounds them."""
        if self.alibi_slope_values is None:
            return None
        if device not in self._slopes_on:
            self._slopes_on[device] = torch.tensor(self.alibi_slope_values, dtype=torch.float32,
                                                   device=device)
        return self._slopes_on[device]

    def dropout_p(self) -> float:
        """Attention dropout probability in training mode, 0 in eval mode."""
        return self.attention_dropout.p if self.training else 0.0

    def dropout_rng(self):
        """The context attention dropout runs in: megatron-core's model-parallel RNG stream
        (``get_cuda_rng_tracker().fork()``, seeded ``seed + 2718 + tp_rank``), as
        ``DotProductAttention.forward`` forks it, so each tensor-parallel rank drops its own
        elements; not under sequence parallelism, where the whole layer already runs on that
        stream (as in megatron-core). No fork without dropout."""
        if self.dropout_p() == 0 or self.config.sequence_parallel:
            return contextlib.nullcontext()
        return tensor_parallel.get_cuda_rng_tracker().fork()

    def forward(self, query: Tensor, key: Tensor, value: Tensor, attention_mask: Optional[Tensor],
                attn_mask_type: Optional[AttnMaskType] = None, attention_bias: Optional[Tensor] = None,
                packed_seq_params: Optional[PackedSeqParams] = None) -> Tensor:
        """softmax(q k^T * scale [+ ALiBi] under the batch's structure) v, ``[sq, b, np * hn]``."""
        if attention_mask is not None:
            raise ValueError(
                f"{type(self).__name__} takes the batch's attention structure (segment_ids / "
                "is_prefix as an AttentionStructure in packed_seq_params), not a dense attention_mask")
        if attention_bias is not None:
            raise NotImplementedError(f"{type(self).__name__} takes no attention_bias (ALiBi is built in)")
        if packed_seq_params is not None and not isinstance(packed_seq_params, AttentionStructure):
            raise ValueError(f"{type(self).__name__} expects an AttentionStructure, got "
                             f"{type(packed_seq_params).__name__} (qkv_format "
                             f"{packed_seq_params.qkv_format!r})")
        mask_type = attn_mask_type if attn_mask_type is not None else self.attn_mask_type
        if mask_type != AttnMaskType.causal:
            raise ValueError(f"{type(self).__name__} is a decoder attention: mask type {mask_type.name} "
                             "is not supported (bidirectional parts come from is_prefix)")
        groups = self.num_attention_heads_per_partition // self.num_query_groups_per_partition
        # [s, b, n, h] -> [b, n, s, h]
        q = query.permute(1, 2, 0, 3)
        k = key.permute(1, 2, 0, 3)
        v = value.permute(1, 2, 0, 3)
        if groups > 1:
            k = k.repeat_interleave(groups, dim=1)
            v = v.repeat_interleave(groups, dim=1)
        context = self.attend(q, k, v, packed_seq_params)
        b, n, s, h = context.shape
        return context.permute(2, 0, 1, 3).reshape(s, b, n * h)

    def attend(self, q: Tensor, k: Tensor, v: Tensor,
               structure: Optional[AttentionStructure]) -> Tensor:
        """``[b, n, s, h]`` attention output of ``[b, n, s, h]`` q, k, v (k, v already expanded to
        every query head)."""
        raise NotImplementedError
