"""Learning-rate and weight-decay scheduling of the optimizer's parameter groups.

:class:`OptimizerParamScheduler` keeps megatron-core's interface and counters (``num_steps`` counts
consumed samples; ``step(increment)`` adds the samples of the iteration just done and also counts
one iteration) but evaluates the schedules of :mod:`megatron.schedules`, which are pure
vectorised functions of progress in iterations, samples or tokens. The same functions drive
``tools/preview_schedule.py``, so a preview equals what training does.

* Flags only (``--lr-decay-style constant|linear|cosine|inverse-square-root|WSD``): spans are in
  samples with Megatron-LM's rule (iteration flags x ``--global-batch-size``), and the values equal
  megatron-core's scheduler for the same flags.
* ``--lr-decay-style power``: the Power Scheduler (Shen et al. 2024) in tokens; phase lengths given
  in iterations are converted through the run's :class:`BatchSchedule` (rampup aware), and the
  batch size in the formula is the batch of the current iteration.
* ``--lr-schedule-config FILE``: ``lr_schedule`` (and optionally ``weight_decay_schedule``) in the
  schedule language; keys of ``lr_schedule`` that default to ``--lr``/``--min-lr`` (the ``inv``
  kind's) are filled in from the flags.

Every group gets ``lr = get_lr(group) * group['lr_mult']`` and
``weight_decay = get_wd(group) * group['wd_mult']`` (multipliers default to 1).
"""
import json
import logging
import os
from dataclasses import dataclass, replace
from typing import Any, Dict, Optional, Tuple

import numpy as np

from megatron.errors import ConfigError
from megatron.schedules.base import fill_run_defaults
from megatron.schedules.registry import Schedule, ScheduleContext, build_schedule
from megatron.schedules.seqlen import seq_length_plan, seq_length_spec
from megatron.schedules.units import BatchConfig, BatchSchedule, batch_schedule, train_iterations

logger = logging.getLogger(__name__)

# schedule parameter -> the flag(s) it comes from, for error messages
PARAM_FLAGS = {
    "lr_decay_style": "--lr-decay-style", "max_lr": "--lr", "min_lr": "--min-lr",
    "init_lr": "--lr-warmup-init", "lr_warmup_steps": "--lr-warmup-* (samples)",
    "lr_decay_steps": "--lr-decay-* / --train-* (samples)",
    "wsd_decay_steps": "--lr-wsd-decay-* (samples)", "lr_wsd_decay_style": "--lr-wsd-decay-style",
    "power_a": "--power-scheduler-a", "power_b": "--power-scheduler-b",
    "power_warmup_tokens": "--lr-warmup-* (tokens)",
    "power_decay_end_tokens": "--lr-decay-* / --train-* (tokens)",
    "power_decay_tokens": "--power-scheduler-decay-* (tokens)",
    "power_decay_style": "--power-scheduler-decay-style",
    "start_wd": "--start-weight-decay", "end_wd": "--end-weight-decay",
    "wd_incr_style": "--weight-decay-incr-style", "wd_incr_steps": "--train-* (samples)",
    "lr_schedule": "--lr-schedule-config lr_schedule",
    "weight_decay_schedule": "--lr-schedule-config weight_decay_schedule",
    # the run's shape: file-based spans, the power schedule's batch size and tokens depend on it
    "train_iters": "--train-iters/--train-samples (iterations)",
    "train_samples": "--train-iters/--train-samples (samples)",
    "global_batch_size": "--global-batch-size", "rampup_batch_size": "--rampup-batch-size",
    "batch_size_steps": "--step-batch-size-schedule (samples, batch)",
    "seq_length": "--seq-length",
    "seq_length_schedule": "the sequence-length curriculum (--seq-length-schedule)",
    "lr_unit": "the LR schedule's unit (tokens with --lr-*-tokens under a sequence-length "
               "curriculum)",
}
RUN_SHAPE_KEYS = ("train_iters", "train_samples", "global_batch_size", "rampup_batch_size",
                  "seq_length")
