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
tells the recipe and what differs from Megatron-LM.
"""
from typing import Any, Dict, List

from megatron.errors import ConfigError

# The optimizer wrappers DeepSpeed may run under mixed precision here (see the module docstring;
# ZeRO stage 3 has its own).
MIXED_PRECISION_WRAPPERS = ("BF16_Optimizer", "DeepSpeedZeroOptimizer",
                            "DeepSpeedZeroOptimizer_Stage3")
ACCUMULATION_FLAGS = ("accumulate_allreduce_grads_in_fp32", "grad_reduce_in_bf16")


def params_dtype_name(args) -> str:
    """``bf16``, ``fp16`` or ``fp32``: the dtype of the model's parameters and activations."""
    return "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32"


def grad_accumulation_dtype_name(args) -> str:
    """The dtype (``fp32``, ``bf16`` or ``fp16``) gradients are accumulated in over an
    iteration's micro batches and all-reduced in over the data-parallel ranks: fp32 when
    ``args.accumulate_allreduce_grads_in_fp32`` (which :func:`resolve_precision_flags` sets
    under --bf16 unless --grad-reduce-in-bf16), else the parameters' dtype."""
    if args.accumulate_allreduce_grads_in_fp32:
        return "fp32"
    return params_dtype_name(args)


def _short_name(dtype) -> str:
    """``fp32``/``bf16``/``fp16`` for a torch dtype (its ``str``), else the ``str``."""
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16", "torch.float16": "fp16"}.get(
        str(dtype), str(dtype))


def _dtype_name(value: Any) -> str:
    """DeepSpeed's spelling of a dtype in its JSON (``"float32"``, ``"torch.bfloat16"``, ...) as
    ``fp32``/``bf16``/``fp16``; ``""`` for anything else."""
    from deepspeed.runtime.config import DtypeEnum

    try:
        name = _short_name(DtypeEnum(value).value)
    except (ValueError, TypeError):
        return ""
    return name if name in ("fp32", "bf16", "fp16") else ""


def _accumulation_from_json(args, json_accumulation: Any, notes: List[str]) -> None:
    """``data_types.grad_accum_dtype`` of the ``--deepspeed_config`` JSON (``json_accumulation``)
    against the accumulation flags: without them it sets them (noted), with them it must agree."""
    where = (f"--deepspeed_config {args.deepspeed_config} "
             f"data_types.grad_accum_dtype={json_accumulation}")
    params = params_dtype_name(args)
    name = _dtype_name(json_accumulation)
    if name not in ("fp32", params):
        raise ConfigError(f"{where}: gradients of {params} parameters accumulate in fp32"
                          + ("" if params == "fp32" else f" or {params}") + " here")
    given = [args.given_flags[d] for d in ACCUMULATION_FLAGS if d in args.given_flags]
    if given:
        if name != grad_accumulation_dtype_name(args):
            raise ConfigError(f"{where} disagrees with {' '.join(given)} (gradients accumulated "
                              f"in {grad_accumulation_dtype_name(args)}); give one of them")
        return
    if name != grad_accumulation_dtype_name(args):
        args.accumulate_allreduce_grads_in_fp32 = name == "fp32"
        args.grad_reduce_in_bf16 = bool(args.bf16) and name == "bf16"
        flag = "--grad-reduce-in-bf16" if args.grad_reduce_in_bf16 else \
            "--accumulate-allreduce-grads-in-fp32"
        notes.append(f"from {where}: {flag} (gradients accumulated and reduced in {name})")


def _check_pipe_tied_gradients(args) -> None:
    """fp16 with fp32 accumulation under a pipeline is refused: ZeRO moves each micro batch's
    gradient into its fp32 ``grad_accum`` (emptying ``param.grad``), and DeepSpeed's pipe engine
    sums the tied embedding's gradient over its stages from ``param.grad``
    (``_exec_reduce_tied_grads``), so that sum would be skipped."""
    if not (args.fp16 and args.accumulate_allreduce_grads_in_fp32
            and args.pipeline_model_parallel_size > 1):
        return
    given = args.given_flags.get("accumulate_allreduce_grads_in_fp32",
                                 f"--deepspeed_config {args.deepspeed_config} "
                                 "data_types.grad_accum_dtype=fp32")
    raise ConfigError(f"{given} with --fp16 and --pipeline-model-parallel-size "
                      f"{args.pipeline_model_parallel_size}: DeepSpeed's pipe engine would not sum "
                      "the tied embedding's fp32-accumulated gradient over the stages; use --bf16 "
                      "(fp32 accumulation) or fp16 accumulation (drop the flag)")


