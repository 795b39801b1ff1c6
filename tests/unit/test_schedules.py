"""The schedule language: registry, built-in kinds, staged schedules, units, config errors."""
import json
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers.paths import DATA
from megatron.config.arguments import validate_args
from megatron.config.parser import get_parser
from megatron.errors import ArgumentError
from megatron.schedules.registry import (
    REQUIRED,
    Schedule,
    ScheduleContext,
    ScheduleError,
    build_schedule,
    known_kinds,
    register_schedule,
)
from megatron.schedules.units import BatchSchedule

BUILTIN = ["constant", "linear", "cosine", "inverse-square-root", "wsd", "power", "step",
           "piecewise-linear", "staged"]
CTX = ScheduleContext.for_training(BatchSchedule(8, None, seq_length=16), 1000)
RAMP_CTX = ScheduleContext.for_training(BatchSchedule(16, (4, 4, 200), seq_length=16), 1000)


def test_registry_lists_builtins():
    assert set(BUILTIN) <= set(known_kinds())


def test_unknown_type_lists_known_kinds():
    with pytest.raises(ScheduleError) as info:
        build_schedule({"type": "cosinus", "from": 1.0})
    assert "cosinus" in str(info.value) and all(k in str(info.value) for k in BUILTIN)


def test_unknown_key_is_named():
    with pytest.raises(ScheduleError, match="'form'"):
        build_schedule({"type": "cosine", "form": 1.0, "to": 0.0}, CTX)
    with pytest.raises(ScheduleError, match="unit"):
        build_schedule({"type": "constant", "value": 1, "unit": "epochs"})


def test_number_is_constant():
    s = build_schedule(3.5)
    assert s.unit == "iterations" and s(10) == 3.5 and np.all(s(np.arange(5)) == 3.5)


def test_span_comes_from_context_in_the_schedule_unit():
    it = build_schedule({"type": "linear", "from": 1.0, "to": 0.0}, CTX)
    assert it(500) == pytest.approx(0.5) and it(1000) == 0.0
    sa = build_schedule({"type": "linear", "from": 1.0, "to": 0.0, "unit": "samples"}, CTX)
    assert sa.unit == "samples" and sa(4000) == pytest.approx(0.5)
    tk = build_schedule({"type": "linear", "from": 1.0, "to": 0.0, "unit": "tokens"}, CTX)
    assert tk(8 * 16 * 250) == pytest.approx(0.75)
    explicit = build_schedule({"type": "linear", "from": 1.0, "to": 0.0, "span": 10}, CTX)
    assert explicit(5) == pytest.approx(0.5) and explicit(20) == 0.0


def test_kinds_values():
    cos = build_schedule({"type": "cosine", "from": 3e-4, "to": 3e-5}, CTX)
    assert cos(0) == pytest.approx(3e-4) and cos(500) == pytest.approx(1.65e-4) and cos(1000) == pytest.approx(3e-5)
    warm = build_schedule({"type": "cosine", "from": 1.0, "to": 0.0, "warmup": 100,
                           "warmup_from": 0.1}, CTX)
    assert warm(0) == pytest.approx(0.1) and warm(50) == pytest.approx(0.55) and warm(100) == 1.0
    isr = build_schedule({"type": "inverse-square-root", "from": 1.0, "to": 0.01, "warmup": 4}, CTX)
    assert isr(16) == pytest.approx(0.5) and isr(1001) == 0.01
    wsd = build_schedule({"type": "wsd", "from": 1.0, "to": 0.0, "decay": 100, "decay_style": "linear"}, CTX)
    assert wsd(900) == 1.0 and wsd(950) == pytest.approx(0.5) and wsd(1000) == pytest.approx(0.0)
    step = build_schedule({"type": "step", "points": {0: 1.0, 100: 0.5, "300": 0.1}})
    assert list(step([0, 99, 100, 299, 300, 10**6])) == [1.0, 1.0, 0.5, 0.5, 0.1, 0.1]
    pl = build_schedule({"type": "piecewise-linear", "points": [[0, 0.0], [10, 1.0]]})
    assert pl(5) == 0.5 and pl(-1) == 0.0 and pl(100) == 1.0


