"""Staged schedules: a list of ``{start, schedule}`` steps.

A stage spans from its ``start`` to the next stage's ``start`` (the last one to the end of
training), and its schedule's ``from``/``to`` run over that span: the stage's schedule is built with
``span`` = the stage length and, by default (``relative: true``), sees progress **relative to the
stage start** (``p - start``). With ``relative: false`` it sees the absolute progress (its
``span`` is still the stage length unless given). All stages share one unit: the staged config's
``unit``, else the first stage schedule's, else iterations::

    lr_schedule:
      - start: 0
        schedule: {type: linear, from: 0.0, to: 3.0e-4}
      - start: 1000
        schedule: {type: constant, value: 3.0e-4}
      - start: 90000
        schedule: {type: cosine, from: 3.0e-4, to: 3.0e-5}

or ``{type: staged, unit: samples, relative: true, stages: [...]}``. A stage's schedule may also be
written ``value:`` (Levanter's spelling). Stages must start at 0, in
strictly increasing order, before the end of training; a stage schedule with an explicit ``span``
longer than its stage overlaps the next and is rejected.
"""
from dataclasses import replace
from typing import Mapping

import numpy as np

from megatron.schedules.base import Schedule, ScheduleContext, ScheduleError, _number, build_schedule, register_schedule

STAGE_KEY_ALIASES = {"value": "schedule"}
"""Other spellings of a stage's keys: Levanter writes a stage's schedule as ``value``."""


def _stage(stage, i: int) -> dict:
    """Stage ``i`` as ``{"start": ..., "schedule": ...}`` (``value`` read as ``schedule``);
    :class:`ScheduleError` naming the stage and the key for anything else."""
    if not isinstance(stage, Mapping):
        raise ScheduleError(f"stage {i}: expected {{start: N, schedule: ...}}, got {stage!r}")
    known = {"start", "schedule"} | set(STAGE_KEY_ALIASES)
    unknown = sorted(set(stage) - known)
    if unknown:
        raise ScheduleError(f"stage {i}: unknown key {unknown[0]!r} (known keys: schedule (or "
                            f"value), start)")
    out = dict(stage)
    for alias, key in STAGE_KEY_ALIASES.items():
        if alias in out:
            if key in out:
                raise ScheduleError(f"stage {i}: {alias!r} and {key!r} are the same key (the "
                                    f"stage's schedule); give one")
            out[key] = out.pop(alias)
    if "start" not in out or "schedule" not in out:
        raise ScheduleError(f"stage {i}: needs 'start' and 'schedule'; got {dict(stage)!r}")
    return out


@register_schedule("staged")
class Staged(Schedule):
    keys = {"stages": None, "relative": True}

    def __init__(self, unit, starts, schedules, relative=True):
        self.unit = unit
        self.starts = np.asarray(starts, dtype=np.float64)
        self.schedules = list(schedules)
        self.relative = bool(relative)

    @classmethod
    def from_config(cls, config, context, unit):
        stages = config.get("stages")
        if not isinstance(stages, (list, tuple)) or not stages:
            raise ScheduleError(f"staged: 'stages' must be a non-empty list of {{start, schedule}}; "
                                f"got {stages!r}")
        relative = config.get("relative", True)
        if not isinstance(relative, bool):
            raise ScheduleError(f"staged: 'relative' must be true or false; got {relative!r}")
        stages = [_stage(stage, i) for i, stage in enumerate(stages)]
        if "unit" not in config:
            first = stages[0]["schedule"]
            if isinstance(first, Mapping) and "unit" in first:
                unit = first["unit"]
        starts = []
        for i, stage in enumerate(stages):
            start = _number(stage["start"], f"stage {i}: 'start'")
            if i == 0 and start != 0:
                raise ScheduleError(f"stage 0: 'start' {start:g} must be 0 (stages cover all of training)")
            if starts and start <= starts[-1]:
                raise ScheduleError(f"stage {i}: 'start' {start:g} is not after the previous stage's "
                                    f"start {starts[-1]:g} (stages must be sorted and not overlap)")
            starts.append(start)
        total = context.total_in(unit) if context is not None else None
        if total is not None and len(starts) > 1 and starts[-1] >= total:
            raise ScheduleError(f"stage {len(starts) - 1}: 'start' {starts[-1]:g} {unit} is not before "
                                f"the end of training ({total:g} {unit})")
        schedules = []
        for i, stage in enumerate(stages):
            end = starts[i + 1] if i + 1 < len(starts) else total
            sub = stage["schedule"]
            if isinstance(sub, Mapping):
                if sub.get("unit", unit) != unit:
                    raise ScheduleError(f"stage {i}: unit {sub['unit']!r} differs from the staged "
                                        f"schedule's unit {unit!r}")
                if "span" in sub and end is not None and _number(sub["span"], f"stage {i}: 'span'") \
                        > end - starts[i] + (0 if relative else starts[i]):
                    raise ScheduleError(f"stage {i}: 'span' {sub['span']} overlaps the next stage "
                                        f"(stage length {end - starts[i]:g} {unit})")
            # A relative stage's schedule sees p - start: its context says where its 0 lies in
            # the run, so kinds that depend on the run's real progress (power) can add it back.
            offset = (context.offset if context is not None else 0.0) + (starts[i] if relative else 0.0)
            sub_context = context
            if end is not None:
                length = end - starts[i]
                if context is None:
                    sub_context = ScheduleContext(spans={unit: length}, offset=offset)
                else:
                    sub_context = context.with_span(unit, length if relative else end, offset)
            elif context is not None:
                sub_context = replace(context, offset=offset)
            try:
                schedules.append(build_schedule(sub, sub_context, default_unit=unit))
            except ScheduleError as e:
                raise ScheduleError(f"stage {i} (start {starts[i]:g}): {e}") from None
        return cls(unit, starts, schedules, relative)

    def values(self, p):
        idx = np.clip(np.searchsorted(self.starts, p, side="right") - 1, 0, len(self.starts) - 1)
        out = np.empty(p.shape, dtype=np.float64)
        for k, schedule in enumerate(self.schedules):
            mask = idx == k
            if np.any(mask):
                local = p[mask] - self.starts[k] if self.relative else p[mask]
                out[mask] = schedule(local)
        return out
