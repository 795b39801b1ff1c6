"""The training loop on a DeepSpeed engine: schedule, evaluation per validation group, logging,
checkpoints and exact resume.

Progress is counted in iterations (optimizer steps over one global batch) and consumed samples; the
learning-rate scheduler is advanced by the samples of each iteration (Megatron-LM's convention).
"""
import math
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import torch

from megatron.checkpointing import TrainingState, load_checkpoint, save_checkpoint
from megatron.data.train_data import EvalGroup, TrainData  # noqa: F401 (re-exported)
from megatron.data.samplers import PretrainingBatchSampler
from megatron.deepspeed_config import deepspeed_config_from_args
from megatron.initialize import all_reduce_small, initialize_distributed, print_rank_0, set_seeds
from megatron.learning_rates import build_opt_param_scheduler
from megatron.metrics import MetricsWriter, perplexity
from megatron.optimizer import build_optimizer
from megatron.parallel.topology import layout_line
from megatron.schedules.units import (BatchSchedule, batch_schedule_from_args,
                                      train_iterations_from_args)


def _to_device(batch: Dict[str, torch.Tensor], device) -> Dict[str, torch.Tensor]:
    return {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}


def gpt_forward_step(engine, batch: Dict[str, torch.Tensor]) -> Tuple[torch.Tensor, torch.Tensor]:
    """Forward one micro batch; returns (mean loss over unmasked tokens, per-sample mean loss).

    Batch keys: ``tokens``, ``labels``, ``loss_mask``, ``position_ids`` and optionally the
    compact attention structure ``segment_ids`` / ``is_prefix`` (absent: plain causal attention),
    which the model's core attention turns into its own mask form (megatron/model/masks.py).
    """
    from megatron.model.masks import attention_structure_from_batch

    batch = _to_device(batch, engine.device)
    per_token = engine(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                       packed_seq_params=attention_structure_from_batch(batch))
    mask = batch["loss_mask"].to(per_token.dtype)
    per_token = per_token.float() * mask.float()
    tokens_per_sample = mask.float().sum(dim=1)
    loss = per_token.sum() / tokens_per_sample.sum().clamp(min=1.0)
    per_sample = per_token.sum(dim=1) / tokens_per_sample.clamp(min=1.0)
    return loss, per_sample.detach()


def _loader(dataset, consumed: int, args, total: Optional[int] = None) -> Iterator[Dict]:
    from megatron.core import parallel_state

    sampler = PretrainingBatchSampler(
        total_samples=total if total is not None else len(dataset), consumed_samples=consumed,
        micro_batch_size=args.micro_batch_size,
        data_parallel_rank=parallel_state.get_data_parallel_rank(),
        data_parallel_size=parallel_state.get_data_parallel_world_size())
    # Own generator: creating a DataLoader iterator otherwise draws its worker base seed from the
    # global torch RNG, which would shift the dropout stream of a resumed run (exact resume).
    loader = torch.utils.data.DataLoader(dataset, batch_sampler=sampler, num_workers=args.num_workers,
                                         pin_memory=torch.cuda.is_available(),
                                         persistent_workers=False,
                                         generator=torch.Generator().manual_seed(args.seed))
    return iter(loader)


class ExitRequest:
    """Decides, identically on every rank, whether to stop after the current iteration:
    ``--exit-signal-handler`` (SIGTERM/SIGINT received by any rank) or ``--exit-duration-in-mins``."""

    def __init__(self, args):
        self.signal_received = False
        self.deadline = None
        self.reason = ""
        if args.exit_duration_in_mins is not None:
            self.deadline = time.time() + 60.0 * args.exit_duration_in_mins
        if args.exit_signal_handler:
            import signal

            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, self._on_signal)
        self.enabled = args.exit_signal_handler or self.deadline is not None

    def _on_signal(self, signum, frame):
        self.signal_received = True

    def should_exit(self) -> bool:
        """True on every rank when any rank saw a signal or the time limit has passed."""
        if not self.enabled:
            return False
        flags = all_reduce_small(
            torch.tensor([float(self.signal_received),
                          float(self.deadline is not None and time.time() >= self.deadline)]),
            torch.distributed.ReduceOp.MAX)
        if flags[0] > 0:
            self.reason = "exit signal received (--exit-signal-handler)"
        elif flags[1] > 0:
            self.reason = "time limit reached (--exit-duration-in-mins)"
        return bool(flags.max() > 0)


def _data_parallel_group():
    """The group loss sums are reduced over: each data-parallel replica once (the tensor-parallel
    ranks of a replica hold the same loss)."""
    from megatron.core import parallel_state

    return parallel_state.get_data_parallel_group()


