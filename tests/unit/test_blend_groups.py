"""Blend files at production scale (issue 43): unknown keys at every level, all missing prefixes
in one error, non-finite/negative/all-zero weights at parse time, and group entries (``paths:`` /
``glob:``) expanded into one constituent per prefix weighted by its share of the group's tokens."""
import json
import math

import numpy as np
import pytest

from helpers.curriculum import write_corpus
from megatron.data.blend_config import BlendConfigError, parse_blend_config, range_tokens, scaled_weight

SEQ = 16

LENGTHS = {"a": [40, 70, 30, 90, 50, 20], "b": [200, 10, 60, 80], "c": [35] * 9}


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    d = tmp_path_factory.mktemp("groups")
    return {n: write_corpus(str(d / f"web_{n}_text_document"), lengths, seed=k)
            for k, (n, lengths) in enumerate(LENGTHS.items())}


def _parse(obj, **kw):
    return parse_blend_config(obj, "t.yaml", **kw)


def _bad(obj, *needles, **kw):
    with pytest.raises(BlendConfigError) as info:
        _parse(obj, **kw)
    msg = str(info.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def _tokens(name, split=(0.0, 1.0)):
    """Formula: the tokens of the documents megatron-core's rounding puts in ``split``."""
    n = len(LENGTHS[name])
    return sum(LENGTHS[name][int(round(split[0] * n)):int(round(split[1] * n))])


# -------------------------------------------------------------------------------- bad input
def test_unknown_key_beside_a_splits_blend(shards):
    _bad({"train": {"blend": [{"path": shards["a"], "weight": 1}], "foo": 1}},
         "t.yaml: train", "unknown key 'foo'", "1", "allowed keys: blend, epochized_blend, sequential")
    _bad({"valid": [{"name": "v", "blend": [{"path": shards["a"], "weight": 1}], "foo": 2}]},
         "valid[0]", "'foo'", "allowed keys: name, blend")
    _bad({"valid": [{"name": "v", "path": shards["a"], "foo": 2}]}, "valid[0]", "'foo'",
         "allowed keys: name, path, paths, glob, split, weight")
    _bad({"train": {"sequential": [{"blend": [{"path": shards["a"], "weight": 1}], "bar": 3}]}},
         "sequential[0]", "'bar'")
    _bad({"train": {"blend": [{"path": shards["a"], "weight": {"type": "staged", "stages": [
        {"start": 0, "schedule": {"type": "constant", "value": 1, "bogus": 1}}]}}]}},
         "stages[0].schedule", "'bogus'")
    _bad({"train": {"blend": [{"path": shards["a"], "weight": {"type": "staged", "stages": [
        {"start": 0, "schedule": 1, "extra": 1}]}}]}}, "stages[0]", "'extra'")


def test_missing_prefixes_all_in_one_error(tmp_path, shards):
    entries = [{"path": shards["a"], "weight": 1}]
    entries += [{"path": str(tmp_path / f"shard_{k:04d}_text_document"), "weight": 1} for k in range(1024)]
    msg = _bad({"train": {"blend": entries}}, "1024 dataset prefixes are missing or unreadable",
               "train.blend[1].path", "shard_0000_text_document.bin", "shard_0004", "... and 1019 more")
    assert "shard_0005" not in msg
    # one missing: the message as before (where, file)
    _bad({"train": {"blend": entries[:2]}}, "t.yaml: train.blend[1].path: dataset file",
         "shard_0000_text_document.bin' does not exist")
    # across splits and groups too, and before any other check of the entries that follow
    msg = _bad({"train": {"blend": entries[:3]}, "valid": [{"name": "v", "paths": [
        shards["b"], str(tmp_path / "gone_text_document")]}]}, "3 dataset prefixes",
        "valid[0][0].paths[1]", "gone_text_document")


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -1.0, "nan", "-inf"])
def test_non_finite_or_negative_static_weights(shards, weight):
    _bad({"train": {"blend": [{"path": shards["a"], "weight": weight}]}}, "train.blend[0].weight",
         repr(weight) if isinstance(weight, str) else "")


@pytest.mark.parametrize("schedule,where", [
    ({"type": "constant", "value": float("nan")}, "weight.value"),
    ({"type": "linear", "from": float("inf"), "to": 0}, "weight.from"),
    ({"type": "cosine", "from": 1, "to": -0.5}, "weight.to"),
    ({"type": "linear", "points": {0: 1, 10: float("nan")}}, "weight.points[10]"),
    ({"type": "step", "points": {0: 1, 10: float("inf")}}, "weight.points[10]"),
    ({"type": "staged", "stages": [{"start": 0, "schedule": {"type": "constant", "value": 1}},
                                   {"start": 5, "schedule": -2}]}, "weight.stages[1].schedule"),
    ({"type": "staged", "stages": [{"start": 0, "schedule": {"type": "constant",
                                                             "value": float("nan")}}]},
     "weight.stages[0].schedule.value"),
])
def test_non_finite_or_negative_schedule_values(shards, schedule, where):
    _bad({"train": {"blend": [{"path": shards["a"], "weight": schedule}]}}, "train.blend[0]." + where)


