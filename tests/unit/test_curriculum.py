"""megatron/data/curriculum/: curriculum index bounds, megatron-core equivalence for static
weights, epochized/sequential blends, resume, data-parallel independence, caching."""
import os

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from megatron.core.datasets import helpers
from megatron.core.datasets.blended_dataset import BlendedDataset
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
from megatron.core.datasets.utils import Split

from helpers.curriculum import fake_index, prefix_error, random_schedules, schedule_entries, write_corpus
from helpers.curriculum import megatron_blend_indices as build_blending_index  # the static peer
from megatron.data.blend_config import BlendConfigError, parse_blend_config
from megatron.data.curriculum import index as curriculum_index
from megatron.data.curriculum import kernel as curriculum_kernel
from megatron.data.curriculum.constituents import resolve_constituents
from megatron.data.curriculum.dataset import build_curriculum_dataset
from megatron.data.curriculum.index import CurriculumIndex
from megatron.data.epoch_order import gpt_sample_documents
from megatron.data.samplers import PretrainingBatchSampler
from megatron.schedules.units import BatchSchedule
from megatron.tokenizer import ByteLevelTokenizer

SEQ = 16


@pytest.fixture(scope="module", autouse=True)
def gloo_group(dist_group):
    """megatron-core's BlendedDataset calls torch.distributed.get_rank() unguarded."""
    yield


def _make(prefix, ndocs, value, seed):
    rng = np.random.default_rng(seed)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for _k in range(ndocs):
        n = int(rng.integers(5, 40))
        b.add_document(np.full(n, value, dtype=np.uint16), [n])
    b.finalize(prefix + ".idx")
    return prefix


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("curr")
    return {name: _make(str(d / f"{name}_text_document"), ndocs, i + 1, i)
            for i, (name, ndocs) in enumerate([("a", 40), ("b", 60), ("c", 30)])}


def _gpt_config(cache, seed=1):
    return GPTDatasetConfig(random_seed=seed, sequence_length=SEQ, tokenizer=ByteLevelTokenizer(),
                            reset_position_ids=False, reset_attention_mask=False,
                            eod_mask_loss=False, path_to_cache=str(cache), blend=None,
                            blend_per_split=None, split="1,0,0")


def _fake_index(blend_obj, N, gbs=4, rampup=None, spe=10 ** 6):
    return fake_index(blend_obj, N, gbs, rampup, spe, seq=SEQ)


# --- bounds -------------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheds=random_schedules(), N=st.integers(1, 1500), gbs=st.integers(1, 9))
def test_counts_track_integral_of_target_weights(scheds, N, gbs):
    idx = _fake_index({"blend": schedule_entries(scheds, gbs, SEQ)}, N, gbs)
    err = prefix_error(idx)
    assert err.max() <= 2.0 + 1e-9, err.max()     # never more than 2 samples behind
    assert (-err).max() <= 1.0 + 1e-9, (-err).max()  # never more than 1 sample ahead
    assert len(idx.dataset_index) == N and idx.counts.sum() == N


def test_static_weights_within_one_and_identical_to_megatron():
    w = [0.5, 0.2, 0.3, 1.7]
    idx = _fake_index({"blend": [{"path": f"d{k}", "weight": x} for k, x in enumerate(w)]}, 5000)
    err = prefix_error(idx)
    assert np.abs(err).max() <= 1.0
    ref_id = np.zeros(5000, dtype=np.int16)
    ref_sample = np.zeros(5000, dtype=np.int64)
    norm = (np.array(w) / np.sum(w)).tolist()
    helpers.build_blending_indices(ref_id, ref_sample, norm, len(w), 5000, False)
    np.testing.assert_array_equal(np.asarray(idx.dataset_index), ref_id)
    np.testing.assert_array_equal(np.asarray(idx.dataset_sample_index), ref_sample)
    ids, samples = build_blending_index(w, 5000)
    np.testing.assert_array_equal(ids, ref_id)
    np.testing.assert_array_equal(samples, ref_sample)
    assert idx.dataset_index.dtype == np.uint8 and idx.dataset_sample_index.dtype == np.int32


def test_python_fallback_matches_compiled(monkeypatch):
    blend = {"blend": [{"path": "a", "weight": {"type": "linear", "points": {0: 1, 20: 5}}},
                       {"path": "b", "weight": {"type": "step", "unit": "samples",
                                                "points": {0: 2, 50: 0, 120: 1}}},
                       {"path": "c", "weight": 0.3}]}
    fast = _fake_index(blend, 300)
    monkeypatch.setitem(curriculum_kernel._KERNEL, "fn", None)
    slow = _fake_index(blend, 300)
    np.testing.assert_array_equal(np.asarray(fast.dataset_index), np.asarray(slow.dataset_index))
    np.testing.assert_array_equal(np.asarray(fast.dataset_sample_index),
                                  np.asarray(slow.dataset_sample_index))


def test_weight_zero_means_no_new_samples_and_rampup_iterations():
    # gbs ramps 2 -> 8; code's weight is 0 from iteration 10 on.
    idx = _fake_index({"blend": [{"path": "web", "weight": 1},
                                 {"path": "code", "weight": {"type": "step", "points": {0: 1, 10: 0}}}]},
                      400, gbs=8, rampup=(2, 2, 60))
    start10 = idx.batch_schedule.samples_at_iteration(10)
    ids = np.asarray(idx.dataset_index)
    assert (ids[start10 + 2:] == 0).all()
    assert abs((ids[:start10] == 1).sum() - start10 / 2) <= 1
    mix = idx.iteration_mixture()
    target = idx.target_iteration_mixture()
    assert mix.shape == target.shape == (2, idx.progress.num_iterations)
    np.testing.assert_allclose(target[:, 12:], [[1.0] * (target.shape[1] - 12), [0.0] * (target.shape[1] - 12)])


