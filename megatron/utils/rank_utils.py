"""Rank-aware helpers every layer may use: printing on rank 0 and all-reducing small tensors.

A leaf module (it imports only torch), so the data, model, parallel and checkpoint modules need
not import ``megatron.parallel.initialize``, which starts the distributed processes.
"""
import torch


def print_rank_0(message: str) -> None:
    """Print on global rank 0 only (flushes, so launcher logs interleave sensibly)."""
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        print(message, flush=True)


def all_reduce_small(tensor: torch.Tensor, op=None, group=None) -> torch.Tensor:
    """All-reduce a small tensor (flags, loss sums) over ``group`` (default: all ranks) and return
    the result on the CPU. The reduction runs where the backend needs it: on this rank's GPU for
    nccl, which cannot reduce CPU tensors, else on the CPU. Without a process group the tensor is
    returned as is."""
    if not torch.distributed.is_initialized():
        return tensor
    on_gpu = torch.distributed.get_backend() == "nccl"
    work = tensor.to(torch.device("cuda", torch.cuda.current_device())) if on_gpu else tensor.clone()
    torch.distributed.all_reduce(work, op=op if op is not None else torch.distributed.ReduceOp.SUM,
                                 group=group)
    return work.cpu()
