"""Context stages in one run (docs/context_extension.md#in-one-run; the stages:
megatron/config/context_stages.py): the switch at a stage's start, in process, along the path a
resume from the checkpoint of that iteration with the stage's flags and ``--extend-context``
takes.

* **Data**: the record a checkpoint of this iteration would hold (``TrainMix.record``, through
  JSON as the checkpoint's file) is continued by the datasets provider at the stage's flags, as
  a resume continues it (megatron/data/mix_resume.py: a new phase at the new sequence length,
  each dataset finishing its epoch in progress from the tokens it has not drawn); the
  evaluation groups are rebuilt at the new length.
* **Model**: its rotary embeddings rebuilt in place at the stage's encoding
  (megatron/model/rotary.py ``set_rotary_embeddings``).
* **Global batch**: the loop sets the engine's batch (gradient accumulation steps) from the
  stage's batch schedule, as it does for a step batch-size schedule.
* **LR/WD schedule**: the stage's scheduler (its run shape) continues the counters, as
  ``--override-opt_param-scheduler`` continues a checkpoint's.

The generator states are those before the switch (a resume restores the checkpoint's).
"""
import json
from typing import Callable, Tuple

from megatron.checkpoint.engine import TrainingState, rng_state, set_rng_state
from megatron.config.context_stages import ContextStage, ContextStages, stage_args
from megatron.data.mix_ledger import MixRecord
from megatron.data.mix_resume import DataResume, length_change_problem
from megatron.data.train_data import TrainData
from megatron.errors import ConfigError
from megatron.model.rotary import set_rotary_embeddings
from megatron.optim.learning_rates import OptimizerParamScheduler, build_opt_param_scheduler
from megatron.parallel.pipe import is_pipe_engine
from megatron.utils.rank_utils import print_rank_0


def check_stages_data(stages: ContextStages, data: TrainData, consumed_samples: int) -> None:
    """Refuse at start-up, in one line, training data that cannot continue at a later stage's
    sequence length (packed data, an epochized_blend stage): the switch would stop the run
    there."""
    if data.mix is None:
        raise ConfigError(f"{stages.where}: context stages need training data with a data ledger")
    mixer = data.mix.dataset.index.blend.mixer
    if mixer is not None and len(stages.stages) > 1:  # its weights are planned for one length
        raise ConfigError(f"{stages.where}: context stages with an adaptive mixer ({mixer.where}) "
                          "are not supported: its recorded weights are planned for one sequence "
                          "length; remove the mixer, or run each stage as its own launch with "
                          "--override-data-mix (the mixer restarts from the blend file)")
    for before, stage in zip(stages.stages, stages.stages[1:], strict=False):
        old, new = int(before.args.seq_length), int(stage.args.seq_length)
        begin = stages.samples_before(stage)
        if old == new or begin < consumed_samples:
            continue
        problem = length_change_problem(data.mix.sources, data.mix.dataset.index.blend, old, new,
                                        begin)
        if problem is not None:
            raise ConfigError(f"{stage.where} (from iteration {stage.start}): {problem}")


def in_run_resume(data: TrainData, state: TrainingState, stage: ContextStage,
                  override_data_mix: bool) -> DataResume:
    """The :class:`DataResume` of a checkpoint written now: the data ledger's record of
    ``state`` read back as the checkpoint's ``data_mix.json`` would be."""
    where = f"{stage.where} (from iteration {stage.start})"
    record = data.mix.record(state.iteration, state.consumed_samples).to_json()
    return DataResume(where, state.iteration,
                      MixRecord.from_json(json.loads(json.dumps(record)), where),
                      override=override_data_mix)


def enter_stage(args, stage: ContextStage, engine, optimizer, scheduler: OptimizerParamScheduler,
                data: TrainData, state: TrainingState,
                datasets_provider: Callable) -> Tuple[object, TrainData, OptimizerParamScheduler]:
    """Switch the run to ``stage`` after ``state.iteration`` iterations (module docstring):
    returns the stage's namespace (``args``: the run's validated flags with the entry point's
    additions), its training data and its LR/WD scheduler on ``optimizer``."""
    generators = rng_state()
    ns = stage_args(args, stage)
    run = ns.run_config
    print_rank_0(f"context stage {stage.index} ({stage.where}) from iteration {state.iteration} "
                 f"(global sample {state.consumed_samples}): {', '.join(stage.change)}")
    resume = in_run_resume(data, state, stage, run.checkpoint.override_data_mix)
    data = datasets_provider(ns, resume)
    model = run.model
    if model.position_embedding_type in ("rope", "yarn"):
        set_rotary_embeddings(engine.module, run.transformer, model.position_embedding_type,
                              model.rotary_percent, model.rotary_base, model.rope_scaling,
                              model.max_position_embeddings)
    if is_pipe_engine(engine):
        engine.reset_activation_shape()  # the pipe's buffers are sized by the first batch
    new = build_opt_param_scheduler(run.schedule, optimizer)
    new.continue_from(scheduler)
    set_rng_state(generators)
    return ns, data, new
