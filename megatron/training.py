"""The training loop on a DeepSpeed engine: schedule, evaluation per validation group, logging,
checkpoints and exact resume.

Progress is counted in iterations (optimizer steps over one global batch) and consumed samples; the
learning-rate scheduler is advanced by the samples of each iteration (Megatron-LM's convention).
"""
import functools
import math
import time
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from megatron.checkpoint.engine import TrainingState, load_checkpoint, save_checkpoint
from megatron.data.device_transfer import to_device_async
from megatron.data.train_data import EvalGroup, TrainData  # noqa: F401 (re-exported)
from megatron.data.samplers import PretrainingBatchSampler
from megatron.deepspeed_config import deepspeed_config_from_args
from megatron.initialize import initialize_distributed, set_seeds
from megatron.rank_utils import all_reduce_small, print_rank_0
from megatron.learning_rates import build_opt_param_scheduler
from megatron.loss_normalization import (LossNormalizer, LossWeights, normalization_from_args,
                                         normalization_line)
from megatron.metrics import MetricsWriter, metrics_writer_from_args, perplexity
from megatron.model.attention_backends import check_backend_trains
from megatron.model.lm_loss import masked_lm_loss
from megatron.moe_metrics import moe_training_from_args
from megatron.optimizer import build_optimizer
from megatron.parallel.topology import layout_line
from megatron.schedules.units import BatchSchedule, batch_schedule_from_args


