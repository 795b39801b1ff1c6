"""The "model" flag group (``--num-layers``, ``--hidden-size``, ``--swiglu``,
``--position-embedding-type``, ``--transformer-impl``, ``--attention-backend``, ...) and its checks:
derived sizes, the rotary flags, the layer implementation, the core attention of the run, and
megatron-core's ``TransformerConfig`` (``args.transformer_config``)."""
import argparse
from typing import List

from megatron.config.compat_flags import value_alias
from megatron.errors import ArgumentError


def add_model_args(parser: argparse.ArgumentParser) -> None:
    """The "model" flag group."""
    g = parser.add_argument_group("model")
    g.add_argument("--num-layers", type=int, default=None, help="Number of transformer layers.")
    g.add_argument("--hidden-size", type=int, default=None, help="Transformer hidden size.")
    g.add_argument("--ffn-hidden-size", type=int, default=None,
                   help="MLP hidden size (default 4*hidden, or 8/3*hidden rounded to 64 with --swiglu).")
    g.add_argument("--num-attention-heads", type=int, default=None, help="Attention heads.")
    g.add_argument("--num-query-groups", type=int, default=None,
                   help="Key/value head groups for grouped-query attention (default: heads).")
    g.add_argument("--kv-channels", type=int, default=None,
                   help="Channels per attention head (default hidden/heads).")
    g.add_argument("--seq-length", type=int, default=None, help="Tokens per sample.")
    g.add_argument("--max-position-embeddings", type=int, default=None,
                   help="Largest position the model can embed (default --seq-length).")
    g.add_argument("--normalization", default="LayerNorm", choices=["LayerNorm", "RMSNorm"],
                   type=value_alias("--normalization"),
                   help="Norm layers (any case: rmsnorm, layernorm).")
    g.add_argument("--norm-epsilon", type=float, default=1e-5)
    g.add_argument("--swiglu", action="store_true", help="SwiGLU MLP instead of GeLU.")
    g.add_argument("--openai-gelu", action="store_true",
                   help="GeLU by its tanh approximation (OpenAI's GPT-2, BigScience's BLOOM) "
                        "instead of the exact erf form.")
    g.add_argument("--no-bias-gelu-fusion", action="store_false", dest="bias_gelu_fusion",
                   help="GeLU by the exact erf form instead of the tanh approximation that "
                        "Megatron-LM's bias-GeLU fusion computes (the default with biases; "
                        "megatron/model/gelu.py).")
    # Megatron-LM's kernel fusions (GPU only; same functions unfused: megatron/model/fusions.py)
    g.add_argument("--no-bias-swiglu-fusion", action="store_false", dest="bias_swiglu_fusion",
                   help="GPU: SwiGLU (and its bias) unfused instead of megatron-core's fused kernel.")
    g.add_argument("--no-bias-dropout-fusion", action="store_false", dest="bias_dropout_fusion",
                   help="GPU: bias + dropout + residual add unfused instead of megatron-core's "
                        "fused kernel.")
    g.add_argument("--no-rope-fusion", action="store_false", dest="apply_rope_fusion",
                   help="GPU: rotary embeddings unfused instead of Transformer Engine's fused "
                        "kernel (used when TE imports).")
    g.add_argument("--no-persist-layer-norm", action="store_false", dest="persist_layer_norm",
                   help="GPU: no Apex persistent LayerNorm kernel (used with Apex and "
                        "--transformer-impl local).")
    g.add_argument("--position-embedding-type", default="learned_absolute",
                   choices=["learned_absolute", "rope", "yarn", "alibi", "none"],
                   type=value_alias("--position-embedding-type"),
                   help="rope: rotary embeddings; yarn: rotary embeddings with YaRN's frequency "
                        "correction and attention factor (--rotary-scaling-factor, --yarn-*, "
                        "--mscale*); alibi: BLOOM's attention biases (no position embedding); "
                        "BigScience's rotary and absolute mean rope and learned_absolute.")
    g.add_argument("--rotary-percent", type=float, default=1.0,
                   help="Fraction of each head's channels rotated (needs rope or yarn).")
    g.add_argument("--rotary-base", type=int, default=10000,
                   help="RoPE base theta (needs rope or yarn).")
    # RoPE scaling (docs/position_encodings.md): Megatron-LM's flags, megatron-core's formulas
    g.add_argument("--rotary-seq-len-interpolation-factor", type=float, default=None,
                   help="Linear position interpolation: positions divided by this factor >= 1 "
                        "(transformers' rope_type linear; needs rope).")
    g.add_argument("--use-rope-scaling", action="store_true",
                   help="Llama 3.1's RoPE scaling (transformers' rope_type llama3: low/high "
                        "frequency factors 1 and 4, original length 8192; needs rope).")
    g.add_argument("--rope-scaling-factor", type=float, default=8.0,
                   help="Llama 3.1's RoPE scaling factor >= 1 (needs --use-rope-scaling).")
    g.add_argument("--rotary-scaling-factor", type=float, default=1.0,
                   help="YaRN's scaling factor s >= 1: the new length over the original "
                        "(needs yarn).")
    g.add_argument("--yarn-original-max-position-embeddings", type=int, default=4096,
                   help="YaRN: the length the model was trained at before the extension "
                        "(needs yarn).")
    g.add_argument("--yarn-beta-fast", type=float, default=32.0,
                   help="YaRN: rotations over the original length above which a frequency is "
                        "kept (needs yarn).")
    g.add_argument("--yarn-beta-slow", type=float, default=1.0,
                   help="YaRN: rotations over the original length below which a frequency is "
                        "divided by the scaling factor (needs yarn).")
    g.add_argument("--mscale", type=float, default=1.0,
                   help="YaRN: attention factor numerator 0.1 * mscale * ln(s) + 1 (needs yarn).")
    g.add_argument("--mscale-all-dim", type=float, default=0.0,
                   help="YaRN: attention factor denominator 0.1 * mscale_all_dim * ln(s) + 1 "
                        "(needs yarn).")
    g.add_argument("--yarn-correction-range-round-to-int", action="store_true", default=True,
                   help="YaRN: round the correction range's ends to whole channels (the "
                        "default; transformers' truncate true; needs yarn).")
    g.add_argument("--no-yarn-correction-range-round-to-int", action="store_false",
                   dest="yarn_correction_range_round_to_int",
                   help="YaRN: keep the correction range's ends fractional (transformers' "
                        "truncate false; needs yarn).")
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true",
                   help="Separate input embedding and output layer weights.")
    g.add_argument("--disable-bias-linear", action="store_true", help="No biases in linear layers.")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g.add_argument("--transformer-impl", default=None,
                   choices=["transformer_engine", "local"],
                   help="Layer implementation (default: transformer_engine when Transformer "
                        "Engine imports, else local); transformer_engine given without it is an "
                        "error.")
    g.add_argument("--attention-backend", default="auto",
                   help="Core attention: auto (default), sdpa, flex, te, or Megatron-LM's flash, fused, "
                        "unfused (Transformer Engine kernels), local (SDPA here); see docs/attention.md.")
    g.add_argument("--use-cpu-initialization", action="store_true",
                   help="Initialise weights on the CPU (always on when no GPU is present).")


