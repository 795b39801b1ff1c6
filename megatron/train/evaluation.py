"""Evaluation per validation/test group: the windows a run evaluates, their mean loss, the log lines
and records."""
import math
from typing import Dict, Iterator, Sequence

import torch

from megatron.config.run_config import LoopConfig
from megatron.data.train_data import EvalGroup
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


def evaluate(engine, loop: LoopConfig, group: EvalGroup, steps: StepFunctions, evaluation_index: int) -> float:
    """Mean loss over ``--eval-iters`` global batches of ``group``; evaluation number
    ``evaluation_index`` reads samples ``[k * eval_iters * gbs, (k+1) * eval_iters * gbs)`` (wrapping
    around the set), so a resumed run evaluates exactly what an uninterrupted one would."""
    samples_per_eval = loop.eval_iters * loop.global_batch_size
    length = len(group.dataset)
    usable = length - length % (loop.micro_batch_size * loop.data_parallel_size)
    start = (evaluation_index * samples_per_eval) % max(usable, 1)
    micro_per_eval = samples_per_eval // (loop.micro_batch_size * loop.data_parallel_size)
    engine.eval()
    with torch.no_grad():
        loss_sum, count = steps.eval_step(engine, _eval_batches(group.dataset, start, usable, loop),
                                          micro_per_eval)
    engine.train()
    total = _reduce_loss_sums(torch.stack([loss_sum.double().view(()),
                                           torch.tensor(float(count), dtype=torch.float64)]))
    return (total[0] / total[1]).item() if total[1] > 0 else math.nan


def _evaluate_all(engine, loop: LoopConfig, groups: Sequence[EvalGroup], steps: StepFunctions, iteration: int,
                  metrics: MetricsWriter, split: str = "valid") -> Dict[str, float]:
    results = {}
    # Periodic evaluation j (at iteration j * eval_interval) reads window j-1; a final evaluation at
    # an iteration between two periodic ones reads the next window. Windows never repeat in a run.
    evaluation_index = max(-(-iteration // loop.eval_interval) - 1, 0)
    for group in groups:
        if group.split != split:
            continue
        # a group that joined at a resume counts its windows from its first evaluation
        loss = evaluate(engine, loop, group, steps, max(evaluation_index - group.first_evaluation, 0))
        results[group.name] = loss
        label = split if group.name == split else f"{split} {group.name}"  # unnamed: "valid"
        print_rank_0(f" {label} | iteration {iteration} | lm loss: {loss:.6E} | "
                     f"ppl: {perplexity(loss):.6E}")
        metrics.eval_record({"iteration": iteration, "split": split, "group": group.name,
                             "lm_loss": loss, "ppl": perplexity(loss)})
    return results
