"""Megatron-LM's kernel fusions as megatron-core ``TransformerConfig`` fields, decided per device.

On a GPU the defaults are Megatron-LM's, each turned off by its Megatron-LM flag:

==========================  ===================================  ==============================
fusion (TransformerConfig)  GPU kernel                           off with
==========================  ===================================  ==============================
``bias_activation_fusion``  megatron-core's ``bias_gelu_impl``   ``--no-bias-gelu-fusion``
                            (tanh GeLU) / ``bias_swiglu_impl``   ``--no-bias-swiglu-fusion``
``bias_dropout_fusion``     megatron-core's fused bias-dropout-  ``--no-bias-dropout-fusion``
                            add
``apply_rope_fusion``       Transformer Engine's fused RoPE      ``--no-rope-fusion``
                            (needs TE)
``persist_layer_norm``      Apex's persistent LayerNorm (where   ``--no-persist-layer-norm``
                            the layer spec uses Apex's norm)
==========================  ===================================  ==============================

Their kernels need a GPU (``torch.compile``d or CUDA kernels of TE/Apex), so on a CPU all are off
and the unfused modules compute the same function: megatron-core's fused GeLU is the tanh
approximation and runs only when ``activation_func`` is ``F.gelu``, so which GeLU the model
computes is decided once, by megatron/model/gelu.py, and this module only picks the kernel that
computes it (``F.gelu`` + fusion on a GPU, ``tanh_gelu`` of megatron/model/activations.py
otherwise); fused SwiGLU is ``silu(a) * b`` as megatron-core's unfused GLU; the fused bias-dropout-add, RoPE and LayerNorm are
the same operations. ``masked_softmax_fusion`` and ``gradient_accumulation_fusion`` stay off
everywhere: the core attentions here never call megatron-core's fused softmax, and DeepSpeed (not
megatron-core's DDP with its ``main_grad`` buffers) accumulates the gradients.
"""
import dataclasses
from typing import Any, Dict, Optional

import torch.nn.functional as F

from megatron.model.activations import mlp_activation
from megatron.model.gelu import TANH, gelu_form


@dataclasses.dataclass(frozen=True)
class FusionFlags:
    """The flags the activation and the fusions follow (argparse dests): the MLP
    (``--disable-bias-linear``, ``--swiglu``, ``--openai-gelu``), each fusion's switch
    (``--no-bias-gelu-fusion``, ``--no-bias-swiglu-fusion``, ``--no-bias-dropout-fusion``,
    ``--no-rope-fusion``, ``--no-persist-layer-norm``) and what a fusion applies to
    (``--position-embedding-type``, ``--normalization``, ``--transformer-impl``)."""

    disable_bias_linear: bool
    swiglu: bool
    openai_gelu: bool
    bias_gelu_fusion: bool
    bias_swiglu_fusion: bool
    bias_dropout_fusion: bool
    apply_rope_fusion: bool
    persist_layer_norm: bool
    position_embedding_type: str
    normalization: str
    transformer_impl: str


@dataclasses.dataclass(frozen=True)
class FusionSupport:
    """What the GPU fusions need from this install: Transformer Engine's fused RoPE
    (megatron-core's ``rope_utils.fused_apply_rotary_pos_emb``) and Apex's layer norm
    (megatron-core's local layer spec then uses ``FusedLayerNorm``)."""

    te_fused_rope: bool
    apex_layer_norm: bool


def fusion_support() -> FusionSupport:
    """:class:`FusionSupport` as megatron-core found it when it was imported."""
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.models.gpt import gpt_layer_specs

    return FusionSupport(te_fused_rope=rope_utils.fused_apply_rotary_pos_emb is not None,
                         apex_layer_norm=bool(gpt_layer_specs.HAVE_APEX))


def fusion_config(flags: FusionFlags, device_type: str,
                  support: Optional[FusionSupport] = None) -> Dict[str, Any]:
    """The ``TransformerConfig`` fields ``activation_func``, ``bias_activation_fusion``,
    ``bias_dropout_fusion``, ``apply_rope_fusion``, ``persist_layer_norm``,
    ``masked_softmax_fusion`` and ``gradient_accumulation_fusion`` for the flags ``flags`` on
    ``device_type`` (``cuda`` or ``cpu``); ``support`` (default :func:`fusion_support`, asked only
    for ``cuda``) says which TE/Apex kernels exist. The MLP computes the same function on every
    device (module docstring)."""
    gpu = device_type == "cuda"
    if gpu and support is None:
        support = fusion_support()
    biases = not flags.disable_bias_linear
    if flags.swiglu:
        fuse_activation = gpu and flags.bias_swiglu_fusion
        activation = mlp_activation(True, None)  # F.silu, which bias_swiglu_impl fuses
    else:
        # megatron-core fuses F.gelu with its tanh kernel: only where the tanh form is wanted
        fuse_activation = (gpu and flags.bias_gelu_fusion and biases
                           and gelu_form(dataclasses.asdict(flags)) == TANH)
        activation = (F.gelu if fuse_activation
                      else mlp_activation(False, gelu_form(dataclasses.asdict(flags))))
    return {
        "activation_func": activation,
        "bias_activation_fusion": fuse_activation,
        "bias_dropout_fusion": gpu and flags.bias_dropout_fusion,
        "apply_rope_fusion": (gpu and flags.apply_rope_fusion and flags.position_embedding_type == "rope"
                              and support.te_fused_rope),
        "persist_layer_norm": (gpu and flags.persist_layer_norm and flags.normalization == "LayerNorm"
                               and flags.transformer_impl == "local" and support.apex_layer_norm),
        "masked_softmax_fusion": False,
        "gradient_accumulation_fusion": False,
    }


def describe_fusions(fields: Dict[str, Any]) -> str:
    """One start-up log line naming the fusions ``fields`` (from :func:`fusion_config`)
    turn on."""
    names = {"bias_activation_fusion": "bias-activation", "bias_dropout_fusion": "bias-dropout-add",
             "apply_rope_fusion": "rope", "persist_layer_norm": "persistent layer norm"}
    on = [label for key, label in names.items() if fields[key]]
    return f"fused kernels: {', '.join(on) if on else 'none (unfused modules compute the same functions)'}"
