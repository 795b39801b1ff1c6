"""Which GeLU the MLP computes: Megatron-LM's rule, in one place for the model, the checkpoint
record and the Hugging Face export.

Megatron-LM (and BigScience's fork, which trained BLOOM) computes GeLU by its tanh approximation
whenever the bias-GeLU fusion applies: by default, unless ``--no-bias-gelu-fusion`` is given or
the linear layers have no biases (``--disable-bias-linear``; Megatron-LM's ``validate_args``
turns the fusion off then), since megatron-core's fused ``bias_gelu_impl`` is the tanh form.
``--openai-gelu`` asks for the tanh form explicitly. Otherwise GeLU is the exact erf form.
Checkpoints written before ``bias_gelu_fusion`` was recorded computed erf (unless
``--openai-gelu``), which is what a record without the key means here.
"""
from typing import Mapping, Optional

TANH = "tanh"
ERF = "erf"


def gelu_form(flags: Mapping) -> Optional[str]:
    """:data:`TANH` or :data:`ERF` for the model flags ``flags`` (argparse dests: ``vars(args)``
    or a ``model_args.json`` ``model`` record), or None with ``swiglu`` (no GeLU)."""
    if flags.get("swiglu"):
        return None
    if flags.get("openai_gelu"):
        return TANH
    if flags.get("bias_gelu_fusion") and not flags.get("disable_bias_linear"):
        return TANH
    return ERF