# what a context-extension stage (--extend-context) may change of the checkpoint's schedule
EXTENSION_KEYS = RUN_SHAPE_KEYS + ("batch_size_steps", "seq_length_schedule")
LEGACY_KEYS = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
               "start_wd", "end_wd", "wd_incr_style", "wd_incr_steps")


@dataclass(frozen=True)
class ScheduleConfig:
    """The LR/WD schedule flags after validation (fields are their argparse dests) and the batch
    schedule (``batch``: megatron/schedules/units.py :class:`BatchConfig`, which also gives
    ``--global-batch-size`` and ``--seq-length``): the run's length (``--train-iters``,
    ``--train-samples``), the LR (``--lr``, ``--min-lr``, ``--lr-warmup-init``), its style and
    spans (iterations, samples or tokens, as each flag says), the Power Scheduler's flags, the
    weight-decay increment, ``--lr-schedule-config`` (and the file validation read,
    ``lr_schedule_config_dict``) and how a checkpoint's schedule is taken (``--extend-context``:
    the run's shape may differ from the checkpoint's)."""

    train_iters: Optional[int]
    train_samples: Optional[int]
    lr: float
    min_lr: float
    lr_warmup_init: float
    lr_decay_style: str
    lr_warmup_fraction: Optional[float]
    lr_warmup_iters: Optional[int]
    lr_warmup_samples: Optional[int]
    lr_warmup_tokens: Optional[int]
    lr_decay_iters: Optional[int]
    lr_decay_samples: Optional[int]
    lr_decay_tokens: Optional[int]
    lr_wsd_decay_style: str
    lr_wsd_decay_iters: Optional[int]
    lr_wsd_decay_samples: Optional[int]
    power_scheduler_a: float
    power_scheduler_b: float
    power_scheduler_decay_style: str
    power_scheduler_decay_iters: Optional[int]
    power_scheduler_decay_samples: Optional[int]
    power_scheduler_decay_tokens: Optional[int]
    start_weight_decay: float
    end_weight_decay: float
    weight_decay_incr_style: str
    lr_schedule_config: Optional[str]
    lr_schedule_config_dict: Optional[Dict[str, Any]]
    override_opt_param_scheduler: bool
    use_checkpoint_opt_param_scheduler: bool
    extend_context: Optional[str]
    batch: BatchConfig


# Levanter's configs nest the schedules under the optimizer's section
LEVANTER_WRAPPER = "optimizer"
# the keys of a --lr-schedule-config file: the LR and WD schedules read here, the
# sequence-length curriculum (megatron/config/seqlen_flags.py) and the context stages of one run
# (megatron/config/context_stages.py)
SCHEDULE_FILE_KEYS = ("lr_schedule", "weight_decay_schedule", "seq_length_schedule",
                      "context_stages")


