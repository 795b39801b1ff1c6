"""A dataset's samples over any number of epochs, numbered so that sample ``k`` is the same
whatever the run draws in all: the ledger's unit of position (megatron/data/mix_ledger.py).

Sample ``k`` of a dataset with ``n`` samples per epoch is position ``k % n`` of epoch ``k // n``.
Epoch 0 is megatron-core's ``GPTDataset`` built for exactly one epoch (its document shuffle, its
``seq_length + 1``-token windows, its sample shuffle); epoch ``e >= 1`` shows the same windows in a
fresh order, a permutation drawn from numpy's generator seeded ``(seed, e)``. The windows of an
epoch never depend on how many samples are drawn, so a run whose mix changes mid-way (and thus
draws more or fewer samples of a dataset) continues each dataset at its ledger position without
repeating or skipping a sample of the epoch in progress. (megatron-core's multi-epoch
``GPTDataset`` instead shuffles documents and samples across all the epochs it is sized for, so
its sample ``k`` changes with that size.) Fixed windows reshuffled per epoch is also how
OLMo-core's numpy datasets repeat data.

For a dataset drawn less than one epoch the samples are exactly those of megatron-core's
``GPTDataset`` (and of its ``BlendedMegatronDatasetBuilder`` blends).
"""
from collections import OrderedDict
from typing import Any, Dict, List, Tuple

import numpy as np
import torch

__all__ = ["EpochShuffledSamples", "epoch_permutation", "gpt_sample_documents"]

_PERMUTATION_TAG = 0x6570  # "ep": keeps these streams apart from other users of (seed, e)


def epoch_permutation(seed: int, epoch: int, samples_per_epoch: int) -> np.ndarray:
    """The order of epoch ``epoch`` (>= 1) over the ``samples_per_epoch`` positions of epoch 0:
    position ``p`` of that epoch is position ``perm[p]`` of epoch 0 (int32 below 2**31 samples)."""
    rng = np.random.default_rng([int(seed), int(epoch), _PERMUTATION_TAG])
    perm = rng.permutation(int(samples_per_epoch))
    return perm.astype(np.int32) if samples_per_epoch < 2 ** 31 else perm


def gpt_sample_documents(dataset, position: int) -> List[List[int]]:
    """``[[sequence_id, first_token, last_token], ...]`` of sample ``position`` of a megatron-core
    ``GPTDataset``: the ``.idx`` sequences (documents, for data preprocessed one document per
    sequence) its ``seq_length + 1`` tokens come from, in order, each with the first and last
    (inclusive) token offsets read from it."""
    idx = int(dataset.shuffle_index[position])
    beg, beg_off = (int(x) for x in dataset.sample_index[idx])
    end, end_off = (int(x) for x in dataset.sample_index[idx + 1])
    extra = int(dataset.config.add_extra_token_to_sequence)
    lengths = dataset.dataset.sequence_lengths
    out = []
    for i in range(beg, end + 1):
        doc = int(dataset.document_index[i])
        first = beg_off if i == beg else 0
        last = end_off + extra - 1 if i == end else int(lengths[doc]) - 1
        if last >= first:
            out.append([doc, first, last])
    return out


class EpochShuffledSamples(torch.utils.data.Dataset):
    """Samples ``k = epoch * n + position`` of a one-epoch dataset of ``n`` samples (see the
    module docstring). ``len()`` is ``num_samples`` (the samples a run may draw; any ``k`` is
    valid as long as it is below it).

    Args:
        epoch_dataset: a map-style dataset holding exactly one epoch (``len()`` = ``n``), e.g. a
            megatron-core ``GPTDataset`` built for ``n`` samples.
        seed: seeds the orders of epochs >= 1.
        num_samples: samples this object serves (``k < num_samples``).
    """

    _CACHED_EPOCHS = 2  # permutations kept per process (a window crossing an epoch needs two)

    def __init__(self, epoch_dataset, seed: int, num_samples: int):
        self.epoch_dataset = epoch_dataset
        self.samples_per_epoch = len(epoch_dataset)
        if self.samples_per_epoch <= 0:
            raise ValueError("a dataset with no sample in an epoch cannot be drawn from")
        self.seed = int(seed)
        self.num_samples = int(num_samples)
        self._orders: "OrderedDict[int, np.ndarray]" = OrderedDict()

    def __len__(self) -> int:
        return self.num_samples

    def epoch_and_position(self, k: int) -> Tuple[int, int]:
        """(epoch, position in that epoch's order) of sample ``k``."""
        return divmod(int(k), self.samples_per_epoch)

    def epoch_position(self, k: int) -> int:
        """The position in epoch 0's order (the one-epoch dataset's index) that sample ``k`` reads."""
        epoch, position = self.epoch_and_position(k)
        if epoch == 0:
            return position
        order = self._orders.get(epoch)
        if order is None:
            order = epoch_permutation(self.seed, epoch, self.samples_per_epoch)
            self._orders[epoch] = order
            while len(self._orders) > self._CACHED_EPOCHS:
                self._orders.popitem(last=False)
        else:
            self._orders.move_to_end(epoch)
        return int(order[position])

    def __getitem__(self, k: int) -> Dict[str, Any]:
        if not 0 <= int(k) < self.num_samples:
            raise IndexError(f"sample {k} outside [0, {self.num_samples})")
        return self.epoch_dataset[self.epoch_position(k)]

    def sample_documents(self, k: int) -> List[List[int]]:
        """``[[sequence_id, first_token, last_token], ...]`` that sample ``k`` is read from (the
        one-epoch dataset must be a megatron-core ``GPTDataset``)."""
        return gpt_sample_documents(self.epoch_dataset, self.epoch_position(k))

    def token_ranges(self, k: int) -> Tuple[int, List[List[int]]]:
        """(epoch, ``[[start, end)]``): the offsets of sample ``k``'s input tokens in the
        dataset's token stream (its documents in the one-epoch dataset's document order; the
        one-epoch dataset must be a megatron-core ``GPTDataset``): window ``j`` of ``L`` tokens
        reads ``[j L, j L + L)``, and the next token as its last label."""
        epoch = int(k) // self.samples_per_epoch
        j = int(self.epoch_dataset.shuffle_index[self.epoch_position(k)])
        L = int(self.epoch_dataset.config.sequence_length)
        return epoch, [[j * L, (j + 1) * L]]

    def __getstate__(self):  # DataLoader workers: no permutation cache to copy
        state = dict(self.__dict__)
        state["_orders"] = OrderedDict()
        return state