def test_all_weights_zero_is_an_error_naming_the_file():
    with pytest.raises(BlendConfigError, match=r"t.yaml: train.blend: all weights are zero at sample 40 \(iteration 10\)"):
        _fake_index({"blend": [{"path": "a", "weight": {"type": "step", "points": {0: 1, 10: 0}}},
                               {"path": "b", "weight": {"type": "linear", "points": {0: 1, 10: 0}}}]},
                    100, gbs=4)


@pytest.mark.parametrize("kernel,chunk", [("compiled", 1 << 20), ("python", 1 << 20), ("compiled", 3)])
def test_epochized_all_weights_zero_is_the_same_error(monkeypatch, kernel, chunk):
    if kernel == "python":
        monkeypatch.setitem(curriculum_kernel._KERNEL, "fn", None)
    monkeypatch.setattr(curriculum_index, "CHUNK", chunk)
    # every weight zero from iteration 5 on while repetitions are left (per-iteration segments)
    with pytest.raises(BlendConfigError, match=r"t.yaml: train.epochized_blend: all weights are zero "
                                               r"at sample 20 \(iteration 5\) of a run of 100 samples"):
        _fake_index({"epochized_blend": [
            {"path": "a", "repetitions": 1, "weight": {"type": "step", "points": {0: 1, 5: 0}}},
            {"path": "b", "repetitions": 1, "weight": {"type": "step", "points": {0: 1, 5: 0}}}]},
            100, gbs=4, spe=50)
    # the one dataset with a positive weight is done at sample 10; "b" (weight 0 until iteration
    # 100) would then be drawn against its weight: same error, naming who is left
    with pytest.raises(BlendConfigError, match=r"train.epochized_blend: all weights are zero at sample "
                                               r"10 \(iteration 2\).*'a' has given its 10 samples.*'b' "
                                               r"has 50 left at weight 0"):
        _fake_index({"epochized_blend": [
            {"path": "a", "repetitions": 1, "weight": 1},
            {"path": "b", "repetitions": 1, "weight": {"type": "step", "points": {0: 0, 100: 1}}}]},
            60, gbs=4, spe={"a": 10, "b": 50})
    # samples-unit weights (one segment per sample) and static weights (one segment) alike
    with pytest.raises(BlendConfigError, match=r"all weights are zero at sample 7 \(iteration 1\)"):
        _fake_index({"epochized_blend": [
            {"path": "a", "repetitions": 1, "weight": 2.0},
            {"path": "b", "repetitions": 1,
             "weight": {"type": "step", "unit": "samples", "points": {0: 0, 30: 1}}}]},
            40, gbs=4, spe={"a": 7, "b": 33})
    with pytest.raises(BlendConfigError, match=r"all weights are zero at sample 7 \(iteration 1\)"):
        _fake_index({"epochized_blend": [{"path": "a", "repetitions": 1, "weight": 2.0},
                                         {"path": "b", "repetitions": 1, "weight": 0}]},
                    40, gbs=4, spe={"a": 7, "b": 33})
    # weights reaching zero only once everything is drawn are fine
    idx = _fake_index({"epochized_blend": [
        {"path": "a", "repetitions": 1, "weight": {"type": "step", "points": {0: 1, 30: 0}}},
        {"path": "b", "repetitions": 2, "weight": 1.0}]}, 60, gbs=4, spe={"a": 20, "b": 20})
    assert idx.counts.tolist() == [20, 40]


# --- epochized and sequential -------------------------------------------------------------------
def test_epochized_exact_repetitions_default_weights_finish_together():
    spe = {"a": 30, "b": 70, "c": 11}
    idx = _fake_index({"epochized_blend": [{"path": "a", "repetitions": 2},
                                           {"path": "b", "repetitions": 1},
                                           {"path": "c", "repetitions": 3}]}, 60 + 70 + 33, spe=spe)
    assert idx.counts.tolist() == [60, 70, 33]
    assert idx.epochs == {"a": 2.0, "b": 1.0, "c": 3.0}
    ids = np.asarray(idx.dataset_index)
    for d in range(3):  # each dataset's last sample is near the end: they finish together
        assert np.nonzero(ids == d)[0].max() >= len(ids) - 8
    for d in range(3):
        np.testing.assert_array_equal(np.sort(np.asarray(idx.dataset_sample_index)[ids == d]),
                                      np.arange(idx.counts[d]))


def test_epochized_with_schedule_keeps_repetitions():
    spe = {"a": 50, "b": 40}
    idx = _fake_index({"epochized_blend": [
        {"path": "a", "repetitions": 1, "weight": 1},
        {"path": "b", "repetitions": 2, "weight": {"type": "linear", "points": {0: 0, 10: 5}}}]},
        130, gbs=4, spe=spe)
    assert idx.counts.tolist() == [50, 80]
    ids = np.asarray(idx.dataset_index)
    assert (ids[:4] == 0).all()  # weight 0 at the start: the schedule shapes the interleaving


