"""Process setup: torch.distributed through DeepSpeed, megatron-core model parallel state, seeds."""
import os
import random

import numpy as np
import torch


def default_backend() -> str:
    """nccl when CUDA is usable, else gloo (DeepSpeed's CPU accelerator would pick oneCCL)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def initialize_distributed(args) -> None:
    """Start torch.distributed (DeepSpeed's launcher sets RANK/WORLD_SIZE/MASTER_*; a plain
    ``python`` run becomes a 1-rank group) and megatron-core's tensor/pipeline/data-parallel
    groups (megatron/parallel/topology.py)."""
    import deepspeed
    from megatron.parallel.topology import initialize_model_parallel

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    if not torch.distributed.is_initialized():
        deepspeed.init_distributed(dist_backend=args.distributed_backend or default_backend(),
                                   verbose=False)
    initialize_model_parallel(args)


def set_seeds(seed: int) -> None:
    """Seed Python, NumPy and torch identically on every rank (megatron-core's tensor-parallel RNG
    tracker too, when CUDA is present)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def print_rank_0(message: str) -> None:
    """Print on global rank 0 only (flushes, so launcher logs interleave sensibly)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(message, flush=True)


def quiet_optional_dependency_warnings() -> None:
    """Hide megatron-core's import-time notices that optional Apex / Transformer Engine kernels are
    absent (expected on CPU; the fallbacks are the intended path). Call before importing
    megatron.core."""
    import warnings

    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).*not installed")
    warnings.filterwarnings("ignore", message=r"full scope is deprecated")


def all_reduce_small(tensor: torch.Tensor, op=None) -> torch.Tensor:
    """All-reduce a small tensor (flags, loss sums) over all ranks and return the result on the
    CPU. The reduction runs where the backend needs it: on this rank's GPU for nccl, which cannot
    reduce CPU tensors, else on the CPU. Without a process group the tensor is returned as is."""
    if not torch.distributed.is_initialized():
        return tensor
    on_gpu = torch.distributed.get_backend() == "nccl"
    work = tensor.to(torch.device("cuda", torch.cuda.current_device())) if on_gpu else tensor.clone()
    torch.distributed.all_reduce(work, op=op if op is not None else torch.distributed.ReduceOp.SUM)
    return work.cpu()
