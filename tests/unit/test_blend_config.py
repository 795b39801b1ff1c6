"""megatron/data/blend_config.py: YAML/JSON blend files -> typed config, and clear errors."""
import json
import os

import numpy as np
import pytest
import yaml
from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

from helpers.paths import DATA
from megatron.data.blend_config import BlendConfigError, load_blend_config, parse_blend_config
from megatron.data.mix_ledger import blend_from_json


def _make(prefix, ndocs=20, seed=0):
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for k in range(ndocs):
        n = int(rng.integers(5, 30))
        b.add_document(np.full(n, k % 250 + 1, dtype=np.uint16), [n])
    b.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("blendcfg")
    return {n: _make(str(d / f"{n}_text_document"), seed=i) for i, n in enumerate(["web", "code", "books"])}


def _write(tmp_path, obj, ext=".yaml"):
    path = str(tmp_path / f"blend{ext}")
    with open(path, "w") as f:
        f.write(json.dumps(obj) if ext == ".json" else yaml.safe_dump(obj, sort_keys=False))
    return path


def test_full_yaml(data, tmp_path):
    text = f"""
train:
  blend:
    - {{path: {data['web']}, weight: 1}}
    - path: {data['code']}
      split: "0:0.9"
      weight: {{type: linear, unit: iterations, points: {{0: 100, 100: 10, 1000: 0}}}}
valid:
  - {{name: web, path: {data['web']}, split: "0.98:1"}}
  - name: mix
    blend: [{{path: {data['code']}, weight: 1}}, {{path: {data['books']}, weight: 2}}]
test:
  - {{name: books, path: {data['books']}, split: "0.9:1", weight: 1}}
"""
    path = tmp_path / "b.yaml"
    path.write_text(text)
    cfg = load_blend_config(str(path))
    stage = cfg.train.stages[0]
    assert stage.kind == "blend" and len(stage.entries) == 2
    assert stage.entries[0].weight == 1.0 and stage.entries[0].split == (0.0, 1.0)
    assert stage.entries[1].split == (0.0, 0.9)
    assert stage.entries[1].weight["points"] == {0.0: 100.0, 100.0: 10.0, 1000.0: 0.0}
    assert [g.name for g in cfg.valid] == ["web", "mix"]
    assert cfg.valid[0].stages[0].entries[0].split == (0.98, 1.0)
    assert len(cfg.valid[1].stages[0].entries) == 2
    assert cfg.test[0].name == "books"


def test_json_epochized_and_sequential(data, tmp_path):
    obj = {"train": {"sequential": [
        {"epochized_blend": [{"path": data["web"], "repetitions": 1},
                             {"path": data["code"], "repetitions": 2,
                              "weight": {"type": "step", "points": {"0": 1, "10": 3}}}]},
        {"blend": [{"path": data["books"], "weight": 1}], "until": {"iterations": 100}},
        {"blend": [{"path": data["web"], "weight": 1}]},
    ]}}
    cfg = load_blend_config(_write(tmp_path, obj, ".json"))
    assert cfg.train.sequential and len(cfg.train.stages) == 3
    s0, s1, s2 = cfg.train.stages
    assert s0.kind == "epochized_blend" and s0.entries[0].weight is None
    assert s0.entries[1].repetitions == 2 and s0.entries[1].weight["points"] == {0.0: 1.0, 10.0: 3.0}
    assert s1.until == ("iterations", 100) and s2.until is None


def test_relative_paths_resolve_against_file_dir(data, tmp_path):
    d = os.path.dirname(data["web"])
    path = os.path.join(d, "rel.yaml")
    with open(path, "w") as f:
        yaml.safe_dump({"train": {"blend": [{"path": "web_text_document", "weight": 1}]}}, f)
    cfg = load_blend_config(path)
    assert cfg.train.stages[0].entries[0].path == os.path.join(d, "web_text_document")


