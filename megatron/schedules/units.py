"""Progress units: iterations <-> consumed samples <-> tokens, aware of batch-size rampup.

One iteration is one optimizer step over one global batch. With ``--rampup-batch-size START INCR
SAMPLES`` the global batch grows from START by INCR every ``SAMPLES / ((GBS - START) / INCR)``
consumed samples (megatron-core's ``RampupBatchsizeNumMicroBatchesCalculator`` rule), so the
mapping between iterations and samples is not linear; everything that converts goes through
:class:`BatchSchedule`.
"""
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np


@dataclass(frozen=True)
class BatchSchedule:
    """Global batch size as a function of consumed samples.

    Attributes:
        global_batch_size: the final global batch size (samples per iteration).
        rampup: ``(start, increment, rampup_samples)`` or ``None`` for a constant batch.
        seq_length: tokens per sample, for token conversions.
    """

    global_batch_size: int
    rampup: Optional[Sequence[int]] = None
    seq_length: int = 1

    def batch_size_at_samples(self, consumed_samples: int) -> int:
        """Global batch size (samples) of the iteration that starts after ``consumed_samples``."""
        if not self.rampup:
            return self.global_batch_size
        start, incr, ramp_samples = (int(x) for x in self.rampup)
        if consumed_samples > ramp_samples:
            return self.global_batch_size
        num_increments = (self.global_batch_size - start) // incr
        samples_per_increment = ramp_samples / num_increments
        steps = int(consumed_samples / samples_per_increment)
        return min(start + steps * incr, self.global_batch_size)

    def consumed_samples_table(self, num_iterations: int) -> np.ndarray:
        """``table[i]`` = samples consumed before iteration ``i`` (0-based), for i in [0, n]."""
        table = np.zeros(num_iterations + 1, dtype=np.int64)
        if not self.rampup:
            table[:] = np.arange(num_iterations + 1, dtype=np.int64) * self.global_batch_size
            return table
        consumed = 0
        ramp_samples = int(self.rampup[2])
        for i in range(num_iterations):
            if consumed > ramp_samples:
                rest = np.arange(1, num_iterations - i + 1, dtype=np.int64)
                table[i + 1 :] = consumed + rest * self.global_batch_size
                return table
            consumed += self.batch_size_at_samples(consumed)
            table[i + 1] = consumed
        return table

    def samples_at_iteration(self, iteration: int) -> int:
        """Samples consumed after ``iteration`` completed iterations."""
        return int(self.consumed_samples_table(iteration)[iteration])

    def iterations_for_samples(self, samples: int) -> int:
        """Smallest number of iterations whose consumed samples reach ``samples``."""
        consumed, iterations = 0, 0
        while consumed < samples:
            if self.rampup and consumed <= int(self.rampup[2]):
                consumed += self.batch_size_at_samples(consumed)
                iterations += 1
            else:
                remaining = samples - consumed
                iterations += -(-remaining // self.global_batch_size)
                break
        return iterations

    def tokens(self, samples: int) -> int:
        """Tokens in ``samples`` samples of ``seq_length`` tokens."""
        return int(samples) * self.seq_length


def batch_schedule_from_args(args) -> BatchSchedule:
    """The run's :class:`BatchSchedule` from ``--global-batch-size``, ``--rampup-batch-size``,
    ``--seq-length``."""
    return BatchSchedule(
        global_batch_size=args.global_batch_size,
        rampup=tuple(int(x) for x in args.rampup_batch_size) if args.rampup_batch_size else None,
        seq_length=args.seq_length,
    )
