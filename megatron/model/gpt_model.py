"""Build a megatron-core ``GPTModel`` from parsed Megatron-style arguments.

``validate_args`` builds the run's ``TransformerConfig`` (:func:`transformer_config_from_args`,
kept in ``args.transformer_config``) and resolves its attention backend
(``args.resolved_attention_backend``); the model is built from those.
"""
import copy
import dataclasses
import functools
from typing import Optional, Union

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.model.alibi import POSITION_EMBEDDING_TYPE as ALIBI
from megatron.model.alibi import model_position_embedding_type
from megatron.model.attention_backends import (
    apply_te_kernel_environment,
    attention_backend_from_args,
    core_attention_spec,
)
from megatron.model.embedding_norm import add_embedding_layernorm
from megatron.model.fusions import describe_fusions, fusion_config_from_args
from megatron.model.init import initialize_parameters
from megatron.model.moe import (
    describe_moe,
    layer_specs_for_pattern,
    moe_config_from_args,
    moe_layer_pattern,
    use_moe_router,
)
from megatron.model.norms import sequence_parallel_capable
from megatron.model.param_names import global_expert_name
from megatron.model.rotary import use_device_rotary_embedding
from megatron.model.vocab_padding import mask_output_layer_padding
from megatron.parallel.experts import first_local_expert
from megatron.parallel.recompute import recompute_config_from_args
from megatron.utils.rank_utils import print_rank_0


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
    arguments), so two namespaces validated from the same flags compare equal."""

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return all(_comparable(getattr(self, f.name)) == _comparable(getattr(other, f.name))
                   for f in dataclasses.fields(self))

    __hash__ = None


def transformer_config_from_args(args) -> TransformerConfig:
    """Translate model flags (``--num-layers``, ``--hidden-size`` ...) into a TransformerConfig
    (``validate_args`` calls it once; megatron-core's checks raise ValueError)."""
    return FlagTransformerConfig(
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


def model_transformer_config(args) -> TransformerConfig:
    """The ``TransformerConfig`` a model of ``args`` is built with: a copy of the one
    ``validate_args`` built (``args.transformer_config``; each model gets its own object, as
    megatron-core modules keep a reference), or, for a namespace that never went through
    validation (built by hand), :func:`transformer_config_from_args` now."""
    config = args.transformer_config
    return copy.copy(config) if config is not None else transformer_config_from_args(args)


def _implementation_layer_spec(args, num_experts: Optional[int] = None) -> ModuleSpec:
    """megatron-core's layer spec of ``--transformer-impl`` (Transformer Engine's or the local
    one), with a dense MLP or, for ``num_experts``, its MoE layer."""
    moe = {"num_experts": num_experts, "moe_grouped_gemm": bool(num_experts) and args.moe_grouped_gemm}
    if args.transformer_impl == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        # megatron-core 0.16's TE getter takes no normalization: TENorm follows
        # TransformerConfig.normalization
        return get_gpt_layer_with_transformer_engine_spec(**moe)
    return get_gpt_layer_local_spec(normalization=args.normalization, **moe)


def layer_spec_from_args(args) -> Union[ModuleSpec, TransformerBlockSubmodules]:
    """Layer spec: Transformer Engine's with ``--transformer-impl transformer_engine`` (which
    ``validate_args`` allows only when TE imports), else megatron-core's local spec; its core
    attention is the ``--attention-backend`` one (megatron/model/attention_backends.py), with
    ALiBi for ``--position-embedding-type alibi``. With ``--num-experts`` the MLP is
    megatron-core's MoE layer (router: megatron/model/moe.py) in the layers ``--moe-layer-freq``
    names; when some layers stay dense, the block of per-layer specs. Logs the backend and why it
    was chosen, and the fused kernels of the model's config."""
    backend = attention_backend_from_args(args)

    print_rank_0(backend.describe())
    print_rank_0(describe_fusions(vars(model_transformer_config(args))))
    apply_te_kernel_environment(backend)
    ulysses = args.ds_sequence_parallel_size
    core_attention = core_attention_spec(
        backend, alibi=args.position_embedding_type == ALIBI,
        **({"sequence_parallel_size": ulysses} if ulysses > 1 else {}))

    def with_core_attention(spec: ModuleSpec) -> ModuleSpec:
        attention = spec.submodules.self_attention.submodules
        if not hasattr(attention, "core_attention"):
            raise AttributeError("layer spec has no self_attention.submodules.core_attention to set")
        attention.core_attention = core_attention
        return spec

    dense = with_core_attention(_implementation_layer_spec(args))
    num_experts = args.num_experts
    if num_experts is None:
        return dense
    moe = use_moe_router(with_core_attention(_implementation_layer_spec(args, num_experts)))
    print_rank_0(describe_moe(args))
    return layer_specs_for_pattern(dense, moe, moe_layer_pattern(args.moe_layer_freq,
                                                                  args.num_layers))


def build_gpt_model(args) -> GPTModel:
    """Construct the GPT model described by ``args`` (``args.padded_vocab_size`` must be set;
    logits of rows at or beyond ``args.vocab_size``, when set, take no probability),
    its initial weights drawn from ``--seed`` and each parameter's name, the same under every
    tensor/pipeline-parallel layout (megatron/model/init.py)."""
    config = model_transformer_config(args)
    layer_spec = layer_spec_from_args(args)
    if args.sequence_parallel:
        layer_spec = sequence_parallel_capable(layer_spec, config.num_layers)
    model = GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=args.padded_vocab_size,
        max_sequence_length=args.max_position_embeddings,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
        position_embedding_type=model_position_embedding_type(args.position_embedding_type),
        rotary_percent=args.rotary_percent,
        rotary_base=args.rotary_base,
    )
    # logits of the padding rows (>= args.vocab_size, from tokenizer_setup) are -inf, so every
    # TP size is the same model (megatron/model/vocab_padding.py)
    mask_output_layer_padding(model.output_layer, getattr(args, "vocab_size", None),
                              args.padded_vocab_size)
    # --position-embedding-type rope without a GPU too, at each Ulysses rank's global positions
    use_device_rotary_embedding(model, sequence_parallel=args.ds_sequence_parallel_size > 1)
    if args.embed_layernorm:  # BLOOM: LayerNorm on the word embeddings
        add_embedding_layernorm(model.embedding, config)
    # experts by their global ids (megatron/model/param_names.py), so every expert-parallel
    # layout draws the same experts
    model.first_local_expert = first_local_expert(args.num_experts)
    initialize_parameters(model.named_parameters(), config, args.seed,
                          canonical_name=lambda n: global_expert_name(n, model.first_local_expert))
    return model
