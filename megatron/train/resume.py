"""Checkpoints of the loop: saving, restoring ``--load`` (``--finetune``, ``--reset-progress``) and
the data ledger a resumed run's data continues."""
from typing import Callable, Optional

from megatron.checkpoint.engine import TrainingState, load_checkpoint, save_checkpoint
from megatron.data.train_data import TrainData
from megatron.utils.rank_utils import print_rank_0


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
