"""The run's typed configs, built once as the last step of validation (``validate_args``) from the
validated flags: frozen dataclasses whose fields are the argparse dests, one per consumer, filled
with no defaults (megatron/utils/typed_config.py), so a flag a consumer needs and the parser lacks
fails at start-up, by name.

- ``batch``: megatron/schedules/units.py ``BatchConfig`` (the batch schedule);
- ``data``: megatron/data/data_config.py ``DataConfig`` (the data builders: sources, index,
  samples and the run's length and evaluations);
- ``loop``: :class:`LoopConfig` (megatron/train/: iterations, intervals, exits, the loader);
- ``checkpoint``: :class:`CheckpointConfig` (megatron/train/resume.py: ``--save``/``--load``);
- ``metrics``: megatron/metrics/writers.py ``MetricsConfig`` (jsonl, TensorBoard, W&B);
- ``tokenizer``: megatron/tokenizer/types.py ``TokenizerConfig`` (the type resolved, its files);
- ``engine``: :class:`EngineConfig` (megatron/train/engine_setup.py: the engine's layout checks);
- ``loss``: megatron/optim/loss_normalization.py ``LossNormalizationConfig``;
- ``skip_step``: megatron/optim/skip_step.py ``SkipStepConfig`` (skipping spiking steps);
- ``schedule``: megatron/optim/learning_rates.py ``ScheduleConfig`` (the LR/WD schedule);
- ``deepspeed``: megatron/config/deepspeed_config.py ``DeepSpeedFlags`` (what the DeepSpeed
  engine's config is built from: megatron/train/engine_setup.py);
- ``vocab``: megatron/tokenizer/tokenizer.py ``VocabConfig`` (what the embedding rows follow);
- ``optimizer``: megatron-core's ``OptimizerConfig`` (megatron/optim/optimizer.py);
- ``transformer``: megatron-core's ``TransformerConfig`` (validation builds it: the model);
- ``model``: megatron/model/model_config.py ``ModelConfig`` (position encoding, layer
  implementation, core attention, pipe and parallel layout, MoE layout: the model's builders,
  megatron/config/model_config.py);
- ``distributed``: megatron/parallel/initialize.py ``DistributedConfig`` (backend, collective
  timeout);
- ``notes``: the start-up notes validation returned (printed once the run starts).

The configs the train package consumes are defined here, the layer below it; the lower layers'
configs are defined next to their consumers, which cannot import this package.
"""
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple, Union

from megatron.core.optimizer import OptimizerConfig
from megatron.core.transformer import TransformerConfig

from megatron.config.batch_flags import batch_config_from_args
from megatron.config.deepspeed_config import DeepSpeedFlags, deepspeed_flags_from_args
from megatron.config.lr_flags import schedule_config_from_args
from megatron.config.model_config import model_config_from_args
from megatron.config.moe_flags import describe_layer_freq
from megatron.config.tokenizer_flags import tokenizer_config_from_args
from megatron.data.data_config import DataConfig
from megatron.metrics.position_buckets import PositionBuckets
from megatron.metrics.writers import MetricsConfig
from megatron.model.model_config import ModelConfig
from megatron.optim.learning_rates import ScheduleConfig
from megatron.optim.loss_normalization import LossNormalizationConfig
from megatron.optim.skip_step import SkipStepConfig
from megatron.parallel.initialize import DistributedConfig
from megatron.schedules.units import BatchConfig
from megatron.tokenizer.tokenizer import VocabConfig
from megatron.tokenizer.types import TokenizerConfig
from megatron.utils.typed_config import config_from_args


@dataclass(frozen=True)
class LoopConfig:
    """What the training loop reads (megatron/train/): the run's length in iterations
    (``train_iters``, derived by validation), the micro batch (samples) and data-parallel size,
    the intervals (iterations) of logging, evaluation, saving and exiting, the evaluation
    iterations and position buckets (``--eval-position-buckets``: None without), the run-control
    exits and the loader's seed and workers."""

    train_iters: int
    micro_batch_size: int
    global_batch_size: int
    data_parallel_size: int
    seq_length: int
    log_interval: int
    eval_interval: int
    eval_iters: int
    position_buckets: Optional[PositionBuckets]
    save_interval: Optional[int]
    exit_interval: Optional[int]
    phase_transition_iterations: Optional[Sequence[int]]
    skip_train: bool
    kill_switch_path: Optional[str]
    exit_duration_in_mins: Optional[float]
    exit_signal_handler: bool
    train_tokens_note: Optional[str]
    seed: int
    num_workers: int


