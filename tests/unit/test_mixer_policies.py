"""The adaptive mixer's policies (megatron/data/mixer_policies.py) against values computed by
hand from their papers' formulas, and their determinism: pure functions of (state, inputs), the
state plain JSON (a checkpoint's record gives the same next weights bit for bit)."""
import json
import math

import numpy as np
import pytest

from megatron.data.blend_config import MIXER_POLICIES, MixerConfig
from megatron.data.mixer_policies import (
    MixerInputs,
    apply_cap,
    apply_floor,
    fit_power_law,
    initial_state,
    update_weights,
)


def _config(policy, floor=0.0, **params):
    values = dict(MIXER_POLICIES[policy], **params)
    return MixerConfig(policy, 2, floor, tuple(sorted(values.items())))


def _inputs(losses, drawn=(4, 4), iteration=2):
    return MixerInputs(tuple(float(x) for x in losses), tuple(drawn), (100, 100), iteration)


def test_floor_is_a_mixture_with_the_uniform_floor():
    assert apply_floor([0.8, 0.2], 0.1) == pytest.approx([0.74, 0.26], abs=1e-15)
    assert apply_floor([4.0, 1.0], 0.5) == pytest.approx([0.5, 0.5], abs=1e-15)
    assert sum(apply_floor([3.0, 2.0, 1.0], 0.2)) == pytest.approx(1.0, abs=1e-15)


def test_odm_is_exp3_on_the_smoothed_importance_weighted_loss():
    """Two datasets, start 1/2 each, losses 4 and 2 in both intervals, smoothing 0.9, reward
    scale 10 (the reference's loss / 10)."""
    config = _config("odm")
    state = initial_state(config, [1, 1])
    # t = 1: eps_1 = min(1/2, sqrt(ln 2 / 2)) = 1/2, so (1 - K eps) = 0: uniform
    w1, state = update_weights(config, state, _inputs([4.0, 2.0]))
    assert w1 == pytest.approx([0.5, 0.5], abs=1e-15)
    assert state["reward"] == pytest.approx([0.1 * 0.4 / 0.5, 0.1 * 0.2 / 0.5], abs=1e-15)
    # t = 2: R = 0.9 R + 0.1 (L/10) / pi -> [0.152, 0.076]; eps_2 = sqrt(ln 2 / 4); eps_1 = 1/2
    w2, state = update_weights(config, state, _inputs([4.0, 2.0]))
    r = [0.9 * 0.08 + 0.1 * 0.4 / 0.5, 0.9 * 0.04 + 0.1 * 0.2 / 0.5]
    eps2 = math.sqrt(math.log(2) / 4)
    soft = [math.exp(0.5 * x) / sum(math.exp(0.5 * y) for y in r) for x in r]
    want = [(1 - 2 * eps2) * s + eps2 for s in soft]
    assert w2 == pytest.approx(want, abs=1e-12)
    assert w2 == pytest.approx([0.501591, 0.498409], abs=1e-6)
    assert w2[0] > w2[1]  # the higher loss is rewarded


def test_odm_leaves_an_undrawn_dataset_unrewarded_and_keeps_its_floor():
    config = _config("odm", floor=0.2)
    state = initial_state(config, [1, 1, 2])
    w, state = update_weights(config, state, _inputs([3.0, float("nan"), 1.0], (2, 0, 6)))
    assert state["reward"][1] == 0.0
    assert min(w) >= 0.2 and sum(w) == pytest.approx(1.0, abs=1e-15)


def test_loss_softmax_is_the_start_mix_reweighted_by_relative_loss():
    config = _config("loss_softmax", temperature=1.0)
    state = initial_state(config, [3, 1])
    w, state = update_weights(config, state, _inputs([4.0, 2.0]))
    assert w == pytest.approx([0.75, 0.25], abs=1e-15)  # every loss at its start: the start mix
    w, state = update_weights(config, state, _inputs([3.0, 1.8]))
    # rho = [0.75, 0.9]: p ~ [0.75 e^-0.25, 0.25 e^-0.1]
    p = np.array([0.75 * math.exp(-0.25), 0.25 * math.exp(-0.1)])
    assert w == pytest.approx(list(p / p.sum()), abs=1e-12)
    assert w == pytest.approx([0.720836, 0.279164], abs=1e-6)


def test_power_law_fit_recovers_the_law():
    n = np.array([50, 100, 200, 400, 800, 1600], dtype=float)
    e, b, alpha = fit_power_law(n, 2.0 + 3.0 * n ** -0.3)
    assert (e, b, alpha) == pytest.approx((2.0, 3.0, 0.3), abs=1e-9)


