"""Checkpoints of the loop: saving, restoring ``--load`` (``--finetune``, ``--reset-progress``) and
the data ledger a resumed run's data continues."""
from typing import Callable, Optional

from megatron.checkpoint.engine import TrainingState, load_checkpoint, save_checkpoint
from megatron.checkpoint.format import checkpoint_tag, read_data_mix, read_tracker
from megatron.config.run_config import CheckpointConfig
from megatron.data.mix_ledger import MixRecord
from megatron.data.mix_resume import DataResume
from megatron.data.train_data import TrainData
from megatron.errors import CheckpointError
from megatron.utils.rank_utils import print_rank_0


def _maybe_save(engine, checkpoint: CheckpointConfig, model_args: dict, state: TrainingState,
                scheduler, after_files_written: Optional[Callable[[int], None]] = None,
                data: Optional[TrainData] = None) -> None:
    """Save a checkpoint of ``state`` into ``--save`` (nothing without it), with the recorded
    model flags ``model_args`` (megatron/checkpoint/model_args.py), the LR/WD scheduler's state
    and the data ledger of ``data``."""
    if not checkpoint.save:
        return
    state.extra["opt_param_scheduler"] = scheduler.state_dict()
    mix = data.mix if data is not None else None  # the data ledger: data_mix.json
    record = mix.record(state.iteration, state.consumed_samples).to_json() if mix else None
    directory = save_checkpoint(engine, checkpoint.save, state, model_args,
                                after_files_written=after_files_written, data_mix=record)
    print_rank_0(f"saved checkpoint {directory}")


def data_resume(checkpoint: CheckpointConfig, evaluate_only: bool):
    """The checkpoint a resumed run's data continues (megatron/data/mix_resume.py
    ``DataResume``: its data ledger, read from ``data_mix.json`` before any dataset is built), or
    None: no ``--load``, no checkpoint there yet, or ``--finetune``/``--reset-progress`` (whose
    data starts at sample 0). ``evaluate_only``: ``--skip-train``/``--eval-only``."""
    import os

    if not checkpoint.load or checkpoint.finetune or checkpoint.reset_progress:
        return None
    iteration = read_tracker(checkpoint.load)
    if iteration is None:
        return None
    directory = os.path.join(checkpoint.load, checkpoint_tag(iteration))
    record = read_data_mix(directory) if os.path.isdir(directory) else None
    if record is not None:
        record = MixRecord.from_json(record, os.path.join(directory, "data_mix.json"))
    return DataResume(checkpoint.load, iteration, record, override=checkpoint.override_data_mix,
                      evaluate_only=evaluate_only)


def _restore(engine, checkpoint: CheckpointConfig, scheduler) -> TrainingState:
    """The training state of ``--load`` restored into ``engine`` and ``scheduler`` as the
    checkpoint flags say (a fresh state without a checkpoint)."""
    if not checkpoint.load:
        return TrainingState()
    state = load_checkpoint(engine, checkpoint.load, finetune=checkpoint.finetune,
                            load_optimizer=not checkpoint.no_load_optim, load_rng=not checkpoint.no_load_rng,
                            universal=checkpoint.universal_checkpoint)
    if state is None:
        print_rank_0(f"no checkpoint in --load {checkpoint.load}; starting from scratch")
        return TrainingState()
    if checkpoint.finetune:
        import os

        loaded = read_tracker(checkpoint.load)  # the iteration load_checkpoint just loaded
        print_rank_0(f"--finetune: loaded the model weights of "
                     f"{os.path.join(checkpoint.load, checkpoint_tag(loaded))} (iteration {loaded} of "
                     f"--load {checkpoint.load}); iteration, consumed samples, optimizer state, "
                     "learning-rate/weight-decay scheduler and RNG start fresh (iteration 0)")
        return state
    if checkpoint.reset_progress:
        # The engine's own counters start over too, as after a fresh start; the optimizer state
        # just loaded brought the checkpoint's learning rates into the param groups: set the
        # fresh schedule's values at progress 0 again.
        engine.global_steps, engine.global_samples = 0, 0
        scheduler.step(0, iterations=0)
        loaded = "the model" if checkpoint.no_load_optim else "the model and optimizer state"
        print_rank_0(f"--reset-progress: loaded {loaded} of iteration "
                     f"{state.iteration} of --load {checkpoint.load}; iteration, consumed samples and "
                     "the learning-rate/weight-decay schedule (this run's flags) start at 0")
        return TrainingState()
    if "opt_param_scheduler" in state.extra and not checkpoint.finetune:
        scheduler.load_state_dict(state.extra["opt_param_scheduler"])
    print_rank_0(f"resumed from --load {checkpoint.load} at iteration {state.iteration}, "
                 f"consumed samples {state.consumed_samples}")
    return state


def _check_data_resume(resume, state: TrainingState) -> None:
    """The data ledger read before the datasets were built must be the loaded checkpoint's."""
    if resume is None or resume.record is None or state.iteration == 0:
        return
    record = resume.record
    if (record.iteration, record.consumed_samples) != (state.iteration, state.consumed_samples):
        raise CheckpointError(
            f"--load {resume.load_dir}: its data_mix.json is of iteration {record.iteration} "
            f"(consumed samples {record.consumed_samples}) but the checkpoint loaded is of "
            f"iteration {state.iteration} (consumed samples {state.consumed_samples}); was the "
            "directory written to during the start-up?")
