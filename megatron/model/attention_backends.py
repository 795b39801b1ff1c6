"""``--attention-backend``: which core attention runs, decided once at start-up and logged.

Values: Megatron-LM's ``auto``, ``flash``, ``fused``, ``unfused``, ``local`` plus ``sdpa``, ``flex``
and ``te``. What each runs (every one honours the batch's segments, prefixes and ALiBi):

==========  ==================================================================================
``sdpa``    ``torch.nn.functional.scaled_dot_product_attention`` (megatron/model/sdpa_attention.py);
            CPU and GPU; the reference. ``local`` (Megatron-LM's own unfused attention) runs it.
``flex``    FlexAttention with a block mask (megatron/model/flex_attention.py); GPU training, no
            attention dropout. On CPU it has no backward: refused for CPU training.
``te``      Transformer Engine (megatron/model/te_attention.py), TE picks its kernel; needs TE
            (it must import: megatron/model/transformer_engine_support.py) and
            ``--transformer-impl transformer_engine`` on a GPU. ``flash`` / ``fused`` /
            ``unfused`` are ``te`` restricted to that kernel family.
``auto``    CPU: ``sdpa``. GPU: batches with segments or prefixes get ``flex`` (block-sparse)
            when attention dropout is 0, else ``te`` when installed, else ``sdpa``; plain causal
            batches get ``te`` when installed, else ``sdpa`` (flash kernels through SDPA), except
            that with ALiBi (a dense bias for SDPA) ``flex`` comes before ``sdpa``.
==========  ==================================================================================

The backend is resolved once, by ``validate_args`` (``AttentionChoice.resolved``, in
``args.run_config.model.attention``); the model builds what it names. An explicit choice that
cannot run stops the run before distributed start-up: Transformer Engine's when the flags are
validated, FlexAttention's limits (no CPU backward, no dropout) when the run starts (``check_backend_trains``), so tools that only parse
flags accept them. Transformer Engine combinations that have no kernel are refused, naming
what runs instead: ``flash`` without a flash-attn package, with attention dropout when only
flash-attn 3/4 (no dropout) is installed, or for ``--prefix-lm`` batches (their ``arbitrary``
mask runs on TE's unfused kernels only); ``fused`` for ``--prefix-lm`` batches; ``unfused`` for
packed documents without prefixes (TE's packed ``thd`` format) before TE 2.12. Where TE's unfused
kernel runs the prefix batches' ``arbitrary`` mask (``te``, ``unfused``, and ``auto`` with
attention dropout) the start-up line says what it stores: ``[b, h, s, s]`` attention
probabilities per layer.

An explicit choice that cannot run here is an error naming the flag; only ``auto`` falls back.
"""
import dataclasses
import importlib.util
from typing import Optional, Tuple

from megatron.errors import ArgumentError

MEGATRON_LM_BACKENDS = ("auto", "flash", "fused", "unfused", "local")
OWN_BACKENDS = ("sdpa", "flex", "te")
ATTENTION_BACKEND_CHOICES = MEGATRON_LM_BACKENDS + OWN_BACKENDS
TE_KERNELS = ("flash", "fused", "unfused")
TE_BACKENDS = ("te",) + TE_KERNELS
FLEX_NO_CPU_BACKWARD = ("torch's FlexAttention has no backward pass on CPU; CPU training runs "
                        "--attention-backend sdpa (or auto)")


@dataclasses.dataclass(frozen=True)
class AttentionBackend:
    """The resolved backend: ``name`` (sdpa, flex or te), the TE kernel family it is restricted
    to (or None), what was requested and why this was chosen."""

    name: str
    requested: str
    reason: str
    te_kernel: Optional[str] = None
    cost: str = ""

    def describe(self) -> str:
        """One start-up log line (with what the choice costs, where that is notable)."""
        kernel = f" ({self.te_kernel} kernels only)" if self.te_kernel else ""
        cost = f"; cost: {self.cost}" if self.cost else ""
        return (f"attention backend: {self.name}{kernel} [--attention-backend {self.requested}: "
                f"{self.reason}{cost}]")


def flex_attention_available() -> bool:
    """True when this torch has ``torch.nn.attention.flex_attention``."""
    return importlib.util.find_spec("torch.nn.attention.flex_attention") is not None


def _error(requested: str, why: str):
    return ArgumentError(f"--attention-backend {requested}: {why}")


