"""The adaptive mixer's toy harness (issue 46): a training mix over three fake datasets (``web``,
``code``, ``math``, 20 samples per epoch each, no files), trained by the loop's rule iteration by
iteration with a made-up loss, and resumed from its checkpoint record. Shared by
tests/unit/test_adaptive_mixer.py (the sampling mixer) and tests/unit/test_objective_mixer.py (the
loss weights' mixer)."""
import json
from typing import List, Optional, Tuple

import numpy as np
import torch

from helpers.curriculum import fake_constituents
from megatron.data.blend_config import parse_blend_config
from megatron.data.mix_ledger import MixRecord
from megatron.data.mix_resume import DataResume, MixSources, continue_training_mix
from megatron.schedules.units import BatchSchedule
from megatron.train.mixer import LoopMixer

SEQ, GBS, ITERS, SPE = 16, 4, 12, 20
BS = BatchSchedule(GBS, None, SEQ)
N = ITERS * GBS
POLICIES = {"odm": {}, "ado": {"warmup": 3}, "loss_softmax": {"temperature": 0.1}}
ENTRIES = [{"path": "web", "weight": 1}, {"path": "code", "weight": 1},
           {"path": "math", "weight": 2}]


def blend(policy: Optional[str], **mixer):
    """The training blend of the three datasets (weights 1, 1, 2) with a mixer of ``policy``
    (interval 2, floor 0.05, the policy's test keys, then ``mixer``), or none (``policy`` None)."""
    train = {"blend": [dict(e) for e in ENTRIES]}
    if policy is not None:
        train["mixer"] = {"policy": policy, "interval": 2, "floor": 0.05, **POLICIES[policy],
                          **mixer}
    return parse_blend_config({"train": train}, "t.yaml", check_files=False).train


class _Source(list):
    def epoch_and_position(self, k):
        return divmod(k, SPE)


SOURCES = MixSources("blend_config", lambda b: fake_constituents(b, SPE, SEQ),
                     lambda c, n, seed: _Source(range(n)))


def new_mix(split_blend, num_samples: int = N, resume: Optional[DataResume] = None):
    """The training mix of ``split_blend`` for a run of ``num_samples`` (seed 5)."""
    return continue_training_mix(SOURCES, split_blend, num_samples, BS, 5, resume)


def made_up_loss(dataset: int, sample: int, iteration: int) -> float:
    """A made-up training loss (nats): dataset 1 learns slowest."""
    return (3.0 + dataset) * (1.0 + iteration) ** -(0.5 / (1 + 2 * (dataset == 1))) \
        + 0.01 * (sample % 7)


def train(mix, mixer: Optional[LoopMixer], first: int, last: int,
          in_force: Optional[List] = None) -> List[List[Tuple[int, int]]]:
    """Iterations ``first..last`` as the loop runs them: each draws its global batch from the
    mix's current dataset, the mixer (if any) adds its per-dataset losses; [(dataset, sample)]
    each. ``in_force``: gets, per iteration, the loss weights it trained with (the mixer's
    :meth:`LoopMixer.objective_weights` before it) and its per-dataset loss sums."""
    draws = []
    k = len(mix.dataset.constituents)
    for it in range(first, last + 1):
        begin, end = BS.samples_at_iteration(it - 1), BS.samples_at_iteration(it)
        batch = [mix.dataset.locate(s) for s in range(begin, end)]
        sums, counts = np.zeros(k), np.zeros(k)
        for d, sample in batch:
            sums[d] += made_up_loss(d, sample, it)
            counts[d] += 1
        if in_force is not None:
            weights = mixer.objective_weights() if mixer is not None else None
            in_force.append((it, None if weights is None else list(weights), sums.tolist()))
        if mixer is not None:  # one micro batch per iteration, as the loop adds it
            mixer.pending.add_micro_batch(
                None, torch.tensor([made_up_loss(d, sample, it) for d, sample in batch]),
                torch.tensor([d for d, _ in batch]))
            mixer.end_iteration(it, end)
        draws.append(batch)
    if mixer is not None:  # as the loop does before its checkpoint
        mixer.fold()
    return draws


def record_of(mix, iteration: int) -> MixRecord:
    """The checkpoint's data record of ``mix`` at ``iteration``, through its JSON."""
    return MixRecord.from_json(json.loads(json.dumps(
        mix.record(iteration, BS.samples_at_iteration(iteration)).to_json())))


def resumed(mix, iteration: int, split_blend, num_samples: int = N,
            static_loss_weights=None) -> Tuple[object, LoopMixer]:
    """The mix and mixer of a run resumed at ``iteration`` from ``mix``'s record."""
    again = new_mix(split_blend, num_samples, DataResume("ckpt", iteration, record_of(mix, iteration)))
    return again, LoopMixer(again, split_blend.mixer, iteration, BS.samples_at_iteration(iteration),
                            static_loss_weights)


def stop_and_resume(split_blend, stops, static_loss_weights=None,
                    in_force: Optional[List] = None) -> Tuple[object, List, LoopMixer]:
    """A run of ``split_blend`` stopped after each iteration of ``stops`` (the last: the run's
    end) and resumed from its record each time: (its last mix, its draws, its last mixer)."""
    mix = new_mix(split_blend)
    mixer, draws, done = LoopMixer(mix, split_blend.mixer, 0, 0, static_loss_weights), [], 0
    for stop in stops:
        if done:
            mix, mixer = resumed(mix, done, split_blend, static_loss_weights=static_loss_weights)
        draws += train(mix, mixer, done + 1, stop, in_force)
        done = stop
    return mix, draws, mixer
