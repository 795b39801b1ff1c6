"""The "skipping a step on a gradient spike" flag group (``--grad-norm-skip-threshold``,
``--skip-step-zscore-threshold``, ``--skip-step-zscore-window``) and its checks; the decision
they configure is megatron/optim/skip_step.py (docs/skip_step.md)."""
import math
from typing import List

from megatron.errors import ArgumentError
from megatron.optim.skip_step import DEFAULT_ZSCORE_WINDOW


def add_skip_step_args(parser) -> None:
    """``--grad-norm-skip-threshold``, ``--skip-step-zscore-threshold``,
    ``--skip-step-zscore-window`` (docs/skip_step.md)."""
    g = parser.add_argument_group("skipping a step on a gradient spike (docs/skip_step.md)")
    g.add_argument("--grad-norm-skip-threshold", type=float, default=math.inf, metavar="X",
                   help="Megatron-LM's grad_norm_skip_threshold: skip the optimizer step (no "
                        "parameter or optimizer-state change; the data is consumed and the LR "
                        "schedule advances) of an iteration whose whole-model gradient norm, "
                        "before clipping, is above X (or NaN). inf: never.")
    g.add_argument("--skip-step-zscore-threshold", type=float, default=None, metavar="T",
                   help="Skip the optimizer step of an iteration whose loss or gradient norm is "
                        "more than T standard deviations above the mean of the last "
                        "--skip-step-zscore-window iterations' (OLMo-core/Levanter's rolling "
                        "z-score; they default to 6). Decides once the window is half full. "
                        "Default: off.")
    g.add_argument("--skip-step-zscore-window", type=int, default=DEFAULT_ZSCORE_WINDOW,
                   metavar="W",
                   help="Iterations in the z-score rule's rolling window of losses and gradient "
                        "norms (kept in checkpoints).")


def validate_skip_step_args(args, notes: List[str]) -> None:
    """:class:`megatron.errors.ArgumentError` naming the flag, its value and what is allowed."""
    threshold = args.grad_norm_skip_threshold
    if math.isnan(threshold) or threshold <= 0:
        raise ArgumentError(f"--grad-norm-skip-threshold {threshold}: must be a positive number "
                            "(a gradient norm; inf, the default, never skips)")
    zscore_threshold = args.skip_step_zscore_threshold
    if zscore_threshold is not None and not (math.isfinite(zscore_threshold)
                                             and zscore_threshold > 0):
        raise ArgumentError(f"--skip-step-zscore-threshold {zscore_threshold}: must be a finite "
                            "positive number of standard deviations (OLMo-core and Levanter use "
                            "6); leave it out to turn the z-score rule off")
    window = args.skip_step_zscore_window
    if window < 2:
        raise ArgumentError(f"--skip-step-zscore-window {window}: must be an integer of at least "
                            f"2 iterations (default {DEFAULT_ZSCORE_WINDOW})")
    if zscore_threshold is None and window != DEFAULT_ZSCORE_WINDOW:
        notes.append(f"--skip-step-zscore-window {window}: no effect without "
                                  "--skip-step-zscore-threshold")