def _te_kernel_problem(requested: str, *, structured_batches: bool, prefix_batches: bool,
                       attention_dropout: float, te_version: Optional[Tuple[int, int]],
                       flash_attn: Tuple[str, ...]) -> Optional[str]:
    """Why TE's ``requested`` kernel family (flash, fused or unfused) has no kernel for this
    run's batches (module docstring), or None when it has one."""
    from megatron.model.transformer_engine_support import (  # lazy: importlib.metadata (~20 ms), for TE only
        FLASH_ATTN_WITH_DROPOUT,
        UNFUSED_THD_MIN_VERSION,
    )

    flex = "flex" if attention_dropout == 0 else "flex (with --attention-dropout 0)"
    if requested == "flash":
        if prefix_batches:
            return ("flash attention kernels take no arbitrary mask, which --prefix-lm batches "
                    f"need; use unfused, te, {flex} or sdpa")
        if not flash_attn:
            return ("Transformer Engine's flash kernels come from the flash-attn package, which is "
                    f"not installed (pip install flash-attn); use fused, te, {flex} or sdpa")
        with_dropout = [d for d in flash_attn if d.split("==")[0] in FLASH_ATTN_WITH_DROPOUT]
        if attention_dropout > 0 and not with_dropout:
            return (f"the installed {', '.join(flash_attn)} has no attention dropout (flash-attn 2 "
                    f"has); set --attention-dropout 0 (got {attention_dropout}), install "
                    "flash-attn, or use fused, te or sdpa")
    if requested == "fused" and prefix_batches:
        return ("Transformer Engine's fused (cuDNN) kernels take no arbitrary mask, which "
                "--prefix-lm batches need (only its unfused kernels do); use unfused or te (they "
                f"store [b, h, s, s] attention probabilities), {flex} or sdpa")
    packed_thd = structured_batches and not prefix_batches
    if (requested == "unfused" and packed_thd
            and (te_version is None or tuple(te_version) < UNFUSED_THD_MIN_VERSION)):
        found = "this Transformer Engine" if te_version is None else \
            f"Transformer Engine {te_version[0]}.{te_version[1]}"
        return ("packed documents without prefixes run Transformer Engine's packed thd format, "
                f"for which {found} has no unfused kernel (TE 2.12 adds one); use fused, flash, "
                f"te, {flex} or sdpa")
    return None


def _unfused_cost(dense_scores_mib: Optional[float]) -> str:
    """What TE's unfused kernel stores for an ``arbitrary`` mask."""
    size = "" if dense_scores_mib is None else f" (at least {dense_scores_mib:,.0f} MiB per layer)"
    return ("Transformer Engine's unfused kernel (the only one for the arbitrary mask prefix "
            f"batches need) stores [b, h, s, s] attention probabilities for the backward{size}")


