"""The "run control" flag group (BigScience / Microsoft Megatron-DeepSpeed: ``--train-tokens``,
``--kill-switch-path``, ``--eval-only``, ``--reset-progress``) and its checks; what they do at run
time is megatron/train/run_control.py. The token budget is applied here: validation shortens the
run to it."""
import argparse
from typing import Optional

from megatron.config.batch_flags import batch_schedule_from_args
from megatron.errors import ArgumentError
from megatron.schedules.units import BatchSchedule, token_budget_iterations


def add_run_control_args(parser: argparse.ArgumentParser) -> None:
    """When training runs and stops (BigScience / Microsoft Megatron-DeepSpeed flags; see
    megatron/train/run_control.py)."""
    g = parser.add_argument_group("run control (BigScience / Microsoft Megatron-DeepSpeed)")
    g.add_argument("--train-tokens", type=int, default=None,
                   help="Microsoft: stop after the first iteration whose consumed tokens (samples x "
                        "--seq-length) reach this, or at --train-iters/--train-samples if earlier; "
                        "schedules that run to the end of training end at the budget.")
    g.add_argument("--kill-switch-path", "--kill-switch-file", dest="kill_switch_path",
                   default=None, metavar="FILE",
                   help="BigScience: when FILE exists, every rank saves a checkpoint after the same "
                        "iteration and exits 0; present at start-up, the run exits at once.")
    g.add_argument("--eval-only", dest="skip_train", nargs="?", const=True, default=False,
                   type=parse_bool_value, metavar="BOOL",
                   help="BigScience's form of --skip-train (also as --eval-only True): evaluate "
                        "the loaded model on the validation and test sets, then exit.")
    g.add_argument("--reset-progress", "--reset-iteration", dest="reset_progress",
                   action="store_true",
                   help="With --load: keep the model and optimizer state but start iteration, "
                        "consumed samples and the LR/WD schedule at 0 (the schedule follows this "
                        "run's flags from its start).")


def validate_run_control(args) -> None:
    """``--train-tokens`` (shortens the run to the budget: :func:`apply_token_budget`),
    ``--reset-progress`` and ``--eval-only``/``--skip-train`` combinations."""
    if args.train_tokens is not None and args.train_tokens <= 0:
        raise ArgumentError(f"--train-tokens {args.train_tokens} must be positive")
    if args.reset_progress:
        if args.load is None:
            raise ArgumentError("--reset-progress needs --load DIR (it resets the counters of the "
                                "checkpoint it loads)")
        if args.finetune:
            raise ArgumentError("--reset-progress and --finetune are mutually exclusive: both start "
                                "at iteration 0, --reset-progress keeps the optimizer state, "
                                "--finetune drops it; give one")
        if args.use_checkpoint_opt_param_scheduler:
            raise ArgumentError("--reset-progress restarts the LR/WD schedule from this run's flags; "
                                "it contradicts --use-checkpoint-opt_param-scheduler")
    if args.kill_switch_path is not None and not args.kill_switch_path.strip():
        raise ArgumentError("--kill-switch-path '': give a file path")
    if args.skip_train and args.eval_iters == 0:
        raise ArgumentError("--eval-only/--skip-train with --eval-iters 0 evaluates nothing; give "
                            "--eval-iters N (global batches per evaluation)")
    args.train_tokens_note = apply_token_budget(args, batch_schedule_from_args(args))


def apply_token_budget(args, batch_schedule: BatchSchedule) -> Optional[str]:
    """Shorten ``args.train_iters`` (iteration-based run) or ``args.train_samples`` (sample-based)
    to the ``--train-tokens`` budget when it ends training first; returns a one-line description
    of the outcome for the start-up log (None without ``--train-tokens``)."""
    if args.train_tokens is None:
        return None
    budget_iters = token_budget_iterations(args.train_tokens, batch_schedule)
    budget_samples = batch_schedule.samples_at_iteration(budget_iters)
    tokens = batch_schedule.tokens(budget_samples)
    if args.train_iters is not None:
        given = f"--train-iters {args.train_iters}"
        first = budget_iters < args.train_iters
        if first:
            args.train_iters = budget_iters
    else:
        given = f"--train-samples {args.train_samples}"
        first = budget_samples < args.train_samples
        if first:
            args.train_samples = budget_samples
    if not first:
        return (f"--train-tokens {args.train_tokens}: {given} ends training first (the budget "
                f"would last {budget_iters} iterations)")
    return (f"--train-tokens {args.train_tokens}: training stops after iteration {budget_iters} "
            f"({budget_samples} samples, {tokens} tokens), before {given}; schedules that run to "
            "the end of training end there")


def parse_bool_value(text: str) -> bool:
    """``true/false``, ``yes/no``, ``1/0`` (any case) as a bool, for flags that BigScience's
    scripts give a value (``--eval-only True``); ``argparse.ArgumentTypeError`` otherwise."""
    value = str(text).strip().lower()
    if value in ("true", "yes", "1"):
        return True
    if value in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a boolean (true/false, yes/no, 1/0)")
