"""Rotary position embeddings (``--position-embedding-type rope`` and ``yarn``) that also run
without a GPU.

megatron-core's ``RotaryEmbedding.get_emb`` moves its ``inv_freq`` to ``torch.cuda.current_device()``
on the first forward, which fails on a CPU-only install. :class:`RotaryEmbedding` here is
megatron-core's class; with CUDA present it is megatron-core's code path unchanged, without it the
embedding is built on the device ``inv_freq`` is on (megatron-core's ``get_freqs_non_repeated``,
laid out as megatron-core's ``get_emb`` lays it out: ``[seq, 1, 1, dim]``, the two halves, or
interleaved pairs with ``rotary_interleaved``). :func:`use_device_rotary_embedding` gives a built
``GPTModel`` such an embedding.

RoPE's scalings are megatron-core's (docs/position_encodings.md): linear interpolation
(``--rotary-seq-len-interpolation-factor``) and Llama 3.1's (``--use-rope-scaling``) are arguments
of its ``RotaryEmbedding``, which ``GPTModel`` takes; YaRN is its ``YarnRotaryEmbedding``, whose
parameters megatron-core reads from the ``TransformerConfig``'s ``yarn_*`` attributes (set only for
``--position-embedding-type yarn``, as Megatron-LM does: :data:`YARN_CONFIG_FIELDS`; the attention
multiplies cos and sin by the YaRN attention factor when they are present).
:class:`YarnRotaryEmbedding` is megatron-core's class that also runs without a GPU (its
construction computes the embedding of the original length, which megatron-core does on the GPU),
built by :func:`rotary_embedding` and given to ``GPTModel`` by :func:`use_yarn_rotary_embedding`.

Under DeepSpeed-Ulysses sequence parallelism (megatron/parallel/ulysses.py) each rank holds a
contiguous slice of every sequence, and its q and k are rotated before the all-to-all: the
embedding then gives the angles of this rank's global positions (its slice of the whole
sequence's), where megatron-core's context-parallel code would take its load-balanced pair of
chunks.
"""
from dataclasses import dataclass
from typing import Optional, Tuple, Union

import torch
from megatron.core.models.common.embeddings import rotary_pos_embedding as mcore_rotary
from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding as mcore_yarn
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import Tensor

from megatron.parallel.ulysses import sequence_parallel_group, sequence_shard
from megatron.runtime.mcore_compat import refresh_yarn_attention_factor

__all__ = ["NO_SCALING", "RopeScaling", "RotaryEmbedding", "YarnRotaryEmbedding", "YARN_CONFIG_FIELDS",
           "rotary_embedding", "use_device_rotary_embedding", "use_yarn_rotary_embedding", "yarn_fields"]

# The TransformerConfig attributes megatron-core's GPTModel and attention read for YaRN, and the
# flags (argparse dests) they come from (Megatron-LM's ``_apply_yarn_config_from_args``).
YARN_CONFIG_FIELDS = {
    "yarn_rotary_scaling_factor": "rotary_scaling_factor",
    "yarn_original_max_position_embeddings": "yarn_original_max_position_embeddings",
    "yarn_beta_fast": "yarn_beta_fast",
    "yarn_beta_slow": "yarn_beta_slow",
    "yarn_mscale": "mscale",
    "yarn_mscale_all_dim": "mscale_all_dim",
    "yarn_correction_range_round_to_int": "yarn_correction_range_round_to_int",
}


def yarn_fields(config: TransformerConfig) -> dict:
    """The ``yarn_*`` attributes of ``config`` (empty unless the model is YaRN's)."""
    return {k: getattr(config, k) for k in YARN_CONFIG_FIELDS if hasattr(config, k)}


@dataclass(frozen=True)
class RopeScaling:
    """RoPE's scaling arguments of megatron-core's ``RotaryEmbedding``: linear interpolation
    (positions divided by ``seq_len_interpolation_factor``; None: none) or Llama 3.1's
    (``rope_scaling``, frequencies scaled by ``rope_scaling_factor``)."""

    seq_len_interpolation_factor: Optional[float] = None
    rope_scaling: bool = False
    rope_scaling_factor: float = 8.0


NO_SCALING = RopeScaling()


