"""One training iteration and one evaluation window on this run's engine: the GPT forward step, the
per-micro-batch steps of a plain DeepSpeed engine, the pipe engine's steps and the gradient norm an
iteration logs.

The pipe engine's steps (:func:`pipe_train_step` / :func:`pipe_eval_step`) run one iteration / one
evaluation window through ``train_batch`` / ``eval_batch`` (the batches in the pipe's input format,
megatron/model/pipe_io.py); the per-micro-batch losses exist only on the last stage, which weighs
them (megatron/optim/loss_normalization.py) and adds them to the interval statistics (other stages
add nothing, so the world-wide sums the loop reduces at log time are the last stage's)."""
import functools
import math
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, Optional, Tuple

import torch

from megatron.data.device_transfer import batch_to_device
from megatron.metrics.position_buckets import PositionBuckets
from megatron.model.lm_loss import masked_lm_loss
from megatron.model.pipe_io import pipe_batch
from megatron.optim.loss_normalization import LossNormalizer
from megatron.parallel.pipe import is_pipe_engine, model_grad_norm
from megatron.parallel.ulysses import (
    sequence_parallel_group,
    sequence_rank_and_size,
    sequence_shard,
    slice_batch_for_sequence_rank,
)
from megatron.utils.rank_utils import all_reduce_small


def gpt_token_losses(engine, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, Dict]:
    """Forward one micro batch; returns (the per-token loss ``[b, s]`` in nats of this rank's
    tokens, unmasked, on the device; the batch as the model got it: this rank's slice, on the
    device).

    Batch keys: ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` and optionally the
    compact attention structure ``segment_ids`` / ``is_prefix`` (absent: plain causal attention)
    with the segment layout the loader's collate computed (megatron/model/masks.py
    ``with_segment_layout``), which the model's core attention turns into its own mask form. The
    batch goes to the device in one non-blocking copy (megatron/data/device_transfer.py). Under
    DeepSpeed-Ulysses each rank keeps its slice of the per-token fields (the attention structure
    stays whole: megatron/parallel/ulysses.py).
    """
    from megatron.model.masks import attention_structure_from_batch, with_segment_layout  # lazy: megatron-core

    rank, size = sequence_rank_and_size()
    batch = slice_batch_for_sequence_rank(with_segment_layout(batch), size, rank)
    batch = batch_to_device(batch, engine.device)
    per_token = engine(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                       packed_seq_params=attention_structure_from_batch(batch))
    return per_token, batch


