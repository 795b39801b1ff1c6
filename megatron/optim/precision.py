"""The mixed-precision recipe of ``--bf16`` / ``--fp16``: the dtypes gradients are accumulated
and reduced in, the ZeRO stage and DeepSpeed config entries that make DeepSpeed run it, and the
start-up line naming what runs.

Megatron-LM's numerics (``validate_args`` in megatron/training/arguments.py): under ``--bf16``
gradients are accumulated over the micro batches and all-reduced over the data-parallel ranks in
fp32 (its ``main_grad``) unless ``--grad-reduce-in-bf16``; under ``--fp16`` in fp16 unless
``--accumulate-allreduce-grads-in-fp32``; master weights and optimizer states are fp32.

DeepSpeed 0.19 chooses the optimizer wrapper from the precision, ``data_types.grad_accum_dtype``
and the ZeRO stage (``DeepSpeedEngine._do_optimizer_sanity_check``). At ZeRO stage 0 it refuses
fp32 accumulation of bf16/fp16 gradients, and its stage-0 wrappers (``FP16_Optimizer``,
``FP16_UnfusedOptimizer``) test every parameter's gradient for overflow with a host sync each;
``FP16_UnfusedOptimizer`` (torch's AdamW, so every run here) also computes its clip norm from
gradient copies without the ``tensor_model_parallel`` attribute, so tensor-parallel ranks other
than 0 leave their shards out. Mixed precision therefore runs at ZeRO stage 1 at least (at
data-parallel size 1 stage 1 partitions nothing), where DeepSpeed runs

* ``BF16_Optimizer`` for bf16 with fp32 accumulation at stage 1: fp32 gradient buffers, fp32
  master weights and optimizer states partitioned over the data-parallel ranks (what BigScience's
  "bf16 at ZeRO 0" ran for BLOOM);
* ``DeepSpeedZeroOptimizer`` otherwise (bf16 with ``--grad-reduce-in-bf16``, fp16, ZeRO 2);
  ``DeepSpeedZeroOptimizer_Stage3`` at ZeRO 3.

Each clips by the whole model's norm, taken with the ``mpu``: each tensor-parallel shard once,
replicated parameters on tensor-parallel rank 0 only, the pipe's tied copy
(``ds_pipe_replicated``) left out, squares summed over the tensor x pipeline ranks (ZeRO 3, which
runs without pipelines here, filters by the model-parallel rank: the tensor-parallel one there);
and each tests for overflow with one flag per step, not one per parameter. docs/precision.md
tells the recipe and what differs from Megatron-LM. The flags' checks and the recipe's resolution
at validation are megatron/config/precision_flags.py.
"""
from dataclasses import dataclass
from typing import Any, Dict

# The optimizer wrappers DeepSpeed may run under mixed precision here (see the module docstring;
# ZeRO stage 3 has its own).
MIXED_PRECISION_WRAPPERS = ("BF16_Optimizer", "DeepSpeedZeroOptimizer",
                            "DeepSpeedZeroOptimizer_Stage3")
ACCUMULATION_FLAGS = ("accumulate_allreduce_grads_in_fp32", "grad_reduce_in_bf16")


@dataclass(frozen=True)
class PrecisionConfig:
    """The precision flags after validation (fields are their argparse dests): ``--bf16``,
    ``--fp16`` and ``accumulate_allreduce_grads_in_fp32`` as megatron/config/precision_flags.py
    resolved it (on under --bf16 unless --grad-reduce-in-bf16)."""

    bf16: bool
    fp16: bool
    accumulate_allreduce_grads_in_fp32: bool


def params_dtype_name(config: PrecisionConfig) -> str:
    """``bf16``, ``fp16`` or ``fp32``: the dtype of the model's parameters and activations."""
    return "bf16" if config.bf16 else "fp16" if config.fp16 else "fp32"


