"""The "parallelism" flag group (tensor, pipeline and sequence parallelism, activation
recompute, ZeRO stage, ...) and its checks: the data-parallel size, the layouts megatron-core or
DeepSpeed cannot run, the recompute flags, and the pipe engine's gradient accumulation."""
import argparse
from typing import List, Optional

from megatron.errors import ArgumentError


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
    g.add_argument("--distributed-timeout-minutes", type=float, default=10.0,
                   help="Megatron-LM's: how long any collective (and the start-up rendezvous) "
                        "waits for a peer before the run stops, naming the ranks that did not "
                        "answer; for the world group, megatron-core's groups and DeepSpeed's. "
                        "Minutes, fractions allowed (0.1 = 6 s; Megatron-LM takes whole minutes).")
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
    if not args.distributed_timeout_minutes > 0:
        raise ArgumentError(f"--distributed-timeout-minutes {args.distributed_timeout_minutes} must "
                            f"be positive (minutes; fractions allowed, e.g. 0.5 for 30 s)")
    problem = ulysses_layout_problem(args)
    if problem:
        raise ArgumentError(problem)
    from megatron.model.gpt_model_pipe import partition_method  # lazy: megatron-core + deepspeed (seconds)

    method = args.pp_partition_method
    partition_method(method)  # the one check of --pp-partition-method (ArgumentError)
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


def _divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def ulysses_layout_problem(args) -> Optional[str]:
    """Why ``--ds-sequence-parallel-size`` cannot run with the other flags of ``args`` (one
    sentence naming the values and what works instead), or None. Checks the heads (and query
    groups) of each tensor-parallel rank and the sequence length against the size, and refuses
    pipeline parallelism and ZeRO stage 3 (whose gradient reduction DeepSpeed does not adjust
    for Ulysses)."""
    sp = args.ds_sequence_parallel_size
    if sp == 1:
        return None
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    flag = f"--ds-sequence-parallel-size {sp}"
    if pp > 1:
        return (f"{flag} with --pipeline-model-parallel-size {pp}: DeepSpeed's pipe engine reduces "
                "gradients over the data-parallel group only, not over the sequence-data-parallel "
                "group Ulysses needs; use --pipeline-model-parallel-size 1 (with "
                "--tensor-model-parallel-size for the model's memory)")
    problems = []
    if args.zero_stage == 3:
        problems.append(f"{flag} with ZeRO stage 3: DeepSpeed's ZeRO-3 reduce-scatter averages the "
                        "gradients over the sequence-parallel ranks where they must be summed (its "
                        "stage 1/2 and stage 0 reductions sum them); use --zero-stage 1 or 2")
    heads, groups = args.num_attention_heads, args.num_query_groups or args.num_attention_heads
    if heads % tp == 0 and groups % tp == 0:
        per_rank_heads, per_rank_groups = heads // tp, groups // tp
        fits = [d for d in _divisors(per_rank_groups) if per_rank_heads % d == 0
                and args.seq_length % d == 0]
        for what, n, count in (("--num-attention-heads", heads, per_rank_heads),
                               ("--num-query-groups", groups, per_rank_groups)):
            if count % sp:
                problems.append(
                    f"{what} {n} gives {count} per tensor-parallel rank (--tensor-model-parallel-"
                    f"size {tp}), not divisible by {flag} (each sequence-parallel rank attends with "
                    f"1/{sp} of them); sizes that divide heads, query groups and --seq-length: "
                    f"{', '.join(map(str, fits))}")
    if args.seq_length % sp:
        problems.append(f"--seq-length {args.seq_length} is not divisible by {flag} (each rank "
                        "holds an equal slice of every sequence)")
    elif args.sequence_parallel and (args.seq_length // sp) % tp:
        problems.append(f"--seq-length {args.seq_length} / {flag} = {args.seq_length // sp} tokens "
                        f"per rank is not divisible by --tensor-model-parallel-size {tp} (needed by "
                        "--sequence-parallel)")
    return "; ".join(problems) or None


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
