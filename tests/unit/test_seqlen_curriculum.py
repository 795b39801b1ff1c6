"""The sequence-length curriculum's schedule (megatron/schedules/seqlen.py) against its peer,
DeepSpeed's ``CurriculumScheduler``, asked as Microsoft Megatron-DeepSpeed's loop asks it: before
every iteration, with the completed optimizer steps + 1."""
import json

import numpy as np
import pytest
from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler
from hypothesis import given, settings
from hypothesis import strategies as st

from megatron.errors import ConfigError
from megatron.schedules.seqlen import seqlen_curriculum_from_deepspeed


def deepspeed_lengths(section, iterations):
    """What Microsoft's loop trains at iterations 1..N: update_difficulty(iteration + 1) with
    the iterations done before it."""
    scheduler = CurriculumScheduler(section)
    return [scheduler.update_difficulty(done + 1) for done in range(iterations)]


@settings(max_examples=80, deadline=None)
@given(low=st.integers(1, 64), span=st.integers(0, 2048), total=st.integers(1, 400),
       step=st.sampled_from([1, 2, 8, 16, 64]), root=st.sampled_from([None, 1, 2, 3, 1.5]),
       iterations=st.integers(1, 500))
def test_fixed_linear_and_root_equal_deepspeeds_scheduler(low, span, total, step, root, iterations):
    """fixed_linear (root None) and fixed_root: every iteration's length equals DeepSpeed's,
    rounding to difficulty_step and the floor at min_difficulty included."""
    section = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": low,
               "max_difficulty": low + span,
               "schedule_type": "fixed_linear" if root is None else "fixed_root",
               "schedule_config": {"total_curriculum_step": total, "difficulty_step": step,
                                   **({} if root is None else {"root_degree": root})}}
    ours = seqlen_curriculum_from_deepspeed(section).lengths_for_iterations(iterations)
    assert ours.tolist() == deepspeed_lengths(section, iterations)


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(1, 4096), min_size=2, max_size=6),
       gaps=st.lists(st.integers(1, 50), min_size=5, max_size=5), iterations=st.integers(1, 300))
def test_fixed_discrete_equals_deepspeeds_scheduler(lengths, gaps, iterations):
    """fixed_discrete, any list of lengths (not only increasing: DeepSpeed stops changing the
    length once it has reached max_difficulty) and max steps."""
    max_steps = [sum(gaps[:i + 1]) for i in range(len(lengths) - 1)]
    section = {"curriculum_type": "seqlen", "min_difficulty": min(lengths),
               "max_difficulty": max(lengths), "schedule_type": "fixed_discrete",
               "schedule_config": {"difficulty": lengths, "max_step": max_steps}}
    ours = seqlen_curriculum_from_deepspeed(section).lengths_for_iterations(iterations)
    assert ours.tolist() == deepspeed_lengths(section, iterations)


def test_microsofts_example_warmup():
    """examples_deepspeed/curriculum_learning's GPT setting: from 80 to 2048 tokens in multiples
    of 8 over 36 iterations (scaled down), the first and last iterations by hand."""
    section = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 80,
               "max_difficulty": 2048, "schedule_type": "fixed_linear",
               "schedule_config": {"total_curriculum_step": 36, "difficulty_step": 8}}
    lengths = seqlen_curriculum_from_deepspeed(section).lengths_for_iterations(40)
    # step 1: floor(1/36 * 1968 + 80) = 134 -> 128 (a multiple of 8)
    assert lengths[0] == 128 and lengths[35] == 2048 and lengths[-1] == 2048
    assert all(b >= a for a, b in zip(lengths, lengths[1:], strict=False))
    assert all(k % 8 == 0 for k in lengths)