def _resolve_transformer_impl(args, notes: List[str]) -> None:
    """``--transformer-impl``: the default is Transformer Engine when it imports, else local (with
    a start-up warning when TE is installed but does not import); an explicit
    transformer_engine that cannot be met is an error naming why."""
    from megatron.model import transformer_engine_support  # lazy: importlib.metadata (~20 ms), only to look for TE

    # the run's one look for Transformer Engine: the attention backend and the layer spec use it
    te = args.transformer_engine_status = transformer_engine_support.transformer_engine_status()
    if args.transformer_impl is None:
        args.transformer_impl = "transformer_engine" if te.importable else "local"
        if te.problem is not None:
            notes.append(f"warning: {te.describe_absence()}; using --transformer-impl "
                                      "local")
    elif args.transformer_impl == "transformer_engine" and not te.importable:
        raise ArgumentError(f"--transformer-impl transformer_engine: {te.describe_absence()}; "
                            "install it or give --transformer-impl local (without the flag, local "
                            "is used when Transformer Engine is absent)")


def resolve_attention_backend(args) -> None:
    """``args.resolved_attention_backend``: the core attention of this run on this machine
    (megatron/model/attention_backends.py), resolved once, here; the model builds it and logs it.
    An explicit Transformer Engine backend that cannot run (TE absent or without a GPU, a kernel
    family with none for this run's batches) is refused here, naming what runs instead. What
    FlexAttention cannot do (train on a CPU, attention dropout) is refused when a run starts
    (``check_backend_trains``, before distributed start-up), not by parsing: resolved for
    forward use, FlexAttention may evaluate on a CPU; one that cannot run at all is left
    unresolved (None) for the run to refuse."""
    from megatron.config.model_config import attention_choice_from_args  # lazy: megatron-core + deepspeed (seconds)
    from megatron.model.attention_backends import (  # lazy: ~2 ms import; --help needs none
        TE_BACKENDS,
        resolve_attention_choice,
    )

    try:
        args.resolved_attention_backend = resolve_attention_choice(
            attention_choice_from_args(args), te=args.transformer_engine_status, training=False)
    except ArgumentError:
        if args.attention_backend in TE_BACKENDS:
            raise
        args.resolved_attention_backend = None


