"""The adaptive mixer of the loss weights (issue 46 item 2, ``mixer: {..., target: loss_weight}``;
megatron/train/mixer.py, megatron/data/mixer_loss_weights.py): the data order is the static
blend's sample for sample, every update's weights become the loss weights from the next
iteration (times the static ones), recorded with the policy's state in the checkpoint's data
record so a resume inside an interval continues bit for bit; the loop sets them on the loss
normaliser. On the toy harness tests/helpers/mixer_run.py."""
import math

import pytest
import torch

from helpers.mixer_run import ITERS, POLICIES, N, blend, new_mix, record_of, resumed, stop_and_resume, train
from megatron.data.mix_resume import DataResume
from megatron.data.mixer_loss_weights import objective_loss_weights
from megatron.optim.loss_normalization import LossNormalizer
from megatron.train.loop import _apply_mixer_loss_weights
from megatron.train.mixer import LoopMixer
from megatron.train.steps import step_functions

START = [0.25, 0.25, 0.5]  # the harness blend's weights 1, 1, 2


def _trained(split_blend, static=None):
    mix = new_mix(split_blend)
    mixer = LoopMixer(mix, split_blend.mixer, 0, 0, static)
    in_force = []
    draws = train(mix, mixer, 1, ITERS, in_force)
    return mix, mixer, draws, in_force


def test_the_loss_weights_formula_gives_the_static_weights_at_the_starting_mix():
    assert objective_loss_weights(START, [1, 1, 2]) == [1.0, 1.0, 1.0]  # bit for bit
    assert objective_loss_weights(START, [1, 1, 2], [2.0, 1.0, 0.5]) == [2.0, 1.0, 0.5]
    assert objective_loss_weights([0.5, 0.25, 0.25], [1, 1, 2], [2.0, 1.0, 1.0]) == [4.0, 1.0, 0.5]
    assert objective_loss_weights([0.5, 0.5], [1, 0]) == [0.5, 1.0]  # never drawn: its static weight
    with pytest.raises(ValueError, match="one each per dataset"):
        objective_loss_weights([0.5, 0.5], [1, 1, 1])


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_the_data_order_is_the_static_runs_sample_for_sample(policy):
    static = new_mix(blend(None))
    static_draws = train(static, None, 1, ITERS)
    mix, mixer, draws, in_force = _trained(blend(policy, target="loss_weight"))
    assert draws == static_draws
    assert len(mix.phases) == 1 and mix.phases[0].mixer is None  # no ledger phase was appended
    assert mix.record(ITERS, N).ledger == static.record(ITERS, N).ledger
    assert mix.mixer_weights() == {"web": 0.25, "code": 0.25, "math": 0.5}  # the sampling's
    # updates at 2, 4, ..., 10 (none at the last: nothing left to draw); each in force from the
    # next iteration, the static weights (None: all 1) before the first
    assert [u["iteration"] for u in mixer.updates] == [2, 4, 6, 8, 10]
    assert [w for _, w, _ in in_force[:2]] == [None, None]
    for u in mixer.updates:
        assert u["loss_weights"] == objective_loss_weights(u["weights"], [1, 1, 2])
        assert min(u["weights"]) >= 0.05 - 1e-12 and math.isclose(sum(u["weights"]), 1.0)
        assert in_force[u["iteration"]][1] == u["loss_weights"]  # iteration u + 1 trains with them
    assert mix.mixer_loss_weights() == dict(zip(("web", "code", "math"),
                                                mixer.updates[-1]["loss_weights"], strict=True))
    if policy != "ado":  # ADO keeps the starting mix until its warmup's fits (3 points each)
        assert len({tuple(u["loss_weights"]) for u in mixer.updates}) > 1


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_resume_inside_an_interval_continues_the_loss_weights_bit_for_bit(policy):
    split_blend = blend(policy, target="loss_weight")
    static = [2.0, 1.0, 0.5]  # loss_weight on the entries: the mixer's weights multiply them
    mix, mixer, draws, in_force = _trained(split_blend, static)
    assert in_force[0][1] == static
    assert mixer.updates[0]["loss_weights"] == objective_loss_weights(
        mixer.updates[0]["weights"], [1, 1, 2], static)
    # stopped at iteration 4 (an update), 5 (inside the interval 4..6) and 9, resumed each time
    again_in_force = []
    again, again_draws, again_mixer = stop_and_resume(split_blend, (4, 5, 9, ITERS), static,
                                                      again_in_force)
    assert again_draws == draws
    assert again_in_force == in_force  # the loss weights of every iteration and its losses
    assert again_mixer.updates == mixer.updates and again_mixer.state == mixer.state
    assert again.record(ITERS, N).to_json() == mix.record(ITERS, N).to_json()
    five = new_mix(split_blend)  # a checkpoint inside an interval: its sums, the weights in force
    train(five, LoopMixer(five, split_blend.mixer, 0, 0, static), 1, 5)
    progress = record_of(five, 5).mixer
    assert progress["since"] == 4 and progress["loss_weights"] == in_force[4][1]
    assert [u["iteration"] for u in progress["updates"]] == [2, 4]
    assert sorted(progress) == ["counts", "drawn", "loss_weights", "scale_bits", "since",
                                "state", "sums", "updates"]


def test_a_resume_with_another_run_length_keeps_the_loss_weights():
    split_blend = blend("loss_softmax", target="loss_weight")
    mix = new_mix(split_blend)
    mixer = LoopMixer(mix, split_blend.mixer, 0, 0)
    train(mix, mixer, 1, 5)
    longer = new_mix(split_blend, 2 * N, DataResume("ckpt", 5, record_of(mix, 5)))
    again = LoopMixer(longer, split_blend.mixer, 5, 20)
    assert again.loss_weights == mixer.loss_weights and again.state == mixer.state
    assert again.since == 4 and list(again.sums) == list(mixer.sums)


def test_an_edited_mix_at_a_resume_restarts_the_loss_weights_from_the_file():
    split_blend = blend("odm", target="loss_weight")
    mix = new_mix(split_blend)
    train(mix, LoopMixer(mix, split_blend.mixer, 0, 0), 1, 5)
    sampling = blend("odm")  # the target is part of the mix: changing it is an edit
    with pytest.raises(Exception, match="mixer"):
        new_mix(sampling, N, DataResume("ckpt", 5, record_of(mix, 5)))
    again = new_mix(sampling, N, DataResume("ckpt", 5, record_of(mix, 5), override=True))
    assert again.mixer_progress is None and again.mixer_loss_weights() is None


def test_the_loop_sets_the_mixers_loss_weights_on_the_normaliser():
    split_blend = blend("loss_softmax", target="loss_weight")
    mix, mixer, _, _ = _trained(split_blend)
    normalizer = LossNormalizer("token")
    steps = step_functions(torch.nn.Linear(1, 1), None, normalizer)
    assert steps.normalizer is normalizer
    _apply_mixer_loss_weights(mixer, steps)
    batch = normalizer.prepare({"loss_mask": torch.ones(3, 2), "dataset_id": torch.tensor([0, 1, 2])})
    want = torch.tensor(mixer.loss_weights, dtype=torch.float32).view(3, 1).expand(3, 2)
    assert torch.equal(batch["loss_mask"], want)
    assert normalizer.prepare({"loss_mask": torch.ones(1, 2), "dataset_id": torch.tensor([0])},
                              train=False)["loss_mask"].tolist() == [[1.0, 1.0]]  # evaluation
    # a resumed run's mixer has them from its record before its first iteration
    _, resumed_mixer = resumed(mix, ITERS, split_blend)
    assert resumed_mixer.objective_weights() == mixer.loss_weights
