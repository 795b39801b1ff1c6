"""How a batch describes its attention, and the forms each attention backend builds from it.

A batch carries its attention structure compactly, as fixed-shape per-token tensors (``s`` =
sequence length, ``b`` = micro batch):

- ``segment_ids`` ``[b, s]`` int32 (optional): the segment (packed document) of each token. A token
  attends only to tokens of its own segment; each segment is one contiguous run of tokens. T0
  packing numbers segments 1..k and padding 0 (padding then attends only to padding, which no loss
  reads); pretraining with ``--reset-attention-mask`` starts a new segment after every EOD token
  (megatron/data/document_segments.py).
- ``is_prefix`` ``[b, s]`` bool (optional, ``--prefix-lm``): the tokens of each segment's prefix
  (a T0 input). Prefix tokens of one segment attend to each other in both directions; every other
  pair stays causal. This is the per-token form of per-segment prefix lengths (a segment's prefix
  length is its number of prefix tokens), chosen so the shape is fixed per batch.
- neither: plain causal attention.

Query ``q`` may attend to key ``k`` exactly when (:func:`attend_allowed`)::

    same segment(q, k)  and  (k <= q  or  (is_prefix[q] and is_prefix[k]))

The model receives the structure as an :class:`AttentionStructure` (megatron-core passes it, as
``packed_seq_params``, untouched to every layer's core attention) and each backend builds its own
form on the device, once per forward (cached on the structure): a dense boolean mask for SDPA and
Transformer Engine's ``arbitrary`` mask, a ``BlockMask`` for FlexAttention, bucketed segments for
SDPA's per-segment path, TE's packed-format ``cu_seqlens``.

Where the segments lie (``cu_seqlens``, the longest segment, prefix lengths, SDPA's buckets) is
worked out on the host, in the loader's collate before the transfer (:func:`with_segment_layout`,
megatron/model/segment_layout.py), so no backend reads a device tensor back to the host.
"""
import dataclasses
from typing import Callable, Dict, Mapping, Optional

import torch
from megatron.core.packed_seq_params import PackedSeqParams
from torch import Tensor

from megatron.model.segment_layout import SegmentLayout, padded_cu_seqlens, segment_layout

SEGMENT_IDS_KEY = "segment_ids"
IS_PREFIX_KEY = "is_prefix"
CU_SEQLENS_KEY = "cu_seqlens"
SEGMENT_GATHER_INDEX_KEY = "segment_gather_index"
SEGMENT_LAYOUT_KEY = "segment_layout"


