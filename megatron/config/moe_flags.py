"""Mixture-of-experts flags: Megatron-LM's names (megatron-core's MoE layer), Microsoft
Megatron-DeepSpeed's spellings translated onto them, and their checks (the ``TransformerConfig``
fields they set and the model's MoE summary line are megatron/model/moe.py's).

Megatron-LM's flags keep their meaning. Microsoft's spellings that mean the same thing are aliases in
megatron/config/flag_compat.py (``--topk``, ``--moe-loss-coeff``, ``--moe-expert-parallel-size``,
``--moe-train-capacity-factor``). The ones that need translating are parsed here:

- ``--num-experts E [E ...]``: one value means E experts in every MoE layer. Microsoft's per-layer
  list (PR-MoE) is accepted when all of its values are equal.
- ``--expert-interval K``: Microsoft's MoE layers are the 1-based layers divisible by K. This
  becomes the ``--moe-layer-freq`` pattern ``[(i + 1) % K == 0 for each 0-based i]``.
- ``--disable-moe-token-dropping`` and ``--moe-token-dropping``: dropless routing, or capacity
  routing.
- ``--moe-min-capacity`` and ``--moe-eval-capacity-factor``: accepted where they change nothing
  (dropless routing, or the training factor), refused otherwise.

Units: capacity factors are multiples of each expert's balanced share of one micro-batch's
tokens (tokens x top-k / experts).
"""
import argparse
import ast
from typing import List, Optional, Union

from megatron.errors import ArgumentError
from megatron.runtime.mcore_compat import legacy_grouped_gemm_available

DISPATCHERS = ("allgather", "alltoall", "flex")
LOAD_BALANCING = ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")


