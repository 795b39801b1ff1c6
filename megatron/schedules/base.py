"""The schedule language's core: :class:`Schedule`, :class:`ScheduleContext`, the kind table
(:func:`register_schedule`) and :func:`build_schedule` from a config.

A schedule is a pure, numpy-vectorised function of training progress in one unit (``iterations``,
``samples`` or ``tokens``)::

    schedule = build_schedule({"type": "cosine", "from": 3e-4, "to": 3e-5}, context)
    schedule.unit                     # "iterations" (the default unit)
    schedule(np.arange(1000))         # array of values; schedule(5) gives a float

Nothing here knows about optimizers or LR flags: the same language gives learning rates, weight
decay and dataset weights. A new kind registers itself with :func:`register_schedule` (the
example is in megatron/schedules/registry.py).

The total length of training ("span") in each unit comes from a :class:`ScheduleContext`.

The kinds themselves live in ``builtin.py`` and ``staged.py``, which import this module;
``megatron/schedules/registry.py`` imports them all and is what users import, so the table is
full there.
"""
from dataclasses import dataclass, field, replace
from typing import Any, Dict, Mapping, Optional, Type

import numpy as np

from megatron.errors import ConfigError
from megatron.schedules.units import UNITS, BatchSchedule, check_unit


class ScheduleError(ConfigError):
    """A bad schedule config; the message names the key and the value."""


REQUIRED = object()
"""Marker for a config key without a default."""

_REGISTRY: Dict[str, Type["Schedule"]] = {}


@dataclass(frozen=True)
class ScheduleContext:
    """What a schedule may need to know about the run, independent of optimizers and flags.

    Attributes:
        batch_schedule: iterations <-> samples <-> tokens conversions (rampup aware).
        total: the length of training per unit, e.g. ``{"iterations": 1000, "samples": 32000,
            "tokens": 65536000}``; :meth:`span` fills missing units by conversion.
        spans: per-unit overrides of the span (a staged schedule's stage length).
        offset: the run's progress, in the schedule's unit, at which the schedule's own progress
            is 0: a relative stage's start (0 for a top-level schedule or an absolute stage).
            Kinds whose value depends on the run's real progress (the ``power`` kind's batch size
            and tokens) add it to the progress they are given.
    """

    batch_schedule: Optional[BatchSchedule] = None
    total: Mapping[str, float] = field(default_factory=dict)
    spans: Mapping[str, float] = field(default_factory=dict)
    offset: float = 0.0

    @classmethod
    def for_training(cls, batch_schedule: BatchSchedule, train_iters: int) -> "ScheduleContext":
        samples = batch_schedule.samples_at_iteration(train_iters)
        return cls(batch_schedule, {"iterations": float(train_iters), "samples": float(samples),
                                    "tokens": float(batch_schedule.tokens_at_samples(samples))})

    def span(self, unit: str) -> float:
        """Length, in ``unit``, that a schedule without an explicit ``span`` runs over."""
        check_unit(unit)
        if unit in self.spans:
            return float(self.spans[unit])
        if unit in self.total:
            return float(self.total[unit])
        for other, value in self.total.items():
            if self.batch_schedule is not None:
                return float(self.batch_schedule.convert(value, other, unit))
        raise ScheduleError(f"no span known in {unit}: give the schedule a 'span' or build it with "
                            "a ScheduleContext that knows the length of training")

    def total_in(self, unit: str) -> Optional[float]:
        """The length of training in ``unit`` (ignoring stage spans), or None if unknown."""
        try:
            return replace(self, spans={}).span(unit)
        except ScheduleError:
            return None

    def with_span(self, unit: str, length: float, offset: Optional[float] = None) -> "ScheduleContext":
        """This context with the span ``length`` in ``unit`` (and, if given, the progress
        ``offset``), for a stage's schedule."""
        if offset is None:
            return replace(self, spans={unit: float(length)})
        return replace(self, spans={unit: float(length)}, offset=float(offset))


