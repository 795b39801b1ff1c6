"""The cache keys of every data index this project writes (megatron/data/cache_key.py): the
curriculum index (every data path's training mix, validation groups and weighted split groups),
the T0 pack index and the per-dataset GPT indices megatron-core writes under our names.

For each input a build reads, changing only that input changes the key; the tables below must
name every declared input and every field of the typed values hashed whole (a field added later
fails here until it is given a change). And a build through a cache another run filled equals a
fresh build, for pairs of runs that differ in one input each (the step batch-size schedule first:
the key once forgot it)."""
import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from helpers.curriculum import fake_constituents, write_corpus
from megatron.data.blend_config import parse_blend_config
from megatron.data.curriculum import index as curriculum_index
from megatron.data.curriculum.constituents import Constituent
from megatron.data.curriculum.index import CurriculumIndex
from megatron.schedules.seqlen_plan import SeqLengthPlan
from megatron.schedules.units import BatchSchedule

SEQ = 16


@pytest.fixture(scope="module", autouse=True)
def gloo_group(dist_group):
    yield


def _blend(weight_b=None, split_b="0:1"):
    return parse_blend_config({"train": {"blend": [
        {"path": "data/a", "weight": 1},
        {"path": "data/b", "split": split_b, "weight": weight_b or
         {"type": "linear", "unit": "iterations", "points": {0: 0.0, 8: 3.0}}}]}},
        "t.yaml", check_files=False).train


def _index(blend=None, num_samples=80, schedule=None, constituents=None, **kwargs):
    blend = blend or _blend()
    return CurriculumIndex(blend, constituents or fake_constituents(blend, 40, SEQ), num_samples,
                           schedule or BatchSchedule(8, None, SEQ, steps=((0, 4), (16, 8))),
                           build=False, **kwargs)


# ------------------------------------------------------------------ the curriculum index
def test_every_constructor_argument_is_keyed_or_says_why():
    keyed = set(CurriculumIndex.KEY_INPUTS)
    for name in CurriculumIndex.constructor_arguments():
        assert (name in keyed) != (name in CurriculumIndex.NOT_KEYED_ARGUMENTS), name
    assert set(CurriculumIndex.NOT_KEYED_ARGUMENTS) <= set(CurriculumIndex.constructor_arguments())


def _epochized_continuation():
    """A continuation inside an epochized stage: its caps come from ``drawn_before``."""
    blend = parse_blend_config({"train": {"sequential": [
        {"epochized_blend": [{"path": "data/a", "repetitions": 1},
                             {"path": "data/b", "repetitions": 1}]},
        {"blend": [{"path": "data/a", "weight": 1}]}]}}, "t.yaml", check_files=False).train
    return blend


# one change per declared input: (constructor kwargs, or an attribute to set) -> another key
INPUT_CHANGES = {
    "blend": lambda: _index(_blend(weight_b=2.0)),
    "constituents": lambda: _index(constituents=[dataclasses.replace(c, tokens=c.tokens + 16)
                                                 for c in fake_constituents(_blend(), 40, SEQ)]),
    "num_samples": lambda: _index(num_samples=88),
    "batch_schedule": lambda: _index(schedule=BatchSchedule(8, None, SEQ, steps=((0, 2), (16, 8)))),
    "seed": lambda: _index(seed=7),
    "begin": lambda: _index(begin=8, base=[0, 0]),
    "base": lambda: _index(base=[1, 0]),
    "plans": None,  # below: a continuation whose epochized caps differ by drawn_before only
    "id_dtype": ("id_dtype", np.int16),
    "sample_dtype": ("sample_dtype", np.int64),
    "linear_fast_path": ("linear_fast_path", False),
    "kernel": None,  # below: the kernel's source digest
    "order": lambda: _index(order="blocked"),
}


def test_changing_any_one_declared_input_changes_the_key(monkeypatch):
    assert set(INPUT_CHANGES) == set(CurriculumIndex.KEY_INPUTS)
    base = _index().cache_key()
    assert _index().cache_key() == base
    for name, change in INPUT_CHANGES.items():
        if change is None:
            continue
        if isinstance(change, tuple):
            other = _index()
            setattr(other, *change)
        else:
            other = change()
        assert other.cache_key() != base, name
    monkeypatch.setattr(curriculum_index, "_kernel_source_digest", lambda: "another kernel")
    assert _index().cache_key() != base
    monkeypatch.undo()
    blocked = _index(order="blocked").cache_key()
    monkeypatch.setattr(curriculum_index, "blocked_kernel_digest", lambda: "another kernel")
    assert _index(order="blocked").cache_key() != blocked
    monkeypatch.undo()
    # plans: the same continuation, another history before it
    blend = _epochized_continuation()
    cons = fake_constituents(blend, 10, SEQ)
    keys = {CurriculumIndex(blend, cons, 60, BatchSchedule(4, None, SEQ), begin=8, base=[4, 4],
                            drawn_before=lambda s, d=drawn: np.array([d, 0]), build=False).cache_key()
            for drawn in (0, 2)}
    assert len(keys) == 2


