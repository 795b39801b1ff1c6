"""The blocked order of the curriculum index (megatron/data/curriculum/blocked.py): its kernel
against its Python twin, Tijdeman's in-block bound, the bounds against the exact per-sample
target, epochized and sequential stages, a continuation, ``auto``, the cache written in place,
and a resumed run keeping the order its checkpoint's mix was drawn in."""
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers.curriculum import fake_constituents, fake_index, prefix_error, random_schedules, schedule_entries
from megatron.data.blend_config import BlendConfigError, parse_blend_config
from megatron.data.curriculum import blocked
from megatron.data.curriculum.index import CurriculumIndex
from megatron.data.mix_ledger import MixRecord
from megatron.data.mix_resume import DataResume, MixSources, continue_training_mix
from megatron.errors import ConfigError
from megatron.schedules.units import BatchSchedule

SEQ = 16


def _random_quotas(rng, D, nb):
    lens = rng.integers(1, 3000, nb)
    quotas = np.zeros((nb, D), dtype=np.int64)
    for b in range(nb):
        w = rng.pareto(0.8, D) * (rng.random(D) < 0.7) + 1e-9
        quotas[b] = blocked.apportion(w / w.sum() * lens[b], int(lens[b]))
    return lens, quotas


def test_kernel_equals_python_twin_and_tijdeman_bound_holds_in_every_block():
    rng = np.random.default_rng(3)
    for _ in range(25):
        D, nb = int(rng.integers(1, 60)), int(rng.integers(1, 4))
        lens, quotas = _random_quotas(rng, D, nb)
        gid = rng.permutation(D)
        out = []
        for use_kernel in (True, False):
            counts = np.arange(D, dtype=np.int64) * 10
            ids = np.empty(lens.sum(), dtype=np.int16)
            samples = np.empty(lens.sum(), dtype=np.int64)
            blocked.fill_blocks(lens, quotas, gid, counts, ids, samples, use_kernel)
            out.append((ids, samples, counts))
        for a, b in zip(*out, strict=True):
            np.testing.assert_array_equal(a, b)
        ids, samples, counts = out[0]
        totals = quotas.sum(axis=0)
        np.testing.assert_array_equal(counts, np.arange(D) * 10 + totals)
        for d in range(D):  # each dataset's samples numbered on from where it stood, in order
            np.testing.assert_array_equal(samples[ids == gid[d]], d * 10 + np.arange(totals[d]))
        o = 0
        for L, q in zip(lens, quotas, strict=True):
            m = int((q > 0).sum())
            block = ids[o:o + L]
            for d in np.flatnonzero(q):
                c = np.cumsum(block == gid[d])
                line = q[d] * np.arange(1, L + 1) / L
                # Tijdeman: never a full sample from the quota's straight line (1 - 1/(2m - 2))
                bound = 1 - 1 / (2 * m - 2) if m > 1 else 0
                assert np.abs(c - line).max() <= bound + 1e-9
            o += L


def test_apportion_sums_to_the_block_and_rounds_to_the_nearest_side():
    rng = np.random.default_rng(0)
    for _ in range(200):
        D = int(rng.integers(1, 40))
        total = int(rng.integers(1, 5000))
        need = rng.dirichlet(np.ones(D)) * total + rng.uniform(-0.9, 0.9, D)
        need *= total / need.sum()
        n = blocked.apportion(need, total)
        assert n.sum() == total and (n >= 0).all()
        assert (np.abs(n - need)[need >= 0] < 2).all()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scheds=random_schedules(), N=st.integers(1, 3000), gbs=st.integers(1, 9))
def test_blocked_counts_track_the_exact_target_within_the_documented_bound(scheds, N, gbs):
    idx = fake_index({"blend": schedule_entries(scheds, gbs, SEQ)}, N, gbs, seq=SEQ, order="blocked")
    assert idx.order == "blocked"
    err = prefix_error(idx)
    # the carry (< 1) + Tijdeman in the block (< 1) + the block's straight line (<= 0.25)
    assert err.max() <= 2.25 and (-err).max() <= 2.25, (err.max(), (-err).max())
    assert len(idx.dataset_index) == N and idx.counts.sum() == N
    for d in range(len(idx.constituents)):  # every dataset's samples in order, none repeated
        own = np.asarray(idx.dataset_sample_index)[np.asarray(idx.dataset_index) == d]
        np.testing.assert_array_equal(own, np.arange(len(own)))


