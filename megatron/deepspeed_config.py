"""The DeepSpeed engine configuration derived from the Megatron flags (and ``--deepspeed_config``)."""
import copy
from typing import Any, Dict


def deepspeed_config_from_args(args, train_batch_size: int) -> Dict[str, Any]:
    """DeepSpeed config dict: batch sizes from the flags (``train_batch_size`` is the current global
    batch, which differs from ``--global-batch-size`` during a rampup), ZeRO stage from
    ``--zero-stage`` or the JSON file (default 1 with several data-parallel ranks, else 0), precision
    and gradient clipping from the flags. Other keys of the JSON file are kept."""
    config = copy.deepcopy(args.deepspeed_config_dict or {})
    config["train_micro_batch_size_per_gpu"] = args.micro_batch_size
    config["train_batch_size"] = train_batch_size
    config["gradient_accumulation_steps"] = train_batch_size // (
        args.micro_batch_size * args.data_parallel_size)
    zero = config.setdefault("zero_optimization", {})
    if args.zero_stage is not None:
        zero["stage"] = args.zero_stage
    zero.setdefault("stage", 1 if args.data_parallel_size > 1 else 0)
    config.setdefault("gradient_clipping", args.clip_grad)
    if args.bf16:
        config["bf16"] = {**config.get("bf16", {}), "enabled": True}
    if args.fp16:
        fp16 = {**config.get("fp16", {}), "enabled": True}
        fp16.setdefault("loss_scale", args.loss_scale or 0)
        config["fp16"] = fp16
    if args.pipeline_model_parallel_size > 1 and args.sequence_parallel:
        # The pipe engine splits the activation it sends over the tensor-parallel group, assuming
        # every tensor-parallel rank holds the same one; under sequence parallelism each holds its
        # own slice of the sequence, so the activations travel whole.
        pipeline = config.setdefault("pipeline", {})
        pipeline["pipe_partitioned"] = False
        pipeline["grad_partitioned"] = False
    config.setdefault("zero_allow_untested_optimizer", True)
    config.setdefault("steps_per_print", 10 ** 12)
    config.setdefault("wall_clock_breakdown", False)
    return config
