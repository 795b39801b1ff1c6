"""The training set's micro batches as the loop reads them: resumed at the consumed samples,
collated with the segment layout."""
from typing import Dict, Iterator, Optional

import torch

from megatron.config.run_config import LoopConfig
from megatron.data.samplers import PretrainingBatchSampler
from megatron.model.masks import collate_with_segment_layout


class LoaderIterator:
    """A DataLoader's iterator that the loop can :meth:`close`: its workers shut down when the
    last reference to the DataLoader's own iterator goes, which :meth:`close` drops."""

    def __init__(self, inner: Iterator[Dict]):
        self._inner: Optional[Iterator[Dict]] = inner

    def __iter__(self):
        return self

    def __next__(self) -> Dict:
        if self._inner is None:
            raise StopIteration
        return next(self._inner)

    def close(self) -> None:
        """Drop the DataLoader's iterator: its worker processes are told to stop and joined here
        (tens of milliseconds), their prefetched batches dropped."""
        self._inner = None


def _loader(dataset, consumed: int, loop: LoopConfig, total: Optional[int] = None) -> LoaderIterator:
    """This data-parallel rank's micro batches of ``dataset`` (``loop.micro_batch_size`` samples
    each) from global sample ``consumed`` up to ``total`` samples (default: all), loaded with
    ``loop.num_workers`` workers seeded by ``loop.seed``."""
    from megatron.core import parallel_state

    sampler = PretrainingBatchSampler(
        total_samples=total if total is not None else len(dataset), consumed_samples=consumed,
        micro_batch_size=loop.micro_batch_size,
        data_parallel_rank=parallel_state.get_data_parallel_rank(),
        data_parallel_size=parallel_state.get_data_parallel_world_size())
    # Own generator: creating a DataLoader iterator otherwise draws its worker base seed from the
    # global torch RNG, which would shift the dropout stream of a resumed run (exact resume).
    # The collate adds the host-computed segment layout (megatron/model/masks.py); pinning happens
    # in the one-copy transfer to the device (megatron/data/device_transfer.py).
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=loop.num_workers,
                                         collate_fn=collate_with_segment_layout, pin_memory=False,
                                         persistent_workers=False,
                                         generator=torch.Generator().manual_seed(loop.seed))
    return LoaderIterator(iter(loader))
