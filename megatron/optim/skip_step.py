"""Whether to skip an optimizer step on a gradient (or loss) spike: the decision, as plain Python
(no torch, no process group), so it can be tested against hand-computed values. Its flags and
their checks are megatron/config/skip_step_flags.py; megatron/optim/skip_step_engine.py applies
the decision to a DeepSpeed engine; docs/skip_step.md tells the whole behaviour.

Two rules, either or both:

* ``--grad-norm-skip-threshold X`` (Megatron-LM's ``OptimizerConfig.grad_norm_skip_threshold``,
  NVIDIA/Megatron-LM PR #3460): skip the step when the whole model's gradient norm (before
  clipping) is above X. The default, infinity, never skips. A NaN norm is skipped too (Megatron-LM's
  ``grad_norm > threshold`` is False for NaN; it leaves NaNs to its own NaN checks).
* ``--skip-step-zscore-threshold T`` with ``--skip-step-zscore-window W``: skip the step when the
  iteration's loss or its gradient norm lies more than T standard deviations above the mean of
  the previous W iterations' values, as OLMo-core's ``SkipStepOptimizer``
  (``optim/skip_step_optimizer.py``) and Levanter's ``SkipStepConfig`` (``optim/skipstep.py``)
  do. Like both of them, no step is skipped by this rule until the window holds half its length
  (here at least 2 values), and the values of skipped steps stay in the window; one-sided
  (only a value *above* the mean is an outlier) as Levanter; the standard deviation is the
  sample one (n - 1, as OLMo-core's ``torch.std_mean``). A non-finite loss or gradient norm is
  always skipped under this rule and never enters the window (there, neither project filters
  it, so one NaN would poison the mean for a whole window).

The window and the count of skipped steps are a :meth:`SkipStepRule.state_dict`, kept in the
checkpoints' training state, so a resumed run decides exactly as an uninterrupted one.
"""
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Optional, Tuple

DEFAULT_ZSCORE_WINDOW = 128  # OLMo-core's and Levanter's rolling_interval_length default
STATE_VERSION = 1


@dataclass(frozen=True)
class SkipDecision:
    """One iteration's decision: ``skip``, and why (``reason``: ``""`` when not skipped, else
    ``grad_norm_threshold``, ``non_finite``, ``zscore_loss`` or ``zscore_grad_norm``), with the
    z-scores computed (None when the z-score rule did not decide)."""

    skip: bool
    reason: str = ""
    loss_zscore: Optional[float] = None
    grad_norm_zscore: Optional[float] = None


def mean_and_std(values: Iterable[float]) -> Tuple[float, float]:
    """Mean and sample standard deviation (divided by n - 1) of at least two values."""
    values = list(values)
    if len(values) < 2:
        raise ValueError(f"mean_and_std needs at least 2 values, got {len(values)}")
    mean = math.fsum(values) / len(values)
    variance = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(variance)


def zscore(value: float, history: Iterable[float]) -> float:
    """``(value - mean) / std`` over ``history`` (:func:`mean_and_std`); with a zero standard
    deviation, +inf for a value above the mean and 0 otherwise."""
    mean, std = mean_and_std(history)
    if std == 0.0:
        return math.inf if value > mean else 0.0
    return (value - mean) / std


def _finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)


