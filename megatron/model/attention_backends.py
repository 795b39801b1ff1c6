"""``--attention-backend``: which core attention runs, decided once at start-up and logged.

Values: Megatron-LM's ``auto``, ``flash``, ``fused``, ``unfused``, ``local`` plus ``sdpa``, ``flex``
and ``te``. What each runs (every one honours the batch's segments, prefixes and ALiBi):

==========  ==================================================================================
``sdpa``    ``torch.nn.functional.scaled_dot_product_attention`` (megatron/model/sdpa_attention.py);
            CPU and GPU; the reference. ``local`` (Megatron-LM's own unfused attention) runs it.
``flex``    FlexAttention with a block mask (megatron/model/flex_attention.py); GPU training, no
            attention dropout. On CPU it has no backward: refused for CPU training.
``te``      Transformer Engine (megatron/model/te_attention.py), TE picks its kernel; needs TE
            and ``--transformer-impl transformer_engine`` on a GPU. ``flash`` / ``fused`` /
            ``unfused`` are ``te`` restricted to that kernel family (``flash`` cannot take the
            ``arbitrary`` mask prefix-LM batches need: refused for them; packed documents
            without prefixes run TE's packed ``thd`` format, which it can).
``auto``    CPU: ``sdpa``. GPU: batches with segments or prefixes get ``flex`` (block-sparse)
            when attention dropout is 0, else ``te`` when installed, else ``sdpa``; plain causal
            batches get ``te`` when installed, else ``sdpa`` (flash kernels through SDPA), except
            that with ALiBi (a dense bias for SDPA) ``flex`` comes before ``sdpa``.
==========  ==================================================================================

An explicit choice that cannot run here is an error naming the flag; only ``auto`` falls back.
"""
import dataclasses
import importlib.util
from typing import Optional

MEGATRON_LM_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
OWN_BACKENDS = ("sdpa", "flex", "te")
ATTENTION_BACKEND_CHOICES = MEGATRON_LM_BACKENDS + OWN_BACKENDS
TE_KERNELS = ("flash", "fused", "unfused")


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """The resolved backend: ``name`` (sdpa, flex or te), the TE kernel family it is restricted
    to (or None), what was requested and why this was chosen."""

    name: str
    requested: str
    reason: str
    te_kernel: Optional[str] = None

    def describe(self) -> str:
        """One start-up log line."""
        kernel = f" ({self.te_kernel} kernels only)" if self.te_kernel else ""
        return f"attention backend: {self.name}{kernel} [--attention-backend {self.requested}: {self.reason}]"


def transformer_engine_available() -> bool:
    """True when Transformer Engine can be imported (GPU installs); never required."""
    return importlib.util.find_spec("transformer_engine") is not None


