"""The training loop on a DeepSpeed engine: schedule, evaluation per validation group, logging,
checkpoints and exact resume.

Progress is counted in iterations (optimizer steps over one global batch) and consumed samples; the
learning-rate scheduler is advanced by the samples of each iteration (Megatron-LM's convention).
"""
import time
from typing import Callable, List, Optional, Sequence

import torch

from megatron.checkpoint.engine import TrainingState
from megatron.checkpoint.multinode import check_checkpoint_dirs
from megatron.config.checkpoint_args import model_args_from_args
from megatron.config.context_stages import stage_args
from megatron.config.run_config import LoopConfig, RunConfig
from megatron.data.train_data import TrainData
from megatron.metrics.moe import moe_training
from megatron.metrics.writers import MetricsWriter, metrics_writer
from megatron.model.attention_backends import check_backend_trains
from megatron.optim.loss_normalization import normalization_line
from megatron.parallel.initialize import initialize_distributed, set_seeds
from megatron.parallel.pipe import is_pipe_engine
from megatron.parallel.topology import layout_line
from megatron.schedules.units import batch_schedule
from megatron.train.context_stages import check_stages_data, enter_stage
from megatron.train.engine_setup import loss_normalizer, setup_model_and_optimizer
from megatron.train.evaluation import _evaluate_all
from megatron.train.exit_request import ExitRequest
from megatron.train.hooks import LoopHook, loop_hooks
from megatron.train.loader import _loader
from megatron.train.mixer import TeeStats, loop_mixer
from megatron.train.mixer_loader import MixerLoader
from megatron.train.resume import _check_data_resume, _maybe_save, _restore, data_resume
from megatron.train.run_control import kill_switch_found
from megatron.train.seqlen_batches import SeqLengthBatches
from megatron.train.stats import _IntervalStats, _log_iteration
from megatron.train.steps import StepFunctions, _grad_norm, gpt_forward_step, step_functions
from megatron.utils.rank_utils import all_reduce_small, print_rank_0


