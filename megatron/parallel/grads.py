"""Gradients under tensor parallelism: the sequence-parallel gradient all-reduce and the norm of
the whole model's gradient.

Under ``--sequence-parallel`` each tensor-parallel rank runs the norms (and the biases added after
row-parallel linears) on its own slice of the sequence, so their gradients are partial sums that
must be added over the tensor-parallel group. megatron-core does this in ``finalize_model_grads``
after its own backward; DeepSpeed has no such step and reduces gradients over the data-parallel
group (ZeRO-1/2 already inside the backward), so here the sum is a gradient hook on each such
parameter: it runs as the micro batch's gradient for the parameter is produced, before DeepSpeed
accumulates or reduces it.
"""
from typing import Iterable, List

import torch


def sequence_parallel_parameters(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    """Parameters megatron-core marks ``sequence_parallel`` (replicated over the tensor-parallel
    group but fed a sequence slice, so their gradients are partial)."""
    return [p for p in model.parameters() if p.requires_grad and getattr(p, "sequence_parallel", False)]


def install_sequence_parallel_grad_allreduce(model: torch.nn.Module, group) -> int:
    """Hook every sequence-parallel parameter of ``model`` so that each micro batch's gradient is
    summed over ``group`` (the tensor-parallel group) before DeepSpeed sees it; returns how many
    parameters were hooked. The one place this all-reduce happens."""
    params = sequence_parallel_parameters(model)

    def all_reduce(grad: torch.Tensor) -> torch.Tensor:
        summed = grad.clone()
        torch.distributed.all_reduce(summed, group=group)
        return summed

    for p in params:
        p.register_hook(all_reduce)
    return len(params)


def global_grad_norm(parameters: Iterable[torch.nn.Parameter], mpu) -> float:
    """L2 norm of the whole model's gradient: tensor-parallel shards (``tensor_model_parallel``
    attribute) each counted once, parameters replicated over the tensor-parallel group counted on
    its rank 0 only, squares summed over the model-parallel group (tensor x pipeline) of ``mpu``.
    A collective over that group."""
    from deepspeed.runtime.utils import is_model_parallel_parameter

    tp_rank = mpu.get_tensor_model_parallel_rank()
    square = torch.zeros(1, dtype=torch.float64)
    for p in parameters:
        if p.grad is not None and (tp_rank == 0 or is_model_parallel_parameter(p)):
            square += p.grad.detach().double().pow(2).sum().cpu()
    if mpu.get_model_parallel_world_size() > 1:
        from megatron.initialize import all_reduce_small

        square = all_reduce_small(square, group=mpu.get_model_parallel_group())
    return float(square.sqrt().item())