@dataclasses.dataclass
class AttentionStructure(PackedSeqParams):
    """The compact attention structure of one micro batch (see the module docstring), in the
    ``packed_seq_params`` slot megatron-core threads through ``GPTModel`` to the core attention.

    ``qkv_format`` stays ``sbhd`` (megatron-core reshapes nothing) and ``max_seqlen_q/kv`` is the
    sequence length (what megatron-core's rotary embedding sizes itself by). With segments,
    ``cu_seqlens`` is the fixed-length ``[b*s + 1]`` form of megatron/model/segment_layout.py
    (derived on the tensors' device when not given), and ``layout`` / ``segment_gather_index``
    the host layout and SDPA's gather index the loader computed (None on a pipeline stage, which
    receives device tensors only: backends then use forms that need no host integers). ``forms``
    caches what backends built from it, so all layers of one forward share one mask.
    """

    segment_ids: Optional[Tensor] = None
    is_prefix: Optional[Tensor] = None
    cu_seqlens: Optional[Tensor] = None
    segment_gather_index: Optional[Tensor] = None
    layout: Optional[SegmentLayout] = None
    forms: Dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        ref = self.segment_ids if self.segment_ids is not None else self.is_prefix
        if ref is None:
            raise ValueError("an AttentionStructure needs segment_ids or is_prefix (plain causal "
                             "attention is described by no structure at all)")
        if ref.dim() != 2:
            raise ValueError(f"segment_ids / is_prefix must be [batch, seq], got {tuple(ref.shape)}")
        for name in (SEGMENT_IDS_KEY, IS_PREFIX_KEY):
            t = getattr(self, name)
            if t is not None and t.shape != ref.shape:
                raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(ref.shape)}")
        if self.is_prefix is not None and self.is_prefix.dtype != torch.bool:
            self.is_prefix = self.is_prefix.bool()
        if self.segment_ids is None and (self.cu_seqlens is not None or self.layout is not None):
            raise ValueError("cu_seqlens / a segment layout describe segments: segment_ids missing")
        if self.segment_ids is not None and self.cu_seqlens is None:
            self.cu_seqlens = padded_cu_seqlens(self.segment_ids)
        b, s = ref.shape
        if self.cu_seqlens is not None and tuple(self.cu_seqlens.shape) != (b * s + 1,):
            raise ValueError(f"cu_seqlens has shape {tuple(self.cu_seqlens.shape)}, expected "
                             f"({b * s + 1},) (the fixed-length form of segment_layout.py)")
        if self.layout is not None:
            if (self.layout.batch_size, self.layout.seq_length) != (b, s):
                raise ValueError(f"segment layout of a [{self.layout.batch_size}, "
                                 f"{self.layout.seq_length}] batch given for [{b}, {s}] tensors")
            if self.segment_gather_index is None:
                raise ValueError("a segment layout comes with its segment_gather_index")
        self.qkv_format = "sbhd"
        self.max_seqlen_q = self.max_seqlen_kv = int(s)

    @property
    def batch_size(self) -> int:
        ref = self.segment_ids if self.segment_ids is not None else self.is_prefix
        return int(ref.shape[0])

    @property
    def seq_length(self) -> int:
        return self.max_seqlen_q

    def cached(self, key, build: Callable[[], object]):
        """``build()``, computed once per structure and key (one forward's layers share it)."""
        if key not in self.forms:
            self.forms[key] = build()
        return self.forms[key]

    def to(self, device, non_blocking: bool = False) -> "AttentionStructure":
        """This structure with its tensors on ``device`` (the host layout as it is; no forms)."""
        def move(t):
            return None if t is None else t.to(device, non_blocking=non_blocking)

        return AttentionStructure(
            segment_ids=move(self.segment_ids), is_prefix=move(self.is_prefix),
            cu_seqlens=move(self.cu_seqlens), segment_gather_index=move(self.segment_gather_index),
            layout=self.layout)


def attention_structure(segment_ids: Optional[Tensor] = None,
                        is_prefix: Optional[Tensor] = None) -> Optional[AttentionStructure]:
    """The structure of a batch from its tensors, or None for plain causal attention. On the CPU
    (the host side of the transfer) the segment layout is computed too (ValueError for a segment
    that is not one contiguous run); tensors already on a device get a structure without it."""
    if segment_ids is None and is_prefix is None:
        return None
    if segment_ids is None or segment_ids.device.type != "cpu":
        return AttentionStructure(segment_ids=segment_ids, is_prefix=is_prefix)
    layout, cu_seqlens, gather = segment_layout(segment_ids, is_prefix)
    return AttentionStructure(segment_ids=segment_ids, is_prefix=is_prefix, cu_seqlens=cu_seqlens,
                              segment_gather_index=gather, layout=layout)


def with_segment_layout(batch: Mapping[str, object]) -> Dict[str, object]:
    """``batch`` (CPU tensors: the loader's collated micro batch) with the host-computed segment
    description added when it has ``segment_ids``: ``cu_seqlens`` and ``segment_gather_index``
    (tensors, moved to the device with the batch) and ``segment_layout`` (host integers). A batch
    that has them, or has no segments, comes back unchanged. Raises ValueError for a segment that
    is not one contiguous run."""
    segment_ids = batch.get(SEGMENT_IDS_KEY)
    if segment_ids is None or SEGMENT_LAYOUT_KEY in batch:
        return dict(batch)
    layout, cu_seqlens, gather = segment_layout(segment_ids, batch.get(IS_PREFIX_KEY))
    return {**batch, CU_SEQLENS_KEY: cu_seqlens, SEGMENT_GATHER_INDEX_KEY: gather,
            SEGMENT_LAYOUT_KEY: layout}