class _IntervalStats:
    """Losses accumulated between two log lines (summed locally, reduced across ranks at log time)."""

    def __init__(self, num_datasets: int):
        self.num_datasets = num_datasets
        self.reset()

    def reset(self) -> None:
        # Sums live on the device of the losses (allocated at the first micro batch), so adding a
        # micro batch never waits for the GPU; they come to the CPU once per log interval.
        self.loss_sum = None
        self.dataset_loss = None
        self.dataset_count = None
        self.micro_batches = 0
        self.iterations = 0
        self.start = time.perf_counter()
        self.samples = 0

    def add_micro_batch(self, loss: torch.Tensor, per_sample: torch.Tensor,
                        dataset_id: Optional[torch.Tensor]) -> None:
        device = loss.device
        if self.loss_sum is None:
            size = max(self.num_datasets, 1)
            self.loss_sum = torch.zeros(1, dtype=torch.float64, device=device)
            self.dataset_loss = torch.zeros(size, dtype=torch.float64, device=device)
            self.dataset_count = torch.zeros(size, dtype=torch.float64, device=device)
        self.loss_sum += loss.detach().double()
        self.micro_batches += 1
        if dataset_id is None and self.num_datasets == 1:
            dataset_id = torch.zeros(per_sample.numel(), dtype=torch.long)
        if dataset_id is not None and self.num_datasets:
            ids = dataset_id.long().view(-1).to(device, non_blocking=True)
            self.dataset_loss.index_add_(0, ids, per_sample.double())
            self.dataset_count.index_add_(0, ids, torch.ones_like(ids, dtype=torch.float64))

    def reduced(self) -> Tuple[float, torch.Tensor, torch.Tensor]:
        size = max(self.num_datasets, 1)
        zeros = torch.zeros(size, dtype=torch.float64)
        local = torch.cat([
            self.loss_sum.cpu() if self.loss_sum is not None else torch.zeros(1, dtype=torch.float64),
            torch.tensor([float(self.micro_batches)], dtype=torch.float64),
            self.dataset_loss.cpu() if self.dataset_loss is not None else zeros,
            self.dataset_count.cpu() if self.dataset_count is not None else zeros])
        packed = all_reduce_small(local, group=_data_parallel_group())
        loss = (packed[0] / packed[1].clamp(min=1)).item()
        return loss, packed[2:2 + size], packed[2 + size:]


def evaluate(engine, args, group: EvalGroup, forward_step: Callable, evaluation_index: int) -> float:
    """Mean loss over ``--eval-iters`` global batches of ``group``; evaluation number
    ``evaluation_index`` reads samples ``[k * eval_iters * gbs, (k+1) * eval_iters * gbs)`` (wrapping
    around the set), so a resumed run evaluates exactly what an uninterrupted one would."""
    samples_per_eval = args.eval_iters * args.global_batch_size
    length = len(group.dataset)
    usable = length - length % (args.micro_batch_size * args.data_parallel_size)
    start = (evaluation_index * samples_per_eval) % max(usable, 1)
    micro_per_eval = samples_per_eval // (args.micro_batch_size * args.data_parallel_size)
    engine.eval()
    loss_sum, count = None, 0
    with torch.no_grad():
        iterator = _loader(group.dataset, start, args, total=usable)
        for _ in range(micro_per_eval):
            try:
                batch = next(iterator)
            except StopIteration:  # wrap around a set smaller than one evaluation
                iterator = _loader(group.dataset, 0, args, total=usable)
                batch = next(iterator)
            loss, _ = forward_step(engine, batch)
            loss_sum = loss.detach().double() if loss_sum is None else loss_sum + loss.detach().double()
            count += 1
    engine.train()
    total = all_reduce_small(torch.stack([loss_sum.cpu(), torch.tensor(float(count), dtype=torch.float64)]),
                             group=_data_parallel_group())
    return (total[0] / total[1]).item()


