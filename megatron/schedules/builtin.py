"""Built-in schedule kinds: constant, linear, cosine, inverse-square-root, wsd, power, step,
piecewise-linear, inv.

The warmup/decay kinds follow megatron-core's ``OptimizerParamScheduler`` formulas exactly (with
progress ``p`` in the schedule's unit, ``W`` = ``warmup``, ``S`` = ``span``):

* ``p <= W`` (when ``W > 0``): ``warmup_from + (from - warmup_from) * p / W``
* ``p > S``: ``to``
* otherwise ``to + coeff(r) * (from - to)`` with ``r = (p - W) / (S - W)``.

``span`` defaults to the length of training in the schedule's unit (from the context).

Levanter's key names are aliases (``Schedule.aliases``, renamed by ``build_schedule``):
``constant``'s ``learning_rate`` is ``value``, ``linear``'s ``initial_lr``/``final_lr`` are
``from``/``to``, and ``inv`` (Levanter's inverse decay) takes ``learning_rate``/``min_lr``.
"""
import math
from typing import Mapping, Optional

import numpy as np

from megatron.schedules.base import REQUIRED, Schedule, ScheduleError, _number, _with_defaults, register_schedule

WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
POWER_DECAY_STYLES = ("exponential", "linear")


def parse_points(points, where: str) -> tuple:
    """``{x: value}`` (keys may be strings, as in JSON) or ``[[x, value], ...]`` -> sorted arrays."""
    if isinstance(points, Mapping):
        items = list(points.items())
    elif isinstance(points, (list, tuple)):
        items = []
        for item in points:
            if not isinstance(item, (list, tuple)) or len(item) != 2:
                raise ScheduleError(f"{where}: points must be {{x: value}} or [[x, value], ...]; "
                                    f"got item {item!r}")
            items.append(tuple(item))
    else:
        raise ScheduleError(f"{where}: points must be {{x: value}} or [[x, value], ...]; got {points!r}")
    if not items:
        raise ScheduleError(f"{where}: points is empty")
    xs, vs = [], []
    for x, v in items:
        try:
            xs.append(float(x))
        except (TypeError, ValueError):
            raise ScheduleError(f"{where}: point position {x!r} is not a number") from None
        if not np.isfinite(xs[-1]):
            raise ScheduleError(f"{where}: point position {x!r} is not a finite number")
        vs.append(_number(v, f"{where}: value at point {x!r}"))
    order = np.argsort(xs, kind="stable")
    xs, vs = np.asarray(xs)[order], np.asarray(vs)[order]
    if np.any(np.diff(xs) == 0):
        raise ScheduleError(f"{where}: duplicate point position in {points!r}")
    if xs[0] < 0:
        raise ScheduleError(f"{where}: point position {xs[0]:g} is negative")
    return xs, vs


class _Warmup(Schedule):
    """Shared linear warmup from ``warmup_from`` to ``from`` over ``warmup`` units."""

    def _warm(self, p: np.ndarray, out: np.ndarray, peak) -> np.ndarray:
        if self.warmup > 0:
            ramp = self.warmup_from + (peak - self.warmup_from) * p / self.warmup
            out = np.where(p <= self.warmup, ramp, out)
        return out