def add_moe_args(parser: argparse.ArgumentParser) -> None:
    """The MoE flag group (Megatron-LM's names, Microsoft's ``--expert-interval`` and its
    token-dropping switches)."""
    g = parser.add_argument_group("mixture of experts (docs/moe.md)")
    g.add_argument("--num-experts", type=int, nargs="+", default=None, action=_ExpertCounts,
                   help="Experts per MoE layer (megatron-core's MoE layer); Microsoft's per-layer "
                        "list is accepted when all its values are equal.")
    g.add_argument("--expert-model-parallel-size", type=int, default=1,
                   help="Ranks the experts of each MoE layer are split over (expert parallelism); "
                        "it divides the data-parallel size.")
    g.add_argument("--moe-router-topk", type=int, default=2, help="Experts each token is sent to.")
    g.add_argument("--moe-router-load-balancing-type", default="aux_loss", choices=LOAD_BALANCING,
                   help="aux_loss: Switch/GShard load-balancing loss per micro-batch; "
                        "seq_aux_loss: per sequence; global_aux_loss: over the global batch (GPU); "
                        "sinkhorn: Sinkhorn routing (top-1); none.")
    g.add_argument("--moe-aux-loss-coeff", type=float, default=0.0,
                   help="Weight of the load-balancing loss added to the LM loss.")
    g.add_argument("--moe-z-loss-coeff", type=float, default=None,
                   help="Weight of the router z-loss (ST-MoE), None: off.")
    g.add_argument("--moe-ffn-hidden-size", type=int, default=None,
                   help="Hidden size of each expert's MLP (default --ffn-hidden-size).")
    g.add_argument("--moe-layer-freq", default=1, type=layer_freq_value,
                   help="Which layers are MoE: N (every N-th from layer 0) or a 0/1 list, as "
                        "Megatron-LM writes it: [1,0,1,0] or ([1]*3+[0])*2.")
    g.add_argument("--moe-shared-expert-intermediate-size", type=int, default=None,
                   help="Hidden size of the shared expert every token also goes through "
                        "(DeepSeek/Qwen-MoE); None: no shared expert.")
    g.add_argument("--moe-token-dispatcher-type", default="allgather", choices=DISPATCHERS,
                   help="How tokens reach the ranks of their experts: allgather (every device), "
                        "alltoall (GPU), flex (GPU, DeepEP).")
    g.add_argument("--moe-grouped-gemm", action="store_true",
                   help="GPU: all local experts in one grouped GEMM (TE's or grouped_gemm's) "
                        "instead of one GEMM per expert.")
    g.add_argument("--moe-expert-capacity-factor", type=float, default=None,
                   help="Token dropping: each expert takes at most this factor x its balanced "
                        "share of a micro-batch's tokens; None: dropless.")
    g.add_argument("--moe-pad-expert-input-to-capacity", action="store_true",
                   help="With a capacity factor, pad every expert's input to its capacity.")
    g.add_argument("--moe-token-drop-policy", default="probs", choices=["probs", "position"],
                   help="With a capacity factor, which tokens an expert keeps: the highest router "
                        "probabilities, or the first in the sequence.")
    g.add_argument("--moe-router-pre-softmax", action="store_true",
                   help="Softmax over all experts before the top-k (the gate is then the "
                        "probability, not renormalised over the k chosen).")
    g.add_argument("--moe-router-score-function", default="softmax", choices=["softmax", "sigmoid"])
    g.add_argument("--moe-router-dtype", default=None, choices=["fp32", "fp64"],
                   help="Router logits and probabilities in this precision (default: the model's).")
    g.add_argument("--moe-input-jitter-eps", type=float, default=None,
                   help="Multiplicative uniform noise on the router input (Switch), None: off.")
    g.add_argument("--moe-per-layer-logging", action="store_true",
                   help="Also log the load-balancing loss of every MoE layer.")
    # Microsoft Megatron-DeepSpeed spellings that need translating (module docstring)
    g.add_argument("--expert-interval", type=int, default=None,
                   help="Microsoft: MoE layers are the 1-based layers divisible by this (2 in "
                        "Microsoft's scripts); the same as a --moe-layer-freq pattern.")
    g.add_argument("--disable-moe-token-dropping", action="store_true",
                   help="Microsoft: dropless routing (any --moe-train-capacity-factor is unused).")
    g.add_argument("--moe-token-dropping", action="store_true",
                   help="Microsoft forks: capacity routing, with --moe-train-capacity-factor "
                        "(default 1.0, Microsoft's).")
    g.add_argument("--moe-min-capacity", type=int, default=None,
                   help="Microsoft: minimum tokens per expert under token dropping; megatron-core "
                        "has none, so accepted where the capacity never falls below it (or "
                        "dropless), refused otherwise.")
    g.add_argument("--moe-eval-capacity-factor", type=float, default=None,
                   help="Microsoft: capacity factor at evaluation; megatron-core uses the training "
                        "one, so accepted only when equal to it or with dropless routing.")


