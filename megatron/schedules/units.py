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

UNITS = ("iterations", "samples", "tokens")
_RAMP_TABLES: dict = {}


def check_unit(unit: str) -> str:
    """``unit`` if it is one of :data:`UNITS`, else ``ValueError`` naming the known ones."""
    if unit not in UNITS:
        raise ValueError(f"unknown progress unit {unit!r}; known units: {', '.join(UNITS)}")
    return unit


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
        return int(self.batch_sizes_at_samples(consumed_samples))

    def consumed_samples_table(self, num_iterations: int) -> np.ndarray:
        """``table[i]`` = samples consumed before iteration ``i`` (0-based), for i in [0, n]."""
        return self.samples_at_iterations(np.arange(num_iterations + 1, dtype=np.int64))

    # ---- vectorised conversions (the one place that maps iterations <-> samples <-> tokens) ----

    def _ramp_table(self) -> np.ndarray:
        """Consumed samples before iteration ``i`` for every iteration of the rampup phase, up to
        and including the first iteration whose batch is the full ``global_batch_size`` for good
        (after it, every iteration adds ``global_batch_size``). ``[0]`` without rampup."""
        key = (self.global_batch_size, tuple(int(x) for x in self.rampup) if self.rampup else None)
        table = _RAMP_TABLES.get(key)
        if table is not None:
            return table
        values = [0]
        if self.rampup:
            ramp_samples = int(self.rampup[2])
            consumed = 0
            while consumed <= ramp_samples and ramp_samples > 0:
                consumed += self.batch_size_at_samples(consumed)
                values.append(consumed)
        table = np.asarray(values, dtype=np.int64)
        table.setflags(write=False)
        _RAMP_TABLES[key] = table
        return table

    def samples_at_iterations(self, iterations) -> np.ndarray:
        """Samples consumed after ``iterations`` completed iterations (vectorised, int64)."""
        it = np.asarray(iterations, dtype=np.int64)
        if np.any(it < 0):
            raise ValueError(f"negative iteration count in {iterations!r}")
        table = self._ramp_table()
        last = len(table) - 1
        out = table[-1] + (it - last) * self.global_batch_size
        inside = it < last
        if np.any(inside):
            out = np.where(inside, table[np.minimum(it, last)], out)
        return out

    def iterations_at_samples(self, samples) -> np.ndarray:
        """Completed iterations once ``samples`` samples are consumed: the largest ``i`` with
        ``samples_at_iterations(i) <= samples`` (vectorised, int64; the floor inverse)."""
        s = np.asarray(samples, dtype=np.float64)
        table = self._ramp_table()
        last = len(table) - 1
        after = last + np.floor((s - table[-1]) / self.global_batch_size).astype(np.int64)
        within = np.searchsorted(table, s, side="right").astype(np.int64) - 1
        return np.where(s >= table[-1], after, np.maximum(within, 0))

    def batch_sizes_at_samples(self, consumed_samples) -> np.ndarray:
        """Vectorised :meth:`batch_size_at_samples` (same arithmetic, int64)."""
        c = np.asarray(consumed_samples, dtype=np.float64)
        if not self.rampup:
            return np.full(c.shape, self.global_batch_size, dtype=np.int64)
        start, incr, ramp_samples = (int(x) for x in self.rampup)
        if ramp_samples == 0:
            return np.full(c.shape, self.global_batch_size, dtype=np.int64)
        num_increments = (self.global_batch_size - start) // incr
        if num_increments == 0:
            return np.full(c.shape, self.global_batch_size, dtype=np.int64)
        samples_per_increment = ramp_samples / num_increments
        steps = np.floor(c / samples_per_increment).astype(np.int64)
        ramp = np.minimum(start + steps * incr, self.global_batch_size)
        return np.where(c > ramp_samples, self.global_batch_size, ramp).astype(np.int64)

    def batch_sizes_at_iterations(self, iterations) -> np.ndarray:
        """Global batch size of iteration ``i`` (0-based: the step taken after ``i`` completed
        iterations)."""
        return self.batch_sizes_at_samples(self.samples_at_iterations(iterations))

    def tokens_at_samples(self, samples) -> np.ndarray:
        return np.asarray(samples, dtype=np.float64) * self.seq_length

    def samples_at_tokens(self, tokens) -> np.ndarray:
        return np.asarray(tokens, dtype=np.float64) / self.seq_length

    def convert(self, values, from_unit: str, to_unit: str) -> np.ndarray:
        """Convert progress ``values`` between ``iterations``, ``samples`` and ``tokens``.

        Iterations -> samples/tokens is exact; samples/tokens -> iterations gives completed
        iterations (floor), as :meth:`iterations_at_samples`."""
        check_unit(from_unit)
        check_unit(to_unit)
        if from_unit == to_unit:
            return np.asarray(values, dtype=np.float64)
        if from_unit == "iterations":
            samples = self.samples_at_iterations(np.asarray(values)).astype(np.float64)
        elif from_unit == "tokens":
            samples = self.samples_at_tokens(values)
        else:
            samples = np.asarray(values, dtype=np.float64)
        if to_unit == "samples":
            return samples
        if to_unit == "tokens":
            return self.tokens_at_samples(samples)
        return self.iterations_at_samples(samples).astype(np.float64)

    def samples_at_iteration(self, iteration: int) -> int:
        """Samples consumed after ``iteration`` completed iterations."""
        return int(self.samples_at_iterations(int(iteration)))

    def iterations_for_samples(self, samples: int) -> int:
        """Smallest number of iterations whose consumed samples reach ``samples``."""
        if samples <= 0:
            return 0
        floor = int(self.iterations_at_samples(samples))
        return floor if self.samples_at_iteration(floor) >= samples else floor + 1

    def tokens(self, samples: int) -> int:
        """Tokens in ``samples`` samples of ``seq_length`` tokens."""
        return int(samples) * self.seq_length


