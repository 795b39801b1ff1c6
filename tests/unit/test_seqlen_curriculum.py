"""The sequence-length curriculum's schedule (megatron/schedules/seqlen.py) against its peer,
DeepSpeed's ``CurriculumScheduler``, asked as Microsoft Megatron-DeepSpeed's loop asks it: before
every iteration, with the completed optimizer steps + 1."""
import json

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


def test_an_enabled_legacy_section_is_one_error_naming_the_curriculum(tmp_path):
    """Microsoft's scripts put the section in their DeepSpeed JSON; DeepSpeed 0.19.8 refuses it
    with a traceback and the curriculum does not train here yet: one line naming the file, the
    section and its curriculum, before anything starts."""
    from helpers.flags import parse

    path = _ds_json(tmp_path, MICROSOFT_SECTION)
    with pytest.raises(ConfigError) as info:
        parse(["--deepspeed_config", path])
    assert str(info.value) == (
        f"--deepspeed_config {path}: curriculum_learning (fixed_linear, 8 to 32 tokens over 6 "
        "iterations): the sequence-length curriculum does not train here yet; remove the section "
        "(or set \"enabled\": false) to train at --seq-length")
    bad = dict(MICROSOFT_SECTION, schedule_type="fixed_root")
    with pytest.raises(ConfigError, match=r"curriculum_learning\.schedule_config: missing 'root_degree'"):
        parse(["--deepspeed_config", _ds_json(tmp_path, bad)])


def test_a_disabled_legacy_section_is_left_out_of_deepspeeds_config(tmp_path):
    """"enabled": false: the run trains at --seq-length, DeepSpeed gets no section (it would
    refuse it), and a start-up note says so."""
    from helpers.flags import parse
    from megatron.config.deepspeed_config import deepspeed_config_from_args

    path = _ds_json(tmp_path, dict(MICROSOFT_SECTION, enabled=False))
    args = parse(["--deepspeed_config", path])
    assert "curriculum_learning" not in deepspeed_config_from_args(args, args.global_batch_size)
    assert any(n.startswith(f"--deepspeed_config {path}: its curriculum_learning section is "
                            "disabled") for n in args.run_config.notes)
