"""How an iteration's loss is normalised: the objective as a property of the data, not of how the
global batch is split into micro batches and data-parallel ranks.

Three choices (``--calculate-per-token-loss``, ``--calculate-per-sample-loss``, default):

* ``micro-batch`` (Megatron-LM's default): each micro batch's loss is its masked token mean; the
  iteration's loss and gradient are the mean of those over the gradient-accumulation steps and the
  data-parallel ranks. A micro batch with few loss tokens weighs as much as one with many, so the
  result depends on the batch split.
* ``token`` (``--calculate-per-token-loss``, Megatron-LM's meaning): the sum of the masked token
  losses of the whole global batch over the global number of loss tokens. Megatron-LM returns
  ``(sum, count)`` from its loss function and divides the gradients by the global count in
  ``finalize_model_grads``; on DeepSpeed's engines, which divide the loss by the accumulation
  steps and average the gradients over the data-parallel ranks, each micro batch's backward loss
  is its masked sum times ``dp x GAS`` over the global count, which gives the same gradient. The
  count is known before the first forward: the loader's batches of the iteration are read first,
  their loss masks summed on the host and the sum all-reduced over the data-parallel group on the
  device, asynchronously (no host sync).
* ``sample`` (``--calculate-per-sample-loss``): each sample's token mean (each segment's, in a
  packed T0 sample), averaged over the global batch: the loss mask of a sample (segment) is
  divided by its loss tokens on the host, and then normalised as ``token``.

The loss weight of a dataset (``loss_weight:`` in a blend file, ``--dataset-loss-weights``)
multiplies its samples' loss masks before any of these (so it weighs its tokens against the
others'); the logged per-dataset losses stay unweighted. An adaptive mixer with ``target:
loss_weight`` (megatron/data/mixer_loss_weights.py) sets them between iterations
(:meth:`LossNormalizer.set_loss_weights`).

The MoE load-balancing loss keeps Megatron-LM's normalisation under every choice: its gradient is
scaled by ``1 / (GAS x dp)``, a mean over micro batches (megatron/metrics/moe.py), as
megatron-core scales it under ``calculate_per_token_loss`` too.
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

from megatron.data.device_transfer import to_device_async
from megatron.model.lm_loss import nonzero_divisor

NORMALIZATIONS = ("micro-batch", "token", "sample")

__all__ = ["NORMALIZATIONS", "LossNormalizationConfig", "normalization", "normalization_line",
           "LossWeights", "IterationLoss", "LossNormalizer"]


@dataclass(frozen=True)
class LossNormalizationConfig:
    """The loss normalisation flags after validation (fields are their argparse dests):
    ``--calculate-per-token-loss``, ``--calculate-per-sample-loss`` (exclusive: checked by
    validate_args) and ``packed_samples`` (the entry point's: T0's packed samples, normalised per
    segment; False where the entry point does not set it)."""

    calculate_per_token_loss: bool
    calculate_per_sample_loss: bool
    packed_samples: bool


def normalization(config: LossNormalizationConfig) -> str:
    """``micro-batch``, ``token`` or ``sample``: the loss normalisation ``config`` asks for."""
    if config.calculate_per_token_loss:
        return "token"
    if config.calculate_per_sample_loss:
        return "sample"
    return "micro-batch"


def normalization_line(mode: str, packed: bool) -> str:
    """The start-up line naming the loss normalisation in use."""
    if mode == "token":
        return ("loss normalisation: per token (--calculate-per-token-loss): the masked token "
                "losses of the global batch over its loss tokens")
    if mode == "sample":
        unit = "segment (packed T0 pair)" if packed else "sample"
        return (f"loss normalisation: per {unit} (--calculate-per-sample-loss): each {unit}'s "
                "token mean, averaged over the global batch")
    return ("loss normalisation: per micro batch (Megatron-LM's default): each micro batch's token "
            "mean, averaged over micro batches and data-parallel ranks (--calculate-per-token-loss "
            "makes it independent of the batch split)")


@dataclass(frozen=True)
class LossWeights:
    """Per-dataset loss weights (index = ``dataset_id``), or None when every weight is 1."""

    weights: Optional[Sequence[float]] = None

    def apply(self, batch: Dict) -> Dict:
        """``batch`` with each sample's loss mask times its dataset's weight (host tensors)."""
        if self.weights is None or batch.get("dataset_id") is None:
            return batch
        w = torch.as_tensor(self.weights, dtype=torch.float32)[torch.as_tensor(batch["dataset_id"]).long().view(-1)]
        return {**batch, "loss_mask": batch["loss_mask"].float() * w.view(-1, 1)}


def per_sample_mask(loss_mask: torch.Tensor, segment_ids: Optional[torch.Tensor]) -> torch.Tensor:
    """The loss mask with each sample's (``segment_ids`` given: each segment's) weights summing to
    1: a sample (segment) without loss tokens keeps zeros."""
    mask = loss_mask.float()
    if segment_ids is None:
        total = mask.sum(dim=1, keepdim=True)
        return torch.where(total > 0, mask / total.clamp(min=1e-30), mask)
    seg = torch.as_tensor(segment_ids).long()
    width = int(seg.max().item()) + 1 if seg.numel() else 1
    flat = seg + width * torch.arange(seg.shape[0]).view(-1, 1)
    sums = torch.zeros(seg.shape[0] * width, dtype=mask.dtype).index_add_(0, flat.view(-1), mask.view(-1))
    per_token = sums[flat]
    return torch.where(per_token > 0, mask / per_token.clamp(min=1e-30), mask)


@dataclass
class IterationLoss:
    """The loss weights of one iteration on this rank: ``counts[m]`` (host) is micro batch ``m``'s
    loss weight (its summed loss mask in the token and sample modes, 1 in the micro-batch mode);
    ``factors[m]`` (a device tensor; none in the micro-batch mode) turns its mean loss into the
    loss to back-propagate."""

    counts: List[float]
    factors: List[Optional[torch.Tensor]] = field(default_factory=list)

    def backward_loss(self, m: int, loss: torch.Tensor) -> torch.Tensor:
        """Micro batch ``m``'s loss to back-propagate from its masked mean ``loss``."""
        factor = self.factors[m] if self.factors else None
        return loss if factor is None else loss * factor


