"""Build a megatron-core ``GPTModel`` from the run's typed configs.

``validate_args`` builds the run's ``TransformerConfig`` (megatron/config/model_config.py, kept in
``args.run_config.transformer``) and the :class:`~megatron.model.model_config.ModelConfig`
(``args.run_config.model``: position encoding, layer implementation, the attention backend it
resolved, the MoE layout, ...); the model is built from those and the vocabulary rows.
"""
import copy
from typing import Optional, Union

from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig

from megatron.model.alibi import POSITION_EMBEDDING_TYPE as ALIBI
from megatron.model.alibi import model_position_embedding_type
from megatron.model.attention_backends import (
    apply_te_kernel_environment,
    attention_backend,
    core_attention_spec,
)
from megatron.model.embedding_norm import add_embedding_layernorm
from megatron.model.fusions import describe_fusions
from megatron.model.init import initialize_parameters
from megatron.model.model_config import ModelConfig
from megatron.model.moe import (
    describe_moe,
    layer_specs_for_pattern,
    moe_layer_pattern,
    use_moe_router,
)
from megatron.model.norms import sequence_parallel_capable
from megatron.model.param_names import global_expert_name
from megatron.model.rotary import use_device_rotary_embedding, use_yarn_rotary_embedding
from megatron.model.vocab_padding import mask_output_layer_padding
from megatron.parallel.experts import first_local_expert
from megatron.utils.rank_utils import print_rank_0


def _implementation_layer_spec(model: ModelConfig, num_experts: Optional[int] = None) -> ModuleSpec:
    """megatron-core's layer spec of ``--transformer-impl`` (Transformer Engine's or the local
    one), with a dense MLP or, for ``num_experts``, its MoE layer."""
    moe = {"num_experts": num_experts,
           "moe_grouped_gemm": bool(num_experts) and model.moe.moe_grouped_gemm}
    if model.transformer_impl == "transformer_engine":
        from megatron.core.models.gpt.gpt_layer_specs import (
            get_gpt_layer_with_transformer_engine_spec,
        )

        # megatron-core 0.16's TE getter takes no normalization: TENorm follows
        # TransformerConfig.normalization
        return get_gpt_layer_with_transformer_engine_spec(**moe)
    return get_gpt_layer_local_spec(normalization=model.normalization, **moe)


def gpt_layer_spec(model: ModelConfig,
                   transformer: TransformerConfig) -> Union[ModuleSpec, TransformerBlockSubmodules]:
    """Layer spec: Transformer Engine's with ``--transformer-impl transformer_engine`` (which
    ``validate_args`` allows only when TE imports), else megatron-core's local spec; its core
    attention is the ``--attention-backend`` one (``model.attention``,
    megatron/model/attention_backends.py), with ALiBi for ``--position-embedding-type alibi``.
    With ``--num-experts`` the MLP is megatron-core's MoE layer (router: megatron/model/moe.py) in
    the layers ``--moe-layer-freq`` names; when some layers stay dense, the block of per-layer
    specs. Logs the backend and why it was chosen, and the fused kernels of ``transformer`` (the
    model's config)."""
    backend = attention_backend(model.attention)

    print_rank_0(backend.describe())
    print_rank_0(describe_fusions(vars(transformer)))
    apply_te_kernel_environment(backend)
    ulysses = model.ds_sequence_parallel_size
    core_attention = core_attention_spec(
        backend, alibi=model.position_embedding_type == ALIBI,
        **({"sequence_parallel_size": ulysses} if ulysses > 1 else {}))

    def with_core_attention(spec: ModuleSpec) -> ModuleSpec:
        attention = spec.submodules.self_attention.submodules
        if not hasattr(attention, "core_attention"):
            raise AttributeError("layer spec has no self_attention.submodules.core_attention to set")
        attention.core_attention = core_attention
        return spec

    dense = with_core_attention(_implementation_layer_spec(model))
    num_experts = model.num_experts
    if num_experts is None:
        return dense
    moe = use_moe_router(with_core_attention(_implementation_layer_spec(model, num_experts)))
    print_rank_0(describe_moe(model.moe))
    return layer_specs_for_pattern(dense, moe, moe_layer_pattern(model.moe.moe_layer_freq,
                                                                  model.moe.num_layers))


def build_gpt_model(transformer: TransformerConfig, model: ModelConfig, padded_vocab_size: int,
                    vocab_size: Optional[int] = None) -> GPTModel:
    """Construct the GPT model of ``transformer`` (the run's ``TransformerConfig``; the model
    keeps a copy, as megatron-core modules keep a reference) and ``model`` with
    ``padded_vocab_size`` embedding rows (logits of rows at or beyond ``vocab_size``, when given,
    take no probability), its initial weights drawn from ``--seed`` and each parameter's name, the
    same under every tensor/pipeline-parallel layout (megatron/model/init.py)."""
    config = copy.copy(transformer)
    spec = gpt_layer_spec(model, config)
    if model.sequence_parallel:
        spec = sequence_parallel_capable(spec, config.num_layers)
    position = model_position_embedding_type(model.position_embedding_type)
    scaling = model.rope_scaling
    gpt = GPTModel(
        config=config,
        transformer_layer_spec=spec,
        vocab_size=padded_vocab_size,
        max_sequence_length=model.max_position_embeddings,
        pre_process=True,
        post_process=True,
        parallel_output=True,
        share_embeddings_and_output_weights=not model.untie_embeddings_and_output_weights,
        # YaRN's embedding is given below: megatron-core builds it on the GPU
        position_embedding_type="rope" if position == "yarn" else position,
        rotary_percent=model.rotary_percent,
        rotary_base=model.rotary_base,
        seq_len_interpolation_factor=scaling.seq_len_interpolation_factor,
        rope_scaling=scaling.rope_scaling,
        rope_scaling_factor=scaling.rope_scaling_factor,
    )
    # logits of the padding rows (>= vocab_size, from tokenizer_setup) are -inf, so every TP
    # size is the same model (megatron/model/vocab_padding.py)
    mask_output_layer_padding(gpt.output_layer, vocab_size, padded_vocab_size)
    # --position-embedding-type rope without a GPU too, at each Ulysses rank's global positions
    use_device_rotary_embedding(gpt, sequence_parallel=model.ds_sequence_parallel_size > 1)
    if position == "yarn":  # megatron-core's YaRN branch, its embedding without a GPU too
        use_yarn_rotary_embedding(gpt, model.rotary_percent, model.rotary_base,
                                  sequence_parallel=model.ds_sequence_parallel_size > 1)
    if model.embed_layernorm:  # BLOOM: LayerNorm on the word embeddings
        add_embedding_layernorm(gpt.embedding, config)
    # experts by their global ids (megatron/model/param_names.py), so every expert-parallel
    # layout draws the same experts
    gpt.first_local_expert = first_local_expert(model.num_experts)
    initialize_parameters(gpt.named_parameters(), config, model.seed,
                          canonical_name=lambda n: global_expert_name(n, gpt.first_local_expert))
    return gpt