def gpt_forward_step(engine, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward one micro batch (:func:`gpt_token_losses`); returns (mean loss over unmasked
    tokens, per-sample mean loss), under DeepSpeed-Ulysses those of the whole sequences
    (megatron/model/lm_loss.py)."""
    per_token, batch = gpt_token_losses(engine, batch)
    return masked_lm_loss(per_token, batch["loss_mask"], sequence_parallel_group())


def _bucket_sums(buckets: PositionBuckets, per_token: torch.Tensor, raw: Dict) -> torch.Tensor:
    """``[2, buckets.count]``: the loss sums (nats) and loss tokens per position bucket of one
    micro batch (``raw``: the host batch as read, whose loss mask counts each loss token; its
    ``segment_ids`` give document positions) whose per-token losses of this rank's tokens are
    ``per_token`` (under DeepSpeed-Ulysses this rank's slice of the sequence)."""
    from megatron.model.masks import SEGMENT_IDS_KEY  # lazy: megatron-core

    mask = torch.as_tensor(raw["loss_mask"])
    ids = buckets.bucket_ids(tuple(mask.shape), raw.get(SEGMENT_IDS_KEY))
    rank, size = sequence_rank_and_size()
    if size > 1:  # this Ulysses rank's slice, as gpt_token_losses cut it
        shard = sequence_shard(mask.shape[1], size, rank)
        mask, ids = mask[:, shard], ids[:, shard]
    return buckets.sums(per_token, mask, ids)


def _sequence_summed(sums: torch.Tensor) -> torch.Tensor:
    """``sums`` of this rank's slice of the sequences summed over its DeepSpeed-Ulysses group
    (those of the whole sequences, on the CPU); as they are without one."""
    group = sequence_parallel_group()
    return all_reduce_small(sums.cpu(), group=group) if group is not None else sums.cpu()


@dataclass(frozen=True)
class StepFunctions:
    """How one training iteration and one evaluation window run on this run's engine, picked once
    by :func:`step_functions`; everything else in the loop is shared by every layout.

    ``train_step(engine, iterator, num_micro_batches, stats, logging_now)`` runs the forward,
    backward and optimizer step of one global batch, adds the micro batches' losses to ``stats``
    and returns the unclipped gradient norm when it has one (else None: the engine's is used).
    ``eval_step(engine, iterator, num_micro_batches, buckets=None)`` returns (sum of the
    micro-batch losses, each weighted as the run's loss normalisation averages them, the sum of
    those weights, and with ``buckets`` (megatron/metrics/position_buckets.py) the ``[2, count]``
    loss sums and loss tokens per position bucket, else None) of this rank (of its
    data-parallel replica: summed over a Ulysses group, zero off a pipe's last stage)."""

    train_step: Callable
    eval_step: Callable
    # the loss weighing both use (an adaptive mixer's loss weights are set on it between
    # iterations)
    normalizer: LossNormalizer


def micro_batch_train_step(engine, iterator: Iterator[Dict], num_micro_batches: int, stats,
                           logging_now: bool, forward_step: Callable,
                           normalizer: Optional[LossNormalizer] = None) -> Optional[float]:
    """One iteration on a plain DeepSpeed engine: the iteration's micro batches are read and
    weighed first (``normalizer``, megatron/optim/loss_normalization.py: the loss each backward pass
    takes), then ``forward_step``, ``engine.backward`` and ``engine.step`` per micro batch
    (DeepSpeed steps the optimizer at the last one)."""
    normalizer = normalizer or LossNormalizer("micro-batch")
    raw = [next(iterator) for _ in range(num_micro_batches)]
    batches = [normalizer.prepare(b) for b in raw]
    weights = normalizer.weigh(batches, engine.device)
    stage0_norm = None
    for micro, batch in enumerate(batches):
        loss, per_sample = forward_step(engine, batch)
        engine.backward(weights.backward_loss(micro, loss))
        if logging_now and micro == num_micro_batches - 1:
            stage0_norm = _unclipped_grad_norm(engine)
        engine.step()
        stats.add_micro_batch(loss, per_sample, batch.get("dataset_id"), weights.counts[micro],
                              *normalizer.sample_stats(raw[micro], batch))
    return stage0_norm


def micro_batch_eval_step(engine, iterator: Iterator[Dict], num_micro_batches: int,
                          forward_step: Callable, normalizer: Optional[LossNormalizer] = None,
                          buckets: Optional[PositionBuckets] = None
                          ) -> Tuple[torch.Tensor, float, Optional[torch.Tensor]]:
    """Forward ``num_micro_batches`` micro batches; (sum of their losses, each weighted as the
    normalisation averages them, the sum of the weights, and the loss sums and loss tokens per
    position bucket of ``buckets`` or None). With ``buckets`` the micro batches run through
    :func:`gpt_token_losses` (the per-token losses), not ``forward_step``, and their loss is
    that of :func:`gpt_forward_step`."""
    normalizer = normalizer or LossNormalizer("micro-batch")
    loss_sum, weight_sum, sums = None, 0.0, None
    for _ in range(num_micro_batches):
        raw = next(iterator)
        batch = normalizer.prepare(raw, train=False)
        if buckets is None:
            loss, _ = forward_step(engine, batch)
        else:
            per_token, on_device = gpt_token_losses(engine, batch)
            loss, _ = masked_lm_loss(per_token, on_device["loss_mask"], sequence_parallel_group())
            local = _bucket_sums(buckets, per_token, raw)
            sums = local if sums is None else sums + local
        weight = normalizer.eval_weight(batch)
        value = loss.detach().double() * weight
        loss_sum = value if loss_sum is None else loss_sum + value
        weight_sum += weight
    if sums is not None:
        sums = _sequence_summed(sums)
    return loss_sum.cpu(), weight_sum, sums


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
    (:func:`megatron.parallel.pipe.install_model_grad_clipping`)."""
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
                   normalizer=None, buckets: Optional[PositionBuckets] = None
                   ) -> Tuple[torch.Tensor, float, Optional[torch.Tensor]]:
    """Forward ``num_micro_batches`` micro batches with ``engine.eval_batch``; returns (sum of the
    micro-batch losses, each weighted as the normalisation averages them, the sum of those
    weights, and with ``buckets`` the loss sums and loss tokens per position bucket, else None)
    on the last stage and zeros on the others (the last stage's loss function keeps the
    per-token losses for the buckets).

    The pipe engine describes the tensors it sends between stages once and reuses that description;
    it is renewed around the evaluation, so an evaluation set whose batches carry another attention
    structure than the training set's (say, no ``segment_ids``) still travels correctly."""
    normalizer = normalizer or LossNormalizer("micro-batch")
    batches, raw = _stage_batches(engine, iterator, num_micro_batches,
                                  functools.partial(normalizer.prepare, train=False))
    loss_function = engine.module.loss_function
    loss_function.keep_token_losses = buckets is not None
    engine.reset_activation_shape()
    try:
        engine.eval_batch(map(functools.partial(pipe_batch, device=engine.device), iter(batches)),
                          num_micro_batches=num_micro_batches,
                          reduce_output=None, bcast_loss=False)
    finally:
        loss_function.keep_token_losses = False
    engine.reset_activation_shape()
    records = loss_function.pop_records()
    token_losses = loss_function.pop_token_losses()
    total, weight_sum = torch.zeros((), dtype=torch.float64), 0.0
    for m, (loss, _, _) in enumerate(records):
        weight = normalizer.eval_weight(batches[m])
        total = total + loss.detach().double().cpu() * weight
        weight_sum += weight
    sums = None
    if buckets is not None:
        sums = torch.zeros(2, buckets.count, dtype=torch.float64)
        for m, per_token in enumerate(token_losses):
            sums += _bucket_sums(buckets, per_token, raw[m]).cpu()
    return total, weight_sum, sums


def step_functions(engine, forward_step: Callable,
                   normalizer: Optional[LossNormalizer] = None) -> StepFunctions:
    """The pipe engine's ``train_batch``/``eval_batch`` steps (:func:`pipe_train_step`,
    :func:`pipe_eval_step`) for a ``PipelineModule``, else the per-micro-batch steps around
    ``forward_step``; both weigh the losses with ``normalizer`` (default: Megatron-LM's
    per-micro-batch mean)."""
    normalizer = normalizer or LossNormalizer("micro-batch")
    if is_pipe_engine(engine):
        return StepFunctions(functools.partial(pipe_train_step, normalizer=normalizer),
                             functools.partial(pipe_eval_step, normalizer=normalizer), normalizer)
    return StepFunctions(
        functools.partial(micro_batch_train_step, forward_step=forward_step, normalizer=normalizer),
        functools.partial(micro_batch_eval_step, forward_step=forward_step, normalizer=normalizer),
        normalizer)


def _unclipped_grad_norm(engine) -> Optional[float]:
    """L2 norm of the whole model's (data-parallel averaged) gradient before clipping. ZeRO stages
    keep it in the engine; at stage 0 (fp32 only: mixed precision runs at stage 1 at least,
    megatron/optim/precision.py) DeepSpeed does not, so it is computed from the module's gradients,
    which hold the averaged values between the boundary backward and the optimizer step
    (``megatron.parallel.pipe.model_grad_norm``)."""
    if engine.zero_optimization_stage() > 0:
        return None
    if not any(p.grad is not None for p in engine.module.parameters()):
        return None
    return model_grad_norm(engine.module)


def _grad_norm(engine, stage0_norm: Optional[float]) -> Optional[float]:
    norm = engine.get_global_grad_norm()
    if norm is None:
        norm = stage0_norm
    if norm is None:
        return None
    norm = float(norm.item() if torch.is_tensor(norm) else norm)
    return norm if math.isfinite(norm) else None