def train(run: RunConfig, engine, optimizer, scheduler, data: TrainData, steps: StepFunctions,
          state: TrainingState, metrics: MetricsWriter, model_args: dict,
          after_checkpoint_files_written: Optional[Callable[[int], None]] = None,
          hooks: Sequence[LoopHook] = (), end: Optional[int] = None,
          tokens_at: Optional[Callable[[int], int]] = None,
          exit_request: Optional[ExitRequest] = None) -> bool:
    """Run iterations ``state.iteration + 1 .. --train-iters`` (up to ``end`` when given: a
    context stage's last; updating ``state`` in place) with ``steps`` (:func:`step_functions`);
    returns True when ``--exit-interval`` stopped the run early. ``run``: the typed configs
    (megatron/config/run_config.py); ``model_args``: the model flags each checkpoint records;
    ``after_checkpoint_files_written``: see :func:`pretrain`; ``hooks``: what features add to
    each iteration (megatron/train/hooks.py: MoE bookkeeping, skipped steps); ``tokens_at``:
    the tokens trained in the run's first N samples (default the batch schedule's; context
    stages count each stage's samples at its length); ``exit_request``: the run's, when it
    trains in several calls (default a new one: its time limit counts from now)."""
    loop, checkpoint, schedule = run.loop, run.checkpoint, batch_schedule(run.batch)
    per_step = loop.micro_batch_size * loop.data_parallel_size
    stats = _IntervalStats(len(data.dataset_names))
    exit_request = exit_request or ExitRequest(loop)
    plan, trained_length = schedule.seq_plan, loop.seq_length
    mixer = loop_mixer(data, state.iteration, state.consumed_samples)  # the blend's, or None
    # a sampling mixer's loader workers follow its updates (without workers: a fresh loader at
    # each update, which costs nothing to start or stop)
    follower = (MixerLoader(data.mix, mixer.config, loop) if mixer is not None
                and not mixer.on_loss_weights and loop.num_workers > 0 else None)
    loader = (follower.segment(state.consumed_samples, state.iteration) if follower is not None
              else _loader(data.train, state.consumed_samples, loop))
    # the sequence-length curriculum cuts each micro batch
    iterator = SeqLengthBatches(loader, plan) if plan is not None else loader
    if mixer is not None:  # each micro batch's per-dataset losses also go to the mixer's sums
        step_stats = TeeStats(stats, mixer.pending)
        # target loss_weight: those of the checkpoint (set again only when an update changes them)
        applied_weights = _apply_mixer_loss_weights(mixer, steps)
    else:
        step_stats, applied_weights = stats, None

    def save() -> None:
        if mixer is not None:  # the interval's sums so far go into the data record (every rank)
            mixer.fold()
        _maybe_save(engine, checkpoint, model_args, state, scheduler,
                    after_checkpoint_files_written, data)

    tokens_at = tokens_at or schedule.tokens
    trained_tokens = tokens_at(state.consumed_samples)
    stop = loop.train_iters if end is None else min(int(end), loop.train_iters)
    engine.train()
    while state.iteration < stop:
        batch_size = schedule.batch_size_at_samples(state.consumed_samples)
        if batch_size != engine.train_batch_size():
            engine.set_train_batch_size(batch_size)
        if plan is not None:
            length = iterator.start_iteration(state.iteration)
            if length != trained_length and is_pipe_engine(engine):
                engine.reset_activation_shape()  # the pipe's buffers are sized by the first batch
            trained_length = length
        lr = optimizer.param_groups[0]["lr"]
        wd = optimizer.param_groups[0]["weight_decay"]
        num_micro_batches = batch_size // per_step
        logging_now = (state.iteration + 1) % loop.log_interval == 0
        for hook in hooks:  # e.g. MoE: the aux losses' gradient scale follows GAS and loss scale
            hook.begin_iteration(engine)
        stage0_norm = steps.train_step(engine, iterator, num_micro_batches, step_stats, logging_now)
        state.iteration += 1
        for hook in hooks:  # a skipped step still consumes its data and advances the LR
            hook.end_iteration(state.iteration)
            hook.save_state(state)  # e.g. the skip window, in every checkpoint's training state
        state.consumed_samples += batch_size
        scheduler.step(increment=batch_size)
        if mixer is not None and mixer.end_iteration(state.iteration, state.consumed_samples):
            # the next weights' phase begins at the first sample not trained on, which no
            # batch read so far is past
            data.train = data.mix.dataset
            loader = (follower.segment(state.consumed_samples, state.iteration)
                      if follower is not None else _loader(data.train, state.consumed_samples, loop))
            iterator = SeqLengthBatches(loader, plan) if plan is not None else loader
        if mixer is not None and mixer.loss_weights is not applied_weights:
            # target loss_weight: an update's loss weights, from the next iteration
            applied_weights = _apply_mixer_loss_weights(mixer, steps)
        stats.iterations += 1
        stats.samples += batch_size
        tokens_before, trained_tokens = trained_tokens, tokens_at(state.consumed_samples)
        stats.tokens += trained_tokens - tokens_before
        if state.iteration % loop.log_interval == 0:
            _log_iteration(loop, metrics, stats, state, lr, wd, _grad_norm(engine, stage0_norm),
                           data.dataset_names, batch_size, trained_length, trained_tokens, hooks,
                           data.mix if metrics.enabled else None)
            stats.reset()
        paused = time.perf_counter()  # evaluation and saving stay out of the per-iteration time
        if loop.eval_iters and data.eval_groups and state.iteration % loop.eval_interval == 0:
            _evaluate_all(engine, loop, data.eval_groups, steps, state.iteration, metrics)
        if loop.save_interval and state.iteration % loop.save_interval == 0:
            save()
        stats.start += time.perf_counter() - paused
        reason = None
        if loop.exit_interval and state.iteration % loop.exit_interval == 0:
            reason = f"--exit-interval {loop.exit_interval}"
        elif state.iteration in (loop.phase_transition_iterations or ()):
            reason = (f"--phase-transition-iterations: a phase ends at iteration "
                      f"{state.iteration}; relaunch with the next phase's data mix (and "
                      "--override-data-mix) to continue")
        elif exit_request.should_exit():
            reason = exit_request.reason
        if reason is not None:
            if not (loop.save_interval and state.iteration % loop.save_interval == 0):
                save()
            print_rank_0(f"exiting at iteration {state.iteration}: {reason}")
            if follower is not None:
                follower.close()
            return True
    if mixer is not None:  # for the save after the loop (pretrain's), in the data record
        mixer.fold()
    if follower is not None:  # its workers stop
        follower.close()
    return False


