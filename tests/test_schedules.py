"""The schedule language: registry, built-in kinds, staged schedules, units, config errors."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from megatron.arguments import ArgumentError, get_parser, validate_args
from megatron.schedules.registry import (REQUIRED, Schedule, ScheduleContext, ScheduleError,
                                         build_schedule, known_kinds, register_schedule)
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
                for m, n in zip(samples, tokens)]
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
    from megatron.learning_rates import build_opt_param_scheduler
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
    s = build_opt_param_scheduler(args, opt)
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
