"""The language-model loss of one micro batch from per-token losses and the loss mask.

One definition for every model layout: the per-micro-batch path (``GPTModel``) and the last pipeline
stage (``GPTModelPipe``) both reduce per-token cross entropy with :func:`masked_lm_loss`.
"""
from typing import Tuple

import torch


def vocab_parallel_token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-token cross entropy ``[b, s]`` from vocab-parallel logits ``[s, b, v / TP]`` and labels
    ``[b, s]`` (megatron-core's ``compute_language_model_loss`` without the fused paths)."""
    from megatron.core import tensor_parallel

    loss = tensor_parallel.vocab_parallel_cross_entropy(logits.float(),
                                                        labels.transpose(0, 1).contiguous())
    return loss.transpose(0, 1).contiguous()


def masked_lm_loss(per_token: torch.Tensor, loss_mask: torch.Tensor,
                   sequence_group=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-sample loss) of one micro batch: ``loss = sum(per_token * mask) / sum(mask)`` over
    the micro batch (a weighted mask, as T0's ``--norm-target-loss`` makes, weights each token), and
    per sample ``sum(per_token * mask) / sum(mask)`` over its tokens (detached, for per-dataset
    logging). Both in float32; an empty mask counts as one token so nothing divides by zero (only
    an empty one: a weighted mask summing to less than 1, a loss weight below 1 on a few tokens,
    is divided by its own sum, so the mean and the per-sample means stay means).

    ``sequence_group``: the DeepSpeed-Ulysses group when each rank holds a slice of every sequence
    (megatron/parallel/ulysses.py). The sums and token counts are then summed over the group (one
    all-reduce on the device), so both values are those of the whole sequences, the same on every
    rank of the group; the gradient of ``loss`` is that of this rank's share (its masked sum over
    the whole token count), which DeepSpeed's sum over the group makes the whole loss's gradient.
    """
    mask = loss_mask.float()
    per_token = per_token.float() * mask
    sample_sums = per_token.sum(dim=1)
    tokens_per_sample = mask.sum(dim=1)
    if sequence_group is None:
        loss = per_token.sum() / nonzero_divisor(tokens_per_sample.sum())
        per_sample = sample_sums / nonzero_divisor(tokens_per_sample)
        return loss, per_sample.detach()
    totals = torch.cat([sample_sums.detach(), tokens_per_sample])
    torch.distributed.all_reduce(totals, group=sequence_group)
    b = sample_sums.numel()
    whole_sums, whole_tokens = totals[:b], totals[b:]
    count = nonzero_divisor(whole_tokens.sum())
    share = sample_sums.sum() / count  # this rank's part of the loss: carries the gradient
    loss = share + (whole_sums.sum() / count - share.detach())  # value: the whole loss
    return loss, (whole_sums / nonzero_divisor(whole_tokens)).detach()


def nonzero_divisor(count: torch.Tensor) -> torch.Tensor:
    """``count`` (loss tokens, or their summed weights) with its zeros replaced by 1: the divisor
    of a mean over them."""
    return torch.where(count > 0, count, torch.ones_like(count))
