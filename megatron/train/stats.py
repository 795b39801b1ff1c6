"""The losses of a log interval (reduced over the model replicas) and the iteration's log line and
training record."""
import time
from typing import List, Optional, Sequence, Tuple

import torch

from megatron.checkpoint.engine import TrainingState
from megatron.config.run_config import LoopConfig
from megatron.data.device_transfer import to_device_async
from megatron.utils.rank_utils import all_reduce_small, print_rank_0


def _data_parallel_group():
    """The group loss sums are reduced over: each data-parallel replica once (the tensor-parallel
    ranks of a replica hold the same loss)."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def _reduce_loss_sums(local: torch.Tensor) -> torch.Tensor:
    """Sum per-rank loss sums and counts over the model replicas: over the pipeline group first
    (only the last stage holds losses; the other stages add zeros), then over the data-parallel
    group. Returns the sums on the CPU, the same on every rank (a process without a process
    group: its own)."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():  # a tool or a test: every rank's
        return all_reduce_small(local).cpu()  # (a process without a process group: its own)
    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        local = all_reduce_small(local, group=parallel_state.get_pipeline_model_parallel_group())
    return all_reduce_small(local, group=_data_parallel_group())


class _IntervalStats:
    """Losses accumulated between two log lines (summed locally, reduced across ranks at log time):
    the loss as the run's normalisation averages it (each micro batch's mean weighted by its loss
    weight: 1, or its loss tokens under --calculate-per-token/-sample-loss,
    megatron/optim/loss_normalization.py), the per-dataset losses (unweighted: sample means averaged over
    samples, or token means over tokens under --calculate-per-token-loss) and each dataset's loss
    tokens as the objective weighs them (its share of the loss)."""

    def __init__(self, num_datasets: int):
        self.num_datasets = num_datasets
        self.reset()

    def reset(self) -> None:
        # Sums live on the device of the losses (allocated at the first micro batch), so adding a
        # micro batch never waits for the GPU; they come to the CPU once per log interval.
        self.loss_sum = None
        self.dataset_loss = None
        self.dataset_count = None
        self.dataset_tokens = None
        self.weight_sum = 0.0
        self.iterations = 0
        self.start = time.perf_counter()
        self.samples = 0
        self.tokens = 0  # trained (the batch schedule's tokens, sequence-length curriculum aware)

    def add_micro_batch(self, loss: torch.Tensor, per_sample: torch.Tensor,
                        dataset_id: Optional[torch.Tensor], weight: float = 1.0,
                        sample_weights: Optional[torch.Tensor] = None,
                        loss_tokens: Optional[torch.Tensor] = None) -> None:
        """One micro batch: its mean ``loss`` (weighted by ``weight`` in the interval's loss), its
        per-sample losses (weighted by ``sample_weights``, default 1, in the per-dataset losses) and
        ``loss_tokens`` (host, per sample: its loss mask as the objective weighs it)."""
        device = loss.device
        if self.loss_sum is None:
            size = max(self.num_datasets, 1)
            self.loss_sum = torch.zeros(1, dtype=torch.float64, device=device)
            self.dataset_loss = torch.zeros(size, dtype=torch.float64, device=device)
            self.dataset_count = torch.zeros(size, dtype=torch.float64, device=device)
            self.dataset_tokens = torch.zeros(size, dtype=torch.float64, device=device)
        self.loss_sum += loss.detach().double() * weight
        self.weight_sum += weight
        if dataset_id is None and self.num_datasets == 1:
            dataset_id = torch.zeros(per_sample.numel(), dtype=torch.long)
        if dataset_id is not None and self.num_datasets:
            ids = to_device_async(torch.as_tensor(dataset_id).long().view(-1), device)
            if loss_tokens is not None:
                self.dataset_tokens.index_add_(
                    0, ids, to_device_async(loss_tokens.double().view(-1), device))
            counts = (torch.ones_like(ids, dtype=torch.float64) if sample_weights is None
                      else to_device_async(sample_weights.double().view(-1), device))
            self.dataset_loss.index_add_(0, ids, per_sample.double() * counts)
            self.dataset_count.index_add_(0, ids, counts)

    def reduced(self) -> Tuple[float, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(loss, per-dataset loss sums, their weights, per-dataset loss tokens), summed over the
        model replicas."""
        size = max(self.num_datasets, 1)
        zeros = torch.zeros(size, dtype=torch.float64)
        local = torch.cat([
            self.loss_sum.cpu() if self.loss_sum is not None else torch.zeros(1, dtype=torch.float64),
            torch.tensor([self.weight_sum], dtype=torch.float64),
            self.dataset_loss.cpu() if self.dataset_loss is not None else zeros,
            self.dataset_count.cpu() if self.dataset_count is not None else zeros,
            self.dataset_tokens.cpu() if self.dataset_tokens is not None else zeros])
        packed = _reduce_loss_sums(local)
        loss = (packed[0] / packed[1]).item() if packed[1] > 0 else 0.0
        return loss, packed[2:2 + size], packed[2 + size:2 + 2 * size], packed[2 + 2 * size:]


def _log_iteration(loop: LoopConfig, metrics, stats: _IntervalStats, state: TrainingState, lr: float, wd: float,
                   grad_norm: Optional[float], dataset_names: List[str], batch_size: int,
                   seq_length: int, consumed_tokens: int, hooks: Sequence = (), mix=None) -> None:
    """The log line and training record of the interval in ``stats`` (reduced over the replicas
    here), with each loop hook's fields (megatron/train/hooks.py; e.g. the MoE scalars, skipped
    steps) and, given the run's ``mix``, the samples drawn per dataset. ``seq_length``: tokens per
    sample the last iteration trained; ``consumed_tokens``: tokens trained so far (the batch
    schedule's, megatron/schedules/units.py)."""
    loss, dataset_loss, dataset_count, dataset_tokens = stats.reduced()
    hook_fields = [hook.log_fields(stats.iterations) for hook in hooks]
    hook_record = {key: value for _, fields in hook_fields for key, value in fields.items()}
    elapsed = time.perf_counter() - stats.start
    ms_per_iter = 1000.0 * elapsed / max(stats.iterations, 1)
    tokens_per_s = stats.tokens / max(elapsed, 1e-9)
    per_dataset = {name: (dataset_loss[i] / dataset_count[i]).item()
                   for i, name in enumerate(dataset_names) if dataset_count[i] > 0}
    all_tokens = float(dataset_tokens.sum())
    token_share = {name: float(dataset_tokens[i]) / all_tokens
                   for i, name in enumerate(dataset_names) if all_tokens > 0}
    line = (f" iteration {state.iteration:8d}/{loop.train_iters:8d} | consumed samples: "
            f"{state.consumed_samples:12d} | elapsed time per iteration (ms): {ms_per_iter:.1f} | "
            f"tokens/s: {tokens_per_s:.1f} | global batch size: {batch_size:5d} | learning rate: "
            f"{lr:.6E} | lm loss: {loss:.6E} | grad norm: "
            f"{'n/a' if grad_norm is None else f'{grad_norm:.3f}'}")
    if seq_length != loop.seq_length:  # Microsoft's "curriculum seqlen" segment
        line += f" | seq length: {seq_length}"
    if per_dataset:
        line += " | " + " | ".join(f"{k} loss: {v:.4f}" for k, v in per_dataset.items())
    for segment, _ in hook_fields:
        if segment:
            line += " | " + segment
    print_rank_0(line)
    metrics.train_record({
        "iteration": state.iteration, "consumed_samples": state.consumed_samples,
        "consumed_tokens": consumed_tokens, "seq_length": seq_length, "lr": lr, "weight_decay": wd,
        "lm_loss": loss, "grad_norm": grad_norm, "per_dataset_loss": per_dataset,
        # each dataset's share of the interval's loss tokens, as the objective weighs them
        **({"loss_token_share": token_share} if token_share else {}),
        "tokens_per_second": tokens_per_s, "ms_per_iteration": ms_per_iter,
        "global_batch_size": batch_size, **hook_record,
        # the data ledger: samples drawn per dataset so far (megatron/data/mix_resume.py)
        **({"samples_drawn": mix.samples_drawn(state.consumed_samples)} if mix else {}),
        # an adaptive mixer's weights, drawn from the next iteration on (megatron/train/mixer.py)
        **({"mixer_weights": mix.mixer_weights()} if mix and mix.mixer_weights() else {}),
        # target loss_weight: the datasets' loss weights the next iteration trains with
        **({"mixer_loss_weights": mix.mixer_loss_weights()}
           if mix and mix.mixer_loss_weights() else {})})