def test_linear_with_points_is_piecewise_linear():
    """The blend-file form: weight: {type: linear, unit: iterations, points: {...}}."""
    s = build_schedule({"type": "linear", "unit": "iterations", "points": {0: 100, 100: 10, 1000: 0}})
    assert list(s([0, 50, 100, 550, 1000, 5000])) == [100, 55, 10, 5, 0, 0]
    with pytest.raises(ScheduleError, match="'from'"):
        build_schedule({"type": "linear", "points": {0: 1}, "from": 1.0})


def test_power_kind_uses_batch_schedule_under_rampup():
    s = build_schedule({"type": "power", "max": 1.0, "a": 0.5, "b": -0.5}, RAMP_CTX)
    assert s.unit == "tokens"
    bs = RAMP_CTX.batch_schedule
    samples = bs.samples_at_iterations(np.arange(0, 200))
    tokens = samples * 16.0
    expected = [1.0 if n == 0 else min(1.0, bs.batch_size_at_samples(int(m)) * 0.5 * n ** -0.5)
                for m, n in zip(samples, tokens, strict=True)]
    np.testing.assert_allclose(s(tokens), expected, rtol=1e-13)
    it = build_schedule({"type": "power", "max": 1.0, "a": 0.5, "b": -0.5, "unit": "iterations"},
                        RAMP_CTX)
    np.testing.assert_allclose(it(np.arange(0, 200)), expected, rtol=1e-13)


STAGED = [
    {"start": 0, "schedule": {"type": "linear", "from": 0.0, "to": 3.0e-4}},
    {"start": 100, "schedule": {"type": "constant", "value": 3.0e-4}},
    {"start": 900, "schedule": {"type": "cosine", "from": 3.0e-4, "to": 3.0e-5}},
]


def test_staged_design_example_is_continuous():
    s = build_schedule(STAGED, CTX)
    p = np.arange(0, 1001, dtype=float)
    v = s(p)
    assert v[0] == 0.0 and v[50] == pytest.approx(1.5e-4) and v[100] == pytest.approx(3e-4)
    assert v[500] == 3e-4 and v[950] == pytest.approx(1.65e-4) and v[1000] == pytest.approx(3e-5)
    assert np.max(np.abs(np.diff(v))) < 5e-6  # no jumps: each stage's from/to meets the next
    fine = s(np.array([99.999, 100.0, 899.999, 900.0]))
    assert fine[0] == pytest.approx(fine[1], rel=1e-4) and fine[2] == pytest.approx(fine[3])


def test_staged_relative_and_absolute():
    rel = build_schedule([{"start": 0, "schedule": 1.0},
                          {"start": 10, "schedule": {"type": "step", "points": {0: 2.0, 5: 3.0}}}], CTX)
    assert list(rel([9, 10, 14, 15])) == [1.0, 2.0, 2.0, 3.0]
    ab = build_schedule({"type": "staged", "relative": False, "stages": [
        {"start": 0, "schedule": 1.0},
        {"start": 10, "schedule": {"type": "step", "points": {0: 2.0, 15: 3.0}}}]}, CTX)
    assert list(ab([9, 10, 14, 15])) == [1.0, 2.0, 2.0, 3.0]
    samples = build_schedule({"type": "staged", "unit": "samples", "stages": [
        {"start": 0, "schedule": {"type": "linear", "from": 1.0, "to": 0.0}},
        {"start": 4000, "schedule": 0.0}]}, CTX)
    assert samples.unit == "samples" and samples(2000) == 0.5