@pytest.mark.parametrize("section, message", [
    ({"curriculum_type": "vocabularyrarity", "min_difficulty": 1, "max_difficulty": 2},
     "curriculum_type 'vocabularyrarity': only 'seqlen'"),
    ({"min_difficulty": 64, "schedule_type": "fixed_linear"}, "missing 'max_difficulty'"),
    ({"min_difficulty": 64, "max_difficulty": 8, "schedule_type": "fixed_linear"},
     "min_difficulty 64 is above max_difficulty 8"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_cosine",
      "schedule_config": {}}, "schedule_type 'fixed_cosine'; allowed: fixed_linear, fixed_root"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_linear",
      "schedule_config": {"total_curriculum_step": 0, "difficulty_step": 8}},
     "'total_curriculum_step' is 0; expected a positive integer"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_root",
      "schedule_config": {"total_curriculum_step": 10, "difficulty_step": 8}},
     "curriculum_learning.schedule_config: missing 'root_degree'"),
    ({"min_difficulty": 8, "max_difficulty": 64, "schedule_type": "fixed_discrete",
      "schedule_config": {"difficulty": [8, 64], "max_step": [5, 9]}},
     "'difficulty' has 2 entries and 'max_step' 2"),
])
def test_bad_sections_name_the_key_and_the_value(section, message):
    with pytest.raises(ConfigError) as info:
        seqlen_curriculum_from_deepspeed(section)
    assert message in str(info.value)


MICROSOFT_SECTION = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                     "max_difficulty": 32, "schedule_type": "fixed_linear",
                     "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}


def _ds_json(tmp_path, section):
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "curriculum_learning": section}))
    return str(path)


# ------------------------------------------------------------------ what trains: the plan
def _plan_of(section, iterations, full_length=None, gbs=4):
    from megatron.schedules.seqlen import seq_length_plan, seq_length_spec_from_deepspeed
    from megatron.schedules.units import BatchSchedule

    spec = seq_length_spec_from_deepspeed(section, "curriculum_learning")
    full = full_length or section["max_difficulty"]
    return seq_length_plan(spec, BatchSchedule(gbs, seq_length=full), iterations, full)


@settings(max_examples=40, deadline=None)
@given(low=st.integers(1, 64), span=st.integers(0, 512), total=st.integers(1, 300),
       step=st.sampled_from([1, 2, 8, 16]), root=st.sampled_from([None, 1, 2, 1.5]),
       iterations=st.integers(1, 400))
def test_the_plan_of_the_registry_kinds_equals_deepspeeds_scheduler(low, span, total, step, root,
                                                                     iterations):
    """What the loop trains: the DeepSpeed section translated into the registry's kinds
    (fixed_linear / fixed_root) and planned per iteration equals DeepSpeed's scheduler."""
    section = {"curriculum_type": "seqlen", "min_difficulty": low, "max_difficulty": low + span,
               "schedule_type": "fixed_linear" if root is None else "fixed_root",
               "schedule_config": {"total_curriculum_step": total, "difficulty_step": step,
                                   **({} if root is None else {"root_degree": root})}}
    assert _plan_of(section, iterations).lengths.tolist() == deepspeed_lengths(section, iterations)


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(1, 512), min_size=2, max_size=5),
       gaps=st.lists(st.integers(1, 30), min_size=4, max_size=4), iterations=st.integers(1, 200))
def test_the_plan_of_fixed_discrete_equals_deepspeeds_scheduler(lengths, gaps, iterations):
    max_steps = [sum(gaps[:i + 1]) for i in range(len(lengths) - 1)]
    section = {"curriculum_type": "seqlen", "min_difficulty": min(lengths),
               "max_difficulty": max(lengths), "schedule_type": "fixed_discrete",
               "schedule_config": {"difficulty": lengths, "max_step": max_steps}}
    assert _plan_of(section, iterations).lengths.tolist() == deepspeed_lengths(section, iterations)


MICROSOFT_SECTION = {"enabled": True, "curriculum_type": "seqlen", "min_difficulty": 8,
                     "max_difficulty": 32, "schedule_type": "fixed_linear",
                     "schedule_config": {"total_curriculum_step": 6, "difficulty_step": 8}}


def _ds_json(tmp_path, section=None, name="ds.json", **top):
    path = tmp_path / name
    config = {"train_micro_batch_size_per_gpu": 2, **top}
    if section is not None:
        config["curriculum_learning"] = section
    path.write_text(json.dumps(config))
    return str(path)


