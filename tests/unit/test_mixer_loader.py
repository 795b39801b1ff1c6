"""The sampling mixer's loader whose workers stay up across updates (megatron/train/mixer_loader.py,
issue 46 item 6), in process: a worker's copy of the mix, told each update through its queue, draws
the loop's (dataset, sample) at every global sample, and the batch sampler ends each segment at the
next update's first sample, so no batch of old weights is prefetched past an update. The
end-to-end twin (real workers): tests/e2e/test_adaptive_mixer_e2e.py, whose adaptive run reads
with 2 workers and equals, loss for loss, the static run of its export read by a plain loader."""
import multiprocessing
from types import SimpleNamespace

import pytest
import torch

from helpers.mixer_run import BS, ITERS, N, blend, new_mix, train
from megatron.data.samplers import PretrainingBatchSampler
from megatron.train.mixer import LoopMixer
from megatron.train.mixer_loader import _PhaseFollower, _SegmentSampler, next_update_sample, phase_message


@pytest.mark.parametrize("policy", ["odm", "loss_softmax"])
def test_a_workers_copy_follows_every_update_and_draws_the_loops_samples(policy, monkeypatch):
    split_blend = blend(policy)
    mix = new_mix(split_blend)
    queue = multiprocessing.Queue()
    worker = _PhaseFollower(new_mix(split_blend), [queue])  # the fork's copy: the same state
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: SimpleNamespace(id=0))
    mixer, sent = LoopMixer(mix, split_blend.mixer, 0, 0), 0
    for it in range(1, ITERS + 1):
        phase = len(mix.phases) - 1
        if phase > sent:  # the loop's restart on the same workers: the new phase sent first
            queue.put(phase_message(mix))
            sent = phase
        for s in range(BS.samples_at_iteration(it - 1), BS.samples_at_iteration(it)):
            if phase > worker.phase:
                worker._catch_up(phase)
            assert worker.mix.dataset.locate(s) == mix.dataset.locate(s), (it, s)
        train(mix, mixer, it, it)
    assert len(mix.phases) > 2 and worker.phase == len(mix.phases) - 1
    assert [p.mixer for p in worker.mix.phases] == [p.mixer for p in mix.phases]


def test_a_worker_that_missed_an_update_stops_in_one_line(monkeypatch):
    split_blend = blend("loss_softmax")
    mix = new_mix(split_blend)
    train(mix, LoopMixer(mix, split_blend.mixer, 0, 0), 1, 4)  # updates at 2 and 4: phases 1, 2
    queue = multiprocessing.Queue()
    worker = _PhaseFollower(new_mix(split_blend), [queue])
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: SimpleNamespace(id=0))
    queue.put(phase_message(mix))  # phase 2 only: phase 1's message never came
    with pytest.raises(RuntimeError, match="built phase 1 from sample 16; the loop's is phase 2"):
        worker._catch_up(2)


@pytest.mark.parametrize("rank", [0, 1])
def test_segments_end_at_each_update_and_together_are_the_plain_samplers_batches(rank):
    mix = new_mix(blend("odm"))  # interval 2
    assert [next_update_sample(mix, 2, it) for it in range(ITERS)] == \
        [BS.samples_at_iteration(min((it // 2 + 1) * 2, ITERS)) for it in range(ITERS)]
    sampler, batches, consumed, it = _SegmentSampler(2, rank, 2), [], 0, 0
    while consumed < N:
        sampler.begin, sampler.stop, sampler.phase = consumed, next_update_sample(mix, 2, it), it
        segment = list(sampler)
        assert len(segment) == len(sampler)
        assert {p for batch in segment for _, p in batch} == {it}
        batches += [[i for i, _ in batch] for batch in segment]
        consumed, it = sampler.stop, it + 2
        assert consumed == BS.samples_at_iteration(it)
    assert batches == list(PretrainingBatchSampler(N, 0, 2, rank, 2))