def test_sequential_stages_never_mix():
    spe = {"a": 25, "b": 15, "c": 10 ** 6}
    idx = _fake_index({"sequential": [
        {"epochized_blend": [{"path": "a", "repetitions": 1}, {"path": "b", "repetitions": 2}]},
        {"blend": [{"path": "c", "weight": 1}, {"path": "a", "weight": 1}], "until": {"iterations": 30}},
        {"blend": [{"path": "c", "weight": 1}]}]}, 200, gbs=4, spe=spe)
    ids = np.asarray(idx.dataset_index)
    samples = np.asarray(idx.dataset_sample_index)
    assert set(ids[:55].tolist()) == {0, 1} and (np.bincount(ids[:55]) == [25, 30]).all()
    assert set(ids[55:120].tolist()) == {0, 2}
    assert set(ids[120:].tolist()) == {2}
    # "a" continues where the first stage stopped
    np.testing.assert_array_equal(np.sort(samples[ids == 0]), np.arange((ids == 0).sum()))
    np.testing.assert_array_equal(samples[ids == 2], np.arange((ids == 2).sum()))


def test_sequential_too_short_is_an_error():
    with pytest.raises(BlendConfigError, match="stages provide 10 samples but the run needs 50"):
        _fake_index({"sequential": [{"epochized_blend": [{"path": "a", "repetitions": 1}]}]}, 50,
                    spe=10)


# --- real datasets ------------------------------------------------------------------------------
def test_static_blend_equals_megatron_blended_dataset(data, tmp_path):
    """Within every dataset's first epoch, a static blend is megatron-core's BlendedDataset over
    GPTDatasets sample by sample: the same index (build_blending_indices' rule) and the same
    tokens (one-epoch GPTDataset windows and shuffle)."""
    cfg = parse_blend_config({"train": {"blend": [{"path": data["a"], "weight": 0.3},
                                                  {"path": data["b"], "weight": 0.5},
                                                  {"path": data["c"], "weight": 0.2}]}}, "s.yaml")
    gc = _gpt_config(tmp_path / "cache")
    N = 100
    ours = build_curriculum_dataset(cfg.train, N, gc, BatchSchedule(4, None, SEQ))
    assert max(ours.epochs.values()) <= 1.0
    low = {p: IndexedDataset(p) for p in (data["a"], data["b"], data["c"])}
    gpts = [GPTDataset(low[p], p, np.arange(len(low[p].sequence_lengths), dtype=np.int32), int(n),
                       Split.train, gc) for p, n in zip((data["a"], data["b"], data["c"]), ours.counts, strict=True)]
    ref = BlendedDataset(gpts, [0.3, 0.5, 0.2], N, gc)
    np.testing.assert_array_equal(np.asarray(ours.dataset_index), ref.dataset_index)
    np.testing.assert_array_equal(np.asarray(ours.dataset_sample_index), ref.dataset_sample_index)
    for i in range(N):
        a, b = ours[i], ref[i]
        assert int(a["dataset_id"]) == int(b["dataset_id"])
        assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["labels"], b["labels"])


def test_epochs_past_the_first_reshuffle_the_first_epochs_windows(data, tmp_path):
    """Sample k of a dataset is position k % n of epoch k // n whatever the run draws: epoch 0 is
    the one-epoch GPTDataset, every later epoch the same n windows in a fresh order (each once),
    and the samples of a dataset built for fewer samples are the same."""
    cfg = parse_blend_config({"train": {"blend": [{"path": data["c"], "weight": 1}]}}, "e.yaml")
    gc = _gpt_config(tmp_path / "cache")
    bs = BatchSchedule(4, None, SEQ)
    long = build_curriculum_dataset(cfg.train, 400, gc, bs)
    short = build_curriculum_dataset(cfg.train, 37, gc, bs)
    n = long.constituents[0].samples_per_epoch
    assert long.epochs["c"] == 400 / n > 3
    source = long.datasets[0]
    # a window is told apart by the (document, first token, last token) ranges it reads
    epoch0 = [str(gpt_sample_documents(source.epoch_dataset, p)) for p in range(n)]
    assert len(set(epoch0)) == n
    for e in range(3):
        order = [epoch0.index(str(source.sample_documents(e * n + p))) for p in range(n)]
        assert sorted(order) == list(range(n))
        assert (order == list(range(n))) == (e == 0)
    for i in range(37):
        assert short.datasets[0].sample_documents(i) == source.sample_documents(i)
        assert torch.equal(short[i]["tokens"], long[i]["tokens"])


def test_split_ranges_select_documents_by_position(data, tmp_path):
    cfg = parse_blend_config({"valid": [{"name": "head", "path": data["b"], "split": "0:0.5"},
                                        {"name": "tail", "path": data["b"], "split": "0.5:1"}]}, "v.yaml")
    gc = _gpt_config(tmp_path / "cache")
    head = build_curriculum_dataset(cfg.valid[0], 20, gc, BatchSchedule(4, None, SEQ), "valid")
    tail = build_curriculum_dataset(cfg.valid[1], 20, gc, BatchSchedule(4, None, SEQ), "valid")
    assert head.index.constituents[0].doc_begin == 0 and head.index.constituents[0].doc_end == 30
    assert tail.index.constituents[0].doc_begin == 30 and tail.index.constituents[0].doc_end == 60
    g_head, g_tail = head.datasets[0].epoch_dataset, tail.datasets[0].epoch_dataset
    assert set(np.asarray(g_head.document_index).tolist()) <= set(range(30))
    assert set(np.asarray(g_tail.document_index).tolist()) <= set(range(30, 60))
    assert head.names == ["b"] and tail.names == ["b"]  # one range per set: the short name