@pytest.mark.parametrize("stages, match", [
    ([{"start": 0, "schedule": 1.0}, {"start": 50, "schedule": 2.0}, {"start": 20, "schedule": 3.0}],
     "not after"),
    ([{"start": 0, "schedule": 1.0}, {"start": 50, "schedule": 2.0}, {"start": 50, "schedule": 3.0}],
     "not after"),
    ([{"start": 0, "schedule": 1.0}, {"start": 1000, "schedule": 2.0}], "end of training"),
    ([{"start": 0, "schedule": 1.0}, {"start": 5000, "schedule": 2.0}], "end of training"),
    ([{"start": 10, "schedule": 1.0}], "must be 0"),
    ([{"start": 0, "schedule": {"type": "linear", "from": 1.0, "to": 0.0, "span": 80}},
      {"start": 50, "schedule": 0.0}], "overlaps"),
    ([{"start": 0, "schedule": 1.0, "end": 4}], "'end'"),
    ([{"start": 0, "schedule": {"type": "nope"}}], "known types"),
])
def test_bad_stages(stages, match):
    with pytest.raises(ScheduleError, match=match):
        build_schedule(stages, CTX)


def test_custom_kind_plugs_in():
    @register_schedule("test-sawtooth")
    class Sawtooth(Schedule):
        keys = {"peak": REQUIRED, "period": 10}

        def __init__(self, unit, peak, period):
            self.unit, self.peak, self.period = unit, peak, period

        def values(self, p):
            return self.peak * (p % self.period) / self.period

    s = build_schedule({"type": "test-sawtooth", "peak": 2.0, "unit": "samples"})
    assert s.unit == "samples" and list(s([0, 5, 10, 15])) == [0.0, 1.0, 0.0, 1.0]
    assert "test-sawtooth" in known_kinds()
    staged = build_schedule([{"start": 0, "schedule": 0.5},
                             {"start": 100, "schedule": {"type": "test-sawtooth", "peak": 1.0}}], CTX)
    assert staged(105) == 0.5
    with pytest.raises(ScheduleError, match="'peak'"):
        build_schedule({"type": "test-sawtooth"})


KIND_CONFIGS = [
    {"type": "constant", "value": 2.0, "warmup": 10},
    {"type": "linear", "from": 1.0, "to": 0.1, "warmup": 30, "warmup_from": 0.2},
    {"type": "cosine", "from": 1.0, "to": 0.1, "warmup": 30},
    {"type": "cosine", "from": 0.1, "to": 1.0, "unit": "samples"},
    {"type": "inverse-square-root", "from": 1.0, "to": 0.1, "warmup": 30},
    {"type": "wsd", "from": 1.0, "to": 0.0, "decay": 200, "decay_style": "minus_sqrt"},
    {"type": "power", "max": 0.02, "warmup": 20000, "decay": 20000, "span": 128000},
    {"type": "step", "points": {0: 1.0, 100: 0.5}},
    {"type": "linear", "points": {0: 100, 100: 10, 1000: 0}},
    STAGED,
]


@settings(max_examples=60, deadline=None)
@given(index=st.integers(0, len(KIND_CONFIGS) - 1),
       progress=st.lists(st.floats(0, 2000, allow_nan=False), min_size=1, max_size=20))
def test_vectorised_equals_scalar_and_is_pure(index, progress):
    s = build_schedule(KIND_CONFIGS[index], CTX)
    p = np.asarray(progress)
    vector = s(p)
    assert vector.shape == p.shape
    assert [s(float(x)) for x in p] == list(vector)
    assert list(s(p)) == list(vector)  # pure: same input, same output
    assert np.all(np.isfinite(vector))


@settings(max_examples=30, deadline=None)
@given(start=st.integers(1, 4), incr=st.integers(1, 4), n=st.integers(1, 5), ramp=st.integers(0, 300),
       seq=st.integers(1, 64), iters=st.lists(st.integers(0, 500), min_size=1, max_size=30))
