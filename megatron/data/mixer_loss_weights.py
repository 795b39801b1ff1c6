"""The objective-side adaptive mixer (issue 46 item 2; ``mixer: {..., target: loss_weight}``): the
policy's weights (megatron/data/mixer_policies.py) become the training datasets' loss weights
while the sampling stays the blend's static mix, DoReMi-style (Xie et al. 2023, "DoReMi:
Optimizing Data Mixtures Speeds Up Language Model Pretraining": the data order is untouched, the
domain weights ``alpha`` on the simplex weigh the per-domain losses of the objective
``sum_i alpha_i L_i``).

Dataset ``i``, sampled with the starting mix's weight ``w0_i`` (the blend's, normalised), weighs

    lambda_i = s_i * w_i / w0_i

``w`` the policy's weights in force (on the simplex, floored) and ``s_i`` the dataset's static
loss weight (``loss_weight:`` / ``--dataset-loss-weights``, 1 without). ``w_i / w0_i`` is the
importance weight of the mix ``w`` against the mix the tokens are drawn from: under the
per-token normalisation the objective ``sum_t lambda_d(t) l_t / sum_t lambda_d(t)`` over a
global batch drawn from ``w0`` has, in expectation (numerator and denominator), that of a batch
drawn from ``w``: ``sum_i w_i t_i L_i / sum_i w_i t_i`` (``L_i`` dataset ``i``'s per-token mean
loss, ``t_i`` its loss tokens per sample), DoReMi's objective with ``alpha = w`` where every
sample carries as many loss tokens; at the starting mix every ratio is 1, so the run is the
static one's, bit for bit. Every normalisation of the project divides by the
weighted loss-token count, so a common factor of the weights cancels: only their ratios matter.
A dataset the blend never draws (``w0_i = 0``) keeps its static weight (it has no tokens to
weigh).
"""
from typing import List, Optional, Sequence

__all__ = ["objective_loss_weights"]


def objective_loss_weights(weights: Sequence[float], start: Sequence[float],
                           static: Optional[Sequence[float]] = None) -> List[float]:
    """Each dataset's loss weight (a multiplier of its tokens' loss mask, unitless) when the
    policy's ``weights`` (on the simplex) move the objective of a run drawing the starting mix
    ``start`` (normalised here): ``static_i * weights_i / start_i`` (module docstring);
    ``static``: the datasets' own loss weights, None for all 1."""
    total = float(sum(start))
    static = [1.0] * len(weights) if static is None else [float(x) for x in static]
    if not len(weights) == len(start) == len(static):
        raise ValueError(f"{len(weights)} weights, {len(start)} starting weights and "
                         f"{len(static)} static loss weights: one each per dataset")
    return [s if w0 <= 0 else s * float(w) / (float(w0) / total)
            for w, w0, s in zip(weights, start, static, strict=True)]