def test_stage_of_zero_weights_refused_at_parse(shards):
    _bad({"train": {"sequential": [
        {"blend": [{"path": shards["a"], "weight": 1}], "until": {"samples": 10}},
        {"blend": [{"path": shards["a"], "weight": 0}, {"path": shards["b"], "weight": 0.0}]}]}},
        "train.sequential[1].blend", "all weights are zero")
    _bad({"train": {"epochized_blend": [{"path": shards["a"], "weight": 0, "repetitions": 1}]}},
         "train.epochized_blend", "all weights are zero")
    _bad({"train": {"blend": [{"paths": [shards["a"], shards["b"]], "weight": 0}]}},
         "train.blend", "all weights are zero")
    # a zero next to a default (epochized) or a schedule is not detectable from the file: accepted
    _parse({"train": {"epochized_blend": [{"path": shards["a"], "weight": 0, "repetitions": 1},
                                          {"path": shards["b"], "repetitions": 1}]}})
    _parse({"train": {"blend": [{"path": shards["a"], "weight": 0}, {"path": shards["b"], "weight": {
        "type": "linear", "points": {0: 1, 10: 0}}}]}})


# -------------------------------------------------------------------------------- groups
def test_range_tokens_is_the_formula(shards):
    for name in LENGTHS:
        for split in [(0.0, 1.0), (0.0, 0.5), (0.5, 1.0), (0.2, 0.7)]:
            assert range_tokens(shards[name], split) == _tokens(name, split), (name, split)


@pytest.mark.parametrize("split", [None, "0:0.5", "0.5:1"])
def test_group_weights_are_group_weight_times_token_fraction(shards, split):
    item = {"paths": [shards["a"], shards["b"], shards["c"]], "weight": 3}
    if split:
        item["split"] = split
    entries = _parse({"train": {"blend": [item, {"path": shards["a"], "weight": 1,
                                                 "split": "0.99:1"}]}}).train.stages[0].entries
    rng = tuple(float(x) for x in split.split(":")) if split else (0.0, 1.0)
    total = sum(_tokens(n, rng) for n in LENGTHS)
    assert [e.path for e in entries[:3]] == [shards[n] for n in LENGTHS]
    for e, n in zip(entries[:3], LENGTHS, strict=True):
        assert e.weight == pytest.approx(3 * _tokens(n, rng) / total, rel=1e-15)
        assert e.split == rng and e.where == f"t.yaml: train.blend[0].paths[{list(LENGTHS).index(n)}]"
    assert sum(e.weight for e in entries[:3]) == pytest.approx(3)


def test_glob_and_list_give_the_same_constituents(shards, tmp_path):
    import os

    from megatron.data.curriculum.constituents import resolve_constituents

    d = os.path.dirname(shards["a"])
    listed = _parse({"train": {"blend": [{"paths": [shards[n] for n in LENGTHS], "weight": 2}]}}).train
    globbed = _parse({"train": {"blend": [{"glob": f"{d}/web_*_text_document", "weight": 2}]}}).train
    strip = [(e.path, e.weight, e.split) for e in globbed.stages[0].entries]
    assert strip == [(e.path, e.weight, e.split) for e in listed.stages[0].entries]
    assert resolve_constituents(listed, SEQ) == resolve_constituents(globbed, SEQ)
    # each prefix is its own constituent, with its own name (provenance, the ledger)
    assert [c.name for c in resolve_constituents(globbed, SEQ)] == ["web_a", "web_b", "web_c"]
    # a relative glob resolves against the blend file's directory too
    rel = parse_blend_config({"train": {"blend": [{"glob": "web_*_text_document", "weight": 2}]}},
                             "t.yaml", base_dir=d).train
    assert [e.path for e in rel.stages[0].entries] == [shards[n] for n in LENGTHS]


def test_group_errors(shards, tmp_path):
    _bad({"train": {"blend": [{"glob": str(tmp_path / "nothing_*_document"), "weight": 1}]}},
         "train.blend[0].glob", "matches no dataset", "nothing_*_document")
    _bad({"train": {"blend": [{"path": shards["a"], "paths": [shards["b"]], "weight": 1}]}},
         "exactly one of path, paths, glob")
    _bad({"train": {"blend": [{"paths": [], "weight": 1}]}}, "train.blend[0].paths", "non-empty")
    _bad({"train": {"blend": [{"paths": [shards["a"], shards["a"]], "weight": 1}]}},
         "paths[1]", "twice")
    _bad({"train": {"blend": [{"paths": [shards["a"]], "weight": 1},
                              {"path": shards["a"], "weight": 1}]}}, "blend[1]", "twice")