class _UlyssesRotary:
    """The angles of this rank's global positions under DeepSpeed-Ulysses (the module docstring),
    for megatron-core's rotary embeddings: mixed in before the megatron-core class; a class gives
    its whole-sequence angles by ``angles`` and its ``forward`` by :meth:`_forward`. The Ulysses
    group is megatron-core's context-parallel group, so where it has more than one rank
    megatron-core's ``forward`` (which would cut its context-parallel chunks) is not called."""

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

    def get_emb(self, max_seq_len: int, offset: int = 0) -> Union[Tensor, Tuple[Tensor, float]]:
        """The class's ``angles`` of positions ``offset .. offset + max_seq_len`` (radians,
        ``[max_seq_len, 1, 1, dim]``; YaRN's with its attention factor); under Ulysses the
        ``[max_seq_len / N, 1, 1, dim]`` angles of this rank's slice of them."""
        emb = self.angles(max_seq_len, offset)
        group = self._ulysses_group()
        if group is None:
            return emb
        shard = sequence_shard(max_seq_len, group.size(), group.rank())
        if isinstance(emb, tuple):  # YaRN: (angles, attention factor)
            return emb[0][shard], emb[1]
        return emb[shard]

    def _forward(self, core_forward, max_seq_len: int, offset: int, packed_seq: bool, cp_group):
        """megatron-core's ``core_forward`` (cached) without Ulysses; with it :meth:`get_emb`:
        this rank's slice of the angles once ``sequence_sharded`` is set, all of them before
        (YaRN's constructor computes the original length's)."""
        if self.cp_group is None or self.cp_group.size() == 1:
            return core_forward(self, max_seq_len, offset, packed_seq, cp_group)
        return self.get_emb(max_seq_len, offset)


class RotaryEmbedding(_UlyssesRotary, mcore_rotary.RotaryEmbedding):
    """megatron-core's ``RotaryEmbedding`` that keeps ``inv_freq`` on the CPU when CUDA is absent."""

    def angles(self, max_seq_len: int, offset: int = 0) -> Tensor:
        """``[max_seq_len, 1, 1, dim]`` rotation angles of positions ``offset ..`` (radians):
        megatron-core's ``get_emb``, without a GPU laid out as it lays them out."""
        if torch.cuda.is_available():
            return mcore_rotary.RotaryEmbedding.get_emb(self, max_seq_len, offset)
        freqs = self.get_freqs_non_repeated(max_seq_len, offset)  # [seq, dim / 2]
        if self.rotary_interleaved:
            emb = torch.stack((freqs, freqs), dim=-1).view(freqs.shape[0], -1)
        else:
            emb = torch.cat((freqs, freqs), dim=-1)
        return emb[:, None, None, :]

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False,
                cp_group=None) -> Tensor:
        """megatron-core's embedding; under Ulysses the ``[max_seq_len / N, 1, 1, dim]`` angles of
        this rank's slice of the ``max_seq_len`` positions."""
        return self._forward(mcore_rotary.RotaryEmbedding.forward, max_seq_len, offset,
                             packed_seq, cp_group)