class Schedule:
    """Base class: subclasses set ``keys`` and implement ``values(progress)``."""

    kind: str = "?"
    keys: Dict[str, Any] = {}
    aliases: Dict[str, str] = {}
    """Other spellings of keys (alias -> key of ``keys``), e.g. Levanter's ``initial_lr`` for
    ``from``; :func:`build_schedule` renames them before ``from_config`` sees the config."""
    run_defaults: Dict[str, str] = {}
    """Keys whose default is a value of the run (key -> name, e.g. ``"lr"`` for ``--lr``), filled
    in by :func:`fill_run_defaults` where the caller knows those values (the LR schedule)."""
    default_unit: str = "iterations"
    unit: str = "iterations"

    def values(self, progress: np.ndarray) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def __call__(self, progress):
        p = np.asarray(progress, dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            out = np.asarray(self.values(np.atleast_1d(p)), dtype=np.float64)
        if p.ndim == 0:
            return float(out.reshape(-1)[0])
        return out.reshape(p.shape)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], context: Optional[ScheduleContext],
                    unit: str) -> "Schedule":
        """Build from a config whose keys were checked against ``keys``; missing keys take their
        defaults. Kinds that need the context (the span, batch sizes) override this."""
        kwargs = _with_defaults(cls, config)
        return cls(unit=unit, **kwargs)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({fields})"


def _with_defaults(cls, config: Mapping[str, Any]) -> Dict[str, Any]:
    """Constructor keyword arguments from ``config`` and ``cls.keys``' defaults (the config key
    ``from``, a Python keyword, becomes the argument ``from_``)."""
    kwargs = {}
    for key, default in cls.keys.items():
        name = "from_" if key == "from" else key
        if key in config:
            kwargs[name] = config[key]
        elif default is REQUIRED:
            raise ScheduleError(f"schedule type {cls.kind!r} needs key {key!r}")
        else:
            kwargs[name] = default
    return kwargs


def register_schedule(name: str):
    """Class decorator: make ``type: name`` build this class."""
    def decorate(cls):
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"schedule type {name!r} is already registered by {_REGISTRY[name]}")
        cls.kind = name
        _REGISTRY[name] = cls
        return cls
    return decorate


def known_kinds():
    """The registered kind names, sorted."""
    return sorted(_REGISTRY)


def get_schedule_class(name: str) -> Type[Schedule]:
    """The class registered as ``name``; :class:`ScheduleError` listing the known kinds if none."""
    if name not in _REGISTRY:
        raise ScheduleError(f"unknown schedule type {name!r}; known types: {', '.join(known_kinds())}")
    return _REGISTRY[name]


def _numeric_string(value: str, where: str) -> float:
    """A string that spells a number, as a float (PyYAML reads YAML 1.1, where ``1e-4`` without a
    dot is the *string* "1e-4"); :class:`ScheduleError` naming ``where`` otherwise."""
    try:
        return float(value)
    except ValueError:
        raise ScheduleError(f"{where}: expected a number, got {value!r}") from None


def _number(value, where: str) -> float:
    """``value`` as a float; :class:`ScheduleError` naming ``where`` unless it is a finite number
    or a string that spells one (``"1e-4"``). ``.inf``/``.nan`` in YAML, ``Infinity``/``NaN`` in
    JSON and the strings ``"inf"``/``"nan"`` are refused."""
    number = _numeric_string(value, where) if isinstance(value, str) else value
    if isinstance(number, bool) or not isinstance(number, (int, float, np.integer, np.floating)):
        raise ScheduleError(f"{where}: expected a number, got {value!r}")
    if not np.isfinite(number):
        raise ScheduleError(f"{where}: {value!r} is not a finite number")
    return float(number)


