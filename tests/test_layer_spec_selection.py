"""layer_spec_from_args (megatron/model/gpt_model.py) with Transformer Engine absent and with a
stand-in for it: which megatron-core layer spec is built, called with arguments megatron-core's
getter accepts, and which core attention it gets."""
import importlib.machinery
import importlib.util
import inspect

import pytest

from megatron.core.models.gpt import gpt_layer_specs

REAL_TE_SPEC = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec


def _args(extra=()):
    from megatron.arguments import parse_args
    return parse_args(["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                       "--seq-length", "8", "--micro-batch-size", "1", "--train-iters", "1",
                       "--lr", "1e-3", "--normalization", "RMSNorm", *extra], require_data=False)


@pytest.fixture
def te_installed(monkeypatch):
    """find_spec finds a ``transformer_engine``; megatron-core's TE spec getter is a stand-in with
    the real getter's signature (so a keyword it does not take is a TypeError, as on a GPU install)
    that returns megatron-core's local spec and records its calls."""
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        importlib.machinery.ModuleSpec(name, None) if name == "transformer_engine"
        else real_find_spec(name, *a)))
    calls = []

    def te_spec(*args, **kwargs):
        inspect.signature(REAL_TE_SPEC).bind(*args, **kwargs)
        calls.append(kwargs)
        return gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm")

    monkeypatch.setattr(gpt_layer_specs, "get_gpt_layer_with_transformer_engine_spec", te_spec)
    return calls


def test_without_transformer_engine_the_local_spec_with_sdpa(monkeypatch, capsys):
    from megatron.model.gpt_model import layer_spec_from_args
    from megatron.model.sdpa_attention import SDPAttention

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name == "transformer_engine" else real_find_spec(name, *a)))
    monkeypatch.setattr(gpt_layer_specs, "get_gpt_layer_with_transformer_engine_spec",
                        lambda *a, **k: pytest.fail("TE spec built without TE"))
    spec = layer_spec_from_args(_args())
    attention = spec.submodules.self_attention
    assert attention.submodules.core_attention.module is SDPAttention
    assert "attention backend: sdpa" in capsys.readouterr().out


def test_with_transformer_engine_its_spec_with_valid_arguments(te_installed, capsys):
    from megatron.model.gpt_model import layer_spec_from_args
    from megatron.model.sdpa_attention import SDPAttention

    spec = layer_spec_from_args(_args())  # --transformer-impl transformer_engine (the default)
    assert len(te_installed) == 1  # megatron-core's TE getter built this spec
    # on this CPU machine --attention-backend auto runs SDPA inside TE's spec
    assert spec.submodules.self_attention.submodules.core_attention.module is SDPAttention
    assert "attention backend: sdpa" in capsys.readouterr().out
    layer_spec_from_args(_args(["--transformer-impl", "local"]))
    assert len(te_installed) == 1  # --transformer-impl local: not TE's


def test_transformer_impl_default_falls_back_explicit_is_an_error(monkeypatch, capsys):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name == "transformer_engine" else real_find_spec(name, *a)))
    assert _args().transformer_impl == "local"
    assert _args(["--transformer-impl", "local"]).transformer_impl == "local"
    with pytest.raises(SystemExit):
        _args(["--transformer-impl", "transformer_engine"])
    assert ("error: --transformer-impl transformer_engine: Transformer Engine is not installed (the "
            "module transformer_engine does not import); install it or give --transformer-impl "
            "local") in capsys.readouterr().err


def test_transformer_impl_default_is_transformer_engine_when_installed(te_installed):
    assert _args().transformer_impl == "transformer_engine"
    assert _args(["--transformer-impl", "transformer_engine"]).transformer_impl == "transformer_engine"
    assert _args(["--transformer-impl", "local"]).transformer_impl == "local"