@dataclass(frozen=True)
class CheckpointConfig:
    """What saving and resuming read (megatron/train/resume.py): ``--save``, ``--load`` and how a
    load is taken (``--finetune``, ``--reset-progress``, ``--no-load-optim``, ``--no-load-rng``,
    ``--universal-checkpoint``, ``--override-data-mix``)."""

    save: Optional[str]
    load: Optional[str]
    finetune: bool
    reset_progress: bool
    no_load_optim: bool
    no_load_rng: bool
    universal_checkpoint: bool
    override_data_mix: bool


@dataclass(frozen=True)
class EngineConfig:
    """What the engine set-up reads besides the optimizer, DeepSpeed and schedule configs
    (megatron/train/engine_setup.py): the MoE layout (``--num-experts``, ``--moe-layer-freq`` and
    ``moe_layer_freq_flag``, the flag that chose the MoE layers as given, for messages; None
    without experts), ``--num-layers``, ``--expert-model-parallel-size`` and
    ``--sequence-parallel``."""

    num_experts: Optional[int]
    moe_layer_freq: Union[int, Sequence[int]]
    moe_layer_freq_flag: Optional[str]
    num_layers: int
    expert_model_parallel_size: int
    sequence_parallel: bool


@dataclass(frozen=True)
class RunConfig:
    """Every typed config of one run (module docstring)."""

    batch: BatchConfig
    data: DataConfig
    loop: LoopConfig
    checkpoint: CheckpointConfig
    metrics: MetricsConfig
    tokenizer: TokenizerConfig
    engine: EngineConfig
    loss: LossNormalizationConfig
    skip_step: SkipStepConfig
    schedule: ScheduleConfig
    deepspeed: DeepSpeedFlags
    vocab: VocabConfig
    optimizer: OptimizerConfig
    transformer: TransformerConfig
    model: ModelConfig
    distributed: DistributedConfig
    notes: Tuple[str, ...]


def optimizer_config_from_args(args) -> OptimizerConfig:
    """megatron-core's ``OptimizerConfig`` of the optimizer flags (``--optimizer``, ``--lr``,
    ``--min-lr``, ``--weight-decay``, Adam's betas and eps, SGD's momentum, ``--clip-grad``, the
    precision flags and ``--loss-scale``); every other field keeps megatron-core's default (the
    dynamic loss scaler's settings go to DeepSpeed's config: megatron/config/deepspeed_config.py)."""
    return OptimizerConfig(
        optimizer=args.optimizer, lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        sgd_momentum=args.sgd_momentum, clip_grad=args.clip_grad, bf16=args.bf16, fp16=args.fp16,
        loss_scale=args.loss_scale)


def data_config_from_args(args, batch: Optional[BatchConfig] = None) -> DataConfig:
    """megatron/data/data_config.py ``DataConfig`` of the validated data flags in ``args`` (every
    field read, none defaulted but the T0 flags, which only finetune_t0.py's parser has) with the
    batch config ``batch`` (default: the flags', megatron/config/batch_flags.py)."""
    return config_from_args(DataConfig, args, batch=batch or batch_config_from_args(args),
                            **{dest: getattr(args, dest, False) for dest in (
                                "prefix_lm", "loss_on_targets_only", "norm_target_loss")})


def position_buckets_from_args(args) -> Optional[PositionBuckets]:
    """The evaluation's position buckets of the validated flags (``args.eval_position_bounds``,
    megatron/config/eval_flags.py; ``--eval-position-bucket-basis``), or None without."""
    bounds = args.eval_position_bounds
    if bounds is None:
        return None
    return PositionBuckets(tuple(bounds), args.eval_position_bucket_basis)


def run_config_from_args(args, notes: Sequence[str]) -> RunConfig:
    """The :class:`RunConfig` of validated ``args`` (every field read, none defaulted) with the
    start-up ``notes`` validation returned."""
    batch = config_from_args(BatchConfig, args)
    return RunConfig(batch=batch,
                     data=data_config_from_args(args, batch),
                     loop=config_from_args(LoopConfig, args,
                                           position_buckets=position_buckets_from_args(args)),
                     checkpoint=config_from_args(CheckpointConfig, args),
                     metrics=config_from_args(MetricsConfig, args),
                     tokenizer=tokenizer_config_from_args(args),
                     engine=config_from_args(EngineConfig, args, moe_layer_freq_flag=(
                         describe_layer_freq(args) if args.num_experts else None)),
                     # packed_samples: set by the entry points that pack (finetune_t0.py)
                     loss=config_from_args(LossNormalizationConfig, args, packed_samples=getattr(
                         args, "packed_samples", False)),
                     skip_step=config_from_args(SkipStepConfig, args),
                     schedule=schedule_config_from_args(args),
                     deepspeed=deepspeed_flags_from_args(args),
                     vocab=config_from_args(VocabConfig, args),
                     optimizer=optimizer_config_from_args(args),
                     transformer=args.transformer_config,
                     model=model_config_from_args(args),
                     distributed=config_from_args(DistributedConfig, args),
                     notes=tuple(notes))