def _bad(data, tmp_path, obj, *needles, ext=".yaml"):
    path = _write(tmp_path, obj, ext)
    with pytest.raises(BlendConfigError) as info:
        load_blend_config(path)
    msg = str(info.value)
    assert path in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def test_unknown_keys(data, tmp_path):
    _bad(data, tmp_path, {"trian": {}}, "trian")
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weigth": 1}]}}, "weigth",
         "train.blend[0]")
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": {
        "type": "linear", "points": {0: 1}, "bogus": 3}}]}}, "bogus")
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": {
        "type": "nonsense", "points": {0: 1}}}]}}, "nonsense")
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": {
        "type": "linear", "unit": "epochs", "points": {0: 1}}}]}}, "epochs")


def test_unsorted_points(data, tmp_path):
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": {
        "type": "linear", "points": {0: 1, 100: 2, 50: 3}}}]}}, "not sorted", "points", "50")


def test_negative_weights(data, tmp_path):
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": -1}]}}, "negative", "-1")
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": {
        "type": "step", "points": {0: 1, 10: -2}}}]}}, "negative", "-2")


def test_missing_files(data, tmp_path):
    msg = _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"] + "_nope", "weight": 1}]}},
               "does not exist", ".bin")
    assert "train.blend[0].path" in msg
    os.rename(data["code"] + ".idx", data["code"] + ".idx.x")
    try:
        _bad(data, tmp_path, {"valid": [{"name": "v", "path": data["code"]}]}, ".idx", "valid[0]")
    finally:
        os.rename(data["code"] + ".idx.x", data["code"] + ".idx")


@pytest.mark.parametrize("split,needle", [("0.5:1.5", "outside"), ("-0.1:0.5", "outside"),
                                          ("0.5:0.5", "empty"), ("0.7:0.2", "empty"),
                                          ("0.5", "START:END"), ("a:b", "numbers")])
def test_bad_split(data, tmp_path, split, needle):
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": 1, "split": split}]}},
         needle, split)


def test_stage_with_nothing_to_draw(data, tmp_path):
    _bad(data, tmp_path, {"train": {"blend": []}}, "nothing to draw")
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": 0}]}}, "nothing to draw")
    _bad(data, tmp_path, {"train": {"sequential": [
        {"blend": [{"path": data["web"], "weight": 1}], "until": {"samples": 100}},
        {"blend": [{"path": data["code"], "weight": 1}], "until": {"samples": 50}},
        {"blend": [{"path": data["books"], "weight": 1}]}]}}, "nothing to draw", "sequential[1]")
    _bad(data, tmp_path, {"train": {"sequential": [
        {"blend": [{"path": data["web"], "weight": 1}]},
        {"blend": [{"path": data["code"], "weight": 1}]}]}}, "until", "sequential[0]")
    _bad(data, tmp_path, {"train": {"sequential": [
        {"epochized_blend": [{"path": data["web"], "repetitions": 1}], "until": {"samples": 3}}]}},
        "until")
    _bad(data, tmp_path, {"train": {"epochized_blend": [{"path": data["web"], "repetitions": 0}]}},
         "repetitions")


def test_group_name_twice(data, tmp_path):
    _bad(data, tmp_path, {"valid": [{"name": "a", "path": data["web"]},
                                    {"name": "a", "path": data["code"]}]}, "'a'", "twice")
    _bad(data, tmp_path, {"test": [{"path": data["web"]}]}, "name")


def test_duplicate_dataset_in_blend(data, tmp_path):
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": 1},
                                              {"path": data["web"], "weight": 2}]}}, "twice")


def test_unparsable_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("train: [unclosed")
    with pytest.raises(BlendConfigError, match="cannot parse"):
        load_blend_config(str(path))
    with pytest.raises(BlendConfigError, match="does not exist"):
        load_blend_config(str(tmp_path / "missing.yaml"))


def test_canonical_ignores_locations(data):
    a = parse_blend_config({"train": {"blend": [{"path": data["web"], "weight": 1}]}}, "a.yaml")
    b = parse_blend_config({"train": {"blend": [{"path": data["web"], "weight": 1}]}}, "b.yaml")
    c = parse_blend_config({"train": {"blend": [{"path": data["web"], "weight": 2}]}}, "a.yaml")
    assert a.canonical() == b.canonical() != c.canonical()


