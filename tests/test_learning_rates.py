"""OptimizerParamScheduler: equality with megatron-core for Megatron-LM's styles, the Power
Scheduler against its formula (with batch-size rampup), checkpoints and bad flags."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from megatron.arguments import ArgumentError, get_parser, parse_args, validate_args
from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator
from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler as CoreScheduler
from megatron.learning_rates import build_opt_param_scheduler, scheduler_steps_from_args

BASE = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 "
        "--micro-batch-size 2").split()


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
    steps = scheduler_steps_from_args(args)
    return CoreScheduler(
        optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=steps["lr_warmup_steps"], lr_decay_steps=steps["lr_decay_steps"],
        lr_decay_style=args.lr_decay_style, start_wd=args.start_weight_decay,
        end_wd=args.end_weight_decay, wd_incr_steps=steps["wd_incr_steps"],
        wd_incr_style=args.weight_decay_incr_style, use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=False, wsd_decay_steps=steps["wsd_decay_steps"],
        lr_wsd_decay_style=args.lr_wsd_decay_style)


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
    calc = RampupBatchsizeNumMicroBatchesCalculator(16, 2, 1, False, 0, 4, 4, 64)
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
        calc = RampupBatchsizeNumMicroBatchesCalculator(16, 2, 1, False, 0, *rampup)
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
    from megatron.schedules.units import batch_schedule_from_args
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
