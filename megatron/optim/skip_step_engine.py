"""Skipping an optimizer step on a DeepSpeed engine, with the decision of megatron/optim/skip_step.py
(``--grad-norm-skip-threshold``, ``--skip-step-zscore-threshold``; docs/skip_step.md).

Where the decision is made. It needs the whole model's gradient norm, which DeepSpeed computes
inside its optimizer step, after the gradients are reduced and before it clips them and calls the
torch optimizer's ``step``: ``BF16_Optimizer``, ``DeepSpeedZeroOptimizer`` (ZeRO 1/2, also under
--fp16) and ``DeepSpeedZeroOptimizer_Stage3`` keep it as ``_global_grad_norm``; at ZeRO stage 0
(fp32) the pre-clipping norm is taken as the training loop logs it
(``megatron.parallel.grads.global_grad_norm``; the pipe engine's own clipping records it, see
megatron/parallel/pipe.py). So the torch optimizer's ``step`` is wrapped (:class:`StepSkipper`):
its first call of an iteration decides (ZeRO 1/2 call it once per parameter group), and on a
skipped iteration every call returns at once. The fp32 master weights and the optimizer's moments
and step count are then untouched, and the wrappers recast the bf16/fp16 weights from the unchanged
masters: no parameter changes, bit for bit. The gradients are dropped as after any step.

Decided once for all ranks: the norm is the global one (the same on every rank), the loss for the
z-score rule is the iteration's mean loss over the model replicas (summed over the pipeline
stages, then the data-parallel ranks, as the logged loss), and the decision is all-reduced (max)
over all ranks, so every rank skips or none does.

When DeepSpeed itself skips the step (fp16 overflow, or a non-finite norm in ``BF16_Optimizer``)
the torch optimizer is never called; the iteration is counted as skipped and its values stay out
of the window.
"""
import functools
import math
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch

from megatron.optim.skip_step import SkipDecision, SkipStepConfig, SkipStepRule, skip_step_rule
from megatron.parallel.pipe import is_pipe_engine, model_grad_norm
from megatron.utils.rank_utils import all_reduce_small, print_rank_0

CHECKPOINT_KEY = "skip_step"  # in TrainingState.extra, so in every checkpoint's training state


@dataclass(frozen=True)
class IterationOutcome:
    """What happened to one iteration's optimizer step: ``skipped`` (by the rule or by
    DeepSpeed's overflow check), with the rule's ``decision`` (None when DeepSpeed skipped before
    the torch optimizer was called) and the ``grad_norm``/``loss`` it decided on."""

    skipped: bool
    decision: Optional[SkipDecision]
    grad_norm: Optional[float] = None
    loss: Optional[float] = None


def _as_float(value) -> float:
    return float(value.item() if torch.is_tensor(value) else value)


