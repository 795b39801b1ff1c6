"""The DeepSpeed engine configuration derived from the Megatron flags (and ``--deepspeed_config``).

A value may be given as a flag or as a key of the ``--deepspeed_config`` JSON: given in both it
must agree (:func:`reconcile_with_flags` fails naming the flag, the key and both values); given
as a flag only it goes into the config; given in the JSON only it becomes the flag's value, so
the rest of the program (logging, schedules, the model's dtype) sees what DeepSpeed runs, and the
start-up log says so. ``"auto"`` (Hugging Face's placeholder) counts as not given.

``validate_args`` (megatron/config/arguments.py) runs the checks of DeepSpeed's flags kept here:
:func:`validate_deepspeed_json` reads the JSON, :func:`validate_deepspeed_config` reconciles it with
the flags and checks ``--use-distributed-optimizer`` and the precision flags (the device's support,
fp16 loss scaling, the mixed-precision recipe of megatron/optim/precision.py, resolved by
megatron/config/precision_flags.py). The engine's config is built from :class:`DeepSpeedFlags`
(``RunConfig.deepspeed``, megatron/config/run_config.py) by :func:`deepspeed_config`.
"""
import copy
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from megatron.config.precision_flags import precision_config_from_args, resolve_precision_flags
from megatron.errors import ArgumentError, ConfigError
from megatron.optim.precision import PrecisionConfig, deepspeed_precision_entries
from megatron.utils.typed_config import config_from_args


def load_deepspeed_json(path: str) -> Dict[str, Any]:
    """The ``--deepspeed_config`` file as a dict; :class:`ConfigError` naming the flag and the
    file when it is missing or not a JSON object."""
    if not os.path.isfile(path):
        raise ConfigError(f"--deepspeed_config {path}: no such file")
    with open(path) as f:
        try:
            config = json.load(f)
        except json.JSONDecodeError as e:
            raise ConfigError(f"--deepspeed_config {path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--deepspeed_config {path}: expected a JSON object, got "
                          f"{type(config).__name__}")
    return config


def json_value(config: Dict[str, Any], key: str) -> Any:
    """The value at dotted ``key`` (``"fp16.loss_scale"``) of ``config``, or None when absent or
    ``"auto"``. ``bf16`` also reads DeepSpeed's other spelling ``bfloat16``."""
    node: Any = config
    parts = key.split(".")
    if parts[0] == "bf16" and "bf16" not in config:
        parts[0] = "bfloat16"
    for part in parts:
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return None if node == "auto" else node


def _log2(value: float) -> float:
    return math.log2(value) if value > 0 else float("nan")


@dataclass(frozen=True)
class _Field:
    """A flag that has a DeepSpeed JSON key: ``to_json(flag value)``, ``from_json(key value)``."""

    key: str
    flag: str
    dest: str
    to_json: Callable[[Any], Any] = lambda v: v
    from_json: Callable[[Any], Any] = lambda v: v


# Flags with a JSON counterpart besides the batch sizes (see reconcile_with_flags).
FIELDS = (
    _Field("gradient_clipping", "--clip-grad", "clip_grad", from_json=float),
    _Field("fp16.loss_scale", "--loss-scale", "loss_scale", to_json=lambda v: v or 0,
           from_json=lambda v: float(v) or None),
    _Field("fp16.initial_scale_power", "--initial-loss-scale", "initial_loss_scale",
           to_json=_log2, from_json=lambda v: 2.0 ** v),
    _Field("fp16.min_loss_scale", "--min-loss-scale", "min_loss_scale", from_json=float),
    _Field("fp16.loss_scale_window", "--loss-scale-window", "loss_scale_window", from_json=int),
    _Field("fp16.hysteresis", "--hysteresis", "hysteresis", from_json=int),
    _Field("zero_optimization.stage", "--zero-stage", "zero_stage", from_json=int),
    _Field("bf16.enabled", "--bf16", "bf16", from_json=bool),
    _Field("fp16.enabled", "--fp16", "fp16", from_json=bool),
)


def _given(args, dest: str) -> bool:
    return dest in args.given_flags


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9, abs_tol=0.0)
    except (TypeError, ValueError):
        return a == b


