"""The "learning rate and weight decay schedule" flag group and its checks: warmup and decay
lengths in the run's unit (iterations, samples; BigScience's tokens with either), and the LR/WD
schedules, built once so that a bad shape fails with the flag or file named."""
import argparse
from typing import List

from megatron.config.batch_flags import batch_config_from_args
from megatron.errors import ArgumentError
from megatron.schedules.units import batch_schedule
from megatron.utils.typed_config import config_from_args


def add_lr_args(parser: argparse.ArgumentParser) -> None:
    """The "learning rate and weight decay schedule" flag group."""
    g = parser.add_argument_group("learning rate and weight decay schedule")
    g.add_argument("--lr-decay-style", default="linear",
                   choices=["constant", "linear", "cosine", "inverse-square-root", "WSD", "power"],
                   help="LR shape after warmup; 'power' is the Power Scheduler (arXiv:2408.13359): "
                        "lr = min(--lr, batch_size * a * tokens^b).")
    g.add_argument("--lr-decay-iters", type=int, default=None,
                   help="Iterations to decay over (default --train-iters).")
    g.add_argument("--lr-decay-samples", type=int, default=None,
                   help="Samples to decay over (default --train-samples).")
    g.add_argument("--lr-decay-tokens", type=int, default=None,
                   help="BigScience alias: tokens to decay over (converted to samples).")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="Warmup as a fraction of the decay span.")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-warmup-samples", type=int, default=0)
    g.add_argument("--lr-warmup-tokens", type=int, default=None,
                   help="BigScience alias: warmup tokens (converted to samples).")
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="Learning rate at step 0.")
    g.add_argument("--lr-wsd-decay-style", default="exponential",
                   choices=["exponential", "linear", "cosine", "minus_sqrt"])
    g.add_argument("--lr-wsd-decay-iters", type=int, default=None)
    g.add_argument("--lr-wsd-decay-samples", type=int, default=None)
    g.add_argument("--power-scheduler-a", type=float, default=4.6,
                   help="Power Scheduler amplitude a in lr = min(--lr, batch * a * tokens^b).")
    g.add_argument("--power-scheduler-b", type=float, default=-0.51,
                   help="Power Scheduler exponent b in lr = min(--lr, batch * a * tokens^b).")
    g.add_argument("--power-scheduler-decay-iters", type=int, default=None,
                   help="Power Scheduler: final decay phase over the last N iterations before the "
                        "decay end (--lr-decay-* or end of training); default: no decay phase.")
    g.add_argument("--power-scheduler-decay-samples", type=int, default=None,
                   help="Power Scheduler: final decay phase length in samples.")
    g.add_argument("--power-scheduler-decay-tokens", type=int, default=None,
                   help="Power Scheduler: final decay phase length in tokens.")
    g.add_argument("--power-scheduler-decay-style", default="exponential",
                   choices=["exponential", "linear"],
                   help="Power Scheduler: shape of the final decay down to --min-lr.")
    g.add_argument("--lr-schedule-config", default=None, metavar="FILE",
                   help="YAML/JSON file with 'lr_schedule' (any registered schedule kind or a "
                        "staged list) and optional 'weight_decay_schedule', 'seq_length_schedule' "
                        "and 'context_stages' (at an iteration the sequence length, RoPE and "
                        "global batch change: docs/context_extension.md); replaces the LR "
                        "shape flags. See docs/schedules.md.")
    g.add_argument("--start-weight-decay", type=float, default=None)
    g.add_argument("--end-weight-decay", type=float, default=None)
    g.add_argument("--weight-decay-incr-style", default="constant",
                   choices=["constant", "linear", "cosine"])
    g.add_argument("--override-opt_param-scheduler", "--override-lr-scheduler",
                   dest="override_opt_param_scheduler", action="store_true",
                   help="Use these flags' schedule values, ignoring the checkpoint's.")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-lr-scheduler",
                   dest="use_checkpoint_opt_param_scheduler", action="store_true",
                   help="Use the checkpoint's schedule values, ignoring these flags.")


_FINITE_LR_FLAGS = ("lr", "min_lr", "lr_warmup_init", "lr_warmup_fraction", "weight_decay",
                    "start_weight_decay", "end_weight_decay", "power_scheduler_a",
                    "power_scheduler_b")


def schedule_config_from_args(args):
    """megatron/optim/learning_rates.py ``ScheduleConfig`` of the LR/WD flags in ``args`` (every
    field read, none defaulted) with their batch schedule (``BatchConfig``; the sequence-length
    curriculum's plan once validation made it)."""
    from megatron.optim.learning_rates import ScheduleConfig  # lazy: it imports logging (~10 ms); not --help

    return config_from_args(ScheduleConfig, args, batch=batch_config_from_args(args))