def test_two_ranges_of_one_prefix_get_distinct_names(data):
    blend = parse_blend_config({"train": {"blend": [
        {"path": data["b"], "split": "0:0.5", "weight": 1},
        {"path": data["b"], "split": "0.5:1", "weight": 1}]}}, "t.yaml").train
    assert [c.name for c in resolve_constituents(blend, 8)] == ["b", "b[0.5:1]"]


def _schedule_cfg(data, until=None):
    return parse_blend_config({"train": {"blend": [
        {"path": data["a"], "weight": 1},
        {"path": data["b"], "weight": {"type": "linear", "points": {0: 5, 20: 0.2}}},
        {"path": data["c"], "weight": {"type": "step", "unit": "samples", "points": {0: 0, 40: 2}}},
    ]}}, "r.yaml")


def test_resume_and_data_parallel_give_the_same_sequence(data, tmp_path):
    gc = _gpt_config(tmp_path / "cache")
    ds = build_curriculum_dataset(_schedule_cfg(data).train, 240, gc, BatchSchedule(8, None, SEQ))
    full = [int(ds[i]["dataset_id"]) * 10 ** 6 + int(ds[i]["tokens"].sum()) for i in range(240)]

    def global_sequence(consumed, dp, mbs=2):
        per_rank = [list(PretrainingBatchSampler(240, consumed, mbs, r, dp)) for r in range(dp)]
        seq = []
        for step in zip(*per_rank, strict=False):
            for batch in step:
                seq.extend(int(ds[i]["dataset_id"]) * 10 ** 6 + int(ds[i]["tokens"].sum()) for i in batch)
        return seq

    assert global_sequence(0, 1) == full
    assert global_sequence(0, 2) == full
    for consumed in (8, 96, 200):
        assert global_sequence(consumed, 2) == full[consumed:]
        assert global_sequence(consumed, 1) == full[consumed:]


