"""A toy adaptive-mixer run without a model, as the loop drives it (megatron/train/mixer.py): three
fake datasets of ``SPE`` samples each, made-up per-dataset losses, ``ITERS`` iterations of
``GBS`` samples. Shared by tests/unit/test_adaptive_mixer.py and test_mixture_export.py."""
import numpy as np

from helpers.curriculum import fake_constituents
from megatron.data.mix_resume import MixSources
from megatron.schedules.units import BatchSchedule

SEQ, GBS, ITERS, SPE = 16, 4, 12, 20
BS = BatchSchedule(GBS, None, SEQ)
N = ITERS * GBS
POLICIES = {"odm": {}, "ado": {"warmup": 3}, "loss_softmax": {"temperature": 0.1}}


class Source(list):
    def epoch_and_position(self, k):
        return divmod(k, SPE)


SOURCES = MixSources("blend_config", lambda b: fake_constituents(b, SPE, SEQ),
                     lambda c, n, seed: Source(range(n)))


def made_up_loss(dataset: int, sample: int, iteration: int) -> float:
    """A made-up training loss: dataset 1 learns slowest."""
    return (3.0 + dataset) * (1.0 + iteration) ** -(0.5 / (1 + 2 * (dataset == 1))) \
        + 0.01 * (sample % 7)


def train_iterations(mix, mixer, first: int, last: int):
    """Iterations ``first..last`` as the loop runs them: each draws its global batch from the
    mix's current dataset, the mixer adds its per-dataset losses; [(dataset, sample)] each."""
    draws = []
    k = len(mix.dataset.constituents)
    for it in range(first, last + 1):
        begin, end = BS.samples_at_iteration(it - 1), BS.samples_at_iteration(it)
        batch = [mix.dataset.locate(s) for s in range(begin, end)]
        sums, counts = np.zeros(k), np.zeros(k)
        for d, sample in batch:
            sums[d] += made_up_loss(d, sample, it)
            counts[d] += 1
        mixer.end_iteration(it, end, sums, counts)
        draws.append(batch)
    return draws
