"""DeepSpeed-Ulysses sequence parallelism (``--ds-sequence-parallel-size N``), as Microsoft
Megatron-DeepSpeed runs it for long sequences.

Each of the N ranks of a sequence-parallel group reads the same samples and keeps 1/N of every
sequence: its contiguous slice of the tokens, labels, loss mask and position ids
(:func:`slice_batch_for_sequence_rank`). Everything outside the core attention works on that
slice. Around the core attention DeepSpeed's ``DistributedAttention`` exchanges q, k and v all-to-all
over the group, so each rank attends over the *whole* sequence for 1/N of its heads, and exchanges
the output back (:class:`UlyssesAttention`). The batch's attention structure (``segment_ids``,
``is_prefix``) therefore stays whole on every rank, and the core attention of each backend sees
exactly what it sees on one rank, for its heads: packed documents, prefix-LM, ALiBi (each rank
takes the slopes of its heads) and RoPE (the angles of each rank's global positions,
megatron/model/rotary.py) give the single-rank result.

The groups are megatron-core's context-parallel ones (megatron/parallel/topology.py); DeepSpeed
reduces gradients over the sequence-data-parallel group and divides by the data-parallel size
only, so each rank's loss must be its share of the whole sequence's loss: the local masked sum
over the global token count (megatron/model/lm_loss.py), whose sum over the group is the loss of
one rank.

The sequence-parallel ranks of one tensor-parallel rank share their dropout streams (as megatron-
core's context-parallel ranks do): they draw the same masks for different tokens or heads.
"""
from typing import Dict, Mapping, Optional, Tuple

import torch

# batch fields laid out per token ([micro batch, sequence]) that each rank keeps a slice of; the
# attention structure (segment_ids, is_prefix and the host layout of its segments) stays whole
PER_TOKEN_KEYS = ("tokens", "labels", "loss_mask", "position_ids", "dataset_id")


def sequence_shard(length: int, size: int, rank: int) -> slice:
    """The positions ``[rank * length / size, (rank + 1) * length / size)`` of a ``length``-token
    sequence that sequence-parallel rank ``rank`` of ``size`` holds (``length`` divisible)."""
    if length % size:
        raise ValueError(f"a sequence of {length} tokens does not split over {size} ranks")
    chunk = length // size
    return slice(rank * chunk, (rank + 1) * chunk)


def slice_batch_for_sequence_rank(batch: Mapping[str, object], size: int,
                                  rank: int) -> Dict[str, object]:
    """``batch`` with each per-token field (:data:`PER_TOKEN_KEYS` given as ``[b, s]``) cut to
    this rank's slice of the sequence (:func:`sequence_shard`); the attention structure and
    per-sample fields (a ``[b]`` ``dataset_id``) are kept whole. ``size`` 1: unchanged."""
    if size == 1:
        return dict(batch)
    out = dict(batch)
    seq_length = batch["tokens"].shape[1]
    shard = sequence_shard(seq_length, size, rank)
    for key in PER_TOKEN_KEYS:
        value = batch.get(key)
        if isinstance(value, torch.Tensor) and value.dim() == 2 and value.shape[1] == seq_length:
            out[key] = value[:, shard].contiguous()
    return out


def sequence_parallel_group():
    """The DeepSpeed-Ulysses group of this rank (megatron-core's context-parallel group), or None
    without Ulysses (size 1 or parallel state not initialised)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return None
    if parallel_state.get_context_parallel_world_size() == 1:
        return None
    return parallel_state.get_context_parallel_group()


def sequence_rank_and_size() -> Tuple[int, int]:
    """(rank, size) of this rank in its Ulysses group; (0, 1) without one."""
    group = sequence_parallel_group()
    if group is None:
        return 0, 1
    return torch.distributed.get_rank(group), torch.distributed.get_world_size(group)


class _HeadsLastOutput(torch.nn.Module):
    """A core attention whose ``[s, b, heads * dim]`` output is given back as ``[s, b, heads,
    dim]``, the shape DeepSpeed's output all-to-all takes."""

    def __init__(self, core_attention: torch.nn.Module):
        super().__init__()
        self.core_attention = core_attention

    def forward(self, query, key, value, *args, **kwargs):
        out = self.core_attention(query, key, value, *args, **kwargs)
        return out.view(out.shape[0], out.shape[1], query.shape[2], -1)


class UlyssesAttention(torch.nn.Module):
    """A backend's core attention run over the whole sequence for this rank's share of the heads
    (DeepSpeed's ``DistributedAttention``: q, k, v scattered by head and gathered by sequence,
    the output back). Built in the core-attention slot of the layer spec with megatron-core's
    arguments; ``local_attention`` is the backend class, ``local_params`` its spec parameters. The
    local attention is told its head shard (``sequence_shard``: rank, size) for ALiBi. No
    parameters of its own."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, *args,
                 local_attention=None, local_params: Optional[dict] = None, **kwargs):
        super().__init__()
        from deepspeed.sequence.layer import DistributedAttention

        group = sequence_parallel_group()
        if group is None:
            raise RuntimeError("UlyssesAttention needs a sequence-parallel group "
                               "(--ds-sequence-parallel-size > 1 after initialisation)")
        shard = (torch.distributed.get_rank(group), torch.distributed.get_world_size(group))
        local = local_attention(config, layer_number, attn_mask_type, attention_type, *args,
                                sequence_shard=shard, **(local_params or {}), **kwargs)
        # megatron-core's layout [s, b, heads, dim]: scatter heads (2), gather the sequence (0)
        self.distributed_attention = DistributedAttention(_HeadsLastOutput(local), group,
                                                          scatter_idx=2, gather_idx=0)

    @property
    def local_attention(self) -> torch.nn.Module:
        """The backend's core attention (over the whole sequence, this rank's heads)."""
        return self.distributed_attention.local_attn.core_attention

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        """``[s / N, b, heads * dim]`` attention output of this rank's slice of the sequence, from
        its ``[s / N, b, heads, dim]`` q and ``[s / N, b, groups, dim]`` k, v."""
        out = self.distributed_attention(query, key, value, 1, None, attention_mask,
                                         attn_mask_type=attn_mask_type,
                                         attention_bias=attention_bias,
                                         packed_seq_params=packed_seq_params)
        return out.reshape(out.shape[0], out.shape[1], -1)
