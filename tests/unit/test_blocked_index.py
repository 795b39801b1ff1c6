"""The blocked order of the curriculum index (megatron/data/curriculum/blocked.py): its kernel
against its Python twin, the in-block bound (Tijdeman's rule over groups of equal quotas, a
group's datasets in turn), the bounds against the exact per-sample target, the split of constant
weights, epochized and sequential stages, a continuation, ``auto``, the cache written in place,
batches released in order, a resumed run keeping the order its checkpoint's mix was drawn in, and
``CurriculumDataset.locate``."""
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
        _assert_in_block_bound(lens, quotas, gid, ids)


def _assert_in_block_bound(lens, quotas, gid, ids):
    """Every dataset within ``1 - 1/(K g)`` of its quota's straight line in every block: Tijdeman
    over the G groups of equal quotas (K = 2G - 2) and a group's g datasets in turn."""
    o = 0
    for L, q in zip(lens, quotas, strict=True):
        G = len(np.unique(q[q > 0]))
        block = ids[o:o + L]
        for d in np.flatnonzero(q):
            c = np.cumsum(block == gid[d])
            line = q[d] * np.arange(1, L + 1) / L
            g = int((q == q[d]).sum())
            bound = 1 - 1 / ((2 * G - 2) * g) if G > 1 else (g - 1) / g
            assert np.abs(c - line).max() <= bound + 1e-9, (d, G, g)
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


def _fill_both(lens, quotas, gid):
    """The blocks filled by the kernel and by the Python twin (asserted equal): (ids, samples)."""
    out = []
    for use_kernel in (True, False):
        counts = np.zeros(len(gid), dtype=np.int64)
        ids = np.empty(int(lens.sum()), dtype=np.int16)
        samples = np.empty(int(lens.sum()), dtype=np.int64)
        blocked.fill_blocks(lens, quotas, gid, counts, ids, samples, use_kernel)
        out.append((ids, samples))
    for a, b in zip(*out, strict=True):
        np.testing.assert_array_equal(a, b)
    return out[0]


def test_equal_quotas_form_groups_drawn_in_turn_within_the_bound():
    # thousands of small datasets of equal quotas beside a few large ones, as a skewed blend of
    # 4,096 prefixes gives: a few distinct quotas (the bucket queue) and many (the heap)
    rng = np.random.default_rng(5)
    D = 3000
    for L, heavy in ((65536, 4), (4000, 300)):
        q = np.zeros(D, dtype=np.int64)
        small = rng.choice(D, 1500, replace=False)
        q[small] = rng.integers(1, 4, len(small))
        big = rng.choice(np.setdiff1d(np.arange(D), small), heavy, replace=False)
        q[big] = blocked.apportion(rng.dirichlet(np.ones(heavy)) * (L - q.sum()), L - int(q.sum()))
        assert q.sum() == L
        gid = rng.permutation(D)
        ids, samples = _fill_both(np.array([L]), q[None, :], gid)
        assert np.bincount(ids, minlength=D)[gid].tolist() == q.tolist()
        _assert_in_block_bound(np.array([L]), q[None, :], gid, ids)
        # a group's datasets take their samples in turn, lowest dataset first
        for value in (1, 2, 3):
            members = np.flatnonzero(q == value)
            order = ids[np.isin(ids, gid[members])]
            np.testing.assert_array_equal(order, np.tile(gid[members], value))


def test_one_group_is_a_round_robin():
    lens, quotas = np.array([12]), np.array([[0, 3, 3, 0, 3, 3]])
    ids, samples = _fill_both(lens, quotas, np.arange(6))
    assert ids.tolist() == [1, 2, 4, 5] * 3 and samples.tolist() == [0] * 4 + [1] * 4 + [2] * 4


def test_smallest_is_the_head_of_a_stable_argsort():
    rng = np.random.default_rng(2)
    for _ in range(300):
        n = int(rng.integers(1, 50))
        key = rng.integers(-3, 3, n).astype(np.float64) / 2  # many ties
        if rng.random() < 0.3:
            key[rng.random(n) < 0.3] = np.inf
        k = int(rng.integers(0, n + 2))
        got = blocked._smallest(key, k)
        assert sorted(got.tolist()) == sorted(np.argsort(key, kind="stable")[:k].tolist())


