"""The precision flags' resolution at validation (``validate_args``, through
megatron/config/deepspeed_config.py ``validate_deepspeed_config``): Megatron-LM's gradient
accumulation flags (``--accumulate-allreduce-grads-in-fp32``, ``--grad-reduce-in-bf16``) against
``--bf16``/``--fp16`` and the ``--deepspeed_config`` JSON's ``data_types.grad_accum_dtype`` and
``communication_data_type``, and the ZeRO stage of mixed precision; set in place in the flags.
The recipe itself (what runs, the DeepSpeed entries, the start-up line) is
megatron/optim/precision.py, which takes the resolved flags as its ``PrecisionConfig``.
"""
from typing import Any, List

from megatron.errors import ConfigError
from megatron.optim.precision import (
    ACCUMULATION_FLAGS,
    PrecisionConfig,
    grad_accumulation_dtype_name,
    params_dtype_name,
    short_dtype_name,
)
from megatron.utils.typed_config import config_from_args


def precision_config_from_args(args) -> PrecisionConfig:
    """megatron/optim/precision.py ``PrecisionConfig`` of the precision flags in ``args`` as they
    stand (every field read, none defaulted)."""
    return config_from_args(PrecisionConfig, args)


def _params(args) -> str:
    """``params_dtype_name`` of the flags as they stand."""
    return params_dtype_name(precision_config_from_args(args))


def _accumulation(args) -> str:
    """``grad_accumulation_dtype_name`` of the flags as they stand."""
    return grad_accumulation_dtype_name(precision_config_from_args(args))


def _dtype_name(value: Any) -> str:
    """DeepSpeed's spelling of a dtype in its JSON (``"float32"``, ``"torch.bfloat16"``, ...) as
    ``fp32``/``bf16``/``fp16``; ``""`` for anything else."""
    from deepspeed.runtime.config import DtypeEnum

    try:
        name = short_dtype_name(DtypeEnum(value).value)
    except (ValueError, TypeError):
        return ""
    return name if name in ("fp32", "bf16", "fp16") else ""


def _accumulation_from_json(args, json_accumulation: Any, notes: List[str]) -> None:
    """``data_types.grad_accum_dtype`` of the ``--deepspeed_config`` JSON (``json_accumulation``)
    against the accumulation flags: without them it sets them (noted), with them it must agree."""
    where = (f"--deepspeed_config {args.deepspeed_config} "
             f"data_types.grad_accum_dtype={json_accumulation}")
    params = _params(args)
    name = _dtype_name(json_accumulation)
    if name not in ("fp32", params):
        raise ConfigError(f"{where}: gradients of {params} parameters accumulate in fp32"
                          + ("" if params == "fp32" else f" or {params}") + " here")
    given = [args.given_flags[d] for d in ACCUMULATION_FLAGS if d in args.given_flags]
    if given:
        if name != _accumulation(args):
            raise ConfigError(f"{where} disagrees with {' '.join(given)} (gradients accumulated "
                              f"in {_accumulation(args)}); give one of them")
        return
    if name != _accumulation(args):
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
    if given and _dtype_name(json_reduction) != _accumulation(args):
        raise ConfigError(f"--deepspeed_config {args.deepspeed_config} communication_data_type="
                          f"{json_reduction} disagrees with {' '.join(given)} (gradients "
                          f"all-reduced in {_accumulation(args)}); give one of them")


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
            wrapper = ("BF16_Optimizer" if _accumulation(args) == "fp32"
                       and args.bf16 else "DeepSpeedZeroOptimizer")
            notes.append(f"{given} with --{_params(args)}: runs at ZeRO stage 1 "
                         f"(DeepSpeed's {wrapper}: fp32 master weights, gradients accumulated in "
                         f"{_accumulation(args)}, optimizer states partitioned over "
                         "the data-parallel ranks), since DeepSpeed's stage-0 mixed-precision "
                         "optimizers clip by a partial gradient norm under tensor parallelism "
                         "(docs/precision.md)")
        args.zero_stage = 1
    return notes