def _field_changes(value):
    """Another value of a field's ``value`` (same type)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value + 0.25
    if isinstance(value, str):
        return value + "x"
    raise AssertionError(value)


# every field of the typed values hashed whole, each changed alone
BATCH_SCHEDULE_FIELDS = {
    "global_batch_size": BatchSchedule(16, None, SEQ, steps=((0, 4), (16, 16))),
    "rampup": BatchSchedule(8, (4, 4, 16), SEQ),
    "seq_length": BatchSchedule(8, None, SEQ * 2, steps=((0, 4), (16, 8))),
    "steps": BatchSchedule(8, None, SEQ, steps=((0, 4), (24, 8))),
    "seq_plan": BatchSchedule(8, None, SEQ, steps=((0, 4), (16, 8)),
                              seq_plan=SeqLengthPlan(SEQ, "truncate",
                                                     np.array([8] * 4 + [SEQ] * 20))),
}


def test_every_batch_schedule_field_is_keyed():
    assert set(BATCH_SCHEDULE_FIELDS) == {f.name for f in dataclasses.fields(BatchSchedule)}
    base = _index().cache_key()
    for name, schedule in BATCH_SCHEDULE_FIELDS.items():
        assert _index(schedule=schedule).cache_key() != base, name


def test_every_constituent_field_is_keyed():
    cons = fake_constituents(_blend(), 40, SEQ)
    index = _index(constituents=cons)
    base = index.cache_key()
    for f in dataclasses.fields(Constituent):
        value = getattr(cons[1], f.name)
        new = (value[0], value[1] - 0.5) if f.name == "split" else _field_changes(value)
        index.constituents = [cons[0], dataclasses.replace(cons[1], **{f.name: new})]
        assert index.cache_key() != base, f.name


def test_every_keyed_blend_entry_field_is_keyed_and_the_others_are_not():
    blend = _blend()
    base = _index(blend).cache_key()
    entry = blend.stages[0].entries[1]
    changes = {"path": "data/c", "weight": 0.5, "split": (0.0, 0.5), "repetitions": 2.0,
               "where": "elsewhere", "loss_weight": 3.0, "replay": True}
    assert set(changes) == {f.name for f in dataclasses.fields(entry)}
    for name, value in changes.items():
        stage = dataclasses.replace(blend.stages[0], entries=(
            blend.stages[0].entries[0], dataclasses.replace(entry, **{name: value})))
        changed = dataclasses.replace(blend, stages=(stage,))
        key = _index(changed, constituents=fake_constituents(changed, 40, SEQ)).cache_key()
        assert (key != base) == (name not in ("where", "loss_weight")), name


def test_the_mixer_is_keyed_field_by_field():
    """A blend's mixer (issue 46) shapes every mix after its first update: each of its keyed
    fields changes the key, its error location does not."""
    from megatron.data.blend_config import MixerConfig

    blend = _blend(weight_b=2.0)
    cons = fake_constituents(blend, 40, SEQ)
    mixer = MixerConfig("odm", 2, 0.1, (("reward_scale", 10.0), ("smoothing", 0.9)), "t.yaml")
    keys = {_index(dataclasses.replace(blend, mixer=m), constituents=cons).cache_key()
            for m in (None, mixer, dataclasses.replace(mixer, policy="loss_softmax"),
                      dataclasses.replace(mixer, interval=3), dataclasses.replace(mixer, floor=0.2),
                      dataclasses.replace(mixer, params=(("reward_scale", 5.0), ("smoothing", 0.9))),
                      dataclasses.replace(mixer, max_epochs=2.0),
                      dataclasses.replace(mixer, target="loss_weight"))}
    assert len(keys) == 8
    assert {f.name for f in dataclasses.fields(MixerConfig)} == {"policy", "interval", "floor",
                                                                 "params", "where", "max_epochs",
                                                                 "target"}
    moved = dataclasses.replace(blend, mixer=dataclasses.replace(mixer, where="elsewhere"))
    assert _index(moved, constituents=cons).cache_key() == _index(
        dataclasses.replace(blend, mixer=mixer), constituents=cons).cache_key()


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    rng = np.random.default_rng(1)
    return {name: write_corpus(str(d / f"{name}_text_document"), rng.integers(20, 200, 120), k)
            for k, name in enumerate(("web", "code"))}


def _pretraining_args(corpora, cache, steps, tmp_path, extra=()):
    from megatron.config.parser import parse_args

    blend = tmp_path / "blend.json"
    blend.write_text(json.dumps({"train": {"blend": [
        {"path": corpora["web"], "weight": 1},
        {"path": corpora["code"],
         "weight": {"type": "linear", "unit": "iterations", "points": {0: 0.0, 8: 3.0}}}]}}))
    return parse_args(["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
                       "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size",
                       "8", "--train-samples", "80", "--lr", "1e-3",
                       "--step-batch-size-schedule", steps, "--data-blend-config", str(blend),
                       "--data-cache-path", str(cache), "--eval-iters", "0", *extra]).run_config.data


def _drawn(corpora, cache, steps, tmp_path):
    from megatron.data.builder import build_pretraining_data
    from megatron.tokenizer import ByteLevelTokenizer

    data = build_pretraining_data(_pretraining_args(corpora, cache, steps, tmp_path),
                                  ByteLevelTokenizer())
    return (dict(zip(data.train.names, (int(x) for x in data.train.counts), strict=True)),
            np.asarray(data.train.dataset_index).copy(), data.train.index.cache_hit)


def test_step_batch_size_schedule_runs_never_share_an_index(corpora, tmp_path):
    """The issue's two runs on one --data-cache-path: batch 4 (run A) or 2 (run B) for the first
    16 samples, then 8; run B after A draws what B draws on a fresh cache."""
    shared = tmp_path / "shared"
    drawn_a, _, hit_a = _drawn(corpora, shared, "0:4 1024:8", tmp_path)
    drawn_b, index_b, hit_b = _drawn(corpora, shared, "0:2 1024:8", tmp_path)
    fresh_b, fresh_index_b, _ = _drawn(corpora, tmp_path / "fresh", "0:2 1024:8", tmp_path)
    assert not hit_a and not hit_b
    assert drawn_b == fresh_b == {"web": 24, "code": 56} and drawn_a != drawn_b
    np.testing.assert_array_equal(index_b, fresh_index_b)
    assert _drawn(corpora, shared, "0:2 1024:8", tmp_path)[2]  # the same run reuses its own


def test_pack_documents_changes_the_training_index_key_and_each_datasets(corpora, tmp_path):
    """--pack-documents best-fit against concat on one --data-cache-path: the curriculum
    index's key (its constituents carry the packing and count bins) and every dataset's own index
    key (another class and name) differ, so neither run reads the other's indices."""
    from megatron.data.builder import build_pretraining_data
    from megatron.tokenizer import ByteLevelTokenizer

    keys = {}
    for mode in ("concat", "best-fit", "concat"):
        config = _pretraining_args(corpora, tmp_path / "shared", "0:8", tmp_path,
                                   ["--pack-documents", mode])
        train = build_pretraining_data(config, ByteLevelTokenizer()).train
        key = (train.index.cache_key(),
               [source.epoch_dataset.unique_description_hash
                for source in (s.open() for s in train.datasets)])
        assert train.index.cache_hit == (mode in keys)  # the second concat run reads its own
        keys.setdefault(mode, key)
    assert keys["concat"][0] != keys["best-fit"][0]
    assert not set(keys["concat"][1]) & set(keys["best-fit"][1])


