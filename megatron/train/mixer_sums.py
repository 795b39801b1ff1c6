"""The adaptive mixer's per-dataset loss sums of an update interval, kept on the device in fixed
point and reduced over the model replicas only when the mixer reads them (issue 46 item 6).

Each micro batch adds, per dataset, its samples' losses times their weights (what the log
interval's per-dataset loss averages: 1 per sample, or its loss tokens under
--calculate-per-token-loss) and those weights, each rounded to a multiple of 2**-:data:`SCALE_BITS`
(about 1e-6) and held as int64. Integer sums are exact, so the total of an interval is the same
whatever order the micro batches, ranks and reductions add it in, and however often it is read:
a run that reduces it once at the update equals one that also reduced part of it before a
checkpoint and resumed from there, bit for bit, on any number of replicas. (A float sum would
round differently in each case, and a GPU's float ``index_add_`` is not even deterministic.)
Adding never waits for the device; the host reads the sums once per update or checkpoint.
"""
from typing import Optional, Tuple

import numpy as np
import torch

from megatron.data.device_transfer import to_device_async
from megatron.train.stats import _reduce_loss_sums

__all__ = ["MixerLossSums", "SCALE_BITS", "to_fixed"]

SCALE_BITS = 20  # the sums' unit: 2**-20 (nats x weight, and weight); int64 holds 8.8e12 units' worth
_SCALE = float(2 ** SCALE_BITS)


def to_fixed(values: torch.Tensor) -> torch.Tensor:
    """``values`` (float) as int64 multiples of 2**-SCALE_BITS, rounded to the nearest."""
    return torch.round(values.double() * _SCALE).to(torch.int64)


class MixerLossSums:
    """One interval's per-dataset loss sums and weights over ``num_datasets`` datasets, in fixed
    point on the losses' device, summed over the replicas when taken (the loss sums' reduction:
    over the pipeline stages, then the data-parallel replicas)."""

    def __init__(self, num_datasets: int):
        self.num_datasets = num_datasets
        self.local: Optional[torch.Tensor] = None  # [2, k] int64: loss x weight, weight

    def add_micro_batch(self, loss: torch.Tensor, per_sample: torch.Tensor,
                        dataset_id: Optional[torch.Tensor], weight: float = 1.0,
                        sample_weights: Optional[torch.Tensor] = None,
                        loss_tokens: Optional[torch.Tensor] = None) -> None:
        """One micro batch's per-sample losses (nats) of datasets ``dataset_id``, weighted by
        ``sample_weights`` (default 1 each); the other arguments are the log interval's
        (megatron/train/stats.py ``_IntervalStats.add_micro_batch``) and unused here."""
        del loss, weight, loss_tokens  # the mixer reads the per-dataset losses only
        device = per_sample.device
        if self.local is None:
            self.local = torch.zeros(2, max(self.num_datasets, 1), dtype=torch.int64, device=device)
        if dataset_id is None:
            if self.num_datasets != 1:
                return
            dataset_id = torch.zeros(per_sample.numel(), dtype=torch.long)
        ids = to_device_async(torch.as_tensor(dataset_id).long().view(-1), device)
        counts = (torch.ones(ids.numel(), dtype=torch.float64, device=device)
                  if sample_weights is None
                  else to_device_async(sample_weights.double().view(-1), device))
        self.local[0].index_add_(0, ids, to_fixed(per_sample.detach().double().view(-1) * counts))
        self.local[1].index_add_(0, ids, to_fixed(counts))

    def take(self) -> Tuple[np.ndarray, np.ndarray]:
        """The sums added since the last take, over the replicas (the same on every rank: call it
        on every rank), as int64 host arrays (loss x weight, weight; units of 2**-SCALE_BITS);
        resets them."""
        k = max(self.num_datasets, 1)
        local = self.local if self.local is not None else torch.zeros(2, k, dtype=torch.int64)
        self.local = None
        total = _reduce_loss_sums(local.reshape(-1)).numpy().reshape(2, k)
        return total[0].astype(np.int64), total[1].astype(np.int64)

