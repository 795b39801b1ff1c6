"""The training loader of a run whose adaptive mixer moves the sampling, with loader workers (issue
46 item 6): its workers live for the whole loop instead of being replaced at every update.

The loop's plain loader (megatron/train/loader.py) holds the mix's dataset as it was when its
workers started, so an update that appends a phase would need fresh workers (tens of milliseconds
to start, and their first batches unprefetched). Here instead:

- the batch sampler (in the loop's process) yields each micro batch as ``(global sample, phase)``
  pairs and ends at the next update's first sample, so no batch of the old weights is ever
  prefetched past an update;
- at an update the loop hands the new phase (its weights, first sample, iteration and record:
  what ``TrainMix.append_mixer_segment`` was given) to every worker through its own queue, and
  restarts the iteration on the same workers (``persistent_workers``). A queue, not a bare pipe:
  its ``put`` never blocks (a feeder thread writes), so a record larger than a pipe's buffer
  (thousands of datasets) cannot stall the loop on a worker that draws no sample of the segment
  and so never reads;
- a worker that gets a sample of a phase it has not built yet reads its queue and appends the same
  phases to its copy of the mix (the same build the loop made, whose index it finds in the cache
  the loop wrote), then serves the sample as the loop's dataset would.

The samples are those of the mix's dataset at every global sample, as with a fresh loader.
"""
import multiprocessing
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from megatron.config.run_config import LoopConfig
from megatron.data.blend_config import MixerConfig
from megatron.data.mix_resume import TrainMix, batch_schedule_of
from megatron.data.samplers import PretrainingBatchSampler
from megatron.model.masks import collate_with_segment_layout

__all__ = ["MixerLoader", "next_update_sample", "phase_message"]


class _PhaseFollower(torch.utils.data.Dataset):
    """A worker's view of the mix: sample ``(global sample, phase)`` of the mix's dataset once the
    worker's copy has built ``phase`` (reading the phases it lacks from its queue)."""

    def __init__(self, mix: TrainMix, queues: List):
        self.mix = mix
        self.queues = queues
        self.phase = len(mix.phases) - 1  # the phases the copy has (at the workers' fork)

    def __len__(self) -> int:
        return len(self.mix.dataset)

    def _catch_up(self, phase: int) -> None:
        info = torch.utils.data.get_worker_info()
        if info is None:
            raise RuntimeError("the mixer's loader serves phases in its workers only")
        queue = self.queues[info.id]
        while self.phase < phase:
            number, weights, consumed, iteration, segment = queue.get()
            self.mix.append_mixer_segment(weights, consumed, iteration, segment)
            self.phase = number
            if len(self.mix.phases) - 1 != number:  # a phase missed: the copy is not the loop's
                raise RuntimeError(f"the mixer's loader worker {info.id} built phase "
                                   f"{len(self.mix.phases) - 1} from sample {consumed}; the "
                                   f"loop's is phase {number}")

    def __getitem__(self, key: Tuple[int, int]) -> Dict:
        idx, phase = key
        if phase > self.phase:
            self._catch_up(phase)
        return self.mix.dataset[idx]


class _SegmentIterator:
    """One segment's micro batches: the persistent workers' iterator, which :meth:`close`
    drops, so that once the loader is dropped too the workers stop (the loop may still hold
    this object)."""

    def __init__(self, inner: Iterator[Dict]):
        self._inner: Optional[Iterator[Dict]] = inner

    def __iter__(self):
        return self

    def __next__(self) -> Dict:
        if self._inner is None:
            raise StopIteration
        return next(self._inner)

    def close(self) -> None:
        """Drop the workers' iterator (it yields nothing more)."""
        self._inner = None


class _SegmentSampler:
    """This rank's micro batches of global samples ``begin`` to ``stop`` (the next update's
    first), each sample paired with the phase that draws it."""

    def __init__(self, micro_batch_size: int, rank: int, size: int):
        self.micro_batch_size, self.rank, self.size = micro_batch_size, rank, size
        self.begin, self.stop, self.phase = 0, 0, 0

    def _samples(self) -> PretrainingBatchSampler:
        return PretrainingBatchSampler(self.stop, self.begin, self.micro_batch_size, self.rank,
                                       self.size)

    def __len__(self) -> int:
        return len(self._samples())

    def __iter__(self):
        for batch in self._samples():
            yield [(i, self.phase) for i in batch]


def next_update_sample(mix: TrainMix, interval: int, iteration: int) -> int:
    """The first global sample after the mixer's next update (every ``interval`` iterations)
    after iteration ``iteration`` (the run's end when it comes first): where a segment stops."""
    update = (int(iteration) // interval + 1) * interval
    schedule = batch_schedule_of(mix.phases[-1])
    return min(int(schedule.samples_at_iteration(update)), len(mix.dataset))


def phase_message(mix: TrainMix) -> Tuple[int, List[float], int, int, Optional[Dict]]:
    """What a worker needs to append the mix's last phase as the loop did
    (``TrainMix.append_mixer_segment``'s arguments): (its number, weights, first global sample,
    iteration, the mixer's record)."""
    p = mix.phases[-1]
    return len(mix.phases) - 1, p.static_weights(), p.begin, p.begin_iteration, p.mixer


class MixerLoader:
    """The training loader of ``mix`` (whose blend has the sampling mixer ``config``) for the
    loop's ``loop.num_workers`` (> 0) workers, which stay up from :meth:`segment` to
    :meth:`close`."""

    def __init__(self, mix: TrainMix, config: MixerConfig, loop: LoopConfig):
        from megatron.core import parallel_state  # lazy: megatron-core loads with the loop

        self.mix, self.config = mix, config
        self.queues = [multiprocessing.Queue() for _ in range(loop.num_workers)]
        self.sampler = _SegmentSampler(loop.micro_batch_size,
                                       parallel_state.get_data_parallel_rank(),
                                       parallel_state.get_data_parallel_world_size())
        self.sampler.phase = len(mix.phases) - 1
        # own generator: as megatron/train/loader.py (the global torch RNG is left alone)
        self.loader: Optional[torch.utils.data.DataLoader] = torch.utils.data.DataLoader(
            _PhaseFollower(mix, self.queues), batch_sampler=self.sampler,
            num_workers=loop.num_workers, collate_fn=collate_with_segment_layout,
            pin_memory=False, persistent_workers=True,
            generator=torch.Generator().manual_seed(loop.seed))
        self.current: Optional[_SegmentIterator] = None

    def segment(self, consumed: int, iteration: int) -> _SegmentIterator:
        """This rank's micro batches from global sample ``consumed`` (after ``iteration``) up to
        the next update, drawn by the mix's current phase (the workers build it first)."""
        phase = len(self.mix.phases) - 1
        if phase != self.sampler.phase:  # an update appended it: every worker builds it too
            if phase != self.sampler.phase + 1:
                raise RuntimeError(f"the mixer's loader: phase {phase} follows phase "
                                   f"{self.sampler.phase} (one update at a time)")
            message = phase_message(self.mix)
            for queue in self.queues:
                queue.put(message)
        self.sampler.begin = int(consumed)
        self.sampler.stop = next_update_sample(self.mix, self.config.interval, iteration)
        self.sampler.phase = phase
        if self.current is not None:
            self.current.close()
        self.current = _SegmentIterator(iter(self.loader))
        return self.current

    def close(self) -> None:
        """Stop the workers (the last segment's iterator and the loader dropped)."""
        if self.current is not None:
            self.current.close()
        self.current, self.loader = None, None
        for queue in self.queues:  # a worker that drew nothing since may not have read its last
            queue.cancel_join_thread()
            queue.close()