class StepSkipper:
    """Wraps ``engine``'s torch optimizer so that an iteration the ``rule`` skips changes no
    parameter and no optimizer state (module docstring). The training loop calls
    :meth:`begin_iteration` before and :meth:`end_iteration` after each iteration's step; the
    micro batches' losses reach :meth:`note_loss` through :meth:`wrap_forward_step`. It is one of
    the loop's hooks (megatron/train/hooks.py ``LoopHook``)."""

    def __init__(self, rule: SkipStepRule, engine, token_weighted: bool = False):
        self.rule = rule
        self.engine = engine
        # the iteration's loss as the run averages it: micro batches weighted by their loss tokens
        # under --calculate-per-token/-sample-loss (megatron/optim/loss_normalization.py), else equally
        self.token_weighted = token_weighted
        self.pipe = is_pipe_engine(engine)
        self.interval_skipped = 0
        self._wrapper = None if engine.optimizer is engine.basic_optimizer else engine.optimizer
        self._loss_sum: Optional[torch.Tensor] = None
        self._loss_count = 0
        self._stage0_norm: Optional[float] = None
        self._pending = None  # (loss, norm, decision) of this iteration, once decided
        self._linked_before = None
        inner = engine.basic_optimizer
        if self._wrapper is not None and getattr(self._wrapper, "optimizer", inner) is not inner:
            raise RuntimeError(f"DeepSpeed's {type(self._wrapper).__name__} does not step the "
                               "torch optimizer the engine was given; cannot skip its steps")
        original_step = inner.step

        @functools.wraps(original_step)
        def step(*args, **kwargs):
            if self._pending is None:
                self._pending = self._decide()
            if self._pending[2].skip:
                return None
            return original_step(*args, **kwargs)

        inner.step = step
        if self._wrapper is None and self.engine.gradient_clipping() > 0:
            self._record_norm_before_clipping()

    # ---- the loop's calls ----
    def wrap_forward_step(self, forward_step: Callable) -> Callable:
        """``forward_step`` (megatron.train.steps' ``(engine, batch) -> (loss, per-sample loss)``)
        also handing each micro batch's loss to :meth:`note_loss`, which only the z-score rule
        needs (else ``forward_step`` as it is). On a pipe engine, whose steps do not use
        ``forward_step``, the pipe's loss function is wrapped instead. Evaluation losses noted
        between two iterations are dropped by :meth:`begin_iteration`."""
        if not self.rule.uses_zscore:
            return forward_step
        if self.pipe:  # the last stage's loss function reports each micro batch's mean loss
            self.engine.module.loss_function.observe(
                lambda loss, loss_mask: self.note_loss(loss, loss_mask.float().sum()
                                                       if self.token_weighted else 1.0))
            return forward_step

        def recording_forward(engine, batch):
            loss, per_sample = forward_step(engine, batch)
            self.note_loss(loss, float(batch["loss_mask"].float().sum())
                           if self.token_weighted else 1.0)
            return loss, per_sample

        return recording_forward

    def note_loss(self, loss: torch.Tensor, weight=1.0) -> None:
        """Add one micro batch's mean loss, with its weight in the iteration's mean (1, or its
        loss tokens), to this iteration's sums (on its device: no host sync)."""
        value = loss.detach().double().reshape(()) * weight
        self._loss_sum = value if self._loss_sum is None else self._loss_sum + value
        weight = weight.detach().double().reshape(()) if torch.is_tensor(weight) else float(weight)
        self._loss_count = self._loss_count + weight

    def begin_iteration(self, engine) -> None:
        """Start an iteration of ``engine`` (the one wrapped): drops the losses noted since the
        last one (evaluation's)."""
        self._loss_sum, self._loss_count = None, 0
        self._stage0_norm = None
        self._pending = None
        self._linked_before = getattr(self._wrapper, "_hp_optimizer_states_linked", None)

    def end_iteration(self, iteration: int) -> IterationOutcome:
        """The outcome of the iteration just run (``iteration``: its number, for the log line);
        updates the window and the counts."""
        if self._pending is None:  # DeepSpeed skipped the step before calling the optimizer
            self.rule.count_skip()
            outcome = IterationOutcome(True, None)
            print_rank_0(f" iteration {iteration}: optimizer step skipped by DeepSpeed (gradient "
                         "overflow or non-finite norm)")
        else:
            loss, norm, decision = self._pending
            if decision.skip:
                print_rank_0(f" iteration {iteration}: optimizer step skipped "
                             f"({_describe(decision, norm, loss, self.rule)})")
            self.rule.observe(loss, norm, decision)
            outcome = IterationOutcome(decision.skip, decision, norm, loss)
            if decision.skip and self._linked_before is False:
                # DeepSpeed links its optimizer-state fragments after the first step call; with
                # no state created yet (a skipped first step) that link would stay empty
                self._wrapper._hp_optimizer_states_linked = False
        if outcome.skipped:
            self.interval_skipped += 1
        self._pending = None
        return outcome

    def log_fields(self, iterations: int) -> Tuple[str, Dict[str, int]]:
        """The log line's "skipped iterations" segment and the training record's ``skipped``
        (iterations skipped since the last log line, of the interval's ``iterations``: 0 or 1 at
        --log-interval 1) and ``skipped_total`` (since the start of training, across resumes);
        starts the next interval."""
        fields = {"skipped": self.interval_skipped, "skipped_total": self.rule.skipped_total}
        self.interval_skipped = 0
        return (f"skipped iterations: {fields['skipped']} (total {fields['skipped_total']})",
                fields)

    # ---- checkpoints (TrainingState.extra) ----
    def save_state(self, state) -> None:
        """The rule's window and counts into ``state.extra`` (every checkpoint)."""
        state.extra[CHECKPOINT_KEY] = self.rule.state_dict()

    def restore_state(self, state) -> None:
        """The rule's window and counts from a restored ``state.extra`` (none: a fresh rule)."""
        self.rule.load_state_dict(state.extra.get(CHECKPOINT_KEY))

    # ---- inside the optimizer step ----
    def _record_norm_before_clipping(self) -> None:
        """ZeRO stage 0 (fp32): keep the norm of the gradients before the engine clips them."""
        engine = self.engine
        clip = engine.clip_fp32_gradients

        def clip_fp32_gradients():
            if self.pipe:  # megatron/parallel/pipe.py's clipping records the norm it clips by
                clip()
                self._stage0_norm = _as_float(engine.get_global_grad_norm())
            else:
                self._stage0_norm = self._stage0_grad_norm()
                clip()

        engine.clip_fp32_gradients = clip_fp32_gradients

    def _stage0_grad_norm(self) -> float:
        return model_grad_norm(self.engine.module)

    def _grad_norm(self) -> float:
        if self._wrapper is not None:
            norm = getattr(self._wrapper, "_global_grad_norm", None)
            if norm is None:
                raise RuntimeError(f"DeepSpeed's {type(self._wrapper).__name__} computed no "
                                   "gradient norm (zero_optimization.compute_grad_norm false?); "
                                   "the skip rules need it")
            return _as_float(norm)
        if self._stage0_norm is not None:
            return self._stage0_norm
        return self._stage0_grad_norm()  # no clipping ran: the gradients are as reduced

    def _iteration_loss(self) -> float:
        """This iteration's mean loss over the model replicas, the same on every rank."""
        from megatron.core import parallel_state

        local = torch.zeros(2, dtype=torch.float64)
        if self._loss_sum is not None:
            local[0] = self._loss_sum.cpu()
            local[1] = float(self._loss_count.cpu() if torch.is_tensor(self._loss_count)
                             else self._loss_count)
        if parallel_state.get_pipeline_model_parallel_world_size() > 1:
            local = all_reduce_small(local, group=parallel_state.get_pipeline_model_parallel_group())
        total = all_reduce_small(local, group=parallel_state.get_data_parallel_group())
        return (total[0] / total[1]).item() if total[1] > 0 else math.nan

    def _decide(self):
        norm = self._grad_norm()
        loss = self._iteration_loss() if self.rule.uses_zscore else None
        decision = self.rule.decide(loss, norm)
        anyone = all_reduce_small(torch.tensor([float(decision.skip)]),
                                  torch.distributed.ReduceOp.MAX)
        if anyone.item() > 0 and not decision.skip:
            decision = SkipDecision(True, "another_rank")
        return loss, norm, decision