def build_transformer_config(args) -> None:
    """``args.transformer_config``: megatron-core's ``TransformerConfig`` of the model flags,
    layout (TP, sequence parallelism), recompute and precision flags
    (megatron/config/model_config.py ``transformer_config_from_args``); the model is built from it.
    Its own checks (``ValueError`` from ``__post_init__``) are an ArgumentError here."""
    from megatron.config.model_config import transformer_config_from_args  # lazy: megatron-core + deepspeed (seconds)

    try:
        args.transformer_config = transformer_config_from_args(args)
    except ValueError as e:
        raise ArgumentError(f"megatron-core's TransformerConfig refuses the model flags (--num-layers "
                            f"{args.num_layers}, --hidden-size {args.hidden_size}, "
                            f"--num-attention-heads {args.num_attention_heads}, "
                            f"--tensor-model-parallel-size {args.tensor_model_parallel_size}, "
                            f"recompute and precision flags): {e}") from None


# Flags (argparse dests) of each position encoding: given with another, they are refused.
ROTARY_DESTS = ("rotary_percent", "rotary_base")
ROPE_SCALING_DESTS = ("rotary_seq_len_interpolation_factor", "use_rope_scaling", "rope_scaling_factor")
YARN_DESTS = ("rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast",
              "yarn_beta_slow", "mscale", "mscale_all_dim", "yarn_correction_range_round_to_int")


def _given(args, dests) -> List[str]:
    """``FLAG VALUE`` (``FLAG`` for a switch) of each of ``dests`` given on the command line."""
    out = []
    for dest in dests:
        if dest in args.given_flags:
            value = getattr(args, dest)
            out.append(args.given_flags[dest] if isinstance(value, bool) else
                       f"{args.given_flags[dest]} {value:g}")
    return out


def _refuse_unless(args, dests, allowed, what: str) -> None:
    """Refuse the flags of ``dests`` given while ``--position-embedding-type`` is not in
    ``allowed``, naming them, the type and the types that take them."""
    given = _given(args, dests)
    if given and args.position_embedding_type not in allowed:
        raise ArgumentError(f"{', '.join(given)} configure {what}, but --position-embedding-type "
                            f"is {args.position_embedding_type}; they need --position-embedding-type "
                            f"{' or '.join(allowed)}")