def test_the_legacy_section_trains_and_deepspeed_accepts_what_is_left(tmp_path):
    """Microsoft's legacy section: the lengths are DeepSpeed's scheduler's, the config handed to
    DeepSpeed has no section and DeepSpeed 0.19's own config class accepts it (the section itself
    it refuses), and one start-up line says what happened."""
    from deepspeed.runtime.config import DeepSpeedConfig

    from helpers.flags import parse
    from megatron.config.deepspeed_config import deepspeed_config

    path = _ds_json(tmp_path, MICROSOFT_SECTION)
    with pytest.raises(Exception, match="Legacy top-level 'curriculum_learning' has been removed"):
        DeepSpeedConfig(json.loads(open(path).read()) | {"train_batch_size": 2})
    args = parse(["--deepspeed_config", path, "--train-iters", "10"])
    assert args.seq_length_plan.lengths.tolist() == deepspeed_lengths(MICROSOFT_SECTION, 10)
    handed = deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    assert "curriculum_learning" not in handed
    DeepSpeedConfig(handed)  # accepted
    assert any(n.startswith(f"--deepspeed_config {path}: curriculum_learning (fixed_linear, 8 to 32 "
                            "tokens): trained here as the native schedule") for n in args.run_config.notes)
    bad = dict(MICROSOFT_SECTION, schedule_type="fixed_root")
    with pytest.raises(ConfigError, match=r"curriculum_learning\.schedule_config: missing 'root_degree'"):
        parse(["--deepspeed_config", _ds_json(tmp_path, bad, "bad.json")])


def test_a_disabled_legacy_section_is_left_out_of_deepspeeds_config(tmp_path):
    """"enabled": false: the run trains at --seq-length, DeepSpeed gets no section (it would
    refuse it), and a start-up note says so."""
    from helpers.flags import parse
    from megatron.config.deepspeed_config import deepspeed_config

    path = _ds_json(tmp_path, dict(MICROSOFT_SECTION, enabled=False))
    args = parse(["--deepspeed_config", path])
    assert args.seq_length_plan is None
    assert "curriculum_learning" not in deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    assert any(n.startswith(f"--deepspeed_config {path}: curriculum_learning is disabled")
               for n in args.run_config.notes)


def test_both_spellings_of_one_curriculum_give_the_same_run(tmp_path):
    """The legacy section and its native spelling (--seq-length-schedule, and the
    seq_length_schedule key of --lr-schedule-config's file): the same lengths, the same schedule
    parameters (what checkpoints record and compare) and the same LR at every iteration."""
    import yaml

    from helpers.flags import parse
    from megatron.optim.learning_rates import build_schedules, schedule_context, scheduler_params
    from megatron.schedules.units import batch_schedule

    legacy = parse(["--deepspeed_config", _ds_json(tmp_path, MICROSOFT_SECTION), "--train-iters", "12",
                    "--lr-warmup-tokens", "200", "--lr-decay-tokens", "2000"])
    native_spec = legacy.seq_length_plan.spec
    flag = parse(["--seq-length-schedule", json.dumps(native_spec), "--train-iters", "12",
                  "--lr-warmup-tokens", "200", "--lr-decay-tokens", "2000"])
    schedule_file = tmp_path / "schedules.yaml"
    schedule_file.write_text(yaml.safe_dump({"lr_schedule": {"type": "cosine", "from": 1e-3,
                                                             "warmup": 200, "unit": "tokens"},
                                             "seq_length_schedule": native_spec}))
    in_file = parse(["--lr-schedule-config", str(schedule_file), "--train-iters", "12"])
    runs = (legacy, flag, in_file)
    for args in runs:
        assert args.seq_length_plan.lengths.tolist() == deepspeed_lengths(MICROSOFT_SECTION, 12)
    assert scheduler_params(legacy.run_config.schedule) == scheduler_params(flag.run_config.schedule)
    lr = [build_schedules(scheduler_params(a.run_config.schedule),
                          schedule_context(a.run_config.schedule))[0] for a in runs]
    tokens = batch_schedule(legacy.run_config.batch).tokens_at_iterations(np.arange(13))
    assert np.array_equal(lr[0](tokens), lr[1](tokens))
    # the file's cosine in tokens spans the run's trained tokens
    assert lr[2](tokens[-1]) == pytest.approx(0.0, abs=1e-12)


