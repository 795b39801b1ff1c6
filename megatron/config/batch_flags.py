"""The batch schedule and the run's length of the parsed flags, for validation and the tools that
read the flags (the layers below take megatron/schedules/units.py ``BatchConfig`` and typed
values instead)."""
from megatron.schedules.units import BatchConfig, BatchSchedule, batch_schedule, train_iterations
from megatron.utils.typed_config import config_from_args


def batch_config_from_args(args) -> BatchConfig:
    """megatron/schedules/units.py :class:`BatchConfig` of the batch flags in ``args`` (a
    namespace without one of its fields is a ConfigError naming it)."""
    # the plan is derived by validation (megatron/config/seqlen_flags.py), not a flag: a namespace
    # from before that check (or a tool's) has none
    return config_from_args(BatchConfig, args, seq_length_plan=getattr(args, "seq_length_plan", None))


def batch_schedule_from_args(args) -> BatchSchedule:
    """megatron/schedules/units.py :func:`batch_schedule` of the validated flags in ``args``."""
    return batch_schedule(batch_config_from_args(args))


def train_iterations_from_args(args, schedule: BatchSchedule = None) -> int:
    """megatron/schedules/units.py :func:`train_iterations` (iterations) of the flags
    ``--train-iters`` / ``--train-samples`` under ``schedule`` (default the flags' batch
    schedule, :func:`batch_schedule_from_args`)."""
    if args.train_iters is not None:
        return int(args.train_iters)
    return train_iterations(None, args.train_samples, schedule or batch_schedule_from_args(args))
