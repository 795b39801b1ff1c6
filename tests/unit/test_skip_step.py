"""Skipping an optimizer step on a gradient spike (megatron/optim/skip_step.py, megatron/optim/skip_step_engine.py,
megatron/config/skip_step_flags.py, docs/skip_step.md), in process: the decision against
hand-computed z-scores, its state, the flags and their errors; then one CPU rank's DeepSpeed engine
under every optimizer wrapper (ZeRO 0-3 in fp32, BF16_Optimizer, bf16 ZeRO 2, fp16), where a
skipped step leaves the parameters, the fp32 master weights and the optimizer state bit for bit as
they were and the next step trains. The launches (pipeline 2 x data parallel 2, a skip by each
rule, resume across a skip) are in tests/e2e/test_skip_step_e2e.py."""
import math

import pytest
import torch

from helpers.flags import parse as parse_tiny
from helpers.flags import tiny_run_flags
from helpers.tensors import tensors_by_path
from megatron.errors import ArgumentError
from megatron.optim.skip_step import SkipStepRule, mean_and_std, zscore

BASE = tiny_run_flags(micro_batch_size=1, global_batch_size=2, lr="0.01")


def parse(extra, world_size=1):
    return parse_tiny(extra, world_size, base=BASE)


# ------------------------------------------------------------------ the decision
def test_mean_and_sample_std_and_zscore_by_hand():
    # [1, 2, 3, 4]: mean 2.5, squared deviations 2.25 + 0.25 + 0.25 + 2.25 = 5, / (4 - 1)
    mean, std = mean_and_std([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and std == pytest.approx(math.sqrt(5 / 3), rel=1e-15)
    assert zscore(10.0, [1.0, 2.0, 3.0, 4.0]) == pytest.approx(7.5 / math.sqrt(5 / 3), rel=1e-15)
    assert zscore(1.0, [1.0, 2.0, 3.0, 4.0]) < 0  # below the mean
    assert zscore(2.0, [2.0, 2.0]) == 0.0 and zscore(2.5, [2.0, 2.0]) == math.inf
    with pytest.raises(ValueError):
        mean_and_std([1.0])


def test_grad_norm_threshold_has_megatron_lm_meaning():
    """Skip when the norm is above X (not at X); infinity never skips; NaN is skipped."""
    rule = SkipStepRule(grad_norm_threshold=2.0)
    assert [rule.step(None, norm).skip for norm in (1.0, 2.0, 2.5, math.inf, math.nan, 0.5)] \
        == [False, False, True, True, True, False]
    assert rule.skipped_total == 3
    assert not SkipStepRule().enabled and not SkipStepRule().step(None, 1e30).skip
    assert list(rule.losses) == []  # the threshold rule keeps no window


def test_zscore_rule_waits_for_half_a_window_then_skips_outliers_above():
    """Window 6: decides from 3 values on (max(2, 6 // 2)); one-sided; the skipped step's values
    stay in the window (OLMo-core, Levanter)."""
    rule = SkipStepRule(zscore_threshold=3.0, zscore_window=6)
    assert rule.min_history == 3
    # two values only: a huge norm is not judged yet
    assert not rule.step(2.0, 1.0).skip and not rule.step(2.1, 1.2).skip
    assert not rule.step(2.2, 100.0).skip  # history of 2 < 3
    rule = SkipStepRule(zscore_threshold=3.0, zscore_window=6)
    for loss, norm in ((2.0, 1.0), (2.2, 1.2), (2.4, 1.1)):
        assert not rule.step(loss, norm).skip
    # losses [2.0, 2.2, 2.4]: mean 2.2, std 0.2; norms [1.0, 1.2, 1.1]: mean 1.1, std 0.1
    decision = rule.step(2.3, 1.45)  # loss z 0.5, norm z 3.5 > 3
    assert decision.skip and decision.reason == "zscore_grad_norm"
    assert decision.loss_zscore == pytest.approx(0.5, rel=1e-12)
    assert decision.grad_norm_zscore == pytest.approx(3.5, rel=1e-12)
    assert list(rule.grad_norms) == [1.0, 1.2, 1.1, 1.45]  # kept, as both references do
    # losses [2.0, 2.2, 2.4, 2.3]: mean 2.225, std sqrt(0.0875 / 3)
    decision = rule.decide(2.225 + 3.01 * math.sqrt(0.0875 / 3), 1.1)
    assert decision.skip and decision.reason == "zscore_loss"
    assert not rule.decide(1.0, 0.2).skip  # far *below* the mean: not a spike


def test_zscore_rule_skips_non_finite_values_and_keeps_them_out_of_the_window():
    rule = SkipStepRule(zscore_threshold=6.0, zscore_window=4)
    assert rule.step(math.nan, 1.0).reason == "non_finite"  # even before the window fills
    assert rule.step(2.0, math.inf).reason == "non_finite"
    assert len(rule.losses) == 0 and rule.skipped_total == 2


def test_window_rolls_and_state_round_trips_exactly():
    rule = SkipStepRule(zscore_threshold=6.0, zscore_window=3)
    for i in range(5):
        rule.step(1.0 + i / 7, 0.5 + i / 3)
    rule.count_skip()  # an overflow skip by DeepSpeed
    state = rule.state_dict()
    assert state["losses"] == [1.0 + i / 7 for i in (2, 3, 4)] and state["skipped_total"] == 1
    other = SkipStepRule(zscore_threshold=6.0, zscore_window=3)
    other.load_state_dict(state)
    assert other.state_dict() == state
    assert other.decide(5.0, 0.6) == rule.decide(5.0, 0.6)
    shorter = SkipStepRule(zscore_threshold=6.0, zscore_window=2)
    shorter.load_state_dict(state)  # a window saved longer keeps its newest values
    assert list(shorter.losses) == state["losses"][-2:]
    shorter.load_state_dict(None)  # a checkpoint without it
    assert shorter.state_dict()["losses"] == [] and shorter.skipped_total == 0


# ------------------------------------------------------------------ flags
def test_flags_default_off_and_parse():
    args = parse([])
    assert args.grad_norm_skip_threshold == math.inf and args.skip_step_zscore_threshold is None
    assert args.skip_step_zscore_window == 128
    args = parse(["--grad-norm-skip-threshold", "10", "--skip-step-zscore-threshold", "6",
                  "--skip-step-zscore-window", "32"])
    assert (args.grad_norm_skip_threshold, args.skip_step_zscore_threshold,
            args.skip_step_zscore_window) == (10.0, 6.0, 32)
    assert any("--skip-step-zscore-window 16: no effect without --skip-step-zscore-threshold"
               in note for note in parse(["--skip-step-zscore-window", "16"]).run_config.notes)


@pytest.mark.parametrize("flags, message", [
    (["--grad-norm-skip-threshold", "0"], "--grad-norm-skip-threshold 0.0: must be a positive number"),
    (["--grad-norm-skip-threshold", "-1"], "--grad-norm-skip-threshold -1.0: must be a positive"),
    (["--grad-norm-skip-threshold", "nan"], "--grad-norm-skip-threshold nan: must be a positive"),
    (["--skip-step-zscore-threshold", "0"], "--skip-step-zscore-threshold 0.0: must be a finite "
                                            "positive number of standard deviations"),
    (["--skip-step-zscore-threshold", "inf"], "--skip-step-zscore-threshold inf: must be a finite"),
    (["--skip-step-zscore-threshold", "6", "--skip-step-zscore-window", "1"],
     "--skip-step-zscore-window 1: must be an integer of at least 2 iterations"),
], ids=["threshold-zero", "threshold-negative", "threshold-nan", "zscore-zero", "zscore-inf",
        "window-one"])
def test_bad_flag_values_name_flag_value_and_what_is_allowed(flags, message):
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(")):
        parse(flags)


# ------------------------------------------------------------------ on a DeepSpeed engine
class Tiny(torch.nn.Module):
    """A weight matrix and a bias (two of build_optimizer's groups: with and without weight
    decay); ``loss = mean((W x + b)^2)``, so the gradient grows with the input's square."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 16)

    def forward(self, x):
        return self.linear(x.to(self.linear.weight.dtype)).float().pow(2).mean()


def _tiny_engine(args):
    """(a Tiny model, its one-rank DeepSpeed engine) of the training flags ``args``."""
    import deepspeed

    from megatron.config.deepspeed_config import deepspeed_config
    from megatron.optim.optimizer import build_optimizer
    from megatron.parallel.topology import MegatronCoreMPU

    model = Tiny()
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=build_optimizer(args.run_config.optimizer, model),
        config=deepspeed_config(args.run_config.deepspeed, args.global_batch_size), mpu=MegatronCoreMPU(),
        dist_init_required=False)
    return model, engine


def _snapshot(engine):
    """Parameters as the model holds them (ZeRO 3: this rank's partition), and every tensor of
    the optimizer's state (fp32 masters, Adam moments and step counts)."""
    state = {f"param{i}": getattr(p, "ds_tensor", p).detach().clone()
             for i, p in enumerate(engine.module.parameters())}
    state.update(tensors_by_path(engine.optimizer.state_dict(), "optimizer"))
    return state


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _iteration(engine, skipper, number, scale):
    skipper.begin_iteration(engine)
    for micro in range(engine.gradient_accumulation_steps()):
        x = torch.full((2, 16), scale * (1 + micro / 8))
        engine.backward(engine(x))
        engine.step()
    return skipper.end_iteration(number)


@pytest.mark.parametrize("flags, wrapper", [
    (["--zero-stage", "0"], "AdamW"),
    (["--zero-stage", "1"], "DeepSpeedZeroOptimizer"),
    (["--zero-stage", "2"], "DeepSpeedZeroOptimizer"),
    (["--zero-stage", "3"], "DeepSpeedZeroOptimizer_Stage3"),
    (["--zero-stage", "0", "--clip-grad", "0"], "AdamW"),
    (["--bf16"], "BF16_Optimizer"),
    # stage 0 asked for: run at stage 1 (DeepSpeed #7790 refuses bf16 + fp32 accumulation at
    # stage 0, #7837 mis-scales its norm; docs/megatron_core_versions.md)
    (["--bf16", "--zero-stage", "0"], "BF16_Optimizer"),
    (["--bf16", "--zero-stage", "2"], "DeepSpeedZeroOptimizer"),
    (["--fp16", "--loss-scale", "1"], "DeepSpeedZeroOptimizer"),
], ids=["fp32-zero0", "fp32-zero1", "fp32-zero2", "fp32-zero3", "fp32-zero0-noclip", "bf16",
        "bf16-zero0-asked", "bf16-zero2", "fp16"])
def test_a_skipped_step_changes_no_parameter_and_no_optimizer_state(
        flags, wrapper, one_rank_model_parallel, monkeypatch):
    """Iterations of input scale 1, 30, 1, 1 with --grad-norm-skip-threshold 100: the second's
    gradient norm (~1e3, the first's ~1) is above it, so after it every parameter, fp32 master
    weight, Adam moment and Adam step count equals, bit for bit, what the first left; the third
    trains (Adam's count says 2 steps after it). The norm decided on is the one DeepSpeed logs."""
    from deepspeed.accelerator import get_accelerator

    from megatron.optim.loss_normalization import normalization
    from megatron.optim.skip_step_engine import step_skipper

    if "--fp16" in flags:
        monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = parse(flags + ["--grad-norm-skip-threshold", "100"])  # --clip-grad 1 by default
    model, engine = _tiny_engine(args)
    assert type(engine.optimizer).__name__ == wrapper
    skipper = step_skipper(args.run_config.skip_step, normalization(args.run_config.loss), engine)
    first = _iteration(engine, skipper, 1, 1.0)
    before = _snapshot(engine)
    spike = _iteration(engine, skipper, 2, 30.0)
    after = _snapshot(engine)
    third = _iteration(engine, skipper, 3, 1.0)
    trained = _snapshot(engine)
    assert (first.skipped, spike.skipped, third.skipped) == (False, True, False)
    assert spike.decision.reason == "grad_norm_threshold" and spike.grad_norm > 100
    assert first.grad_norm < 100 and third.grad_norm < 100
    logged = engine.get_global_grad_norm()
    if logged is not None:  # ZeRO 0 fp32 leaves it to the loop (megatron/train/steps.py)
        assert float(logged) == third.grad_norm
    assert _same(before, after), [k for k in before if not torch.equal(before[k], after[k])]
    assert not any(torch.equal(after[k], trained[k]) for k in after if k.startswith("param"))
    steps = [v for k, v in trained.items() if k.endswith("/step")]
    assert steps and all(float(s) == 2 for s in steps)  # steps 1 and 3 only
    assert skipper.log_fields(4) == ("skipped iterations: 1 (total 1)",
                                     {"skipped": 1, "skipped_total": 1})
    assert skipper.log_fields(1) == ("skipped iterations: 0 (total 1)",
                                     {"skipped": 0, "skipped_total": 1})


def test_deepspeed_overflow_skip_is_counted(one_rank_model_parallel, monkeypatch):
    """fp16 with a static loss scale: an input that overflows fp16 makes DeepSpeed skip the step
    before the torch optimizer is called; the iteration is counted as skipped and its values
    stay out of the z-score window."""
    from deepspeed.accelerator import get_accelerator

    from megatron.optim.loss_normalization import normalization
    from megatron.optim.skip_step_engine import step_skipper

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)
    monkeypatch.setenv("LOCAL_RANK", "0")
    args = parse(["--fp16", "--loss-scale", "1024", "--skip-step-zscore-threshold", "6",
                  "--skip-step-zscore-window", "4"])
    model, engine = _tiny_engine(args)
    skipper = step_skipper(args.run_config.skip_step, normalization(args.run_config.loss), engine)
    forward = skipper.wrap_forward_step(lambda engine, x: (engine(x), None))
    outcomes = []
    for number, scale in enumerate((1.0, 1e3, 1.0), start=1):
        skipper.begin_iteration(engine)
        for _micro in range(engine.gradient_accumulation_steps()):
            loss, _ = forward(engine, torch.full((2, 16), scale))
            engine.backward(loss)
            engine.step()
        outcomes.append(skipper.end_iteration(number))
    assert [o.skipped for o in outcomes] == [False, True, False]
    assert outcomes[1].decision is None
    assert skipper.rule.skipped_total == 1 and len(skipper.rule.losses) == 2
    assert math.isfinite(outcomes[0].loss) and outcomes[0].loss > 0  # the recorded mean loss


@pytest.mark.parametrize("flags", [["--bf16"], ["--zero-stage", "1"]], ids=["bf16", "fp32-zero1"])
def test_a_skipped_first_step_leaves_deepspeeds_optimizer_state_links_working(
        flags, one_rank_model_parallel, monkeypatch):
    """BF16_Optimizer and ZeRO 1/2 link each parameter to its fragment of the optimizer state
    after their first step call; skipped before any state exists, the link is made after the
    next (applied) step, so DeepSpeed's safe_get_full_optimizer_state (and what reads through
    it) finds the moments."""
    from deepspeed.utils import safe_get_full_optimizer_state

    from megatron.optim.loss_normalization import normalization
    from megatron.optim.skip_step_engine import step_skipper

    monkeypatch.setenv("LOCAL_RANK", "0")
    args = parse(flags + ["--grad-norm-skip-threshold", "100"])
    model, engine = _tiny_engine(args)
    skipper = step_skipper(args.run_config.skip_step, normalization(args.run_config.loss), engine)
    assert _iteration(engine, skipper, 1, 30.0).skipped
    assert not _iteration(engine, skipper, 2, 1.0).skipped
    moment = safe_get_full_optimizer_state(model.linear.weight, "exp_avg")
    assert moment is not None and float(moment.abs().sum()) > 0