def _gpt_config(cache):
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    from megatron.tokenizer import ByteLevelTokenizer

    return GPTDatasetConfig(random_seed=1, sequence_length=SEQ, tokenizer=ByteLevelTokenizer(),
                            reset_position_ids=False, reset_attention_mask=False,
                            eod_mask_loss=False, path_to_cache=str(cache), blend=None,
                            blend_per_split=None, split="1,0,0")


def _samples(dataset, n=24):
    return torch.stack([dataset[i]["tokens"] for i in range(n)])


@pytest.mark.parametrize("change", ["weighted_split_range", "schedule_rampup", "seq_plan",
                                    "num_samples", "seed"])
def test_a_shared_cache_equals_a_fresh_build(corpora, tmp_path, change):
    """Pairs of builds differing in one input: the second through the cache the first filled
    equals it built on an empty cache."""
    from megatron.data.curriculum.dataset import build_curriculum_dataset
    from megatron.data.weighted_splits import WeightedSplitGroup, WeightedSplitItem

    def group(end):
        return WeightedSplitGroup("TRAIN", (WeightedSplitItem(0.6, 0.0, end, corpora["web"]),
                                            WeightedSplitItem(0.4, 0.0, 0.9, corpora["code"])))

    first = dict(blend=group(0.9).to_split_blend("w"), n=48, schedule=BatchSchedule(4, None, SEQ),
                 seed=1)
    second = dict(first)
    second.update({
        "weighted_split_range": {"blend": group(0.8).to_split_blend("w")},
        "schedule_rampup": {"schedule": BatchSchedule(4, (2, 2, 8), SEQ)},
        "seq_plan": {"schedule": BatchSchedule(4, None, SEQ, seq_plan=SeqLengthPlan(
            SEQ, "truncate", np.array([8] * 6 + [SEQ] * 6)))},
        "num_samples": {"n": 52},
        "seed": {"seed": 5},
    }[change])

    def build(spec, cache):
        config = dataclasses.replace(_gpt_config(cache), random_seed=spec["seed"])
        return build_curriculum_dataset(spec["blend"], spec["n"], config, spec["schedule"])

    shared = tmp_path / "shared"
    build(first, shared)
    through_shared = build(second, shared)
    fresh = build(second, tmp_path / "fresh")
    assert not through_shared.index.cache_hit
    np.testing.assert_array_equal(np.asarray(through_shared.dataset_index),
                                  np.asarray(fresh.dataset_index))
    assert torch.equal(_samples(through_shared), _samples(fresh))


