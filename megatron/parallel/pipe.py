"""What the training loop needs to drive DeepSpeed's pipe engine (``PipelineEngine``). (The pipe's
input format is megatron/model/pipe_io.py, its train and eval steps megatron/train/steps.py.)

- :func:`check_grid_matches`: the engine's process groups are megatron-core's;
- :func:`install_model_grad_clipping`: clipping by the norm of the whole model's gradient (every
  stage, each tensor-parallel shard once, the tied embedding once) at ZeRO stage 0, where
  DeepSpeed's ``clip_grad_norm_`` with the pipe grid would count only the first stage's replicated
  parameters.
"""
import types
from typing import Optional

import torch

from megatron.parallel.grads import global_grad_norm
from megatron.parallel.topology import MegatronCoreMPU

# DeepSpeed's pipe engine divided the gradients of every stage but the last by the gradient
# accumulation steps a second time from 0.18.3 to 0.19.2 (deepspeedai/DeepSpeed issue #8152, fixed by
# PR #8154 in 0.19.3)
PIPE_GAS_BUG = ((0, 18, 3), (0, 19, 2))


def pipe_accumulation_problem(deepspeed_version: str, pipeline_parallel_size: int,
                              micro_batches: int) -> Optional[str]:
    """Why DeepSpeed ``deepspeed_version`` cannot run a pipeline of ``pipeline_parallel_size``
    stages with ``micro_batches`` micro batches per iteration (its gradient-accumulation bug), or
    None."""
    if pipeline_parallel_size <= 1 or micro_batches <= 1:
        return None
    try:
        version = tuple(int(part) for part in deepspeed_version.split("+")[0].split(".")[:3])
    except ValueError:
        return None  # a development build: nothing to compare
    low, high = PIPE_GAS_BUG
    if low <= version <= high:
        return (f"DeepSpeed {deepspeed_version} divides the gradients of every pipeline stage but "
                "the last by the gradient accumulation steps twice (deepspeedai/DeepSpeed issue "
                f"#8152, fixed in 0.19.3): --pipeline-model-parallel-size {pipeline_parallel_size} "
                f"with {micro_batches} micro batches per iteration would train a wrong model; "
                "install deepspeed>=0.19.4 (pip install -U 'deepspeed>=0.19.4,<0.20')")
    return None


def is_pipe_engine(engine) -> bool:
    """True for DeepSpeed's ``PipelineEngine`` (built from a ``PipelineModule``)."""
    from deepspeed.runtime.pipe.engine import PipelineEngine

    return isinstance(engine, PipelineEngine)


def check_grid_matches(grid) -> None:
    """Raise unless the pipe engine's data, pipeline and tensor ("slice") groups hold the same
    ranks as megatron-core's ``parallel_state`` groups of this rank."""
    from megatron.core import parallel_state

    ranks = torch.distributed.get_process_group_ranks
    pairs = {
        "data": (grid.get_data_parallel_group(), parallel_state.get_data_parallel_group()),
        "pipeline": (grid.get_pipe_parallel_group(), parallel_state.get_pipeline_model_parallel_group()),
        "tensor": (grid.get_slice_parallel_group(), parallel_state.get_tensor_model_parallel_group()),
    }
    for axis, (theirs, ours) in pairs.items():
        if sorted(ranks(theirs)) != sorted(ranks(ours)):
            raise RuntimeError(f"rank {torch.distributed.get_rank()}: DeepSpeed pipe grid's {axis}-"
                               f"parallel group {sorted(ranks(theirs))} differs from megatron-core's "
                               f"{sorted(ranks(ours))}")


def unique_parameters(parameters):
    """The parameters whose gradients count in the model's norm on this rank: all but the copies
    DeepSpeed marks ``ds_pipe_replicated`` (the tied embedding's copy on its later stage)."""
    return [p for p in parameters if not getattr(p, "ds_pipe_replicated", False)]


def model_grad_norm(module) -> float:
    """L2 norm of the whole model's gradient from ``module``'s gradients (a ``GPTModel`` or this
    rank's pipe stage): each tensor-parallel shard once, the tied copy of a later stage not at all
    (:func:`unique_parameters`), squares summed over the model-parallel group
    (``megatron.parallel.grads.global_grad_norm``; a collective)."""
    params = [p for p in module.parameters() if p.grad is not None]
    return global_grad_norm(unique_parameters(params), MegatronCoreMPU())


def install_model_grad_clipping(engine) -> None:
    """At ZeRO stage 0 in fp32, make the pipe engine clip by the whole model's gradient norm
    (:func:`model_grad_norm`, recorded as
    ``engine.get_global_grad_norm()``) instead of DeepSpeed's ``clip_grad_norm_``, which with the
    pipe grid as ``mpu`` counts replicated parameters on the first stage only. ZeRO stage 1 and the
    mixed-precision optimizers compute the norm themselves (by tensor-parallel rank, skipping the
    replicated tied copy) and are left alone."""
    if engine.zero_optimization_stage() > 0 or engine.fp16_enabled() or engine.bfloat16_enabled():
        return
    def clip_fp32_gradients(self):
        params = [p for p in self.module.parameters() if p.grad is not None]
        norm = model_grad_norm(self.module)
        self._global_grad_norm = norm
        coefficient = min(1.0, self.gradient_clipping() / (norm + 1e-6))
        if coefficient < 1.0:
            for p in params:
                p.grad.detach().mul_(coefficient)

    engine.clip_fp32_gradients = types.MethodType(clip_fp32_gradients, engine)