def load_schedule_config(path: str) -> Dict[str, Any]:
    """Read a ``--lr-schedule-config`` file (YAML or JSON) into a dict with keys ``lr_schedule``
    and optionally ``weight_decay_schedule``, ``seq_length_schedule`` (the sequence-length
    curriculum, read by megatron/config/seqlen_flags.py) and ``context_stages`` (context stages in
    one run, read by megatron/config/context_stages.py); ``ValueError`` naming the file otherwise.
    Levanter's configs nest ``lr_schedule:`` under ``optimizer:``: that wrapper is taken when it is
    the file's only key, and its keys are then those same keys (others named as
    ``optimizer.KEY``)."""
    if not os.path.isfile(path):
        raise ConfigError(f"--lr-schedule-config {path}: no such file")
    with open(path) as f:
        text = f.read()
    try:
        if path.endswith(".json"):
            config = json.loads(text)
        else:
            import yaml
            config = yaml.safe_load(text)
    except Exception as e:  # yaml.YAMLError, json.JSONDecodeError
        raise ConfigError(f"--lr-schedule-config {path}: cannot parse ({e})") from None
    if not isinstance(config, dict):
        raise ConfigError(f"--lr-schedule-config {path}: expected a mapping with key 'lr_schedule'")
    prefix = ""
    if LEVANTER_WRAPPER in config:
        beside = sorted(str(k) for k in config if k != LEVANTER_WRAPPER)
        if beside:
            raise ConfigError(f"--lr-schedule-config {path}: key {beside[0]!r} beside "
                              f"'{LEVANTER_WRAPPER}' (Levanter's wrapper of lr_schedule): with the "
                              f"wrapper the file holds '{LEVANTER_WRAPPER}' alone; move "
                              f"{beside[0]!r} under it or drop the wrapper")
        config, prefix = config[LEVANTER_WRAPPER], LEVANTER_WRAPPER + "."
        if not isinstance(config, dict):
            raise ConfigError(f"--lr-schedule-config {path}: '{LEVANTER_WRAPPER}' must be a "
                              "mapping with key 'lr_schedule'")
    unknown = sorted(str(k) for k in set(config) - set(SCHEDULE_FILE_KEYS))
    if unknown:
        raise ConfigError(f"--lr-schedule-config {path}: unknown key {prefix + unknown[0]!r} "
                          f"(known keys: {', '.join(prefix + k for k in SCHEDULE_FILE_KEYS)})")
    if "lr_schedule" not in config:
        raise ConfigError(f"--lr-schedule-config {path}: missing key '{prefix}lr_schedule'")
    return config


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def lr_span_flags(config: ScheduleConfig) -> Dict[str, str]:
    """The flags that set the LR warmup and decay spans, as the user gave them (for messages):
    ``{"warmup": "--lr-warmup-iters 10", "decay": "--train-iters 100"}`` (``warmup`` is
    ``"no warmup"`` when none is given)."""
    warmup = next((f"{_flag(d)} {getattr(config, d)}" for d in
                   ("lr_warmup_fraction", "lr_warmup_tokens", "lr_warmup_samples", "lr_warmup_iters")
                   if getattr(config, d)), "no warmup")
    decay = next((f"{_flag(d)} {getattr(config, d)}" for d in
                  ("lr_decay_tokens", "lr_decay_samples", "lr_decay_iters", "train_samples", "train_iters")
                  if getattr(config, d) is not None), "--train-iters")
    return {"warmup": warmup, "decay": decay}


def scheduler_steps(config: ScheduleConfig) -> dict:
    """Warmup, decay and WSD-decay spans of the built-in LR styles, and the weight-decay-increment
    span (samples), from the schedule flags ``config``.

    The LR spans are in samples (Megatron-LM's rule: iteration flags times
    ``--global-batch-size``; BigScience's ``--lr-warmup-tokens`` / ``--lr-decay-tokens`` are
    ``tokens / --seq-length`` samples, with ``--train-iters`` or ``--train-samples`` runs alike),
    or, under a truncating sequence-length curriculum with a ``-tokens`` flag
    (:func:`_lr_in_tokens`), in trained tokens: the spans given in iterations or samples converted
    through the curriculum-aware batch schedule."""
    gbs, seq = config.batch.global_batch_size, config.batch.seq_length
    if _lr_in_tokens(config):
        bs = batch_schedule(config.batch)

        def from_tokens(t):
            return float(t)

        def from_samples(s):
            return float(bs.tokens_at_samples(s))

        def from_iters(i):
            return float(bs.tokens_at_iterations(i))
    else:
        def from_tokens(t):
            return t / seq

        def from_samples(s):
            return s

        def from_iters(i):
            return i * gbs
    samples = config.train_iters * gbs if config.train_samples is None else config.train_samples
    train = from_iters(config.train_iters) if config.train_samples is None else from_samples(samples)
    if config.lr_decay_tokens is not None:
        decay = from_tokens(config.lr_decay_tokens)
    elif config.lr_decay_samples is not None:
        decay = from_samples(config.lr_decay_samples)
    elif config.lr_decay_iters is not None:
        decay = from_iters(config.lr_decay_iters)
    else:
        decay = train
    if config.lr_warmup_fraction is not None:
        warmup = config.lr_warmup_fraction * decay
    elif config.lr_warmup_tokens is not None:
        warmup = from_tokens(config.lr_warmup_tokens)
    elif config.lr_warmup_samples:
        warmup = from_samples(config.lr_warmup_samples)
    else:
        warmup = from_iters(config.lr_warmup_iters or 0)
    if config.lr_wsd_decay_samples:
        wsd = from_samples(config.lr_wsd_decay_samples)
    else:
        wsd = from_iters(config.lr_wsd_decay_iters) if config.lr_wsd_decay_iters else None
    return {"lr_warmup_steps": warmup, "lr_decay_steps": decay, "wsd_decay_steps": wsd,
            "wd_incr_steps": samples}