class SkipStepRule:
    """The skip decision of each iteration from its (data-parallel mean) loss and its whole-model
    gradient norm; see the module docstring. ``grad_norm_threshold`` inf and ``zscore_threshold``
    None: nothing is ever skipped (:attr:`enabled` is False)."""

    def __init__(self, grad_norm_threshold: float = math.inf,
                 zscore_threshold: Optional[float] = None,
                 zscore_window: int = DEFAULT_ZSCORE_WINDOW):
        if zscore_window < 2:
            raise ValueError(f"zscore_window {zscore_window} must be at least 2")
        self.grad_norm_threshold = grad_norm_threshold
        self.zscore_threshold = zscore_threshold
        self.zscore_window = zscore_window
        self.losses: deque = deque(maxlen=zscore_window)
        self.grad_norms: deque = deque(maxlen=zscore_window)
        self.skipped_total = 0

    @property
    def uses_threshold(self) -> bool:
        """Whether ``--grad-norm-skip-threshold`` is finite."""
        return not math.isinf(self.grad_norm_threshold)

    @property
    def uses_zscore(self) -> bool:
        """Whether the rolling z-score rule is on (it needs the iteration's loss)."""
        return self.zscore_threshold is not None

    @property
    def enabled(self) -> bool:
        return self.uses_threshold or self.uses_zscore

    @property
    def min_history(self) -> int:
        """Values the window must hold before the z-score rule skips anything:
        max(2, window // 2)."""
        return max(2, self.zscore_window // 2)

    def decide(self, loss: Optional[float], grad_norm: float) -> SkipDecision:
        """The decision for an iteration with ``loss`` (None when the z-score rule is off) and
        ``grad_norm``, from the window as it is (nothing is recorded)."""
        if self.uses_threshold and (math.isnan(grad_norm) or grad_norm > self.grad_norm_threshold):
            return SkipDecision(True, "grad_norm_threshold")
        if not self.uses_zscore:
            return SkipDecision(False)
        if not (_finite(loss) and _finite(grad_norm)):
            return SkipDecision(True, "non_finite")
        if len(self.losses) < self.min_history:
            return SkipDecision(False)
        loss_z = zscore(loss, self.losses)
        norm_z = zscore(grad_norm, self.grad_norms)
        reason = ("zscore_loss" if loss_z > self.zscore_threshold else
                  "zscore_grad_norm" if norm_z > self.zscore_threshold else "")
        return SkipDecision(bool(reason), reason, loss_z, norm_z)

    def observe(self, loss: Optional[float], grad_norm: float, decision: SkipDecision) -> None:
        """Record an iteration after its decision: its loss and norm enter the window (when the
        z-score rule is on and both are finite, skipped or not) and a skip is counted."""
        if self.uses_zscore and _finite(loss) and _finite(grad_norm):
            self.losses.append(float(loss))
            self.grad_norms.append(float(grad_norm))
        if decision.skip:
            self.skipped_total += 1

    def step(self, loss: Optional[float], grad_norm: float) -> SkipDecision:
        """:meth:`decide`, then :meth:`observe`; returns the decision."""
        decision = self.decide(loss, grad_norm)
        self.observe(loss, grad_norm, decision)
        return decision

    def count_skip(self) -> None:
        """Count a step skipped for another reason (DeepSpeed's fp16/bf16 overflow skip)."""
        self.skipped_total += 1

    # ---- checkpoints ----
    def state_dict(self) -> Dict[str, Any]:
        """Plain data (lists of floats): the window and the running count of skipped steps."""
        return {"version": STATE_VERSION, "losses": list(self.losses),
                "grad_norms": list(self.grad_norms), "skipped_total": self.skipped_total}

    def load_state_dict(self, state: Optional[Dict[str, Any]]) -> None:
        """Restore :meth:`state_dict` (None, a checkpoint without it: an empty window and count).
        A window saved longer than this run's keeps its last ``zscore_window`` values."""
        self.losses.clear()
        self.grad_norms.clear()
        self.skipped_total = 0
        if not state:
            return
        self.losses.extend(float(v) for v in state.get("losses", ()))
        self.grad_norms.extend(float(v) for v in state.get("grad_norms", ()))
        self.skipped_total = int(state.get("skipped_total", 0))


@dataclass(frozen=True)
class SkipStepConfig:
    """The skip-step flags after validation (fields are their argparse dests; checked by
    megatron/config/skip_step_flags.py): ``--grad-norm-skip-threshold`` (a gradient norm; inf:
    off), ``--skip-step-zscore-threshold`` (standard deviations; None: off) and
    ``--skip-step-zscore-window`` (iterations)."""

    grad_norm_skip_threshold: float
    skip_step_zscore_threshold: Optional[float]
    skip_step_zscore_window: int


def skip_step_rule(config: SkipStepConfig) -> SkipStepRule:
    """The :class:`SkipStepRule` of the skip-step flags ``config``."""
    return SkipStepRule(config.grad_norm_skip_threshold, config.skip_step_zscore_threshold,
                        config.skip_step_zscore_window)
