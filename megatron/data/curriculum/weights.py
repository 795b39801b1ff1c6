"""Dataset weights over training progress: :func:`weight_schedule` turns a blend entry's weight (a
number or a schedule of :mod:`megatron.schedules.registry`) into a function of the run's progress
(the one place that talks to the registry), :func:`_linear_breakpoints` finds where a
piecewise-linear schedule bends (the index's fast path), and :class:`_Progress` converts a global
sample index to iterations / samples / tokens (rampup aware)."""
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from megatron.data.blend_config import SCALED_WEIGHT_TYPE
from megatron.schedules import builtin
from megatron.schedules.registry import ScheduleContext, build_schedule
from megatron.schedules.staged import Staged
from megatron.schedules.units import BatchSchedule

__all__ = ["ScaledSchedule", "WeightContext", "weight_schedule"]


# ---------------------------------------------------------------------------------------------
# Weight schedules: the one place that talks to megatron.schedules.registry
@dataclass(frozen=True)
class WeightContext:
    """What a weight schedule may need about the run."""

    batch_schedule: BatchSchedule
    num_samples: int

    @property
    def num_iterations(self) -> int:
        return self.batch_schedule.iterations_for_samples(self.num_samples)


class ScaledSchedule:
    """A weight schedule times a constant: the weight of one prefix of a group entry (its share
    of the group's tokens times the group's schedule; ``megatron.data.blend_config.scaled_weight``)."""

    def __init__(self, schedule, scale: float):
        self.schedule = schedule
        self.scale = float(scale)
        self.unit = getattr(schedule, "unit", "iterations")

    def __call__(self, progress):
        """The inner schedule's weights at ``progress`` (in :attr:`unit`) times :attr:`scale`."""
        return self.schedule(progress) * self.scale

    def __repr__(self) -> str:
        return f"ScaledSchedule({self.schedule!r}, scale={self.scale!r})"


def weight_schedule(config: Any, context: WeightContext):
    """Schedule object for a weight ``config`` (a number or a schedule dict of
    :mod:`megatron.schedules.registry`, or a group member's ``{type: scaled, scale, schedule}``):
    has ``.unit`` and maps a progress ndarray to weights."""
    if isinstance(config, dict) and config.get("type") == SCALED_WEIGHT_TYPE:
        return ScaledSchedule(weight_schedule(config["schedule"], context), config["scale"])
    samples = float(context.num_samples)
    schedule_context = ScheduleContext(
        batch_schedule=context.batch_schedule,
        total={"iterations": float(context.num_iterations), "samples": samples,
               "tokens": float(context.batch_schedule.tokens_at_samples(samples))})
    return build_schedule(config, schedule_context)


def _linear_breakpoints(schedule) -> Optional[np.ndarray]:
    """Progress positions (in the schedule's unit) between which ``schedule`` is linear (affine),
    or None when it is not known to be piecewise linear. Only exact built-in classes qualify (a
    subclass may change ``values``)."""
    kind = type(schedule)
    if kind is ScaledSchedule:  # a constant factor bends nothing
        return _linear_breakpoints(schedule.schedule)
    if kind is builtin.Constant:
        return np.asarray([schedule.warmup] if schedule.warmup > 0 else [], dtype=np.float64)
    if kind in (builtin.PiecewiseLinear, builtin.Step):
        return np.asarray(schedule._x, dtype=np.float64)
    if kind is builtin.Linear:  # warmup ramp, linear decay, then constant
        return np.asarray([schedule.warmup, schedule.span], dtype=np.float64)
    if kind is Staged:
        out = [np.asarray(schedule.starts, dtype=np.float64)]
        for start, sub in zip(schedule.starts, schedule.schedules, strict=True):
            inner = _linear_breakpoints(sub)
            if inner is None:
                return None
            out.append(inner + (start if schedule.relative else 0.0))
        return np.concatenate(out)
    return None


# ---------------------------------------------------------------------------------------------
# Progress conversion
class _Progress:
    """Global sample index -> iteration / samples / tokens (rampup aware), through the run's
    :class:`BatchSchedule` (the one place that converts units)."""

    def __init__(self, batch_schedule: BatchSchedule, num_samples: int):
        self.bs = batch_schedule
        self.num_samples = int(num_samples)
        self.num_iterations = batch_schedule.iterations_for_samples(max(self.num_samples, 1))

    def iteration_of(self, samples: np.ndarray) -> np.ndarray:
        """The (0-based) iteration that global sample index ``samples`` belongs to."""
        return self.bs.iterations_at_samples(np.asarray(samples, dtype=np.int64))

    def iteration_starts(self, lo: int, hi: int) -> np.ndarray:
        """Global sample indices in [lo, hi) where an iteration starts."""
        if hi <= lo:
            return np.zeros(0, dtype=np.int64)
        first = self.bs.iterations_for_samples(lo)
        last = int(self.bs.iterations_at_samples(hi - 1))
        starts = self.bs.samples_at_iterations(np.arange(first, last + 1, dtype=np.int64))
        return starts[(starts >= lo) & (starts < hi)].astype(np.int64)

    def of(self, samples: np.ndarray, unit: str) -> np.ndarray:
        """Progress in ``unit`` at global sample indices ``samples`` (float64)."""
        return self.bs.convert(samples, "samples", unit)

    def samples_for(self, unit: str, n: int) -> int:
        """Global sample index where progress ``unit`` reaches ``n``."""
        if unit == "samples":
            return int(n)
        if unit == "tokens":
            return self.bs.samples_for_tokens(n)
        return self.bs.samples_at_iteration(int(n))