def test_a_dataset_rewritten_at_the_same_path_never_reads_the_old_indices(tmp_path):
    """megatron-core keys its GPTDataset indices on the name it is given, not the files: the name
    holds a digest of the documents' lengths, so a corpus rewritten at the same path (same size,
    other documents) is indexed afresh."""
    from megatron.data.curriculum.dataset import build_curriculum_dataset

    prefix = str(tmp_path / "corpus_text_document")
    blend = parse_blend_config({"valid": [{"name": "v", "path": prefix}]}, "v.yaml",
                               check_files=False).valid[0]
    cache = tmp_path / "cache"
    write_corpus(prefix, [30, 50, 40, 60], seed=0)
    build_curriculum_dataset(blend, 6, _gpt_config(cache), BatchSchedule(2, None, SEQ))
    write_corpus(prefix, [60, 40, 50, 30], seed=0)  # same counts and total tokens: same fingerprint
    after = build_curriculum_dataset(blend, 6, _gpt_config(cache), BatchSchedule(2, None, SEQ))
    fresh = build_curriculum_dataset(blend, 6, _gpt_config(tmp_path / "fresh"),
                                     BatchSchedule(2, None, SEQ))
    assert torch.equal(_samples(after, 6), _samples(fresh, 6))


# ------------------------------------------------------------------ the T0 pack index
def _mtf(tmp_path, **kwargs):
    from megatron.data.mtf_dataset import MTFDataset

    prefix = str(tmp_path / "t0")
    if not os.path.exists(prefix + "_inputs_document.idx"):
        rng = np.random.default_rng(0)
        for part, lo, hi in (("inputs", 3, 20), ("targets", 1, 8)):
            write_corpus(f"{prefix}_{part}_document", rng.integers(lo, hi, 40), seed=hash(part) % 7)
    spec = dict(name="t0", prefix=prefix, seq_length=32, num_samples=30, seed=1,
                doc_range=(0.0, 1.0), cache_dir=str(tmp_path / "cache"))
    spec.update(kwargs)
    return MTFDataset(**spec)


def test_every_pack_index_input_is_keyed(tmp_path, monkeypatch):
    from megatron.data.mtf_dataset import MTFDataset

    base = _mtf(tmp_path)
    key = base._cache_key()
    others = {"pair": None, "lo": dict(doc_range=(0.1, 1.0)), "hi": dict(doc_range=(0.0, 0.9)),
              "documents": None, "pair_lengths": dict(seq_length=16), "seq_length": None,
              "seed": dict(seed=2), "num_samples": dict(num_samples=60), "packing_version": None}
    assert set(others) == set(MTFDataset.KEY_INPUTS)
    for name, kwargs in others.items():
        if kwargs is not None:
            assert _mtf(tmp_path, **kwargs)._cache_key() != key, name
    for name, value in (("pair", None), ("documents", base.documents[1:]),
                        ("seq_length", 33), ("packing_version", 2)):
        other = _mtf(tmp_path)
        if name == "pair":
            monkeypatch.setattr(type(other.pair), "fingerprint", lambda self: {"other": 1})
        else:
            setattr(other, name, value)
        assert other._cache_key() != key, name
        monkeypatch.undo()
    # through the cache another length filled: the same packs as a fresh build
    shared = _mtf(tmp_path, seq_length=24)
    fresh = _mtf(tmp_path, seq_length=24, cache_dir=str(tmp_path / "fresh"))
    for a, b in zip((shared.items, shared.offsets), (fresh.items, fresh.offsets), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