def grad_accumulation_dtype_name(config: PrecisionConfig) -> str:
    """The dtype (``fp32``, ``bf16`` or ``fp16``) gradients are accumulated in over an
    iteration's micro batches and all-reduced in over the data-parallel ranks: fp32 when
    ``config.accumulate_allreduce_grads_in_fp32`` (which megatron/config/precision_flags.py
    ``resolve_precision_flags`` sets under --bf16 unless --grad-reduce-in-bf16), else the
    parameters' dtype."""
    if config.accumulate_allreduce_grads_in_fp32:
        return "fp32"
    return params_dtype_name(config)


def short_dtype_name(dtype) -> str:
    """``fp32``/``bf16``/``fp16`` for a torch dtype (its ``str``), else the ``str``."""
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(
        str(dtype), str(dtype))


def deepspeed_precision_entries(precision: PrecisionConfig,
                                config: Dict[str, Any]) -> Dict[str, Any]:
    """The DeepSpeed config entries of the accumulation and reduction dtypes under --bf16/--fp16
    (``data_types.grad_accum_dtype``; ``communication_data_type``, unless ``config``, the
    ``--deepspeed_config`` JSON, sets it); none in fp32."""
    if not (precision.bf16 or precision.fp16):
        return {}
    accumulation = grad_accumulation_dtype_name(precision)
    reduction = config.get("communication_data_type")
    return {"data_types": {**config.get("data_types", {}), "grad_accum_dtype": accumulation},
            "communication_data_type": accumulation if reduction in (None, "auto") else reduction}


def optimizer_wrapper(engine) -> str:
    """The class name of the optimizer DeepSpeed's ``engine`` steps; under bf16/fp16 one of
    :data:`MIXED_PRECISION_WRAPPERS`, else RuntimeError (a DeepSpeed that chose another
    wrapper would clip by another norm)."""
    name = type(engine.optimizer).__name__
    mixed = engine.bfloat16_enabled() or engine.fp16_enabled()
    if mixed and name not in MIXED_PRECISION_WRAPPERS:
        raise RuntimeError(f"DeepSpeed runs {name} for mixed precision at ZeRO stage "
                           f"{engine.zero_optimization_stage()}; megatron/optim/precision.py expects one "
                           f"of {', '.join(MIXED_PRECISION_WRAPPERS)}")
    return name


def precision_line(engine) -> str:
    """The start-up line naming the precision recipe ``engine`` runs, e.g. ``precision: bf16
    parameters and activations, fp32 master weights and optimizer states, gradients accumulated
    in fp32 and reduced in fp32 (DeepSpeed BF16_Optimizer, ZeRO stage 1); optimizer AdamW
    (fused)``."""
    basic = engine.basic_optimizer  # the torch optimizer DeepSpeed wraps
    kernel = "fused" if getattr(basic, "defaults", {}).get("fused") else "unfused"
    optimizer = f"optimizer {type(basic).__name__} ({kernel})"
    if not (engine.bfloat16_enabled() or engine.fp16_enabled()):
        return f"precision: fp32; {optimizer}"
    model, accumulation = engine.get_data_types()
    # DeepSpeed's wrappers keep fp32 masters unless configured to keep them in low precision
    master = ("bf16" if engine.bf16_master_weights_and_gradients() else
              "fp16" if engine.fp16_master_weights_and_gradients() else "fp32")
    line = (f"precision: {short_dtype_name(model)} parameters and activations, {master} "
            f"master weights and optimizer states, gradients accumulated in "
            f"{short_dtype_name(accumulation)} and reduced in "
            f"{short_dtype_name(engine.communication_data_type)} (DeepSpeed "
            f"{optimizer_wrapper(engine)}, ZeRO stage {engine.zero_optimization_stage()})")
    if engine.fp16_enabled():
        line += (f", dynamic loss scale from {engine.initial_dynamic_scale():g}"
                 if engine.dynamic_loss_scale() else f", static loss scale {engine.loss_scale():g}")
    return f"{line}; {optimizer}"