def global_batch_from_json(args, config: Dict[str, Any]) -> Optional[int]:
    """The global batch size (samples) the JSON gives, for a run without
    ``--global-batch-size``: ``train_batch_size``, else ``--micro-batch-size x data-parallel size
    x gradient_accumulation_steps``; None when the JSON has neither."""
    if json_value(config, "train_batch_size") is not None:
        return int(json_value(config, "train_batch_size"))
    gas = json_value(config, "gradient_accumulation_steps")
    if gas is not None:
        return args.micro_batch_size * args.data_parallel_size * int(gas)
    return None


def reconcile_with_flags(args, config: Dict[str, Any]) -> List[str]:
    """Check ``config`` (the ``--deepspeed_config`` JSON) against the flags and take the values
    only the JSON gives into ``args``; returns ``KEY=VALUE (FLAG)`` for each taken value.

    Batch keys (``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``,
    ``train_batch_size``) must equal what the flags give; under a batch rampup or step schedule
    the JSON holds the final global batch (as BigScience's configs do), and the engine is given
    each iteration's batch (:func:`deepspeed_config`). The keys of
    :data:`FIELDS` must equal their flag when the flag is given. All disagreements are named in
    one :class:`ConfigError`."""
    path = args.deepspeed_config
    problems, taken = [], []
    expected = {"train_micro_batch_size_per_gpu": args.micro_batch_size,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "train_batch_size": args.global_batch_size}
    for key, value in expected.items():
        found = json_value(config, key)
        if found is not None and not _same(found, value):
            problems.append(
                f"{key}={found} disagrees with the flags (--micro-batch-size "
                f"{args.micro_batch_size}, --global-batch-size {args.global_batch_size}, "
                f"data-parallel size {args.data_parallel_size} give {value})")
    found = json_value(config, "sequence_parallel_size")
    sp = args.ds_sequence_parallel_size
    if found is not None and not _same(found, sp):
        problems.append(f"sequence_parallel_size={found} disagrees with --ds-sequence-parallel-size "
                        f"{sp} (the flag sets the DeepSpeed-Ulysses layout: give "
                        f"--ds-sequence-parallel-size {found})")
    for field in FIELDS:
        found = json_value(config, field.key)
        if found is None:
            continue
        if _given(args, field.dest):
            ours = getattr(args, field.dest)
            if not _same(field.to_json(ours), found):
                flag = args.given_flags[field.dest]
                shown = flag if isinstance(ours, bool) else f"{flag} {ours:g}" \
                    if isinstance(ours, float) else f"{flag} {ours}"
                problems.append(f"{field.key}={json.dumps(found)} disagrees with {shown}")
        else:
            try:
                if isinstance(found, (list, dict, str)) or (field.from_json is bool
                                                            and not isinstance(found, bool)):
                    raise ValueError
                value = field.from_json(found)
            except (TypeError, ValueError, OverflowError):
                problems.append(f"{field.key}={json.dumps(found)} is not a valid value (that of "
                                f"{field.flag})")
                continue
            if not _same(getattr(args, field.dest), value):
                setattr(args, field.dest, value)
                taken.append(f"{field.key}={json.dumps(found)} ({field.flag})")
    if problems:
        raise ConfigError(f"--deepspeed_config {path}: {'; '.join(problems)}; give each value "
                          "once (as the flag or as the JSON key) or make them agree")
    return taken


@dataclass(frozen=True)
class DeepSpeedFlags:
    """What the DeepSpeed engine's config is built from (:func:`deepspeed_config`): the validated
    flags (fields are their argparse dests; validate_args reconciled them with the JSON) and the
    ``--deepspeed_config`` JSON (``deepspeed_config_dict``, None without the flag): the micro
    batch (samples) and data-parallel size, the ZeRO stage, ``--clip-grad``, the precision
    (``precision``: megatron/optim/precision.py ``PrecisionConfig``) and fp16 loss scaling, and the
    pipeline and sequence-parallel layout."""

    deepspeed_config_dict: Optional[Dict[str, Any]]
    micro_batch_size: int
    data_parallel_size: int
    zero_stage: Optional[int]
    clip_grad: float
    bf16: bool
    fp16: bool
    loss_scale: Optional[float]
    initial_loss_scale: Optional[float]
    min_loss_scale: Optional[float]
    loss_scale_window: Optional[int]
    hysteresis: Optional[int]
    pipeline_model_parallel_size: int
    sequence_parallel: bool
    precision: PrecisionConfig