# ---- energon's metadataset spelling (tests/data/seeds: the YAML users bring, verbatim) ------
SEEDS = os.path.join(DATA, "seeds")
ENERGON_POINTS = {"type": "linear", "unit": "iterations", "points": {0: 100, 100: 10, 1000: 0}}
# the same thing in this project's own spelling, one per seed file
OUR_SPELLING = {
    "energon_blend.yaml": {"train": {"blend": [
        {"path": "ds1", "weight": 1}, {"path": "ds2", "weight": ENERGON_POINTS}]}},
    "energon_epochized_blend.yaml": {"train": {"epochized_blend": [
        {"path": "ds1", "repetitions": 1},
        {"path": "ds2", "repetitions": 2, "weight": ENERGON_POINTS}]}},
    "energon_sequential_schedule.yaml": {"train": {"sequential": [
        {"epochized_blend": [{"path": "ds1", "repetitions": 1}, {"path": "ds2", "repetitions": 2}]},
        {"blend": [{"path": "ds3", "weight": 1}]}]}},
}


@pytest.fixture(scope="module")
def seed_dir(tmp_path_factory):
    """The seed files next to small datasets named as the seeds name them (ds1, ds2, ds3: about
    20 samples of 16 tokens each), so their relative paths resolve against the file's directory."""
    import shutil
    d = tmp_path_factory.mktemp("seeds")
    for name in os.listdir(SEEDS):
        shutil.copy(os.path.join(SEEDS, name), d / name)
    for i, name in enumerate(["ds1", "ds2", "ds3"]):
        _make(str(d / name), seed=10 + i)
    return d


