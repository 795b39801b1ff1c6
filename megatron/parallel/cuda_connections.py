"""``CUDA_DEVICE_MAX_CONNECTIONS``: one hardware work queue per GPU where Megatron-LM requires it.

Megatron-LM's ``validate_args`` asserts ``CUDA_DEVICE_MAX_CONNECTIONS=1`` with tensor (or
context) parallelism on GPUs before Blackwell (compute capability < 10): megatron-core's
tensor-parallel layers (sequence parallelism, the asynchronous gradient all-reduce) rely on the GPU
running their communication kernels in the order they are queued, ahead of the computation they
overlap with, which only one connection guarantees. The CUDA driver reads the variable when it
creates a device's context, so it is set before this process touches the GPU
(``megatron.parallel.initialize.initialize_distributed``, before ``torch.cuda.set_device``): unset, it
becomes 1; set to another value on a GPU that needs 1, the run stops naming it.
"""
from typing import Callable, MutableMapping, Optional, Tuple

from megatron.errors import ConfigError

VARIABLE = "CUDA_DEVICE_MAX_CONNECTIONS"
FIRST_UNCONSTRAINED_MAJOR = 10  # Blackwell: Megatron-LM no longer requires the variable


def required_max_connections(tensor_parallel_size: int, device_type: str,
                             compute_capability: Optional[Tuple[int, int]] = None) -> Optional[str]:
    """``"1"`` where Megatron-LM requires ``CUDA_DEVICE_MAX_CONNECTIONS=1``: tensor parallelism
    on a CUDA device of compute capability (major, minor) below 10 (unknown counts as below);
    None where it asks nothing."""
    if device_type != "cuda" or tensor_parallel_size <= 1:
        return None
    if compute_capability is not None and compute_capability[0] >= FIRST_UNCONSTRAINED_MAJOR:
        return None
    return "1"


def apply_max_connections(tensor_parallel_size: int, device_type: str,
                          environ: MutableMapping[str, str],
                          compute_capability: Callable[[], Tuple[int, int]]) -> Optional[str]:
    """Set ``CUDA_DEVICE_MAX_CONNECTIONS=1`` in ``environ`` where it is required and unset
    (returns a start-up note saying so); raise ConfigError naming the variable, its value and
    the GPU when it is set to another value on a GPU that needs 1. ``compute_capability()`` is
    asked only in that case (it may start CUDA, after which the variable no longer counts)."""
    required = required_max_connections(tensor_parallel_size, device_type)
    if required is None:
        return None
    current = environ.get(VARIABLE)
    if current is None:
        environ[VARIABLE] = required
        return (f"{VARIABLE}={required} set: Megatron-LM requires it with "
                f"--tensor-model-parallel-size {tensor_parallel_size} on GPUs before Blackwell "
                "(set it yourself to choose another value on Blackwell)")
    if current.strip() == required:
        return None
    capability = tuple(compute_capability())
    if required_max_connections(tensor_parallel_size, device_type, capability) is None:
        return None
    raise ConfigError(
        f"{VARIABLE}={current} with --tensor-model-parallel-size {tensor_parallel_size} on a GPU of "
        f"compute capability {capability[0]}.{capability[1]}: Megatron-LM requires {VARIABLE}=1 "
        f"before Blackwell (compute capability {FIRST_UNCONSTRAINED_MAJOR}), so that the "
        "tensor-parallel communication runs in the order it is queued, ahead of the computation "
        f"it overlaps with; unset it (it is then set to 1) or set it to 1")
