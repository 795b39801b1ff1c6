"""The "parallelism" flag group (tensor, pipeline and sequence parallelism, activation
recompute, ZeRO stage, ...) and its checks: the data-parallel size, the layouts megatron-core or
DeepSpeed cannot run, the recompute flags, and the pipe engine's gradient accumulation."""
import argparse

from megatron.errors import ArgumentError
from megatron.parallel.recompute import resolve_recompute_flags


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    """The "parallelism" flag group."""
    g = parser.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1,
                   help="Ranks each weight matrix is split over (megatron-core tensor parallelism).")
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1,
                   help="Pipeline stages the layers are split over (DeepSpeed's pipe engine).")
    g.add_argument("--no-pipeline-parallel", action="store_true",
                   help="BigScience: train with the plain (non-pipe) engine; only with "
                        "--pipeline-model-parallel-size 1, where it is what happens anyway.")
    g.add_argument("--pp-partition-method", default="type:transformer",
                   help="How DeepSpeed's pipe engine splits layers over stages: uniform (layer "
                        "count), parameters (parameter count) or type:REGEX (balance the layers "
                        "whose class name matches REGEX, e.g. type:transformer|embedding).")
    g.add_argument("--sequence-parallel", action="store_true",
                   help="Megatron-LM sequence parallelism: split norm/dropout activations along "
                        "the sequence over the tensor-parallel group (needs TP > 1).")
    g.add_argument("--ds-sequence-parallel-size", type=int, default=1,
                   help="DeepSpeed-Ulysses sequence parallelism (Microsoft Megatron-DeepSpeed): each "
                        "of N ranks holds 1/N of every sequence; an all-to-all around the core "
                        "attention gives each the whole sequence for 1/N of the heads. Data-parallel "
                        "size = world / (TP x PP x N).")
    g.add_argument("--recompute-granularity", default=None, choices=["full", "selective"],
                   help="Activation recompute: 'full' recomputes whole layers (with "
                        "--recompute-method/--recompute-num-layers), 'selective' the core attention.")
    g.add_argument("--recompute-method", default=None, choices=["uniform", "block"],
                   help="'uniform': checkpoint the input of every group of --recompute-num-layers "
                        "layers; 'block': recompute only the first --recompute-num-layers layers "
                        "of each pipeline stage.")
    g.add_argument("--recompute-num-layers", type=int, default=None,
                   help="Layers per recompute group (uniform) or layers recomputed per stage (block).")
    g.add_argument("--checkpoint-activations", action="store_true",
                   help="BigScience: full recompute, uniform method, --checkpoint-num-layers layers "
                        "per group.")
    g.add_argument("--checkpoint-num-layers", type=int, default=1,
                   help="BigScience: layers per recompute group with --checkpoint-activations.")
    g.add_argument("--deepspeed-activation-checkpointing", action="store_true",
                   help="BigScience: as --checkpoint-activations, with DeepSpeed's activation "
                        "checkpointing doing the recompute where DeepSpeed owns the layers (pipe).")
    g.add_argument("--distribute-saved-activations", action="store_true",
                   help="With full recompute, split each saved layer input over the "
                        "tensor-parallel group.")
    g.add_argument("--zero-stage", type=int, default=None, choices=[0, 1, 2, 3],
                   help="DeepSpeed ZeRO stage (must agree with the --deepspeed_config JSON's "
                        "zero_optimization.stage when both are given).")
    g.add_argument("--distributed-backend", default=None, choices=["nccl", "gloo"],
                   help="Default: nccl with CUDA, gloo otherwise.")
    g.add_argument("--local_rank", "--local-rank", type=int, default=None,
                   help="Set by the deepspeed launcher.")