def train_iterations_from_args(args, batch_schedule: Optional[BatchSchedule] = None) -> int:
    """Optimizer steps (iterations) of the run: ``--train-iters``, or the whole global batches
    that fit in ``--train-samples`` under the (rampup-aware) batch schedule, rounded down.

    This is Megatron-LM's ``update_train_iters``: ``train_samples // global_batch_size`` without
    rampup (128017 samples at batch 64: 2000 iterations); with rampup, the iterations of the rampup
    phase (its loop: one iteration per batch while consumed samples <= the rampup samples) plus the
    whole full batches in the rest, which is the floor inverse
    :meth:`BatchSchedule.iterations_at_samples`. A partial last batch is dropped. (When
    ``--train-samples`` ends inside the rampup phase, Megatron-LM subtracts whole *full* batches
    from the rampup iterations; here it is the same floor: the iterations whose samples fit.)"""
    if args.train_iters is not None:
        return int(args.train_iters)
    schedule = batch_schedule or batch_schedule_from_args(args)
    return int(schedule.iterations_at_samples(int(args.train_samples)))


def train_samples_from_args(args, batch_schedule: Optional[BatchSchedule] = None) -> int:
    """Samples the planned iterations consume: the sum of the batch schedule's global batch sizes
    over :func:`train_iterations_from_args` iterations. Training sets are sized from this, so the
    last iteration never runs out of data (``--train-samples`` off a batch boundary drops the
    partial batch, as Megatron-LM does)."""
    schedule = batch_schedule or batch_schedule_from_args(args)
    return schedule.samples_at_iteration(train_iterations_from_args(args, schedule))


def batch_schedule_from_args(args) -> BatchSchedule:
    """The run's :class:`BatchSchedule` from ``--global-batch-size``, ``--rampup-batch-size``,
    ``--seq-length``."""
    return BatchSchedule(
        global_batch_size=args.global_batch_size,
        rampup=tuple(int(x) for x in args.rampup_batch_size) if args.rampup_batch_size else None,
        seq_length=args.seq_length,
    )
