"""The sequence-length curriculum's schedule (sequence-length warmup, Li, Zhang and He 2022,
arXiv 2108.06084): the number of tokens per sample, k, that each training iteration trains on.

Two spellings give one :class:`SeqLengthSpec`, and every run trains its :class:`SeqLengthPlan`:

* native: a ``seq_length_schedule`` in the ``--lr-schedule-config`` file, or
  ``--seq-length-schedule``: any registered schedule kind (linear, cosine, step, staged, the root
  kind ``fixed_root`` ...) in iterations, samples or tokens, plus ``mode`` (``truncate``:
  Microsoft's, every sample keeps its first k tokens; ``split``: OLMo-core's, every sample is cut
  into ``seq_length / k`` samples of k tokens, so a batch keeps its tokens) and ``multiple_of``
  (the value is rounded down to a multiple of it);
* DeepSpeed's legacy ``"curriculum_learning"`` section and the data-efficiency
  ``seqlen_truncate``/``seqlen_reshape`` metrics, translated into the native spelling with the
  kinds ``fixed_linear``, ``fixed_root`` and ``fixed_discrete`` registered here, which give the
  length DeepSpeed's own ``CurriculumScheduler`` gives for the same config, as Microsoft
  Megatron-DeepSpeed's loop asks it:

  * ``fixed_linear`` / ``fixed_root``: ``floor((step / total_curriculum_step) ** (1 / root_degree)
    x (max - min) + min)``, rounded down to a multiple of ``difficulty_step``, at least ``min``
    rounded up to that multiple, at most ``max`` (``fixed_linear``: ``root_degree`` 1);
  * ``fixed_discrete``: ``difficulty[i]`` while ``step <= max_step[i]``, the last difficulty after;
  * the step is the completed optimizer steps + 1 (Microsoft's ``update_difficulty(iteration +
    1)`` before each iteration), and the length stops changing once it has reached
    ``max_difficulty`` (``CurriculumScheduler.update_difficulty``).

A native schedule is asked, like the LR schedule, at the progress before the iteration (completed
iterations, consumed samples or trained tokens); the DeepSpeed kinds add DeepSpeed's one step
themselves.
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Tuple

import numpy as np

from megatron.errors import ConfigError
from megatron.schedules import builtin, staged  # noqa: F401  (the kinds a native schedule names)
from megatron.schedules.base import (
    REQUIRED,
    Schedule,
    ScheduleContext,
    ScheduleError,
    build_schedule,
    register_schedule,
)
from megatron.schedules.seqlen_plan import MODES, SeqLengthPlan

KINDS = ("fixed_linear", "fixed_root", "fixed_discrete")


@dataclass(frozen=True)
class SeqLengthCurriculum:
    """A sequence-length curriculum in DeepSpeed's terms: lengths from ``min_length`` to
    ``max_length`` tokens (DeepSpeed's ``min_difficulty``/``max_difficulty``) by ``kind``.
    ``fixed_linear``/``fixed_root`` reach ``max_length`` after ``total_steps`` iterations in
    multiples of ``multiple_of`` tokens (``difficulty_step``) along a ``root_degree`` root;
    ``fixed_discrete`` trains ``lengths[i]`` up to iteration ``max_steps[i]``."""

    kind: str
    min_length: int
    max_length: int
    total_steps: int = 0
    multiple_of: int = 1
    root_degree: float = 1.0
    lengths: Tuple[int, ...] = ()
    max_steps: Tuple[int, ...] = ()

    def difficulty(self, step: int) -> int:
        """DeepSpeed's ``CurriculumScheduler.get_difficulty(step)``: the length (tokens) of
        ``step``, counted from 1."""
        if self.kind == "fixed_discrete":
            if step > self.max_steps[-1]:
                return self.lengths[-1]
            return next(length for length, last in zip(self.lengths, self.max_steps, strict=False)
                        if step <= last)
        fraction = (float(step) / self.total_steps) ** (1.0 / self.root_degree)
        length = math.floor(fraction * (self.max_length - self.min_length) + self.min_length)
        length -= length % self.multiple_of
        length = max(length, -(-self.min_length // self.multiple_of) * self.multiple_of)
        return min(length, self.max_length)

    def lengths_for_iterations(self, iterations: int) -> np.ndarray:
        """The length (tokens per sample) trained at each of iterations 1..``iterations``, as
        DeepSpeed's scheduler gives it when asked before every iteration with the completed
        steps + 1: it starts at ``min_length`` and stops changing once at ``max_length``."""
        out = np.empty(iterations, dtype=np.int64)
        current = self.min_length
        for i in range(iterations):
            if current < self.max_length:
                current = self.difficulty(i + 1)
            out[i] = current
        return out


def _require(section: Dict[str, Any], key: str, where: str) -> Any:
    if key not in section:
        raise ConfigError(f"{where}: missing '{key}'")
    return section[key]


def _positive_int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: '{key}' is {value!r}; expected a positive integer")
    return value


def seqlen_curriculum_from_deepspeed(section: Dict[str, Any],
                                     where: str = "curriculum_learning") -> SeqLengthCurriculum:
    """The :class:`SeqLengthCurriculum` of DeepSpeed's legacy ``"curriculum_learning"`` section
    (``where`` names it in errors): ``curriculum_type`` ``"seqlen"``, ``min_difficulty``,
    ``max_difficulty``, ``schedule_type`` (one of :data:`KINDS`) and its ``schedule_config``.
    ConfigError names the key, the value and what is allowed."""
    kind_of_curriculum = section.get("curriculum_type", "seqlen")
    if kind_of_curriculum != "seqlen":
        raise ConfigError(f"{where}: curriculum_type {kind_of_curriculum!r}: only 'seqlen' (the "
                          "sequence-length curriculum) is a curriculum of this kind")
    low = _positive_int(_require(section, "min_difficulty", where), "min_difficulty", where)
    high = _positive_int(_require(section, "max_difficulty", where), "max_difficulty", where)
    if low > high:
        raise ConfigError(f"{where}: min_difficulty {low} is above max_difficulty {high}")
    kind = _require(section, "schedule_type", where)
    if kind not in KINDS:
        raise ConfigError(f"{where}: schedule_type {kind!r}; allowed: {', '.join(KINDS)}")
    config = _require(section, "schedule_config", where)
    inner = f"{where}.schedule_config"
    if kind == "fixed_discrete":
        lengths: List[int] = [_positive_int(v, "difficulty", inner)
                              for v in _require(config, "difficulty", inner)]
        max_steps: List[int] = [_positive_int(v, "max_step", inner)
                                for v in _require(config, "max_step", inner)]
        above = [length for length in lengths if length > high]
        if above:
            raise ConfigError(f"{inner}: difficulty {above[0]} is above max_difficulty {high}")
        if not max_steps or len(lengths) != len(max_steps) + 1:
            raise ConfigError(f"{inner}: 'difficulty' has {len(lengths)} entries and 'max_step' "
                              f"{len(max_steps)}; expected one difficulty more than max steps "
                              "(the last one holds after the last max step)")
        return SeqLengthCurriculum(kind, low, high, lengths=tuple(lengths),
                                   max_steps=tuple(max_steps))
    total = _positive_int(_require(config, "total_curriculum_step", inner),
                          "total_curriculum_step", inner)
    step = _positive_int(_require(config, "difficulty_step", inner), "difficulty_step", inner)
    degree = 1.0
    if kind == "fixed_root":
        degree = _require(config, "root_degree", inner)
        if isinstance(degree, bool) or not isinstance(degree, (int, float)) or degree <= 0:
            raise ConfigError(f"{inner}: 'root_degree' is {degree!r}; expected a positive number")
    return SeqLengthCurriculum(kind, low, high, total_steps=total, multiple_of=step,
                               root_degree=float(degree))


# ------------------------------------------------ DeepSpeed's kinds in the schedule registry
class _DeepSpeedKind(Schedule):
    """A DeepSpeed ``CurriculumScheduler`` schedule type as a schedule kind in iterations: the
    value at progress ``p`` (completed iterations) is DeepSpeed's length of step ``p + 1`` with
    its latch at ``max_difficulty`` (:meth:`SeqLengthCurriculum.lengths_for_iterations`)."""

    default_unit = "iterations"

    def __init__(self, unit: str, curriculum: SeqLengthCurriculum):
        if unit != "iterations":
            raise ScheduleError(f"{self.kind}: unit {unit!r}; DeepSpeed's schedules count "
                                "iterations (optimizer steps)")
        self.unit = unit
        self.curriculum = curriculum
        self._table = np.zeros(0, dtype=np.int64)

    @classmethod
    def from_config(cls, config, context, unit):
        section = {key: value for key, value in config.items() if key not in ("type", "unit")}
        schedule_config = {key: section.pop(key) for key in list(section) if key in _SCHEDULE_KEYS}
        section.update(curriculum_type="seqlen", schedule_type=cls.kind,
                       schedule_config=schedule_config)
        return cls(unit, seqlen_curriculum_from_deepspeed(section, f"schedule type {cls.kind!r}"))

    def values(self, p):
        steps = np.maximum(np.floor(p).astype(np.int64), 0)
        need = int(steps.max()) + 1 if steps.size else 0
        if need > self._table.size:
            self._table = self.curriculum.lengths_for_iterations(max(need, 2 * self._table.size))
        return self._table[steps].astype(np.float64)


_SCHEDULE_KEYS = ("total_curriculum_step", "difficulty_step", "root_degree", "difficulty",
                  "max_step")


@register_schedule("fixed_linear")
class FixedLinear(_DeepSpeedKind):
    """DeepSpeed's ``fixed_linear``: ``min_difficulty`` to ``max_difficulty`` over
    ``total_curriculum_step`` iterations in multiples of ``difficulty_step``."""

    keys = {"min_difficulty": REQUIRED, "max_difficulty": REQUIRED,
            "total_curriculum_step": REQUIRED, "difficulty_step": REQUIRED}


@register_schedule("fixed_root")
class FixedRoot(_DeepSpeedKind):
    """DeepSpeed's ``fixed_root``: as ``fixed_linear`` along the ``root_degree`` root of the
    progress."""

    keys = {"min_difficulty": REQUIRED, "max_difficulty": REQUIRED,
            "total_curriculum_step": REQUIRED, "difficulty_step": REQUIRED,
            "root_degree": REQUIRED}


@register_schedule("fixed_discrete")
class FixedDiscrete(_DeepSpeedKind):
    """DeepSpeed's ``fixed_discrete``: ``difficulty[i]`` up to iteration ``max_step[i]``."""

    keys = {"min_difficulty": REQUIRED, "max_difficulty": REQUIRED, "difficulty": REQUIRED,
            "max_step": REQUIRED}


# ------------------------------------------------------------------ the native spelling
@dataclass(frozen=True)
class SeqLengthSpec:
    """A sequence-length curriculum as written: ``schedule`` (a schedule config of the registry,
    its values in tokens per sample), ``mode`` (:data:`MODES`), ``multiple_of`` (tokens) and
    ``source`` (where it was given, for messages)."""

    schedule: Any
    mode: str = "truncate"
    multiple_of: int = 1
    source: str = "--seq-length-schedule"

    def to_dict(self) -> Dict[str, Any]:
        """The native spelling as one mapping (what a checkpoint records)."""
        schedule = self.schedule
        if isinstance(schedule, (list, tuple)):
            schedule = {"type": "staged", "stages": list(schedule)}
        return {**schedule, "mode": self.mode, "multiple_of": self.multiple_of}


def seq_length_spec(config: Any, source: str) -> SeqLengthSpec:
    """The :class:`SeqLengthSpec` of a native ``seq_length_schedule`` (``source`` names it in
    errors): a schedule mapping with the extra keys ``mode`` (default ``truncate``) and
    ``multiple_of`` (default 1), or a list of stages. ConfigError names the key and value."""
    if isinstance(config, (list, tuple)):
        return SeqLengthSpec(list(config), source=source)
    if not isinstance(config, dict):
        raise ConfigError(f"{source}: expected a schedule mapping (type: ..., mode: "
                          f"{'|'.join(MODES)}, multiple_of: N) or a list of stages; got {config!r}")
    schedule = dict(config)
    mode = schedule.pop("mode", "truncate")
    if mode not in MODES:
        raise ConfigError(f"{source}: mode {mode!r}; allowed: {', '.join(MODES)}")
    multiple_of = schedule.pop("multiple_of", 1)
    if isinstance(multiple_of, bool) or not isinstance(multiple_of, int) or multiple_of <= 0:
        raise ConfigError(f"{source}: multiple_of {multiple_of!r}; expected a positive integer "
                          "(tokens)")
    return SeqLengthSpec(schedule, mode, multiple_of, source)


def seq_length_spec_from_deepspeed(section: Dict[str, Any], source: str,
                                   mode: str = "truncate") -> SeqLengthSpec:
    """The native spelling of a DeepSpeed curriculum section (the legacy ``curriculum_learning``
    or a data-efficiency ``seqlen_truncate``/``seqlen_reshape`` metric): the schedule kind of the
    same name with DeepSpeed's keys. The section is checked first (ConfigError naming the key)."""
    seqlen_curriculum_from_deepspeed(section, source)
    schedule = {"type": section["schedule_type"],
                "min_difficulty": section["min_difficulty"],
                "max_difficulty": section["max_difficulty"]}
    schedule.update(section["schedule_config"])
    return SeqLengthSpec(schedule, mode, 1, source)


# -------------------------------------------------------------------------- the plan
def _round_down_length(values: np.ndarray, multiple_of: int) -> np.ndarray:
    """``floor(values)`` rounded down to a multiple of ``multiple_of``, at least ``multiple_of``."""
    lengths = np.floor(values).astype(np.int64)
    lengths -= lengths % multiple_of
    return np.maximum(lengths, multiple_of)


def _split_length(length: int, full_length: int, multiple_of: int) -> int:
    """The largest divisor of ``full_length`` that is at most ``length`` and a multiple of
    ``multiple_of`` (split mode cuts each sample into equal parts)."""
    for d in range(min(length, full_length), 0, -1):
        if full_length % d == 0 and d % multiple_of == 0:
            return d
    return full_length


def seq_length_plan(spec: SeqLengthSpec, batch_schedule, iterations: int,
                    full_length: int, rules: Sequence[Tuple[int, str]] = ()) -> SeqLengthPlan:
    """The :class:`SeqLengthPlan` of ``spec`` for a run of ``iterations`` iterations whose data
    gives ``full_length``-token samples, under ``batch_schedule`` (a plain
    :class:`~megatron.schedules.units.BatchSchedule`: global batch per iteration).

    The schedule's default span is the run's length in iterations or samples; one in tokens
    needs an explicit ``span`` (the run's tokens depend on the lengths it gives). Each value is
    rounded down to ``multiple_of`` (at least ``multiple_of``); split mode then takes the largest
    divisor of ``full_length`` not above it. ``rules``: ``(divisor, why)`` the layout puts on k
    (tensor-parallel size with sequence parallelism, Ulysses size). ConfigError, naming the value,
    the iteration and the rule, for a length above ``full_length`` or one the layout cannot
    train."""
    where = spec.source
    if spec.mode == "split" and full_length % spec.multiple_of:
        raise ConfigError(f"{where}: mode split with multiple_of {spec.multiple_of}: --seq-length "
                          f"{full_length} is not a multiple of it (split cuts each sample into "
                          "equal parts of a multiple of multiple_of tokens)")
    n = max(int(iterations), 1)
    samples = batch_schedule.samples_at_iterations(np.arange(n + 1, dtype=np.int64))
    context = ScheduleContext(None, {"iterations": float(n), "samples": float(samples[-1])})
    try:
        schedule = build_schedule(spec.schedule, context)
    except ScheduleError as e:
        raise ConfigError(f"{where}: {e}") from None
    if schedule.unit == "iterations":
        values = schedule(np.arange(n, dtype=np.float64))
    elif schedule.unit == "samples":
        values = schedule(samples[:-1].astype(np.float64))
    else:  # tokens: each iteration's value depends on the tokens the ones before it trained
        values = np.empty(n, dtype=np.float64)
        tokens = 0.0
        batches = np.diff(samples)
        for i in range(n):
            values[i] = schedule(tokens)
            k = min(_round_down_length(values[i:i + 1], spec.multiple_of)[0], full_length)
            tokens += float(batches[i]) * (k if spec.mode == "truncate" else full_length)
    bad = np.flatnonzero(~np.isfinite(values) | (values < 1))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(f"{where}: the schedule gives {values[i]!r} tokens per sample at "
                          f"iteration {i + 1}; a sequence length is at least 1")
    lengths = _round_down_length(values, spec.multiple_of)
    over = np.flatnonzero(lengths > full_length)
    if over.size:
        i = int(over[0])
        raise ConfigError(f"{where}: the schedule gives {int(lengths[i])} tokens per sample at "
                          f"iteration {i + 1}, above --seq-length {full_length}")
    if spec.mode == "split":
        table = {int(k): _split_length(int(k), full_length, spec.multiple_of)
                 for k in np.unique(lengths)}
        lengths = np.asarray([table[int(k)] for k in lengths], dtype=np.int64)
    for divisor, why in rules:
        wrong = np.flatnonzero(lengths % divisor)
        if wrong.size:
            i = int(wrong[0])
            raise ConfigError(f"{where}: iteration {i + 1} trains {int(lengths[i])} tokens per "
                              f"sample, not a multiple of {divisor} ({why}); give the schedule "
                              f"multiple_of {divisor} (or a multiple of it)")
    return SeqLengthPlan(full_length, spec.mode, lengths, spec.to_dict())


def describe_plan(plan: SeqLengthPlan) -> str:
    """One start-up line: the mode, the first and last lengths and where the full length starts."""
    shorter = np.flatnonzero(plan.lengths < plan.full_length)
    if not shorter.size:
        reach = f"--seq-length {plan.full_length} at every iteration"
    elif shorter[-1] + 1 < plan.lengths.size:
        reach = f"--seq-length {plan.full_length} from iteration {int(shorter[-1]) + 2} on"
    else:
        reach = f"never reaching --seq-length {plan.full_length} for good in this run"
    how = ("each sample keeps its first k tokens" if plan.truncates
           else "each sample is cut into --seq-length / k samples of k tokens")
    return (f"sequence-length curriculum ({plan.spec.get('type', 'staged')}, mode {plan.mode}: "
            f"{how}): {int(plan.lengths[0])} tokens at iteration 1, {reach}; evaluation at "
            f"--seq-length {plan.full_length}")
