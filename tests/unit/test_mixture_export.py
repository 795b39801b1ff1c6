"""An adaptive run's mixture exported as a blend file (issue 46 item 4;
megatron/data/mixture_export.py, tools/export_mixture.py): a static run from the exported file
draws at every global sample the (dataset, sample) the adaptive run drew, for each policy (the
greedy order; the blocked order interleaves a block by its length: refused); what a stage cannot express is refused in one line. The launched version (a
checkpoint, the tool and tools/data_provenance.py): tests/e2e/test_adaptive_mixer_e2e.py."""
import dataclasses

import pytest
import yaml

from helpers.curriculum import fake_constituents
from helpers.mixer_run import BS, ITERS, POLICIES, SEQ, SOURCES, SPE, N, _Source
from helpers.mixer_run import train as _train
from megatron.data.blend_config import parse_blend_config
from megatron.data.mix_ledger import MixRecord
from megatron.data.mix_resume import MixSources, continue_training_mix
from megatron.data.mixture_export import exported_blend_file, mixer_updates, split_blend_to_file
from megatron.errors import ConfigError
from megatron.train.mixer import LoopMixer

BLEND = {"blend": [{"path": "web", "weight": 1}, {"path": "code", "weight": 1},
                   {"path": "math", "weight": 2, "loss_weight": 0.5}]}
VALID = [{"name": "web", "path": "web", "split": "0.9:1"},
         {"name": "mix", "blend": [{"path": "web", "weight": 1}, {"path": "code", "weight": 3}]}]


def _config(policy):
    train = dict(BLEND, mixer={"policy": policy, "interval": 2, "floor": 0.05, "max_epochs": 1,
                               **POLICIES[policy]})
    return parse_blend_config({"train": train, "valid": VALID}, "t.yaml", check_files=False)


def _draws(mix):
    return [mix.dataset.locate(s) for s in range(N)]


def _sources(order):
    return dataclasses.replace(SOURCES, order=order)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_static_run_from_the_export_draws_what_the_adaptive_run_drew(policy):
    config, order = _config(policy), "greedy"
    sources = _sources(order)
    mix = continue_training_mix(sources, config.train, N, BS, 5, None)
    drawn = [x for batch in _train(mix, LoopMixer(mix, config.train.mixer, 0, 0), 1, ITERS)
             for x in batch]
    record = MixRecord.from_json(mix.record(ITERS, N).to_json())
    assert len(record.phases) == 6  # the blend's weights, then 5 updates

    blend, notes = exported_blend_file(record, config)
    text = yaml.safe_dump(blend, sort_keys=False)
    again = parse_blend_config(yaml.safe_load(text), "exported.yaml", check_files=False)
    assert again.train.mixer is None and again.train.sequential
    assert [s.until for s in again.train.stages] == [("samples", p.begin) for p in record.phases[1:]] + [None]
    for stage, phase in zip(again.train.stages, record.phases, strict=True):  # the recorded weights, exactly
        assert [e.weight for e in stage.entries] == [
            e["weight"] for e in phase.blend["stages"][0]["entries"]]
        assert [e.loss_weight for e in stage.entries] == [1.0, 1.0, 0.5]
    assert [g.name for g in again.valid] == ["web", "mix"]
    assert [split_blend_to_file(g) for g in again.valid] == [split_blend_to_file(g) for g in config.valid]
    assert f"--seed 5, --data-index-order {order}" in notes[1]

    static = continue_training_mix(sources, again.train, N, BS, 5, None)
    assert _draws(static) == drawn  # every global sample: the same dataset and sample
    # and the static run's own record names no mixer
    assert all(p.mixer is None for p in static.record(ITERS, N).phases)


def test_the_mixer_updates_name_each_datasets_weight_and_loss():
    config = _config("loss_softmax")
    mix = continue_training_mix(SOURCES, config.train, N, BS, 5, None)
    _train(mix, LoopMixer(mix, config.train.mixer, 0, 0), 1, ITERS)
    updates = mixer_updates(mix.phases)
    assert [u["iteration"] for u in updates] == [2, 4, 6, 8, 10]
    for u, phase in zip(updates, mix.phases[1:], strict=True):
        assert list(u["weights"]) == ["web", "code", "math"] and u["policy"] == "loss_softmax"
        assert list(u["weights"].values()) == phase.mixer["weights"]
        assert list(u["losses"].values()) == phase.mixer["losses"]
        assert u["begin"] == phase.begin


def test_what_one_static_run_cannot_draw_is_refused_in_one_line():
    config = _config("odm")
    mix = continue_training_mix(SOURCES, config.train, N, BS, 5, None)
    _train(mix, LoopMixer(mix, config.train.mixer, 0, 0), 1, 4)
    record = MixRecord.from_json(mix.record(4, BS.samples_at_iteration(4)).to_json())
    record.phases[1].seed = 6
    with pytest.raises(ConfigError, match=r"^phase 1 \(from iteration 2\) was planned with seed 6, "
                                          r"phase 0 with 5: one static run cannot draw both$"):
        exported_blend_file(record)
    record.phases[1].seed = 5
    record.phases[1].blend["stages"][0]["entries"][0]["replay"] = True
    with pytest.raises(ConfigError, match=r"^phase 1 \(from iteration 2\) replays .*web \(replay: "
                                          r"true\), the tokens its run drew before"):
        exported_blend_file(record)
    epochized = parse_blend_config({"train": {"epochized_blend": [
        {"path": "web", "repetitions": 1}]}}, "e.yaml", check_files=False).train
    sources = MixSources("blend_config", lambda b: fake_constituents(b, SPE, SEQ),
                         lambda c, n, seed: _Source(range(n)))
    other = continue_training_mix(sources, epochized, SPE, BS, 5, None)
    with pytest.raises(ConfigError, match=r"^phase 0 \(from iteration 0\) draws a epochized_blend mix"):
        exported_blend_file(other.record(0, 0))
    blocked = continue_training_mix(_sources("blocked"), config.train, N, BS, 5, None)
    _train(blocked, LoopMixer(blocked, config.train.mixer, 0, 0), 1, 4)
    with pytest.raises(ConfigError, match=r"^the run's mix was drawn in the blocked order "
                                          r"\(--data-index-order\), whose blocks run"):
        exported_blend_file(blocked.record(4, BS.samples_at_iteration(4)))
    # a static blend drawn blocked (one phase) exports: nothing cuts it
    one_phase = blocked.record(4, 16).to_json()
    one_phase["phases"] = one_phase["phases"][:1]
    blend, _ = exported_blend_file(MixRecord.from_json(one_phase))
    assert [list(s) for s in blend["train"]["sequential"]] == [["blend"]]
    t0 = dataclasses.replace(record, kind="t0")
    with pytest.raises(ConfigError, match="T0 mix"):
        exported_blend_file(t0)
