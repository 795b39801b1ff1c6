"""The training loop on a DeepSpeed engine: schedule, evaluation per validation group, logging,
checkpoints and exact resume.

Progress is counted in iterations (optimizer steps over one global batch) and consumed samples; the
learning-rate scheduler is advanced by the samples of each iteration (Megatron-LM's convention).
"""
import time
from typing import Callable, Optional, Sequence

import torch

from megatron.checkpoint.engine import TrainingState
from megatron.data.train_data import TrainData
from megatron.metrics.writers import MetricsWriter, metrics_writer_from_args
from megatron.model.attention_backends import check_backend_trains
from megatron.optim.loss_normalization import normalization_line
from megatron.parallel.topology import layout_line
from megatron.runtime.initialize import initialize_distributed, set_seeds
from megatron.schedules.units import BatchSchedule, batch_schedule_from_args
from megatron.train.engine_setup import loss_normalizer_from_args, setup_model_and_optimizer
from megatron.train.evaluation import _evaluate_all
from megatron.train.exit_request import ExitRequest
from megatron.train.hooks import LoopHook, loop_hooks_from_args
from megatron.train.loader import _loader
from megatron.train.resume import _check_data_resume, _maybe_save, _restore, data_resume_from_args
from megatron.train.stats import _IntervalStats, _log_iteration
from megatron.train.steps import StepFunctions, _grad_norm, gpt_forward_step, step_functions
from megatron.utils.rank_utils import all_reduce_small, print_rank_0


def train(args, engine, optimizer, scheduler, data: TrainData, steps: StepFunctions,
          state: TrainingState, metrics: MetricsWriter, batch_schedule: BatchSchedule,
          after_checkpoint_files_written: Optional[Callable[[int], None]] = None,
          hooks: Sequence[LoopHook] = ()) -> bool:
    """Run iterations ``state.iteration + 1 .. --train-iters`` (updating ``state`` in place) with
    ``steps`` (:func:`step_functions`); returns True when ``--exit-interval`` stopped the run
    early. ``after_checkpoint_files_written``: see :func:`pretrain`. ``hooks``: what features add
    to each iteration (megatron/train/hooks.py: MoE bookkeeping, skipped steps)."""
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
        for hook in hooks:  # e.g. MoE: the aux losses' gradient scale follows GAS and loss scale
            hook.begin_iteration(engine)
        stage0_norm = steps.train_step(engine, iterator, num_micro_batches, stats, logging_now)
        state.iteration += 1
        for hook in hooks:  # a skipped step still consumes its data and advances the LR
            hook.end_iteration(state.iteration)
            hook.save_state(state)  # e.g. the skip window, in every checkpoint's training state
        state.consumed_samples += batch_size
        scheduler.step(increment=batch_size)
        stats.iterations += 1
        stats.samples += batch_size
        if state.iteration % args.log_interval == 0:
            _log_iteration(args, metrics, stats, state, lr, wd, _grad_norm(engine, stage0_norm),
                           data.dataset_names, batch_size, hooks,
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


def _kill_switch_at_start(args) -> bool:
    """True on every rank when any rank finds the ``--kill-switch-path`` file before the run
    starts (BigScience: a queued job whose kill switch is set exits at once, building nothing)."""
    from megatron.train.run_control import kill_switch_found

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
    hooks = loop_hooks_from_args(args, engine)  # MoE bookkeeping, skip-step: as the flags ask
    for hook in hooks:
        hook.restore_state(state)
        forward_step = hook.wrap_forward_step(forward_step)
    normalizer = loss_normalizer_from_args(args, data)
    print_rank_0(normalization_line(normalizer.mode, normalizer.packed))
    steps = step_functions(engine, forward_step, normalizer)
    start_iteration = state.iteration
    exited_early = False
    if not args.skip_train and state.iteration < args.train_iters:
        exited_early = train(args, engine, optimizer, scheduler, data, steps, state, metrics,
                             batch_schedule, after_checkpoint_files_written, hooks)
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