def allowed_keys(cls: Type[Schedule]) -> set:
    """The config keys a kind accepts: its ``keys``, their ``aliases``, ``type`` and ``unit``."""
    return set(cls.keys) | set(cls.aliases) | {"type", "unit"}


def _resolve_aliases(cls: Type[Schedule], config: Mapping[str, Any]) -> tuple:
    """(``config`` with every alias key renamed to its canonical key, the ``(alias, key)`` pairs
    used). Giving an alias and its key together is a :class:`ScheduleError` naming both."""
    out, used = dict(config), []
    for alias, key in cls.aliases.items():
        if alias not in out:
            continue
        if key in out:
            raise ScheduleError(f"schedule type {config['type']!r}: {alias!r} ({out[alias]!r}) and "
                                f"{key!r} ({out[key]!r}) are the same key; give one")
        out[key] = out.pop(alias)
        used.append((alias, key))
    return out, used


def fill_run_defaults(config, run_values: Mapping[str, float]):
    """``config`` (any schedule config, stages included, at any depth) with each schedule's
    missing keys that default to a value of the run filled in: a kind's ``run_defaults`` maps a
    key to a name of ``run_values`` (``inv``'s ``learning_rate`` -> ``"lr"``, the run's ``--lr``).
    A key given through one of its aliases counts as given. ``config`` is not changed."""
    if isinstance(config, (list, tuple)):
        return [fill_run_defaults(item, run_values) for item in config]
    if not isinstance(config, Mapping):
        return config
    out = {key: fill_run_defaults(value, run_values) for key, value in config.items()}
    cls = _REGISTRY.get(config.get("type")) if isinstance(config.get("type"), str) else None
    if cls is not None:
        given = {cls.aliases.get(key, key) for key in out}
        for key, name in cls.run_defaults.items():
            if key not in given and name in run_values:
                out[key] = run_values[name]
    return out


def build_schedule(config, context: Optional[ScheduleContext] = None,
                   default_unit: Optional[str] = None) -> Schedule:
    """A schedule from ``config``: a number or a string spelling one (constant), a list of stages
    (staged), or a dict ``{"type": KIND, "unit": UNIT, ...KIND's keys or their aliases}``. Unknown
    types and keys raise :class:`ScheduleError` naming them."""
    if isinstance(config, str):
        try:
            config = _numeric_string(config, "constant schedule")
        except ScheduleError:
            pass  # not a number: refused below as not a schedule
    if isinstance(config, (int, float, np.integer, np.floating)) and not isinstance(config, bool):
        return _REGISTRY["constant"](unit=default_unit or "iterations",
                                     value=_number(config, "constant schedule"))
    if isinstance(config, (list, tuple)):
        config = {"type": "staged", "stages": list(config)}
    if not isinstance(config, Mapping):
        raise ScheduleError(f"a schedule is a number, a list of stages or a mapping with 'type'; "
                            f"got {config!r}")
    if "type" not in config:
        raise ScheduleError(f"schedule {dict(config)!r} has no 'type'; known types: "
                            f"{', '.join(known_kinds())}")
    cls = get_schedule_class(config["type"])
    allowed = allowed_keys(cls)
    for key in config:
        if key not in allowed:
            raise ScheduleError(f"schedule type {config['type']!r}: unknown key {key!r} (known keys: "
                                f"{', '.join(sorted(allowed))})")
    unit = config.get("unit", default_unit or cls.default_unit)
    if unit not in UNITS:
        raise ScheduleError(f"schedule type {config['type']!r}: unknown unit {unit!r}; known units: "
                            f"{', '.join(UNITS)}")
    config, aliases_used = _resolve_aliases(cls, config)
    try:
        schedule = cls.from_config(config, context, unit)
    except ScheduleError as e:
        if not aliases_used:
            raise
        spelled = ", ".join(f"{alias!r} is {key!r}" for alias, key in aliases_used)
        raise ScheduleError(f"{e} (in this schedule {spelled})") from None
    schedule.unit = unit
    return schedule
