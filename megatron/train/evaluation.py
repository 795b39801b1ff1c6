"""Evaluation per validation/test group: the windows a run evaluates, their mean loss (and, with
``--eval-position-buckets``, the mean loss per range of token positions), the log lines and
records."""
import math
from dataclasses import dataclass, field
from typing import Dict, Iterator, Sequence

import torch

from megatron.config.run_config import LoopConfig
from megatron.data.train_data import EvalGroup
from megatron.metrics.position_buckets import bucket_fields, bucket_tag
from megatron.metrics.writers import MetricsWriter, perplexity
from megatron.train.loader import _loader
from megatron.train.stats import _reduce_loss_sums
from megatron.train.steps import StepFunctions
from megatron.utils.rank_utils import print_rank_0


def _eval_batches(dataset, start: int, usable: int, loop: LoopConfig) -> Iterator[Dict]:
    """Micro batches of ``dataset`` from sample ``start``, wrapping around to sample 0 after
    ``usable`` samples (a set smaller than one evaluation)."""
    iterator = _loader(dataset, start, loop, total=usable)
    while True:
        yield from iterator
        iterator = _loader(dataset, 0, loop, total=usable)


@dataclass(frozen=True)
class GroupEvaluation:
    """One evaluation of one group, summed over the data-parallel replicas: ``loss``, the mean
    loss as the run's normalisation averages it (nats per token; NaN without loss tokens), and
    ``position_fields``, each position bucket's mean loss (nats per loss token) and loss tokens
    as record fields (megatron/metrics/position_buckets.py ``bucket_fields``; empty without
    buckets)."""

    loss: float
    position_fields: Dict[str, float] = field(default_factory=dict)


def evaluate(engine, loop: LoopConfig, group: EvalGroup, steps: StepFunctions,
             evaluation_index: int) -> GroupEvaluation:
    """Mean loss over ``--eval-iters`` global batches of ``group`` (and per position bucket of
    ``loop.position_buckets``); evaluation number ``evaluation_index`` reads samples
    ``[k * eval_iters * gbs, (k+1) * eval_iters * gbs)`` (wrapping around the set), so a resumed
    run evaluates exactly what an uninterrupted one would. The sums are reduced over the pipeline
    stages and the data-parallel replicas (every rank gets the same values)."""
    samples_per_eval = loop.eval_iters * loop.global_batch_size
    length = len(group.dataset)
    usable = length - length % (loop.micro_batch_size * loop.data_parallel_size)
    start = (evaluation_index * samples_per_eval) % max(usable, 1)
    micro_per_eval = samples_per_eval // (loop.micro_batch_size * loop.data_parallel_size)
    buckets = loop.position_buckets
    engine.eval()
    with torch.no_grad():
        loss_sum, count, sums = steps.eval_step(
            engine, _eval_batches(group.dataset, start, usable, loop), micro_per_eval,
            buckets=buckets)
    engine.train()
    local = [loss_sum.double().view(1), torch.tensor([float(count)], dtype=torch.float64)]
    if buckets is not None:
        local.append(sums.double().reshape(-1))
    total = _reduce_loss_sums(torch.cat(local))
    loss = (total[0] / total[1]).item() if total[1] > 0 else math.nan
    if buckets is None:
        return GroupEvaluation(loss)
    return GroupEvaluation(loss, bucket_fields(buckets, total[2:].view(2, buckets.count)))


def _evaluate_all(engine, loop: LoopConfig, groups: Sequence[EvalGroup], steps: StepFunctions, iteration: int,
                  metrics: MetricsWriter, split: str = "valid") -> Dict[str, float]:
    """Evaluate each group of ``split``: one log line and one record per group (with its position
    buckets' losses and loss tokens under ``--eval-position-buckets``); returns each group's
    loss (nats per token)."""
    results = {}
    # Periodic evaluation j (at iteration j * eval_interval) reads window j-1; a final evaluation at
    # an iteration between two periodic ones reads the next window. Windows never repeat in a run.
    evaluation_index = max(-(-iteration // loop.eval_interval) - 1, 0)
    for group in groups:
        if group.split != split:
            continue
        # a group that joined at a resume counts its windows from its first evaluation
        result = evaluate(engine, loop, group, steps,
                          max(evaluation_index - group.first_evaluation, 0))
        loss = results[group.name] = result.loss
        label = split if group.name == split else f"{split} {group.name}"  # unnamed: "valid"
        fields = result.position_fields
        by_position = "".join(
            f" | loss [{lo}, {hi}): {fields[bucket_tag(lo, hi)]:.6E}"
            for lo, hi in (loop.position_buckets.ranges if loop.position_buckets else ())
            if bucket_tag(lo, hi) in fields)
        print_rank_0(f" {label} | iteration {iteration} | lm loss: {loss:.6E} | "
                     f"ppl: {perplexity(loss):.6E}{by_position}")
        metrics.eval_record({"iteration": iteration, "split": split, "group": group.name,
                             "lm_loss": loss, "ppl": perplexity(loss), **result.position_fields})
    return results
