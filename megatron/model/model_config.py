"""The typed configs model building reads besides megatron-core's ``TransformerConfig``: frozen
dataclasses whose fields are argparse dests (or values validation derives), built once by
validation (megatron/config/model_config.py) and kept in ``args.run_config.model``.

- :class:`MoELayout`: the MoE layer's layout and router flags the layer spec, the start-up line
  and the MoE records read (megatron/model/moe.py, megatron/metrics/moe.py);
- :class:`ModelConfig`: position encoding, embeddings, the layer implementation and core
  attention, the pipe layout and the initial weights' seed.

The vocabulary rows are not here: the tokenizer set-up derives them after validation, and the
builders take them as arguments (``padded_vocab_size``, ``vocab_size``).
"""
from dataclasses import dataclass
from typing import List, Optional, Union

from megatron.model.attention_backends import AttentionChoice
from megatron.model.rotary import RopeScaling
from megatron.parallel.topology import ParallelLayout


@dataclass(frozen=True)
class MoELayout:
    """The MoE flags the model's layer spec, its start-up line and the MoE records read:
    ``--num-experts`` (experts per MoE layer), ``--num-layers`` and ``--moe-layer-freq`` (which
    layers are MoE), the expert FFN size, the router (top-k, score function, pre-softmax, the
    load-balancing loss and its coefficient, the z-loss coefficient), the shared expert's size,
    the capacity factor and drop policy, the token dispatcher, ``--expert-model-parallel-size``,
    ``--moe-grouped-gemm`` and ``--moe-per-layer-logging``."""

    num_experts: int
    num_layers: int
    moe_layer_freq: Union[int, List[int]]
    moe_ffn_hidden_size: Optional[int]
    moe_router_topk: int
    moe_router_score_function: str
    moe_router_pre_softmax: bool
    moe_router_load_balancing_type: str
    moe_aux_loss_coeff: float
    moe_z_loss_coeff: Optional[float]
    moe_shared_expert_intermediate_size: Optional[int]
    moe_expert_capacity_factor: Optional[float]
    moe_token_drop_policy: str
    moe_token_dispatcher_type: str
    expert_model_parallel_size: int
    moe_grouped_gemm: bool
    moe_per_layer_logging: bool


@dataclass(frozen=True)
class ModelConfig:
    """What building the model reads besides the ``TransformerConfig``: ``--seed`` (initial
    weights), ``--max-position-embeddings`` (positions), the position encoding
    (``--position-embedding-type``, ``--rotary-percent``, ``--rotary-base``, RoPE's linear or
    Llama 3.1 scaling: ``--rotary-seq-len-interpolation-factor``, ``--use-rope-scaling``,
    ``--rope-scaling-factor``; YaRN's flags are the ``TransformerConfig``'s), tied or untied
    embeddings, BLOOM's ``--embed-layernorm``, ``--sequence-parallel``,
    ``--ds-sequence-parallel-size`` (Ulysses ranks), ``--transformer-impl``,
    ``--normalization``, ``--num-layers``, ``--pipeline-model-parallel-size``; and what
    validation derived: DeepSpeed's ``partition_method``, the pipe's
    ``activation_checkpoint_interval`` (transformer layers per recomputed chunk, 0: none), the
    parallel ``layout``, the core ``attention`` choice and the ``moe`` layout (None for a dense
    model)."""

    seed: int
    max_position_embeddings: int
    position_embedding_type: str
    rotary_percent: float
    rotary_base: int
    rotary_seq_len_interpolation_factor: Optional[float]
    use_rope_scaling: bool
    rope_scaling_factor: float
    untie_embeddings_and_output_weights: bool
    embed_layernorm: bool
    sequence_parallel: bool
    ds_sequence_parallel_size: int
    transformer_impl: str
    normalization: str
    num_layers: int
    pipeline_model_parallel_size: int
    partition_method: str
    activation_checkpoint_interval: int
    layout: ParallelLayout
    attention: AttentionChoice
    moe: Optional[MoELayout]

    @property
    def rope_scaling(self) -> RopeScaling:
        """megatron-core's RoPE scaling arguments of the flags."""
        return RopeScaling(seq_len_interpolation_factor=self.rotary_seq_len_interpolation_factor,
                           rope_scaling=self.use_rope_scaling,
                           rope_scaling_factor=self.rope_scaling_factor)

    @property
    def num_experts(self) -> Optional[int]:
        """Experts per MoE layer (``--num-experts``), None for a dense model."""
        return self.moe.num_experts if self.moe is not None else None