def collate_with_segment_layout(samples):
    """The loader's ``collate_fn``: torch's default collate, then :func:`with_segment_layout`."""
    from torch.utils.data import default_collate

    return with_segment_layout(default_collate(samples))


def attention_structure_from_batch(batch: Mapping[str, Tensor]) -> Optional[AttentionStructure]:
    """The structure of a batch dict: its ``segment_ids`` / ``is_prefix`` (if any) with the segment
    description :func:`with_segment_layout` added (else :func:`attention_structure` of them)."""
    if batch.get(SEGMENT_LAYOUT_KEY) is None:
        return attention_structure(batch.get(SEGMENT_IDS_KEY), batch.get(IS_PREFIX_KEY))
    return AttentionStructure(segment_ids=batch[SEGMENT_IDS_KEY], is_prefix=batch.get(IS_PREFIX_KEY),
                              cu_seqlens=batch[CU_SEQLENS_KEY],
                              segment_gather_index=batch[SEGMENT_GATHER_INDEX_KEY],
                              layout=batch[SEGMENT_LAYOUT_KEY])


# ---------------------------------------------------------------------------- the one rule
def attend_allowed(q_idx: Tensor, k_idx: Tensor, q_seg: Optional[Tensor], k_seg: Optional[Tensor],
                   q_prefix: Optional[Tensor], k_prefix: Optional[Tensor]) -> Tensor:
    """Whether query position ``q_idx`` may attend to key position ``k_idx`` (broadcasting
    tensors): same segment, and causal or both in the prefix. Shared by every backend's form
    (dense masks, FlexAttention's ``mask_mod``)."""
    allowed = k_idx <= q_idx
    if q_prefix is not None:
        allowed = allowed | (q_prefix & k_prefix)
    if q_seg is not None:
        allowed = allowed & (q_seg == k_seg)
    return allowed


def dense_allowed_mask(structure: Optional[AttentionStructure], seq_length: int,
                       device=None) -> Tensor:
    """``[b, 1, s, s]`` bool, True where a query may attend to a key (``[1, 1, s, s]`` causal
    when ``structure`` is None), built on ``device``: SDPA's mask and the reference."""
    device = device if device is not None else (
        structure.segment_ids.device if structure is not None and structure.segment_ids is not None
        else structure.is_prefix.device if structure is not None else None)
    idx = torch.arange(seq_length, device=device)
    q_idx, k_idx = idx[:, None], idx[None, :]
    if structure is None:
        return attend_allowed(q_idx, k_idx, None, None, None, None)[None, None]
    seg = structure.segment_ids
    pre = structure.is_prefix
    return attend_allowed(
        q_idx, k_idx,
        None if seg is None else seg[:, :, None], None if seg is None else seg[:, None, :],
        None if pre is None else pre[:, :, None], None if pre is None else pre[:, None, :],
    )[:, None]


def block_mask(structure: Optional[AttentionStructure], seq_length: int, device):
    """FlexAttention ``BlockMask`` of ``structure`` (causal when None), ``[b|1, 1, s, s]``. On GPU
    its construction is compiled (as torchtitan does), so no dense ``[b, s, s]`` intermediate is
    materialised; on CPU it is evaluated eagerly."""
    from torch.nn.attention.flex_attention import create_block_mask as _create

    compiled = torch.device(device).type == "cuda"

    def create_block_mask(mask_mod, **kwargs):
        return _create(mask_mod, _compile=compiled, **kwargs)

    if structure is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return attend_allowed(q_idx, kv_idx, None, None, None, None)

        return create_block_mask(mask_mod, B=None, H=None, Q_LEN=seq_length, KV_LEN=seq_length,
                                 device=device)
    seg = structure.segment_ids
    pre = structure.is_prefix

    def mask_mod(b, h, q_idx, kv_idx):
        return attend_allowed(
            q_idx, kv_idx,
            None if seg is None else seg[b, q_idx], None if seg is None else seg[b, kv_idx],
            None if pre is None else pre[b, q_idx], None if pre is None else pre[b, kv_idx])

    return create_block_mask(mask_mod, B=structure.batch_size, H=None, Q_LEN=seq_length,
                             KV_LEN=seq_length, device=device)