def test_cache_reuse_invalidation_and_half_written(data, tmp_path):
    cache = tmp_path / "cache"
    gc = _gpt_config(cache)
    bs = BatchSchedule(8, None, SEQ)
    first = build_curriculum_dataset(_schedule_cfg(data).train, 240, gc, bs)
    first_ids = np.array(first.dataset_index)
    assert not first.index.cache_hit and os.path.isdir(first.index.cache_path)
    again = build_curriculum_dataset(_schedule_cfg(data).train, 240, gc, bs)
    assert again.index.cache_hit and again.index.cache_path == first.index.cache_path
    np.testing.assert_array_equal(np.asarray(again.dataset_index), first_ids)
    # a different config, length or batch schedule -> a different cache entry
    other_cfg = parse_blend_config({"train": {"blend": [{"path": data["a"], "weight": 1},
                                                        {"path": data["b"], "weight": 2}]}}, "r.yaml")
    for other in (build_curriculum_dataset(other_cfg.train, 240, gc, bs),
                  build_curriculum_dataset(_schedule_cfg(data).train, 248, gc, bs),
                  build_curriculum_dataset(_schedule_cfg(data).train, 240, gc, BatchSchedule(4, None, SEQ))):
        assert not other.index.cache_hit and other.index.cache_path != first.index.cache_path
    # a half-written entry (truncated array) is ignored and rebuilt
    path = first.index.cache_path
    ids_file = os.path.join(path, "dataset_index.npy")
    with open(ids_file, "r+b") as f:
        f.truncate(os.path.getsize(ids_file) // 2)
    rebuilt = build_curriculum_dataset(_schedule_cfg(data).train, 240, gc, bs)
    assert not rebuilt.index.cache_hit
    np.testing.assert_array_equal(np.asarray(rebuilt.dataset_index), first_ids)
    # an entry without its completion marker is ignored too
    os.unlink(os.path.join(path, "meta.json"))
    assert not build_curriculum_dataset(_schedule_cfg(data).train, 240, gc, bs).index.cache_hit
    assert build_curriculum_dataset(_schedule_cfg(data).train, 240, gc, bs).index.cache_hit
    # leftovers of an interrupted write (temp dirs) are never read
    leftovers = [n for n in os.listdir(cache) if ".tmp-" in n]
    assert leftovers == []


def test_negative_schedule_value_is_an_error(data, tmp_path, monkeypatch):
    cfg = parse_blend_config({"train": {"blend": [
        {"path": data["a"], "weight": 1},
        {"path": data["b"], "weight": {"type": "cosine", "from": 1.0, "to": 0.5}}]}}, "n.yaml")

    class Negative:
        unit = "iterations"

        def __call__(self, p):
            return 1.0 - np.asarray(p, dtype=np.float64) / 5.0

    monkeypatch.setattr(curriculum_index, "weight_schedule",
                        lambda config, context: Negative() if isinstance(config, dict) else
                        curriculum_index._standin_schedule(config))
    with pytest.raises(BlendConfigError, match=r"n.yaml: train.blend\[1\].weight: .*negative"):
        build_curriculum_dataset(cfg.train, 100, _gpt_config(tmp_path / "c"), BatchSchedule(4, None, SEQ))


def test_target_weights_preview(data, tmp_path):
    ds = build_curriculum_dataset(_schedule_cfg(data).train, 240, _gpt_config(tmp_path / "c"),
                                  BatchSchedule(8, None, SEQ))
    tw = ds.target_weights([0, 39, 40, 239])
    np.testing.assert_allclose(tw.sum(axis=0), 1.0)
    np.testing.assert_allclose(tw[:, 0], [1 / 6, 5 / 6, 0.0])
    assert tw[2, 2] > 0 and tw[2, 1] == 0


def test_blend_file_end_to_end_epochized_and_groups(data, tmp_path):
    import yaml

    from megatron.data.blend_config import load_blend_config
    from megatron.data.curriculum.dataset import build_blend_config_datasets

    path = tmp_path / "blend.yaml"
    path.write_text(yaml.safe_dump({
        "train": {"epochized_blend": [{"path": data["a"], "repetitions": 2, "split": "0:0.9"},
                                      {"path": data["c"], "repetitions": 1}]},
        "valid": [{"name": "a_tail", "path": data["a"], "split": "0.9:1"},
                  {"name": "mix", "blend": [{"path": data["b"], "weight": 1},
                                            {"path": data["c"], "weight": 1}]}],
        "test": [{"name": "b", "path": data["b"]}]}))
    cfg = load_blend_config(str(path))
    gc = _gpt_config(tmp_path / "cache")
    bs = BatchSchedule(4, None, SEQ)
    probe = CurriculumIndex(cfg.train, resolve_constituents(cfg.train, SEQ), 1, bs)
    n_train = int(sum(c.samples_per_epoch * r for c, r in zip(probe.constituents, (2, 1), strict=True)))
    train, valid, test = build_blend_config_datasets(cfg, (n_train, 12, 8), gc, bs)
    # one epoch as GPTDataset counts it
    for c, ds in zip(train.index.constituents, train.datasets, strict=True):
        one = GPTDataset(ds.epoch_dataset.dataset, f"probe-{c.name}", np.arange(c.doc_begin, c.doc_end, dtype=np.int32),
                         None, Split.train, gc)
        assert len(one) == c.samples_per_epoch
    assert train.epochs == {"a": 2.0, "c": 1.0}
    assert [n for n, _ in valid] == ["a_tail", "mix"] and [n for n, _ in test] == ["b"]
    assert len(valid[0][1]) == 12 and len(test[0][1]) == 8
    assert valid[1][1].counts.tolist() == [6, 6]
    train[n_train - 1]


def test_zero_static_weight_is_never_drawn_and_registry_schedules_work():
    idx = _fake_index({"blend": [{"path": "a", "weight": 1}, {"path": "z", "weight": 0},
                                 {"path": "b", "weight": 2}]}, 500)
    assert idx.counts.tolist()[1] == 0 and idx.counts.sum() == 500
    # a registry schedule that needs the run's span (cosine over the whole run, in samples)
    idx = _fake_index({"blend": [{"path": "a", "weight": 1},
                                 {"path": "b", "weight": {"type": "cosine", "unit": "samples",
                                                          "from": 3.0, "to": 0.0}}]}, 400)
    tw = idx.target_weights([0, 399])
    np.testing.assert_allclose(tw[:, 0], [0.25, 0.75])
    assert tw[1, 1] < 1e-3
    assert prefix_error(idx).max() <= 2.0


# --- piecewise-linear fast path (samples/tokens units) -------------------------------------------
def _fast_path_weight(kind, unit, pts, span):
    """A samples/tokens-unit weight schedule of a piecewise-linear kind (breakpoints anywhere,
    also between samples for tokens)."""
    points = {float(x) * span / 400.0: v for x, v in sorted(pts)}
    if kind in ("linear", "step", "piecewise-linear"):
        return {"type": kind, "unit": unit, "points": points}
    xs = sorted(points)
    if kind == "decay":  # linear from/to with a warmup ramp: breakpoints at warmup and span
        return {"type": "linear", "unit": unit, "from": pts[0][1], "to": pts[-1][1],
                "warmup": xs[0] / 2, "warmup_from": pts[-1][1], "span": xs[-1] + 1.0}
    if kind == "warmup":
        return {"type": "constant", "unit": unit, "value": pts[0][1], "warmup": xs[-1] + 0.5}
    # staged: a step, then (when it starts before the end of training) a linear decay
    stages = [{"start": 0, "schedule": {"type": "step", "points": {0: pts[0][1], xs[0] / 2: pts[-1][1]}}}]
    second = min(xs[-1] + 1.0, span - 1.0)
    if second > 0:
        stages.append({"start": second, "schedule": {"type": "linear", "from": pts[0][1], "to": 0.0}})
    return {"type": "staged", "unit": unit, "stages": stages}


_fast_sched = st.tuples(
    st.sampled_from(["linear", "step", "piecewise-linear", "decay", "warmup", "staged"]),
    st.sampled_from(["samples", "tokens", "iterations"]),
    st.lists(st.tuples(st.integers(0, 440), st.sampled_from([0.0, 0.05, 1.0, 3.0, 100.0])),
             min_size=1, max_size=4, unique_by=lambda p: p[0]))


def _run_both_paths(entries, N, gbs, rampup, chunk):
    old_chunk = curriculum_index.CHUNK
    curriculum_index.CHUNK = chunk
    try:
        out = {}
        for fast in (True, False):
            CurriculumIndex.linear_fast_path = fast
            out[fast] = _fake_index({"blend": entries}, N, gbs, rampup=rampup)
    finally:
        curriculum_index.CHUNK = old_chunk
        CurriculumIndex.linear_fast_path = True
    return out[True], out[False]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheds=st.lists(st.one_of(_fast_sched, st.sampled_from([0.5, 7.0])), min_size=1, max_size=7),
       N=st.integers(1, 1500), gbs=st.integers(1, 9), ramp=st.booleans(),
       chunk=st.sampled_from([1 << 20, 64, 7]))
