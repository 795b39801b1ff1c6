"""The adaptive mixer in the loop (megatron/train/mixer.py, issue 46 items 1 and 3): each update
appends a phase of static weights at the first sample not yet drawn, recorded with its inputs
and the policy's state; a run resumed from its record inside an update interval draws the same
(dataset, sample) at every iteration and computes the same weights, bit for bit."""
import json
from types import SimpleNamespace

import pytest

from helpers.mixer_run import BS, ITERS, POLICIES, SPE, N, new_mix, stop_and_resume
from helpers.mixer_run import blend as mixer_blend
from helpers.mixer_run import train as _train
from megatron.data.blend_config import parse_blend_config
from megatron.data.mix_ledger import MixRecord
from megatron.data.mix_resume import DataResume
from megatron.errors import ConfigError
from megatron.train.context_stages import check_stages_data
from megatron.train.mixer import LoopMixer


def _blend(policy):
    return mixer_blend(policy, max_epochs=1)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_resume_inside_an_interval_reproduces_the_weights_and_the_samples(policy):
    blend = _blend(policy)
    mix = new_mix(blend)
    whole = _train(mix, LoopMixer(mix, blend.mixer, 0, 0), 1, ITERS)
    segments = [p.mixer for p in mix.phases[1:]]
    # none at the last iteration: nothing is left to draw
    assert [s["iteration"] for s in segments] == [2, 4, 6, 8, 10]
    assert [p.begin for p in mix.phases] == [0] + [BS.samples_at_iteration(i) for i in range(2, 11, 2)]
    weights = [tuple(s["weights"]) for s in segments]
    assert len(set(weights)) > 1
    assert all(min(s["weights"]) >= 0.05 - 1e-12 for s in segments if "fallback" not in s)

    # stopped at iteration 4 (an update), 5 (inside the interval 4..6) and 9, each time resumed
    # from the record
    third, draws, _ = stop_and_resume(blend, (4, 5, 9, ITERS))
    assert draws == whole
    assert [p.to_json() for p in third.phases] == [p.to_json() for p in mix.phases]
    assert third.record(ITERS, N).to_json() == mix.record(ITERS, N).to_json()

    # the cap (max_epochs 1 of 20 samples each): a dataset lowered to it says so
    fallbacks = [f for s in segments for f in s.get("fallback", ())]
    for f in fallbacks:
        assert f["capped"] < f["weight"] and f["reason"].startswith("max_epochs 1:")
    drawn = [sum(dd == d for batch in whole for dd, _ in batch) for d in range(3)]
    assert max(drawn) <= SPE + 2, drawn  # the index keeps each within 2 samples of its target

    # every sample of every dataset drawn once, in order, across all the phases
    for d in range(3):
        assert [k for batch in whole for dd, k in batch if dd == d] == list(
            range(sum(dd == d for batch in whole for dd, _ in batch)))


def test_the_segments_weights_are_what_the_phases_draw():
    blend = _blend("loss_softmax")
    mix = new_mix(blend)
    assert mix.mixer_weights() == {"web": 0.25, "code": 0.25, "math": 0.5}  # the training record's
    _train(mix, LoopMixer(mix, blend.mixer, 0, 0), 1, ITERS)
    assert list(mix.mixer_weights().values()) == pytest.approx(mix.phases[-1].mixer["weights"],
                                                               abs=1e-15)
    for phase in mix.phases[1:]:
        entries = [e["weight"] for s in phase.blend["stages"] for e in s["entries"]]
        assert entries == phase.mixer["weights"]
        assert phase.blend["mixer"]["policy"] == "loss_softmax"


def test_a_mixer_run_resumed_with_another_length_is_refused_in_one_line():
    blend = _blend("odm")
    mix = new_mix(blend)
    _train(mix, LoopMixer(mix, blend.mixer, 0, 0), 1, 5)
    record = MixRecord.from_json(json.loads(json.dumps(mix.record(5, 20).to_json())))
    with pytest.raises(ConfigError) as error:
        new_mix(blend, 2 * N, DataResume("ckpt", 5, record))
    assert "adaptive mixer's weights of iteration 4" in str(error.value)
    assert "\n" not in str(error.value)


def test_an_edited_mix_at_a_resume_restarts_the_mixer_from_the_new_file():
    blend = _blend("odm")
    mix = new_mix(blend)
    _train(mix, LoopMixer(mix, blend.mixer, 0, 0), 1, 5)
    record = MixRecord.from_json(json.loads(json.dumps(mix.record(5, 20).to_json())))
    edited = parse_blend_config({"train": {"blend": [
        {"path": "web", "weight": 1}, {"path": "code", "weight": 3}, {"path": "math", "weight": 2}],
        "mixer": {"policy": "odm", "interval": 2, "floor": 0.05}}}, "t.yaml",
        check_files=False).train
    with pytest.raises(ConfigError, match="code weight 1 -> 3"):  # against the file's phase
        new_mix(edited, N, DataResume("ckpt", 5, record))
    again = new_mix(edited, N, DataResume("ckpt", 5, record, override=True))
    assert [p.begin for p in again.phases] == [0, 8, 16, 20] and again.phases[-1].mixer is None
    assert again.mixer_progress is None
    mixer = LoopMixer(again, edited.mixer, 5, 20)
    assert mixer.state["start"] == [1 / 6, 3 / 6, 2 / 6] and mixer.state["updates"] == 0
    _train(again, mixer, 6, 8)
    assert [p.mixer["iteration"] for p in again.phases if p.mixer] == [2, 4, 6, 8]


def test_context_stages_with_a_mixer_are_refused_at_start_up_in_one_line():
    blend = _blend("odm")
    mix = new_mix(blend)
    stages = SimpleNamespace(where="lr.yaml: context_stages", stages=[object(), object()])
    with pytest.raises(ConfigError) as error:
        check_stages_data(stages, SimpleNamespace(mix=mix), 0)
    message = str(error.value)
    assert "context stages with an adaptive mixer (t.yaml: train.mixer)" in message
    assert "--override-data-mix" in message and "\n" not in message