def resolve_attention_backend(requested: str, *, device_type: str, te_available: bool,
                              transformer_impl: str, structured_batches: bool,
                              attention_dropout: float, training: bool = True,
                              flex_available: bool = True, alibi: bool = False,
                              prefix_batches: bool = False,
                              te_version: Optional[Tuple[int, int]] = None,
                              flash_attn: Tuple[str, ...] = (),
                              te_problem: Optional[str] = None,
                              dense_scores_mib: Optional[float] = None,
                              sequence_parallel_size: int = 1) -> AttentionBackend:
    """The backend for ``requested`` (one of :data:`ATTENTION_BACKEND_CHOICES`) on ``device_type``
    (``cpu``/``cuda``), given whether TE imports (``te_problem``: why not, when installed), its
    ``te_version`` (major, minor) and the installed ``flash_attn`` distributions,
    ``--transformer-impl``, whether batches carry segments or prefixes (and prefixes:
    ``--prefix-lm``), ``--attention-dropout``, whether the model trains and whether it uses
    ALiBi (see the module docstring); ``dense_scores_mib``: the size of one ``[b, h, s, s]``
    tensor of this run (MiB), for the cost note; ``sequence_parallel_size``:
    ``--ds-sequence-parallel-size`` (Transformer Engine's attention is not run inside the Ulysses
    all-to-all: refused when asked for, passed over by ``auto``). Raises ArgumentError when an
    explicit choice cannot run."""
    if requested not in ATTENTION_BACKEND_CHOICES:
        raise _error(requested, f"unknown; choose one of {', '.join(ATTENTION_BACKEND_CHOICES)}")
    if requested in ("sdpa", "local"):
        why = "explicit" if requested == "sdpa" else "Megatron-LM's local attention runs on SDPA here"
        return AttentionBackend("sdpa", requested, why)
    if requested == "flex":
        if not flex_available:
            raise _error(requested, "this torch has no torch.nn.attention.flex_attention")
        if device_type == "cpu" and training:
            raise _error(requested, FLEX_NO_CPU_BACKWARD)
        if attention_dropout > 0:
            raise _error(requested, f"FlexAttention has no attention dropout; set "
                                    f"--attention-dropout 0 (got {attention_dropout})")
        return AttentionBackend("flex", requested, "explicit")
    unfused_cost = _unfused_cost(dense_scores_mib) if prefix_batches else ""
    if requested in TE_BACKENDS:
        if sequence_parallel_size > 1:
            raise _error(requested, f"Transformer Engine's attention does not run inside the "
                                    f"DeepSpeed-Ulysses all-to-all here (--ds-sequence-parallel-size "
                                    f"{sequence_parallel_size}); use sdpa, flex or auto")
        if not te_available:
            why = te_problem or "Transformer Engine is not installed (pip install transformer-engine[pytorch])"
            raise _error(requested, f"{why}; use sdpa or flex")
        if transformer_impl != "transformer_engine":
            raise _error(requested, f"needs --transformer-impl transformer_engine (got {transformer_impl})")
        if device_type != "cuda":
            raise _error(requested, "Transformer Engine attention needs a CUDA device")
        kernel = requested if requested in TE_KERNELS else None
        if kernel is not None:
            problem = _te_kernel_problem(kernel, structured_batches=structured_batches,
                                         prefix_batches=prefix_batches,
                                         attention_dropout=attention_dropout,
                                         te_version=te_version, flash_attn=flash_attn)
            if problem:
                raise _error(requested, problem)
        return AttentionBackend("te", requested, "explicit", te_kernel=kernel, cost=unfused_cost)
    # auto
    if device_type != "cuda":
        return AttentionBackend("sdpa", requested, "CPU: SDPA (FlexAttention has no CPU backward)")
    te_ok = (te_available and transformer_impl == "transformer_engine"
             and sequence_parallel_size == 1)
    if structured_batches:
        if flex_available and attention_dropout == 0:
            return AttentionBackend("flex", requested, "GPU, packed/prefix batches: block-sparse FlexAttention")
        if te_ok and prefix_batches:
            return AttentionBackend(
                "te", requested, "GPU, prefix-LM batches with attention dropout: Transformer "
                                 "Engine with an arbitrary mask",
                cost=unfused_cost + "; --attention-dropout 0 runs block-sparse FlexAttention instead")
        if te_ok:
            return AttentionBackend("te", requested, "GPU, packed batches with attention dropout: "
                                                     "Transformer Engine's packed thd format")
        return AttentionBackend("sdpa", requested, "GPU, packed/prefix batches, no Transformer Engine: "
                                                   "SDPA per segment")
    if te_ok:
        return AttentionBackend("te", requested, "GPU, causal batches: Transformer Engine")
    if alibi and flex_available and attention_dropout == 0:
        return AttentionBackend("flex", requested, "GPU, causal batches with ALiBi, no Transformer "
                                                   "Engine: FlexAttention (ALiBi as score_mod)")
    return AttentionBackend("sdpa", requested, "GPU, causal batches, no Transformer Engine: SDPA")


@dataclasses.dataclass(frozen=True)
class AttentionChoice:
    """What resolving the core attention of a run reads (megatron/config/model_config.py builds it
    from the flags): ``attention_backend`` (the ``--attention-backend`` asked for),
    ``--transformer-impl``, whether batches carry segments or prefixes (``structured_batches``)
    and prefixes (``prefix_batches``: ``--prefix-lm``), ``--attention-dropout``, whether the model
    uses ALiBi, ``dense_scores_mib`` (MiB of one ``[b, h, s, s]`` tensor of this run) and
    ``--ds-sequence-parallel-size``; ``resolved``: the backend validation resolved (forward use on
    this machine), None where it could not (a FlexAttention choice that cannot run here)."""

    attention_backend: str
    transformer_impl: str
    structured_batches: bool
    prefix_batches: bool
    attention_dropout: float
    alibi: bool
    dense_scores_mib: float
    ds_sequence_parallel_size: int
    resolved: Optional[AttentionBackend] = None