def _describe(decision: SkipDecision, norm: float, loss: Optional[float],
              rule: SkipStepRule) -> str:
    if decision.reason == "grad_norm_threshold":
        return f"grad norm {norm:.6g} > --grad-norm-skip-threshold {rule.grad_norm_threshold:g}"
    if decision.reason == "non_finite":
        return f"non-finite loss {loss} or grad norm {norm}"
    if decision.reason == "zscore_loss":
        return (f"loss {loss:.6g} is {decision.loss_zscore:.3g} standard deviations above the "
                f"mean of the last {len(rule.losses)} iterations > "
                f"--skip-step-zscore-threshold {rule.zscore_threshold:g}")
    if decision.reason == "zscore_grad_norm":
        return (f"grad norm {norm:.6g} is {decision.grad_norm_zscore:.3g} standard deviations "
                f"above the mean of the last {len(rule.grad_norms)} iterations > "
                f"--skip-step-zscore-threshold {rule.zscore_threshold:g}")
    return f"another rank decided to skip ({decision.reason})"


def step_skipper(config: SkipStepConfig, normalization: str, engine) -> Optional[StepSkipper]:
    """A :class:`StepSkipper` on ``engine`` when a skip flag of ``config`` is given, else None
    (nothing is wrapped); ``normalization``: the run's loss normalisation
    (megatron/optim/loss_normalization.py; the iteration's loss is token-weighted unless
    ``micro-batch``)."""
    rule = skip_step_rule(config)
    token_weighted = normalization != "micro-batch"
    return StepSkipper(rule, engine, token_weighted) if rule.enabled else None
