"""megatron/data/blend_config.py: YAML/JSON blend files -> typed config, and clear errors."""
import json
import os

import numpy as np
import pytest
import yaml

from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
from megatron.data.blend_config import BlendConfigError, load_blend_config, parse_blend_config


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