class _Decay(_Warmup):
    keys = {"from": REQUIRED, "to": 0.0, "warmup": 0, "warmup_from": 0.0, "span": None}

    def __init__(self, unit: str, from_: float, to: float = 0.0, warmup: float = 0,
                 warmup_from: float = 0.0, span: Optional[float] = None, **extra):
        self.unit = unit
        self.from_ = _number(from_, f"{self.kind}: 'from'")
        self.to = _number(to, f"{self.kind}: 'to'")
        self.warmup = _number(warmup, f"{self.kind}: 'warmup'")
        self.warmup_from = _number(warmup_from, f"{self.kind}: 'warmup_from'")
        if span is None:
            raise ScheduleError(f"{self.kind}: no 'span' and no context to take it from")
        self.span = _number(span, f"{self.kind}: 'span'")
        if self.warmup < 0:
            raise ScheduleError(f"{self.kind}: 'warmup' {warmup} is negative")
        if self.span <= 0:
            raise ScheduleError(f"{self.kind}: 'span' {self.span:g} {unit} must be positive")
        if self.warmup >= self.span:
            raise ScheduleError(f"{self.kind}: warmup {self.warmup:g} {unit} is not shorter than the "
                                f"decay span {self.span:g} {unit}")
        for key, value in extra.items():
            setattr(self, key, value)

    @classmethod
    def from_config(cls, config, context, unit):
        kwargs = _with_defaults(cls, config)
        if kwargs.get("span") is None and context is not None:
            kwargs["span"] = context.span(unit)
        return cls(unit=unit, **kwargs)

    def coeff(self, r: np.ndarray, p: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def coeff_up(self, r: np.ndarray, p: np.ndarray) -> np.ndarray:
        return 1.0 - self.coeff(r, p)

    def values(self, p):
        r = (p - self.warmup) / (self.span - self.warmup)
        if self.from_ >= self.to:   # decreasing: megatron-core's lr form, min + coeff * delta
            out = self.to + self.coeff(r, p) * (self.from_ - self.to)
        else:                       # increasing: megatron-core's weight-decay form, start + ...
            out = self.from_ + self.coeff_up(r, p) * (self.to - self.from_)
        out = np.where(p > self.span, self.to, out)
        return self._warm(p, out, self.from_)


@register_schedule("constant")
class Constant(_Warmup):
    """``value`` (after an optional linear warmup from ``warmup_from``)."""
    keys = {"value": REQUIRED, "warmup": 0, "warmup_from": 0.0}
    aliases = {"learning_rate": "value"}  # Levanter

    def __init__(self, unit: str, value: float, warmup: float = 0, warmup_from: float = 0.0):
        self.unit = unit
        self.value = _number(value, "constant: 'value'")
        self.warmup = _number(warmup, "constant: 'warmup'")
        self.warmup_from = _number(warmup_from, "constant: 'warmup_from'")

    def values(self, p):
        return self._warm(p, np.full(p.shape, self.value), self.value)


@register_schedule("piecewise-linear")
class PiecewiseLinear(Schedule):
    """Linear interpolation between ``points: {x: value}``; constant before the first point and
    after the last."""
    keys = {"points": REQUIRED}

    def __init__(self, unit: str, points):
        self.unit = unit
        self.points = points
        self._x, self._v = parse_points(points, f"{self.kind}")

    def values(self, p):
        return np.interp(p, self._x, self._v)


@register_schedule("linear")
class Linear(_Decay):
    """Linear from ``from`` to ``to`` over the span (after an optional warmup), or, given
    ``points: {x: value}``, piecewise-linear through the points."""
    keys = {"from": None, "to": 0.0, "warmup": 0, "warmup_from": 0.0, "span": None, "points": None}
    aliases = {"initial_lr": "from", "final_lr": "to"}  # Levanter

    @classmethod
    def from_config(cls, config, context, unit):
        if "points" in config:
            others = sorted(k for k in config if k not in ("type", "unit", "points"))
            if others:
                raise ScheduleError(f"linear: 'points' excludes {', '.join(repr(k) for k in others)}")
            return PiecewiseLinear(unit=unit, points=config["points"])
        if "from" not in config:
            raise ScheduleError("linear: needs key 'from' (or 'points')")
        return super().from_config({k: v for k, v in config.items() if k != "points"}, context, unit)

    def __init__(self, unit, from_, to=0.0, warmup=0, warmup_from=0.0, span=None, points=None):
        super().__init__(unit, from_, to, warmup, warmup_from, span)

    def coeff(self, r, p):
        return 1.0 - r

    def coeff_up(self, r, p):
        return r


@register_schedule("cosine")
class Cosine(_Decay):
    """Half-cosine from ``from`` to ``to`` over the span (after an optional warmup)."""

    def coeff(self, r, p):
        return 0.5 * (np.cos(math.pi * r) + 1.0)

    def coeff_up(self, r, p):
        return 0.5 * (np.cos(math.pi * (1 - r)) + 1.0)


@register_schedule("inverse-square-root")
class InverseSquareRoot(_Decay):
    """``from * sqrt(max(warmup, 1)) / sqrt(max(p, 1))``, never below ``to``; ``to`` after the span."""

    def values(self, p):
        w = max(self.warmup, 1.0)
        lr = self.from_ * w ** 0.5 / (np.maximum(p, 1.0) ** 0.5)
        out = np.where(p > self.span, self.to, np.maximum(self.to, lr))
        return self._warm(p, out, self.from_)


@register_schedule("wsd")
class WSD(_Decay):
    """Warmup-stable-decay: ``from`` until ``span - decay``, then anneal to ``to`` over ``decay``
    units in ``decay_style`` (exponential, linear, cosine, minus_sqrt)."""
    keys = dict(_Decay.keys, decay=REQUIRED, decay_style="exponential")

    def __init__(self, unit, from_, to=0.0, warmup=0, warmup_from=0.0, span=None, decay=None,
                 decay_style="exponential"):
        super().__init__(unit, from_, to, warmup, warmup_from, span)
        self.decay = _number(decay, "wsd: 'decay'")
        if decay_style not in WSD_DECAY_STYLES:
            raise ScheduleError(f"wsd: unknown decay_style {decay_style!r}; known: "
                                f"{', '.join(WSD_DECAY_STYLES)}")
        if not 0 < self.decay <= self.span:
            raise ScheduleError(f"wsd: 'decay' {self.decay:g} {unit} must be positive and at most the "
                                f"span {self.span:g} {unit}")
        self.decay_style = decay_style

    def coeff(self, r, p):
        start = self.span - self.decay
        wr = (p - start) / self.decay
        if self.decay_style == "linear":
            c = 1.0 - wr
        elif self.decay_style == "cosine":
            c = 0.5 * (np.cos(math.pi * wr) + 1.0)
        elif self.decay_style == "exponential":
            c = (2.0 * np.power(0.5, wr)) - 1.0
        else:
            c = 1.0 - np.sqrt(wr)
        return np.where(p <= start, 1.0, c)


@register_schedule("step")
class Step(Schedule):
    """Piecewise constant: ``points: {x: value}`` holds ``value`` from ``x`` to the next point
    (the first value before the first point)."""
    keys = {"points": REQUIRED}

    def __init__(self, unit: str, points):
        self.unit = unit
        self.points = points
        self._x, self._v = parse_points(points, "step")

    def values(self, p):
        idx = np.searchsorted(self._x, p, side="right") - 1
        return self._v[np.clip(idx, 0, len(self._v) - 1)]


@register_schedule("power")
class Power(_Warmup):
    """Power Scheduler (Shen et al. 2024, arXiv:2408.13359).

    ``lr(n) = max(to, min(max, beta * a * n**b))`` with ``n`` the tokens consumed and ``beta`` the
    global batch size in samples (sequences) of the current iteration, read from the context's
    :class:`BatchSchedule` at the run's real progress (so batch-size rampup is honoured, also
    inside a stage) unless ``batch_size`` is given. Inside a relative stage ``n`` counts the tokens
    since the stage start (the tokens the stage really saw, also while the batch ramps in unit
    iterations); at top level or in an absolute stage, the run's tokens. ``to`` is a floor
    everywhere after the warmup.
    Linear warmup over ``warmup`` units from ``warmup_from`` to ``lr(warmup)``; with ``decay > 0``
    the last ``decay`` units before ``span`` decay from ``lr(span - decay)`` to ``to``:
    exponential ``(e**(1 - r) - 1) / (e - 1)`` (IBM's reference) or linear ``1 - r``, and ``to``
    after ``span`` (when ``lr(span - decay)`` is already at the floor, the decay stays there).
    Without a decay phase the power law simply continues (token-number agnostic). Phase lengths
    are in the schedule's unit (default tokens). ``b`` must be negative (a decaying power law).
    """
    keys = {"max": REQUIRED, "a": 4.6, "b": -0.51, "to": 0.0, "warmup": 0, "warmup_from": 0.0,
            "span": None, "decay": 0, "decay_style": "exponential", "batch_size": None}
    default_unit = "tokens"

    def __init__(self, unit, max, a=4.6, b=-0.51, to=0.0, warmup=0, warmup_from=0.0, span=None,
                 decay=0, decay_style="exponential", batch_size=None, batch_schedule=None,
                 offset=0.0):
        self.unit = unit
        self.max = _number(max, "power: 'max'")
        self.a = _number(a, "power: 'a'")
        self.b = _number(b, "power: 'b'")
        self.to = _number(to, "power: 'to'")
        self.warmup = _number(warmup, "power: 'warmup'")
        self.warmup_from = _number(warmup_from, "power: 'warmup_from'")
        self.decay = _number(decay, "power: 'decay'")
        self.span = None if span is None else _number(span, "power: 'span'")
        if decay_style not in POWER_DECAY_STYLES:
            raise ScheduleError(f"power: unknown decay_style {decay_style!r}; known: "
                                f"{', '.join(POWER_DECAY_STYLES)}")
        self.decay_style = decay_style
        self.batch_size = None if batch_size is None else _number(batch_size, "power: 'batch_size'")
        self._batch_schedule = batch_schedule
        if self.a <= 0:
            raise ScheduleError(f"power: 'a' {self.a:g} must be positive")
        if self.b >= 0:
            raise ScheduleError(f"power: 'b' {self.b:g} must be negative (lr = a * batch * n**b "
                                "decays with the tokens n)")
        if self.to > self.max:
            raise ScheduleError(f"power: 'to' {self.to:g} is above 'max' {self.max:g}")
        self._offset = float(offset)
        if self.warmup < 0 or self.decay < 0:
            raise ScheduleError(f"power: 'warmup' {self.warmup:g} and 'decay' {self.decay:g} must be "
                                "non-negative")
        if self.decay > 0 and self.span is None:
            raise ScheduleError("power: a 'decay' phase needs the 'span' (end of training)")
        if self.span is not None and self.warmup + self.decay > self.span:
            raise ScheduleError(f"power: warmup {self.warmup:g} + decay {self.decay:g} {unit} exceed "
                                f"the span {self.span:g} {unit}")
        if batch_schedule is None and (self.batch_size is None or unit == "iterations"):
            raise ScheduleError("power: needs the run's batch schedule (a ScheduleContext) or, for "
                                "units samples/tokens, a 'batch_size'")
        self._seq = batch_schedule.seq_length if batch_schedule is not None else 1

    @classmethod
    def from_config(cls, config, context, unit):
        kwargs = _with_defaults(cls, config)
        if kwargs.get("span") is None and context is not None:
            kwargs["span"] = context.span(unit)
        return cls(unit=unit, batch_schedule=None if context is None else context.batch_schedule,
                   offset=0.0 if context is None else context.offset, **kwargs)

    def _samples_tokens(self, p):
        """(samples, tokens) of the run at progress ``p`` in the schedule's unit (absolute)."""
        bs = self._batch_schedule
        if self.unit == "iterations":
            samples = bs.samples_at_iterations(np.rint(p).astype(np.int64)).astype(np.float64)
            return samples, bs.tokens_at_samples(samples)
        if bs is None:  # a 'batch_size' and no run: tokens are samples x 1
            return (p, p * self._seq) if self.unit == "samples" else (p / self._seq, p)
        if self.unit == "samples":
            return p, bs.tokens_at_samples(p)
        return bs.samples_at_tokens(p), p

    def power_lr(self, p):
        """``max(to, min(max, beta * a * n**b))`` at progress ``p`` of this schedule (relative
        to its stage start inside a relative stage); no warmup or decay. ``beta`` is the run's
        batch size at the real progress ``p + offset``; ``n`` the tokens from the stage start."""
        p = np.asarray(p, dtype=np.float64)
        samples, tokens = self._samples_tokens(p + self._offset)
        if self._offset:
            tokens = tokens - self._samples_tokens(np.asarray([self._offset]))[1][0]
        if self.batch_size is not None:
            beta = self.batch_size
        else:
            beta = self._batch_schedule.batch_sizes_at_samples(samples).astype(np.float64)
        with np.errstate(divide="ignore"):
            return np.maximum(self.to, np.minimum(self.max, beta * self.a * np.power(tokens, self.b)))

    def values(self, p):
        out = self.power_lr(p)
        if self.span is not None and self.decay > 0:
            start = self.span - self.decay
            top = self.power_lr(np.asarray([start]))[0]   # never below ``to``: no rise
            r = (p - start) / self.decay
            if self.decay_style == "exponential":
                c = (np.exp(1.0 - r) - 1.0) / (math.e - 1.0)
            else:
                c = 1.0 - r
            out = np.where(p > start, self.to + c * (top - self.to), out)
            out = np.where(p > self.span, self.to, out)
        if self.warmup > 0:
            out = self._warm(p, out, self.power_lr(np.asarray([self.warmup]))[0])
        return out


@register_schedule("inv")
class InverseDecay(Schedule):
    """Levanter's ``inv`` decay (``levanter.optim.config._inv_decay_schedule``) from
    ``learning_rate`` to ``min_lr`` over ``span`` units of progress ``p``::

        decay = min(1, 1 / ((learning_rate / min_lr - 1) * max(p, 1) / span + 1))
        value = max(learning_rate * decay, min_lr)

    It reaches ``min_lr`` at ``p = span`` and stays there. ``p`` is the progress the schedule is
    given (inside a relative stage: since the stage start, as Levanter's ``count``; ``span`` then
    defaults to the stage length, Levanter's ``decay_steps``). ``min_lr`` must be > 0 (the formula
    divides by it). In an ``lr_schedule`` of ``--lr-schedule-config`` the two values default to
    ``--lr`` and ``--min-lr`` (``run_defaults``); elsewhere they are required.
    """
    keys = {"learning_rate": REQUIRED, "min_lr": REQUIRED, "span": None}
    aliases = {"from": "learning_rate", "to": "min_lr"}
    run_defaults = {"learning_rate": "lr", "min_lr": "min_lr"}

    def __init__(self, unit: str, learning_rate: float, min_lr: float, span: Optional[float] = None):
        self.unit = unit
        self.learning_rate = _number(learning_rate, "inv: 'learning_rate'")
        self.min_lr = _number(min_lr, "inv: 'min_lr'")
        if self.min_lr <= 0:
            raise ScheduleError(f"inv: 'min_lr' {min_lr!r} must be > 0 (the formula divides by it; in "
                                "an lr_schedule it defaults to --min-lr)")
        if span is None:
            raise ScheduleError("inv: no 'span' and no context to take it from")
        self.span = _number(span, "inv: 'span'")
        if self.span <= 0:
            raise ScheduleError(f"inv: 'span' {self.span:g} {unit} must be positive")

    @classmethod
    def from_config(cls, config, context, unit):
        for key, flag in (("learning_rate", "--lr"), ("min_lr", "--min-lr")):
            if key not in config:
                alias = next(a for a, k in cls.aliases.items() if k == key)
                raise ScheduleError(f"inv: needs key {key!r} (or {alias!r}); only an lr_schedule of "
                                    f"--lr-schedule-config defaults it to {flag}")
        kwargs = _with_defaults(cls, config)
        if kwargs.get("span") is None and context is not None:
            kwargs["span"] = context.span(unit)
        return cls(unit=unit, **kwargs)

    def values(self, p):
        lr, low = self.learning_rate, self.min_lr
        decay = np.minimum(1.0, 1.0 / ((lr / low - 1.0) * np.maximum(p, 1.0) / self.span + 1.0))
        return np.maximum(lr * decay, low)