def test_constant_entries_split_blocks_as_the_full_weights_do():
    # the split rule on (constant entries, scheduled entries) against the rule on every entry's
    # normalised weights: the same blocks, the same Simpson weights
    rng = np.random.default_rng(4)
    D, length = 200, 1 << 16
    static = rng.pareto(0.7, D) + 1e-4
    dynamic = np.array([3, 50, 120])
    static[dynamic] = 0.0
    slopes = rng.random((len(dynamic), 1)) * 1e-4

    def at(pos):
        return 0.5 + slopes * pos[None, :]

    weights = blocked.StageWeights(static, dynamic, at)
    s, e, inv, dyn = blocked._split_blocks(np.array([0]), np.array([length]), weights,
                                           lambda j, detail: pytest.fail("no zero weights"))
    assert len(s) > 1 and s[0] == 0 and e[-1] == length and (s[1:] == e[:-1]).all()

    def full(pos):
        raw = np.repeat(static[:, None], len(pos), axis=1)
        raw[dynamic] = at(pos)
        return raw / raw.sum(axis=0)

    mids = (s + e - 1) // 2
    w0, wm, w1 = full(s), full(mids), full(e - 1)
    err = (np.abs(w1 - w0) / 8 + np.abs(wm - (w0 + w1) / 2)).max(axis=0) * (e - s)
    assert (err <= blocked.BLOCK_ERROR * (1 + 1e-9)).all()
    simpson = (w0 + 4 * wm + w1) / 6
    got = static[:, None] * inv[None, :]
    got[dynamic] = dyn
    np.testing.assert_allclose(got, simpson, rtol=1e-12, atol=1e-15)
    # each block's parent was too far from straight: halving stopped as soon as it could
    parents = {(int(a), int(b)) for a, b in zip(s, e, strict=True)}
    for a, b in parents:
        size = b - a
        if size < length:  # a half: its parent spanned [a, a + 2 size) or [a - size, b)
            lo = a if (a // size) % 2 == 0 else a - size
            p0, pm, p1 = full(np.array([lo])), full(np.array([(2 * lo + 2 * size - 1) // 2])), \
                full(np.array([lo + 2 * size - 1]))
            perr = (np.abs(p1 - p0) / 8 + np.abs(pm - (p0 + p1) / 2)).max() * 2 * size
            assert perr > blocked.BLOCK_ERROR


def test_locate_reads_the_index_refuses_outside_it_and_survives_pickling():
    import pickle

    from megatron.data.curriculum.dataset import CurriculumDataset

    blend = {"blend": [{"path": "a", "weight": 1}, {"path": "b", "weight": 3}]}
    idx = fake_index(blend, 400, seq=SEQ, order="blocked")
    cfg = parse_blend_config({"train": blend}, "t.yaml", check_files=False).train
    tail = CurriculumIndex(cfg, idx.constituents, 400, BatchSchedule(4, None, SEQ), order="blocked",
                           begin=100, base=idx.drawn_before(100))
    for ds, begin in ((CurriculumDataset(idx, [None, None]), 0),
                      (CurriculumDataset(tail, [None, None]), 100)):
        ids, samples = np.asarray(ds.dataset_index), np.asarray(ds.dataset_sample_index)
        for copy in (ds, pickle.loads(pickle.dumps(ds))):
            for i in (begin, begin + 1, 250, 399):
                got = copy.locate(i)
                assert got == (ids[i - begin], samples[i - begin])
                assert type(got[0]) is int and type(got[1]) is int
            assert copy.locate(np.int64(399)) == (ids[-1], samples[-1])
            for outside in (begin - 1, -1, 400, 10 ** 6):
                with pytest.raises(IndexError, match=rf"global sample {outside} is outside this "
                                                     rf"mix's samples \[{begin}, 400\)"):
                    copy.locate(outside)


def test_batches_are_released_in_order_and_planned_a_bounded_way_ahead(monkeypatch):
    # a stage of 40 batches: each filled range is told in order, and the quotas of at most
    # PENDING_BATCHES + 1 batches are held at once (their pages released as they are filled)
    monkeypatch.setattr(blocked, "MAX_BLOCK", 64)
    monkeypatch.setattr(blocked, "BATCH_SAMPLES", 128)
    D, length = 7, 40 * 128
    told, planned = [], []
    quotas = blocked._quotas

    def planning(*args):
        planned.append(len(told))
        return quotas(*args)

    monkeypatch.setattr(blocked, "_quotas", planning)
    weights = blocked.StageWeights(np.arange(1.0, D + 1), np.zeros(0, dtype=np.int64), None)
    ids, samples = np.empty(length, dtype=np.uint8), np.empty(length, dtype=np.int32)
    counts = np.zeros(D, dtype=np.int64)
    drawn = blocked.build_blocked_stage(length, weights, np.zeros(0, dtype=np.int64),
                                        np.full(D, -1), counts, np.arange(D), ids, samples,
                                        lambda j, detail: pytest.fail("no zero weights"),
                                        written=lambda lo, hi: told.append((lo, hi)))
    assert told == [(k * 128, (k + 1) * 128) for k in range(40)]
    assert len(planned) == 40
    assert all(k - done <= blocked.PENDING_BATCHES for k, done in enumerate(planned))
    assert drawn.tolist() == counts.tolist() == np.bincount(ids, minlength=D).tolist()
    for d in range(D):
        np.testing.assert_array_equal(samples[ids == d], np.arange(drawn[d]))


def test_a_quota_longer_than_its_block_is_refused_by_the_kernel():
    if blocked._load_kernel() is None:
        pytest.skip("no compiler: the kernel is not built")
    ids, samples = np.empty(4, dtype=np.int16), np.empty(4, dtype=np.int64)
    with pytest.raises(ValueError, match="a quota longer than its block"):
        blocked.fill_blocks(np.array([4]), np.array([[5, 0]]), np.arange(2),
                            np.zeros(2, dtype=np.int64), ids, samples)
