"""Gradients under tensor parallelism: the sequence-parallel gradient all-reduce and the norm of
the whole model's gradient.

Under ``--sequence-parallel`` each tensor-parallel rank runs the norms (and the biases added after
row-parallel linears) on its own slice of the sequence, so their gradients are partial sums that
must be added over the tensor-parallel group. megatron-core does this once per step, after
gradient accumulation, in ``finalize_model_grads`` (one flattened all-reduce of all of them).
Here DeepSpeed runs the step, so the same reduction runs where DeepSpeed starts its
data-parallel reduction of the accumulated gradients (the two sums commute):
``engine.allreduce_gradients`` at the accumulation boundary (ZeRO 0 and 1; the pipe engine's
``ReduceGrads`` instruction calls it too) and the pipe engine's ``_bf16_reduce_grads``. It reduces
the tensors DeepSpeed is about to reduce (:func:`accumulated_gradient`).

ZeRO 2 (and ``overlap_comm``) reduce each gradient over data-parallel ranks inside the backward, as
it is produced, so there the sum runs after that reduction instead, on what it leaves: at the
boundary ``allreduce_gradients`` ends with the optimizer's epilogue, after which each rank holds its
partition of the step's accumulated gradient (``averaged_gradients``). The slices of that partition
that belong to sequence-parallel parameters are summed over the tensor-parallel group, one
flattened all-reduce per step (:func:`partition_slices`; tensor-parallel peers hold the same
partition layout, since their parameters have the same shapes). Only ZeRO-Offload (``cpu_offload``,
whose partition is filled by asynchronous copies) keeps the fallback: a hook on each parameter
sums every micro batch's gradient as it is produced (correct, one blocking all-reduce per parameter
and micro batch).
"""
from typing import Iterable, List

import torch

from megatron.utils.rank_utils import all_reduce_small