def test_the_data_efficiency_form_trains_its_sequence_length_metric(tmp_path):
    """--data-efficiency-curriculum-learning: seqlen_truncate truncates, seqlen_reshape splits,
    the data_efficiency section leaves DeepSpeed's config; other metrics are refused naming
    them, as is the flag without a section."""
    from helpers.flags import parse
    from megatron.config.deepspeed_config import deepspeed_config

    def data_efficiency(metrics):
        return {"enabled": True, "seed": 1234, "data_sampling": {
            "enabled": True, "num_workers": 0, "curriculum_learning": {
                "enabled": True, "data_cluster_path": "/tmp/x", "curriculum_metrics": metrics}}}

    metric = {"index_to_sample_path": "dummy", "index_to_metric_path": "dummy",
              "difficulty_type": "value", "clustering_type": "single_cluster",
              "min_difficulty": 8, "max_difficulty": 32, "schedule_type": "fixed_root",
              "schedule_config": {"total_curriculum_step": 8, "difficulty_step": 8, "root_degree": 2}}
    section = {"curriculum_type": "seqlen", **metric}
    for name, mode in (("seqlen_truncate", "truncate"), ("seqlen_reshape", "split")):
        path = _ds_json(tmp_path, name=f"{name}.json",
                        data_efficiency=data_efficiency({name: metric}))
        args = parse(["--deepspeed_config", path, "--data-efficiency-curriculum-learning"])
        assert args.seq_length_plan.mode == mode
        want = deepspeed_lengths(section, 10)
        if mode == "split":  # the largest divisor of --seq-length 32 not above each length
            want = [max(d for d in (8, 16, 32) if d <= k) for k in want]
        assert args.seq_length_plan.lengths.tolist() == want
        assert "data_efficiency" not in deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    path = _ds_json(tmp_path, name="voc.json", data_efficiency=data_efficiency(
        {"vocabularyrarity": dict(metric, difficulty_type="percentile")}))
    with pytest.raises(ConfigError, match="metric 'vocabularyrarity' needs DeepSpeed's offline "
                                          "data-analysis index files"):
        parse(["--deepspeed_config", path, "--data-efficiency-curriculum-learning"])
    with pytest.raises(ConfigError, match="--data-efficiency-curriculum-learning needs "
                                          "--deepspeed_config"):
        parse(["--data-efficiency-curriculum-learning"])


@pytest.mark.parametrize("flags, message", [
    (["--tensor-model-parallel-size", "2", "--sequence-parallel",
      "--seq-length-schedule", "{type: linear, from: 9, span: 10}"],
     "iteration 1 trains 9 tokens per sample, not a multiple of 2 (--sequence-parallel splits each "
     "rank's sequence over --tensor-model-parallel-size 2); give the schedule multiple_of 2"),
    (["--ds-sequence-parallel-size", "2", "--seq-length-schedule", "{type: linear, from: 9, span: 10}"],
     "iteration 1 trains 9 tokens per sample, not a multiple of 2 (DeepSpeed-Ulysses splits each "
     "sequence over --ds-sequence-parallel-size 2)"),
    (["--seq-length-schedule", "{type: linear, from: 8, to: 64, span: 10}"],
     "--seq-length-schedule: the schedule gives 36 tokens per sample at iteration 6, above "
     "--seq-length 32"),
    (["--seq-length-schedule", "{type: linear, from: 8, span: 10, mode: squash}"],
     "--seq-length-schedule: mode 'squash'; allowed: truncate, split"),
    (["--seq-length-schedule", "{type: linear, from: 8, span: 10, mode: split, multiple_of: 6}"],
     "mode split with multiple_of 6: --seq-length 32 is not a multiple of it"),
    (["--seq-length-schedule", "{type: linear, from: 8, unit: tokens}"],
     "--seq-length-schedule: no span known in tokens"),
    (["--seq-length-schedule", "{type: linear, from: 8}", "--train-tokens", "1000"],
     "with --train-tokens the run's length depends on the curriculum; give the schedule an "
     "explicit 'span'"),
])
def test_a_curriculum_the_run_cannot_train_is_refused_naming_value_and_rule(flags, message):
    from helpers.flags import parse

    with pytest.raises(ConfigError) as info:
        parse(flags, world_size=2)
    assert message in str(info.value)


def test_two_spellings_at_once_are_refused(tmp_path):
    from helpers.flags import parse

    with pytest.raises(ConfigError, match="two sequence-length curricula: --seq-length-schedule and "
                                          "--deepspeed_config"):
        parse(["--seq-length-schedule", "{type: linear, from: 8, span: 4}",
               "--deepspeed_config", _ds_json(tmp_path, MICROSOFT_SECTION)])


def test_split_mode_rounds_down_to_divisors_of_the_full_length():
    from helpers.flags import parse

    args = parse(["--seq-length-schedule", "{type: linear, from: 8, to: 32, span: 8, mode: split}",
                  "--train-iters", "10"])
    # linear values 8, 11, 14, 17, 20, 23, 26, 29, 32, 32 -> divisors of 32 not above them
    assert args.seq_length_plan.lengths.tolist() == [8, 8, 8, 16, 16, 16, 16, 16, 32, 32]


