"""The peer of the batch-size rampup tests: megatron-core's ``RampupBatchsizeNumMicroBatchesCalculator``.

megatron-core 0.16 ships it; later releases dropped it (Megatron-LM made ``--rampup-batch-size``
inert, their PR #4411). Where it is gone, :class:`RestatedRampupCalculator` stands in: its rule
restated from megatron-core 0.16.1, ``megatron/core/num_microbatches_calculator.py``,
``RampupBatchsizeNumMicroBatchesCalculator.__init__``/``update`` (the same float division and
truncation), and :data:`RECORDED_0_16_1` holds batch sizes the 0.16.1 class gave, so the
restatement is checked against the original on every stack (tests/unit/test_units_and_samplers.py).
"""
from typing import Dict, List, Tuple


class RestatedRampupCalculator:
    """megatron-core 0.16.1's rampup calculator (same constructor arguments, ``update`` and
    ``get_current_global_batch_size``): from ``start_global_batch_size`` the global batch grows by
    ``batch_size_increment`` every ``ramup_samples / increments`` consumed samples (float
    division, truncated), and is ``global_batch_size`` once more than ``ramup_samples`` samples
    are consumed."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int,
                 decrease_batch_size_if_needed: bool, rank: int, start_global_batch_size: int,
                 batch_size_increment: int, ramup_samples: int):
        diff = global_batch_size - start_global_batch_size
        assert diff >= 0 and diff % batch_size_increment == 0
        self.global_batch_size = global_batch_size
        self.start_global_batch_size = start_global_batch_size
        self.batch_size_increment = batch_size_increment
        self.ramup_samples = ramup_samples
        self.rampup_samples_per_increment = ramup_samples / (diff // batch_size_increment)
        self.current_global_batch_size = None
        self.update(0, False)

    def update(self, consumed_samples: int, consistency_check: bool, verbose: bool = False) -> None:
        """Set the global batch size (samples) after ``consumed_samples`` samples."""
        if consumed_samples > self.ramup_samples:
            self.current_global_batch_size = self.global_batch_size
        else:
            steps = int(consumed_samples / self.rampup_samples_per_increment)
            self.current_global_batch_size = (self.start_global_batch_size
                                              + steps * self.batch_size_increment)

    def get_current_global_batch_size(self) -> int:
        """The global batch size (samples) of the last :meth:`update`."""
        return self.current_global_batch_size


# (global batch, start, increment, rampup samples) -> the first 40 global batch sizes of a run
# that consumes each batch in turn, as megatron-core 0.16.1's class gave them (recorded with it).
RECORDED_0_16_1: Dict[Tuple[int, int, int, int], List[int]] = {
    (16, 4, 4, 64): [4] * 6 + [8] * 3 + [12] * 2 + [16] * 29,
    (16, 2, 2, 100): [2] * 8 + [4] * 4 + [6, 6, 8, 8, 10, 10, 12, 14] + [16] * 20,
    (16, 4, 4, 100): [4] * 9 + [8] * 4 + [12] * 3 + [16] * 24,
    (64, 8, 8, 1000): [8] * 18 + [16] * 9 + [24] * 6 + [32] * 5 + [40] * 2,
    (12, 3, 3, 7): [3, 6] + [12] * 38,
}

try:
    from megatron.core.num_microbatches_calculator import (
        RampupBatchsizeNumMicroBatchesCalculator as PeerRampupCalculator,
    )
    PEER_IS_MEGATRON_CORE = True
except ImportError:  # megatron-core 0.18+
    PeerRampupCalculator = RestatedRampupCalculator
    PEER_IS_MEGATRON_CORE = False


def batch_sizes(calculator_class, global_batch: int, start: int, increment: int, samples: int,
                iterations: int = 40) -> List[int]:
    """The global batch sizes of ``iterations`` iterations, each consuming its batch."""
    calc = calculator_class(global_batch, 1, 1, False, 0, start, increment, samples)
    consumed, sizes = 0, []
    for _ in range(iterations):
        calc.update(consumed, False)
        sizes.append(calc.get_current_global_batch_size())
        consumed += sizes[-1]
    return sizes
