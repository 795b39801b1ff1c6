"""OptimizerParamScheduler: equality with megatron-core for Megatron-LM's styles, the Power
Scheduler against its formula (with batch-size rampup), checkpoints and bad flags."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler as CoreScheduler

from helpers.flags import TINY_SCHEDULE as BASE
from helpers.rampup_peer import PeerRampupCalculator
from megatron.config.arguments import validate_args
from megatron.config.parser import get_parser, parse_args
from megatron.errors import ArgumentError
from megatron.optim.learning_rates import build_opt_param_scheduler as _build
from megatron.optim.learning_rates import scheduler_steps


def make_args(*extra):
    return parse_args(BASE + " ".join(extra).split(), world_size=1, require_data=False)


def bad_args(*extra):
    """The ArgumentError message validate_args gives for these flags."""
    args = get_parser().parse_args(BASE + " ".join(extra).split())
    with pytest.raises(ArgumentError) as info:
        validate_args(args, 1, require_data=False)
    return str(info.value)


def dummy_optimizer():
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(2))
    return torch.optim.SGD([{"params": [a], "wd_mult": 1.0, "lr_mult": 1.0},
                            {"params": [b], "wd_mult": 0.0, "lr_mult": 1.0}], lr=0.1)


def core_scheduler(args, optimizer):
    steps = scheduler_steps(args.run_config.schedule)
    return CoreScheduler(
        optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=steps["lr_warmup_steps"], lr_decay_steps=steps["lr_decay_steps"],
        lr_decay_style=args.lr_decay_style, start_wd=args.start_weight_decay,
        end_wd=args.end_weight_decay, wd_incr_steps=steps["wd_incr_steps"],
        wd_incr_style=args.weight_decay_incr_style, use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=False, wsd_decay_steps=steps["wsd_decay_steps"],
        lr_wsd_decay_style=args.lr_wsd_decay_style)


def build_opt_param_scheduler(args, optimizer):
    return _build(args.run_config.schedule, optimizer)


def run(scheduler, optimizer, increments):
    """(lr, wd) of both param groups before each step, then after the last."""
    out = []
    for inc in list(increments) + [None]:
        out.append([(g["lr"], g["weight_decay"]) for g in optimizer.param_groups])
        if inc is not None:
            scheduler.step(increment=inc)
    return np.asarray(out)


ITER_CASES = [
    "--lr-decay-style constant",
    "--lr-decay-style constant --lr-warmup-iters 7",
    "--lr-decay-style linear",
    "--lr-decay-style linear --lr-warmup-iters 10 --lr-decay-iters 40 --min-lr 1e-5",
    "--lr-decay-style cosine --lr-warmup-iters 10 --min-lr 1e-4",
    "--lr-decay-style cosine --lr-warmup-iters 10 --lr-warmup-init 1e-4",
    "--lr-decay-style cosine --lr-warmup-fraction 0.1 --min-lr 2e-5",
    "--lr-decay-style inverse-square-root --lr-warmup-iters 5 --min-lr 1e-4",
    "--lr-decay-style inverse-square-root --min-lr 1e-5",
    "--lr-decay-style linear --weight-decay-incr-style linear --start-weight-decay 0.01 "
    "--end-weight-decay 0.1",
    "--lr-decay-style cosine --weight-decay-incr-style cosine --start-weight-decay 0.0 "
    "--end-weight-decay 0.05 --lr-warmup-iters 3",
] + [f"--lr-decay-style WSD --lr-wsd-decay-iters 20 --lr-wsd-decay-style {s} --lr-warmup-iters 5 "
     f"--min-lr 1e-5" for s in ("exponential", "linear", "cosine", "minus_sqrt")]

SAMPLE_CASES = [
    "--lr-decay-style constant --lr-warmup-samples 30",
    "--lr-decay-style linear --lr-warmup-samples 40 --lr-decay-samples 200 --min-lr 1e-5",
    "--lr-decay-style cosine --lr-warmup-samples 41 --lr-warmup-init 2e-4",
    "--lr-decay-style cosine --lr-warmup-fraction 0.05",
    "--lr-decay-style inverse-square-root --lr-warmup-samples 30",
    "--lr-decay-style cosine --weight-decay-incr-style linear --start-weight-decay 0.02 "
    "--end-weight-decay 0.2",
] + [f"--lr-decay-style WSD --lr-wsd-decay-samples 90 --lr-wsd-decay-style {s} "
     f"--lr-warmup-samples 20 --min-lr 1e-5" for s in ("exponential", "linear", "cosine", "minus_sqrt")]


def _compare(args, increments):
    ours_opt, core_opt = dummy_optimizer(), dummy_optimizer()
    ours = run(build_opt_param_scheduler(args, ours_opt), ours_opt, increments)
    core = run(core_scheduler(args, core_opt), core_opt, increments)
    np.testing.assert_allclose(ours, core, rtol=1e-13, atol=1e-20)
    return ours


@pytest.mark.parametrize("flags", ITER_CASES)
def test_iteration_based_matches_megatron_core(flags):
    args = make_args("--global-batch-size 4 --train-iters 60 --lr 1e-3", flags)
    ours = _compare(args, [4] * 65)  # a few steps past the end too
    assert ours[0, 1, 1] == 0.0 or args.start_weight_decay == 0  # wd_mult 0 group


@pytest.mark.parametrize("flags", SAMPLE_CASES)
def test_sample_based_matches_megatron_core(flags):
    args = make_args("--global-batch-size 8 --train-samples 300 --lr 3e-4", flags)
    _compare(args, [8] * 40)


def test_rampup_increments_match_megatron_core():
    args = make_args("--global-batch-size 16 --rampup-batch-size 4 4 64 --train-samples 400 --lr 1e-3 "
                     "--lr-decay-style cosine --lr-warmup-samples 50 --min-lr 1e-5")
    calc = PeerRampupCalculator(16, 2, 1, False, 0, 4, 4, 64)
    consumed, increments = 0, []
    while consumed < 400:
        calc.update(consumed, False)
        increments.append(calc.get_current_global_batch_size())
        consumed += increments[-1]
    _compare(args, increments)


@settings(max_examples=25, deadline=None)
@given(style=st.sampled_from(["linear", "cosine", "inverse-square-root", "constant"]),
       iters=st.integers(5, 80), warmup_frac=st.floats(0, 0.9), lr=st.floats(1e-5, 1e-2),
       min_frac=st.floats(0, 1), init_frac=st.floats(0, 1))
def test_matches_megatron_core_property(style, iters, warmup_frac, lr, min_frac, init_frac):
    warmup = int(warmup_frac * iters)
    args = make_args(f"--global-batch-size 2 --train-iters {iters} --lr {lr!r} --min-lr {lr * min_frac!r} "
                     f"--lr-warmup-iters {warmup} --lr-warmup-init {lr * init_frac!r} "
                     f"--lr-decay-style {style}")
    _compare(args, [2] * (iters + 2))


# ---- Power Scheduler ----

def power_reference(a, b, lr_max, min_lr, init_lr, seq, batches, warmup_iters, decay_iters, style):
    """Shen et al. 2024: lr(n) = min(lr_max, beta * a * n^b), n = tokens, beta = batch (samples);
    linear warmup to lr(N_warmup); the last decay_iters iterations decay to min_lr."""
    tokens = np.concatenate([[0], np.cumsum(batches)]) * seq       # tokens before iteration i
    beta = list(batches) + [batches[-1]]
    total = len(batches)

    def power(i):
        n = tokens[i]
        return lr_max if n == 0 else min(lr_max, beta[i] * a * n ** b)

    out = []
    for i in range(total + 1):
        n = tokens[i]
        if warmup_iters and n <= tokens[warmup_iters]:
            out.append(init_lr + (power(warmup_iters) - init_lr) * n / tokens[warmup_iters])
            continue
        start = total - decay_iters
        if decay_iters and n > tokens[start]:
            r = (n - tokens[start]) / (tokens[total] - tokens[start])
            c = (math.exp(1 - r) - 1) / (math.e - 1) if style == "exponential" else 1 - r
            out.append(min_lr + c * (power(start) - min_lr))
            continue
        out.append(power(i))
    return np.asarray(out)


@pytest.mark.parametrize("rampup", [None, (4, 4, 100)])
@pytest.mark.parametrize("style", ["exponential", "linear"])
def test_power_scheduler_matches_formula(rampup, style):
    ramp = f"--rampup-batch-size {' '.join(map(str, rampup))}" if rampup else ""
    args = make_args(f"--global-batch-size 16 {ramp} --train-iters 60 --lr 0.02 --min-lr 1e-4 "
                     f"--lr-decay-style power --lr-warmup-iters 8 --power-scheduler-decay-iters 12 "
                     f"--power-scheduler-decay-style {style} --power-scheduler-a 0.05 "
                     "--power-scheduler-b -0.45")
    if rampup:
        calc = PeerRampupCalculator(16, 2, 1, False, 0, *rampup)
        consumed, batches = 0, []
        for _ in range(60):
            calc.update(consumed, False)
            batches.append(calc.get_current_global_batch_size())
            consumed += batches[-1]
        assert len(set(batches)) > 1
    else:
        batches = [16] * 60
    expected = power_reference(0.05, -0.45, 0.02, 1e-4, 0.0, 16, batches, 8, 12, style)
    optimizer = dummy_optimizer()
    ours = run(build_opt_param_scheduler(args, optimizer), optimizer, batches)[:, 0, 0]
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-18)
    assert ours[-1] == pytest.approx(1e-4)
    assert (ours[9:48] < 0.02).any()  # the power law is active, not just the cap


def test_power_scheduler_paper_defaults():
    args = make_args("--global-batch-size 4 --train-iters 20 --lr 0.02 --lr-decay-style power")
    assert (args.power_scheduler_a, args.power_scheduler_b) == (4.6, -0.51)
    assert args.power_scheduler_decay_style == "exponential"
    optimizer = dummy_optimizer()
    lrs = run(build_opt_param_scheduler(args, optimizer), optimizer, [4] * 20)[:, 0, 0]
    n = np.arange(21) * 4 * 16
    expected = np.minimum(0.02, 4 * 4.6 * np.power(np.maximum(n, 1), -0.51))
    expected[0] = 0.02
    np.testing.assert_allclose(lrs, expected, rtol=1e-12)


# ---- checkpoints ----

FLAGS = "--global-batch-size 4 --train-iters 50 --lr-warmup-iters 5 --lr-decay-style cosine"


def test_state_dict_round_trip_continues_identically():
    args = make_args(FLAGS, "--lr 1e-3 --weight-decay-incr-style linear --start-weight-decay 0.0 "
                     "--end-weight-decay 0.1")
    opt_a = dummy_optimizer()
    a = build_opt_param_scheduler(args, opt_a)
    full = run(a, opt_a, [4] * 50)
    opt_b = dummy_optimizer()
    b = build_opt_param_scheduler(args, opt_b)
    run(b, opt_b, [4] * 20)
    sd = b.state_dict()
    opt_c = dummy_optimizer()
    c = build_opt_param_scheduler(args, opt_c)
    c.load_state_dict(torch.load(_save(sd), weights_only=False))
    assert c.num_steps == 80 and c.num_iters == 20
    rest = run(c, opt_c, [4] * 30)
    assert np.array_equal(rest, full[20:])


def _save(sd):
    import io
    buffer = io.BytesIO()
    torch.save(sd, buffer)
    buffer.seek(0)
    return buffer


def test_mismatch_error_names_each_value():
    old = build_opt_param_scheduler(make_args(FLAGS, "--lr 1e-3 --min-lr 1e-5"), dummy_optimizer())
    old.step(4)
    sd = old.state_dict()
    new = build_opt_param_scheduler(make_args(FLAGS, "--lr 2e-3 --min-lr 1e-5"), dummy_optimizer())
    with pytest.raises(ValueError) as info:
        new.load_state_dict(sd)
    msg = str(info.value)
    assert "max_lr" in msg and "--lr" in msg and "0.002" in msg and "0.001" in msg
    assert "min_lr" not in msg
    new2 = build_opt_param_scheduler(make_args(FLAGS, "--lr 2e-3 --min-lr 0 --lr-decay-style linear"),
                                     dummy_optimizer())
    with pytest.raises(ValueError) as info:
        new2.load_state_dict(sd)
    msg = str(info.value)
    assert all(k in msg for k in ("max_lr", "min_lr", "lr_decay_style", "'cosine'", "'linear'"))


def test_override_and_use_checkpoint():
    old_args = make_args(FLAGS, "--lr 1e-3")
    old = build_opt_param_scheduler(old_args, dummy_optimizer())
    for _ in range(10):
        old.step(4)
    sd = old.state_dict()
    expected_old = old.get_lr()

    opt = dummy_optimizer()
    use = build_opt_param_scheduler(make_args(FLAGS, "--lr 2e-3 --use-checkpoint-lr-scheduler"), opt)
    use.load_state_dict(sd)
    assert opt.param_groups[0]["lr"] == expected_old

    opt = dummy_optimizer()
    over = build_opt_param_scheduler(make_args(FLAGS, "--lr 2e-3 --override-opt_param-scheduler"), opt)
    over.load_state_dict(sd)
    fresh = build_opt_param_scheduler(make_args(FLAGS, "--lr 2e-3"), dummy_optimizer())
    for _ in range(10):
        fresh.step(4)
    assert opt.param_groups[0]["lr"] == fresh.get_lr() == pytest.approx(2 * expected_old)


def test_loads_megatron_core_state_dict():
    args = make_args(FLAGS, "--lr 1e-3 --weight-decay-incr-style cosine --start-weight-decay 0.01 "
                     "--end-weight-decay 0.1")
    core_opt = dummy_optimizer()
    core = core_scheduler(args, core_opt)
    for _ in range(15):
        core.step(4)
    sd = core.state_dict()
    assert set(sd) == {"max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
                       "num_steps", "start_wd", "end_wd", "wd_incr_style", "wd_incr_steps"}
    opt = dummy_optimizer()
    ours = build_opt_param_scheduler(args, opt)
    ours.load_state_dict(sd)
    assert ours.num_iters == 15
    np.testing.assert_allclose(run(ours, opt, [4] * 35), run(core, core_opt, [4] * 35), rtol=1e-13)
    # and a megatron-core state dict with other values is a named mismatch
    with pytest.raises(ValueError, match="lr_warmup_steps"):
        build_opt_param_scheduler(make_args(FLAGS.replace("warmup-iters 5", "warmup-iters 6"),
                                            "--lr 1e-3 --weight-decay-incr-style cosine "
                                            "--start-weight-decay 0.01 --end-weight-decay 0.1"),
                                  dummy_optimizer()).load_state_dict(sd)


def test_lr_mult_and_wd_mult():
    args = make_args(FLAGS, "--lr 1e-3 --weight-decay 0.1")
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a], "lr_mult": 0.5, "wd_mult": 1.0},
                           {"params": [b], "lr_mult": 1.0, "wd_mult": 0.0}], lr=1.0)
    s = build_opt_param_scheduler(args, opt)
    for _ in range(7):
        s.step(4)
    assert opt.param_groups[0]["lr"] == 0.5 * s.get_lr() and opt.param_groups[1]["lr"] == s.get_lr()
    assert opt.param_groups[0]["weight_decay"] == 0.1 and opt.param_groups[1]["weight_decay"] == 0.0


# ---- bad flags ----

def test_bad_flags():
    base = "--global-batch-size 4 --train-iters 50"
    assert "--min-lr" in bad_args(base, "--lr 1e-3 --min-lr 1e-2")
    assert "--lr" in bad_args(base, "--lr=-1e-3")
    msg = bad_args(base, "--lr 1e-3 --lr-warmup-iters 60")
    assert "warmup" in msg and "shorter" in msg
    assert "mutually exclusive" in bad_args(base, "--lr 1e-3 --lr-decay-style power "
                                            "--power-scheduler-decay-iters 5 "
                                            "--power-scheduler-decay-tokens 100")
    assert "exceed" in bad_args(base, "--lr 1e-3 --lr-decay-style power --lr-warmup-iters 30 "
                                "--power-scheduler-decay-iters 30")
    assert "--lr-schedule-config" in bad_args(base, "--lr 1e-3 --lr-schedule-config /nonexistent.yaml")


@settings(max_examples=15, deadline=None)
@given(split=st.integers(0, 40),
       flags=st.sampled_from([
           "--lr 1e-3 --lr-decay-style WSD --lr-wsd-decay-iters 10 --lr-warmup-iters 3",
           "--lr 0.02 --lr-decay-style power --lr-warmup-iters 4 --power-scheduler-decay-iters 8 "
           "--power-scheduler-a 0.05 --rampup-batch-size 4 4 60",
           "--lr 1e-3 --lr-decay-style cosine --weight-decay-incr-style cosine "
           "--start-weight-decay 0.0 --end-weight-decay 0.1 --rampup-batch-size 4 4 60"]))
def test_round_trip_at_any_iteration(split, flags):
    args = make_args("--global-batch-size 16 --train-iters 40", flags)
    from megatron.config.batch_flags import batch_schedule_from_args
    bs = batch_schedule_from_args(args)
    batches = [int(b) for b in bs.batch_sizes_at_iterations(np.arange(40))]
    opt = dummy_optimizer()
    full = run(build_opt_param_scheduler(args, opt), opt, batches)
    opt_b = dummy_optimizer()
    first = build_opt_param_scheduler(args, opt_b)
    run(first, opt_b, batches[:split])
    opt_c = dummy_optimizer()
    resumed = build_opt_param_scheduler(args, opt_c)
    resumed.load_state_dict(torch.load(_save(first.state_dict()), weights_only=False))
    assert np.array_equal(run(resumed, opt_c, batches[split:]), full[split:])


# ---- issue 9: Power Scheduler inside stages, floors and flags ----

def _calculator_batches(gbs, rampup, num_iterations):
    """Global batch of each iteration from megatron-core's rampup calculator (independent of
    megatron.schedules.units)."""
    calc = PeerRampupCalculator(gbs, 1, 1, False, 0, *rampup)
    consumed, batches = 0, []
    for _ in range(num_iterations):
        calc.update(consumed, False)
        batches.append(calc.get_current_global_batch_size())
        consumed += batches[-1]
    return np.asarray(batches, dtype=np.int64)


def _write_schedule(tmp_path, config):
    import json
    path = tmp_path / "lr.json"
    path.write_text(json.dumps(config))
    return str(path)


# --rampup-batch-size 256 256 30000000 --global-batch-size 1024, seq 4096: the batch is 256, 512,
# 768 for 10M samples each, then 1024 (the numbers).
RAMP = "--global-batch-size 1024 --rampup-batch-size 256 256 30000000 --seq-length 4096"


def _power_stage_config(unit, start, relative=True):
    return {"lr_schedule": {"type": "staged", "unit": unit, "relative": relative, "stages": [
        {"start": 0, "schedule": {"type": "constant", "value": 0.02}},
        {"start": start, "schedule": {"type": "power", "max": 0.02}}]}}


def test_power_stage_uses_the_runs_batch_and_the_stages_tokens(tmp_path):
    """A power stage starting at 20M samples: at 22M samples the batch is 768 and the stage has
    seen 2M x 4096 tokens, so lr = min(0.02, 768 * 4.6 * (2M*4096)^-0.51) = the cap 0.02 (it was
    0.0104 = beta 256, the batch at the stage-relative 2M samples)."""
    args = make_args(RAMP, "--train-samples 100000000 --lr 0.02 --lr-schedule-config",
                     _write_schedule(tmp_path, _power_stage_config("samples", 20_000_000)))
    sched = build_opt_param_scheduler(args, dummy_optimizer())
    samples = np.asarray([20_000_000, 22_000_000, 28_000_000, 29_999_999, 30_000_001, 60_000_000,
                          99_000_000])
    lr, _ = sched.values_at(np.zeros_like(samples), samples)
    beta = np.where(samples > 30_000_000, 1024,
                    np.minimum(256 + 256 * (samples // 10_000_000), 1024))
    n = (samples - 20_000_000) * 4096.0
    with np.errstate(divide="ignore"):
        expected = np.minimum(0.02, beta * 4.6 * np.power(n, -0.51))
    np.testing.assert_allclose(lr, expected, rtol=1e-12)
    assert lr[1] == 0.02 and beta[1] == 768
    assert (lr[2:] < 0.02).all()            # the power law, not the cap, decides there
    assert lr[2] == pytest.approx(768 * 4.6 * (8e6 * 4096) ** -0.51, rel=1e-12)


def test_power_stage_in_iterations_counts_the_tokens_the_stage_saw(tmp_path):
    """unit: iterations while the batch ramps: n = tokens consumed since the stage's first
    iteration (sum of the ramping batches), beta = the batch of the current iteration."""
    seq, gbs, rampup, start = 4096, 1024, (256, 256, 30_000_000), 70_000
    config = _power_stage_config("iterations", start)
    args = make_args(RAMP, "--train-iters 120000 --lr 0.02 --lr-schedule-config",
                     _write_schedule(tmp_path, config))
    batches = _calculator_batches(gbs, rampup, 120_000)
    consumed = np.concatenate([[0], np.cumsum(batches)])
    assert len(set(batches[start:start + 40_000])) > 1   # the stage starts inside the rampup
    its = np.asarray([start + 1, start + 1000, start + 5000, start + 30_000, 119_000])
    sched = build_opt_param_scheduler(args, dummy_optimizer())
    lr, _ = sched.values_at(its, consumed[its])
    n = (consumed[its] - consumed[start]) * float(seq)
    expected = np.minimum(0.02, batches[its] * 4.6 * np.power(n, -0.51))
    np.testing.assert_allclose(lr, expected, rtol=1e-12)
    assert (lr < 0.02).any()
    # relative: false: n = the run's tokens
    args = make_args(RAMP, "--train-iters 120000 --lr 0.02 --lr-schedule-config",
                     _write_schedule(tmp_path, _power_stage_config("iterations", start, False)))
    lr, _ = build_opt_param_scheduler(args, dummy_optimizer()).values_at(its, consumed[its])
    expected = np.minimum(0.02, batches[its] * 4.6 * np.power(consumed[its] * float(seq), -0.51))
    np.testing.assert_allclose(lr, expected, rtol=1e-12)


def test_power_min_lr_is_a_floor():
    """--min-lr above the power law: the stable phase stays at --min-lr, and the decay phase,
    starting at the floor, does not rise."""
    args = make_args("--global-batch-size 16 --train-iters 60 --lr 0.02 --min-lr 0.013 "
                     "--lr-decay-style power --lr-warmup-iters 4 --power-scheduler-decay-iters 12 "
                     "--power-scheduler-a 0.05 --power-scheduler-b -0.45")
    optimizer = dummy_optimizer()
    lrs = run(build_opt_param_scheduler(args, optimizer), optimizer, [16] * 60)[:, 0, 0]
    n = np.arange(61) * 16 * 16.0
    power = 16 * 0.05 * np.power(np.maximum(n, 1), -0.45)
    assert power[48] < 0.013 < power[30]    # the law crosses the floor mid-run
    stable = np.arange(5, 49)
    np.testing.assert_allclose(lrs[stable], np.maximum(0.013, np.minimum(0.02, power[stable])),
                               rtol=1e-12)
    assert (lrs[5:] >= 0.013 * (1 - 1e-12)).all() and (lrs[30:40] > 0.013).any()
    np.testing.assert_allclose(lrs[48:], 0.013, rtol=1e-12)   # decay from the floor: flat


def test_power_flags_that_would_be_ignored_or_wrong_are_refused():
    base = "--global-batch-size 4 --train-iters 50 --lr 0.02 --lr-decay-style power"
    msg = bad_args(base, "--lr-decay-iters 40")
    assert "--lr-decay-iters 40" in msg and "--power-scheduler-decay-iters" in msg
    assert "--lr-decay-tokens" not in msg
    assert "--power-scheduler-b 0.1 must be negative" in bad_args(base, "--power-scheduler-b 0.1")
    assert "--power-scheduler-b 0.0 must be negative" in bad_args(base, "--power-scheduler-b 0")
    # with a decay phase, --lr-decay-iters is where it ends
    args = make_args(base, "--lr-decay-iters 40 --power-scheduler-decay-iters 10")
    optimizer = dummy_optimizer()
    lrs = run(build_opt_param_scheduler(args, optimizer), optimizer, [4] * 50)[:, 0, 0]
    assert lrs[30] > 0 and (lrs[41:] == 0).all() and lrs[40] == pytest.approx(0, abs=1e-15)


def test_power_b_not_negative_in_a_schedule_file(tmp_path):
    path = _write_schedule(tmp_path, {"lr_schedule": {"type": "power", "max": 0.02, "b": 0.2}})
    msg = bad_args("--global-batch-size 4 --train-iters 50 --lr 0.02 --lr-schedule-config", path)
    assert path in msg and "'b' 0.2 must be negative" in msg


# ---- BigScience token flags with iteration-based runs ----

def test_token_flags_with_train_iters_match_megatron_core():
    """--lr-warmup-tokens/--lr-decay-tokens with --train-iters: spans of tokens / seq-length
    samples, the values megatron-core gives for those sample spans."""
    args = make_args("--global-batch-size 4 --train-iters 60 --lr 1e-3 --min-lr 1e-5 "
                     "--lr-decay-style cosine --lr-warmup-tokens 520 --lr-decay-tokens 3000")
    steps = scheduler_steps(args.run_config.schedule)
    assert (steps["lr_warmup_steps"], steps["lr_decay_steps"]) == (520 / 16, 3000 / 16)
    _compare(args, [4] * 62)


def test_power_token_flags_with_train_iters_and_rampup():
    """Power style, --train-iters with rampup, warmup and decay in tokens: the formula in tokens
    (beta = the ramping batch) with the phases where the tokens say."""
    args = make_args("--global-batch-size 16 --rampup-batch-size 4 4 100 --train-iters 60 "
                     "--lr 0.02 --min-lr 1e-4 --lr-decay-style power --lr-warmup-tokens 1000 "
                     "--power-scheduler-decay-tokens 3000 --power-scheduler-decay-style linear "
                     "--power-scheduler-a 0.05 --power-scheduler-b -0.45")
    batches = _calculator_batches(16, (4, 4, 100), 60)
    tokens = np.concatenate([[0], np.cumsum(batches)]) * 16.0
    beta = np.concatenate([batches, batches[-1:]]).astype(float)
    warm, start = 1000.0, tokens[-1] - 3000.0

    def law(n, b):
        return min(0.02, b * 0.05 * n ** -0.45) if n else 0.02

    beta_at = lambda n: beta[np.searchsorted(tokens, n, side="right") - 1]  # noqa: E731
    expected = []
    for i, n in enumerate(tokens):
        if n <= warm:
            expected.append(law(warm, beta_at(warm)) * n / warm)
        elif n > start:
            top = max(1e-4, law(start, beta_at(start)))
            expected.append(1e-4 + (1 - (n - start) / 3000.0) * (top - 1e-4))
        else:
            expected.append(max(1e-4, law(n, beta[i])))
    optimizer = dummy_optimizer()
    ours = run(build_opt_param_scheduler(args, optimizer), optimizer, batches)[:, 0, 0]
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-18)


@pytest.mark.parametrize("flags, named, not_named", [
    ("--train-iters 10 --lr-warmup-tokens 1000000 --lr-decay-tokens 640",
     ["--lr-warmup-tokens 1000000", "--lr-decay-tokens 640", "shorter"],
     ["--lr-warmup-samples", "--lr-warmup-iters", "--lr-decay-samples", "--lr-decay-iters"]),
    ("--train-iters 10 --lr-warmup-tokens 100 --lr-warmup-iters 2",
     ["--lr-warmup-iters 2", "--lr-warmup-tokens 100"], ["--lr-warmup-samples", "fraction"]),
    ("--train-iters 10 --lr-decay-tokens 100 --lr-decay-iters 5",
     ["--lr-decay-iters 5", "--lr-decay-tokens 100"], ["--lr-decay-samples"]),
    ("--train-iters 10 --lr-warmup-samples 8", ["--lr-warmup-samples 8", "--train-iters 10"],
     ["--lr-decay-samples", "--lr-wsd"]),
    ("--train-samples 100 --lr-warmup-iters 60", ["--lr-warmup-iters 60", "--train-samples 100"],
     ["--lr-decay-iters", "--lr-wsd"]),
    ("--train-iters 10 --lr-warmup-iters 30", ["--lr-warmup-iters 30", "--train-iters 10"],
     ["--lr-decay", "-samples", "-tokens"]),
])
def test_lr_span_errors_name_only_the_flags_given(flags, named, not_named):
    msg = bad_args("--global-batch-size 4 --lr 1e-3", flags)
    for fragment in named:
        assert fragment in msg, (fragment, msg)
    for fragment in not_named:
        assert fragment not in msg, (fragment, msg)


@pytest.mark.parametrize("flag", ["--lr inf", "--lr nan", "--min-lr nan", "--lr-warmup-init nan",
                                  "--power-scheduler-a inf", "--weight-decay nan"])
def test_non_finite_lr_flags_are_refused(flag):
    msg = bad_args("--global-batch-size 4 --train-iters 10 --lr 1e-3 --lr-decay-style power", flag)
    assert f"{flag} is not a finite number" in msg


# ---- checkpoints record everything that shapes the schedules ----

STAGED = {"lr_schedule": [
    {"start": 0, "schedule": {"type": "linear", "from": 0.0, "to": 3.0e-4}},
    {"start": 10, "schedule": {"type": "constant", "value": 3.0e-4}},
    {"start": 40, "schedule": {"type": "cosine", "from": 3.0e-4, "to": 3.0e-5}}],
    "weight_decay_schedule": {"type": "linear", "from": 0.0, "to": 0.1}}


def _file_scheduler(tmp_path, name, config, flags, optimizer=None):
    import json
    path = tmp_path / name
    path.write_text(json.dumps(config))
    args = make_args(flags, "--lr 3e-4 --lr-schedule-config", str(path))
    return build_opt_param_scheduler(args, optimizer or dummy_optimizer())


def _stepped_state(scheduler, batch, steps):
    for _ in range(steps):
        scheduler.step(batch)
    return torch.load(_save(scheduler.state_dict()), weights_only=False)


def test_state_dict_records_the_run_shape(tmp_path):
    s = _file_scheduler(tmp_path, "a.json", STAGED,
                        "--global-batch-size 16 --rampup-batch-size 4 4 100 --train-samples 1000")
    params = torch.load(_save(s.state_dict()), weights_only=False)["params"]
    bs_iters = int(np.searchsorted(s.context.batch_schedule.consumed_samples_table(100), 1000,
                                   side="right") - 1)
    assert params["train_iters"] == bs_iters and params["train_samples"] == 1000
    assert params["global_batch_size"] == 16 and params["rampup_batch_size"] == [4, 4, 100]
    assert params["seq_length"] == 16
    assert params["lr_schedule"] == STAGED["lr_schedule"]
    assert params["weight_decay_schedule"] == STAGED["weight_decay_schedule"]


def test_resume_refuses_every_change_in_one_error(tmp_path):
    old = _file_scheduler(tmp_path, "a.json", STAGED, "--global-batch-size 16 --train-iters 100")
    sd = _stepped_state(old, 16, 30)
    changed = json_copy(STAGED)
    changed["lr_schedule"][2]["schedule"]["to"] = 1.0e-5
    new = _file_scheduler(tmp_path, "b.json", changed,
                          "--global-batch-size 16 --rampup-batch-size 8 8 64 --train-iters 120 "
                          "--seq-length 32")
    with pytest.raises(ValueError) as info:
        new.load_state_dict(sd)
    msg = str(info.value)
    for fragment in ("(train_iters): checkpoint 100, now 120",
                     "(train_samples): checkpoint 1600, now",
                     "--rampup-batch-size (rampup_batch_size): checkpoint None, now [8, 8, 64]",
                     "--seq-length (seq_length): checkpoint 16, now 32",
                     "--lr-schedule-config lr_schedule[2].schedule.to: checkpoint 3e-05, now 1e-05",
                     "--override-opt_param-scheduler", "--use-checkpoint-opt_param-scheduler"):
        assert fragment in msg, (fragment, msg)
    assert "global_batch_size" not in msg and "lr_schedule[0]" not in msg
    assert msg.count("differs from the checkpoint") == 1


def json_copy(value):
    import json
    return json.loads(json.dumps(value))


def test_use_checkpoint_restores_a_file_schedule_with_its_run_length(tmp_path):
    """Resumed with a longer run: --use-checkpoint-opt_param-scheduler keeps the checkpoint's
    schedule (the cosine stage still ends at iteration 100), --override-opt_param-scheduler takes
    the new one (it ends at 200)."""
    flags = "--global-batch-size 16 --train-iters 100"
    reference = _file_scheduler(tmp_path, "a.json", STAGED, flags)
    its = np.arange(0, 201)
    want, want_wd = reference.values_at(its, its * 16)
    sd = _stepped_state(_file_scheduler(tmp_path, "a.json", STAGED, flags), 16, 30)

    opt = dummy_optimizer()
    use = _file_scheduler(tmp_path, "a.json", STAGED, "--global-batch-size 16 --train-iters 200 "
                          "--use-checkpoint-opt_param-scheduler", opt)
    use.load_state_dict(sd)
    got, got_wd = use.values_at(its, its * 16)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(got_wd, want_wd)
    assert got[100] == pytest.approx(3e-5) and opt.param_groups[0]["lr"] == want[30]

    over = _file_scheduler(tmp_path, "a.json", STAGED, "--global-batch-size 16 --train-iters 200 "
                           "--override-opt_param-scheduler")
    over.load_state_dict(sd)
    fresh = _file_scheduler(tmp_path, "a.json", STAGED, "--global-batch-size 16 --train-iters 200")
    np.testing.assert_array_equal(over.values_at(its, its * 16)[0], fresh.values_at(its, its * 16)[0])
    assert over.values_at(its, its * 16)[0][100] > 3e-5 and over.num_iters == 30


def test_use_checkpoint_restores_the_power_schedules_batch_and_seq(tmp_path):
    """The power schedule depends on the batch schedule and --seq-length: the checkpoint's are
    restored with the schedule."""
    power = {"lr_schedule": {"type": "power", "max": 0.02, "a": 0.05, "b": -0.45}}
    flags = "--global-batch-size 16 --rampup-batch-size 4 4 100 --train-iters 60"
    reference = _file_scheduler(tmp_path, "p.json", power, flags)
    its = np.arange(1, 61)
    samples = reference.context.batch_schedule.samples_at_iterations(its)
    want = reference.values_at(its, samples)[0]
    sd = _stepped_state(_file_scheduler(tmp_path, "p.json", power, flags), 4, 3)
    use = _file_scheduler(tmp_path, "p.json", power, "--global-batch-size 16 --train-iters 60 "
                          "--seq-length 32 --use-checkpoint-opt_param-scheduler")
    assert not np.array_equal(use.values_at(its, samples)[0], want)
    use.load_state_dict(sd)
    np.testing.assert_array_equal(use.values_at(its, samples)[0], want)
