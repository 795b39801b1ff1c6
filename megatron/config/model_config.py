"""The model's typed configs from the validated flags: megatron-core's ``TransformerConfig``
(:func:`transformer_config_from_args`, ``args.transformer_config`` and
``args.run_config.transformer``), the core-attention choice, the MoE layout, the parallel layout
and megatron/model/model_config.py's ``ModelConfig`` (``args.run_config.model``). The model
package builds from these and reads no flags."""
import dataclasses
import functools
from typing import Any, Dict, Optional

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.model.attention_backends import AttentionBackend, AttentionChoice
from megatron.model.fusions import FusionFlags, fusion_config
from megatron.model.gpt_model_pipe import activation_checkpoint_interval, partition_method
from megatron.model.model_config import ModelConfig, MoELayout
from megatron.model.rotary import YARN_CONFIG_FIELDS, yarn_fields
from megatron.parallel.topology import ParallelLayout
from megatron.utils.typed_config import config_from_args


def _device_type() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def params_dtype(args) -> torch.dtype:
    """The dtype that parameters are created in: bf16, fp16 or fp32 from ``--bf16/--fp16``."""
    if args.bf16:
        return torch.bfloat16
    if args.fp16:
        return torch.float16
    return torch.float32


def _comparable(value):
    # megatron-core's init methods are functools.partial objects, which compare by identity
    if isinstance(value, functools.partial):
        return value.func, value.args, tuple(sorted(value.keywords.items()))
    return value


class FlagTransformerConfig(TransformerConfig):
    """The ``TransformerConfig`` of parsed flags, equal to another exactly when every field is
    (the init-method partials megatron-core's ``__post_init__`` makes compare by function and
    arguments), so two namespaces validated from the same flags compare equal; the ``yarn_*``
    attributes (YaRN's, not dataclass fields) are compared too."""

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return yarn_fields(self) == yarn_fields(other) and all(
            _comparable(getattr(self, f.name)) == _comparable(getattr(other, f.name))
            for f in dataclasses.fields(self))

    __hash__ = None


def recompute_config_from_args(args) -> Dict[str, Any]:
    """The ``TransformerConfig`` keyword arguments for activation recompute (and the
    ``distribute_saved_activations`` option), from validated flags."""
    return {
        "recompute_granularity": args.recompute_granularity,
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "distribute_saved_activations": bool(args.distribute_saved_activations),
    }


def moe_config_from_args(args) -> dict:
    """The ``TransformerConfig`` fields of the MoE flags (empty for a dense model)."""
    if args.num_experts is None:
        return {}
    return dict(
        num_moe_experts=args.num_experts,
        expert_model_parallel_size=args.expert_model_parallel_size,
        moe_router_topk=args.moe_router_topk,
        moe_router_load_balancing_type=args.moe_router_load_balancing_type,
        moe_aux_loss_coeff=args.moe_aux_loss_coeff,
        moe_z_loss_coeff=args.moe_z_loss_coeff,
        moe_ffn_hidden_size=args.moe_ffn_hidden_size,
        moe_layer_freq=args.moe_layer_freq,
        moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
        moe_token_dispatcher_type=args.moe_token_dispatcher_type,
        moe_grouped_gemm=args.moe_grouped_gemm,
        moe_expert_capacity_factor=args.moe_expert_capacity_factor,
        moe_pad_expert_input_to_capacity=args.moe_pad_expert_input_to_capacity,
        moe_token_drop_policy=args.moe_token_drop_policy,
        moe_router_pre_softmax=args.moe_router_pre_softmax,
        moe_router_score_function=args.moe_router_score_function,
        moe_router_dtype=args.moe_router_dtype,
        moe_input_jitter_eps=args.moe_input_jitter_eps,
        moe_per_layer_logging=args.moe_per_layer_logging,
    )


def fusion_config_from_args(args, device_type: str) -> Dict[str, Any]:
    """megatron/model/fusions.py ``fusion_config`` of the flags ``args`` on ``device_type``
    (``cuda`` or ``cpu``): the activation and fusion fields of the ``TransformerConfig``."""
    return fusion_config(config_from_args(FusionFlags, args), device_type)