def test_static_weights_at_many_datasets_stay_within_two_samples():
    rng = np.random.default_rng(1)
    w = np.sort(rng.pareto(0.7, 300))[::-1] + 1e-4
    idx = fake_index({"blend": [{"path": f"p{d}", "weight": float(x)} for d, x in enumerate(w)]},
                     200_000, order="blocked")
    ids = np.asarray(idx.dataset_index)
    target = w / w.sum()
    for d in (0, 1, 2, 150, 299):
        lag = np.arange(1, len(ids) + 1) * target[d] - np.cumsum(ids == d)
        assert np.abs(lag).max() < 2.0, (d, np.abs(lag).max())


def test_epochized_and_sequential_stages_in_the_blocked_order():
    spe = {"a": 30, "b": 70, "c": 11}
    idx = fake_index({"epochized_blend": [{"path": "a", "repetitions": 2},
                                          {"path": "b", "repetitions": 1},
                                          {"path": "c", "repetitions": 3}]}, 60 + 70 + 33, spe=spe,
                     seq=SEQ, order="blocked")
    assert idx.counts.tolist() == [60, 70, 33] and idx.epochs == {"a": 2.0, "b": 1.0, "c": 3.0}
    ids = np.asarray(idx.dataset_index)
    for d in range(3):  # default weights follow the repetitions: they finish together
        assert np.nonzero(ids == d)[0].max() >= len(ids) - 8
    spe = {"a": 25, "b": 15, "c": 10 ** 6}
    idx = fake_index({"sequential": [
        {"epochized_blend": [{"path": "a", "repetitions": 1}, {"path": "b", "repetitions": 2}]},
        {"blend": [{"path": "c", "weight": 1}, {"path": "a", "weight": 1}], "until": {"iterations": 30}},
        {"blend": [{"path": "c", "weight": 1}]}]}, 200, gbs=4, spe=spe, seq=SEQ, order="blocked")
    ids, samples = np.asarray(idx.dataset_index), np.asarray(idx.dataset_sample_index)
    assert set(ids[:55].tolist()) == {0, 1} and (np.bincount(ids[:55]) == [25, 30]).all()
    assert set(ids[55:120].tolist()) == {0, 2} and set(ids[120:].tolist()) == {2}
    np.testing.assert_array_equal(np.sort(samples[ids == 0]), np.arange((ids == 0).sum()))


def test_an_epochized_stage_with_a_schedule_keeps_its_repetitions():
    spe = {"a": 50, "b": 40}
    idx = fake_index({"epochized_blend": [
        {"path": "a", "repetitions": 1, "weight": 1},
        {"path": "b", "repetitions": 2, "weight": {"type": "linear", "points": {0: 0, 10: 5}}}]},
        130, gbs=4, spe=spe, seq=SEQ, order="blocked")
    assert idx.counts.tolist() == [50, 80]


def test_all_weights_zero_is_the_greedy_orders_error():
    blend = {"blend": [{"path": "a", "weight": {"type": "step", "unit": "samples",
                                                "points": {0: 1, 40: 0}}},
                       {"path": "b", "weight": {"type": "step", "unit": "samples",
                                                "points": {0: 1, 40: 0}}}]}
    messages = []
    for order in ("greedy", "blocked"):
        with pytest.raises(BlendConfigError) as error:
            fake_index(blend, 100, seq=SEQ, order=order)
        messages.append(str(error.value))
    assert messages[0] == messages[1] and "all weights are zero at sample 40" in messages[0]


def _big_blend(D):
    """D datasets over three sequential stages: an epochized one, a ramp in samples, a step in
    iterations with skewed static weights."""
    rng = np.random.default_rng(D)
    w = np.sort(rng.pareto(0.7, D))[::-1] + 1e-4
    return {"sequential": [
        {"epochized_blend": [{"path": f"p{d}", "repetitions": 1} for d in range(0, D, 512)]},
        {"blend": [{"path": f"p{d}", "weight": {"type": "linear", "unit": "samples",
                                                "points": {0: float(w[d]), 9000: float(w[-d - 1])}}}
                   for d in range(D)], "until": {"samples": 12000}},
        {"blend": [{"path": f"p{d}", "weight": {"type": "step", "points": {0: float(w[d]),
                                                                          3500: float(w[-d - 1])}}}
                   for d in range(D)]}]}