def _validate_rotary(args) -> None:
    """The position-encoding flags: ``--rotary-*`` need rope or yarn, the linear and Llama 3.1
    scaling flags rope, the YaRN flags yarn; each value within what megatron-core's formulas
    (and transformers' ``rope_scaling``) take."""
    _refuse_unless(args, ROTARY_DESTS, ("rope", "yarn"), "rotary position embeddings")
    _refuse_unless(args, ROPE_SCALING_DESTS, ("rope",), "RoPE scaling (YaRN scales by "
                   "--rotary-scaling-factor)")
    _refuse_unless(args, YARN_DESTS, ("yarn",), "YaRN")
    if "rope_scaling_factor" in args.given_flags and not args.use_rope_scaling:
        raise ArgumentError(f"--rope-scaling-factor {args.rope_scaling_factor:g} needs "
                            "--use-rope-scaling (Llama 3.1's RoPE scaling)")
    if args.use_rope_scaling and args.rotary_seq_len_interpolation_factor is not None:
        raise ArgumentError(f"--use-rope-scaling and --rotary-seq-len-interpolation-factor "
                            f"{args.rotary_seq_len_interpolation_factor:g}: choose one RoPE scaling "
                            "(Llama 3.1's or linear interpolation)")
    checks = [("rotary_base", args.rotary_base > 0, "a positive integer"),
              ("rotary_percent", 0.0 < args.rotary_percent <= 1.0, "in (0, 1]"),
              ("rotary_seq_len_interpolation_factor",
               args.rotary_seq_len_interpolation_factor is None
               or args.rotary_seq_len_interpolation_factor >= 1.0, ">= 1"),
              ("rope_scaling_factor", args.rope_scaling_factor >= 1.0, ">= 1"),
              ("rotary_scaling_factor", args.rotary_scaling_factor >= 1.0, ">= 1"),
              ("yarn_original_max_position_embeddings",
               args.yarn_original_max_position_embeddings >= 1, ">= 1"),
              ("yarn_beta_slow", args.yarn_beta_slow > 0, "> 0"),
              ("yarn_beta_fast", args.yarn_beta_fast > args.yarn_beta_slow,
               f"> --yarn-beta-slow {args.yarn_beta_slow:g}"),
              ("mscale", args.mscale >= 0, ">= 0"),
              ("mscale_all_dim", args.mscale_all_dim >= 0, ">= 0")]
    for dest, ok, allowed in checks:
        if not ok:
            flag = args.given_flags.get(dest, "--" + dest.replace("_", "-"))
            raise ArgumentError(f"{flag} {getattr(args, dest):g}: must be {allowed}")
    if args.position_embedding_type == "yarn" and args.rotary_percent != 1.0:
        raise ArgumentError(f"--rotary-percent {args.rotary_percent:g} with "
                            "--position-embedding-type yarn: megatron-core's YaRN rotates every "
                            "channel of each head (--rotary-percent 1)")


def validate_model(args, notes: List[str]) -> None:
    """The model flags: rotary flags, divisibility of heads and query groups, derived sizes
    (query groups, kv channels, ffn size, max positions), the attention backend's name,
    ``--transformer-impl`` and the dropouts."""
    _validate_rotary(args)
    if args.hidden_size % args.num_attention_heads:
        raise ArgumentError(f"--hidden-size {args.hidden_size} is not divisible by "
                            f"--num-attention-heads {args.num_attention_heads}")
    if args.num_query_groups is None:
        args.num_query_groups = args.num_attention_heads
    elif args.num_attention_heads % args.num_query_groups:
        raise ArgumentError(f"--num-attention-heads {args.num_attention_heads} is not divisible by "
                            f"--num-query-groups {args.num_query_groups}")
    if args.kv_channels is None:
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if args.disable_bias_linear or args.swiglu:
        # Megatron-LM's validate_args: no bias-GeLU fusion without biases (so GeLU is erf), and
        # SwiGLU has no GeLU; the recorded flag then says what the MLP computes
        args.bias_gelu_fusion = False
    if args.ffn_hidden_size is None:
        if args.swiglu:
            args.ffn_hidden_size = int((4 * args.hidden_size * 2 / 3) / 64) * 64 or 64
        else:
            args.ffn_hidden_size = 4 * args.hidden_size
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if (args.position_embedding_type == "learned_absolute"
            and args.seq_length > args.max_position_embeddings):
        raise ArgumentError(f"--seq-length {args.seq_length} exceeds --max-position-embeddings "
                            f"{args.max_position_embeddings}")
    from megatron.model.attention_backends import ATTENTION_BACKEND_CHOICES  # lazy: ~2 ms import; --help needs none

    if args.attention_backend not in ATTENTION_BACKEND_CHOICES:
        raise ArgumentError(f"--attention-backend {args.attention_backend}: unknown; choose one of "
                            f"{', '.join(ATTENTION_BACKEND_CHOICES)}")
    _resolve_transformer_impl(args, notes)
    for name in ("hidden_dropout", "attention_dropout"):
        value = getattr(args, name)
        if not 0.0 <= value < 1.0:
            raise ArgumentError(f"--{name.replace('_', '-')} {value} must be in [0, 1)")
