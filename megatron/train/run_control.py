"""When a run trains and when it stops: the token budget (``--train-tokens``), the kill switch
(``--kill-switch-path``), evaluation-only runs (``--eval-only``) and ``--reset-progress``.

Flag names and meanings are those of BigScience's and Microsoft's Megatron-DeepSpeed forks:

- ``--train-tokens N`` (Microsoft): training continues while the consumed tokens (consumed samples
  x ``--seq-length``) are below N, so it stops after the first iteration whose tokens reach N,
  or at ``--train-iters``/``--train-samples`` if that comes first. Microsoft's scripts set
  ``--train-samples`` to twice the budget on purpose: the budget is what stops the run. Here the
  stopping iteration is known before training (the batch schedule fixes the samples of every
  iteration), so ``validate_args`` shortens ``--train-iters``/``--train-samples`` to it and every
  schedule whose span defaults to "the end of training" ends at the budget (docs/schedules.md).
- ``--kill-switch-path FILE`` (BigScience; Microsoft calls it ``--kill-switch-file``): when FILE
  exists at start-up the run exits at once; when it appears during training, every rank saves a
  checkpoint after the same iteration and exits 0 (the check is all-reduced, see
  ``megatron.train.exit_request.ExitRequest``).
"""
import argparse
import math
import os
from typing import Optional

from megatron.schedules.units import BatchSchedule


def token_budget_iterations(train_tokens: int, batch_schedule: BatchSchedule) -> int:
    """Iterations a ``--train-tokens`` budget allows: the smallest ``i`` whose consumed tokens
    (samples after ``i`` iterations x seq length, rampup aware) reach ``train_tokens``. This is
    where Microsoft's loop (``while consumed_train_tokens < train_tokens``) stops."""
    samples = math.ceil(int(train_tokens) / batch_schedule.seq_length)
    return batch_schedule.iterations_for_samples(samples)


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


def kill_switch_found(path: Optional[str]) -> bool:
    """Whether the ``--kill-switch-path`` file exists on this rank (False without the flag)."""
    return path is not None and os.path.exists(path)