def _without_where(obj):
    """A parsed config with every ``where``/``source`` blanked (they name the file's own keys)."""
    import dataclasses
    if dataclasses.is_dataclass(obj):
        changes = {f.name: _without_where(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        changes.update({k: "" for k in ("where", "source") if k in changes})
        return dataclasses.replace(obj, **changes)
    if isinstance(obj, tuple):
        return tuple(_without_where(v) for v in obj)
    return obj


def _index(split_blend, train_iters, global_batch=4, seq_length=16):
    """The curriculum index training builds for ``split_blend`` (megatron/data/curriculum/index.py)."""
    from megatron.data.curriculum.constituents import resolve_constituents
    from megatron.data.curriculum.index import CurriculumIndex
    from megatron.schedules.units import BatchSchedule
    return CurriculumIndex(split_blend, resolve_constituents(split_blend, seq_length),
                           train_iters * global_batch, BatchSchedule(global_batch, None, seq_length),
                           seed=1234, cache_dir=None)


@pytest.mark.parametrize("seed, train_iters", [("energon_blend.yaml", 150),
                                               ("energon_epochized_blend.yaml", 12),
                                               ("energon_sequential_schedule.yaml", 40)])
def test_energon_seed_equals_our_spelling(seed_dir, seed, train_iters):
    """Each seed parses to the typed config of our spelling of the same blend, and the built
    curriculum index is the same, sample for sample."""
    theirs = load_blend_config(str(seed_dir / seed))
    ours = parse_blend_config(OUR_SPELLING[seed], "ours.yaml", base_dir=str(seed_dir))
    assert _without_where(theirs) == _without_where(ours)
    assert theirs.canonical() == ours.canonical()
    a, b = _index(theirs.train, train_iters), _index(ours.train, train_iters)
    assert a.names == b.names and len(a.names) == len(set(e.path for s in ours.train.stages
                                                               for e in s.entries))
    np.testing.assert_array_equal(np.asarray(a.dataset_index), np.asarray(b.dataset_index))
    np.testing.assert_array_equal(np.asarray(a.dataset_sample_index),
                                  np.asarray(b.dataset_sample_index))


def test_energon_weight_schedule_is_linear_in_iterations(seed_dir):
    """energon's ``linear: {0: 100, 100: 10, 1000: 0}`` is the piecewise-linear weight of
    (global) iteration, constant after the last point: the index targets w2 / (1 + w2)."""
    cfg = load_blend_config(str(seed_dir / "energon_blend.yaml"))
    stage = cfg.train.stages[0]
    assert stage.kind == "blend" and stage.entries[0].weight == 1.0
    assert stage.entries[1].weight == {"type": "linear", "unit": "iterations",
                                       "points": {0.0: 100.0, 100.0: 10.0, 1000.0: 0.0}}
    index = _index(cfg.train, 150)
    iters = np.arange(150)
    w2 = np.interp(iters, [0, 100, 1000], [100, 10, 0])
    target = index.target_weights(iters * 4)
    np.testing.assert_allclose(target[1], w2 / (1 + w2))
    np.testing.assert_allclose(target[0], 1 / (1 + w2))


def test_energon_step_weight_and_splits(seed_dir):
    """``step`` holds a value from its point to the next; ``val``/``test`` hold one blend or one
    dataset each: one group named after the split; ``blend_epochized`` is ``epochized_blend``;
    a dataset stage of ``sequential_schedule`` with ``until`` is a blend stage."""
    text = """
__module__: megatron.energon
__class__: MetadatasetV2
splits:
  train:
    sequential_schedule:
      - path: ds1
        until: {iterations: 5}
      - blend_epochized:
          - {path: ds2, repetitions: 0.5}
          - {path: ds3}
      - blend:
          - path: ds1
          - path: ds2
            weight:
              __module__: megatron.energon
              __class__: WeightSchedule
              step: {0: 3, 20: 0}
  val: {path: ds3, split: "0.9:1"}
  test:
    blend: [{path: ds1, weight: 2}, {path: ds2}]
"""
    path = seed_dir / "mixed.yaml"
    path.write_text(text)
    theirs = load_blend_config(str(path))
    ours = parse_blend_config({
        "train": {"sequential": [
            {"blend": [{"path": "ds1", "weight": 1}], "until": {"iterations": 5}},
            {"epochized_blend": [{"path": "ds2", "repetitions": 0.5},
                                 {"path": "ds3", "repetitions": 1}]},
            {"blend": [{"path": "ds1", "weight": 1},
                       {"path": "ds2", "weight": {"type": "step", "unit": "iterations",
                                                  "points": {0: 3, 20: 0}}}]}]},
        "valid": [{"name": "val", "path": "ds3", "split": "0.9:1"}],
        "test": {"blend": [{"path": "ds1", "weight": 2}, {"path": "ds2", "weight": 1}]}},
        "ours.yaml", base_dir=str(seed_dir))
    assert _without_where(theirs) == _without_where(ours)
    assert [g.name for g in theirs.valid] == ["val"] and [g.name for g in theirs.test] == ["test"]
    from megatron.schedules.registry import build_schedule
    step = build_schedule(theirs.train.stages[2].entries[1].weight)
    assert list(step([0, 19, 19.5, 20, 100])) == [3.0, 3.0, 3.0, 0.0, 0.0]


def _bad_text(tmp_path, text, *needles):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(BlendConfigError) as info:
        load_blend_config(str(path))
    msg = str(info.value)
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, msg
    return msg


def _energon(train, cls="MetadatasetV2"):
    return f"__module__: megatron.energon\n__class__: {cls}\nsplits:\n  train:\n{train}"


def test_energon_errors_name_file_key_value(data, tmp_path):
    web = data["web"]
    weight = ("          __module__: megatron.energon\n          __class__: WeightSchedule\n")
    msg = _bad_text(tmp_path, _energon(f"    blend: [{{path: {web}}}]\n", cls="Metadataset3"),
                    "__class__", "'Metadataset3'", "MetadatasetV2, Metadataset")
    assert msg.count("error") <= 1
    _bad_text(tmp_path, _energon(f"    blend: [{{path: {web}}}]\n").replace(
        "megatron.energon", "megatron.energy", 1), "__module__", "'megatron.energy'")
    _bad_text(tmp_path, _energon(f"    blend:\n      - path: {web}\n        weight:\n{weight}"
                                 "          linear: {0: 1, 10: 0}\n          step: {0: 1}\n"),
              "splits.train.blend[0].weight", "exactly one of linear, step", "linear, step")
    _bad_text(tmp_path, _energon(f"    blend:\n      - path: {web}\n        weight:\n{weight}"),
              "splits.train.blend[0].weight", "exactly one of linear, step", "neither")
    _bad_text(tmp_path, _energon(f"    blend:\n      - path: {web}\n        weight:\n"
                                 "          __class__: Schedule\n          linear: {0: 1}\n"),
              "splits.train.blend[0].weight", "__class__ 'Schedule'", "WeightSchedule")
    _bad_text(tmp_path, _energon(f"    blend:\n      - path: {web}\n        weight:\n{weight}"
                                 "          linear: {0: 1, 10: 2, 5: 0}\n"),
              "splits.train.blend[0].weight.linear", "not sorted")
    for key, value in (("subflavors", "{a: 1}"), ("split_part", "val"),
                       ("shuffle_over_epochs_multiplier", "2"), ("dataset_config", "ds.yaml")):
        _bad_text(tmp_path, _energon(f"    blend:\n      - path: {web}\n        {key}: {value}\n"),
                  "splits.train.blend[0]", f"key {key!r}", "energon's and not supported")
    _bad_text(tmp_path, _energon("    join: [{path: a}, {path: b}]\n    joiner: x\n"),
              "splits.train", "'join'", "energon's and not supported")
    _bad_text(tmp_path, _energon(f"    blend: [{{path: {web}}}]\n") + "  training: {}\n",
              "splits", "'training'", "train, val, valid, test")
    _bad_text(tmp_path, _energon(f"    blend_epochized: [{{path: {web}}}]\n    blend: []\n"),
              "splits.train", "exactly one of")
    _bad_text(tmp_path, _energon(f"    sequential_schedule:\n      - path: {web}\n"
                                 f"      - path: {data['code']}\n"),
              "splits.train.sequential_schedule[0]", "until")
    _bad_text(tmp_path, _energon(f"    blend_epochized: [{{path: {web}, repetitions: 0}}]\n"),
              "splits.train.blend_epochized[0].repetitions", "must be > 0")
    _bad_text(tmp_path, "__module__: megatron.energon\n__class__: MetadatasetV2\n",
              "needs 'splits")


def test_our_spelling_errors_unchanged(data, tmp_path):
    """The energon reading leaves our own spelling's errors as they were."""
    msg = _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"]}]}}, "missing key 'weight'")
    assert "train.blend[0]" in msg
    _bad(data, tmp_path, {"train": {"sequential_schedule": []}},
         "give exactly one of blend, epochized_blend, sequential")
    _bad(data, tmp_path, {"__class__": "MetadatasetV2", "train": {}}, "'train'", "__module__, "
         "__class__, splits")


def test_loss_weight_entries(data, tmp_path):
    """``loss_weight`` per entry (default 1) weighs a dataset's tokens in the loss; it must be
    positive, and one dataset has one loss weight (megatron/data/loss_weights.py)."""
    from megatron.data.curriculum.constituents import resolve_constituents
    from megatron.data.loss_weights import dataset_loss_weights

    cfg = parse_blend_config({"train": {"sequential": [
        {"blend": [{"path": data["web"], "weight": 1},
                   {"path": data["code"], "weight": 1, "loss_weight": 2.5}],
         "until": {"iterations": 5}},
        {"blend": [{"path": data["code"], "weight": 1, "loss_weight": 2.5},
                   {"path": data["books"], "weight": 1}]}]}}, "t.yaml")
    stages = cfg.train.stages
    assert [e.loss_weight for s in stages for e in s.entries] == [1.0, 2.5, 2.5, 1.0]
    constituents = resolve_constituents(cfg.train, 8)
    assert dataset_loss_weights(constituents, cfg.train, {}) == [1.0, 2.5, 1.0]
    with pytest.raises(BlendConfigError, match=r"train.blend\[1\].loss_weight: loss_weight 0 must "
                                               r"be > 0 \(a dataset not to learn from is left out\)"):
        parse_blend_config({"train": {"blend": [{"path": data["web"], "weight": 1},
                                                {"path": data["code"], "weight": 1,
                                                 "loss_weight": 0}]}}, "t.yaml")
    bad = parse_blend_config({"train": {"sequential": [
        {"blend": [{"path": data["code"], "weight": 1, "loss_weight": 1}], "until": {"iterations": 5}},
        {"blend": [{"path": data["code"], "weight": 1, "loss_weight": 2}]}]}}, "t.yaml")
    with pytest.raises(Exception, match="2, but code has loss_weight 1 in another stage; a dataset "
                                        "has one loss weight"):
        dataset_loss_weights(resolve_constituents(bad.train, 8), bad.train, {})
    with pytest.raises(Exception, match="--dataset-loss-weights and loss_weight in the blend file"):
        dataset_loss_weights(constituents, cfg.train, {"web": 2.0})
    plain = parse_blend_config({"train": {"blend": [{"path": data["web"], "weight": 1}]}}, "t.yaml")
    assert dataset_loss_weights(resolve_constituents(plain.train, 8), plain.train, {}) is None
    assert dataset_loss_weights(resolve_constituents(plain.train, 8), plain.train, {"web": 3}) == [3]


def test_a_readable_prefix_is_read_once_until_its_files_change(tmp_path, monkeypatch):
    """dataset_prefix_problem reads a prefix's header once while its files keep their inode,
    size and mtime (the start-up checks, then resolve_constituents); a file cut short after the
    first check is read again and reported. The fingerprint resolve_constituents takes from the
    open index is gpt_files_fingerprint's from the header."""
    from helpers.curriculum import write_corpus
    from megatron.data import blend_config
    from megatron.data.curriculum.constituents import resolve_constituents
    from megatron.data.mix_ledger import gpt_files_fingerprint

    prefix = write_corpus(str(tmp_path / "web_text_document"), [30, 40, 50, 20])
    reads = []
    real = blend_config.indexed_dataset_problem
    monkeypatch.setattr(blend_config, "indexed_dataset_problem", lambda p: reads.append(p) or real(p))
    assert blend_config.dataset_prefix_problem(prefix) is None
    blend = parse_blend_config({"train": {"blend": [{"path": prefix, "weight": 1}]}}, "t.yaml").train
    (c,) = resolve_constituents(blend, 16)
    assert reads == [prefix]
    assert c.fingerprint == gpt_files_fingerprint(prefix)
    with open(prefix + ".bin", "r+b") as f:
        f.truncate(10)
    assert "is truncated" in blend_config.dataset_prefix_problem(prefix)
    assert reads == [prefix, prefix]


# ------------------------------------------------------------------ the adaptive mixer (issue 46)
def _mixed(data, mixer, weight_b=2):
    return {"train": {"blend": [{"path": data["web"], "weight": 1},
                                {"path": data["code"], "weight": weight_b}], "mixer": mixer}}


def test_mixer_is_read_with_its_policy_keys(data, tmp_path):
    cfg = load_blend_config(_write(tmp_path, _mixed(data, {"policy": "odm", "interval": 4,
                                                           "floor": 0.1, "smoothing": 0.5})))
    m = cfg.train.mixer
    assert (m.policy, m.interval, m.floor) == ("odm", 4, 0.1)
    assert dict(m.params) == {"smoothing": 0.5, "reward_scale": 10.0}  # defaults filled in
    assert m.where.endswith("train.mixer")
    ado = load_blend_config(_write(tmp_path, _mixed(data, {"policy": "ado", "interval": 1}))).train
    assert ado.mixer.floor == 0.0 and ado.mixer.max_epochs is None
    assert load_blend_config(_write(tmp_path, _mixed(data, {"policy": "ado", "interval": 1,
                                                            "max_epochs": 2}))
                             ).train.mixer.max_epochs == 2.0
    assert load_blend_config(_write(tmp_path, _mixed(data, None) | {"train": {"blend": [
        {"path": data["web"], "weight": 1}]}})).train.mixer is None
    assert m.target == "sampling" and "target" not in m.to_json()  # records stay as they were
    lw = load_blend_config(_write(tmp_path, _mixed(data, {"policy": "odm", "interval": 4,
                                                          "target": "loss_weight"}))).train.mixer
    assert lw.target == "loss_weight" and lw.to_json()["target"] == "loss_weight"
    assert blend_from_json({"stages": [], "mixer": lw.to_json()}).mixer == lw  # the ledger's


@pytest.mark.parametrize("mixer,needles", [
    ({"policy": "doremi", "interval": 2}, ("train.mixer.policy", "'doremi'", "odm, ado, loss_softmax")),
    ({"policy": "odm", "interval": 2, "temperature": 1},
     ("unknown key 'temperature'", "policy, interval, floor, max_epochs, target, smoothing, "
                                   "reward_scale")),
    ({"policy": "odm", "interval": 2, "target": "loss"},
     ("train.mixer.target", "unknown target 'loss'", "allowed: sampling, loss_weight")),
    ({"policy": "odm", "interval": 2, "target": "loss_weight", "max_epochs": 2},
     ("train.mixer.max_epochs", "max_epochs 2 beside target loss_weight", "leave max_epochs out")),
    ({"policy": "loss_softmax", "interval": 0}, ("train.mixer.interval", "interval 0", "positive")),
    ({"policy": "loss_softmax", "interval": 2.5}, ("interval 2.5", "whole number")),
    ({"policy": "ado"}, ("missing key 'interval'",)),
    ({"policy": "odm", "interval": 2, "floor": -0.1}, ("train.mixer.floor", "floor -0.1", "negative")),
    ({"policy": "odm", "interval": 2, "floor": 0.6}, ("floor 0.6 x 2 datasets = 1.2", "above 1")),
    ({"policy": "loss_softmax", "interval": 2, "temperature": 0}, ("temperature 0", "> 0")),
    ({"policy": "odm", "interval": 2, "smoothing": 1}, ("smoothing 1", "[0, 1)")),
    ({"policy": "odm", "interval": 2, "max_epochs": 0}, ("train.mixer.max_epochs", "max_epochs 0",
                                                          "> 0")),
    ("odm", ("train.mixer", "expected a mapping")),
])
def test_bad_mixer_is_one_line_naming_key_and_value(data, tmp_path, mixer, needles):
    msg = _bad(data, tmp_path, _mixed(data, mixer), *needles)
    assert "\n" not in msg


def test_mixer_refuses_a_weight_schedule_and_other_places(data, tmp_path):
    schedule = {"type": "linear", "points": {0: 1, 10: 2}}
    _bad(data, tmp_path, _mixed(data, {"policy": "odm", "interval": 2}, weight_b=schedule),
         "train.blend[1].weight", "weight schedule", "beside a mixer", "give a number")
    mixer = {"policy": "odm", "interval": 2}
    _bad(data, tmp_path, {"train": {"epochized_blend": [{"path": data["web"], "repetitions": 1}],
                                    "mixer": mixer}}, "unknown key 'mixer'")
    _bad(data, tmp_path, {"valid": [{"name": "v", "blend": [{"path": data["web"], "weight": 1}],
                                     "mixer": mixer}]}, "unknown key 'mixer'")
    _bad(data, tmp_path, {"train": {"blend": [{"path": data["web"], "weight": 1}], "foo": 1}},
         "unknown key 'foo'", "allowed keys: blend, epochized_blend, sequential, mixer")