def validate_layout_sizes(args, world_size: int) -> None:
    """Data-parallel size = world / (TP x PP x Ulysses SP)."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    sp = args.ds_sequence_parallel_size
    if tp < 1 or pp < 1 or sp < 1:
        raise ArgumentError(f"--tensor-model-parallel-size {tp}, --pipeline-model-parallel-size "
                            f"{pp} and --ds-sequence-parallel-size {sp} must be positive")
    if world_size % (tp * pp * sp):
        with_sp = f" x --ds-sequence-parallel-size {sp}" if sp > 1 else ""
        raise ArgumentError(
            f"world size {world_size} is not divisible by --tensor-model-parallel-size {tp} x "
            f"--pipeline-model-parallel-size {pp}{with_sp} (= {tp * pp * sp})")
    args.world_size = world_size
    args.data_parallel_size = world_size // (tp * pp * sp)


def validate_layout(args) -> None:
    """Layouts megatron-core or DeepSpeed cannot run, refused with the values named; recompute
    flags resolved to Megatron-LM's three."""
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    if args.num_attention_heads % tp:
        raise ArgumentError(f"--num-attention-heads {args.num_attention_heads} is not divisible by "
                            f"--tensor-model-parallel-size {tp}")
    if args.num_query_groups % tp:
        raise ArgumentError(f"--num-query-groups {args.num_query_groups} is not divisible by "
                            f"--tensor-model-parallel-size {tp}")
    if args.ffn_hidden_size % tp:
        raise ArgumentError(f"--ffn-hidden-size {args.ffn_hidden_size} is not divisible by "
                            f"--tensor-model-parallel-size {tp}")
    if args.sequence_parallel and tp == 1:
        raise ArgumentError("--sequence-parallel needs --tensor-model-parallel-size > 1 (it splits "
                            "activations over the tensor-parallel group; given 1)")
    if args.sequence_parallel and args.seq_length % tp:
        raise ArgumentError(f"--seq-length {args.seq_length} is not divisible by "
                            f"--tensor-model-parallel-size {tp} (needed by --sequence-parallel)")
    if args.no_pipeline_parallel and pp > 1:
        raise ArgumentError(f"--no-pipeline-parallel contradicts --pipeline-model-parallel-size {pp}")
    from megatron.parallel.ulysses import ulysses_layout_problem  # lazy: torch (~1 s); --help needs none

    problem = ulysses_layout_problem(args)
    if problem:
        raise ArgumentError(problem)
    from megatron.model.gpt_model_pipe import partition_method_from_args  # lazy: megatron-core + deepspeed (seconds)

    method = args.pp_partition_method
    partition_method_from_args(args)  # the one check of --pp-partition-method (ArgumentError)
    if pp > 1:
        if args.num_layers < pp:
            raise ArgumentError(f"--num-layers {args.num_layers} is fewer than "
                                f"--pipeline-model-parallel-size {pp} stages")
        if method == "uniform" and args.num_layers % pp:
            raise ArgumentError(f"--num-layers {args.num_layers} is not divisible by "
                                f"--pipeline-model-parallel-size {pp} (needed by "
                                f"--pp-partition-method uniform)")
        zero = args.zero_stage  # the JSON's stage when no --zero-stage (validate_deepspeed_config)
        if zero is not None and zero >= 2:
            from_flag = "zero_stage" in args.given_flags or not args.deepspeed_config_dict
            where = ("--zero-stage" if from_flag
                     else f"--deepspeed_config {args.deepspeed_config} zero_optimization.stage")
            raise ArgumentError(f"{where} {zero} with --pipeline-model-parallel-size {pp}: "
                                "DeepSpeed's pipe engine supports ZeRO stage 0 or 1 only")
    if args.checkpoint_num_layers < 1:
        raise ArgumentError(f"--checkpoint-num-layers {args.checkpoint_num_layers} must be positive")
    resolve_recompute_flags(args)


def validate_pipe_accumulation(args) -> None:
    """A pipeline with gradient accumulation on a DeepSpeed release with the pipe engine's
    accumulation bug (megatron/parallel/pipe.py ``pipe_accumulation_problem``) is refused."""
    from importlib.metadata import PackageNotFoundError, version

    from megatron.parallel.pipe import pipe_accumulation_problem  # lazy: torch (~1 s); --help needs none

    try:
        installed = version("deepspeed")
    except PackageNotFoundError:
        return
    micro_batches = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    problem = pipe_accumulation_problem(installed, args.pipeline_model_parallel_size, micro_batches)
    if problem:
        raise ArgumentError(problem)
