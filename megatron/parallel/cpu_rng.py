"""megatron-core's model-parallel RNG tracker and activation recompute on machines without CUDA.

megatron-core keeps dropout streams in a tracker of *CUDA* generator states
(``tensor_parallel.random``): ``model_parallel_cuda_manual_seed`` seeds them, ``tracker.fork()``
runs sequence-/tensor-parallel dropout on the ``model-parallel-rng`` stream, and
``tensor_parallel.checkpoint`` (activation recompute) saves and restores the CUDA state around the
recomputed forward. Without CUDA each of these calls ``torch.cuda.get_rng_state`` and fails.

On CPU the tensors' generator is the CPU one, so :func:`use_cpu_generator_for_model_parallel_rng`
points megatron-core's two device-state hooks at the CPU generator and installs a tracker whose
streams are CPU generator states. Recompute then restores the CPU state the forward saw (the same
dropout masks, so recompute does not change results), and ``fork()`` swaps the CPU generator to the
named stream and back, as it swaps the CUDA generator on a GPU. Nothing changes when CUDA is
available.
"""
import contextlib
import functools
from typing import Optional

import torch

_MODEL_PARALLEL = "model-parallel-rng"
_DATA_PARALLEL = "data-parallel-rng"
_EXPERT_PARALLEL = "expert-parallel-rng"


def _cpu_get_state(device="cuda", clone=False, graph_safe=False):
    return torch.get_rng_state()


def _cpu_set_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


@functools.lru_cache(maxsize=None)
def _tracker_class():
    from megatron.core.tensor_parallel.random import CudaRNGStatesTracker

    class CpuRNGStatesTracker(CudaRNGStatesTracker):
        """The tracker with its streams kept as CPU generator states."""

        def add(self, name, seed):
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.seeds_.add(seed)
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=_MODEL_PARALLEL):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            outer = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(outer)

    return CpuRNGStatesTracker


def use_cpu_generator_for_model_parallel_rng() -> bool:
    """Without CUDA, make megatron-core's RNG tracker and ``tensor_parallel.checkpoint`` use the CPU
    generator (idempotent). Returns True when it did so, False when CUDA is available."""
    if torch.cuda.is_available():
        return False
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = _cpu_get_state
    mrandom._set_cuda_rng_state = _cpu_set_state
    if not isinstance(mrandom._CUDA_RNG_STATE_TRACKER, _tracker_class()):
        mrandom._CUDA_RNG_STATE_TRACKER = _tracker_class()()
        mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    return True


def model_parallel_manual_seed(seed: int, tp_rank: Optional[int] = None,
                               ep_rank: Optional[int] = None, etp_rank: Optional[int] = None) -> None:
    """Seed megatron-core's tracker as ``model_parallel_cuda_manual_seed`` does (data-parallel
    stream ``seed``, tensor-parallel stream ``seed + 2718 + tp_rank``, expert stream ``seed + 1024
    + 100 * ep_rank + etp_rank``; the ranks default to megatron-core's parallel state), on the
    GPU's generator when CUDA is present, else on CPU generator states."""
    from megatron.core import parallel_state, tensor_parallel

    if not use_cpu_generator_for_model_parallel_rng():
        tensor_parallel.model_parallel_cuda_manual_seed(seed, tp_rank=tp_rank, ep_rank=ep_rank,
                                                        etp_rank=etp_rank)
        return
    tp_rank = parallel_state.get_tensor_model_parallel_rank() if tp_rank is None else tp_rank
    ep_rank = parallel_state.get_expert_model_parallel_rank() if ep_rank is None else ep_rank
    etp_rank = parallel_state.get_expert_tensor_parallel_rank() if etp_rank is None else etp_rank
    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.reset()
    tracker.add(_DATA_PARALLEL, seed)
    tracker.add(_MODEL_PARALLEL, seed + 2718 + tp_rank)
    tracker.add(_EXPERT_PARALLEL, seed + 1024 + 100 * ep_rank + etp_rank)