def test_units_conversions_round_trip(start, incr, n, ramp, seq, iters):
    bs = BatchSchedule(start + n * incr, (start, incr, ramp), seq_length=seq)
    table = [0]
    for _ in range(max(iters)):
        table.append(table[-1] + bs.batch_size_at_samples(table[-1]))
    it = np.asarray(iters)
    samples = bs.samples_at_iterations(it)
    assert list(samples) == [table[i] for i in iters]
    assert list(bs.iterations_at_samples(samples)) == iters
    assert list(bs.iterations_at_samples(samples + 0.5)) == iters
    assert list(bs.convert(it, "iterations", "tokens")) == [table[i] * seq for i in iters]
    assert list(bs.convert(samples * seq, "tokens", "iterations")) == iters
    assert list(bs.batch_sizes_at_samples(samples)) == [bs.batch_size_at_samples(table[i]) for i in iters]
    for i in iters:
        assert bs.iterations_for_samples(table[i]) == i


# ---- --lr-schedule-config through the flags ----

BASE = ("--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 16 "
        "--micro-batch-size 2 --global-batch-size 4 --train-iters 1000 --lr 3e-4").split()


def config_args(tmp_path, config, name="schedule.yaml"):
    path = tmp_path / name
    if isinstance(config, str):
        path.write_text(config)
    else:
        path.write_text(json.dumps(config))
    args = get_parser().parse_args(BASE + ["--lr-schedule-config", str(path)])
    return args, str(path)


def test_config_file_yaml_staged(tmp_path):
    import torch

    from megatron.optim.learning_rates import build_opt_param_scheduler
    args, _ = config_args(tmp_path, """
lr_schedule:
  - start: 0
    schedule: {type: linear, from: 0.0, to: 3.0e-4}
  - start: 100
    schedule: {type: constant, value: 3.0e-4}
  - start: 900
    schedule: {type: cosine, from: 3.0e-4, to: 3.0e-5}
weight_decay_schedule: {type: step, points: {0: 0.0, 500: 0.1}}
""")
    validate_args(args, 1, require_data=False)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = build_opt_param_scheduler(args.run_config.schedule, opt)
    seen = []
    for _ in range(1000):
        seen.append((opt.param_groups[0]["lr"], opt.param_groups[0]["weight_decay"]))
        s.step(4)
    assert seen[50][0] == pytest.approx(1.5e-4) and seen[500] == (3e-4, 0.1) and seen[499][1] == 0.0


@pytest.mark.parametrize("config, words", [
    ({"lr_schedule": {"type": "cosine", "from": 3e-4, "to": 3e-5}, "lr_shedule": 1}, ["'lr_shedule'"]),
    ({"lr_schedule": {"type": "cosine", "from": 3e-4, "too": 3e-5}}, ["'too'"]),
    ({"lr_schedule": {"type": "cosinus", "from": 3e-4}}, ["'cosinus'", "known types", "wsd"]),
    ({"lr_schedule": {"type": "linear", "from": 3e-4, "to": -1e-5}}, ["negative"]),
    ({"lr_schedule": -1.0}, ["negative"]),
    ({"lr_schedule": {"type": "cosine", "from": 3e-4, "warmup": 2000}}, ["warmup", "shorter"]),
    ({"lr_schedule": [{"start": 0, "schedule": 1e-4}, {"start": 500, "schedule": 2e-4},
                      {"start": 300, "schedule": 3e-4}]}, ["stage 2", "300"]),
    ({"lr_schedule": [{"start": 0, "schedule": 1e-4}, {"start": 1200, "schedule": 2e-4}]},
     ["stage 1", "1200", "end of training"]),
    ({"weight_decay_schedule": 0.1}, ["lr_schedule"]),
])
def test_config_file_errors_name_file_key_value(tmp_path, config, words):
    args, path = config_args(tmp_path, config, "bad.json")
    with pytest.raises(ArgumentError) as info:
        validate_args(args, 1, require_data=False)
    msg = str(info.value)
    assert path in msg and "--lr-schedule-config" in msg
    for word in words:
        assert word in msg


def test_config_file_unparsable(tmp_path):
    args, path = config_args(tmp_path, "lr_schedule: [unclosed", "bad.yaml")
    with pytest.raises(ArgumentError, match="cannot parse"):
        validate_args(args, 1, require_data=False)


