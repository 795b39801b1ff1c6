"""The adaptive mixer's interval sums (megatron/train/mixer_sums.py, issue 46 item 6): fixed point
on the device, exact, so an interval's total is the same whatever the micro batch split, the order
the samples come in, and where a checkpoint took part of it (the loop folds the sums before every
checkpoint, megatron/train/loop.py); its means are within half a unit per sample of the float
ones. A float64 sum fails the order test (checked here too, so the test can tell them apart)."""
import random
from fractions import Fraction

import numpy as np
import pytest
import torch

from megatron.train.mixer_sums import SCALE_BITS, MixerLossSums

K = 3
UNIT = Fraction(1, 2 ** SCALE_BITS)


def _samples(n=400, seed=0):
    """``n`` (dataset, loss, weight) triples: losses in nats with full float64 mantissas, weights
    as loss tokens (1..64)."""
    rng = random.Random(seed)
    return [(rng.randrange(K), rng.uniform(0.1, 12.0), float(rng.randrange(1, 65))) for _ in range(n)]


def _add(sums: MixerLossSums, samples, weighted: bool) -> None:
    sums.add_micro_batch(torch.tensor(0.0),
                         torch.tensor([x for _, x, _ in samples], dtype=torch.float64),
                         torch.tensor([d for d, _, _ in samples]),
                         1.0, torch.tensor([w for _, _, w in samples]) if weighted else None)


def _taken(samples, splits, cut_at=(), weighted=True):
    """The interval's total of ``samples`` added in micro batches cut at ``splits``, taken (folded)
    also after the micro batches in ``cut_at`` and added up as the mixer does."""
    sums, total = MixerLossSums(K), [np.zeros(K, dtype=np.int64), np.zeros(K, dtype=np.int64)]
    bounds = [0, *splits, len(samples)]
    for m, (a, b) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        _add(sums, samples[a:b], weighted)
        if m in cut_at:
            s, c = sums.take()
            total = [total[0] + s, total[1] + c]
    s, c = sums.take()
    return total[0] + s, total[1] + c


@pytest.mark.parametrize("weighted", [False, True])
def test_the_total_is_each_values_rounding_summed_exactly(weighted):
    samples = _samples()
    sums, counts = _taken(samples, [100, 250], weighted=weighted)
    for d in range(K):
        want = sum(round(Fraction(x) * (Fraction(w) if weighted else 1) / UNIT)
                   for dd, x, w in samples if dd == d)
        assert int(sums[d]) == want
        assert int(counts[d]) == sum(round((Fraction(w) if weighted else 1) / UNIT)
                                     for dd, _, w in samples if dd == d)


def test_any_split_order_and_fold_gives_the_same_total_bit_for_bit():
    samples = _samples()
    want = _taken(samples, [])
    rng = random.Random(1)
    for trial in range(6):
        shuffled = samples[:]
        rng.shuffle(shuffled)
        splits = sorted(rng.sample(range(1, len(samples)), 5))
        cut_at = set(rng.sample(range(6), 2))
        got = _taken(shuffled, splits, cut_at)
        assert [a.tolist() for a in got] == [a.tolist() for a in want], trial
    # a float64 running sum (what the mixer kept before) depends on the order: this data tells
    # them apart (a plain loop: Python 3.12's sum() compensates its rounding)
    floats = set()
    for order in (samples, samples[::-1], sorted(samples, key=lambda t: t[1])):
        total = 0.0
        for d, x, w in order:
            total += x * w if d == 0 else 0.0
        floats.add(total)
    assert len(floats) > 1


def test_the_mean_is_within_half_a_unit_per_sample_of_the_float_mean():
    samples = _samples()
    sums, counts = _taken(samples, [200], weighted=True)
    for d in range(K):
        mine = [(x, w) for dd, x, w in samples if dd == d]
        exact = sum(Fraction(x) * Fraction(w) for x, w in mine) / sum(Fraction(w) for _, w in mine)
        got = int(sums[d]) / int(counts[d])
        assert abs(Fraction(got) - exact) <= len(mine) * UNIT  # loss x weight and weight rounded
        assert abs(got - float(exact)) < 1e-5


def test_nothing_added_takes_zeros_and_a_take_resets():
    sums = MixerLossSums(K)
    assert [a.tolist() for a in sums.take()] == [[0] * K, [0] * K]
    _add(sums, _samples(10), False)
    assert sums.take()[1].sum() == 10 * 2 ** SCALE_BITS
    assert [a.tolist() for a in sums.take()] == [[0] * K, [0] * K]
