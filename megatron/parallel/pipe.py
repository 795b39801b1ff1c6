"""What the training loop needs to drive DeepSpeed's pipe engine (``PipelineEngine``).

- :func:`pipe_batch`: the loader's batch dict -> the ``(inputs, labels)`` tuples the engine feeds to
  the first and the last stage (see megatron/model/gpt_model_pipe.py for what flows where);
- :func:`pipe_train_step` / :func:`pipe_eval_step`: one iteration / one evaluation window through
  ``train_batch`` / ``eval_batch``; the per-micro-batch losses exist only on the last stage, which
  weighs them (megatron/optim/loss_normalization.py) and adds them to the interval statistics (other
  stages add nothing, so the world-wide sums the loop reduces at log time are the last stage's);
- :func:`check_grid_matches`: the engine's process groups are megatron-core's;
- :func:`install_model_grad_clipping`: clipping by the norm of the whole model's gradient (every
  stage, each tensor-parallel shard once, the tied embedding once) at ZeRO stage 0, where
  DeepSpeed's ``clip_grad_norm_`` with the pipe grid would count only the first stage's replicated
  parameters.
"""
import functools
import types
from typing import Dict, Iterator, Optional, Tuple

import torch


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


def pipe_batch(batch: Dict[str, torch.Tensor], device=None) -> Tuple[tuple, tuple]:
    """``((tokens, position_ids, *attention), (labels, loss_mask[, dataset_id]))`` from a loader
    batch (the first stage reads the inputs, the last stage the labels); ``attention`` is the
    batch's compact attention structure (``segment_ids`` with ``cu_seqlens``, ``is_prefix``) in
    the pipe's form. With ``device`` the batch goes there in one non-blocking copy first
    (megatron/data/device_transfer.py), so the engine's own per-tensor move has nothing to do."""
    from megatron.data.device_transfer import batch_to_device
    from megatron.model.gpt_model_pipe import attention_tensors
    from megatron.model.masks import CU_SEQLENS_KEY, IS_PREFIX_KEY, SEGMENT_IDS_KEY

    if device is not None:
        batch = batch_to_device(batch, device)
    inputs = [batch["tokens"], batch["position_ids"],
              *attention_tensors(batch.get(SEGMENT_IDS_KEY), batch.get(IS_PREFIX_KEY),
                                 batch.get(CU_SEQLENS_KEY))]
    labels = [batch["labels"], batch["loss_mask"]]
    if batch.get("dataset_id") is not None:
        labels.append(torch.as_tensor(batch["dataset_id"]).view(-1))
    return tuple(inputs), tuple(labels)


def _stage_batches(engine, iterator: Iterator[Dict], num_micro_batches: int, prepare):
    """(the batches this stage feeds the engine, the raw ones read) for one call of the engine:
    the last stage, which computes the losses, reads its ``num_micro_batches`` batches first (so
    their loss weights are known before the first forward); the others read as the engine asks,
    as before."""
    if engine.is_last_stage():
        raw = [next(iterator) for _ in range(num_micro_batches)]
        return [prepare(b) for b in raw], raw
    return (prepare(b) for b in iterator), None


def pipe_train_step(engine, iterator: Iterator[Dict], num_micro_batches: int, stats,
                    logging_now: bool, normalizer=None) -> Optional[float]:
    """One iteration (``num_micro_batches`` micro batches, forward, backward, optimizer step) with
    ``engine.train_batch``; the last stage weighs the iteration's losses (``normalizer``,
    megatron/optim/loss_normalization.py: the loss each backward pass takes) and adds each micro
    batch's losses to ``stats``. Returns None: the gradient norm is the engine's
    (:func:`install_model_grad_clipping`)."""
    from megatron.optim.loss_normalization import LossNormalizer

    normalizer = normalizer or LossNormalizer("micro-batch")
    if engine.micro_batches != num_micro_batches:
        raise RuntimeError(f"pipe engine runs {engine.micro_batches} micro batches per iteration, "
                           f"the batch schedule asks {num_micro_batches}")
    batches, raw = _stage_batches(engine, iterator, num_micro_batches, normalizer.prepare)
    loss_function = engine.module.loss_function
    weights = None
    if raw is not None:
        weights = normalizer.weigh(batches, engine.device)
        loss_function.set_factors(weights.factors)
    engine.train_batch(data_iter=map(functools.partial(pipe_batch, device=engine.device),
                                     iter(batches)))
    for m, (loss, per_sample, dataset_id) in enumerate(loss_function.pop_records()):
        stats.add_micro_batch(loss, per_sample, dataset_id, weights.counts[m],
                              *normalizer.sample_stats(raw[m], batches[m]))
    return None


def pipe_eval_step(engine, iterator: Iterator[Dict], num_micro_batches: int,
                   normalizer=None) -> Tuple[torch.Tensor, float]:
    """Forward ``num_micro_batches`` micro batches with ``engine.eval_batch``; returns (sum of the
    micro-batch losses, each weighted as the normalisation averages them, and the sum of those
    weights) on the last stage and (0, 0) on the others.

    The pipe engine describes the tensors it sends between stages once and reuses that description;
    it is renewed around the evaluation, so an evaluation set whose batches carry another attention
    structure than the training set's (say, no ``segment_ids``) still travels correctly."""
    from megatron.optim.loss_normalization import LossNormalizer

    normalizer = normalizer or LossNormalizer("micro-batch")
    batches, raw = _stage_batches(engine, iterator, num_micro_batches,
                                  functools.partial(normalizer.prepare, train=False))
    engine.reset_activation_shape()
    engine.eval_batch(map(functools.partial(pipe_batch, device=engine.device), iter(batches)),
                      num_micro_batches=num_micro_batches,
                      reduce_output=None, bcast_loss=False)
    engine.reset_activation_shape()
    records = engine.module.loss_function.pop_records()
    total, weight_sum = torch.zeros((), dtype=torch.float64), 0.0
    for m, (loss, _, _) in enumerate(records):
        weight = normalizer.eval_weight(batches[m])
        total = total + loss.detach().double().cpu() * weight
        weight_sum += weight
    return total, weight_sum


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
    from megatron.parallel.grads import global_grad_norm
    from megatron.parallel.topology import MegatronCoreMPU

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
