"""What a feature may add to the training loop: the :class:`LoopHook` protocol, and the hooks a
run's flags ask for (:func:`loop_hooks_from_args`).

The loop (megatron/train/loop.py) calls every hook at five points, in list order:

- ``wrap_forward_step(forward_step)`` once, before the first iteration: the forward step the
  plain engine's micro-batch steps call (a hook that needs each micro batch's loss wraps it);
- ``begin_iteration(engine)`` before an iteration's micro batches;
- ``end_iteration(iteration)`` after its optimizer step (``iteration`` is the number of the
  iteration just run, counted from 1), before the samples and the LR scheduler advance;
- ``log_fields(iterations)`` at each log line, after the interval's losses are reduced
  (``iterations``: the iterations of the log interval). It returns ``(line, record)``: a segment
  for the log line ("" for none) and the fields it adds to the training record. Every rank calls
  it (a hook may all-reduce);
- ``save_state(state)`` after each iteration and ``restore_state(state)`` at start-up, after
  ``--load``: the hook's part of the checkpoint's ``TrainingState.extra``.

A hook that has nothing to do at a point implements it as a no-op. The hooks of today:
megatron/metrics/moe.py ``MoETraining`` (the aux losses' backward scale, the MoE scalars) and
megatron/optim/skip_step_engine.py ``StepSkipper`` (skipping spiking steps, its window in
checkpoints). A new feature adds a hook here instead of a parameter to ``train``.
"""
from typing import Callable, Dict, List, Protocol, Tuple

from megatron.checkpoint.engine import TrainingState
from megatron.metrics.moe import moe_training
from megatron.optim.skip_step_engine import step_skipper_from_args


class LoopHook(Protocol):
    """A feature's calls from the training loop (module docstring)."""

    def wrap_forward_step(self, forward_step: Callable) -> Callable:
        """The forward step the loop's micro-batch steps use (``forward_step`` or a wrapper)."""

    def begin_iteration(self, engine) -> None:
        """Before the micro batches of one iteration."""

    def end_iteration(self, iteration: int) -> object:
        """After iteration ``iteration``'s optimizer step (its return value is not used)."""

    def log_fields(self, iterations: int) -> Tuple[str, Dict[str, float]]:
        """``(log-line segment, training-record fields)`` of a log interval of ``iterations``
        iterations; starts the next interval."""

    def save_state(self, state: TrainingState) -> None:
        """Write the hook's state into ``state.extra`` (saved with every checkpoint)."""

    def restore_state(self, state: TrainingState) -> None:
        """Read the hook's state from a restored ``state.extra`` (empty on a fresh run)."""


def loop_hooks_from_args(args, engine) -> List[LoopHook]:
    """The hooks of this run, in the order their fields appear in the log line and the record:
    the MoE bookkeeping of a model with ``--num-experts``, then the step skipper of the skip-step
    flags (each only when its flags ask for it)."""
    hooks = [moe_training(engine.module, args.run_config.model.moe),
             step_skipper_from_args(args, engine)]  # --grad-norm-skip-threshold, ... or None
    return [hook for hook in hooks if hook is not None]