# ---- Levanter's staged spelling, the inv kind, numbers written as strings ----

SEEDS = os.path.join(DATA, "seeds")


def levanter_inv(count, lr, min_lr, decay_steps):
    """Levanter's ``_inv_decay_schedule`` (src/levanter/optim/config.py), transcribed."""
    decay = min(1.0, 1.0 / ((lr / min_lr - 1) * max(count, 1) / decay_steps + 1))
    return max(lr * decay, min_lr)


def test_levanter_seed_file(tmp_path):
    """The Levanter staged schedule (tests/data/seeds/levanter_lr_schedule.yaml, verbatim: `value:`
    stages at 0, 1000, 100000, `initial_lr`/`final_lr`, `learning_rate`, a bare `inv`, `1e-4` read
    by YAML 1.1 as a string) in a 120000-iteration run: linear 0 -> 1e-4, constant 1e-4, then
    Levanter's inv formula from --lr to --min-lr over the last stage."""
    import torch

    from megatron.optim.learning_rates import build_opt_param_scheduler
    flags = BASE[:-4] + ["--train-iters", "120000", "--lr", "1e-4", "--min-lr", "1e-5",
                         "--lr-schedule-config", os.path.join(SEEDS, "levanter_lr_schedule.yaml")]
    args = validate_args(get_parser().parse_args(flags), 1, require_data=False)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    s = build_opt_param_scheduler(args.run_config.schedule, opt)
    iterations = np.arange(120001)
    lr, _ = s.values_at(iterations, iterations * 4)
    i = iterations.astype(np.float64)
    count = np.maximum(i - 100000, 1)
    inv = np.maximum(1e-4 * np.minimum(1.0, 1.0 / ((1e-4 / 1e-5 - 1) * count / 20000 + 1)), 1e-5)
    want = np.where(i < 1000, 1e-4 * i / 1000, np.where(i < 100000, 1e-4, inv))
    np.testing.assert_allclose(lr, want, rtol=1e-12, atol=0)
    for k in (100001, 100500, 119000):
        assert lr[k] == pytest.approx(levanter_inv(k - 100000, 1e-4, 1e-5, 20000), rel=1e-12)
    seen = []  # the stepped scheduler gives the same values
    for _ in range(1001):
        seen.append(opt.param_groups[0]["lr"])
        s.step(4)
    np.testing.assert_allclose(seen, lr[:1001], rtol=1e-12, atol=0)
    assert lr[-1] == pytest.approx(1e-5)
    # the run's --lr/--min-lr are stored with the schedule (a resume with others is refused)
    assert s.params["lr_schedule"][2]["value"] == {"type": "inv", "learning_rate": 1e-4,
                                                   "min_lr": 1e-5}