def test_compiled_blocked_build_equals_the_python_reference_at_4096_datasets(monkeypatch):
    D = 4096
    spe = {f"p{d}": 3 + d % 5 for d in range(D)}
    N, gbs = 16000, 4
    cfg = parse_blend_config({"train": _big_blend(D)}, "t.yaml", check_files=False).train
    cons = fake_constituents(cfg, spe, SEQ)
    bs = BatchSchedule(gbs, None, SEQ)
    fast = CurriculumIndex(cfg, cons, N, bs, order="blocked")
    # an edit at 60%: the continuation from the ledger, built both ways too
    begin = int(N * 0.6)
    base = fast.drawn_before(begin)
    edited_fast = CurriculumIndex(cfg, cons, N, bs, order="blocked", begin=begin, base=base)
    monkeypatch.setitem(blocked._KERNEL, "fn", None)
    slow = CurriculumIndex(cfg, cons, N, bs, order="blocked")
    edited_slow = CurriculumIndex(cfg, cons, N, bs, order="blocked", begin=begin, base=base)
    for a, b in ((fast, slow), (edited_fast, edited_slow)):
        np.testing.assert_array_equal(np.asarray(a.dataset_index), np.asarray(b.dataset_index))
        np.testing.assert_array_equal(np.asarray(a.dataset_sample_index),
                                      np.asarray(b.dataset_sample_index))
    # the epochized stage gives each of its datasets exactly one epoch
    epochized = [f"p{d}" for d in range(0, D, 512)]
    first = sum(spe[name] for name in epochized)
    drawn = np.bincount(np.asarray(fast.dataset_index[:first]), minlength=D)
    assert [drawn[fast.names.index(name)] for name in epochized] == [spe[n] for n in epochized]
    assert drawn.sum() == first
    # no repeat, no gap across the edit: each dataset continues at its ledger position
    ids = np.concatenate([np.asarray(fast.dataset_index[:begin]), np.asarray(edited_fast.dataset_index)])
    samples = np.concatenate([np.asarray(fast.dataset_sample_index[:begin]),
                              np.asarray(edited_fast.dataset_sample_index)])
    for d in np.unique(ids)[:: max(1, D // 64)]:
        np.testing.assert_array_equal(samples[ids == d], np.arange((ids == d).sum()))


def test_auto_takes_greedy_while_cheap_and_blocked_beyond(monkeypatch):
    assert blocked.resolve_index_order("auto", 1000, 10) == "greedy"
    assert blocked.resolve_index_order("auto", 10 ** 9, 1024) == "blocked"
    assert blocked.resolve_index_order("greedy", 10 ** 9, 1024) == "greedy"
    with pytest.raises(ValueError, match="--data-index-order: 'fast' is not one of auto, greedy, blocked"):
        blocked.resolve_index_order("fast", 10, 10)
    blend = {"blend": [{"path": "a", "weight": 1}, {"path": "b", "weight": 2}]}
    assert fake_index(blend, 500, seq=SEQ).order == "greedy"
    monkeypatch.setattr(blocked, "AUTO_GREEDY_WORK", 999)
    assert fake_index(blend, 500, seq=SEQ).order == "blocked"


def test_the_cache_is_written_in_place_and_read_back(tmp_path):
    blend = {"blend": [{"path": f"p{d}", "weight": 1 + d % 7} for d in range(40)]}
    cfg = parse_blend_config({"train": blend}, "t.yaml", check_files=False).train
    cons = fake_constituents(cfg, 10 ** 6, SEQ)
    bs = BatchSchedule(8, None, SEQ)
    plain = CurriculumIndex(cfg, cons, 300_000, bs, order="blocked")
    cached = CurriculumIndex(cfg, cons, 300_000, bs, order="blocked", cache_dir=str(tmp_path))
    again = CurriculumIndex(cfg, cons, 300_000, bs, order="blocked", cache_dir=str(tmp_path))
    assert not cached.cache_hit and again.cache_hit
    for idx in (cached, again):
        np.testing.assert_array_equal(np.asarray(idx.dataset_index), plain.dataset_index)
        np.testing.assert_array_equal(np.asarray(idx.dataset_sample_index), plain.dataset_sample_index)
    assert os.listdir(tmp_path) == [os.path.basename(cached.cache_path)]  # nothing left aside
    # the entry records the samples per dataset: a load makes no pass over the index for them
    meta = json.loads(open(os.path.join(cached.cache_path, "meta.json")).read())
    assert meta["counts"] == plain.counts.tolist() == again.counts.tolist()
    del meta["counts"]  # an entry written before counts were recorded: counted from the index
    with open(os.path.join(cached.cache_path, "meta.json"), "w") as f:
        json.dump(meta, f)
    older = CurriculumIndex(cfg, cons, 300_000, bs, order="blocked", cache_dir=str(tmp_path))
    assert older.cache_hit and older.counts.tolist() == plain.counts.tolist()


class _Source:
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, k):
        return k


def _sources(order):
    return MixSources("blend_config", lambda b: fake_constituents(b, 10 ** 6, SEQ),
                      lambda c, n, seed: _Source(n), order=order)


def _record(mix, iteration, bs):
    consumed = bs.samples_at_iteration(iteration)
    return MixRecord.from_json(json.loads(json.dumps(mix.record(iteration, consumed).to_json())))


def test_a_resume_keeps_its_checkpoints_order_and_another_is_an_edit():
    bs = BatchSchedule(4, None, SEQ)
    cfg = parse_blend_config({"train": {"blend": [{"path": "web", "weight": 3},
                                                  {"path": "code", "weight": 1}]}},
                             "t.yaml", check_files=False).train
    mix = continue_training_mix(_sources("blocked"), cfg, 400, bs, 7, None)
    assert mix.phases[0].order == "blocked" and mix.dataset.index.order == "blocked"
    record = _record(mix, 20, bs)
    assert record.phases[0].order == "blocked"
    # auto keeps the checkpoint's order: the same index, bitwise
    same = continue_training_mix(_sources("auto"), cfg, 400, bs, 7, DataResume("ckpt", 20, record))
    np.testing.assert_array_equal(same.dataset.dataset_index, mix.dataset.dataset_index)
    # a record from before orders were recorded was drawn greedy, and resumes greedy
    old = MixRecord.from_json({k: v for k, v in record.to_json().items()} | {
        "phases": [{k: v for k, v in record.phases[0].to_json().items() if k != "order"}]})
    greedy = continue_training_mix(_sources("greedy"), cfg, 400, bs, 7, None)
    resumed = continue_training_mix(_sources("auto"), cfg, 400, bs, 7, DataResume("ckpt", 20, old))
    assert resumed.dataset.index.order == "greedy"
    np.testing.assert_array_equal(resumed.dataset.dataset_index, greedy.dataset.dataset_index)
    # another order is an edit: refused in one message naming both flags, or continued from
    # the ledger under --override-data-mix with no sample repeated or skipped
    with pytest.raises(ConfigError, match=r"--data-index-order blocked -> greedy .*--override-data-mix"):
        continue_training_mix(_sources("greedy"), cfg, 400, bs, 7, DataResume("ckpt", 20, record))
    edited = continue_training_mix(_sources("greedy"), cfg, 400, bs, 7,
                                   DataResume("ckpt", 20, record, override=True))
    assert [p.order for p in edited.phases] == ["blocked", "greedy"]
    ids = np.concatenate([mix.dataset.dataset_index[:80], edited.dataset.dataset_index])
    samples = np.concatenate([mix.dataset.dataset_sample_index[:80],
                              edited.dataset.dataset_sample_index])
    for d in range(2):
        np.testing.assert_array_equal(samples[ids == d], np.arange((ids == d).sum()))


def test_the_start_up_epochs_line_of_thousands_of_datasets_stays_short():
    from megatron.data.builder import epochs_text

    few = {"web": 0.25, "code": 1.5}
    assert epochs_text(few) == "web 0.25, code 1.50"
    many = {f"ds{d:04d}": (4096 - d) / 1000 if d < 100 else 0.0 for d in range(4096)}
    text = epochs_text(many)
    assert text.startswith("ds0000 4.10, ds0001 4.09") and text.endswith("... and 4086 more (3996 not drawn)")
    assert len(text) < 300


def test_without_a_compiler_the_python_twin_serves(monkeypatch, caplog):
    from megatron.runtime import jit_ops

    def no_compiler(*args, **kwargs):
        raise OSError("no c++ compiler")

    monkeypatch.setattr(jit_ops, "load_op", no_compiler)
    monkeypatch.delitem(blocked._KERNEL, "fn", raising=False)
    assert blocked._load_kernel() is None
    assert "cannot build the blocked index kernel" in caplog.text and "no c++ compiler" in caplog.text
    lens, quotas = np.array([5]), np.array([[2, 3]])
    ids, samples = np.empty(5, dtype=np.int16), np.empty(5, dtype=np.int64)
    blocked.fill_blocks(lens, quotas, np.arange(2), np.zeros(2, dtype=np.int64), ids, samples)
    assert np.bincount(ids).tolist() == [2, 3]
