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


def masked_lm_loss(per_token: torch.Tensor,
                   loss_mask: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(loss, per-sample loss) of one micro batch: ``loss = sum(per_token * mask) / sum(mask)`` over
    the micro batch (a weighted mask, as T0's ``--norm-target-loss`` makes, weights each token), and
    per sample ``sum(per_token * mask) / sum(mask)`` over its tokens (detached, for per-dataset
    logging). Both in float32; empty masks count as one token so nothing divides by zero."""
    mask = loss_mask.float()
    per_token = per_token.float() * mask
    tokens_per_sample = mask.sum(dim=1)
    loss = per_token.sum() / tokens_per_sample.sum().clamp(min=1.0)
    per_sample = per_token.sum(dim=1) / tokens_per_sample.clamp(min=1.0)
    return loss, per_sample.detach()