def test_linear_fast_path_bounds_and_agrees_with_per_sample_path(scheds, N, gbs, ramp, chunk):
    entries = []
    for k, s in enumerate(scheds):
        if isinstance(s, tuple):
            kind, unit, pts = s
            span = {"iterations": max(N // gbs, 1), "samples": N, "tokens": N * SEQ}[unit]
            s = _fast_path_weight(kind, unit, pts, span)
        entries.append({"path": f"d{k}", "weight": s})
    entries.append({"path": "floor", "weight": 0.01})
    rampup = (1, 1, 3 * gbs) if ramp and gbs > 1 else None
    fast, slow = _run_both_paths(entries, N, gbs, rampup, chunk)
    for idx in (fast, slow):
        err = prefix_error(idx)
        assert err.max() <= 2.0 + 1e-9, err.max()
        assert (-err).max() <= 1.0 + 1e-9, (-err).max()
        assert len(idx.dataset_index) == N and idx.counts.sum() == N
        np.testing.assert_array_equal(idx.counts, np.bincount(np.asarray(idx.dataset_index),
                                                              minlength=len(idx.constituents)))
    # both track the same per-sample target, so their counts never differ by 3 or more
    D = len(fast.constituents)
    c_fast = np.cumsum(np.eye(D, dtype=np.int64)[np.asarray(fast.dataset_index)], axis=0)
    c_slow = np.cumsum(np.eye(D, dtype=np.int64)[np.asarray(slow.dataset_index)], axis=0)
    assert np.abs(c_fast - c_slow).max(initial=0) <= 2
    for d, ds_fast in enumerate(fast.counts):  # dataset sample ids stay 0..count-1 in order
        np.testing.assert_array_equal(
            np.asarray(fast.dataset_sample_index)[np.asarray(fast.dataset_index) == d],
            np.arange(ds_fast))


def _count_evaluations(monkeypatch):
    seen = {"samples": 0, "linear": 0}
    raw, linear = CurriculumIndex._raw_weights, CurriculumIndex._build_linear

    def counting_raw(self, plan, samples, check=True):
        seen["samples"] += len(samples)
        return raw(self, plan, samples, check)

    def counting_linear(self, *args):
        seen["linear"] += 1
        return linear(self, *args)

    monkeypatch.setattr(CurriculumIndex, "_raw_weights", counting_raw)
    monkeypatch.setattr(CurriculumIndex, "_build_linear", counting_linear)
    return seen


def test_linear_fast_path_evaluates_segment_ends_only(monkeypatch):
    seen = _count_evaluations(monkeypatch)
    N = 300_000
    idx = _fake_index({"blend": [
        {"path": "a", "weight": 2.0},
        {"path": "b", "weight": {"type": "linear", "unit": "samples", "points": {0: 10, N // 3: 1, N: 0}}},
        {"path": "c", "weight": {"type": "step", "unit": "tokens",
                                 "points": {0: 1, N * SEQ // 2 + 3: 5, 3 * N * SEQ // 4: 0.5}}}]}, N)
    assert seen["linear"] == 1 and seen["samples"] < 100, seen
    err = prefix_error(idx)
    assert err.max() <= 2.0 and (-err).max() <= 1.0
    # a schedule that is not piecewise linear (cosine) or caps (epochized) keep the per-sample path
    seen.update(samples=0, linear=0)
    _fake_index({"blend": [{"path": "a", "weight": 1.0},
                           {"path": "b", "weight": {"type": "cosine", "unit": "samples", "from": 3.0}}]}, 500)
    assert seen["linear"] == 0 and seen["samples"] >= 500
    _fake_index({"epochized_blend": [
        {"path": "a", "repetitions": 1, "weight": 1},
        {"path": "b", "repetitions": 1, "weight": {"type": "linear", "unit": "samples", "points": {0: 0, 10: 5}}}]},
        200, spe=100)
    assert seen["linear"] == 0


@pytest.mark.parametrize("chunk", [1 << 20, 50])
def test_python_fallback_matches_compiled_linear_fast_path(monkeypatch, chunk):
    blend = {"blend": [
        {"path": "a", "weight": {"type": "linear", "points": {0: 1, 20: 5}}},  # iterations unit
        {"path": "b", "weight": {"type": "step", "unit": "tokens", "points": {0: 2, 50 * SEQ + 3: 0, 120 * SEQ: 1}}},
        {"path": "c", "weight": {"type": "linear", "unit": "samples", "from": 0.0, "to": 4.0, "warmup": 30,
                                 "warmup_from": 2.0}},
        {"path": "d", "weight": {"type": "staged", "unit": "samples", "stages": [
            {"start": 0, "schedule": 0.3}, {"start": 200, "schedule": {"type": "linear", "from": 3, "to": 0}}]}}]}
    monkeypatch.setattr(curriculum_index, "CHUNK", chunk)
    fast = _fake_index(blend, 400, rampup=(1, 1, 12))
    monkeypatch.setitem(curriculum_kernel._KERNEL, "fn", None)
    slow = _fake_index(blend, 400, rampup=(1, 1, 12))
    np.testing.assert_array_equal(np.asarray(fast.dataset_index), np.asarray(slow.dataset_index))
    np.testing.assert_array_equal(np.asarray(fast.dataset_sample_index),
                                  np.asarray(slow.dataset_sample_index))
    err = prefix_error(fast)
    assert err.max() <= 2.0 and (-err).max() <= 1.0


def test_data_path_blends_are_megatron_cores_within_an_epoch(data, tmp_path):
    """--data-path W A W B --split: the training set and the valid/test groups are megatron-core's
    BlendedMegatronDatasetBuilder splits sample for sample while no dataset passes its first epoch
    (the same document ranges, blending rule and one-epoch GPTDatasets), now with the ledger."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

    from megatron.config.parser import parse_args
    from megatron.data.builder import build_pretraining_data, gpt_dataset_config, train_valid_test_num_samples

    args = parse_args(["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
                       "--seq-length", str(SEQ), "--micro-batch-size", "2", "--global-batch-size",
                       "4", "--train-iters", "10", "--lr", "1e-3", "--eval-interval", "5",
                       "--eval-iters", "1", "--data-path", "0.3", data["a"], "0.7", data["b"],
                       "--split", "80,15,5", "--data-cache-path", str(tmp_path / "cache")])
    tokenizer = ByteLevelTokenizer()
    ours = build_pretraining_data(args.run_config.data, tokenizer)
    assert ours.mix is not None and ours.dataset_names == ["a", "b"]
    assert max(ours.train.epochs.values()) < 1
    sizes = train_valid_test_num_samples(args.run_config.data)
    ref = BlendedMegatronDatasetBuilder(GPTDataset, list(sizes), lambda: True,
                                        gpt_dataset_config(args.run_config.data, tokenizer)).build()
    groups = {g.name: g.dataset for g in ours.eval_groups}
    assert sorted(groups) == ["test", "valid"]
    for mine, theirs, n in ((ours.train, ref[0], sizes[0]), (groups["valid"], ref[1], sizes[1]),
                            (groups["test"], ref[2], sizes[2])):
        assert max(mine.epochs.values()) <= 1
        for i in range(n):
            a, b = mine[i], theirs[i]
            assert int(a["dataset_id"]) == int(b["dataset_id"]), i
            assert torch.equal(a["tokens"], b["tokens"]) and torch.equal(a["labels"], b["labels"])


@given(tokens=st.integers(1, 5000), seq=st.integers(1, 600), extra=st.booleans())
@settings(max_examples=200, deadline=None)
def test_passes_per_epoch_is_the_fewest_that_hold_a_sample(tokens, seq, extra):
    """An epoch of a dataset is the fewest passes e >= 1 over its tokens with at least one sample
    of seq + extra tokens (megatron-core's GPTDataset._get_num_epochs for one sample)."""
    from megatron.data.curriculum.constituents import passes_per_epoch

    e = passes_per_epoch(tokens, seq, extra)
    assert (e * tokens - int(extra)) // seq >= 1
    assert e == 1 or ((e - 1) * tokens - int(extra)) // seq < 1


def _short_tail_corpus(prefix, last=7):
    lengths = np.random.default_rng(3).integers(5, 40, 599).tolist() + [last]
    return write_corpus(prefix, lengths, 3)


def test_split_shorter_than_one_sample_spans_passes_as_megatron_core(tmp_path):
    """--data-path P --split 949,50,1 on 600 documents whose last one (the test split) holds 7
    tokens, fewer than one sample of 16: the test split's epochs are 3 passes over it (1 sample
    each); its first epoch's sample is megatron-core's BlendedMegatronDatasetBuilder's test
    sample for the same one-sample request, and every sample reads that document only, across
    passes."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder

    from megatron.config.parser import parse_args
    from megatron.data.builder import build_pretraining_data, gpt_dataset_config

    prefix = _short_tail_corpus(str(tmp_path / "small_text_document"))
    args = parse_args(["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
                       "--seq-length", str(SEQ), "--micro-batch-size", "2", "--global-batch-size",
                       "4", "--train-iters", "4", "--lr", "1e-3", "--eval-interval", "2",
                       "--eval-iters", "1", "--data-path", prefix, "--split", "949,50,1",
                       "--data-cache-path", str(tmp_path / "cache")])
    tokenizer = ByteLevelTokenizer()
    ours = build_pretraining_data(args.run_config.data, tokenizer)
    test = {g.name: g.dataset for g in ours.eval_groups}["test"]
    c = test.constituents[0]
    assert (c.doc_begin, c.doc_end, c.tokens, c.passes, c.samples_per_epoch) == (599, 600, 7, 3, 1)
    ref = BlendedMegatronDatasetBuilder(GPTDataset, [1, 1, 1], lambda: True,
                                        gpt_dataset_config(args.run_config.data, tokenizer)).build()[2]
    assert len(ref) == 1 and torch.equal(test[0]["tokens"], ref[0]["tokens"])
    low_level = IndexedDataset(prefix)  # kept: its tokens are views of its memory map
    tokens = low_level.get(599)
    for i in range(len(test)):
        docs = test.datasets[0].sample_documents(i)
        assert {d for d, _, _ in docs} == {599} and sum(b - a + 1 for _, a, b in docs) == SEQ + 1
        sample = np.concatenate([tokens[a:b + 1] for _, a, b in docs])
        assert np.array_equal(test[i]["tokens"].numpy(), sample[:-1])


def test_empty_split_is_refused_naming_what_to_change(data):
    """Only a range that selects no document (or no token) is refused: one error naming the
    range and what to change."""
    blend = parse_blend_config({"valid": [{"name": "v", "path": data["c"], "split": "0.999:1"}]},
                               "v.yaml").valid[0]
    with pytest.raises(BlendConfigError) as err:
        resolve_constituents(blend, SEQ)
    assert "selects no document" in str(err.value) and "--split" in str(err.value)


def test_blocked_and_linear_cuts_share_the_breakpoints():
    """Both cut rules read one list of breakpoints (CurriculumIndex._breakpoints): a samples-unit
    step at 250.5 and a ramp ending at 600 (samples), a tokens-unit step at 100 samples of SEQ
    tokens, and a smooth cosine (no breakpoints). The blocked order's block starts are ceil(x) - 1
    to ceil(x) + 1 (stage-local, inside the stage); the linear fast path's segment starts are
    floor(x) - 1 to floor(x) + 2 (global), and it declines a stage with a smooth schedule."""
    blend = {"blend": [
        {"path": "a", "weight": {"type": "step", "unit": "samples", "points": {0: 1, 250.5: 3}}},
        {"path": "b", "weight": {"type": "linear", "unit": "samples", "points": {0: 1, 600: 2}}},
        {"path": "c", "weight": {"type": "step", "unit": "tokens", "points": {0: 2, 100 * SEQ: 1}}},
        {"path": "d", "weight": 1.0}]}
    idx = fake_index(blend, 1000, 4, seq=SEQ, order="blocked")
    plan = idx.plans[0]
    assert [unit for unit, _ in idx._breakpoints(plan)] == ["samples", "samples", "tokens"]
    xs = [0.0, 250.5, 0.0, 600.0, 0.0, 100.0]  # every breakpoint, as a sample position
    expected = {int(np.ceil(x)) + k for x in xs for k in (-1, 0, 1)}
    np.testing.assert_array_equal(idx._blocked_cuts(plan),
                                  sorted(c for c in expected if 0 < c < 1000))
    segments, iterations = idx._linear_segments(plan)
    assert not iterations
    np.testing.assert_array_equal(segments, sorted({int(np.floor(x)) + k for x in xs
                                                    for k in (-1, 0, 1, 2)}))
    blend["blend"][3]["weight"] = {"type": "cosine", "unit": "samples", "from": 1.0, "to": 2.0}
    smooth = fake_index(blend, 1000, 4, seq=SEQ, order="blocked")
    assert smooth._breakpoints(smooth.plans[0])[3] == ("samples", None)
    assert smooth._linear_segments(smooth.plans[0]) is None


def test_linear_fast_path_cuts_each_stage_at_its_own_breakpoints():
    """Two sequential stages giving datasets a and b other samples-unit ramps: each stage's
    segments are cut at its own schedules' breakpoints (a stage once took another stage's
    schedule for its second dataset from the schedule memo), so the fast path tracks the same
    per-sample target as evaluating every sample."""
    def ramp(points):
        return {"type": "linear", "unit": "samples", "points": points}

    blend = {"sequential": [
        {"blend": [{"path": "a", "weight": ramp({0: 1, 400: 5})},
                   {"path": "b", "weight": ramp({0: 5, 400: 1})}], "until": {"samples": 400}},
        {"blend": [{"path": "a", "weight": ramp({400: 1, 600: 9, 800: 1})},
                   {"path": "b", "weight": ramp({400: 9, 500: 0.1, 800: 9})}]}]}
    out = {}
    try:
        for fast in (True, False):
            CurriculumIndex.linear_fast_path = fast
            out[fast] = _fake_index(blend, 800, 4)
    finally:
        CurriculumIndex.linear_fast_path = True
    for idx in out.values():
        err = prefix_error(idx)
        assert err.max() <= 2.0 + 1e-9 and (-err).max() <= 1.0 + 1e-9, (err.max(), err.min())
    c = {k: np.cumsum(np.eye(2, dtype=np.int64)[np.asarray(v.dataset_index)], axis=0)
         for k, v in out.items()}
    assert np.abs(c[True] - c[False]).max() <= 2


def test_drawn_before_counts_either_side_of_the_index():
    """The ledger at a sample (CurriculumIndex.drawn_before, and CurriculumDataset's, which goes
    on from its last answer when that is shorter) is the base plus the samples before it, whether
    it counts them or takes the samples after it from the totals; for a continuation index too."""
    from helpers.curriculum import fake_constituents
    from megatron.data.blend_config import parse_blend_config
    from megatron.data.curriculum.dataset import CurriculumDataset
    from megatron.schedules.units import BatchSchedule

    blend = parse_blend_config({"train": {"blend": [{"path": f"p{d}", "weight": 1 + d}
                                                    for d in range(5)]}},
                               "t.yaml", check_files=False).train
    for begin, base in ((0, [0] * 5), (300, [50, 60, 70, 60, 60])):
        idx = CurriculumIndex(blend, fake_constituents(blend, 10 ** 6, SEQ), 2000,
                              BatchSchedule(4, None, SEQ), begin=begin, base=base)
        ids = np.asarray(idx.dataset_index)
        ds = CurriculumDataset(idx, [None] * 5)
        for s in (begin, begin + 1, 1200, 1999, 2000, 700, 1900, 1901, begin + 3):
            want = np.asarray(base) + np.bincount(ids[:s - begin], minlength=5)
            np.testing.assert_array_equal(idx.drawn_before(s), want)
            np.testing.assert_array_equal(ds.drawn_before(s), want)