def sequence_parallel_parameters(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    """Parameters megatron-core marks ``sequence_parallel`` (replicated over the tensor-parallel
    group but fed a sequence slice, so their gradients are partial)."""
    return [p for p in model.parameters() if p.requires_grad and getattr(p, "sequence_parallel", False)]


PER_STEP = "once per step, after accumulation (one flattened all-reduce per dtype)"
PER_PARTITION = ("once per step, on this rank's ZeRO partition of the accumulated gradient "
                 "(one flattened all-reduce per dtype)")
PER_MICRO_BATCH = "per parameter and micro batch (ZeRO-Offload reduces inside the backward)"


def reduces_inside_backward(engine) -> bool:
    """True when DeepSpeed reduces gradients over data-parallel ranks inside the backward, as
    each is produced (ZeRO stage 2, or ``overlap_comm``), so no point after accumulation precedes
    that reduction."""
    return bool(engine.zero_optimization_partition_gradients() or
                (engine.zero_optimization() and engine.zero_overlap_comm()))


def partition_slices(optimizer, params: List[torch.nn.Parameter]) -> List[torch.Tensor]:
    """Views of the gradient partition DeepSpeed's ZeRO 1/2 ``optimizer`` holds after its epilogue
    at the accumulation boundary (``averaged_gradients``) onto the elements of ``params`` that this
    rank owns. Each parameter group's partition is either a compact buffer (fp32 accumulation of
    bf16/fp16 weights: ``flat_partition``) or the list of pads (``_zero_padding``) and parameter
    slices whose concatenation is the partition; a parameter's slice starts at its insertion offset
    and spans ``min(numel - start offset, partition size - insertion offset)`` elements, as
    DeepSpeed lays it out. Writing into the views changes what the step uses (norm and update)."""
    wanted = {id(p) for p in params}
    views = []
    for group, in_partition in enumerate(optimizer.params_in_partition):
        partition = optimizer.averaged_gradients.get(group)
        if partition is None or not any(id(p) in wanted for p in in_partition):
            continue
        rank = torch.distributed.get_rank(group=optimizer.real_dp_process_group[group])
        size = int(optimizer.partition_size[group])
        flat = getattr(partition, "flat_partition", None)
        starts, position = {}, 0
        if flat is None:  # the list: index each entry by where it starts in the partition
            for index, entry in enumerate(partition):
                starts[position] = index
                position += entry.numel()
        for param in in_partition:
            if id(param) not in wanted:
                continue
            param_id = optimizer.get_param_id(param)
            start = int(optimizer.grad_start_offset[group][rank][param_id])
            insertion = int(optimizer.grad_partition_insertion_offset[group][rank][param_id])
            count = min(param.numel() - start, size - insertion)
            if count <= 0:
                continue
            if flat is not None:
                views.append(flat.narrow(0, insertion, count))
                continue
            entry = partition[starts[insertion]]
            if entry.numel() != count or getattr(entry, "_zero_padding", False):
                raise RuntimeError(f"ZeRO gradient partition layout not understood at a parameter of "
                                   f"{param.numel()} elements (slice of {count} at {insertion})")
            views.append(entry.view(-1))
    return views


def accumulated_gradient(engine, param: torch.nn.Parameter):
    """The tensor holding ``param``'s gradient summed over this step's micro batches, where the
    engine keeps it for its data-parallel reduction: ZeRO 1's (``get_gradient_for_reduction``:
    the fp32 ``grad_accum`` or ``param.grad``), DeepSpeed's ``BF16_Optimizer``'s fp32 copy
    (``param._hp_grad``), else ``param.grad``. None when the parameter has no gradient."""
    optimizer = engine.optimizer
    if hasattr(optimizer, "get_gradient_for_reduction"):
        return optimizer.get_gradient_for_reduction(param)
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer

    if isinstance(optimizer, BF16_Optimizer) and getattr(param, "_hp_grad", None) is not None:
        return param._hp_grad
    return param.grad


def all_reduce_coalesced(tensors: List[torch.Tensor], group) -> None:
    """Sum ``tensors`` over ``group`` in place: one all-reduce of their flattened copy per dtype
    (as megatron-core's ``_allreduce_non_tensor_model_parallel_grads``)."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    by_dtype = {}
    for tensor in tensors:
        by_dtype.setdefault(tensor.dtype, []).append(tensor)
    for same in by_dtype.values():
        flat = _flatten_dense_tensors(same)
        torch.distributed.all_reduce(flat, group=group)
        for tensor, summed in zip(same, _unflatten_dense_tensors(flat, same), strict=True):
            tensor.copy_(summed)


def _hook_each_parameter(params: List[torch.nn.Parameter], group) -> None:
    def all_reduce(grad: torch.Tensor) -> torch.Tensor:
        summed = grad.clone()
        torch.distributed.all_reduce(summed, group=group)
        return summed

    for p in params:
        p.register_hook(all_reduce)


def install_sequence_parallel_grad_allreduce(engine, group) -> str:
    """Make the DeepSpeed ``engine`` (plain or pipe) sum the gradients of its sequence-parallel
    parameters over ``group`` (the tensor-parallel group) before its data-parallel reduction:
    :data:`PER_STEP` where it reduces after accumulation, :data:`PER_PARTITION` where it reduces
    inside the backward, :data:`PER_MICRO_BATCH` under ZeRO-Offload (module docstring). Returns
    which; the one place this all-reduce happens."""
    import types

    params = sequence_parallel_parameters(engine.module)
    if reduces_inside_backward(engine):
        if getattr(engine.optimizer, "cpu_offload", False):
            _hook_each_parameter(params, group)
            return PER_MICRO_BATCH
        epilogue_reduction = engine.allreduce_gradients

        def allreduce_then_sum_partition(self, *args, **kwargs):
            result = epilogue_reduction(*args, **kwargs)
            if self.is_gradient_accumulation_boundary():
                all_reduce_coalesced(partition_slices(self.optimizer, params), group)
            return result

        engine.allreduce_gradients = types.MethodType(allreduce_then_sum_partition, engine)
        return PER_PARTITION

    def reduce_accumulated():
        grads = [accumulated_gradient(engine, p) for p in params]
        all_reduce_coalesced([g for g in grads if g is not None], group)

    data_parallel_reduction = engine.allreduce_gradients

    def allreduce_gradients(self, *args, **kwargs):
        if self.is_gradient_accumulation_boundary():
            reduce_accumulated()
        return data_parallel_reduction(*args, **kwargs)

    engine.allreduce_gradients = types.MethodType(allreduce_gradients, engine)
    if hasattr(engine, "_bf16_reduce_grads"):  # the pipe engine's reduction under BF16_Optimizer
        bf16_reduction = engine._bf16_reduce_grads

        def bf16_reduce_grads(self, *args, **kwargs):
            reduce_accumulated()
            return bf16_reduction(*args, **kwargs)

        engine._bf16_reduce_grads = types.MethodType(bf16_reduce_grads, engine)
    return PER_STEP


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
        square = all_reduce_small(square, group=mpu.get_model_parallel_group())
    return float(square.sqrt().item())