class _ExpertCounts(argparse.Action):
    """``--num-experts``: one count is stored as an int (Megatron-LM's meaning, and what
    checkpoints record), Microsoft's per-layer list as a list."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values[0] if len(values) == 1 else list(values))


def layer_freq_value(text: Union[str, int, list]) -> Union[int, List[int]]:
    """The value of ``--moe-layer-freq``: an int, or the list that a list literal or Megatron-LM's
    ``([1]*3+[0])*2`` writes (lists, integers, ``+`` and ``*`` only: nothing else is
    evaluated). Checked against ``--num-layers`` by :func:`parse_moe_layer_freq`."""
    if isinstance(text, (int, list)):
        return text
    try:
        return _eval_list_expression(ast.parse(str(text).strip(), mode="eval").body)
    except (SyntaxError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"expected an integer or a 0/1 list such as [1,0,1,0] "
                                         f"or ([1]*3+[0])*2 ({e})") from None


def parse_moe_layer_freq(text: Union[str, int, list], num_layers: int) -> Union[int, List[int]]:
    """``--moe-layer-freq``: an int N (every N-th layer from layer 0 is MoE) or a 0/1 list of
    ``num_layers`` entries (:func:`layer_freq_value`)."""
    try:
        value = layer_freq_value(text)
    except argparse.ArgumentTypeError as e:
        raise ArgumentError(f"--moe-layer-freq {text}: {e}") from None
    if isinstance(value, int):
        if value < 1:
            raise ArgumentError(f"--moe-layer-freq {text} must be a positive integer")
        return value
    if len(value) != num_layers or any(v not in (0, 1) for v in value):
        raise ArgumentError(f"--moe-layer-freq {text}: a list needs one 0 or 1 per layer "
                            f"(--num-layers {num_layers}); got {value}")
    if not any(value):
        raise ArgumentError(f"--moe-layer-freq {text} makes no layer MoE; drop --num-experts for "
                            "a dense model")
    return value


def _eval_list_expression(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.List):
        items = [_eval_list_expression(e) for e in node.elts]
        if not all(isinstance(i, int) for i in items):
            raise ValueError("list entries must be integers")
        return items
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mult)):
        left, right = _eval_list_expression(node.left), _eval_list_expression(node.right)
        return left + right if isinstance(node.op, ast.Add) else left * right
    raise ValueError(f"{ast.dump(node)[:40]} is not a list, integer, + or *")


def describe_layer_freq(args) -> str:
    """The flag that chose the MoE layers, as given: ``--expert-interval N`` (Microsoft's) or
    ``--moe-layer-freq`` with its value."""
    if args.expert_interval is not None:
        return f"--expert-interval {args.expert_interval}"
    freq = args.moe_layer_freq
    shown = freq if isinstance(freq, int) else "[" + ",".join(str(x) for x in freq) + "]"
    return f"--moe-layer-freq {shown}"


def _recorded_model_flags(args) -> dict:
    """The model flags ``--use-checkpoint-args`` took from the checkpoint (dest -> value; empty
    without the flag)."""
    return (args.checkpoint_model_args or {}).get("model") or {}


def _num_experts(args) -> Optional[int]:
    """``args.num_experts`` as one count, None for a dense model (no flag, or Microsoft's [1])."""
    counts = args.num_experts
    if counts is None:
        return None
    if isinstance(counts, int):
        counts = [counts]
    if any(c < 1 for c in counts):
        raise ArgumentError(f"--num-experts {' '.join(map(str, counts))}: counts must be positive")
    distinct = sorted(set(c for c in counts if c > 1))
    if not distinct:
        return None  # Microsoft's default [1]: dense
    if len(distinct) > 1:
        raise ArgumentError(
            f"--num-experts {' '.join(map(str, counts))}: MoE layers with different expert counts "
            "(Microsoft's PR-MoE pyramid) are not built here; megatron-core's MoE layer has one "
            "count. Use --num-experts N with --moe-layer-freq or --expert-interval")
    return distinct[0]


def validate_moe_args(args, notes: List[str]) -> None:
    """Resolve the MoE flags in place: ``args.num_experts`` becomes one count or None,
    ``args.moe_layer_freq`` an int or a 0/1 list, Microsoft's token-dropping spellings a capacity
    factor. Layouts and devices megatron-core's MoE cannot run are refused, naming what works."""
    given = args.given_flags
    args.num_experts = _num_experts(args)
    if args.num_experts is None:
        moe_only = [f for d, f in given.items() if d.startswith("moe_") or d in (
            "expert_interval", "disable_moe_token_dropping")]
        if args.expert_model_parallel_size != 1:
            raise ArgumentError(f"--expert-model-parallel-size {args.expert_model_parallel_size} "
                                "needs --num-experts (a dense model has no experts to split)")
        if moe_only:
            notes.append(f"dense model (no --num-experts): {', '.join(moe_only)} "
                                      "have no effect")
        return
    _apply_microsoft_defaults(args, notes)
    if args.expert_interval is not None:
        if "moe_layer_freq" in given:
            raise ArgumentError("--expert-interval (Microsoft) and --moe-layer-freq both say which "
                                "layers are MoE; give one")
        if args.expert_interval < 1:
            raise ArgumentError(f"--expert-interval {args.expert_interval} must be positive")
        args.moe_layer_freq = [1 if (i + 1) % args.expert_interval == 0 else 0
                               for i in range(args.num_layers)]
        if not any(args.moe_layer_freq):
            raise ArgumentError(f"--expert-interval {args.expert_interval} exceeds --num-layers "
                                f"{args.num_layers}: no layer would be MoE")
        from megatron.model.moe import moe_layer_pattern  # lazy: the model imports megatron-core

        recorded = _recorded_model_flags(args).get("moe_layer_freq")
        if recorded is not None and moe_layer_pattern(recorded, args.num_layers) \
                != args.moe_layer_freq:
            raise ArgumentError(f"--expert-interval {args.expert_interval} makes layers "
                                f"{args.moe_layer_freq} MoE, the checkpoint's --moe-layer-freq "
                                f"{recorded} (--use-checkpoint-args); drop --expert-interval")
    else:
        args.moe_layer_freq = parse_moe_layer_freq(args.moe_layer_freq, args.num_layers)
    if not 1 <= args.moe_router_topk <= args.num_experts:
        raise ArgumentError(f"--moe-router-topk {args.moe_router_topk} must be between 1 and "
                            f"--num-experts {args.num_experts}")
    if args.moe_router_topk == 1 and not args.moe_router_pre_softmax:
        if given.get("moe_router_topk") == "--topk" or args.microsoft_moe_defaults:
            # DeepSpeed's top-1 gate (Microsoft's --topk 1) is the softmax probability
            args.moe_router_pre_softmax = True
        elif args.moe_router_load_balancing_type != "sinkhorn":
            raise ArgumentError(
                "--moe-router-topk 1 needs --moe-router-pre-softmax: a softmax over the one chosen "
                "logit is always 1, so the router would learn nothing from the LM loss")
    if args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    _resolve_token_dropping(args, notes)
    _validate_expert_layout(args)
    _validate_moe_on_device(args)
    if args.moe_grouped_gemm and args.transformer_impl == "local":
        problem = grouped_gemm_without_te_problem(legacy_grouped_gemm_available())
        if problem:
            raise ArgumentError(problem)


# Microsoft Megatron-DeepSpeed's MoE spellings: dest -> how its flag is written (an alias's dest
# is its canonical flag's, given_flags records the spelling used)
_MICROSOFT_SPELLINGS = {"moe_router_topk": "--topk", "moe_aux_loss_coeff": "--moe-loss-coeff",
                        "expert_model_parallel_size": "--moe-expert-parallel-size",
                        "moe_expert_capacity_factor": "--moe-train-capacity-factor",
                        "expert_interval": "--expert-interval",
                        "disable_moe_token_dropping": "--disable-moe-token-dropping",
                        "moe_min_capacity": "--moe-min-capacity",
                        "moe_eval_capacity_factor": "--moe-eval-capacity-factor",
                        "create_moe_param_group": "--create-moe-param-group"}


def _apply_microsoft_defaults(args, notes: List[str]) -> None:
    """A command line that spells its MoE flags as Microsoft Megatron-DeepSpeed does gets that
    project's defaults for the MoE flags it leaves out: ``--topk 1`` (DeepSpeed's top-1 gate, the
    softmax probability), ``--moe-loss-coeff 0.1``, ``--expert-interval 2`` (MoE in every second
    layer) and token dropping at ``--moe-train-capacity-factor 1.0``. So its scripts build the
    model they build there. Megatron-LM's defaults apply otherwise. A value that
    ``--use-checkpoint-args`` took from the checkpoint's ``model_args.json`` counts as given: the
    defaults never replace the model the checkpoint records."""
    given = args.given_flags
    args.microsoft_moe_defaults = any(given.get(d) == f for d, f in _MICROSOFT_SPELLINGS.items())
    if not args.microsoft_moe_defaults:
        return
    settled = set(given) | set(_recorded_model_flags(args))
    applied = []
    if "moe_router_topk" not in settled:
        args.moe_router_topk = 1
        applied.append("--topk 1")
    if "moe_aux_loss_coeff" not in settled:
        args.moe_aux_loss_coeff = 0.1
        applied.append("--moe-loss-coeff 0.1")
    if args.expert_interval is None and "moe_layer_freq" not in settled:
        args.expert_interval = 2
        applied.append("--expert-interval 2")
    if not args.disable_moe_token_dropping and "moe_expert_capacity_factor" not in settled:
        args.moe_expert_capacity_factor = 1.0
        applied.append("token dropping at --moe-train-capacity-factor 1.0")
    if applied:
        notes.append("MoE flags in Microsoft Megatron-DeepSpeed's spelling: its "
                                  f"defaults apply ({', '.join(applied)}; docs/moe.md)")


def _tokens_routed_per_micro_batch(args) -> int:
    """Tokens one router sees per micro-batch: the micro-batch's, split over the tensor-parallel
    ranks under --sequence-parallel."""
    tokens = args.micro_batch_size * args.seq_length
    return tokens // args.tensor_model_parallel_size if args.sequence_parallel else tokens


def _resolve_token_dropping(args, notes: List[str]) -> None:
    given = args.given_flags
    factor = args.moe_expert_capacity_factor
    if args.disable_moe_token_dropping and args.moe_token_dropping:
        raise ArgumentError("--disable-moe-token-dropping contradicts --moe-token-dropping")
    if args.disable_moe_token_dropping:
        factor = None  # Microsoft: the capacity factor is unused without dropping
    elif args.moe_token_dropping and factor is None:
        factor = 1.0  # Microsoft's default --moe-train-capacity-factor
    if factor is not None and factor <= 0:
        raise ArgumentError(f"--moe-expert-capacity-factor {factor} must be positive")
    args.moe_expert_capacity_factor = factor
    if args.moe_min_capacity is not None and factor is not None:
        import math

        capacity = math.ceil(_tokens_routed_per_micro_batch(args) * args.moe_router_topk
                             / args.num_experts * factor)
        if capacity < args.moe_min_capacity:
            raise ArgumentError(
                f"--moe-min-capacity {args.moe_min_capacity} exceeds the capacity of capacity "
                f"factor {factor:g} ({capacity} tokens per expert and micro-batch): "
                "megatron-core's router has no minimum capacity; raise "
                "--moe-train-capacity-factor, or route dropless (--disable-moe-token-dropping)")
    if args.moe_eval_capacity_factor is not None and factor is not None \
            and args.moe_eval_capacity_factor != factor:
        raise ArgumentError(
            f"--moe-eval-capacity-factor {args.moe_eval_capacity_factor} differs from the training "
            f"capacity factor {factor}: megatron-core evaluates with the training one; give the "
            "same value or drop the flag")
    inert = [f"{f} {getattr(args, d)}" for d, f in given.items()
             if d in ("moe_min_capacity", "moe_eval_capacity_factor")]
    if inert:
        notes.append(f"MoE capacity flags that change nothing in this run (docs/moe.md): "
                                  f"{', '.join(inert)} (the capacity never falls below the minimum; "
                                  "evaluation uses the training capacity)")
    if args.moe_pad_expert_input_to_capacity and factor is None:
        raise ArgumentError("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor "
                            "(dropless routing has no capacity to pad to)")


def _validate_expert_layout(args) -> None:
    ep = args.expert_model_parallel_size
    if ep < 1:
        raise ArgumentError(f"--expert-model-parallel-size {ep} must be positive")
    if args.num_experts % ep:
        raise ArgumentError(f"--num-experts {args.num_experts} is not divisible by "
                            f"--expert-model-parallel-size {ep}")
    dp = args.data_parallel_size
    if dp % ep:
        raise ArgumentError(
            f"--expert-model-parallel-size {ep} does not divide the data-parallel size {dp} "
            f"(world {args.world_size} / (TP {args.tensor_model_parallel_size} x PP "
            f"{args.pipeline_model_parallel_size})): expert-parallel ranks are data-parallel "
            "ranks of the dense layers")
    if ep > 1:
        if args.zero_stage is not None and args.zero_stage >= 3:
            raise ArgumentError(f"--expert-model-parallel-size {ep} with ZeRO stage "
                                f"{args.zero_stage}: experts are reduced by DeepSpeed's ZeRO 0-2 "
                                "MoE path; use ZeRO stage 1 or 2")
        if (args.save or args.load) and args.zero_stage == 0:
            raise ArgumentError(
                f"--{'save' if args.save else 'load'} with --expert-model-parallel-size {ep} and "
                "ZeRO stage 0: expert-parallel checkpoints keep their optimizer state in ZeRO's "
                "partitions; use --zero-stage 1 or 2")
    if args.ds_sequence_parallel_size > 1:
        raise ArgumentError(
            f"--num-experts with --ds-sequence-parallel-size {args.ds_sequence_parallel_size}: "
            "the router would balance each rank's slice of the sequence, not the whole sequence; "
            "use --sequence-parallel with tensor parallelism for long MoE sequences")
    if args.tensor_model_parallel_size > 1 and not args.sequence_parallel:
        raise ArgumentError(
            f"--num-experts with --tensor-model-parallel-size {args.tensor_model_parallel_size} "
            "needs --sequence-parallel (megatron-core's MoE layer routes each tensor-parallel "
            "rank's slice of the tokens)")
    if args.moe_router_load_balancing_type == "sinkhorn" and args.moe_router_topk != 1:
        raise ArgumentError(f"--moe-router-load-balancing-type sinkhorn routes top-1; got "
                            f"--moe-router-topk {args.moe_router_topk}")
    shared = args.moe_shared_expert_intermediate_size
    if shared is not None and shared % args.tensor_model_parallel_size:
        raise ArgumentError(f"--moe-shared-expert-intermediate-size {shared} is not divisible by "
                            f"--tensor-model-parallel-size {args.tensor_model_parallel_size}")
    if args.moe_ffn_hidden_size % args.tensor_model_parallel_size:
        raise ArgumentError(f"--moe-ffn-hidden-size {args.moe_ffn_hidden_size} is not divisible "
                            f"by --tensor-model-parallel-size {args.tensor_model_parallel_size}")


def grouped_gemm_without_te_problem(legacy_available: bool) -> Optional[str]:
    """Why ``--moe-grouped-gemm`` with ``--transformer-impl local`` cannot run grouped, or None:
    only megatron-core's legacy ``GroupedMLP`` groups the experts' GEMMs without Transformer
    Engine, and megatron-core 0.17+ removed it (its local experts then run one GEMM each,
    silently)."""
    if legacy_available:
        return None
    return ("--moe-grouped-gemm with --transformer-impl local: this megatron-core has no grouped "
            "GEMM without Transformer Engine (its legacy GroupedMLP was removed in 0.17; the "
            "experts would run one GEMM each); use --transformer-impl transformer_engine, or drop "
            "--moe-grouped-gemm")


def _validate_moe_on_device(args) -> None:
    """Pieces of megatron-core's MoE that need CUDA, refused without it (naming the CPU path)."""
    import torch

    if torch.cuda.is_available():
        return
    if args.moe_token_dispatcher_type != "allgather":
        raise ArgumentError(f"--moe-token-dispatcher-type {args.moe_token_dispatcher_type} needs a "
                            "GPU (megatron-core's dispatcher uses CUDA streams); use allgather")
    if args.moe_grouped_gemm:
        raise ArgumentError("--moe-grouped-gemm needs a GPU (grouped GEMM kernels); without it "
                            "each expert runs its own GEMM (megatron-core's SequentialMLP)")
    if args.moe_router_load_balancing_type == "global_aux_loss":
        raise ArgumentError("--moe-router-load-balancing-type global_aux_loss keeps its counts on "
                            "the GPU in megatron-core; use aux_loss or seq_aux_loss")