def transformer_config_from_args(args) -> TransformerConfig:
    """Translate model flags (``--num-layers``, ``--hidden-size`` ...) into a TransformerConfig
    (``validate_args`` calls it once; megatron-core's checks raise ValueError). With
    ``--position-embedding-type yarn`` it carries YaRN's flags as the ``yarn_*`` attributes
    megatron-core's GPTModel and attention read (as Megatron-LM sets them)."""
    config = FlagTransformerConfig(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups,
        ffn_hidden_size=args.ffn_hidden_size,
        kv_channels=args.kv_channels,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        init_method_std=args.init_method_std,
        normalization=args.normalization,
        layernorm_epsilon=args.norm_epsilon,
        gated_linear_unit=args.swiglu,
        add_bias_linear=not args.disable_bias_linear,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        sequence_parallel=args.sequence_parallel,
        **recompute_config_from_args(args),
        **moe_config_from_args(args),
        use_cpu_initialization=args.use_cpu_initialization or not torch.cuda.is_available(),
        params_dtype=params_dtype(args),
        bf16=args.bf16,
        fp16=args.fp16,
        apply_query_key_layer_scaling=False,
        attention_softmax_in_fp32=True,
        # activation and Megatron-LM's fusions: on a GPU its defaults, on a CPU the unfused
        # modules computing the same functions (megatron/model/fusions.py)
        **fusion_config_from_args(args, _device_type()),
    )
    if args.position_embedding_type == "yarn":
        for field, dest in YARN_CONFIG_FIELDS.items():
            setattr(config, field, getattr(args, dest))
    return config


def batches_have_structure(args) -> bool:
    """Whether this run's batches carry segments or prefixes: ``--reset-attention-mask``, or an
    entry point that packs samples (``finetune_t0.py`` sets ``packed_samples``)."""
    return bool(args.reset_attention_mask or getattr(args, "packed_samples", False))


def dense_scores_mib(args) -> float:
    """MiB of one ``[b, h, s, s]`` tensor of attention probabilities of this run: micro batch x
    this rank's heads (over TP x Ulysses SP) x seq-length squared, in the parameters' dtype."""
    element = 2 if (args.bf16 or args.fp16) else 4
    heads = args.num_attention_heads / (max(args.tensor_model_parallel_size, 1)
                                        * args.ds_sequence_parallel_size)
    return args.micro_batch_size * heads * args.seq_length ** 2 * element / 2 ** 20


def attention_choice_from_args(args, resolved: Optional[AttentionBackend] = None) -> AttentionChoice:
    """The ``AttentionChoice`` of the flags (``--attention-backend``, ``--transformer-impl``, the
    batches' structure, ``--attention-dropout``, ALiBi, the size of one dense score tensor in MiB,
    ``--ds-sequence-parallel-size``) with the backend validation ``resolved`` (None: not yet, or
    it cannot run here)."""
    return AttentionChoice(
        attention_backend=args.attention_backend, transformer_impl=args.transformer_impl,
        structured_batches=batches_have_structure(args),
        prefix_batches=bool(getattr(args, "prefix_lm", False)),
        attention_dropout=args.attention_dropout,
        alibi=args.position_embedding_type == "alibi",
        dense_scores_mib=dense_scores_mib(args),
        ds_sequence_parallel_size=args.ds_sequence_parallel_size, resolved=resolved)


def parallel_layout_from_args(args) -> ParallelLayout:
    """The layout validated by ``validate_args`` (``args.data_parallel_size`` is set there)."""
    return ParallelLayout(tp=args.tensor_model_parallel_size, pp=args.pipeline_model_parallel_size,
                          dp=args.data_parallel_size, world=args.world_size,
                          sp=args.ds_sequence_parallel_size,
                          ep=args.expert_model_parallel_size)


def moe_layout_from_args(args) -> Optional[MoELayout]:
    """The ``MoELayout`` of the MoE flags, None for a dense model (no ``--num-experts``)."""
    return None if args.num_experts is None else config_from_args(MoELayout, args)


def model_config_from_args(args) -> ModelConfig:
    """The ``ModelConfig`` of validated ``args``: its flag fields, and the pipe's partition method
    (``--pp-partition-method``) and recompute interval, the parallel layout, the attention choice
    with the backend validation resolved (``args.resolved_attention_backend``) and the MoE
    layout."""
    return config_from_args(
        ModelConfig, args,
        partition_method=partition_method(args.pp_partition_method),
        activation_checkpoint_interval=activation_checkpoint_interval(args.recompute_granularity,
                                                                      args.recompute_num_layers),
        layout=parallel_layout_from_args(args),
        attention=attention_choice_from_args(args, args.resolved_attention_backend),
        moe=moe_layout_from_args(args))
