"""The model in its DeepSpeed engine with the optimizer and the LR/WD scheduler, and how the run
weighs its losses."""
from typing import Callable

from megatron.config.deepspeed_config import deepspeed_config_from_args
from megatron.config.moe_flags import describe_layer_freq
from megatron.data.train_data import TrainData
from megatron.model.moe import moe_layer_pattern
from megatron.optim.learning_rates import build_opt_param_scheduler
from megatron.optim.loss_normalization import LossNormalizer, LossWeights, normalization_from_args
from megatron.optim.optimizer import build_optimizer
from megatron.optim.precision import precision_line
from megatron.parallel.grads import install_sequence_parallel_grad_allreduce
from megatron.parallel.pipe import check_grid_matches, install_model_grad_clipping
from megatron.parallel.topology import MegatronCoreMPU
from megatron.utils.rank_utils import print_rank_0


def setup_model_and_optimizer(args, model_provider: Callable, initial_batch: int):
    """Model, torch optimizer, DeepSpeed engine and the LR/WD scheduler on the engine's groups."""
    import deepspeed
    from deepspeed.pipe import PipelineModule
    from megatron.core import parallel_state

    from megatron.parallel.experts import check_stages_hold_experts, mark_expert_parameters  # lazy: deepspeed (seconds)

    model = model_provider(args)
    pipe = isinstance(model, PipelineModule)
    # expert-parallel experts reduced over their expert-data-parallel group (DeepSpeed's MoE path)
    if args.num_experts:
        check_stages_hold_experts(model, moe_layer_pattern(args.moe_layer_freq, args.num_layers),
                                  args.expert_model_parallel_size, describe_layer_freq(args))
    mark_expert_parameters(model, args.expert_model_parallel_size)
    optimizer = build_optimizer(args.run_config.optimizer, model)
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
    print_rank_0(precision_line(engine))  # megatron/optim/precision.py; checks DeepSpeed's wrapper
    scheduler = build_opt_param_scheduler(args.run_config.schedule, ds_optimizer)
    return engine, ds_optimizer, scheduler


def loss_normalizer_from_args(args, data: TrainData) -> LossNormalizer:
    """How this run weighs its losses (megatron/optim/loss_normalization.py): the normalisation of
    --calculate-per-token-loss / --calculate-per-sample-loss (per segment for packed T0 samples),
    the training datasets' loss weights, over megatron-core's data-parallel group."""
    from megatron.core import parallel_state

    return LossNormalizer(normalization_from_args(args), packed=getattr(args, "packed_samples", False),
                          loss_weights=LossWeights(data.loss_weights),
                          data_parallel_group=parallel_state.get_data_parallel_group(),
                          data_parallel_size=args.data_parallel_size)