def _this_device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_attention_choice(choice: AttentionChoice, te=None, device_type: Optional[str] = None,
                             training: bool = True) -> AttentionBackend:
    """:func:`resolve_attention_backend` of ``choice`` on this machine (``cuda`` when a GPU is
    visible, unless ``device_type`` says otherwise), with what importing Transformer Engine found
    (``te``: a ``TransformerEngineStatus`` of megatron/model/transformer_engine_support.py; asked
    for when None). ``validate_args`` calls it once (what runs here, forward at least:
    ``training=False``) and keeps the result in ``choice.resolved``; whether it also trains here
    is :func:`check_backend_trains`, asked by the training loop before start-up."""
    from megatron.model import transformer_engine_support  # lazy: importlib.metadata (~20 ms), for TE only

    if device_type is None:
        device_type = _this_device_type()
    if te is None:
        te = transformer_engine_support.transformer_engine_status()
    return resolve_attention_backend(
        choice.attention_backend, device_type=device_type,
        te_available=te.importable, transformer_impl=choice.transformer_impl,
        structured_batches=choice.structured_batches, attention_dropout=choice.attention_dropout,
        training=training, flex_available=flex_attention_available(),
        alibi=choice.alibi,
        prefix_batches=choice.prefix_batches, te_version=te.version,
        flash_attn=te.flash_attn, te_problem=te.describe_absence() if te.problem else None,
        dense_scores_mib=choice.dense_scores_mib,
        sequence_parallel_size=choice.ds_sequence_parallel_size)


def attention_backend(choice: AttentionChoice) -> AttentionBackend:
    """The backend of ``choice``: the one ``validate_args`` resolved (``choice.resolved``); one it
    left unresolved (a FlexAttention choice that cannot run here) is resolved now, for training
    (:func:`resolve_attention_choice`: ArgumentError when it cannot run)."""
    resolved = choice.resolved
    return resolved if resolved is not None else resolve_attention_choice(choice)


def check_backend_trains(choice: AttentionChoice, device_type: Optional[str] = None) -> None:
    """ArgumentError when the backend of ``choice`` cannot train here (FlexAttention on a CPU: no
    backward pass; or with attention dropout), for the training loop to ask before distributed
    start-up; evaluation (forward only) may run FlexAttention on a CPU."""
    backend = attention_backend(choice)  # unresolved by validation: refused here
    if backend.name == "flex" and (device_type or _this_device_type()) == "cpu":
        raise _error(backend.requested, FLEX_NO_CPU_BACKWARD)


def core_attention_spec(backend: AttentionBackend, alibi: bool, sequence_parallel_size: int = 1):
    """The core-attention ``ModuleSpec`` of ``backend`` (``alibi``: add ALiBi biases); with
    DeepSpeed-Ulysses (``sequence_parallel_size`` > 1) the backend inside
    megatron/parallel/ulysses.py's ``UlyssesAttention``."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    if backend.name == "sdpa":
        from megatron.model.sdpa_attention import SDPAttention as cls  # lazy: megatron-core (seconds)
    elif backend.name == "flex":
        from megatron.model.flex_attention import FlexCoreAttention as cls  # lazy: megatron-core (seconds)
    elif backend.name == "te":
        from megatron.model.te_attention import te_structured_attention_class  # lazy: megatron-core (seconds)

        cls = te_structured_attention_class()
    else:
        raise ValueError(f"unknown attention backend {backend.name!r}")
    params = {"alibi": alibi}
    if backend.name in ("sdpa", "flex"):  # one cache of shape-only forms for all the layers
        from megatron.model.core_attention import SharedAttentionForms  # lazy: megatron-core (seconds)

        params["shared_forms"] = SharedAttentionForms()
    if sequence_parallel_size > 1:
        from megatron.parallel.ulysses import UlyssesAttention  # lazy: torch, only to build a model

        return ModuleSpec(module=UlyssesAttention,
                          params={"local_attention": cls, "local_params": params})
    return ModuleSpec(module=cls, params=params)


def apply_te_kernel_environment(backend: AttentionBackend, environ=None) -> None:
    """Restrict TE to ``backend.te_kernel`` through its environment switches (before TE's first
    attention call); nothing for other backends."""
    import os

    from megatron.model.te_attention import te_kernel_environment  # lazy: megatron-core, only for a TE backend

    if backend.name == "te":
        (environ if environ is not None else os.environ).update(te_kernel_environment(backend.te_kernel))
