"""Megatron-LM's kernel fusions (megatron/model/fusions.py): which TransformerConfig fields each
device gets for each flag, that megatron-core accepts them, and that the fused GPU kernels compute
the function the CPU's unfused modules compute (run here through megatron-core's own autograd
functions, their kernels un-compiled)."""
import pytest
import torch
import torch.nn.functional as F

from megatron.model.activations import tanh_gelu
from megatron.model.fusions import FusionFlags, FusionSupport, describe_fusions, fusion_config
from megatron.utils.typed_config import config_from_args

FUSIONS = ("bias_activation_fusion", "bias_dropout_fusion", "apply_rope_fusion",
           "persist_layer_norm", "masked_softmax_fusion", "gradient_accumulation_fusion")
EVERYTHING = FusionSupport(te_fused_rope=True, apex_layer_norm=True)


def fusion_config_from_args(args, device_type, support):
    """``fusion_config`` of the flags of ``args``."""
    return fusion_config(config_from_args(FusionFlags, args), device_type, support)


def _args(*extra):
    from megatron.config.parser import parse_args
    return parse_args(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                       "--seq-length", "16", "--micro-batch-size", "1", "--train-iters", "1",
                       "--lr", "1e-3", *extra], require_data=False)


def _fused(fields):
    return {name for name in FUSIONS if fields[name]}


@pytest.mark.parametrize("extra", [(), ("--swiglu",), ("--position-embedding-type", "rope"),
                                   ("--openai-gelu",), ("--no-bias-gelu-fusion",),
                                   ("--disable-bias-linear",)])
def test_cpu_runs_every_module_unfused_with_the_same_activation(extra):
    from megatron.model.activations import mlp_activation
    from megatron.model.gelu import gelu_form
    args = _args(*extra)
    fields = fusion_config_from_args(args, "cpu", EVERYTHING)
    assert _fused(fields) == set()
    assert fields["activation_func"] is mlp_activation(args.swiglu, gelu_form(vars(args)))
    assert describe_fusions(fields).startswith("fused kernels: none")


@pytest.mark.parametrize("extra,activation,fused", [
    # Megatron-LM's defaults: tanh GeLU through megatron-core's fused bias_gelu_impl
    ((), F.gelu, {"bias_activation_fusion", "bias_dropout_fusion", "persist_layer_norm"}),
    (("--openai-gelu",), F.gelu, {"bias_activation_fusion", "bias_dropout_fusion",
                                  "persist_layer_norm"}),
    # the erf form: megatron-core's fused kernel is tanh, so GeLU stays unfused
    (("--no-bias-gelu-fusion",), F.gelu, {"bias_dropout_fusion", "persist_layer_norm"}),
    (("--openai-gelu", "--no-bias-gelu-fusion"), tanh_gelu, {"bias_dropout_fusion",
                                                             "persist_layer_norm"}),
    (("--disable-bias-linear",), F.gelu, {"bias_dropout_fusion", "persist_layer_norm"}),
    (("--disable-bias-linear", "--openai-gelu"), tanh_gelu, {"bias_dropout_fusion",
                                                             "persist_layer_norm"}),
    (("--swiglu",), F.silu, {"bias_activation_fusion", "bias_dropout_fusion", "persist_layer_norm"}),
    (("--swiglu", "--no-bias-swiglu-fusion"), F.silu, {"bias_dropout_fusion", "persist_layer_norm"}),
    (("--no-bias-dropout-fusion",), F.gelu, {"bias_activation_fusion", "persist_layer_norm"}),
    (("--position-embedding-type", "rope"), F.gelu, {"bias_activation_fusion",
                                                     "bias_dropout_fusion", "apply_rope_fusion",
                                                     "persist_layer_norm"}),
    (("--position-embedding-type", "rope", "--no-rope-fusion"), F.gelu,
     {"bias_activation_fusion", "bias_dropout_fusion", "persist_layer_norm"}),
    (("--no-persist-layer-norm",), F.gelu, {"bias_activation_fusion", "bias_dropout_fusion"}),
    (("--normalization", "RMSNorm"), F.gelu, {"bias_activation_fusion", "bias_dropout_fusion"}),
])
def test_gpu_gets_megatron_lm_defaults_and_flags(extra, activation, fused):
    fields = fusion_config_from_args(_args(*extra), "cuda", EVERYTHING)
    assert _fused(fields) == fused
    assert fields["activation_func"] is activation