def _lr_in_tokens(config: ScheduleConfig) -> bool:
    """Whether the built-in LR schedule runs in trained tokens: a truncating sequence-length
    curriculum with ``--lr-warmup-tokens`` or ``--lr-decay-tokens`` (tokens are then not samples x
    ``--seq-length``, as Microsoft Megatron-DeepSpeed's AnnealingLR counts them)."""
    plan = config.batch.seq_length_plan
    return (plan is not None and plan.truncates
            and (config.lr_warmup_tokens is not None or config.lr_decay_tokens is not None))


def run_shape(config: ScheduleConfig, schedule: Optional[BatchSchedule] = None) -> Dict[str, Any]:
    """What the schedules' values depend on besides their own flags: the length of training
    (iterations; samples = ``--train-samples`` or the samples of those iterations), the batch
    schedule (``schedule``, default that of ``config.batch``) and the sequence length (tokens).
    Stored in checkpoints with the schedule parameters."""
    bs = schedule or batch_schedule(config.batch)
    iters = train_iterations(config.train_iters, config.train_samples, bs)
    samples = (config.train_samples if config.train_samples is not None
               else bs.samples_at_iteration(iters))
    shape = {"train_iters": int(iters), "train_samples": int(samples),
             "global_batch_size": int(bs.global_batch_size),
             "rampup_batch_size": [int(x) for x in bs.rampup] if bs.rampup else None,
             "batch_size_steps": [list(step) for step in bs.steps] if bs.steps else None,
             "seq_length": int(bs.seq_length)}
    if bs.seq_plan is not None:  # absent without a curriculum: checkpoints stay as they were
        shape["seq_length_schedule"] = dict(bs.seq_plan.spec)
    return shape


def schedule_context_from_run_shape(shape: Dict[str, Any]) -> ScheduleContext:
    """The :class:`ScheduleContext` of a :func:`run_shape` dict (also a checkpoint's):
    with a ``seq_length_schedule``, its tokens are those the curriculum trains."""
    bs = BatchSchedule(global_batch_size=int(shape["global_batch_size"]),
                       rampup=tuple(shape["rampup_batch_size"]) if shape["rampup_batch_size"] else None,
                       seq_length=int(shape["seq_length"]),
                       # absent from checkpoints written before --step-batch-size-schedule
                       steps=tuple(map(tuple, shape["batch_size_steps"]))
                       if shape.get("batch_size_steps") else None)
    if shape.get("seq_length_schedule") is not None:
        spec = seq_length_spec(shape["seq_length_schedule"], "the sequence-length curriculum")
        plan = seq_length_plan(spec, bs, int(shape["train_iters"]), bs.seq_length)
        bs = replace(bs, seq_plan=plan)
    samples = float(shape["train_samples"])
    return ScheduleContext(bs, {"iterations": float(shape["train_iters"]), "samples": samples,
                                "tokens": float(bs.tokens_at_samples(samples))})


def schedule_context(config: ScheduleConfig,
                     schedule: Optional[BatchSchedule] = None) -> ScheduleContext:
    """The run's :class:`ScheduleContext`: length of training in every unit (iterations, samples,
    tokens), and batch schedule (``schedule``, default that of ``config.batch``)."""
    return schedule_context_from_run_shape(run_shape(config, schedule))


def _power_tokens(bs: BatchSchedule, iters: Optional[int], samples: Optional[int],
                  tokens: Optional[int]) -> Optional[float]:
    if tokens is not None:
        return float(tokens)
    if samples is not None:
        return float(bs.tokens_at_samples(samples))
    if iters is not None:
        return float(bs.tokens_at_iterations(int(iters)))
    return None