def test_schedule_weight_of_a_group_is_scaled(shards):
    from megatron.data.curriculum.weights import WeightContext, weight_schedule
    from megatron.schedules.units import BatchSchedule

    schedule = {"type": "linear", "unit": "iterations", "points": {0: 4, 50: 1, 100: 0}}
    entries = _parse({"train": {"blend": [{"paths": [shards["a"], shards["b"]], "weight": schedule},
                                          {"path": shards["c"], "weight": 1}]}}).train.stages[0].entries
    ctx = WeightContext(BatchSchedule(4, None, SEQ), 400)
    total = _tokens("a") + _tokens("b")
    p = np.linspace(0, 120, 25)
    group = weight_schedule(entries[0].weight["schedule"], ctx)
    for e, n in zip(entries[:2], ("a", "b"), strict=True):
        sched = weight_schedule(e.weight, ctx)
        assert sched.unit == "iterations"
        np.testing.assert_allclose(sched(p), group(p) * _tokens(n) / total, rtol=1e-15)
    assert scaled_weight(scaled_weight(schedule, 0.5), 0.5)["scale"] == 0.25
    assert scaled_weight(None, 0.5) is None and scaled_weight(2, 0.25) == 0.5


def _index(blend, num_samples):
    from megatron.data.curriculum.constituents import resolve_constituents
    from megatron.data.curriculum.index import CurriculumIndex
    from megatron.schedules.units import BatchSchedule

    return CurriculumIndex(blend, resolve_constituents(blend, SEQ), num_samples,
                           BatchSchedule(4, None, SEQ), seed=1234, cache_dir=None)


@pytest.mark.parametrize("weight", [3, {"type": "linear", "unit": "samples",
                                        "points": {0: 1, 60: 5, 120: 0.5}}])
def test_group_index_equals_the_explicit_per_prefix_blend(shards, weight):
    other = {"path": shards["a"], "weight": 1, "split": "0.9:1"}
    group = _parse({"train": {"blend": [{"paths": [shards[n] for n in LENGTHS], "weight": weight,
                                         "split": "0:0.9"}, other]}}).train
    total = sum(_tokens(n, (0.0, 0.9)) for n in LENGTHS)
    explicit = _parse({"train": {"blend": [
        {"path": shards[n], "split": "0:0.9", "weight": 1}
        for n in LENGTHS] + [other]}}).train
    # the explicit blend with each prefix's weight written out: group weight x token fraction
    import dataclasses
    entries = tuple(dataclasses.replace(e, weight=scaled_weight(weight, _tokens(n, (0.0, 0.9)) / total))
                    for e, n in zip(explicit.stages[0].entries, LENGTHS, strict=False)) \
        + explicit.stages[0].entries[3:]
    explicit = dataclasses.replace(explicit, stages=(dataclasses.replace(explicit.stages[0],
                                                                         entries=entries),))
    a, b = _index(group, 160), _index(explicit, 160)
    np.testing.assert_array_equal(a.dataset_index, b.dataset_index)
    np.testing.assert_array_equal(a.dataset_sample_index, b.dataset_sample_index)
    assert len(set(a.dataset_index.tolist())) == 4


def test_group_in_an_epochized_blend_repeats_each_prefix(shards):
    from megatron.data.curriculum.constituents import resolve_constituents

    blend = _parse({"train": {"sequential": [{"epochized_blend": [
        {"paths": [shards["a"], shards["b"]], "repetitions": 2}, {"path": shards["c"], "repetitions": 1}]},
        {"blend": [{"path": shards["c"], "weight": 1}]}]}}).train
    entries = blend.stages[0].entries
    assert [e.repetitions for e in entries] == [2, 2, 1] and entries[0].weight is None
    cons = resolve_constituents(blend, SEQ)
    n = sum(2 * c.samples_per_epoch for c in cons[:2]) + cons[2].samples_per_epoch
    index = _index(blend, n + 8)
    counts = np.bincount(index.dataset_index[:n], minlength=3)
    assert counts.tolist() == [2 * cons[0].samples_per_epoch, 2 * cons[1].samples_per_epoch,
                               cons[2].samples_per_epoch]


def test_group_weights_survive_the_ledger(shards):
    from megatron.data.mix_ledger import blend_from_json, blend_to_json

    blend = _parse({"train": {"blend": [{"paths": [shards["a"], shards["b"]], "weight": {
        "type": "step", "points": {0: 1, 10: 2}}}]}}).train
    back = blend_from_json(json.loads(json.dumps(blend_to_json(blend))))
    assert [e.weight for e in back.stages[0].entries] == [e.weight for e in blend.stages[0].entries]
    assert all(math.isclose(e.weight["scale"], _tokens(n) / (_tokens("a") + _tokens("b")))
               for e, n in zip(blend.stages[0].entries, "ab", strict=True))


def test_group_member_weight_text_in_mix_edits(shards):
    from megatron.data.mix_resume import _weight_text

    blend = _parse({"train": {"blend": [{"paths": [shards["a"], shards["b"]], "weight": {
        "type": "step", "unit": "samples", "points": {0: 1, 10: 2}}}]}}).train
    share = _tokens("a") / (_tokens("a") + _tokens("b"))
    assert _weight_text(blend.stages[0].entries[0].weight) == f"{share:g} x step {{0: 1, 10: 2}} (samples)"