def flex_attention_available() -> bool:
    """True when this torch has ``torch.nn.attention.flex_attention``."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def _error(requested: str, why: str):
    from megatron.arguments import ArgumentError

    return ArgumentError(f"--attention-backend {requested}: {why}")


def resolve_attention_backend(requested: str, *, device_type: str, te_available: bool,
                              transformer_impl: str, structured_batches: bool,
                              attention_dropout: float, training: bool = True,
                              flex_available: bool = True, alibi: bool = False,
                              prefix_batches: bool = False) -> AttentionBackend:
    """The backend for ``requested`` (one of :data:`ATTENTION_BACKEND_CHOICES`) on ``device_type``
    (``cpu``/``cuda``), given whether TE imports, ``--transformer-impl``, whether batches carry
    segments or prefixes (and prefixes: ``--prefix-lm``), ``--attention-dropout``, whether the
    model trains and whether it uses ALiBi (see the module docstring). Raises ArgumentError when an explicit choice cannot run."""
    if requested not in ATTENTION_BACKEND_CHOICES:
        raise _error(requested, f"unknown; choose one of {', '.join(ATTENTION_BACKEND_CHOICES)}")
    if requested in ("sdpa", "local"):
        why = "explicit" if requested == "sdpa" else "Megatron-LM's local attention runs on SDPA here"
        return AttentionBackend("sdpa", requested, why)
    if requested == "flex":
        if not flex_available:
            raise _error(requested, "this torch has no torch.nn.attention.flex_attention")
        if device_type == "cpu" and training:
            raise _error(requested, "torch's FlexAttention has no backward pass on CPU; CPU training "
                                    "runs --attention-backend sdpa (or auto)")
        if attention_dropout > 0:
            raise _error(requested, f"FlexAttention has no attention dropout; set "
                                    f"--attention-dropout 0 (got {attention_dropout})")
        return AttentionBackend("flex", requested, "explicit")
    if requested in ("te",) + TE_KERNELS:
        if not te_available:
            raise _error(requested, "Transformer Engine is not installed (pip install "
                                    "transformer-engine[pytorch]); use sdpa or flex")
        if transformer_impl != "transformer_engine":
            raise _error(requested, f"needs --transformer-impl transformer_engine (got {transformer_impl})")
        if device_type != "cuda":
            raise _error(requested, "Transformer Engine attention needs a CUDA device")
        if requested == "flash" and prefix_batches:
            raise _error(requested, "flash attention kernels take no arbitrary mask, which "
                                    "--prefix-lm batches need; use unfused, fused, te, flex or sdpa")
        kernel = requested if requested in TE_KERNELS else None
        return AttentionBackend("te", requested, "explicit", te_kernel=kernel)
    # auto
    if device_type != "cuda":
        return AttentionBackend("sdpa", requested, "CPU: SDPA (FlexAttention has no CPU backward)")
    te_ok = te_available and transformer_impl == "transformer_engine"
    if structured_batches:
        if flex_available and attention_dropout == 0:
            return AttentionBackend("flex", requested, "GPU, packed/prefix batches: block-sparse FlexAttention")
        if te_ok:
            return AttentionBackend("te", requested, "GPU, packed/prefix batches with attention dropout: "
                                                     "Transformer Engine with an arbitrary mask")
        return AttentionBackend("sdpa", requested, "GPU, packed/prefix batches, no Transformer Engine: "
                                                   "SDPA per segment")
    if te_ok:
        return AttentionBackend("te", requested, "GPU, causal batches: Transformer Engine")
    if alibi and flex_available and attention_dropout == 0:
        return AttentionBackend("flex", requested, "GPU, causal batches with ALiBi, no Transformer "
                                                   "Engine: FlexAttention (ALiBi as score_mod)")
    return AttentionBackend("sdpa", requested, "GPU, causal batches, no Transformer Engine: SDPA")


def batches_have_structure(args) -> bool:
    """Whether this run's batches carry segments or prefixes: ``--reset-attention-mask``, or an
    entry point that packs samples (``finetune_t0.py`` sets ``packed_samples``)."""
    return bool(args.reset_attention_mask or getattr(args, "packed_samples", False))


def attention_backend_from_args(args, device_type: Optional[str] = None,
                                training: bool = True) -> AttentionBackend:
    """:func:`resolve_attention_backend` for parsed flags on this machine (``cuda`` when a GPU is
    visible, unless ``device_type`` says otherwise)."""
    import torch

    if device_type is None:
        device_type = "cuda" if torch.cuda.is_available() else "cpu"
    return resolve_attention_backend(
        args.attention_backend, device_type=device_type,
        te_available=transformer_engine_available(), transformer_impl=args.transformer_impl,
        structured_batches=batches_have_structure(args), attention_dropout=args.attention_dropout,
        training=training, flex_available=flex_attention_available(),
        alibi=args.position_embedding_type == "alibi",
        prefix_batches=bool(getattr(args, "prefix_lm", False)))


def core_attention_spec(backend: AttentionBackend, alibi: bool):
    """The core-attention ``ModuleSpec`` of ``backend`` (``alibi``: add ALiBi biases)."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    if backend.name == "sdpa":
        from megatron.model.sdpa_attention import SDPAttention as cls
    elif backend.name == "flex":
        from megatron.model.flex_attention import FlexCoreAttention as cls
    elif backend.name == "te":
        from megatron.model.te_attention import te_structured_attention_class

        cls = te_structured_attention_class()
    else:
        raise ValueError(f"unknown attention backend {backend.name!r}")
    return ModuleSpec(module=cls, params={"alibi": alibi})


def apply_te_kernel_environment(backend: AttentionBackend, environ=None) -> None:
    """Restrict TE to ``backend.te_kernel`` through its environment switches (before TE's first
    attention call); nothing for other backends."""
    import os

    from megatron.model.te_attention import te_kernel_environment

    if backend.name == "te":
        (environ if environ is not None else os.environ).update(te_kernel_environment(backend.te_kernel))