def power_spans(config: ScheduleConfig, bs: BatchSchedule) -> Tuple[float, float, float]:
    """(warmup, decay_end, decay_length) in tokens for ``--lr-decay-style power``; iteration flags
    are converted through the batch schedule ``bs`` (rampup aware), samples to the tokens they
    train (times ``--seq-length``, or the sequence-length curriculum's lengths)."""
    end = _power_tokens(bs, config.lr_decay_iters, config.lr_decay_samples, config.lr_decay_tokens)
    if end is None:
        end = (float(bs.tokens_at_samples(config.train_samples)) if config.train_samples is not None
               else float(bs.tokens_at_iterations(config.train_iters)))
    if config.lr_warmup_fraction is not None:
        warmup = config.lr_warmup_fraction * end
    elif config.lr_warmup_tokens is not None:
        warmup = float(config.lr_warmup_tokens)
    elif config.lr_warmup_iters:
        warmup = float(bs.tokens_at_iterations(config.lr_warmup_iters))
    else:
        warmup = float(bs.tokens_at_samples(config.lr_warmup_samples or 0))
    decay = 0.0
    if config.power_scheduler_decay_tokens:
        decay = float(config.power_scheduler_decay_tokens)
    elif config.power_scheduler_decay_samples:
        decay = float(bs.tokens_at_samples(config.power_scheduler_decay_samples))
    elif config.power_scheduler_decay_iters:
        end_iter = int(bs.iterations_at_samples(bs.samples_at_tokens(end)))
        start_iter = max(end_iter - int(config.power_scheduler_decay_iters), 0)
        decay = end - float(bs.tokens_at_iterations(start_iter))
    return warmup, end, decay


def lr_schedule_with_run_defaults(lr_schedule, config: ScheduleConfig):
    """The ``lr_schedule`` of a ``--lr-schedule-config`` file with the keys that default to the
    run's LR flags filled in (e.g. a bare ``{type: inv}`` takes ``learning_rate`` = ``--lr`` and
    ``min_lr`` = ``--min-lr``), so the values it runs with are stored, and compared on resume, with
    the schedule."""
    flags = {"lr": config.lr, "min_lr": config.min_lr}
    return fill_run_defaults(lr_schedule, {k: float(v) for k, v in flags.items() if v is not None})


def scheduler_params(config: ScheduleConfig,
                     schedule: Optional[BatchSchedule] = None) -> Dict[str, Any]:
    """Everything that defines the LR and WD schedules, as a flat, checkpointable dict (keys not
    used by the chosen style are None; spans in samples, or tokens where the key says so);
    ``schedule``: the batch schedule of ``config.batch`` when already built."""
    c = config
    bs = schedule or batch_schedule(c.batch)
    steps = scheduler_steps(c)
    params: Dict[str, Any] = {k: None for k in PARAM_FLAGS}
    params.update(run_shape(c, bs))
    params.update(start_wd=c.start_weight_decay, end_wd=c.end_weight_decay,
                  wd_incr_style=c.weight_decay_incr_style, wd_incr_steps=steps["wd_incr_steps"])
    file_config = c.lr_schedule_config_dict
    if file_config is None and c.lr_schedule_config:
        file_config = load_schedule_config(c.lr_schedule_config)
    if file_config is not None:
        params["lr_schedule"] = lr_schedule_with_run_defaults(file_config["lr_schedule"], c)
        if file_config.get("weight_decay_schedule") is not None:
            params["weight_decay_schedule"] = file_config["weight_decay_schedule"]
            for key in ("start_wd", "end_wd", "wd_incr_style", "wd_incr_steps"):
                params[key] = None
        return params
    params.update(lr_decay_style=c.lr_decay_style, max_lr=float(c.lr),
                  min_lr=float(c.min_lr), init_lr=float(c.lr_warmup_init))
    if c.lr_decay_style == "power":
        warmup, end, decay = power_spans(c, bs)
        params.update(power_a=float(c.power_scheduler_a), power_b=float(c.power_scheduler_b),
                      power_warmup_tokens=warmup, power_decay_end_tokens=end,
                      power_decay_tokens=decay, power_decay_style=c.power_scheduler_decay_style)
        return params
    params.update(lr_warmup_steps=steps["lr_warmup_steps"], lr_decay_steps=steps["lr_decay_steps"])
    if _lr_in_tokens(c):
        params["lr_unit"] = "tokens"  # the spans above are trained tokens
    if c.lr_decay_style == "WSD":
        params.update(wsd_decay_steps=steps["wsd_decay_steps"],
                      lr_wsd_decay_style=c.lr_wsd_decay_style)
    return params