# ------------------------------------------------------------------ tokens are trained tokens
@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 64), min_size=1, max_size=30),
       rampup=st.sampled_from([None, (2, 2, 40)]), probe=st.floats(0, 3000))
def test_tokens_are_global_batch_times_length_summed_over_iterations(lengths, rampup, probe):
    """Under a truncating plan the batch schedule's tokens after i iterations are sum(gbs_j x k_j),
    past the plan the last length holds, and samples <-> tokens invert each other."""
    from megatron.schedules.seqlen_plan import SeqLengthPlan
    from megatron.schedules.units import BatchSchedule

    plan = SeqLengthPlan(64, "truncate", np.asarray(lengths))
    bs = BatchSchedule(8, rampup, seq_length=64, seq_plan=plan)
    n = len(lengths) + 5
    batches = bs.batch_sizes_at_iterations(np.arange(n))
    ks = [lengths[min(i, len(lengths) - 1)] for i in range(n)]
    want = np.concatenate([[0], np.cumsum(batches * np.asarray(ks))])
    assert np.array_equal(bs.tokens_at_iterations(np.arange(n + 1)), want)
    assert bs.tokens(int(bs.samples_at_iteration(n))) == want[-1]
    assert float(bs.tokens_at_samples(bs.samples_at_tokens(probe))) == pytest.approx(probe, abs=1e-6)
    split = BatchSchedule(8, rampup, seq_length=64, seq_plan=SeqLengthPlan(64, "split", np.asarray(lengths)))
    assert np.array_equal(split.tokens_at_iterations(np.arange(n + 1)),
                          split.samples_at_iterations(np.arange(n + 1)) * 64)


def test_the_lr_in_tokens_follows_the_trained_tokens():
    """BigScience/Microsoft's --lr-warmup-tokens / --lr-decay-tokens under the curriculum: the LR
    of each step is the cosine schedule of the tokens trained before it, sum(gbs x k) (Microsoft's
    AnnealingLR on consumed_train_tokens), not of samples x --seq-length; the Power Scheduler's n
    is the same trained tokens; --train-tokens stops where they reach the budget."""
    import math

    from helpers.flags import parse
    from megatron.optim.learning_rates import build_opt_param_scheduler

    curriculum = ["--seq-length-schedule", "{type: linear, from: 8, span: 6, multiple_of: 8}",
                  "--global-batch-size", "4", "--train-iters", "12"]
    args = parse(curriculum + ["--lr", "1e-3", "--min-lr", "1e-4", "--lr-decay-style", "cosine",
                               "--lr-warmup-tokens", "300", "--lr-decay-tokens", "1200"])
    ks = args.seq_length_plan.lengths.tolist()
    assert ks == [8, 8, 16, 16, 24, 24, 32, 32, 32, 32, 32, 32]
    tokens = np.concatenate([[0], np.cumsum(4 * np.asarray(ks))])

    class Optimizer:
        param_groups = [{}]

    scheduler = build_opt_param_scheduler(args.run_config.schedule, Optimizer())
    for i in range(12):
        t = tokens[i]
        if t <= 300:
            want = 1e-3 * t / 300
        else:
            progress = min((t - 300) / (1200 - 300), 1.0)
            want = 1e-4 + 0.5 * (1e-3 - 1e-4) * (1 + math.cos(math.pi * progress))
        assert scheduler.get_lr() == pytest.approx(want, rel=1e-12, abs=1e-15), i
        scheduler.step(increment=4)
    power = parse(curriculum + ["--lr", "1e-2", "--lr-decay-style", "power", "--lr-warmup-iters", "0",
                                "--power-scheduler-a", "4.6", "--power-scheduler-b", "-0.51"])
    scheduler = build_opt_param_scheduler(power.run_config.schedule, Optimizer())
    for i in range(1, 12):
        scheduler.step(increment=4)
        n = tokens[i]
        assert scheduler.get_lr() == pytest.approx(min(1e-2, 4 * 4.6 * n ** -0.51), rel=1e-12), i
    budget = parse(curriculum + ["--lr", "1e-3", "--train-tokens", str(int(tokens[5]) + 1)])
    assert budget.train_iters == 6  # the 6th iteration reaches the budget