def test_gpu_fusions_need_their_kernels():
    """Without Transformer Engine no fused RoPE; without Apex (or with TE's layer spec, whose
    norms ignore the setting) no persistent layer norm."""
    args = _args("--position-embedding-type", "rope")
    none = FusionSupport(te_fused_rope=False, apex_layer_norm=False)
    assert _fused(fusion_config_from_args(args, "cuda", none)) == {"bias_activation_fusion",
                                                                   "bias_dropout_fusion"}
    args.transformer_impl = "transformer_engine"
    assert not fusion_config_from_args(args, "cuda", EVERYTHING)["persist_layer_norm"]


@pytest.mark.parametrize("extra", [(), ("--swiglu",), ("--openai-gelu", "--no-bias-gelu-fusion"),
                                   ("--disable-bias-linear",), ("--swiglu", "--disable-bias-linear")])
def test_megatron_core_accepts_the_gpu_fields(extra):
    """TransformerConfig's own checks (bias_activation_fusion needs F.gelu with biases or F.silu
    gated) pass for every GPU choice (RoPE fusion, which megatron-core checks against an installed
    TE, and Apex's norm aside)."""
    from megatron.core.transformer.transformer_config import TransformerConfig
    args = _args(*extra)
    fields = fusion_config_from_args(args, "cuda", FusionSupport(False, False))
    TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4,
                      gated_linear_unit=args.swiglu, add_bias_linear=not args.disable_bias_linear,
                      **fields)


def _uncompiled(function):
    """The Python function behind a torch.compile'd one (torch.compile returns the function itself
    under TORCHDYNAMO_DISABLE=1)."""
    return getattr(function, "__wrapped__", function)


def test_fused_bias_gelu_is_the_cpu_tanh_gelu(monkeypatch):
    """megatron-core's bias_gelu_impl (the GPU path, its torch.compile'd kernels run uncompiled
    here: the compiled wrapper's ``__wrapped__``, or the function itself where torch's compiler is
    disabled, as tools/cpu_env.sh does) equals tanh_gelu(y + bias), the CPU path, forward and
    backward."""
    from megatron.core.fusions import fused_bias_gelu
    for name in ("bias_gelu", "bias_gelu_back"):
        monkeypatch.setattr(fused_bias_gelu, name, _uncompiled(getattr(fused_bias_gelu, name)))
    y = torch.randn(5, 3, 8, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(8, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(5, 3, 8, dtype=torch.float64)
    fused = fused_bias_gelu.bias_gelu_impl(y, bias)
    fused_grads = torch.autograd.grad(fused, (y, bias), grad)
    cpu = tanh_gelu(y + bias)
    cpu_grads = torch.autograd.grad(cpu, (y, bias), grad)
    torch.testing.assert_close(fused, cpu, rtol=1e-7, atol=1e-7)
    for got, want in zip(fused_grads, cpu_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-7)
    assert (cpu - F.gelu(y + bias)).abs().max() > 1e-5  # and it is not the erf form


def test_fused_bias_swiglu_is_the_unfused_glu(monkeypatch):
    """megatron-core's bias_swiglu_impl equals silu(a) * b of (y + bias) split in halves, as its
    unfused MLP computes it, forward and backward, with and without biases."""
    from megatron.core.fusions import fused_bias_swiglu
    for name in ("bias_swiglu", "bias_swiglu_back", "swiglu", "swiglu_back"):
        monkeypatch.setattr(fused_bias_swiglu, name, _uncompiled(getattr(fused_bias_swiglu, name)))
    y = torch.randn(4, 2, 12, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(4, 2, 6, dtype=torch.float64)
    for bias in (torch.randn(12, dtype=torch.float64, requires_grad=True), None):
        fused = fused_bias_swiglu.bias_swiglu_impl(y, bias)
        x = y if bias is None else y + bias
        a, b = torch.chunk(x, 2, dim=-1)
        unfused = F.silu(a) * b
        inputs = (y,) if bias is None else (y, bias)
        torch.testing.assert_close(fused, unfused, rtol=1e-7, atol=1e-7)
        for got, want in zip(torch.autograd.grad(fused, inputs, grad),
                             torch.autograd.grad(unfused, inputs, grad), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-7, atol=1e-7)