def deepspeed_flags_from_args(args) -> DeepSpeedFlags:
    """The :class:`DeepSpeedFlags` of validated ``args`` (every field read, none defaulted)."""
    return config_from_args(DeepSpeedFlags, args, precision=precision_config_from_args(args))


def deepspeed_config(flags: DeepSpeedFlags, train_batch_size: int) -> Dict[str, Any]:
    """DeepSpeed config dict: batch sizes from the flags (``train_batch_size``, samples, is the
    current global batch, which differs from ``--global-batch-size`` during a rampup), ZeRO stage
    from ``--zero-stage`` or the JSON file (default 1 with several data-parallel ranks, else 0; at
    least 1 under mixed precision, set by validate_args), precision (with the gradient accumulation
    and reduction dtypes of megatron/optim/precision.py) and gradient clipping from the flags.
    Other keys of the JSON file are kept (a copy: ``flags`` is not changed)."""
    config = copy.deepcopy(flags.deepspeed_config_dict or {})
    config["train_micro_batch_size_per_gpu"] = flags.micro_batch_size
    config["train_batch_size"] = train_batch_size
    config["gradient_accumulation_steps"] = train_batch_size // (
        flags.micro_batch_size * flags.data_parallel_size)
    zero = config.setdefault("zero_optimization", {})
    if zero.get("stage") == "auto":  # validate_args counted "auto" as not given
        del zero["stage"]
    if flags.zero_stage is not None:
        zero["stage"] = flags.zero_stage
    zero.setdefault("stage", 1 if flags.data_parallel_size > 1 else 0)
    # validate_args reconciled these with the JSON (reconcile_with_flags): the flags hold the values
    config["gradient_clipping"] = flags.clip_grad
    if flags.bf16:
        config["bf16"] = {**config.get("bf16", {}), "enabled": True}
    if flags.fp16:
        fp16 = {key: value for key, value in config.get("fp16", {}).items() if value != "auto"}
        fp16.update(enabled=True, loss_scale=flags.loss_scale or 0)
        for key, value in (("initial_scale_power", flags.initial_loss_scale),
                           ("min_loss_scale", flags.min_loss_scale),
                           ("loss_scale_window", flags.loss_scale_window),
                           ("hysteresis", flags.hysteresis)):
            if value is not None:  # DeepSpeed takes integers but for loss_scale
                fp16[key] = int(round(math.log2(value))) if key == "initial_scale_power" else int(value)
        config["fp16"] = fp16
    # gradient accumulation and data-parallel reduction dtypes (fp32 under bf16 by default)
    config.update(deepspeed_precision_entries(flags.precision, config))
    if flags.pipeline_model_parallel_size > 1 and flags.sequence_parallel:
        # The pipe engine splits the activation it sends over the tensor-parallel group, assuming
        # every tensor-parallel rank holds the same one; under sequence parallelism each holds its
        # own slice of the sequence, so the activations travel whole.
        pipeline = config.setdefault("pipeline", {})
        pipeline["pipe_partitioned"] = False
        pipeline["grad_partitioned"] = False
    config.setdefault("zero_allow_untested_optimizer", True)
    config.setdefault("steps_per_print", 10 ** 12)
    config.setdefault("wall_clock_breakdown", False)
    return config


# ------------------------------------------------- checks of validate_args (ArgumentError)
def validate_deepspeed_json(args, notes: List[str]) -> None:
    """``args.deepspeed_config_dict``: the ``--deepspeed_config`` JSON (None without the flag).
    Its sequence-length curriculum sections are read, and taken out, by
    megatron/config/seqlen_flags.py."""
    args.deepspeed_config_dict = None
    if args.deepspeed_config is not None:
        try:
            args.deepspeed_config_dict = load_deepspeed_json(args.deepspeed_config)
        except ConfigError as e:
            raise ArgumentError(str(e)) from None


