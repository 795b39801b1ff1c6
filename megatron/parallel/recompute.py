"""Activation recompute flags -> megatron-core ``TransformerConfig`` fields.

Megatron-LM's ``--recompute-granularity {full,selective} --recompute-method {uniform,block}
--recompute-num-layers N`` keep their meaning; BigScience's ``--checkpoint-activations`` is
``full`` / ``uniform`` / ``--checkpoint-num-layers`` (default 1), and
``--deepspeed-activation-checkpointing`` says the same with DeepSpeed's checkpoint function doing
the recompute where DeepSpeed owns the layers (the pipe engine).
"""
from typing import Any, Dict

from megatron.errors import ArgumentError


def recompute_config_from_args(args) -> Dict[str, Any]:
    """The ``TransformerConfig`` keyword arguments for activation recompute (and the
    ``distribute_saved_activations`` option), from validated flags."""
    return {
        "recompute_granularity": args.recompute_granularity,
        "recompute_method": args.recompute_method,
        "recompute_num_layers": args.recompute_num_layers,
        "distribute_saved_activations": bool(args.distribute_saved_activations),
    }


def resolve_recompute_flags(args) -> None:
    """Fold BigScience's ``--checkpoint-activations`` / ``--deepspeed-activation-checkpointing``
    into Megatron-LM's three recompute flags (in place) and check their combination; raises
    :class:`megatron.errors.ArgumentError` naming the flags and values."""
    bigscience = [f for f, v in (("--checkpoint-activations", args.checkpoint_activations),
                                 ("--deepspeed-activation-checkpointing",
                                  args.deepspeed_activation_checkpointing)) if v]
    if bigscience:
        if args.recompute_granularity not in (None, "full") or args.recompute_method not in (None, "uniform"):
            raise ArgumentError(
                f"{' and '.join(bigscience)} (full recompute, uniform method) contradicts "
                f"--recompute-granularity {args.recompute_granularity} --recompute-method "
                f"{args.recompute_method}")
        args.recompute_granularity = "full"
        args.recompute_method = "uniform"
        if args.recompute_num_layers is None:
            args.recompute_num_layers = args.checkpoint_num_layers
    granularity, method, n = args.recompute_granularity, args.recompute_method, args.recompute_num_layers
    if granularity is None:
        if method is not None or n is not None or args.distribute_saved_activations:
            given = [f for f, v in (("--recompute-method", method), ("--recompute-num-layers", n),
                                    ("--distribute-saved-activations",
                                     args.distribute_saved_activations or None)) if v is not None]
            raise ArgumentError(f"{', '.join(given)} needs --recompute-granularity full (or "
                                "--checkpoint-activations)")
        return
    if granularity == "selective":
        if method is not None or n is not None:
            raise ArgumentError(
                f"--recompute-granularity selective recomputes the core attention of every layer; "
                f"--recompute-method {method} / --recompute-num-layers {n} apply to 'full' only")
        if args.distribute_saved_activations:
            raise ArgumentError("--distribute-saved-activations needs --recompute-granularity full")
        return
    if method is None or n is None:
        raise ArgumentError(
            f"--recompute-granularity full needs --recompute-method (uniform or block) and "
            f"--recompute-num-layers N (given: --recompute-method {method}, --recompute-num-layers {n})")
    layers_per_stage = args.num_layers // args.pipeline_model_parallel_size
    if method == "uniform" and not 1 <= n <= layers_per_stage:
        raise ArgumentError(
            f"--recompute-num-layers {n} with --recompute-method uniform must be in [1, "
            f"{layers_per_stage}] (layers per pipeline stage: --num-layers {args.num_layers} / "
            f"--pipeline-model-parallel-size {args.pipeline_model_parallel_size})")
    if method == "block" and not 0 <= n <= layers_per_stage:
        raise ArgumentError(
            f"--recompute-num-layers {n} with --recompute-method block must be in [0, "
            f"{layers_per_stage}] (layers per pipeline stage)")
    if method == "block" and args.pipeline_model_parallel_size > 1:
        raise ArgumentError(
            f"--recompute-method block with --pipeline-model-parallel-size "
            f"{args.pipeline_model_parallel_size} is not supported: DeepSpeed's pipe engine "
            "recomputes every N layers (use --recompute-method uniform)")
    if args.distribute_saved_activations and args.sequence_parallel:
        raise ArgumentError("--distribute-saved-activations and --sequence-parallel are mutually "
                            "exclusive (sequence parallelism already splits the saved activations)")
    if args.distribute_saved_activations and args.tensor_model_parallel_size == 1:
        raise ArgumentError("--distribute-saved-activations splits saved activations over the "
                            "tensor-parallel group; it needs --tensor-model-parallel-size > 1")
