"""gpt_layer_spec (megatron/model/gpt_model.py) with Transformer Engine absent, installed
but failing to import, and with a stand-in for it: which megatron-core layer spec is built, called
with arguments megatron-core's getter accepts, and which core attention it gets."""
import importlib
import importlib.machinery
import importlib.util
import inspect

import pytest
from megatron.core.models.gpt import gpt_layer_specs

REAL_TE_SPEC = gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec


def _args(extra=()):
    from megatron.config.parser import parse_args
    return parse_args(["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
                       "--seq-length", "8", "--micro-batch-size", "1", "--train-iters", "1",
                       "--lr", "1e-3", "--normalization", "RMSNorm", *extra], require_data=False)


def te_found(monkeypatch, status):
    """Transformer Engine detection (megatron/model/transformer_engine_support.py) reports
    ``status``."""
    from megatron.model import transformer_engine_support
    monkeypatch.setattr(transformer_engine_support, "transformer_engine_status", lambda: status)


def te_absent(monkeypatch):
    from megatron.model.transformer_engine_support import TransformerEngineStatus
    te_found(monkeypatch, TransformerEngineStatus(importable=False))


@pytest.fixture
def te_installed(monkeypatch):
    """Transformer Engine 2.9 imports; megatron-core's TE spec getter is a stand-in with
    the real getter's signature (so a keyword it does not take is a TypeError, as on a GPU install)
    that returns megatron-core's local spec and records its calls."""
    from megatron.model.transformer_engine_support import TransformerEngineStatus
    te_found(monkeypatch, TransformerEngineStatus(importable=True, version=(2, 9)))
    calls = []

    def te_spec(*args, **kwargs):
        inspect.signature(REAL_TE_SPEC).bind(*args, **kwargs)
        calls.append(kwargs)
        return gpt_layer_specs.get_gpt_layer_local_spec(normalization="RMSNorm")

    monkeypatch.setattr(gpt_layer_specs, "get_gpt_layer_with_transformer_engine_spec", te_spec)
    return calls


def test_without_transformer_engine_the_local_spec_with_sdpa(monkeypatch, capsys):
    from helpers.models import layer_spec
    from megatron.model.sdpa_attention import SDPAttention

    te_absent(monkeypatch)
    monkeypatch.setattr(gpt_layer_specs, "get_gpt_layer_with_transformer_engine_spec",
                        lambda *a, **k: pytest.fail("TE spec built without TE"))
    spec = layer_spec(_args())
    attention = spec.submodules.self_attention
    assert attention.submodules.core_attention.module is SDPAttention
    assert "attention backend: sdpa" in capsys.readouterr().out


def test_with_transformer_engine_its_spec_with_valid_arguments(te_installed, capsys):
    from helpers.models import layer_spec
    from megatron.model.sdpa_attention import SDPAttention

    spec = layer_spec(_args())  # --transformer-impl transformer_engine (the default)
    assert len(te_installed) == 1  # megatron-core's TE getter built this spec
    # on this CPU machine --attention-backend auto runs SDPA inside TE's spec
    assert spec.submodules.self_attention.submodules.core_attention.module is SDPAttention
    assert "attention backend: sdpa" in capsys.readouterr().out
    layer_spec(_args(["--transformer-impl", "local"]))
    assert len(te_installed) == 1  # --transformer-impl local: not TE's


def test_transformer_impl_default_falls_back_explicit_is_an_error(monkeypatch, capsys):
    te_absent(monkeypatch)
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


def _fake_transformer_engine(monkeypatch, import_error):
    """A ``transformer_engine`` package that find_spec finds and whose ``pytorch`` module raises
    ``import_error`` on import (a TE built for another torch or CUDA, say)."""
    real_find_spec, real_import = importlib.util.find_spec, importlib.import_module
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        importlib.machinery.ModuleSpec(name, None) if name == "transformer_engine"
        else real_find_spec(name, *a)))

    def fake_import(name, *a):
        if name.startswith("transformer_engine"):
            raise import_error
        return real_import(name, *a)

    monkeypatch.setattr(importlib, "import_module", fake_import)


def test_detection_imports_transformer_engine(monkeypatch):
    """Detection imports TE: found by find_spec but failing to import, it is not available, and the
    import error is what is reported; absent, nothing is imported."""
    from megatron.model.transformer_engine_support import transformer_engine_available, transformer_engine_status

    _fake_transformer_engine(monkeypatch, OSError("libcudnn.so.9: cannot open shared object file"))
    status = transformer_engine_status()
    assert (status.importable, status.installed) == (False, True)
    assert status.problem == "OSError: libcudnn.so.9: cannot open shared object file"
    assert not transformer_engine_available()
    monkeypatch.undo()
    monkeypatch.setattr(importlib, "import_module", lambda *a: pytest.fail("imported without TE"))
    assert transformer_engine_status() == transformer_engine_status().__class__(importable=False)


def test_transformer_engine_that_does_not_import_is_not_chosen_and_says_why(monkeypatch, capsys):
    """The default falls back to local with a start-up warning naming the import error; asking for
    transformer_engine (or a TE attention backend) is an error naming it."""
    _fake_transformer_engine(monkeypatch, ImportError("undefined symbol: _ZN3c104cuda9SetDevice"))
    args = _args()
    assert args.transformer_impl == "local"
    assert ("warning: Transformer Engine is installed but does not import (ImportError: undefined "
            "symbol: _ZN3c104cuda9SetDevice); using --transformer-impl local") in args.run_config.notes
    for extra in (["--transformer-impl", "transformer_engine"], ["--attention-backend", "te"]):
        with pytest.raises(SystemExit):
            _args(extra)
        assert ("Transformer Engine is installed but does not import (ImportError: undefined "
                "symbol: _ZN3c104cuda9SetDevice)") in capsys.readouterr().err


def test_known_warnings_keep_a_broken_transformer_engine_visible(monkeypatch):
    """megatron-core's "not installed" notices are silenced only for packages that are absent."""
    import warnings

    from megatron.runtime.known_warnings import quiet_known_warnings

    real_find_spec = importlib.util.find_spec
    for te_present in (False, True):
        # called in this iteration; after the loop it sees the last te_present either way (B023)
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
            importlib.machinery.ModuleSpec(name, None) if te_present and name == "transformer_engine"  # noqa: B023
            else None if name in ("apex", "transformer_engine") else real_find_spec(name, *a)))
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            quiet_known_warnings()
            warnings.warn("Transformer Engine is not installed. Falling back to Megatron Local", stacklevel=2)
            warnings.warn("Apex is not installed. Falling back to Torch Norm", stacklevel=2)
        assert [str(w.message).split()[0] for w in seen] == (["Transformer"] if te_present else [])