_STYLE_KIND = {"linear": "linear", "cosine": "cosine", "inverse-square-root": "inverse-square-root",
               "WSD": "wsd"}


def build_schedules(params: Dict[str, Any], context: ScheduleContext) -> Tuple[Schedule, Schedule]:
    """(lr schedule, weight-decay schedule) from :func:`scheduler_params`'s dict."""
    p = params
    unit = p.get("lr_unit") or "samples"  # tokens: --lr-*-tokens under a sequence-length curriculum
    if p.get("lr_schedule") is not None:
        lr = build_schedule(p["lr_schedule"], context)
    elif p["lr_decay_style"] == "constant":
        lr = build_schedule({"type": "constant", "unit": unit, "value": p["max_lr"],
                             "warmup": p["lr_warmup_steps"], "warmup_from": p["init_lr"]}, context)
    elif p["lr_decay_style"] == "power":
        lr = build_schedule({"type": "power", "unit": "tokens", "max": p["max_lr"], "a": p["power_a"],
                             "b": p["power_b"], "to": p["min_lr"], "warmup": p["power_warmup_tokens"],
                             "warmup_from": p["init_lr"], "span": p["power_decay_end_tokens"],
                             "decay": p["power_decay_tokens"],
                             "decay_style": p["power_decay_style"]}, context)
    elif p["lr_decay_style"] in _STYLE_KIND:
        config = {"type": _STYLE_KIND[p["lr_decay_style"]], "unit": unit, "from": p["max_lr"],
                  "to": p["min_lr"], "warmup": p["lr_warmup_steps"], "warmup_from": p["init_lr"],
                  "span": p["lr_decay_steps"]}
        if p["lr_decay_style"] == "WSD":
            config.update(decay=p["wsd_decay_steps"], decay_style=p["lr_wsd_decay_style"])
        lr = build_schedule(config, context)
    else:
        raise ConfigError(f"--lr-decay-style {p['lr_decay_style']!r} is not supported")
    if p.get("weight_decay_schedule") is not None:
        wd = build_schedule(p["weight_decay_schedule"], context)
    elif p["wd_incr_style"] == "constant":
        wd = build_schedule({"type": "constant", "unit": "samples", "value": p["end_wd"]}, context)
    elif p["wd_incr_style"] in ("linear", "cosine"):
        wd = build_schedule({"type": p["wd_incr_style"], "unit": "samples", "from": p["start_wd"],
                             "to": p["end_wd"], "span": p["wd_incr_steps"]}, context)
    else:
        raise ConfigError(f"--weight-decay-incr-style {p['wd_incr_style']!r} is not supported")
    return lr, wd


def progress_in(unit: str, iterations, samples, batch_schedule: Optional[BatchSchedule]):
    """Progress in ``unit`` given completed iterations and consumed samples (vectorised); tokens
    are those trained (``batch_schedule.tokens_at_samples``; samples without a batch schedule)."""
    if unit == "iterations":
        return np.asarray(iterations, dtype=np.float64)
    if unit == "samples" or batch_schedule is None:
        return np.asarray(samples, dtype=np.float64)
    return batch_schedule.tokens_at_samples(samples)


