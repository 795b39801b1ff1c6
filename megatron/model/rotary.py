"""Rotary position embeddings (``--position-embedding-type rope``) that also run without a GPU.

megatron-core's ``RotaryEmbedding.get_emb`` moves its ``inv_freq`` to ``torch.cuda.current_device()``
on the first forward, which fails on a CPU-only install. :class:`RotaryEmbedding` here is
megatron-core's class; with CUDA present it is megatron-core's code path unchanged, without it the
embedding is built on the device ``inv_freq`` is on (megatron-core's ``get_freqs_non_repeated``,
laid out as megatron-core's ``get_emb`` lays it out: ``[seq, 1, 1, dim]``, the two halves, or
interleaved pairs with ``rotary_interleaved``). :func:`use_device_rotary_embedding` gives a built
``GPTModel`` such an embedding.

Under DeepSpeed-Ulysses sequence parallelism (megatron/parallel/ulysses.py) each rank holds a
contiguous slice of every sequence, and its q and k are rotated before the all-to-all: the
embedding then gives the angles of this rank's global positions (its slice of the whole
sequence's), where megatron-core's context-parallel code would take its load-balanced pair of
chunks.
"""
import torch
from megatron.core.models.common.embeddings import rotary_pos_embedding as mcore_rotary
from torch import Tensor

from megatron.parallel.ulysses import sequence_parallel_group, sequence_shard

__all__ = ["RotaryEmbedding", "use_device_rotary_embedding"]


class RotaryEmbedding(mcore_rotary.RotaryEmbedding):
    """megatron-core's ``RotaryEmbedding`` that keeps ``inv_freq`` on the CPU when CUDA is absent."""

    def get_emb(self, max_seq_len: int, offset: int = 0) -> Tensor:
        """``[max_seq_len, 1, 1, dim]`` rotation angles of positions ``offset ..`` (radians)."""
        if torch.cuda.is_available():
            return super().get_emb(max_seq_len, offset)
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # [seq, dim / 2]
        if self.rotary_interleaved:
            emb = torch.stack((freqs, freqs), dim=-1).view(freqs.shape[0], -1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]

    def _ulysses_group(self):
        if not getattr(self, "sequence_sharded", False):
            return None

        return sequence_parallel_group()

    def get_rotary_seq_len(self, inference_context, transformer, transformer_input,
                           transformer_config, packed_seq_params=None, **kwargs) -> int:
        """megatron-core's length (tokens of the whole sequence when the batch has an attention
        structure), times the Ulysses size when it counted this rank's slice only."""
        length = super().get_rotary_seq_len(inference_context, transformer, transformer_input,
                                            transformer_config, packed_seq_params, **kwargs)
        group = self._ulysses_group()
        if group is not None and packed_seq_params is None:
            length *= group.size()
        return length

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False,
                cp_group=None) -> Tensor:
        """megatron-core's embedding; under Ulysses the ``[max_seq_len / N, 1, 1, dim]`` angles of
        this rank's slice of the ``max_seq_len`` positions."""
        group = self._ulysses_group()
        if group is None:
            return super().forward(max_seq_len, offset, packed_seq, cp_group)

        emb = self.get_emb(max_seq_len, offset)
        return emb[sequence_shard(max_seq_len, group.size(), group.rank())]


def use_device_rotary_embedding(model: torch.nn.Module,
                                sequence_parallel: bool = False) -> torch.nn.Module:
    """Make ``model.rotary_pos_emb`` (a megatron-core ``RotaryEmbedding`` built by ``GPTModel``) a
    :class:`RotaryEmbedding`: same construction (``inv_freq``, interleaving, interpolation factor,
    context-parallel group), so the same angles, on CPU too; with ``sequence_parallel``
    (DeepSpeed-Ulysses) at this rank's global positions. Other models are returned unchanged."""
    rotary = getattr(model, "rotary_pos_emb", None)
    if type(rotary) is mcore_rotary.RotaryEmbedding:
        rotary.__class__ = RotaryEmbedding  # adds method overrides
        rotary.sequence_sharded = sequence_parallel
    return model
