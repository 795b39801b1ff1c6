"""Torch LayerNorm/RMSNorm for megatron-core's local layer spec, also under sequence parallelism.

megatron-core's local spec uses ``WrappedTorchNorm`` when Apex is absent (always on CPU), which
refuses ``sequence_parallel`` because it does not tag its parameters for the tensor-parallel
gradient sum. :class:`TorchNorm` builds the same torch module and tags weight and bias
``sequence_parallel`` (as megatron-core's fused norms do), so megatron/parallel/grads.py sums their
gradients over the tensor-parallel group.
"""
import torch
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import TransformerBlockSubmodules
from megatron.core.transformer.transformer_config import TransformerConfig


class TorchNorm:
    """``torch.nn.LayerNorm`` or ``torch.nn.RMSNorm`` per ``config.normalization`` (the
    constructor signature megatron-core's layer specs call), parameters tagged
    ``sequence_parallel = config.sequence_parallel``."""

    def __new__(cls, config: TransformerConfig, hidden_size: int, eps: float = 1e-5,
                persist_layer_norm: bool = False, zero_centered_gamma: bool = False,
                normalization: str = "LayerNorm"):
        if config.normalization == "LayerNorm":
            norm = torch.nn.LayerNorm(hidden_size, eps=eps)
        elif config.normalization == "RMSNorm":
            norm = torch.nn.RMSNorm(hidden_size, eps=eps)
        else:
            raise ValueError(f"normalization {config.normalization}: LayerNorm or RMSNorm only")
        for param in norm.parameters():
            param.sequence_parallel = config.sequence_parallel
        return norm


def _swap(module):
    return TorchNorm if module is WrappedTorchNorm else module


def sequence_parallel_capable(layer_spec, num_layers: int) -> TransformerBlockSubmodules:
    """The block spec for ``num_layers`` layers of ``layer_spec`` (one layer's spec, or the block
    of per-layer specs) with every ``WrappedTorchNorm`` (the layers' and the final norm) replaced
    by :class:`TorchNorm`; other norms (Transformer Engine's, Apex's) already handle sequence
    parallelism and are kept."""
    from megatron.core.transformer.transformer_block import LayerNormImpl

    if isinstance(layer_spec, TransformerBlockSubmodules):
        layer_specs, final_norm = list(layer_spec.layer_specs), layer_spec.layer_norm
    else:
        layer_specs, final_norm = [layer_spec] * num_layers, LayerNormImpl
    for spec in {id(s): s for s in layer_specs}.values():
        sub = spec.submodules
        for field in ("input_layernorm", "pre_mlp_layernorm"):
            if hasattr(sub, field):
                setattr(sub, field, _swap(getattr(sub, field)))
    return TransformerBlockSubmodules(layer_specs=layer_specs, layer_norm=_swap(final_norm))
