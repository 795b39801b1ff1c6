"""How a batch describes its attention, and the forms each attention backend builds from it.

A batch carries its attention structure compactly, as fixed-shape per-token tensors (``s`` =
sequence length, ``b`` = micro batch):

- ``segment_ids`` ``[b, s]`` int32 (optional): the segment (packed document) of each token. A token
  attends only to tokens of its own segment; each segment is one contiguous run of tokens. T0
  packing numbers segments 1..k and padding 0 (padding then attends only to padding, which no loss
  reads); pretraining with ``--reset-attention-mask`` starts a new segment after every EOD token.
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
Transformer Engine's ``arbitrary`` mask, a ``BlockMask`` for FlexAttention, segment runs for
SDPA's per-segment path.
"""
import dataclasses
from typing import Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import Tensor

from megatron.core.packed_seq_params import PackedSeqParams

SEGMENT_IDS_KEY = "segment_ids"
IS_PREFIX_KEY = "is_prefix"
SEGMENT_IDS_DTYPE = torch.int32


@dataclasses.dataclass
class AttentionStructure(PackedSeqParams):
    """The compact attention structure of one micro batch (see the module docstring), in the
    ``packed_seq_params`` slot megatron-core threads through ``GPTModel`` to the core attention.

    ``qkv_format`` stays ``sbhd`` (megatron-core reshapes nothing) and ``max_seqlen_q/kv`` is the
    sequence length (what megatron-core's rotary embedding sizes itself by). ``forms`` caches what
    backends built from it, so all layers of one forward share one mask.
    """

    segment_ids: Optional[Tensor] = None
    is_prefix: Optional[Tensor] = None
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
        self.qkv_format = "sbhd"
        self.max_seqlen_q = self.max_seqlen_kv = int(ref.shape[1])

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


def attention_structure(segment_ids: Optional[Tensor] = None,
                        is_prefix: Optional[Tensor] = None) -> Optional[AttentionStructure]:
    """The structure of a batch from its tensors, or None for plain causal attention."""
    if segment_ids is None and is_prefix is None:
        return None
    return AttentionStructure(segment_ids=segment_ids, is_prefix=is_prefix)


def attention_structure_from_batch(batch: Mapping[str, Tensor]) -> Optional[AttentionStructure]:
    """:func:`attention_structure` of a batch dict's ``segment_ids`` / ``is_prefix`` (if any)."""
    return attention_structure(batch.get(SEGMENT_IDS_KEY), batch.get(IS_PREFIX_KEY))


def segment_ids_after_eod(tokens: Tensor, eod: int) -> Tensor:
    """``[b, s]`` int32 segment ids of pretraining samples under ``--reset-attention-mask``: a new
    document starts right after every EOD token (the EOD belongs to the document it ends), as
    megatron-core's ``_get_ltor_masks_and_position_ids`` masks. Segments count from 1."""
    is_eod = (tokens == eod).to(SEGMENT_IDS_DTYPE)
    return (1 + torch.cumsum(is_eod, dim=-1, dtype=SEGMENT_IDS_DTYPE) - is_eod).to(SEGMENT_IDS_DTYPE)


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


def segment_runs(structure: AttentionStructure) -> List[List[Tuple[int, int]]]:
    """Per sample, the ``(start, end)`` token ranges of its segments (maximal runs of one
    segment id; one run over the whole sample without ``segment_ids``). One host sync. Raises
    ValueError when a segment id comes back after another segment (not one contiguous run)."""
    s = structure.seq_length
    if structure.segment_ids is None:
        return [[(0, s)] for _ in range(structure.batch_size)]
    seg = structure.segment_ids
    change = torch.ones_like(seg, dtype=torch.bool)
    change[:, 1:] = seg[:, 1:] != seg[:, :-1]
    runs = []
    for n, (row, ids) in enumerate(zip(change.cpu(), seg.cpu())):
        starts = torch.nonzero(row).flatten().tolist()
        run_ids = ids[starts].tolist()
        if len(set(run_ids)) != len(run_ids):
            repeated = next(i for i in run_ids if run_ids.count(i) > 1)
            raise ValueError(f"segment_ids of sample {n}: segment {repeated} is split into separate "
                             "runs; each segment must be one contiguous run of tokens")
        runs.append(list(zip(starts, starts[1:] + [s])))
    return runs


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