def _reduction_from_json(args, json_reduction: Any) -> None:
    """``communication_data_type`` of the ``--deepspeed_config`` JSON: kept (the start-up line
    names it), but it must agree with an accumulation flag given, which names the all-reduce
    dtype too."""
    given = [args.given_flags[d] for d in ACCUMULATION_FLAGS if d in args.given_flags]
    if given and _dtype_name(json_reduction) != grad_accumulation_dtype_name(args):
        raise ConfigError(f"--deepspeed_config {args.deepspeed_config} communication_data_type="
                          f"{json_reduction} disagrees with {' '.join(given)} (gradients "
                          f"all-reduced in {grad_accumulation_dtype_name(args)}); give one of them")


def resolve_precision_flags(args, json_accumulation: Any = None,
                            json_reduction: Any = None) -> List[str]:
    """Megatron-LM's accumulation flags and the ZeRO stage under mixed precision, in place;
    returns the start-up notes to print. ``json_accumulation`` and ``json_reduction`` are the
    ``--deepspeed_config`` JSON's ``data_types.grad_accum_dtype`` and
    ``communication_data_type`` (None when absent). Sets
    ``args.accumulate_allreduce_grads_in_fp32`` to what runs (on under --bf16 unless
    --grad-reduce-in-bf16, as Megatron-LM does) and, under --bf16/--fp16, ``args.zero_stage`` to
    at least 1 (see the module docstring; a stage 0 given becomes 1, noted). :class:`ConfigError`
    for contradicting flags or JSON keys."""
    notes = []
    if args.grad_reduce_in_bf16 and args.accumulate_allreduce_grads_in_fp32:
        raise ConfigError("--grad-reduce-in-bf16 contradicts --accumulate-allreduce-grads-in-fp32 "
                          "(gradients accumulated and reduced in bf16 or in fp32); drop one")
    if args.grad_reduce_in_bf16 and not args.bf16:
        notes.append("--grad-reduce-in-bf16: no effect without --bf16")
        args.grad_reduce_in_bf16 = False
    if args.accumulate_allreduce_grads_in_fp32 and not (args.bf16 or args.fp16):
        notes.append("--accumulate-allreduce-grads-in-fp32: no effect without --bf16 or --fp16 "
                     "(fp32 training accumulates in fp32)")
        args.accumulate_allreduce_grads_in_fp32 = False
    if args.bf16 and not args.grad_reduce_in_bf16:
        args.accumulate_allreduce_grads_in_fp32 = True
    if json_accumulation is not None:
        _accumulation_from_json(args, json_accumulation, notes)
    if json_reduction is not None and (args.bf16 or args.fp16):
        _reduction_from_json(args, json_reduction)
    _check_pipe_tied_gradients(args)
    if (args.bf16 or args.fp16) and not args.zero_stage:
        if args.zero_stage == 0:
            given = ("--zero-stage 0" if "zero_stage" in args.given_flags else
                     f"--deepspeed_config {args.deepspeed_config} zero_optimization.stage=0")
            wrapper = ("BF16_Optimizer" if grad_accumulation_dtype_name(args) == "fp32"
                       and args.bf16 else "DeepSpeedZeroOptimizer")
            notes.append(f"{given} with --{params_dtype_name(args)}: runs at ZeRO stage 1 "
                         f"(DeepSpeed's {wrapper}: fp32 master weights, gradients accumulated in "
                         f"{grad_accumulation_dtype_name(args)}, optimizer states partitioned over "
                         "the data-parallel ranks), since DeepSpeed's stage-0 mixed-precision "
                         "optimizers clip by a partial gradient norm under tensor parallelism "
                         "(docs/precision.md)")
        args.zero_stage = 1
    return notes


def deepspeed_precision_entries(args, config: Dict[str, Any]) -> Dict[str, Any]:
    """The DeepSpeed config entries of the accumulation and reduction dtypes under --bf16/--fp16
    (``data_types.grad_accum_dtype``; ``communication_data_type``, unless ``config``, the
    ``--deepspeed_config`` JSON, sets it); none in fp32."""
    if not (args.bf16 or args.fp16):
        return {}
    accumulation = grad_accumulation_dtype_name(args)
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
    line = (f"precision: {_short_name(model)} parameters and activations, {master} "
            f"master weights and optimizer states, gradients accumulated in "
            f"{_short_name(accumulation)} and reduced in "
            f"{_short_name(engine.communication_data_type)} (DeepSpeed "
            f"{optimizer_wrapper(engine)}, ZeRO stage {engine.zero_optimization_stage()})")
    if engine.fp16_enabled():
        line += (f", dynamic loss scale from {engine.initial_dynamic_scale():g}"
                 if engine.dynamic_loss_scale() else f", static loss scale {engine.loss_scale():g}")
    return f"{line}; {optimizer}"