def _differs(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return float(a) != float(b)
    return a != b


def _differences(ours, theirs, path: str):
    """``(path, ours, theirs)`` for every differing leaf of two parsed schedule values (nested
    dicts/lists of a ``--lr-schedule-config`` file; plain values are one leaf)."""
    if isinstance(ours, dict) and isinstance(theirs, dict):
        for key in list(ours) + [k for k in theirs if k not in ours]:
            sub = f"{path}.{key}" if isinstance(key, str) else f"{path}[{key!r}]"
            yield from _differences(ours.get(key), theirs.get(key), sub)
    elif isinstance(ours, (list, tuple)) and isinstance(theirs, (list, tuple)) \
            and len(ours) == len(theirs) and path.startswith("--lr-schedule-config"):
        for i, (a, b) in enumerate(zip(ours, theirs, strict=True)):
            yield from _differences(a, b, f"{path}[{i}]")
    elif _differs(ours, theirs):
        yield path, ours, theirs


class OptimizerParamScheduler:
    """Anneals the learning rate and weight decay of every param group of ``optimizer``.

    ``num_steps`` counts consumed samples (megatron-core's meaning) and ``num_iters`` completed
    iterations. ``override`` uses this run's values over a checkpoint's; ``use_checkpoint`` takes
    the checkpoint's; with neither, differing values raise ``ValueError`` naming each one.
    ``extend_context`` (``--extend-context``) takes this run's shape (``EXTENSION_KEYS``: length,
    batch, sequence length) without either.
    """

    def __init__(self, optimizer, params: Dict[str, Any], context: ScheduleContext,
                 override_opt_param_scheduler: bool = False,
                 use_checkpoint_opt_param_scheduler: bool = False,
                 extend_context: bool = False):
        if override_opt_param_scheduler and use_checkpoint_opt_param_scheduler:
            raise ConfigError("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler "
                             "are mutually exclusive")
        self.optimizer = optimizer
        self.params = dict(params)
        self.context = context
        self.override_opt_param_scheduler = override_opt_param_scheduler
        self.use_checkpoint_opt_param_scheduler = use_checkpoint_opt_param_scheduler
        self.extend_context = extend_context
        self.num_steps = 0
        self.num_iters = 0
        self._build()
        self.step(0)

    def _build(self) -> None:
        self.lr_schedule, self.wd_schedule = build_schedules(self.params, self.context)

    # ---- values ----
    def values_at(self, iterations, samples) -> Tuple[np.ndarray, np.ndarray]:
        """(lr, weight decay) before the ``lr_mult``/``wd_mult`` multipliers, after ``iterations``
        completed iterations that consumed ``samples`` samples (vectorised)."""
        bs = self.context.batch_schedule
        lr = self.lr_schedule(progress_in(self.lr_schedule.unit, iterations, samples, bs))
        wd = self.wd_schedule(progress_in(self.wd_schedule.unit, iterations, samples, bs))
        return lr, wd

    def get_lr(self, param_group: Optional[dict] = None) -> float:
        """The scheduled learning rate now (``step`` multiplies it by the group's ``lr_mult``)."""
        return float(self.values_at(np.asarray([self.num_iters]), np.asarray([self.num_steps]))[0][0])

    def get_wd(self, param_group: Optional[dict] = None) -> float:
        """The scheduled weight decay now (``step`` multiplies it by the group's ``wd_mult``)."""
        return float(self.values_at(np.asarray([self.num_iters]), np.asarray([self.num_steps]))[1][0])

    def step(self, increment: int, iterations: Optional[int] = None) -> None:
        """Advance by ``increment`` samples and ``iterations`` iterations (default: one iteration
        if ``increment`` > 0), then set every group's ``lr`` and ``weight_decay``."""
        self.num_steps += increment
        self.num_iters += (1 if increment else 0) if iterations is None else iterations
        lr, wd = self.values_at(np.asarray([self.num_iters]), np.asarray([self.num_steps]))
        lr, wd = float(lr[0]), float(wd[0])
        for group in self.optimizer.param_groups:
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = wd * group.get("wd_mult", 1.0)

    def continue_from(self, other: "OptimizerParamScheduler") -> None:
        """Take ``other``'s progress (consumed samples, completed iterations) and set every
        group's values at it under this scheduler's schedules: a context stage of one run
        (megatron/train/context_stages.py) continues as a resume with
        ``--override-opt_param-scheduler`` continues the checkpoint's counters."""
        self.num_steps = other.num_steps
        self.num_iters = other.num_iters
        self.step(0, iterations=0)

    # ---- checkpoints ----
    def state_dict(self) -> dict:
        """megatron-core's keys (so older code can read it) plus ``num_iters`` and ``params``."""
        sd = {key: self.params.get(key) for key in LEGACY_KEYS}
        sd.update(num_steps=self.num_steps, num_iters_completed=self.num_iters,
                  params=dict(self.params))
        return sd

    @staticmethod
    def _legacy_params(sd: dict) -> Dict[str, Any]:
        """Schedule values of a megatron-core ``OptimizerParamScheduler.state_dict()``."""
        out = {"max_lr": sd["start_lr"] if "start_lr" in sd else sd["max_lr"], "min_lr": sd["min_lr"]}
        for key, aliases in (("lr_warmup_steps", ("warmup_iter", "warmup_steps", "lr_warmup_steps")),
                             ("lr_decay_steps", ("end_iter", "decay_steps", "lr_decay_steps")),
                             ("lr_decay_style", ("decay_style", "lr_decay_style"))):
            out[key] = next(sd[a] for a in aliases if a in sd)
        if "start_wd" in sd:
            for key in ("start_wd", "end_wd", "wd_incr_steps", "wd_incr_style"):
                out[key] = sd[key]
        return out

    def load_state_dict(self, sd: dict) -> None:
        if "params" in sd:
            checkpoint = dict(sd["params"])
            num_steps = sd["num_steps"]
            num_iters = sd.get("num_iters_completed")
        else:
            checkpoint = self._legacy_params(sd)
            num_steps = sd["num_iters"] if "num_iters" in sd else sd["num_steps"]
            num_iters = None
        diffs = [(k, self.params.get(k), v) for k, v in checkpoint.items()
                 if _differs(self.params.get(k), v)]
        if self.extend_context:
            # a context-extension stage: this run's length, batch and sequence length are taken;
            # the schedule's own values (LR, spans) keep the rules below
            for k, ours, theirs in diffs:
                if k in EXTENSION_KEYS:
                    logger.info("--extend-context: the schedule's %s is %r (checkpoint %r)", k, ours, theirs)
            diffs = [d for d in diffs if d[0] not in EXTENSION_KEYS]
        if diffs and self.override_opt_param_scheduler:
            for k, ours, theirs in diffs:
                logger.info("overriding checkpoint's %s=%r with %r", k, theirs, ours)
        elif diffs and self.use_checkpoint_opt_param_scheduler:
            self.params.update(checkpoint)
            if all(k in checkpoint for k in RUN_SHAPE_KEYS):
                # spans of file-based schedules and the power schedule's batch sizes/tokens come
                # from the checkpoint's run, not from this run's flags
                self.context = schedule_context_from_run_shape(self.params)
            self._build()
        elif diffs:
            lines = []
            for k, ours, theirs in diffs:
                label = PARAM_FLAGS.get(k, k)
                if k in ("lr_schedule", "weight_decay_schedule"):
                    lines += [f"{where}: checkpoint {b!r}, now {a!r}"
                              for where, a, b in _differences(ours, theirs, label)]
                else:
                    lines.append(f"{label} ({k}): checkpoint {theirs!r}, now {ours!r}")
            raise ConfigError(
                "the learning-rate/weight-decay schedule differs from the checkpoint's: "
                f"{'; '.join(lines)}. Pass --override-opt_param-scheduler to use this run's "
                "values, or --use-checkpoint-opt_param-scheduler to use the checkpoint's")
        if num_iters is None:
            bs = self.context.batch_schedule
            num_iters = int(bs.iterations_at_samples(num_steps)) if bs is not None else 0
        self.num_steps = num_steps
        self.num_iters = int(num_iters)
        self.step(0, iterations=0)


def build_opt_param_scheduler(config: ScheduleConfig, optimizer) -> OptimizerParamScheduler:
    """The scheduler for ``optimizer``'s param groups from the LR/WD schedule flags ``config``
    (and ``--lr-schedule-config``): values per consumed sample and completed iteration."""
    bs = batch_schedule(config.batch)
    context = schedule_context(config, bs)
    params = scheduler_params(config, bs)
    return OptimizerParamScheduler(
        optimizer, params, context,
        override_opt_param_scheduler=config.override_opt_param_scheduler,
        use_checkpoint_opt_param_scheduler=config.use_checkpoint_opt_param_scheduler,
        extend_context=config.extend_context is not None)