def _apply_mixer_loss_weights(mixer, steps: StepFunctions) -> Optional[List[float]]:
    """Weigh the next iterations' tokens by the loss weights an adaptive mixer with ``target:
    loss_weight`` has in force (megatron/train/mixer.py); nothing for a sampling mixer. Returns
    ``mixer.loss_weights`` (the list just set, or None), which the loop compares by identity to
    set them again only after an update replaced them."""
    if mixer.on_loss_weights and mixer.loss_weights is not None:
        steps.normalizer.set_loss_weights(mixer.objective_weights())
    return mixer.loss_weights


def _kill_switch_at_start(loop: LoopConfig) -> bool:
    """True on every rank when any rank finds the ``--kill-switch-path`` file before the run
    starts (BigScience: a queued job whose kill switch is set exits at once, building nothing)."""
    if loop.kill_switch_path is None:
        return False
    found = all_reduce_small(torch.tensor([float(kill_switch_found(loop.kill_switch_path))]),
                             torch.distributed.ReduceOp.MAX)
    if found.item() > 0:
        print_rank_0(f"kill switch {loop.kill_switch_path} found (--kill-switch-path) at start-up: "
                     "exiting without training")
        return True
    return False


def pretrain(args, datasets_provider: Callable, model_provider: Callable,
             forward_step: Callable = gpt_forward_step,
             after_checkpoint_files_written: Optional[Callable[[int], None]] = None,
             notes: Sequence[str] = ()) -> TrainingState:
    """Set up distributed state, model, engine, scheduler and data, restore ``--load``, train to
    ``--train-iters``, evaluate every group, save, and return the final training state.

    ``args``: the validated flags, with their typed configs (``args.run_config``,
    megatron/config/run_config.py) and what the entry point derived (the tokenizer). Everything
    here takes the typed configs but for what still reads the flags (issue 42): the model and
    data providers, distributed start-up, the attention backend's check, the layout line, the MoE
    hook, the metrics' record of the flags and the model flags each checkpoint records
    (megatron/config/checkpoint_args.py, the ``model_args.json`` format);
    ``datasets_provider(args, resume) -> TrainData`` (``resume``: :func:`data_resume`, the data
    ledger of the checkpoint a resumed run continues, or None);
    ``model_provider(args) -> torch.nn.Module``.
    ``after_checkpoint_files_written(iteration)`` runs on every rank once its files of a
    checkpoint are written, before the tracker names it (a test's fault injection).
    ``notes``: the entry point's start-up lines (the tokenizer's), printed after validation's.
    """
    run = args.run_config
    loop, checkpoint = run.loop, run.checkpoint
    check_backend_trains(run.model.attention)  # before start-up: FlexAttention has no backward on a CPU
    start_notes = initialize_distributed(run.model.layout, run.distributed.distributed_backend,
                                         run.distributed.distributed_timeout_minutes)
    # flag compatibility, --deepspeed_config, the tokenizer's, distributed start-up's
    for note in run.notes + tuple(notes) + tuple(start_notes):
        print_rank_0(note)
    if _kill_switch_at_start(loop):
        return TrainingState()
    # a --save some node cannot see, ranks that would resume different iterations: one line now
    check_checkpoint_dirs(checkpoint.save, checkpoint.load)
    set_seeds(loop.seed)
    resume = data_resume(checkpoint, loop.skip_train)  # the data ledger, before any dataset
    # context stages in one run (megatron/config/context_stages.py): the run is built at the
    # stage that wrote the checkpoint it resumes (the flags' from scratch), as that launch was
    flags, stages, stage = args, getattr(args, "context_stages", None), None
    if stages is not None:
        stage = stages.recorded_at(resume.iteration if resume is not None else 0)
        args = stage_args(flags, stage)
        run, loop = args.run_config, args.run_config.loop
    data = datasets_provider(args, resume)
    rank0 = torch.distributed.get_rank() == 0
    metrics = metrics_writer(run.metrics, enabled=rank0, run_flags=vars(flags))  # jsonl, TB, W&B
    engine, optimizer, scheduler = setup_model_and_optimizer(
        run, model_provider(args), batch_schedule(run.batch).batch_size_at_samples(0))
    state = _restore(engine, checkpoint, scheduler)
    _check_data_resume(resume, state)
    if stages is not None and not loop.skip_train:
        check_stages_data(stages, data, state.consumed_samples)
    if checkpoint.load and not loop.skip_train and state.iteration >= loop.train_iters > 0:
        # A resume at the end of training: no step, no evaluation, no duplicate metrics records.
        print_rank_0(f"nothing to train: the checkpoint in --load {checkpoint.load} is at "
                     f"iteration {state.iteration} and --train-iters is {loop.train_iters}; to "
                     f"train on, raise --train-iters (with --override-opt_param-scheduler so the "
                     f"LR schedule follows the new length)")
        metrics.close()
        return state
    layout = layout_line(run.model.layout, engine.zero_optimization_stage(),
                         args.gradient_accumulation_steps, run.transformer)
    print_rank_0(f"training: {loop.train_iters} iterations, global batch {loop.global_batch_size}, "
                 f"micro batch {loop.micro_batch_size} | {layout}")
    if loop.train_tokens_note:
        print_rank_0(loop.train_tokens_note)
    if loop.skip_train:
        print_rank_0(f"--eval-only/--skip-train: evaluating the model of iteration "
                     f"{state.iteration} on the validation and test sets, no training")
    # MoE bookkeeping, skip-step: as the flags ask
    hooks = loop_hooks(engine, moe_training(engine.module, run.model.moe), run.skip_step, run.loss)
    for hook in hooks:
        hook.restore_state(state)
        forward_step = hook.wrap_forward_step(forward_step)
    normalizer = loss_normalizer(run.loss, data, loop.data_parallel_size)
    print_rank_0(normalization_line(normalizer.mode, normalizer.packed))
    steps = step_functions(engine, forward_step, normalizer)
    start_iteration = state.iteration
    exited_early = False
    model_args = model_args_from_args(args)  # recorded in every checkpoint
    exit_request = None  # one for all stages: signals and the time limit
    while not loop.skip_train and state.iteration < loop.train_iters and not exited_early:
        exit_request = exit_request or ExitRequest(loop)
        if stages is not None and stages.at(state.iteration).index != stage.index:
            # the next context stage, in process, as a resume with its flags would start it
            stage = stages.at(state.iteration)
            args, data, scheduler = enter_stage(flags, stage, engine, optimizer, scheduler, data,
                                                state, datasets_provider)
            run, loop = args.run_config, args.run_config.loop
            steps = step_functions(engine, forward_step,
                                   loss_normalizer(run.loss, data, loop.data_parallel_size))
            model_args = model_args_from_args(args)
        exited_early = train(run, engine, optimizer, scheduler, data, steps, state, metrics,
                             model_args, after_checkpoint_files_written, hooks,
                             end=stages.end(stage, loop.train_iters) if stages else None,
                             tokens_at=stages.tokens if stages else None,
                             exit_request=exit_request)
    if checkpoint.save and state.iteration > start_iteration and not exited_early \
            and not (loop.save_interval and state.iteration % loop.save_interval == 0):
        _maybe_save(engine, checkpoint, model_args, state, scheduler,
                    after_checkpoint_files_written, data)
    if not exited_early and loop.eval_iters:
        if state.iteration % loop.eval_interval != 0 or loop.skip_train \
                or state.iteration == start_iteration:
            _evaluate_all(engine, loop, data.eval_groups, steps, state.iteration, metrics)
        _evaluate_all(engine, loop, data.eval_groups, steps, state.iteration, metrics,
                      split="test")
    metrics.close()
    return state