def validate_deepspeed_config(args, notes: List[str]) -> None:
    """Flags and ``--deepspeed_config`` agree (megatron/config/deepspeed_config.py
    reconcile_with_flags; values only the JSON gives are taken into args and noted), then
    ``--use-distributed-optimizer`` (ZeRO stage 1 unless a stage >= 1 is given), the
    precision flags against the device and the mixed-precision recipe."""
    if args.deepspeed_config_dict is not None:
        try:
            taken = reconcile_with_flags(args, args.deepspeed_config_dict)
        except ConfigError as e:
            raise ArgumentError(str(e)) from None
        if taken:
            notes.append(f"from --deepspeed_config {args.deepspeed_config}: "
                                      + ", ".join(taken))
    if args.use_distributed_optimizer:
        if args.zero_stage is None:
            args.zero_stage = 1
        elif args.zero_stage == 0:
            where = ("--zero-stage 0" if "zero_stage" in args.given_flags else
                     f"--deepspeed_config {args.deepspeed_config} zero_optimization.stage=0")
            raise ArgumentError(f"--use-distributed-optimizer (optimizer states sharded over the "
                                f"data-parallel ranks: DeepSpeed ZeRO stage 1 here) contradicts "
                                f"{where}; drop one")
        notes.append(
            f"--use-distributed-optimizer: optimizer states sharded over the "
            f"{args.data_parallel_size} data-parallel rank(s) by DeepSpeed ZeRO stage "
            f"{args.zero_stage}")
    if args.fp16 and args.bf16:
        raise ArgumentError("--fp16 and --bf16 are mutually exclusive (one of them from "
                            f"--deepspeed_config {args.deepspeed_config}); pick one")
    _validate_precision_on_device(args, notes)
    _resolve_precision(args, notes)


def _resolve_precision(args, notes: List[str]) -> None:
    """Gradient accumulation and reduction dtypes (Megatron-LM's flags, the JSON's
    ``data_types.grad_accum_dtype`` and ``communication_data_type``) and the ZeRO stage of mixed
    precision (megatron/optim/precision.py ``resolve_precision_flags``)."""
    config = args.deepspeed_config_dict or {}
    try:
        notes.extend(resolve_precision_flags(
            args, json_value(config, "data_types.grad_accum_dtype"),
            json_value(config, "communication_data_type")))
    except ConfigError as e:
        raise ArgumentError(str(e)) from None


def _validate_precision_on_device(args, notes: List[str]) -> None:
    """``--fp16``/``--bf16`` need the DeepSpeed accelerator to support the type (DeepSpeed's
    engine refuses it otherwise with a traceback); fp16 loss-scale values."""
    given = "fp16" if args.fp16 else "bf16" if args.bf16 else None
    if given is not None:
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        supported = (accelerator.is_fp16_supported() if given == "fp16"
                     else accelerator.is_bf16_supported())
        if not supported:
            flag = (f"--{given}" if given in args.given_flags else
                    f"--deepspeed_config {args.deepspeed_config} {given}.enabled=true")
            other = "--bf16" if given == "fp16" else "--fp16"
            raise ArgumentError(f"{flag}: DeepSpeed's {accelerator.device_name()} accelerator has "
                                f"no {given} support on this machine; use {other} or full "
                                "precision (drop the flag)")
    scale = args.initial_loss_scale
    if scale is not None:
        if not (math.isfinite(scale) and scale > 0 and math.log2(scale).is_integer()):
            raise ArgumentError(f"--initial-loss-scale {args.initial_loss_scale:g} must be a power "
                                "of 2 (DeepSpeed takes fp16.initial_scale_power = log2 of it)")
    if args.loss_scale is not None and not (math.isfinite(args.loss_scale) and args.loss_scale >= 0):
        raise ArgumentError(f"--loss-scale {args.loss_scale:g} must be non-negative (0: dynamic)")
    if args.min_loss_scale is not None and not (math.isfinite(args.min_loss_scale)
                                                and args.min_loss_scale >= 1
                                                and args.min_loss_scale == int(args.min_loss_scale)):
        raise ArgumentError(f"--min-loss-scale {args.min_loss_scale:g} must be a positive whole "
                            "number (DeepSpeed's fp16.min_loss_scale is an integer)")
    for dest in ("loss_scale_window", "hysteresis"):
        if getattr(args, dest) is not None and getattr(args, dest) < 1:
            raise ArgumentError(f"--{dest.replace('_', '-')} {getattr(args, dest)} must be at least 1")
    if not args.fp16:
        given_scale = [args.given_flags[d] for d in ("loss_scale", "initial_loss_scale",
                                                     "min_loss_scale", "loss_scale_window",
                                                     "hysteresis") if d in args.given_flags]
        if given_scale:
            notes.append(f"{', '.join(given_scale)}: no effect without --fp16 "
                                      "(loss scaling is for float16 only)")
