"""The model in its DeepSpeed engine with the optimizer and the LR/WD scheduler, and how the run
weighs its losses."""
import torch

from megatron.config.deepspeed_config import deepspeed_config
from megatron.config.run_config import EngineConfig, RunConfig
from megatron.data.train_data import TrainData
from megatron.model.moe import moe_layer_pattern
from megatron.optim.learning_rates import build_opt_param_scheduler
from megatron.optim.loss_normalization import LossNormalizationConfig, LossNormalizer, LossWeights, normalization
from megatron.optim.optimizer import build_optimizer
from megatron.optim.precision import precision_line
from megatron.parallel.grads import install_sequence_parallel_grad_allreduce
from megatron.parallel.pipe import check_grid_matches, install_model_grad_clipping
from megatron.parallel.topology import MegatronCoreMPU
from megatron.utils.rank_utils import print_rank_0


def setup_model_and_optimizer(run: RunConfig, model: torch.nn.Module, initial_batch: int):
    """Torch optimizer, DeepSpeed engine and the LR/WD scheduler on the engine's groups for
    ``model`` (the model provider's), from the run's typed configs ``run``
    (megatron/config/run_config.py: ``engine``, ``optimizer``, ``deepspeed``, ``schedule``);
    ``initial_batch``: the global batch (samples) of the first iteration."""
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from megatron.core import parallel_state

    from megatron.parallel.experts import check_stages_hold_experts, mark_expert_parameters  # lazy: deepspeed (seconds)

    engine_config: EngineConfig = run.engine
    pipe = isinstance(model, PipelineModule)
    # expert-parallel experts reduced over their expert-data-parallel group (DeepSpeed's MoE path)
    if engine_config.num_experts:
        check_stages_hold_experts(
            model, moe_layer_pattern(engine_config.moe_layer_freq, engine_config.num_layers),
            engine_config.expert_model_parallel_size, engine_config.moe_layer_freq_flag)
    mark_expert_parameters(model, engine_config.expert_model_parallel_size)
    optimizer = build_optimizer(run.optimizer, model)
    engine, ds_optimizer, _, _ = deepspeed.initialize(
        model=model, optimizer=optimizer, config=deepspeed_config(run.deepspeed, initial_batch),
        # A pipe engine takes its groups from the PipelineModule's topology (DeepSpeed refuses an
        # mpu with a pipe); they are checked against megatron-core's below.
        mpu=None if pipe else MegatronCoreMPU(), dist_init_required=False)
    if pipe:
        check_grid_matches(engine.grid)
        install_model_grad_clipping(engine)
    if engine_config.sequence_parallel:  # megatron/parallel/grads.py
        when = install_sequence_parallel_grad_allreduce(
            engine, parallel_state.get_tensor_model_parallel_group())
        print_rank_0(f"sequence-parallel gradients summed over tensor-parallel ranks {when}")
    print_rank_0(precision_line(engine))  # megatron/optim/precision.py; checks DeepSpeed's wrapper
    scheduler = build_opt_param_scheduler(run.schedule, ds_optimizer)
    return engine, ds_optimizer, scheduler


def loss_normalizer(config: LossNormalizationConfig, data: TrainData,
                    data_parallel_size: int) -> LossNormalizer:
    """How this run weighs its losses (megatron/optim/loss_normalization.py): the normalisation of
    --calculate-per-token-loss / --calculate-per-sample-loss (per segment for packed T0 samples),
    the training datasets' loss weights, over megatron-core's data-parallel group of
    ``data_parallel_size`` ranks."""
    from megatron.core import parallel_state

    return LossNormalizer(normalization(config), packed=config.packed_samples,
                          loss_weights=LossWeights(data.loss_weights),
                          data_parallel_group=parallel_state.get_data_parallel_group(),
                          data_parallel_size=data_parallel_size)
