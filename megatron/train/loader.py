"""The training set's micro batches as the loop reads them: resumed at the consumed samples,
collated with the segment layout."""
from typing import Dict, Iterator, Optional

import torch

from megatron.config.run_config import LoopConfig
from megatron.data.samplers import PretrainingBatchSampler
from megatron.model.masks import collate_with_segment_layout


def _loader(dataset, consumed: int, loop: LoopConfig, total: Optional[int] = None) -> Iterator[Dict]:
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
    return iter(loader)
