"""Progress units: iterations <-> consumed samples <-> tokens, aware of batch-size rampup.

One iteration is one optimizer step over one global batch. With ``--rampup-batch-size START INCR
SAMPLES`` the global batch grows from START by INCR every ``SAMPLES / ((GBS - START) / INCR)``
consumed samples (megatron-core's ``RampupBatchsizeNumMicroBatchesCalculator`` rule); with
Megatron-LM's ``--step-batch-size-schedule 'T0:B0 T1:B1 ...'`` it is Bi from Ti tokens on. Either
way the mapping between iterations and samples is not linear; everything that converts goes
through :class:`BatchSchedule`.

Tokens are the tokens trained: samples x ``--seq-length``, or, under a truncating
sequence-length curriculum (megatron/schedules/seqlen.py), the sum over iterations of global
batch x that iteration's length (Microsoft Megatron-DeepSpeed's ``consumed_train_tokens``).
"""
import math
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

import numpy as np

from megatron.schedules.seqlen_plan import SeqLengthPlan

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
        steps: ``((threshold_samples, batch), ...)`` (first threshold 0, increasing; the last
            batch is ``global_batch_size``): the batch is the one of the last threshold reached
            by the consumed samples (Megatron-LM's step batch size schedule); ``None`` without.
        seq_plan: the sequence-length curriculum's lengths per iteration, or ``None``; a
            truncating one makes tokens the sum of global batch x length over iterations.
    """

    global_batch_size: int
    rampup: Optional[Sequence[int]] = None
    seq_length: int = 1
    steps: Optional[Tuple[Tuple[int, int], ...]] = None
    seq_plan: Optional[SeqLengthPlan] = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if self.steps is not None:
            steps = tuple((int(t), int(b)) for t, b in self.steps)
            object.__setattr__(self, "steps", steps)
            if self.rampup:
                raise ValueError("a batch schedule has either a rampup or steps, not both")
            if steps[0][0] != 0 or any(b[0] <= a[0] for a, b in zip(steps, steps[1:], strict=False)):
                raise ValueError(f"step thresholds must start at 0 and increase: {steps}")
            if steps[-1][1] != self.global_batch_size:
                raise ValueError(f"the last step's batch {steps[-1][1]} is not the global batch "
                                 f"size {self.global_batch_size}")

    def batch_size_at_samples(self, consumed_samples: int) -> int:
        """Global batch size (samples) of the iteration that starts after ``consumed_samples``."""
        if not self.rampup and not self.steps:
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
        key = (self.global_batch_size, tuple(int(x) for x in self.rampup) if self.rampup else None,
               self.steps)
        table = _RAMP_TABLES.get(key)
        if table is not None:
            return table
        values = [0]
        if self.steps:
            # within step i (batch b until threshold t_{i+1}), iterations add b while the samples
            # consumed before them are below t_{i+1}
            pieces = [np.zeros(1, dtype=np.int64)]
            consumed = 0
            for (_, batch), (end, _) in zip(self.steps, self.steps[1:], strict=False):
                if consumed < end:
                    n = -(-(end - consumed) // batch)
                    pieces.append(consumed + batch * np.arange(1, n + 1, dtype=np.int64))
                    consumed += n * batch
            values = np.concatenate(pieces)
        elif self.rampup:
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
        if self.steps:
            thresholds = np.array([t for t, _ in self.steps], dtype=np.float64)
            batches = np.array([b for _, b in self.steps], dtype=np.int64)
            return batches[np.searchsorted(thresholds, c, side="right") - 1]
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

    def _token_table(self) -> Optional[np.ndarray]:
        """Tokens trained before iteration ``i`` for i in [0, len(plan)] under a truncating
        sequence-length plan (None without one)."""
        plan = self.seq_plan
        if plan is None or not plan.truncates:
            return None
        table = getattr(self, "_tokens_before", None)
        if table is None:
            n = plan.lengths.size
            batches = np.diff(self.samples_at_iterations(np.arange(n + 1, dtype=np.int64)))
            table = np.concatenate([[0], np.cumsum(batches * plan.lengths)]).astype(np.float64)
            table.setflags(write=False)
            object.__setattr__(self, "_tokens_before", table)
        return table

    def tokens_at_samples(self, samples) -> np.ndarray:
        """Tokens trained once ``samples`` samples are consumed (vectorised, float64): samples x
        ``seq_length``, or under a truncating plan the tokens of the whole iterations before plus
        the samples into the current one x its length."""
        s = np.asarray(samples, dtype=np.float64)
        table = self._token_table()
        if table is None:
            return s * self.seq_length
        n = table.size - 1
        it = np.minimum(self.iterations_at_samples(s), n)
        start = self.samples_at_iterations(it).astype(np.float64)
        return table[it] + (s - start) * self.seq_plan.lengths_at(np.minimum(it, n - 1))

    def samples_at_tokens(self, tokens) -> np.ndarray:
        """The inverse of :meth:`tokens_at_samples` (vectorised, float64; fractional samples
        inside an iteration)."""
        t = np.asarray(tokens, dtype=np.float64)
        table = self._token_table()
        if table is None:
            return t / self.seq_length
        n = table.size - 1
        it = np.clip(np.searchsorted(table, t, side="right") - 1, 0, n)
        start = self.samples_at_iterations(it).astype(np.float64)
        return start + (t - table[it]) / self.seq_plan.lengths_at(np.minimum(it, n - 1))

    def samples_for_tokens(self, tokens: int) -> int:
        """The fewest consumed samples whose trained tokens reach ``tokens`` (the inverse of
        :meth:`tokens_at_samples`, rounded up; integer arithmetic without a truncating plan)."""
        if self._token_table() is None:
            return math.ceil(int(tokens) / self.seq_length)
        return math.ceil(float(self.samples_at_tokens(int(tokens))) - 1e-9)

    def tokens_at_iterations(self, iterations) -> np.ndarray:
        """Tokens trained in the first ``iterations`` iterations (vectorised, float64)."""
        return self.tokens_at_samples(self.samples_at_iterations(np.asarray(iterations)))

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
        """Tokens trained in the first ``samples`` samples (:meth:`tokens_at_samples`)."""
        if self._token_table() is None:
            return int(samples) * self.seq_length
        return int(round(float(self.tokens_at_samples(int(samples)))))


def train_iterations(train_iters: Optional[int], train_samples: Optional[int],
                     batch_schedule: BatchSchedule) -> int:
    """Optimizer steps (iterations) of the run: ``train_iters`` (``--train-iters``), or the whole
    global batches that fit in ``train_samples`` (``--train-samples``, samples) under the
    (rampup-aware) ``batch_schedule``, rounded down.

    This is Megatron-LM's ``update_train_iters``: ``train_samples // global_batch_size`` without
    rampup (128017 samples at batch 64: 2000 iterations); with rampup, the iterations of the rampup
    phase (its loop: one iteration per batch while consumed samples <= the rampup samples) plus the
    whole full batches in the rest, which is the floor inverse
    :meth:`BatchSchedule.iterations_at_samples`. A partial last batch is dropped. (When
    ``--train-samples`` ends inside the rampup phase, Megatron-LM subtracts whole *full* batches
    from the rampup iterations; here it is the same floor: the iterations whose samples fit.)"""
    if train_iters is not None:
        return int(train_iters)
    return int(batch_schedule.iterations_at_samples(int(train_samples)))


def planned_samples(train_iters: Optional[int], train_samples: Optional[int],
                    batch_schedule: BatchSchedule) -> int:
    """Samples the planned iterations consume: the sum of ``batch_schedule``'s global batch sizes
    over :func:`train_iterations` iterations. Training sets are sized from this, so the last
    iteration never runs out of data (``--train-samples`` off a batch boundary drops the partial
    batch, as Megatron-LM does)."""
    return batch_schedule.samples_at_iteration(
        train_iterations(train_iters, train_samples, batch_schedule))


@dataclass(frozen=True)
class BatchConfig:
    """The batch flags after validation (fields are their argparse dests): ``--global-batch-size``
    (samples), ``--rampup-batch-size START INCREMENT SAMPLES`` (or None), ``batch_size_steps``
    (``--step-batch-size-schedule`` as validate_args parses it: ``[(threshold_samples, batch),
    ...]``, or None), ``--seq-length`` (tokens per sample) and ``seq_length_plan`` (the
    sequence-length curriculum's :class:`SeqLengthPlan` validation made, or None)."""

    global_batch_size: int
    rampup_batch_size: Optional[Sequence]
    batch_size_steps: Optional[Sequence[Sequence[int]]]
    seq_length: int
    seq_length_plan: Optional[SeqLengthPlan] = None


def batch_schedule(config: BatchConfig) -> BatchSchedule:
    """The run's :class:`BatchSchedule` of the validated batch flags."""
    steps = config.batch_size_steps
    return BatchSchedule(
        global_batch_size=config.global_batch_size,
        rampup=(tuple(int(x) for x in config.rampup_batch_size) if config.rampup_batch_size
                else None),
        seq_length=config.seq_length,
        steps=tuple(tuple(step) for step in steps) if steps else None,
        seq_plan=config.seq_length_plan,
    )


_SUFFIXES = {"K": 10 ** 3, "M": 10 ** 6, "B": 10 ** 9, "T": 10 ** 12}


def _count_with_suffix(text: str) -> int:
    """``"2.4B"`` -> 2400000000: Megatron-LM's number syntax (K/M/B/T, any case; the value
    ``int(float(number) * multiplier)``)."""
    text = text.strip().upper()
    multiplier = _SUFFIXES.get(text[-1:], 1)
    if multiplier != 1:
        text = text[:-1]
    return int(float(text) * multiplier)


def parse_step_batch_size_schedule(text: str, seq_length: int) -> List[Tuple[int, int]]:
    """Megatron-LM's ``--step-batch-size-schedule`` as ``[(threshold_samples, batch), ...]``.

    ``text`` is ``"T0:B0 T1:B1 ..."`` (spaces or commas between entries): from ``Ti`` consumed
    tokens on the global batch is ``Bi`` samples. Numbers take K/M/B/T suffixes (1e3 ... 1e12).
    As megatron-core's ``StepBatchsizeNumMicroBatchesCalculator`` (Megatron-LM's training passes
    ``--seq-length``, so thresholds are tokens): each threshold becomes ``Ti // seq_length``
    samples, entries are sorted by threshold, the first must be 0, thresholds must strictly
    increase (in samples) and batches be positive. ``ValueError`` names the entry otherwise."""
    steps = []
    for entry in text.replace(",", " ").split():
        threshold, sep, batch = entry.partition(":")
        try:
            if not sep:
                raise ValueError
            tokens, size = _count_with_suffix(threshold), _count_with_suffix(batch)
        except ValueError:
            raise ValueError(f"entry {entry!r} is not TOKENS:BATCH (numbers, optionally with a "
                             "K/M/B/T suffix)") from None
        if size <= 0 or tokens < 0:
            raise ValueError(f"entry {entry!r}: the batch must be positive and the threshold "
                             "non-negative")
        steps.append((tokens // seq_length, size, entry))
    if not steps:
        raise ValueError("no TOKENS:BATCH entries")
    steps.sort(key=lambda step: step[0])
    if steps[0][0] != 0:
        raise ValueError(f"the first threshold must be 0 (got {steps[0][2]!r})")
    for before, after in zip(steps, steps[1:], strict=False):
        if after[0] <= before[0]:
            raise ValueError(f"thresholds {before[2]!r} and {after[2]!r} fall on the same sample "
                             f"({after[0]} at --seq-length {seq_length}); thresholds must "
                             "increase")
    return [(samples, size) for samples, size, _ in steps]


def token_budget_iterations(train_tokens: int, batch_schedule: BatchSchedule) -> int:
    """Iterations a ``--train-tokens`` budget allows: the smallest ``i`` whose consumed tokens
    (samples after ``i`` iterations x seq length, rampup aware) reach ``train_tokens``. This is
    where Microsoft's loop (``while consumed_train_tokens < train_tokens``) stops. Under a
    truncating sequence-length plan the tokens are those trained (global batch x length)."""
    return batch_schedule.iterations_for_samples(batch_schedule.samples_for_tokens(train_tokens))