def test_levanter_optimizer_wrapper_is_taken_and_keys_beside_it_refused(tmp_path):
    """Levanter's configs nest lr_schedule under optimizer: the seed file so wrapped gives the
    unwrapped file's LR at every iteration (Levanter's inv in the last stage); a key beside the
    wrapper, or one inside it other than the schedules, is refused in one line naming it."""
    import torch

    from megatron.optim.learning_rates import build_opt_param_scheduler
    seed = open(os.path.join(SEEDS, "levanter_lr_schedule.yaml")).read()
    wrapped = tmp_path / "levanter_optimizer.yaml"
    wrapped.write_text("optimizer:\n" + "".join("  " + line + "\n" for line in seed.splitlines()))
    lrs = []
    for path in (os.path.join(SEEDS, "levanter_lr_schedule.yaml"), str(wrapped)):
        flags = BASE[:-4] + ["--train-iters", "120000", "--lr", "1e-4", "--min-lr", "1e-5",
                             "--lr-schedule-config", path]
        args = validate_args(get_parser().parse_args(flags), 1, require_data=False)
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        iterations = np.arange(0, 120001, 7)
        lrs.append(build_opt_param_scheduler(args.run_config.schedule, opt).values_at(
            iterations, iterations * 4)[0])
    np.testing.assert_array_equal(lrs[0], lrs[1])
    assert lrs[1][-1] == pytest.approx(levanter_inv(119994 - 100000, 1e-4, 1e-5, 20000), rel=1e-12)
    bad = [("optimizer:\n  lr_schedule: {type: constant, value: 1e-3}\ntrainer: {num_train_steps: 10}\n",
            "key 'trainer' beside 'optimizer' (Levanter's wrapper of lr_schedule)"),
           ("optimizer:\n  learning_rate: 3e-4\n  lr_schedule: {type: constant, value: 1e-3}\n",
            "unknown key 'optimizer.learning_rate' (known keys: optimizer.lr_schedule"),
           ("optimizer:\n  weight_decay_schedule: {type: constant, value: 0.1}\n",
            "missing key 'optimizer.lr_schedule'"),
           ("optimizer: [1, 2]\n", "'optimizer' must be a mapping with key 'lr_schedule'")]
    for text, message in bad:
        args, path = config_args(tmp_path, text, "bad.yaml")
        with pytest.raises(ArgumentError) as e:
            validate_args(args, 1, require_data=False)
        assert f"--lr-schedule-config {path}: {message}" in str(e.value)
        assert "\n" not in str(e.value)


def test_inv_kind_matches_levanters_formula():
    for lr, low, span in ((1e-4, 1e-5, 20), (3e-3, 3e-5, 1000), (1.0, 0.5, 7)):
        s = build_schedule({"type": "inv", "learning_rate": lr, "min_lr": low, "span": span}, CTX)
        p = np.arange(0, 3 * span + 1)
        np.testing.assert_allclose(s(p), [levanter_inv(c, lr, low, span) for c in p], rtol=1e-13)
        assert s(span) == pytest.approx(low) and s(2 * span) == low
    aliased = build_schedule({"type": "inv", "from": 1e-3, "to": 1e-4}, CTX)  # span: the run
    assert aliased(400) == pytest.approx(levanter_inv(400, 1e-3, 1e-4, 1000))
    staged = build_schedule([{"start": 0, "schedule": 1e-3},
                             {"start": 600, "value": {"type": "inv", "from": 1e-3, "to": 1e-4}}], CTX)
    assert staged(700) == pytest.approx(levanter_inv(100, 1e-3, 1e-4, 400))


@pytest.mark.parametrize("config, words", [
    ({"type": "inv", "learning_rate": 1e-3, "min_lr": 0}, ["'min_lr' 0", "> 0", "--min-lr"]),
    ({"type": "inv", "from": 1e-3, "to": -1e-4}, ["'min_lr' -0.0001", "> 0", "'to' is 'min_lr'"]),
    ({"type": "inv", "min_lr": 1e-4}, ["'learning_rate'", "'from'", "--lr"]),
    ({"type": "inv", "learning_rate": 1e-3}, ["'min_lr'", "'to'", "--min-lr"]),
    ({"type": "inv", "learning_rate": 1e-3, "min_lr": 1e-4, "span": 0}, ["'span' 0"]),
    ({"type": "linear", "initial_lr": 0.0, "from": 0.1}, ["'initial_lr'", "'from'", "same key"]),
    ({"type": "linear", "initial_lr": "fast"}, ["'from'", "'fast'", "'initial_lr' is 'from'"]),
    ({"type": "constant", "learning_rate": "high"}, ["expected a number, got 'high'"]),
    ([{"start": 0, "value": 1.0, "schedule": 2.0}], ["stage 0", "'value'", "'schedule'"]),
    ([{"start": 0, "valeu": 1.0}], ["stage 0", "'valeu'", "value"]),
])
def test_levanter_spelling_errors_name_the_key(config, words):
    with pytest.raises(ScheduleError) as info:
        build_schedule(config, CTX)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_bare_inv_with_min_lr_zero_is_refused_naming_the_flag(tmp_path):
    args, path = config_args(tmp_path, "lr_schedule: {type: inv}\n", "inv.yaml")
    with pytest.raises(ArgumentError) as info:
        validate_args(args, 1, require_data=False)   # --min-lr defaults to 0
    assert path in str(info.value) and "'min_lr' 0.0 must be > 0" in str(info.value)
    assert "--min-lr" in str(info.value)