class YarnRotaryEmbedding(_UlyssesRotary, mcore_yarn.YarnRotaryEmbedding):
    """megatron-core's ``YarnRotaryEmbedding`` that keeps its frequencies on the CPU when CUDA is
    absent: there the angles are megatron-core's ``get_emb`` formula, composed of its YaRN
    helpers (correction range, linear ramp, concentration factor)."""

    def angles(self, max_seq_len: int, offset: int = 0) -> Tuple[Tensor, float]:
        """``([max_seq_len, 1, 1, dim]`` angles of positions ``offset ..`` in radians, the
        attention factor cos and sin are multiplied by)."""
        if torch.cuda.is_available():
            return mcore_yarn.YarnRotaryEmbedding.get_emb(self, max_seq_len, offset)
        low, high = mcore_yarn._yarn_find_correction_range(
            self.beta_fast, self.beta_slow, self.dim, self.rotary_base,
            self.original_max_position_embeddings, self.correction_range_round_to_int)
        extrapolated = 1.0 - mcore_yarn._yarn_linear_ramp_mask(
            low, high, self.dim // 2, device=self.inv_freq_extra.device).to(torch.float32)
        inv_freq = self.inv_freq_inter * (1 - extrapolated) + self.inv_freq_extra * extrapolated
        seq = torch.arange(max_seq_len, device=inv_freq.device, dtype=self.inv_freq_extra.dtype)
        freqs = torch.outer(seq + offset, inv_freq)
        factor = mcore_yarn._yarn_get_concentration_factor(self.scaling_factor, self.mscale,
                                                           self.mscale_all_dim)
        return torch.cat((freqs, freqs), dim=-1)[:, None, None, :], factor

    def forward(self, max_seq_len: int, offset: int = 0, packed_seq: bool = False,
                cp_group=None) -> Tuple[Tensor, float]:
        """megatron-core's YaRN embedding and attention factor; under Ulysses the angles of this
        rank's slice of the ``max_seq_len`` positions."""
        return self._forward(mcore_yarn.YarnRotaryEmbedding.forward, max_seq_len, offset,
                             packed_seq, cp_group)

    # megatron-core's constructor clears its forward's cache (``self.forward.cache_clear()``)
    forward.cache_clear = mcore_yarn.YarnRotaryEmbedding.forward.cache_clear


def rotary_embedding(config: TransformerConfig, position_embedding_type: str,
                     rotary_percent: float, rotary_base: int,
                     scaling: RopeScaling = NO_SCALING
                     ) -> Optional[Union[RotaryEmbedding, YarnRotaryEmbedding]]:
    """The rotary embedding ``GPTModel`` builds for ``position_embedding_type`` (None for other
    encodings), with the same arguments: RoPE with ``scaling``, or YaRN with ``config``'s
    ``yarn_*`` attributes."""
    if position_embedding_type == "rope":
        return RotaryEmbedding(
            kv_channels=config.kv_channels, rotary_percent=rotary_percent,
            rotary_interleaved=config.rotary_interleaved,
            seq_len_interpolation_factor=scaling.seq_len_interpolation_factor,
            rotary_base=rotary_base, rope_scaling=scaling.rope_scaling,
            rope_scaling_factor=scaling.rope_scaling_factor,
            use_cpu_initialization=config.use_cpu_initialization)
    if position_embedding_type == "yarn":
        return YarnRotaryEmbedding(
            kv_channels=config.kv_channels, rotary_percent=rotary_percent,
            rotary_interleaved=config.rotary_interleaved, rotary_base=rotary_base,
            scaling_factor=config.yarn_rotary_scaling_factor,
            original_max_position_embeddings=config.yarn_original_max_position_embeddings,
            beta_fast=config.yarn_beta_fast, beta_slow=config.yarn_beta_slow,
            mscale=config.yarn_mscale, mscale_all_dim=config.yarn_mscale_all_dim,
            correction_range_round_to_int=config.yarn_correction_range_round_to_int,
            use_cpu_initialization=config.use_cpu_initialization)
    return None


def use_yarn_rotary_embedding(model: torch.nn.Module, rotary_percent: float, rotary_base: int,
                              sequence_parallel: bool = False) -> torch.nn.Module:
    """Make a ``GPTModel`` built with ``rope`` (megatron-core's ``yarn`` construction needs a GPU)
    YaRN's: its ``rotary_pos_emb`` a :class:`YarnRotaryEmbedding` of the model's config (the
    ``yarn_*`` attributes) and its ``position_embedding_type`` ``yarn``, so its forward takes
    megatron-core's YaRN branch; with ``sequence_parallel`` (DeepSpeed-Ulysses) at this rank's
    global positions."""
    rotary = rotary_embedding(model.config, "yarn", rotary_percent, rotary_base)
    rotary.sequence_sharded = sequence_parallel
    model.rotary_pos_emb = rotary
    model.position_embedding_type = "yarn"
    return model


def set_rotary_embeddings(model: torch.nn.Module, config: TransformerConfig,
                          position_embedding_type: str, rotary_percent: float, rotary_base: int,
                          scaling: RopeScaling = NO_SCALING, max_position_embeddings: int = None) -> int:
    """Switch a built model's rotary position encoding in place (a context stage of one run,
    megatron/train/context_stages.py): every rotary embedding of ``model`` (``GPTModel``'s, each
    pipe layer's) rebuilt as :func:`rotary_embedding` builds it for ``position_embedding_type``
    (rope or yarn), ``rotary_percent``, ``rotary_base`` and ``scaling``, on its module's
    context-parallel group and Ulysses slice; the ``yarn_*`` attributes of the model's
    ``TransformerConfig`` copies (which the attention reads for YaRN's attention factor) set
    from ``config`` for yarn and removed for rope; ``GPTModel``'s encoding type, base, maximum
    length (``max_position_embeddings``, when given) and rotary cache updated. The angles are then
    those of a model built with these values. Returns how many embeddings were replaced."""
    yarn = yarn_fields(config) if position_embedding_type == "yarn" else {}
    configs = {id(m.config): m.config for m in model.modules()
               if isinstance(getattr(m, "config", None), TransformerConfig)}
    for module_config in configs.values():
        for name in YARN_CONFIG_FIELDS:
            if name in vars(module_config):
                delattr(module_config, name)
        for name, value in yarn.items():
            setattr(module_config, name, value)
    replaced = 0
    for module in list(model.modules()):
        old = getattr(module, "rotary_pos_emb", None)
        if not isinstance(old, (mcore_rotary.RotaryEmbedding, mcore_yarn.YarnRotaryEmbedding)):
            continue
        new = rotary_embedding(config, position_embedding_type, rotary_percent, rotary_base,
                               scaling)
        new.cp_group = old.cp_group
        new.sequence_sharded = getattr(old, "sequence_sharded", False)
        module.rotary_pos_emb = new
        replaced += 1
        if hasattr(module, "rotary_pos_emb_cache"):  # GPTModel
            module.position_embedding_type = position_embedding_type
            module.rotary_base = rotary_base
            module.rotary_pos_emb_cache.clear()
            if max_position_embeddings is not None:
                module.max_position_embeddings = max_position_embeddings
                module.max_sequence_length = max_position_embeddings
            if hasattr(module, "rotary_scaling"):  # GPTModel's export attribute (0.19)
                module.rotary_scaling = scaling.rope_scaling
    for module in model.modules():  # megatron-core 0.19's attention caches YaRN's factor
        refresh_yarn_attention_factor(module)
    # megatron-core caches each embedding's angles by (embedding, length, ...): drop the old ones
    for cls in (mcore_rotary.RotaryEmbedding, mcore_yarn.YarnRotaryEmbedding):
        clear = getattr(cls.forward, "cache_clear", None)
        if clear is not None:
            clear()
    return replaced


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
