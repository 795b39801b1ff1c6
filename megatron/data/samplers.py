"""Batch samplers that resume at a consumed-samples offset.

The global sample order is fixed: global batch ``k`` covers dataset indices
``[consumed, consumed + batch)`` whatever the data-parallel size. Each step of the sampler yields the
micro batch of one rank: the ``mbs x dp`` consecutive indices of a step are split into ``dp`` slices of
``mbs`` and rank ``r`` takes slice ``r`` (Megatron-LM's ``MegatronPretrainingSampler`` rule).
"""
from typing import Iterator, List


class PretrainingBatchSampler:
    """Yields this rank's micro batches (lists of dataset indices), starting at ``consumed_samples``.

    Args:
        total_samples: dataset length (samples).
        consumed_samples: samples already consumed by the whole run before this point.
        micro_batch_size: samples per rank per micro batch.
        data_parallel_rank, data_parallel_size: this rank and the number of data-parallel ranks.
    """

    def __init__(self, total_samples: int, consumed_samples: int, micro_batch_size: int,
                 data_parallel_rank: int, data_parallel_size: int):
        if total_samples <= 0:
            raise ValueError(f"no samples to draw from (total_samples={total_samples})")
        if not 0 <= data_parallel_rank < data_parallel_size:
            raise ValueError(f"data_parallel_rank {data_parallel_rank} outside [0, {data_parallel_size})")
        if consumed_samples >= total_samples:
            raise ValueError(f"consumed_samples {consumed_samples} >= dataset size {total_samples}: the "
                             "dataset was built for fewer samples than the run consumes")
        self.total_samples = total_samples
        self.consumed_samples = consumed_samples
        self.micro_batch_size = micro_batch_size
        self.data_parallel_rank = data_parallel_rank
        self.step = micro_batch_size * data_parallel_size

    def __len__(self) -> int:
        return (self.total_samples - self.consumed_samples) // self.step

    def __iter__(self) -> Iterator[List[int]]:
        start = self.data_parallel_rank * self.micro_batch_size
        for first in range(self.consumed_samples, self.total_samples - self.step + 1, self.step):
            yield list(range(first + start, first + start + self.micro_batch_size))