def test_numbers_written_as_strings():
    """PyYAML reads `1e-4` (no dot) as a string: a string that spells a finite number is a
    number wherever a schedule reads one; other strings are refused as before."""
    as_float = build_schedule({"type": "cosine", "from": 3e-4, "to": 3e-5, "warmup": 10}, CTX)
    as_text = build_schedule({"type": "cosine", "from": "3e-4", "to": "3e-5", "warmup": "10"}, CTX)
    p = np.arange(1001)
    np.testing.assert_array_equal(as_text(p), as_float(p))
    pts = build_schedule({"type": "step", "points": {"0": "1e-4", "100": "2e-5"}}, CTX)
    assert list(pts([0, 99, 100])) == [1e-4, 1e-4, 2e-5]
    assert build_schedule("1e-4")(5) == 1e-4
    staged = build_schedule([{"start": "0", "schedule": "1e-4"}, {"start": "1e2", "schedule": 0.5}], CTX)
    assert list(staged([99, 100])) == [1e-4, 0.5]
    for bad, words in (("3e-4x", ["'from'", "expected a number, got '3e-4x'"]),
                       ("inf", ["'from'", "'inf' is not a finite number"]),
                       ("nan", ["'from'", "'nan' is not a finite number"])):
        with pytest.raises(ScheduleError) as info:
            build_schedule({"type": "cosine", "from": bad}, CTX)
        for word in words:
            assert word in str(info.value)
    with pytest.raises(ScheduleError, match="value at point 5.*expected a number, got 'x'"):
        build_schedule({"type": "step", "points": {0: 1.0, 5: "x"}})
    with pytest.raises(ScheduleError, match="a schedule is a number"):
        build_schedule("cosine")


def test_levanter_yaml_strings_through_the_flags(tmp_path):
    args, _ = config_args(tmp_path, "lr_schedule:\n  - {start: 0, value: {type: constant, "
                                    "learning_rate: 1e-4}}\n  - {start: 500, value: 5e-5}\n")
    validate_args(args, 1, require_data=False)
    from megatron.optim.learning_rates import build_schedules, schedule_context, scheduler_params
    config = args.run_config.schedule
    lr, _ = build_schedules(scheduler_params(config), schedule_context(config))
    assert list(lr([0, 499, 500, 999])) == [1e-4, 1e-4, 5e-5, 5e-5]


def test_bare_inv_resume_with_another_lr_is_refused(tmp_path):
    """A bare `inv` runs with --lr/--min-lr, so they are part of the stored schedule: a resume
    with another --min-lr names the key, the checkpoint's value and the new one."""
    from megatron.optim.learning_rates import build_opt_param_scheduler

    class _Opt:
        param_groups = []

    path = tmp_path / "inv.yaml"
    path.write_text("lr_schedule: [{start: 0, value: 1e-3}, {start: 100, value: {type: inv}}]\n")

    def scheduler(min_lr):
        flags = BASE + ["--min-lr", min_lr, "--lr-schedule-config", str(path)]
        args = validate_args(get_parser().parse_args(flags), 1, require_data=False)
        return build_opt_param_scheduler(args.run_config.schedule, _Opt())

    old = scheduler("1e-5")
    for _ in range(3):
        old.step(4)
    with pytest.raises(ValueError) as info:
        scheduler("2e-5").load_state_dict(old.state_dict())
    assert ("--lr-schedule-config lr_schedule[1].value.min_lr: checkpoint 1e-05, now 2e-05"
            in str(info.value))
    same = scheduler("1e-5")
    same.load_state_dict(old.state_dict())
    assert same.num_iters == 3