def _given_flags(args, *dests: str) -> List[str]:
    """``--flag VALUE`` for each of ``dests`` the user set (not None, not the default 0)."""
    return [f"--{d.replace('_', '-')} {getattr(args, d)}" for d in dests if getattr(args, d)]


def read_schedule_file(args) -> None:
    """``args.lr_schedule_config_dict``: the ``--lr-schedule-config`` file (None without the flag),
    read once for the checks that use it (the LR schedule's, the sequence-length curriculum's)."""
    args.lr_schedule_config_dict = None
    if args.lr_schedule_config is not None:
        from megatron.optim import learning_rates as lrs  # lazy: it imports logging (~10 ms); not --help
        try:
            args.lr_schedule_config_dict = lrs.load_schedule_config(args.lr_schedule_config)
        except ValueError as e:
            raise ArgumentError(str(e)) from None


def validate_lr_units(args) -> None:
    """Iteration-based runs take *-iters warmup/decay flags, sample-based runs *-samples; the
    BigScience *-tokens flags go with either. Errors name only the flags the user gave."""
    import math

    for name in _FINITE_LR_FLAGS:
        value = getattr(args, name)
        if value is not None and not math.isfinite(value):
            raise ArgumentError(f"--{name.replace('_', '-')} {value} is not a finite number")
    for kind, dests in (("warmup", ("lr_warmup_fraction", "lr_warmup_iters", "lr_warmup_samples",
                                    "lr_warmup_tokens")),
                        ("decay", ("lr_decay_iters", "lr_decay_samples", "lr_decay_tokens")),
                        ("WSD decay", ("lr_wsd_decay_iters", "lr_wsd_decay_samples"))):
        given = _given_flags(args, *dests)
        if len(given) > 1:
            raise ArgumentError(f"{' and '.join(given)} both set the LR {kind} length; give one")
    for name in ("lr_warmup_iters", "lr_warmup_samples", "lr_warmup_tokens", "lr_decay_iters",
                 "lr_decay_samples", "lr_decay_tokens", "lr_wsd_decay_iters", "lr_wsd_decay_samples"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ArgumentError(f"--{name.replace('_', '-')} {value} must be non-negative")
    if args.train_iters is not None:
        bad = _given_flags(args, "lr_decay_samples", "lr_warmup_samples", "lr_wsd_decay_samples")
        if bad:
            raise ArgumentError(f"{', '.join(bad)} given with --train-iters {args.train_iters}; "
                                "use the -iters (or -tokens) variants for an iteration-based run")
    else:
        bad = _given_flags(args, "lr_decay_iters", "lr_warmup_iters", "lr_wsd_decay_iters")
        if bad:
            raise ArgumentError(f"{', '.join(bad)} given with --train-samples {args.train_samples}; "
                                "use the -samples (or -tokens) variants for a sample-based run")
    if args.lr_decay_style == "WSD" and not (args.lr_wsd_decay_iters or args.lr_wsd_decay_samples):
        raise ArgumentError("--lr-decay-style WSD needs --lr-wsd-decay-iters (or -samples)")
    if args.start_weight_decay is None:
        args.start_weight_decay = args.weight_decay
    if args.end_weight_decay is None:
        args.end_weight_decay = args.weight_decay
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        raise ArgumentError("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler "
                            "are mutually exclusive")
    _validate_lr_schedule(args)


def _validate_lr_schedule(args) -> None:
    """Build the LR/WD schedules once, so bad shapes fail here with the flag or file named."""
    import numpy as np

    from megatron.optim import learning_rates as lrs  # lazy: it imports logging (~10 ms); not --help
    from megatron.schedules.registry import ScheduleError  # lazy: the schedule registry (~6 ms); not --help

    for name in ("lr_warmup_fraction",):
        value = getattr(args, name)
        if value is not None and not 0.0 <= value < 1.0:
            raise ArgumentError(f"--lr-warmup-fraction {value} must be in [0, 1)")
    if args.start_weight_decay < 0 or args.end_weight_decay < 0:
        raise ArgumentError(f"--start-weight-decay {args.start_weight_decay} and --end-weight-decay "
                            f"{args.end_weight_decay} must be non-negative")
    if args.weight_decay_incr_style == "constant" and args.start_weight_decay != args.end_weight_decay:
        raise ArgumentError(f"--weight-decay-incr-style constant with --start-weight-decay "
                            f"{args.start_weight_decay} != --end-weight-decay {args.end_weight_decay}")
    decays = [f for f in ("power_scheduler_decay_iters", "power_scheduler_decay_samples",
                          "power_scheduler_decay_tokens") if getattr(args, f) is not None]
    if len(decays) > 1:
        raise ArgumentError(f"{', '.join('--' + f.replace('_', '-') for f in decays)} are mutually "
                            "exclusive")
    for f in decays:
        if getattr(args, f) < 0:
            raise ArgumentError(f"--{f.replace('_', '-')} {getattr(args, f)} must be non-negative")
    if args.power_scheduler_a <= 0:
        raise ArgumentError(f"--power-scheduler-a {args.power_scheduler_a} must be positive")
    if args.power_scheduler_b >= 0:
        raise ArgumentError(f"--power-scheduler-b {args.power_scheduler_b} must be negative (the "
                            "Power Scheduler's lr = batch * a * tokens^b decays with the tokens)")
    if args.lr_decay_style == "power" and args.lr_schedule_config is None and not decays:
        given = _given_flags(args, "lr_decay_iters", "lr_decay_samples", "lr_decay_tokens")
        if given:
            raise ArgumentError(
                f"{given[0]} with --lr-decay-style power has no effect without a final decay "
                "phase: the power law runs to the end of training. Give its length with "
                "--power-scheduler-decay-iters/-samples/-tokens (it then ends at "
                f"{given[0].split()[0]}), or drop {given[0].split()[0]}")
    where = (f"--lr-schedule-config {args.lr_schedule_config}" if args.lr_schedule_config
             else f"--lr-decay-style {args.lr_decay_style}")
    config = schedule_config_from_args(args)
    bs = batch_schedule(config.batch)
    steps = lrs.scheduler_steps(config)
    spans = lrs.lr_span_flags(config)
    if args.lr_schedule_config is None and args.lr_decay_style != "power" \
            and steps["lr_warmup_steps"] >= steps["lr_decay_steps"]:
        raise ArgumentError(
            f"the warmup ({spans['warmup']}: {steps['lr_warmup_steps']:g} samples) must be shorter "
            f"than the decay span ({spans['decay']}: {steps['lr_decay_steps']:g} samples)")
    if args.lr_decay_style == "WSD" and args.lr_schedule_config is None \
            and steps["wsd_decay_steps"] > steps["lr_decay_steps"]:
        wsd = _given_flags(args, "lr_wsd_decay_iters", "lr_wsd_decay_samples")[0]
        raise ArgumentError(f"{wsd} ({steps['wsd_decay_steps']:g} samples) is longer than the decay "
                            f"span ({spans['decay']}: {steps['lr_decay_steps']:g} samples)")
    if args.lr_decay_style == "power" and args.lr_schedule_config is None:
        warmup, end, decay = lrs.power_spans(config, bs)
        if warmup + decay > end:
            phases = [f"the warmup ({spans['warmup']}: {warmup:g} tokens)"] if warmup else []
            phases += [f"the final decay ({flag}: {decay:g} tokens)"
                       for flag in _given_flags(args, *decays)]
            raise ArgumentError(f"{' and '.join(phases)} exceed the span they share "
                                f"({spans['decay']}: {end:g} tokens)")
    if args.lr_warmup_init < 0 or args.lr_warmup_init > args.lr:
        raise ArgumentError(f"--lr-warmup-init {args.lr_warmup_init} must be in [0, --lr {args.lr}]")
    try:
        context = lrs.schedule_context(config, bs)
        params = lrs.scheduler_params(config, bs)
        lr, wd = lrs.build_schedules(params, context)
    except (ScheduleError, ValueError) as e:
        raise ArgumentError(f"{where}: {e}") from None
    # sample the schedules over training (and every stage boundary) for negative or non-finite
    # values (a finite config can still overflow, e.g. a huge power-law amplitude)
    iters = int(context.total["iterations"])
    grid = np.unique(np.concatenate([np.linspace(0, iters, min(iters, 20000) + 1).astype(np.int64),
                                     [iters]]))
    samples = bs.samples_at_iterations(grid)
    for name, schedule in (("learning rate", lr), ("weight decay", wd)):
        values = schedule(lrs.progress_in(schedule.unit, grid, samples, bs))
        bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
        if bad.size:
            raise ArgumentError(f"{where}: negative or invalid {name} {values[bad[0]]:g} at iteration "
                                f"{grid[bad[0]]}")