def gpt_forward_step(engine, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward one micro batch; returns (mean loss over unmasked tokens, per-sample mean loss).

    Batch keys: ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` and optionally the
    compact attention structure ``segment_ids`` / ``is_prefix`` (absent: plain causal attention)
    with the segment layout the loader's collate computed (megatron/model/masks.py
    ``with_segment_layout``), which the model's core attention turns into its own mask form. The
    batch goes to the device in one non-blocking copy (megatron/data/device_transfer.py). Under
    DeepSpeed-Ulysses each rank keeps its slice of the per-token fields (the attention structure
    stays whole) and the losses are those of the whole sequences (megatron/parallel/ulysses.py).
    """
    from megatron.data.device_transfer import batch_to_device
    from megatron.model.masks import attention_structure_from_batch, with_segment_layout
    from megatron.parallel.ulysses import (sequence_parallel_group, sequence_rank_and_size,
                                           slice_batch_for_sequence_rank)

    rank, size = sequence_rank_and_size()
    batch = slice_batch_for_sequence_rank(with_segment_layout(batch), size, rank)
    batch = batch_to_device(batch, engine.device)
    per_token = engine(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                       packed_seq_params=attention_structure_from_batch(batch))
    return masked_lm_loss(per_token, batch["loss_mask"], sequence_parallel_group())


def _loader(dataset, consumed: int, args, total: Optional[int] = None) -> Iterator[Dict]:
    from megatron.core import parallel_state
    from megatron.model.masks import collate_with_segment_layout

    sampler = PretrainingBatchSampler(
        total_samples=total if total is not None else len(dataset), consumed_samples=consumed,
        micro_batch_size=args.micro_batch_size,
        data_parallel_rank=parallel_state.get_data_parallel_rank(),
        data_parallel_size=parallel_state.get_data_parallel_world_size())
    # Own generator: creating a DataLoader iterator otherwise draws its worker base seed from the
    # global torch RNG, which would shift the dropout stream of a resumed run (exact resume).
    # The collate adds the host-computed segment layout (megatron/model/masks.py); pinning happens
    # in the one-copy transfer to the device (megatron/data/device_transfer.py).
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers,
                                         collate_fn=collate_with_segment_layout, pin_memory=False,
                                         persistent_workers=False,
                                         generator=torch.Generator().manual_seed(args.seed))
    return iter(loader)


class ExitRequest:
    """Decides, identically on every rank, whether to stop after the current iteration:
    ``--exit-signal-handler`` (SIGTERM/SIGINT received by any rank), ``--exit-duration-in-mins``
    or ``--kill-switch-path`` (the file exists on any rank)."""

    def __init__(self, args):
        self.signal_received = False
        self.deadline = None
        self.reason = ""
        self.kill_switch_path = args.kill_switch_path
        if args.exit_duration_in_mins is not None:
            self.deadline = time.time() + 60.0 * args.exit_duration_in_mins
        if args.exit_signal_handler:
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        self.enabled = (args.exit_signal_handler or self.deadline is not None
                        or self.kill_switch_path is not None)

    def _on_signal(self, signum, frame):
        self.signal_received = True

    def should_exit(self) -> bool:
        """True on every rank when any rank saw a signal, the time limit has passed or any rank
        sees the kill-switch file."""
        from megatron.run_control import kill_switch_found

        if not self.enabled:
            return False
        flags = all_reduce_small(
            torch.tensor([float(self.signal_received),
                          float(self.deadline is not None and time.time() >= self.deadline),
                          float(kill_switch_found(self.kill_switch_path))]),
            torch.distributed.ReduceOp.MAX)
        if flags[0] > 0:
            self.reason = "exit signal received (--exit-signal-handler)"
        elif flags[1] > 0:
            self.reason = "time limit reached (--exit-duration-in-mins)"
        elif flags[2] > 0:
            self.reason = f"kill switch {self.kill_switch_path} found (--kill-switch-path)"
        return bool(flags.max() > 0)


def _data_parallel_group():
    """The group loss sums are reduced over: each data-parallel replica once (the tensor-parallel
    ranks of a replica hold the same loss)."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


def _reduce_loss_sums(local: torch.Tensor) -> torch.Tensor:
    """Sum per-rank loss sums and counts over the model replicas: over the pipeline group first
    (only the last stage holds losses; the other stages add zeros), then over the data-parallel
    group. Returns the sums on the CPU, the same on every rank."""
    from megatron.core import parallel_state

    if parallel_state.get_pipeline_model_parallel_world_size() > 1:
        local = all_reduce_small(local, group=parallel_state.get_pipeline_model_parallel_group())
    return all_reduce_small(local, group=_data_parallel_group())


class _IntervalStats:
    """Losses accumulated between two log lines (summed locally, reduced across ranks at log time):
    the loss as the run's normalisation averages it (each micro batch's mean weighted by its loss
    weight: 1, or its loss tokens under --calculate-per-token/-sample-loss,
    megatron/loss_normalization.py), the per-dataset losses (unweighted: sample means averaged over
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
        self.micro_batches = 0
        self.iterations = 0
        self.start = time.perf_counter()
        self.samples = 0

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
        self.micro_batches += 1
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


@dataclass(frozen=True)
class StepFunctions:
    """How one training iteration and one evaluation window run on this run's engine, picked once
    by :func:`step_functions`; everything else in the loop is shared by every layout.

    ``train_step(engine, iterator, num_micro_batches, stats, logging_now)`` runs the forward,
    backward and optimizer step of one global batch, adds the micro batches' losses to ``stats``
    and returns the unclipped gradient norm when it has one (else None: the engine's is used).
    ``eval_step(engine, iterator, num_micro_batches)`` returns (sum of the micro-batch losses,
    each weighted as the run's loss normalisation averages them, and the sum of those weights)
    of this rank."""

    train_step: Callable
    eval_step: Callable


def micro_batch_train_step(engine, iterator: Iterator[Dict], num_micro_batches: int, stats,
                           logging_now: bool, forward_step: Callable,
                           normalizer: Optional[LossNormalizer] = None) -> Optional[float]:
    """One iteration on a plain DeepSpeed engine: the iteration's micro batches are read and
    weighed first (``normalizer``, megatron/loss_normalization.py: the loss each backward pass
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
                          forward_step: Callable,
                          normalizer: Optional[LossNormalizer] = None) -> Tuple[torch.Tensor, float]:
    """Forward ``num_micro_batches`` micro batches; (sum of their losses, each weighted as the
    normalisation averages them, and the sum of the weights)."""
    normalizer = normalizer or LossNormalizer("micro-batch")
    loss_sum, weight_sum = None, 0.0
    for _ in range(num_micro_batches):
        batch = normalizer.prepare(next(iterator), train=False)
        loss, _ = forward_step(engine, batch)
        weight = normalizer.eval_weight(batch)
        value = loss.detach().double() * weight
        loss_sum = value if loss_sum is None else loss_sum + value
        weight_sum += weight
    return loss_sum.cpu(), weight_sum


def step_functions(engine, forward_step: Callable,
                   normalizer: Optional[LossNormalizer] = None) -> StepFunctions:
    """The pipe engine's ``train_batch``/``eval_batch`` steps (megatron/parallel/pipe.py) for a
    ``PipelineModule``, else the per-micro-batch steps around ``forward_step``; both weigh the
    losses with ``normalizer`` (default: Megatron-LM's per-micro-batch mean)."""
    from megatron.parallel.pipe import is_pipe_engine, pipe_eval_step, pipe_train_step

    normalizer = normalizer or LossNormalizer("micro-batch")
    if is_pipe_engine(engine):
        return StepFunctions(functools.partial(pipe_train_step, normalizer=normalizer),
                             functools.partial(pipe_eval_step, normalizer=normalizer))
    return StepFunctions(
        functools.partial(micro_batch_train_step, forward_step=forward_step, normalizer=normalizer),
        functools.partial(micro_batch_eval_step, forward_step=forward_step, normalizer=normalizer))


def _eval_batches(dataset, start: int, usable: int, args) -> Iterator[Dict]:
    """Micro batches of ``dataset`` from sample ``start``, wrapping around to sample 0 after
    ``usable`` samples (a set smaller than one evaluation)."""
    iterator = _loader(dataset, start, args, total=usable)
    while True:
        yield from iterator
        iterator = _loader(dataset, 0, args, total=usable)


def evaluate(engine, args, group: EvalGroup, steps: StepFunctions, evaluation_index: int) -> float:
    """Mean loss over ``--eval-iters`` global batches of ``group``; evaluation number
    ``evaluation_index`` reads samples ``[k * eval_iters * gbs, (k+1) * eval_iters * gbs)`` (wrapping
    around the set), so a resumed run evaluates exactly what an uninterrupted one would."""
    samples_per_eval = args.eval_iters * args.global_batch_size
    length = len(group.dataset)
    usable = length - length % (args.micro_batch_size * args.data_parallel_size)
    start = (evaluation_index * samples_per_eval) % max(usable, 1)
    micro_per_eval = samples_per_eval // (args.micro_batch_size * args.data_parallel_size)
    engine.eval()
    with torch.no_grad():
        loss_sum, count = steps.eval_step(engine, _eval_batches(group.dataset, start, usable, args),
                                          micro_per_eval)
    engine.train()
    total = _reduce_loss_sums(torch.stack([loss_sum.double().view(()),
                                           torch.tensor(float(count), dtype=torch.float64)]))
    return (total[0] / total[1]).item() if total[1] > 0 else math.nan


def _evaluate_all(engine, args, groups: Sequence[EvalGroup], steps: StepFunctions, iteration: int,
                  metrics: MetricsWriter, split: str = "valid") -> Dict[str, float]:
    results = {}
    # Periodic evaluation j (at iteration j * eval_interval) reads window j-1; a final evaluation at
    # an iteration between two periodic ones reads the next window. Windows never repeat in a run.
    evaluation_index = max(-(-iteration // args.eval_interval) - 1, 0)
    for group in groups:
        if group.split != split:
            continue
        # a group that joined at a resume counts its windows from its first evaluation
        loss = evaluate(engine, args, group, steps, max(evaluation_index - group.first_evaluation, 0))
        results[group.name] = loss
        label = split if group.name == split else f"{split} {group.name}"  # unnamed: "valid"
        print_rank_0(f" {label} | iteration {iteration} | lm loss: {loss:.6E} | "
                     f"ppl: {perplexity(loss):.6E}")
        metrics.eval_record({"iteration": iteration, "split": split, "group": group.name,
                             "lm_loss": loss, "ppl": perplexity(loss)})
    return results


def setup_model_and_optimizer(args, model_provider: Callable, initial_batch: int):
    """Model, torch optimizer, DeepSpeed engine and the LR/WD scheduler on the engine's groups."""
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from megatron.core import parallel_state
    from megatron.moe_arguments import describe_layer_freq, moe_layer_pattern
    from megatron.parallel.experts import check_stages_hold_experts, mark_expert_parameters
    from megatron.parallel.grads import install_sequence_parallel_grad_allreduce
    from megatron.parallel.pipe import check_grid_matches, install_model_grad_clipping
    from megatron.parallel.topology import MegatronCoreMPU
    from megatron.precision import precision_line

    model = model_provider(args)
    pipe = isinstance(model, PipelineModule)
    # expert-parallel experts reduced over their expert-data-parallel group (DeepSpeed's MoE path)
    if getattr(args, "num_experts", None):
        check_stages_hold_experts(model, moe_layer_pattern(args.moe_layer_freq, args.num_layers),
                                  args.expert_model_parallel_size, describe_layer_freq(args))
    mark_expert_parameters(model, getattr(args, "expert_model_parallel_size", 1))
    optimizer = build_optimizer(args, model)
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config_from_args(args, initial_batch),
        # A pipe engine takes its groups from the PipelineModule's topology (DeepSpeed refuses an
        # mpu with a pipe); they are checked against megatron-core's below.
        mpu=None if pipe else MegatronCoreMPU(), dist_init_required=False)
    if pipe:
        check_grid_matches(engine.grid)
        install_model_grad_clipping(engine)
    if args.sequence_parallel:  # megatron/parallel/grads.py
        when = install_sequence_parallel_grad_allreduce(
            engine, parallel_state.get_tensor_model_parallel_group())
        print_rank_0(f"sequence-parallel gradients summed over tensor-parallel ranks {when}")
    print_rank_0(precision_line(engine))  # megatron/precision.py; checks DeepSpeed's wrapper
    scheduler = build_opt_param_scheduler(args, ds_optimizer)
    return engine, ds_optimizer, scheduler


def _maybe_save(engine, args, state: TrainingState, scheduler,
                after_files_written: Optional[Callable[[int], None]] = None,
                data: Optional[TrainData] = None) -> None:
    if not args.save:
        return
    state.extra["opt_param_scheduler"] = scheduler.state_dict()
    from megatron.checkpoint.model_args import model_args_from_args

    mix = data.mix if data is not None else None  # the data ledger: data_mix.json
    record = mix.record(state.iteration, state.consumed_samples).to_json() if mix else None
    directory = save_checkpoint(engine, args.save, state, model_args_from_args(args),
                                after_files_written=after_files_written, data_mix=record)
    print_rank_0(f"saved checkpoint {directory}")


def data_resume_from_args(args):
    """The checkpoint a resumed run's data continues (megatron/data/mix_resume.py
    ``DataResume``: its data ledger, read from ``data_mix.json`` before any dataset is built), or
    None: no ``--load``, no checkpoint there yet, or ``--finetune``/``--reset-progress`` (whose
    data starts at sample 0)."""
    import os

    from megatron.checkpoint.format import checkpoint_tag, read_data_mix, read_tracker
    from megatron.data.mix_ledger import MixRecord
    from megatron.data.mix_resume import DataResume

    if not args.load or args.finetune or args.reset_progress:
        return None
    iteration = read_tracker(args.load)
    if iteration is None:
        return None
    directory = os.path.join(args.load, checkpoint_tag(iteration))
    record = read_data_mix(directory) if os.path.isdir(directory) else None
    if record is not None:
        record = MixRecord.from_json(record, os.path.join(directory, "data_mix.json"))
    return DataResume(args.load, iteration, record, override=args.override_data_mix,
                      evaluate_only=args.skip_train)


def _restore(engine, args, scheduler) -> TrainingState:
    if not args.load:
        return TrainingState()
    state = load_checkpoint(engine, args.load, finetune=args.finetune,
                            load_optimizer=not args.no_load_optim, load_rng=not args.no_load_rng,
                            universal=args.universal_checkpoint)
    if state is None:
        print_rank_0(f"no checkpoint in --load {args.load}; starting from scratch")
        return TrainingState()
    if args.finetune:
        import os

        from megatron.checkpoint.format import checkpoint_tag, read_tracker

        loaded = read_tracker(args.load)  # the iteration load_checkpoint just loaded
        print_rank_0(f"--finetune: loaded the model weights of "
                     f"{os.path.join(args.load, checkpoint_tag(loaded))} (iteration {loaded} of "
                     f"--load {args.load}); iteration, consumed samples, optimizer state, "
                     "learning-rate/weight-decay scheduler and RNG start fresh (iteration 0)")
        return state
    if args.reset_progress:
        # The engine's own counters start over too, as after a fresh start; the optimizer state
        # just loaded brought the checkpoint's learning rates into the param groups: set the
        # fresh schedule's values at progress 0 again.
        engine.global_steps, engine.global_samples = 0, 0
        scheduler.step(0, iterations=0)
        loaded = "the model" if args.no_load_optim else "the model and optimizer state"
        print_rank_0(f"--reset-progress: loaded {loaded} of iteration "
                     f"{state.iteration} of --load {args.load}; iteration, consumed samples and "
                     "the learning-rate/weight-decay schedule (this run's flags) start at 0")
        return TrainingState()
    if "opt_param_scheduler" in state.extra and not args.finetune:
        scheduler.load_state_dict(state.extra["opt_param_scheduler"])
    print_rank_0(f"resumed from --load {args.load} at iteration {state.iteration}, "
                 f"consumed samples {state.consumed_samples}")
    return state


def _log_iteration(args, metrics, stats: _IntervalStats, state: TrainingState, lr: float, wd: float,
                   grad_norm: Optional[float], dataset_names: List[str], batch_size: int,
                   skip_fields: Optional[Dict[str, int]] = None, moe=None, mix=None) -> None:
    loss, dataset_loss, dataset_count, dataset_tokens = stats.reduced()
    # MoE: load-balancing losses and tokens per expert, beside lm_loss (megatron/moe_metrics.py)
    moe_fields = moe.interval_record(stats.iterations) if moe else {}
    elapsed = time.perf_counter() - stats.start
    ms_per_iter = 1000.0 * elapsed / max(stats.iterations, 1)
    tokens_per_s = stats.samples * args.seq_length / max(elapsed, 1e-9)
    per_dataset = {name: (dataset_loss[i] / dataset_count[i]).item()
                   for i, name in enumerate(dataset_names) if dataset_count[i] > 0}
    all_tokens = float(dataset_tokens.sum())
    token_share = {name: float(dataset_tokens[i]) / all_tokens
                   for i, name in enumerate(dataset_names) if all_tokens > 0}
    line = (f" iteration {state.iteration:8d}/{args.train_iters:8d} | consumed samples: "
            f"{state.consumed_samples:12d} | elapsed time per iteration (ms): {ms_per_iter:.1f} | "
            f"tokens/s: {tokens_per_s:.1f} | global batch size: {batch_size:5d} | learning rate: "
            f"{lr:.6E} | lm loss: {loss:.6E} | grad norm: "
            f"{'n/a' if grad_norm is None else f'{grad_norm:.3f}'}")
    if per_dataset:
        line += " | " + " | ".join(f"{k} loss: {v:.4f}" for k, v in per_dataset.items())
    if moe_fields:
        line += " | " + " | ".join(f"{k.replace('_', ' ')}: {v:.4g}" for k, v in moe_fields.items()
                                   if "_layer_" not in k)
    if skip_fields is not None:  # megatron/skip_step_engine.py StepSkipper.log_fields
        line += (f" | skipped iterations: {skip_fields['skipped']} "
                 f"(total {skip_fields['skipped_total']})")
    print_rank_0(line)
    metrics.train_record({
        "iteration": state.iteration, "consumed_samples": state.consumed_samples,
        "consumed_tokens": state.consumed_samples * args.seq_length, "lr": lr, "weight_decay": wd,
        "lm_loss": loss, "grad_norm": grad_norm, "per_dataset_loss": per_dataset,
        # each dataset's share of the interval's loss tokens, as the objective weighs them
        **({"loss_token_share": token_share} if token_share else {}),
        "tokens_per_second": tokens_per_s, "ms_per_iteration": ms_per_iter,
        "global_batch_size": batch_size, **moe_fields, **(skip_fields or {}),
        # the data ledger: samples drawn per dataset so far (megatron/data/mix_resume.py)
        **({"samples_drawn": mix.samples_drawn(state.consumed_samples)} if mix else {})})


def _unclipped_grad_norm(engine) -> Optional[float]:
    """L2 norm of the whole model's (data-parallel averaged) gradient before clipping. ZeRO stages
    keep it in the engine; at stage 0 (fp32 only: mixed precision runs at stage 1 at least,
    megatron/precision.py) DeepSpeed does not, so it is computed from the module's gradients,
    which hold the averaged values between the boundary backward and the optimizer step
    (``megatron.parallel.pipe.model_grad_norm``)."""
    from megatron.parallel.pipe import model_grad_norm

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


def train(args, engine, optimizer, scheduler, data: TrainData, steps: StepFunctions,
          state: TrainingState, metrics: MetricsWriter, batch_schedule: BatchSchedule,
          after_checkpoint_files_written: Optional[Callable[[int], None]] = None,
          skipper=None, moe=None) -> bool:
    """Run iterations ``state.iteration + 1 .. --train-iters`` (updating ``state`` in place) with
    ``steps`` (:func:`step_functions`); returns True when ``--exit-interval`` stopped the run
    early. ``after_checkpoint_files_written``: see :func:`pretrain`. ``skipper``: the
    megatron/skip_step_engine.py ``StepSkipper`` of the skip flags, or None. ``moe``: the
    megatron/moe_metrics.py ``MoETraining`` of an MoE model, or None."""
    per_step = args.micro_batch_size * args.data_parallel_size
    stats = _IntervalStats(len(data.dataset_names))
    exit_request = ExitRequest(args)
    iterator = _loader(data.train, state.consumed_samples, args)
    engine.train()
    while state.iteration < args.train_iters:
        batch_size = batch_schedule.batch_size_at_samples(state.consumed_samples)
        if batch_size != engine.train_batch_size():
            engine.set_train_batch_size(batch_size)
        lr = optimizer.param_groups[0]["lr"]
        wd = optimizer.param_groups[0]["weight_decay"]
        num_micro_batches = batch_size // per_step
        logging_now = (state.iteration + 1) % args.log_interval == 0
        if skipper is not None:
            skipper.begin_iteration()
        if moe is not None:  # the aux losses' gradient scale follows GAS and the fp16 loss scale
            moe.set_backward_scale(engine)
        stage0_norm = steps.train_step(engine, iterator, num_micro_batches, stats, logging_now)
        state.iteration += 1
        if skipper is not None:  # a skipped step still consumes its data and advances the LR
            skipper.end_iteration(state.iteration)
            skipper.save_to(state)  # the window goes into every checkpoint's training state
        state.consumed_samples += batch_size
        scheduler.step(increment=batch_size)
        stats.iterations += 1
        stats.samples += batch_size
        if state.iteration % args.log_interval == 0:
            _log_iteration(args, metrics, stats, state, lr, wd, _grad_norm(engine, stage0_norm),
                           data.dataset_names, batch_size,
                           skipper.log_fields() if skipper is not None else None, moe,
                           data.mix if metrics.enabled else None)
            stats.reset()
        paused = time.perf_counter()  # evaluation and saving stay out of the per-iteration time
        if args.eval_iters and data.eval_groups and state.iteration % args.eval_interval == 0:
            _evaluate_all(engine, args, data.eval_groups, steps, state.iteration, metrics)
        if args.save_interval and state.iteration % args.save_interval == 0:
            _maybe_save(engine, args, state, scheduler, after_checkpoint_files_written, data)
        stats.start += time.perf_counter() - paused
        reason = None
        if args.exit_interval and state.iteration % args.exit_interval == 0:
            reason = f"--exit-interval {args.exit_interval}"
        elif state.iteration in (args.phase_transition_iterations or ()):
            reason = (f"--phase-transition-iterations: a phase ends at iteration "
                      f"{state.iteration}; relaunch with the next phase's data mix (and "
                      "--override-data-mix) to continue")
        elif exit_request.should_exit():
            reason = exit_request.reason
        if reason is not None:
            if not (args.save_interval and state.iteration % args.save_interval == 0):
                _maybe_save(engine, args, state, scheduler, after_checkpoint_files_written, data)
            print_rank_0(f"exiting at iteration {state.iteration}: {reason}")
            return True
    return False


def _check_data_resume(resume, state: TrainingState) -> None:
    """The data ledger read before the datasets were built must be the loaded checkpoint's."""
    from megatron.errors import CheckpointError

    if resume is None or resume.record is None or state.iteration == 0:
        return
    record = resume.record
    if (record.iteration, record.consumed_samples) != (state.iteration, state.consumed_samples):
        raise CheckpointError(
            f"--load {resume.load_dir}: its data_mix.json is of iteration {record.iteration} "
            f"(consumed samples {record.consumed_samples}) but the checkpoint loaded is of "
            f"iteration {state.iteration} (consumed samples {state.consumed_samples}); was the "
            "directory written to during the start-up?")


def loss_normalizer_from_args(args, data: TrainData) -> LossNormalizer:
    """How this run weighs its losses (megatron/loss_normalization.py): the normalisation of
    --calculate-per-token-loss / --calculate-per-sample-loss (per segment for packed T0 samples),
    the training datasets' loss weights, over megatron-core's data-parallel group."""
    from megatron.core import parallel_state

    return LossNormalizer(normalization_from_args(args), packed=getattr(args, "packed_samples", False),
                          loss_weights=LossWeights(data.loss_weights),
                          data_parallel_group=parallel_state.get_data_parallel_group(),
                          data_parallel_size=args.data_parallel_size)


def _kill_switch_at_start(args) -> bool:
    """True on every rank when any rank finds the ``--kill-switch-path`` file before the run
    starts (BigScience: a queued job whose kill switch is set exits at once, building nothing)."""
    from megatron.run_control import kill_switch_found

    if args.kill_switch_path is None:
        return False
    found = all_reduce_small(torch.tensor([float(kill_switch_found(args.kill_switch_path))]),
                             torch.distributed.ReduceOp.MAX)
    if found.item() > 0:
        print_rank_0(f"kill switch {args.kill_switch_path} found (--kill-switch-path) at start-up: "
                     "exiting without training")
        return True
    return False


def pretrain(args, datasets_provider: Callable, model_provider: Callable,
             forward_step: Callable = gpt_forward_step,
             after_checkpoint_files_written: Optional[Callable[[int], None]] = None
             ) -> TrainingState:
    """Set up distributed state, model, engine, scheduler and data, restore ``--load``, train to
    ``--train-iters``, evaluate every group, save, and return the final training state.

    ``datasets_provider(args, resume) -> TrainData`` (``resume``: :func:`data_resume_from_args`,
    the data ledger of the checkpoint a resumed run continues, or None);
    ``model_provider(args) -> torch.nn.Module``.
    ``after_checkpoint_files_written(iteration)`` runs on every rank once its files of a
    checkpoint are written, before the tracker names it (a test's fault injection).
    """
    check_backend_trains(args)  # before start-up: FlexAttention has no backward on a CPU
    initialize_distributed(args)
    for note in args.startup_notes:  # flag compatibility and --deepspeed_config notes
        print_rank_0(note)
    if _kill_switch_at_start(args):
        return TrainingState()
    set_seeds(args.seed)
    batch_schedule = batch_schedule_from_args(args)  # args.train_iters: derived by validate_args
    resume = data_resume_from_args(args)  # the checkpoint's data ledger, before any dataset
    data = datasets_provider(args, resume)
    rank0 = torch.distributed.get_rank() == 0
    metrics = metrics_writer_from_args(args, enabled=rank0)  # jsonl, TensorBoard, W&B
    engine, optimizer, scheduler = setup_model_and_optimizer(
        args, model_provider, batch_schedule.batch_size_at_samples(0))
    state = _restore(engine, args, scheduler)
    _check_data_resume(resume, state)
    if args.load and not args.skip_train and state.iteration >= args.train_iters > 0:
        # A resume at the end of training: no step, no evaluation, no duplicate metrics records.
        print_rank_0(f"nothing to train: the checkpoint in --load {args.load} is at iteration "
                     f"{state.iteration} and --train-iters is {args.train_iters}; to train on, "
                     f"raise --train-iters (with --override-opt_param-scheduler so the LR schedule "
                     f"follows the new length)")
        metrics.close()
        return state
    print_rank_0(f"training: {args.train_iters} iterations, global batch {args.global_batch_size}, "
                 f"micro batch {args.micro_batch_size} | {layout_line(args, engine)}")
    if args.train_tokens_note:
        print_rank_0(args.train_tokens_note)
    if args.skip_train:
        print_rank_0(f"--eval-only/--skip-train: evaluating the model of iteration "
                     f"{state.iteration} on the validation and test sets, no training")
    from megatron.skip_step_engine import step_skipper_from_args

    skipper = step_skipper_from_args(args, engine)  # --grad-norm-skip-threshold, ... or None
    if skipper is not None:
        skipper.restore_from(state)
    normalizer = loss_normalizer_from_args(args, data)
    print_rank_0(normalization_line(normalizer.mode, normalizer.packed))
    steps = step_functions(engine, skipper.recording(forward_step) if skipper else forward_step,
                           normalizer)
    start_iteration = state.iteration
    exited_early = False
    if not args.skip_train and state.iteration < args.train_iters:
        exited_early = train(args, engine, optimizer, scheduler, data, steps, state, metrics,
                             batch_schedule, after_checkpoint_files_written, skipper,
                             moe_training_from_args(engine.module, args))
        if args.save and state.iteration > start_iteration and not exited_early \
                and not (args.save_interval and state.iteration % args.save_interval == 0):
            _maybe_save(engine, args, state, scheduler, after_checkpoint_files_written, data)
    if not exited_early and args.eval_iters:
        if state.iteration % args.eval_interval != 0 or args.skip_train or state.iteration == start_iteration:
            _evaluate_all(engine, args, data.eval_groups, steps, state.iteration, metrics)
        _evaluate_all(engine, args, data.eval_groups, steps, state.iteration, metrics,
                      split="test")
    metrics.close()
    return state