def test_ado_keeps_the_start_mix_until_warm_then_follows_the_learning_speed():
    config = _config("ado", warmup=3, history=0.9, average=0.9)
    state = initial_state(config, [1, 1])
    laws = [(1.0, 4.0, 0.5), (2.0, 1.0, 0.2)]  # dataset 0 learns faster at these counts
    for step in range(1, 4):
        n = 8 * step
        losses = [e + b * n ** -a for e, b, a in laws]
        w, state = update_weights(config, state, _inputs(losses, (8, 8), 2 * step))
        if step < 3:
            assert w == [0.5, 0.5]
    # the third update: fits on 3 points, speeds alpha (L - E) / n, times mu sqrt(h (1 - h))
    speeds = []
    for i in range(2):
        n_i, l_i = zip(*state["points"][i], strict=True)
        e, b, a = fit_power_law(n_i, l_i)
        speeds.append(a * b * 24 ** -a / 24)
    q = np.array(speeds) * 0.5 * math.sqrt(0.25)
    q = q / q.sum()
    p = 0.9 * np.array([0.5, 0.5]) + 0.1 * q
    assert w == pytest.approx(list(p / p.sum()), abs=1e-12)
    assert w[0] > w[1]
    assert state["mean"] == pytest.approx(list((1 - 1 / 7) * 0.5 + q / 7), abs=1e-12)


@pytest.mark.parametrize("policy", sorted(MIXER_POLICIES))
def test_policies_are_pure_and_their_state_survives_json(policy):
    """The same state and inputs give the same weights bit for bit, also from the state as a
    checkpoint records it (JSON)."""
    config = _config(policy, floor=0.05)
    rng = np.random.default_rng(0)
    state = initial_state(config, [1, 2, 3])
    trajectory = []
    for t in range(1, 7):
        inputs = MixerInputs(tuple(float(x) for x in rng.uniform(1, 5, 3)),
                             tuple(int(x) for x in rng.integers(1, 9, 3)), (50, 50, 50), 2 * t)
        again, _ = update_weights(config, json.loads(json.dumps(state)), inputs)
        w, state = update_weights(config, state, inputs)
        assert again == w
        assert min(w) >= 0.05 - 1e-15 and sum(w) == pytest.approx(1.0, abs=1e-12)
        trajectory.append(w)
    assert len({tuple(w) for w in trajectory}) > 1 or policy == "ado"


def test_the_cap_lowers_a_dataset_to_what_it_may_still_draw_and_says_why():
    """max_epochs 1: dataset 0 has 2 of its 10 samples left for the next 10 samples, so at most
    0.2; its excess 0.3 goes to the others in proportion (0.3, 0.2 -> 0.48, 0.32)."""
    inputs = MixerInputs((1.0, 1.0, 1.0), (1, 1, 1), (2, 100, 100), 4, total=(8, 0, 0),
                         per_epoch=(10, 100, 100), next_samples=10)
    w, fallback = apply_cap([0.5, 0.3, 0.2], 1.0, inputs)
    assert w == pytest.approx([0.2, 0.48, 0.32], abs=1e-15)
    assert [(f["dataset"], f["weight"], f["capped"]) for f in fallback] == [(0, 0.5, 0.2)]
    assert fallback[0]["reason"] == "max_epochs 1: 8 of 10 samples drawn, 10 in the next interval"
    # lowering one may push another over its cap: filled until none is
    inputs = MixerInputs((1.0,) * 3, (1,) * 3, (1,) * 3, 4, total=(9, 5, 0),
                         per_epoch=(10, 10, 100), next_samples=10)
    w, fallback = apply_cap([0.6, 0.3, 0.1], 1.0, inputs)
    assert w == pytest.approx([0.1, 0.5, 0.4], abs=1e-12)
    assert [f["dataset"] for f in fallback] == [0, 1]
    # every dataset at its cap: renormalised, drawn past it, and said so
    inputs = MixerInputs((1.0,) * 2, (1,) * 2, (1,) * 2, 4, total=(10, 9), per_epoch=(10, 10),
                         next_samples=10)
    w, fallback = apply_cap([0.5, 0.5], 1.0, inputs)
    assert w == pytest.approx([0.0, 1.0], abs=1e-15)
    assert all("every dataset is at its cap" in f["reason"] for f in fallback)


def test_update_weights_records_the_capped_weights_as_drawn():
    config = MixerConfig("loss_softmax", 2, 0.0, (("temperature", 1.0),), max_epochs=1.0)
    state = initial_state(config, [1, 1])
    inputs = MixerInputs((2.0, 2.0), (4, 4), (1, 16), 2, total=(9, 4), per_epoch=(10, 20),
                         next_samples=8)
    w, state = update_weights(config, state, inputs)
    assert w == pytest.approx([0.125, 0.875], abs=1e-15) and state["weights"] == w
    assert state["fallback"][0]["dataset"] == 0
