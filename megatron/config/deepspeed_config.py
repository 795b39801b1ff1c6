"""The DeepSpeed engine configuration derived from the Megatron flags (and ``--deepspeed_config``).

A value may be given as a flag or as a key of the ``--deepspeed_config`` JSON: given in both it
must agree (:func:`reconcile_with_flags` fails naming the flag, the key and both values); given
as a flag only it goes into the config; given in the JSON only it becomes the flag's value, so
the rest of the program (logging, schedules, the model's dtype) sees what DeepSpeed runs, and the
start-up log says so. ``"auto"`` (Hugging Face's placeholder) counts as not given.
"""
import copy
import json
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from megatron.errors import ConfigError
from megatron.optim.precision import deepspeed_precision_entries


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
    each iteration's batch (:func:`deepspeed_config_from_args`). The keys of
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
    sp = getattr(args, "ds_sequence_parallel_size", 1)
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


def deepspeed_config_from_args(args, train_batch_size: int) -> Dict[str, Any]:
    """DeepSpeed config dict: batch sizes from the flags (``train_batch_size`` is the current global
    batch, which differs from ``--global-batch-size`` during a rampup), ZeRO stage from
    ``--zero-stage`` or the JSON file (default 1 with several data-parallel ranks, else 0; at least
    1 under mixed precision, set by validate_args), precision (with the gradient accumulation and
    reduction dtypes of megatron/optim/precision.py) and gradient clipping from the flags. Other keys of
    the JSON file are kept."""
    config = copy.deepcopy(args.deepspeed_config_dict or {})
    config["train_micro_batch_size_per_gpu"] = args.micro_batch_size
    config["train_batch_size"] = train_batch_size
    config["gradient_accumulation_steps"] = train_batch_size // (
        args.micro_batch_size * args.data_parallel_size)
    zero = config.setdefault("zero_optimization", {})
    if zero.get("stage") == "auto":  # validate_args counted "auto" as not given
        del zero["stage"]
    if args.zero_stage is not None:
        zero["stage"] = args.zero_stage
    zero.setdefault("stage", 1 if args.data_parallel_size > 1 else 0)
    # validate_args reconciled these with the JSON (reconcile_with_flags): args hold the values
    config["gradient_clipping"] = args.clip_grad
    if args.bf16:
        config["bf16"] = {**config.get("bf16", {}), "enabled": True}
    if args.fp16:
        fp16 = {key: value for key, value in config.get("fp16", {}).items() if value != "auto"}
        fp16.update(enabled=True, loss_scale=args.loss_scale or 0)
        for key, value in (("initial_scale_power", args.initial_loss_scale),
                           ("min_loss_scale", args.min_loss_scale),
                           ("loss_scale_window", args.loss_scale_window),
                           ("hysteresis", args.hysteresis)):
            if value is not None:  # DeepSpeed takes integers but for loss_scale
                fp16[key] = int(round(math.log2(value))) if key == "initial_scale_power" else int(value)
        config["fp16"] = fp16
    # gradient accumulation and data-parallel reduction dtypes (fp32 under bf16 by default)
    config.update(deepspeed_precision_entries(args, config))
    if args.pipeline_model_parallel_size > 1 and args.sequence_parallel:
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