class LossNormalizer:
    """Prepares an iteration's micro batches and their loss weights for one normalisation
    (module docstring). ``packed``: samples are packed T0 pairs (per-sample means are per
    segment); ``data_parallel_group``/``data_parallel_size``: the ranks one global batch is split
    over (sequence-parallel ranks of a sample are not counted twice: they share samples)."""

    def __init__(self, mode: str, packed: bool = False, loss_weights: LossWeights = LossWeights(),
                 data_parallel_group=None, data_parallel_size: int = 1):
        if mode not in NORMALIZATIONS:
            raise ValueError(f"loss normalisation {mode!r}; known: {', '.join(NORMALIZATIONS)}")
        self.mode = mode
        self.packed = packed
        self.loss_weights = loss_weights
        self.group = data_parallel_group
        self.dp = int(data_parallel_size)

    def set_loss_weights(self, weights: Optional[Sequence[float]]) -> None:
        """Weigh the datasets' tokens by ``weights`` (unitless, index = ``dataset_id``; None: all
        1) in the batches prepared from now on: an adaptive mixer's loss weights (``target:
        loss_weight``, megatron/train/mixer.py), set between iterations."""
        self.loss_weights = LossWeights(None if weights is None else tuple(float(w) for w in weights))

    @property
    def token_weighted(self) -> bool:
        """Whether losses are averaged weighted by their loss tokens (token and sample modes)."""
        return self.mode != "micro-batch"

    def prepare(self, batch: Dict, train: bool = True) -> Dict:
        """``batch`` (host tensors) with its loss mask as this normalisation weighs it: per-sample
        (segment) means in the sample mode, times the datasets' loss weights when training."""
        if self.mode == "sample":
            segments = batch.get("segment_ids") if self.packed else None
            batch = {**batch, "loss_mask": per_sample_mask(batch["loss_mask"], segments)}
        if train:
            batch = self.loss_weights.apply(batch)
        return batch

    def weigh(self, batches: Sequence[Dict], device) -> IterationLoss:
        """The loss weights of an iteration whose micro batches on this rank are ``batches``
        (prepared). In the token and sample modes this all-reduces the summed loss masks over the
        data-parallel group on ``device`` (no host wait) once per iteration."""
        if not self.token_weighted:
            return IterationLoss([1.0] * len(batches))
        counts = [float(b["loss_mask"].float().sum()) for b in batches]
        total = _all_reduced_sum(sum(counts), device, self.group)
        scale = float(self.dp * len(batches))
        return IterationLoss(counts, [total.reciprocal() * (c * scale) for c in counts])

    def sample_stats(self, raw: Dict, prepared: Dict):
        """(per-sample weights of the per-dataset losses, per-sample loss tokens as the objective
        weighs them) of a micro batch (host tensors): the raw loss tokens under
        --calculate-per-token-loss (per-dataset losses are token means), else None (sample means)."""
        tokens = prepared["loss_mask"].float().sum(dim=1)
        weights = raw["loss_mask"].float().sum(dim=1) if self.mode == "token" else None
        return weights, tokens

    def eval_weight(self, batch: Dict) -> float:
        """An evaluation micro batch's weight in the evaluation's mean (prepared ``batch``)."""
        return float(batch["loss_mask"].float().sum()) if self.token_weighted else 1.0


def _all_reduced_sum(value: float, device, group) -> torch.Tensor:
    """``value`` summed over ``group``, as a float32 tensor on ``device`` (1 where the sum is 0,
    so an iteration without loss tokens divides by 1; a weighted count below 1 stays as it is).
    The host does not wait: the value goes to the device from pinned memory, non-blocking, and
    the all-reduce is queued there."""
    total = to_device_async(torch.tensor([value], dtype=torch.float32), device)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(total, group=group)
    return nonzero_divisor(total)