def _evaluate_all(engine, args, groups: Sequence[EvalGroup], forward_step, iteration: int,
                  metrics: MetricsWriter, split: str = "valid") -> Dict[str, float]:
    results = {}
    # Periodic evaluation j (at iteration j * eval_interval) reads window j-1; a final evaluation at
    # an iteration between two periodic ones reads the next window. Windows never repeat in a run.
    evaluation_index = max(-(-iteration // args.eval_interval) - 1, 0)
    for group in groups:
        if group.split != split:
            continue
        loss = evaluate(engine, args, group, forward_step, evaluation_index)
        results[group.name] = loss
        print_rank_0(f" {split} {group.name} | iteration {iteration} | lm loss: {loss:.6E} | "
                     f"ppl: {perplexity(loss):.6E}")
        metrics.eval_record({"iteration": iteration, "split": split, "group": group.name,
                             "lm_loss": loss, "ppl": perplexity(loss)})
    return results


def setup_model_and_optimizer(args, model_provider: Callable, initial_batch: int):
    """Model, torch optimizer, DeepSpeed engine and the LR/WD scheduler on the engine's groups."""
    import deepspeed
    from megatron.core import parallel_state
    from megatron.parallel.grads import install_sequence_parallel_grad_allreduce
    from megatron.parallel.topology import MegatronCoreMPU

    model = model_provider(args)
    if args.sequence_parallel:
        install_sequence_parallel_grad_allreduce(model, parallel_state.get_tensor_model_parallel_group())
    optimizer = build_optimizer(args, model)
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config_from_args(args, initial_batch),
        mpu=MegatronCoreMPU(), dist_init_required=False)
    scheduler = build_opt_param_scheduler(args, ds_optimizer)
    return engine, ds_optimizer, scheduler


def _maybe_save(engine, args, state: TrainingState, scheduler) -> None:
    if not args.save:
        return
    state.extra["opt_param_scheduler"] = scheduler.state_dict()
    directory = save_checkpoint(engine, args.save, state)
    print_rank_0(f"saved checkpoint {directory}")


def _restore(engine, args, scheduler) -> TrainingState:
    if not args.load:
        return TrainingState()
    state = load_checkpoint(engine, args.load, finetune=args.finetune,
                            load_optimizer=not args.no_load_optim, load_rng=not args.no_load_rng)
    if state is None:
        print_rank_0(f"no checkpoint in --load {args.load}; starting from scratch")
        return TrainingState()
    if args.finetune:
        import os

        from megatron.checkpointing import checkpoint_tag, read_tracker

        loaded = read_tracker(args.load)  # the iteration load_checkpoint just loaded
        print_rank_0(f"--finetune: loaded the model weights of "
                     f"{os.path.join(args.load, checkpoint_tag(loaded))} (iteration {loaded} of "
                     f"--load {args.load}); iteration, consumed samples, optimizer state, "
                     "learning-rate/weight-decay scheduler and RNG start fresh (iteration 0)")
        return state
    if "opt_param_scheduler" in state.extra and not args.finetune:
        scheduler.load_state_dict(state.extra["opt_param_scheduler"])
    print_rank_0(f"resumed from --load {args.load} at iteration {state.iteration}, "
                 f"consumed samples {state.consumed_samples}")
    return state


def _log_iteration(args, metrics, stats: _IntervalStats, state: TrainingState, lr: float, wd: float,
                   grad_norm: Optional[float], dataset_names: List[str], batch_size: int) -> None:
    loss, dataset_loss, dataset_count = stats.reduced()
    elapsed = time.perf_counter() - stats.start
    ms_per_iter = 1000.0 * elapsed / max(stats.iterations, 1)
    tokens_per_s = stats.samples * args.seq_length / max(elapsed, 1e-9)
    per_dataset = {name: (dataset_loss[i] / dataset_count[i]).item()
                   for i, name in enumerate(dataset_names) if dataset_count[i] > 0}
    line = (f" iteration {state.iteration:8d}/{args.train_iters:8d} | consumed samples: "
            f"{state.consumed_samples:12d} | elapsed time per iteration (ms): {ms_per_iter:.1f} | "
            f"tokens/s: {tokens_per_s:.1f} | global batch size: {batch_size:5d} | learning rate: "
            f"{lr:.6E} | lm loss: {loss:.6E} | grad norm: "
            f"{'n/a' if grad_norm is None else f'{grad_norm:.3f}'}")
    if per_dataset:
        line += " | " + " | ".join(f"{k} loss: {v:.4f}" for k, v in per_dataset.items())
    print_rank_0(line)
    metrics.train_record({
        "iteration": state.iteration, "consumed_samples": state.consumed_samples,
        "consumed_tokens": state.consumed_samples * args.seq_length, "lr": lr, "weight_decay": wd,
        "lm_loss": loss, "grad_norm": grad_norm, "per_dataset_loss": per_dataset,
        "tokens_per_second": tokens_per_s, "ms_per_iteration": ms_per_iter,
        "global_batch_size": batch_size})


def _unclipped_grad_norm(engine) -> Optional[float]:
    """L2 norm of the whole model's (data-parallel averaged) gradient before clipping. ZeRO stages
    keep it in the engine; at stage 0 DeepSpeed does not, so it is computed from the module's
    gradients, which hold the averaged values between the boundary backward and the optimizer
    step: each tensor-parallel shard once, summed over the model-parallel group."""
    from megatron.parallel.grads import global_grad_norm

    if engine.zero_optimization_stage() > 0:
        return None
    if not any(p.grad is not None for p in engine.module.parameters()):
        return None
    norm = global_grad_norm(engine.module.parameters(), engine.mpu)
    if engine.fp16_enabled() and hasattr(engine.optimizer, "cur_scale"):
        norm /= float(engine.optimizer.cur_scale)
    return norm


def _grad_norm(engine, stage0_norm: Optional[float]) -> Optional[float]:
    norm = engine.get_global_grad_norm()
    if norm is None:
        norm = stage0_norm
    if norm is None:
        return None
    norm = float(norm.item() if torch.is_tensor(norm) else norm)
    return norm if math.isfinite(norm) else None


def train(args, engine, optimizer, scheduler, data: TrainData, forward_step: Callable,
          state: TrainingState, metrics: MetricsWriter, batch_schedule: BatchSchedule) -> bool:
    """Run iterations ``state.iteration + 1 .. --train-iters`` (updating ``state`` in place);
    returns True when ``--exit-interval`` stopped the run early."""
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
        stage0_norm = None
        for micro in range(num_micro_batches):
            batch = next(iterator)
            loss, per_sample = forward_step(engine, batch)
            engine.backward(loss)
            if logging_now and micro == num_micro_batches - 1:
                stage0_norm = _unclipped_grad_norm(engine)
            engine.step()
            stats.add_micro_batch(loss, per_sample, batch.get("dataset_id"))
        state.iteration += 1
        state.consumed_samples += batch_size
        scheduler.step(increment=batch_size)
        stats.iterations += 1
        stats.samples += batch_size
        if state.iteration % args.log_interval == 0:
            _log_iteration(args, metrics, stats, state, lr, wd, _grad_norm(engine, stage0_norm),
                           data.dataset_names, batch_size)
            stats.reset()
        paused = time.perf_counter()  # evaluation and saving stay out of the per-iteration time
        if args.eval_iters and data.eval_groups and state.iteration % args.eval_interval == 0:
            _evaluate_all(engine, args, data.eval_groups, forward_step, state.iteration, metrics)
        if args.save_interval and state.iteration % args.save_interval == 0:
            _maybe_save(engine, args, state, scheduler)
        stats.start += time.perf_counter() - paused
        reason = None
        if args.exit_interval and state.iteration % args.exit_interval == 0:
            reason = f"--exit-interval {args.exit_interval}"
        elif exit_request.should_exit():
            reason = exit_request.reason
        if reason is not None:
            if not (args.save_interval and state.iteration % args.save_interval == 0):
                _maybe_save(engine, args, state, scheduler)
            print_rank_0(f"exiting at iteration {state.iteration}: {reason}")
            return True
    return False


def pretrain(args, datasets_provider: Callable, model_provider: Callable,
             forward_step: Callable = gpt_forward_step) -> TrainingState:
    """Set up distributed state, model, engine, scheduler and data, restore ``--load``, train to
    ``--train-iters``, evaluate every group, save, and return the final training state.

    ``datasets_provider(args) -> TrainData``; ``model_provider(args) -> torch.nn.Module``.
    """
    initialize_distributed(args)
    set_seeds(args.seed)
    batch_schedule = batch_schedule_from_args(args)
    args.train_iters = train_iterations_from_args(args, batch_schedule)
    data = datasets_provider(args)
    rank0 = torch.distributed.get_rank() == 0
    metrics = MetricsWriter(args.metrics_jsonl, args.tensorboard_dir, enabled=rank0)
    engine, optimizer, scheduler = setup_model_and_optimizer(
        args, model_provider, batch_schedule.batch_size_at_samples(0))
    state = _restore(engine, args, scheduler)
    print_rank_0(f"training: {args.train_iters} iterations, global batch {args.global_batch_size}, "
                 f"micro batch {args.micro_batch_size} | {layout_line(args, engine)}")
    start_iteration = state.iteration
    exited_early = False
    if not args.skip_train and state.iteration < args.train_iters:
        exited_early = train(args, engine, optimizer, scheduler, data, forward_step, state, metrics,
                             batch_schedule)
        if args.save and state.iteration > start_iteration and not exited_early \
                and not (args.save_interval and state.iteration % args.save_interval == 0):
            _maybe_save(engine, args, state, scheduler)
    if not exited_early and args.eval_iters:
        if state.iteration % args.eval_interval != 0 or args.skip_train or state.iteration == start_iteration:
            _evaluate_all(engine, args, data.eval_groups, forward_step, state.iteration, metrics)
        _evaluate_all(engine, args, data.eval_groups, forward_step, state.iteration, metrics,
                      split="test")
    metrics.close()
    return state
