"""Schedule registry: kind name -> schedule class, and :func:`build_schedule` from a config, with
every built-in kind registered. Import the schedule language from here.

The language itself (:class:`Schedule`, :class:`ScheduleContext`, :func:`register_schedule`,
:func:`build_schedule`) is megatron/schedules/base.py; the kinds register themselves on import:
``builtin.py`` (constant, linear, cosine, inverse-square-root, wsd, power, step, piecewise-linear)
``staged.py`` (staged) and ``seqlen.py`` (DeepSpeed's curriculum kinds fixed_linear, fixed_root,
fixed_discrete), all imported here. A new kind's module is imported here too (or by
``builtin.py``)::

    @register_schedule("my-kind")
    class MyKind(Schedule):
        keys = {"value": REQUIRED, "period": 100}       # config keys and defaults
        def __init__(self, unit, value, period): ...
        def values(self, progress):                     # progress: float64 array in self.unit
            return ...
"""
from megatron.schedules import builtin, seqlen, staged  # noqa: F401,E402  (register the built-in kinds)
from megatron.schedules.base import (  # noqa: F401
    REQUIRED,
    Schedule,
    ScheduleContext,
    ScheduleError,
    build_schedule,
    get_schedule_class,
    known_kinds,
    register_schedule,
)

__all__ = ["REQUIRED", "Schedule", "ScheduleContext", "ScheduleError", "build_schedule",
           "get_schedule_class", "known_kinds", "register_schedule"]
