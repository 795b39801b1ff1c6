"""megatron-core's tensor-/sequence-parallel communication buffers on machines without CUDA.

megatron-core allocates the buffers of its sequence-parallel all-gathers and reduce-scatters with
``device=torch.cuda.current_device()`` (``tensor_parallel.mappings``, the backward of
``tensor_parallel.layers``' linear, ``utils.GlobalMemoryBuffer``, and the gather of
``--distribute-saved-activations`` in ``tensor_parallel.utils``), which fails on a CPU-only
machine although gloo runs those collectives. :func:`allocate_megatron_core_buffers_on_cpu` gives
those modules a view of ``torch`` whose ``torch.cuda.current_device()`` is the CPU, so the
buffers land where the tensors are; every other attribute is torch's own. Nothing changes when
CUDA is available.
"""
import importlib
import types

import torch

PATCHED_MODULES = ("megatron.core.tensor_parallel.mappings", "megatron.core.tensor_parallel.layers",
                   "megatron.core.tensor_parallel.utils", "megatron.core.utils")


class _CudaOnCpu:
    """``torch.cuda`` except ``current_device()``, which names the CPU."""

    @staticmethod
    def current_device() -> torch.device:
        return torch.device("cpu")

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _TorchOnCpu(types.ModuleType):
    """``torch`` with :class:`_CudaOnCpu` as ``torch.cuda``."""

    def __init__(self):
        super().__init__("torch")
        self.cuda = _CudaOnCpu()

    def __getattr__(self, name):
        return getattr(torch, name)


def allocate_megatron_core_buffers_on_cpu() -> bool:
    """Without CUDA, make megatron-core's tensor/sequence-parallel communication buffers CPU
    tensors (idempotent). Returns True when it did so, False when CUDA is available."""
    if torch.cuda.is_available():
        return False
    for name in PATCHED_MODULES:
        module = importlib.import_module(name)
        if not isinstance(module.torch, _TorchOnCpu):
            module.torch = _TorchOnCpu()
    return True
