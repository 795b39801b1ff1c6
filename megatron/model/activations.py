"""The MLP's activation function from the flags: SiLU (gated) with ``--swiglu``, else GeLU in the
form Megatron-LM's rule gives (megatron/model/gelu.py). megatron/model/fusions.py picks the kernel
that computes it (``TransformerConfig.activation_func`` and the bias-activation fusion)."""
from typing import Optional

import torch
import torch.nn.functional as F

from megatron.model.gelu import TANH


def tanh_gelu(x: torch.Tensor) -> torch.Tensor:
    """GeLU by its tanh approximation: the function of megatron-core's fused ``bias_gelu_impl``
    and of ``openai_gelu`` (torch's native kernel, on every device)."""
    return F.gelu(x, approximate="tanh")


def mlp_activation(swiglu: bool, gelu: Optional[str]):
    """The MLP activation: SiLU (gated) with ``swiglu`` (``--swiglu``), else GeLU in the form
    ``gelu`` (megatron/model/gelu.py ``gelu_form`` of the flags: Megatron-LM's rule): the tanh
    approximation by default (with biases and without ``--no-bias-gelu-fusion``) or with
    ``--openai-gelu``, else the exact erf form."""
    if swiglu:
        return F.silu
    return tanh_gelu if gelu == TANH else F.gelu
