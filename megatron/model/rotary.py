"""Rotary position embeddings (``--position-embedding-type rope``) that also run without a GPU.

megatron-core's ``RotaryEmbedding.get_emb`` moves its ``inv_freq`` to ``torch.cuda.current_device()``
on the first forward, which fails on a CPU-only install. :class:`RotaryEmbedding` here is
megatron-core's class; with CUDA present it is megatron-core's code path unchanged, without it the
embedding is built on the device ``inv_freq`` is on (megatron-core's ``get_freqs_non_repeated``,
laid out as megatron-core's ``get_emb`` lays it out: ``[seq, 1, 1, dim]``, the two halves, or
interleaved pairs with ``rotary_interleaved``). :func:`use_device_rotary_embedding` gives a built
``GPTModel`` such an embedding.
"""
import torch
from torch import Tensor

from megatron.core.models.common.embeddings import rotary_pos_embedding as mcore_rotary

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


def use_device_rotary_embedding(model: torch.nn.Module) -> torch.nn.Module:
    """Make ``model.rotary_pos_emb`` (a megatron-core ``RotaryEmbedding`` built by ``GPTModel``) a
    :class:`RotaryEmbedding`: same construction (``inv_freq``, interleaving, interpolation factor,
    context-parallel group), so the same angles, on CPU too. Other models are returned unchanged."""
    rotary = getattr(model, "rotary_pos_emb", None)
    if type(rotary) is mcore_rotary.RotaryEmbedding:
        rotary.__class__ = RotaryEmbedding  # adds one method override, no state
    return model
