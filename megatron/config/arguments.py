"""Command-line arguments: one parser with Megatron-LM flag names, and ``validate_args``.

Flags keep Megatron-LM's (and the BigScience Megatron-DeepSpeed fork's) names and meanings.
``validate_args`` fills derived values (data-parallel size, ffn size, the iterations of a
``--train-samples`` run, the attention backend, megatron-core's ``TransformerConfig`` ...) and
rejects impossible combinations with an :class:`ArgumentError` that names the flags and values. It
is the last writer of ``args``: only the entry points add the tokenizer and its embedding rows
(``megatron.tokenizer.tokenizer_setup(args).apply(args)``), which need the tokenizer's files.
"""
import argparse
import math
import os
from typing import Callable, List, Optional

from megatron.config import flag_compat
from megatron.errors import ArgumentError, ConfigError  # noqa: F401 (ArgumentError: raised here)
from megatron.optim.skip_step import add_skip_step_args, validate_skip_step_args
from megatron.config.moe_flags import add_moe_args, validate_moe_args
from megatron.tokenizer.flags import add_tokenizer_args


def _value_alias(flag: str) -> Callable[[str], str]:
    """argparse ``type=`` for ``flag``: another project's spelling of a value (listed in
    megatron/config/flag_compat.py VALUE_ALIASES, e.g. ``rotary``) becomes the value it means
    (``rope``), so ``choices`` are checked against the canonical values."""
    def value(text: str) -> str:
        return flag_compat.canonical_value(flag, text)

    return value


class _SwitchByValue(argparse.Action):
    """An alias that takes a value and sets a switch (``--glu-activation swiglu`` = ``--swiglu``);
    ``choices`` are the values it accepts."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)


# Aliases whose canonical value depends on other flags: parsed under their own name and resolved
# in validate_args (--use-distributed-optimizer is ZeRO stage 1 unless a stage >= 1 is given).
_ALIASES_RESOLVED_IN_VALIDATION = ("--use-distributed-optimizer",)


def _add_compat_args(parser: argparse.ArgumentParser) -> None:
    """Register every flag of megatron/config/flag_compat.py that ``parser`` does not define itself.
    An alias writes its canonical flag's destination (so alias and canonical give equal args;
    an alias of a flag the parser lacks, e.g. ``--prefixlm`` without ``--prefix-lm``, is not
    registered); inert and refused flags are parsed under their own names, with their value,
    and reported after parsing (refused: in the error; inert: in one start-up line)."""
    g = parser.add_argument_group("flags of other launch scripts (docs/compatibility.md)")
    actions = parser._option_string_actions
    for c in flag_compat.COMPAT_FLAGS:
        if c.flag in actions:
            continue
        help_text = f"{c.status}: {c.note}" + (f" Use {c.use_instead}." if c.use_instead else "")
        if c.status != "alias" or c.flag in _ALIASES_RESOLVED_IN_VALIDATION:
            if c.takes_value:
                g.add_argument(c.flag, dest=c.dest, default=None, metavar="VALUE", help=help_text)
            else:
                g.add_argument(c.flag, dest=c.dest, action="store_true", help=help_text)
            continue
        canonical, _, value = c.use_instead.partition(" ")
        target = actions.get(canonical)
        if target is None:
            continue
        common = dict(dest=target.dest, default=argparse.SUPPRESS, help=f"alias of {c.use_instead}")
        if value:  # a switch standing for FLAG VALUE
            const = target.type(value) if callable(target.type) else value
            g.add_argument(c.flag, action="store_const", const=const, **common)
        elif c.accepted_values:  # a FLAG VALUE standing for a switch
            g.add_argument(c.flag, action=_SwitchByValue, choices=c.accepted_values, **common)
        elif target.nargs == 0:  # a switch standing for a switch
            g.add_argument(c.flag, action="store_const", const=target.const, **common)
        else:
            g.add_argument(c.flag, type=target.type, choices=target.choices, nargs=target.nargs,
                           metavar=target.metavar, **common)


def _refused_flags(args) -> List[str]:
    """One message per refused flag of megatron/config/flag_compat.py on the command line (a value in
    its ``inert_values``, e.g. ``--ds-sequence-parallel-size 1``, is accepted)."""
    problems = []
    for c in flag_compat.COMPAT_FLAGS:
        if c.status != "refused" or c.dest not in args.given_flags:
            continue
        value = getattr(args, c.dest)
        if c.takes_value and value in c.inert_values:
            continue
        given = c.flag + (f" {value}" if c.takes_value else "")
        problems.append(f"{given} is not supported: {c.note}"
                        + (f" Use {c.use_instead} instead" if c.use_instead else " Drop the flag"))
    return problems


def _inert_flags(args) -> List[str]:
    """The accepted-but-inert flags of megatron/config/flag_compat.py on the command line, as given
    (``--data-impl mmap``), in command-line order."""
    out = []
    for dest, flag in args.given_flags.items():
        c = flag_compat.compat_flag(flag)
        if c is None or c.status == "alias":
            continue
        value = getattr(args, dest)
        if c.status == "inert" or (c.takes_value and value in c.inert_values):
            out.append(flag + (f" {value}" if c.takes_value else ""))
    return out


def _add_model_args(parser: argparse.ArgumentParser) -> None:
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
                   type=_value_alias("--normalization"),
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
                   choices=["learned_absolute", "rope", "alibi", "none"],
                   type=_value_alias("--position-embedding-type"),
                   help="alibi: BLOOM's attention biases (no position embedding); BigScience's "
                        "rotary and absolute mean rope and learned_absolute.")
    g.add_argument("--rotary-percent", type=float, default=1.0,
                   help="Fraction of each head's channels rotated (needs rope).")
    g.add_argument("--rotary-base", type=int, default=10000, help="RoPE base (needs rope).")
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


def _add_training_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, default=None, help="Samples per rank per forward.")
    g.add_argument("--global-batch-size", type=int, default=None,
                   help="Samples per optimizer step (default micro batch x data-parallel size).")
    g.add_argument("--rampup-batch-size", nargs=3, default=None, metavar=("START", "INCR", "SAMPLES"),
                   help="Grow the global batch from START by INCR over SAMPLES consumed samples.")
    g.add_argument("--step-batch-size-schedule", default=None, metavar="'TOKENS:BATCH ...'",
                   help="Megatron-LM's step-wise global batch: 'T0:B0 T1:B1 ...' switches to "
                        "batch Bi once Ti tokens (Ti // --seq-length samples) are consumed; "
                        "K/M/B/T suffixes (1e3..1e12); T0 must be 0; the last batch is the "
                        "global batch size.")
    g.add_argument("--train-iters", type=int, default=None, help="Total optimizer steps.")
    g.add_argument("--train-samples", type=int, default=None, help="Total training samples.")
    g.add_argument("--optimizer", default="adam", choices=["adam", "sgd", "adafactor"])
    g.add_argument("--lr", type=float, default=None, help="Peak learning rate.")
    g.add_argument("--min-lr", type=float, default=0.0, help="Learning rate floor after decay.")
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--clip-grad", type=float, default=1.0, help="Gradient-norm clip (0 disables).")
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--adam-eps", type=float, default=1e-8)
    g.add_argument("--sgd-momentum", type=float, default=0.9)
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--bf16", action="store_true", help="bfloat16 mixed precision.")
    g.add_argument("--fp16", action="store_true", help="float16 mixed precision (loss scaling).")
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true",
                   help="Accumulate gradients over micro batches and all-reduce them over "
                        "data-parallel ranks in fp32 (the default under --bf16; off under "
                        "--fp16 unless given). docs/precision.md.")
    g.add_argument("--grad-reduce-in-bf16", action="store_true",
                   help="Under --bf16, accumulate and all-reduce gradients in bf16 instead of "
                        "fp32. docs/precision.md.")
    g.add_argument("--loss-scale", type=float, default=None,
                   help="Static fp16 loss scale (default dynamic); DeepSpeed fp16.loss_scale.")
    g.add_argument("--initial-loss-scale", type=float, default=None,
                   help="Initial dynamic fp16 loss scale, a power of 2 (DeepSpeed "
                        "fp16.initial_scale_power = log2; default the JSON's, else DeepSpeed's "
                        "2**16).")
    g.add_argument("--min-loss-scale", type=float, default=None,
                   help="Floor of the dynamic fp16 loss scale (DeepSpeed fp16.min_loss_scale; "
                        "default the JSON's, else 1).")
    g.add_argument("--loss-scale-window", type=int, default=None,
                   help="Overflow-free iterations before the dynamic loss scale doubles "
                        "(DeepSpeed fp16.loss_scale_window; default the JSON's, else 1000).")
    g.add_argument("--hysteresis", type=int, default=None,
                   help="Overflows tolerated before the dynamic loss scale halves (DeepSpeed "
                        "fp16.hysteresis; default the JSON's, else 2).")
    g.add_argument("--log-interval", type=int, default=100, help="Iterations between log lines.")
    g.add_argument("--eval-interval", type=int, default=1000, help="Iterations between evaluations.")
    g.add_argument("--eval-iters", type=int, default=100,
                   help="Global batches per evaluation of each validation set (0 disables).")
    g.add_argument("--exit-interval", type=int, default=None,
                   help="Stop (after saving) when the iteration is a multiple of this.")
    g.add_argument("--skip-train", action="store_true", help="Only evaluate.")
    g.add_argument("--exit-signal-handler", action="store_true",
                   help="On SIGTERM (or SIGINT), finish the iteration, save a checkpoint, exit 0.")
    g.add_argument("--exit-duration-in-mins", type=float, default=None,
                   help="Save and exit once training has run this many minutes.")
    g.add_argument("--calculate-per-token-loss", action="store_true",
                   help="Megatron-LM's flag: the loss is the sum of the masked token losses of the "
                        "global batch over its loss tokens (not the mean of each micro batch's "
                        "mean), so loss and gradient do not depend on the micro-batch size, the "
                        "accumulation steps or the data-parallel size. docs/objective.md.")
    g.add_argument("--calculate-per-sample-loss", action="store_true",
                   help="The loss is each sample's token mean (each segment's, in packed T0 "
                        "samples) averaged over the global batch: every sample counts once "
                        "whatever its length, independent of the batch split. docs/objective.md.")


def _add_lr_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("learning rate and weight decay schedule")
    g.add_argument("--lr-decay-style", default="linear",
                   choices=["constant", "linear", "cosine", "inverse-square-root", "WSD", "power"],
                   help="LR shape after warmup; 'power' is the Power Scheduler (arXiv:2408.13359): "
                        "lr = min(--lr, batch_size * a * tokens^b).")
    g.add_argument("--lr-decay-iters", type=int, default=None,
                   help="Iterations to decay over (default --train-iters).")
    g.add_argument("--lr-decay-samples", type=int, default=None,
                   help="Samples to decay over (default --train-samples).")
    g.add_argument("--lr-decay-tokens", type=int, default=None,
                   help="BigScience alias: tokens to decay over (converted to samples).")
    g.add_argument("--lr-warmup-fraction", type=float, default=None,
                   help="Warmup as a fraction of the decay span.")
    g.add_argument("--lr-warmup-iters", type=int, default=0)
    g.add_argument("--lr-warmup-samples", type=int, default=0)
    g.add_argument("--lr-warmup-tokens", type=int, default=None,
                   help="BigScience alias: warmup tokens (converted to samples).")
    g.add_argument("--lr-warmup-init", type=float, default=0.0, help="Learning rate at step 0.")
    g.add_argument("--lr-wsd-decay-style", default="exponential",
                   choices=["exponential", "linear", "cosine", "minus_sqrt"])
    g.add_argument("--lr-wsd-decay-iters", type=int, default=None)
    g.add_argument("--lr-wsd-decay-samples", type=int, default=None)
    g.add_argument("--power-scheduler-a", type=float, default=4.6,
                   help="Power Scheduler amplitude a in lr = min(--lr, batch * a * tokens^b).")
    g.add_argument("--power-scheduler-b", type=float, default=-0.51,
                   help="Power Scheduler exponent b in lr = min(--lr, batch * a * tokens^b).")
    g.add_argument("--power-scheduler-decay-iters", type=int, default=None,
                   help="Power Scheduler: final decay phase over the last N iterations before the "
                        "decay end (--lr-decay-* or end of training); default: no decay phase.")
    g.add_argument("--power-scheduler-decay-samples", type=int, default=None,
                   help="Power Scheduler: final decay phase length in samples.")
    g.add_argument("--power-scheduler-decay-tokens", type=int, default=None,
                   help="Power Scheduler: final decay phase length in tokens.")
    g.add_argument("--power-scheduler-decay-style", default="exponential",
                   choices=["exponential", "linear"],
                   help="Power Scheduler: shape of the final decay down to --min-lr.")
    g.add_argument("--lr-schedule-config", default=None, metavar="FILE",
                   help="YAML/JSON file with 'lr_schedule' (any registered schedule kind or a "
                        "staged list) and optional 'weight_decay_schedule'; replaces the LR "
                        "shape flags. See docs/schedules.md.")
    g.add_argument("--start-weight-decay", type=float, default=None)
    g.add_argument("--end-weight-decay", type=float, default=None)
    g.add_argument("--weight-decay-incr-style", default="constant",
                   choices=["constant", "linear", "cosine"])
    g.add_argument("--override-opt_param-scheduler", "--override-lr-scheduler",
                   dest="override_opt_param_scheduler", action="store_true",
                   help="Use these flags' schedule values, ignoring the checkpoint's.")
    g.add_argument("--use-checkpoint-opt_param-scheduler", "--use-checkpoint-lr-scheduler",
                   dest="use_checkpoint_opt_param_scheduler", action="store_true",
                   help="Use the checkpoint's schedule values, ignoring these flags.")


def _add_data_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("data")
    g.add_argument("--data-path", nargs="*", default=None,
                   help="[WEIGHT] PREFIX ...: a static blend split by --split.")
    g.add_argument("--split", default="969,30,1",
                   help="Train/valid/test proportions of --data-path documents, e.g. 969,30,1.")
    g.add_argument("--train-data-path", nargs="*", default=None)
    g.add_argument("--valid-data-path", nargs="*", default=None)
    g.add_argument("--test-data-path", nargs="*", default=None)
    g.add_argument("--data-blend-config", default=None, metavar="FILE",
                   help="YAML/JSON blend file: per split a blend / epochized_blend / sequential "
                        "stages, weights may be schedules; named valid/test groups "
                        "(see docs/curriculum.md).")
    for split in ("train", "valid", "test"):
        g.add_argument(f"--{split}-weighted-split-paths", nargs="*", default=None,
                       help='BigScience groups, one per argument: "NAME: WEIGHT START:END PREFIX, ..."'
                            + (" (each group evaluated and logged on its own)" if split != "train" else ""))
        g.add_argument(f"--{split}-weighted-split-paths-path", default=None, metavar="FILE",
                       help=f"File with the --{split}-weighted-split-paths text (quoted groups on one "
                            "line, as BigScience's xP3 files, or one group per line).")
    g.add_argument("--data-cache-path", default=None, help="Directory for dataset index caches.")
    g.add_argument("--override-data-mix", action="store_true",
                   help="With --load: continue under this run's training data mix when it differs "
                        "from the checkpoint's (weights, datasets, stages); every dataset continues "
                        "at its position in the checkpoint's data ledger. Without it an edited mix "
                        "is an error listing the changes. See docs/curriculum.md.")
    g.add_argument("--phase-transition-iterations", nargs="+", default=None, metavar="N",
                   help="Megatron-LM's flag: save a checkpoint and exit (status 0) at each of these "
                        "iterations ('1000,5000' or '1000 5000'), so the next phase's data mix is "
                        "given at the relaunch (with --override-data-mix).")
    g.add_argument("--dataset-loss-weights", nargs="+", default=None, metavar="NAME=WEIGHT",
                   help="Loss weight of a training dataset (its short name in the per-dataset "
                        "losses), apart from how often it is sampled: its tokens' loss weights are "
                        "multiplied before the loss is normalised (a blend file may give "
                        "loss_weight per entry instead). docs/objective.md.")
    g.add_argument("--num-workers", type=int, default=0, help="DataLoader worker processes.")
    g.add_argument("--reset-position-ids", action="store_true")
    g.add_argument("--reset-attention-mask", action="store_true")
    g.add_argument("--eod-mask-loss", action="store_true")


def _add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("checkpointing")
    g.add_argument("--save", default=None, help="Directory to save checkpoints to.")
    g.add_argument("--save-interval", type=int, default=None, help="Iterations between saves.")
    g.add_argument("--load", default=None, help="Directory to resume from.")
    g.add_argument("--finetune", action="store_true",
                   help="Load model weights only; reset iteration, optimizer and scheduler.")
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--universal-checkpoint", action="store_true",
                   help="BigScience's flag: load --load through the layout-independent path "
                        "(megatron/checkpoint/reshard.py) even on the layout it was saved with. "
                        "A checkpoint of another TP/PP/DP size or ZeRO stage takes that path "
                        "without the flag.")
    g.add_argument("--use-checkpoint-args", action="store_true",
                   help="Take the model and tokenizer flags from the model_args.json of the "
                        "checkpoint in --load; flags given that disagree with it are an error "
                        "(megatron/checkpoint/model_args.py).")


def _add_logging_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("logging")
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--metrics-jsonl", default=None,
                   help="Append one JSON record per log interval and per evaluation.")
    g.add_argument("--log-batch-size-to-tensorboard", action="store_true",
                   help="TensorBoard scalar train/global_batch_size (samples per iteration).")
    g.add_argument("--log-timers-to-tensorboard", action="store_true",
                   help="TensorBoard scalar train/ms_per_iteration (wall time per iteration).")
    g.add_argument("--wandb-project", default=None,
                   help="Log to a Weights & Biases run in this project (rank 0, the rank that "
                        "writes --metrics-jsonl and TensorBoard; needs pip install '.[wandb]'). "
                        "WANDB_MODE=offline logs without an account.")
    g.add_argument("--wandb-exp-name", default=None,
                   help="Name of the W&B run (Megatron-LM's flag; also --wandb-name). "
                        "A resume under another name starts a new run.")
    g.add_argument("--wandb-save-dir", default=None,
                   help="Directory for the W&B run's local files (default --save/wandb).")


def _add_parallel_args(parser: argparse.ArgumentParser) -> None:
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


def _add_run_control_args(parser: argparse.ArgumentParser) -> None:
    """When training runs and stops (BigScience / Microsoft Megatron-DeepSpeed flags; see
    megatron/train/run_control.py)."""
    from megatron.train.run_control import parse_bool_value

    g = parser.add_argument_group("run control (BigScience / Microsoft Megatron-DeepSpeed)")
    g.add_argument("--train-tokens", type=int, default=None,
                   help="Microsoft: stop after the first iteration whose consumed tokens (samples x "
                        "--seq-length) reach this, or at --train-iters/--train-samples if earlier; "
                        "schedules that run to the end of training end at the budget.")
    g.add_argument("--kill-switch-path", "--kill-switch-file", dest="kill_switch_path",
                   default=None, metavar="FILE",
                   help="BigScience: when FILE exists, every rank saves a checkpoint after the same "
                        "iteration and exits 0; present at start-up, the run exits at once.")
    g.add_argument("--eval-only", dest="skip_train", nargs="?", const=True, default=False,
                   type=parse_bool_value, metavar="BOOL",
                   help="BigScience's form of --skip-train (also as --eval-only True): evaluate "
                        "the loaded model on the validation and test sets, then exit.")
    g.add_argument("--reset-progress", "--reset-iteration", dest="reset_progress",
                   action="store_true",
                   help="With --load: keep the model and optimizer state but start iteration, "
                        "consumed samples and the LR/WD schedule at 0 (the schedule follows this "
                        "run's flags from its start).")


def _add_bloom_model_args(parser: argparse.ArgumentParser) -> None:
    """BLOOM's architecture flags (BigScience Megatron-DeepSpeed)."""
    g = parser.add_argument_group("BLOOM architecture")
    g.add_argument("--embed-layernorm", action="store_true",
                   help="LayerNorm right after the word embeddings (BLOOM's "
                        "word_embeddings_layernorm).")
    g.add_argument("--pad-vocab-size-to", type=int, default=None, metavar="N",
                   help="Pad the vocabulary to exactly N embedding rows (N >= the tokenizer's "
                        "vocabulary, divisible by --tensor-model-parallel-size) instead of "
                        "rounding up to --make-vocab-size-divisible-by x TP.")


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line (``error: MESSAGE (see PROG --help)``, exit
    status 2, no usage block) and that reports every unknown flag and every bad value of one
    command line together instead of stopping at the first."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._bad_values: List[str] = []
        self._given: dict = {}

    def _get_values(self, action, arg_strings):
        if action.option_strings:  # the flag is on the command line
            self._given[action.dest] = action.option_strings[0]
        return super()._get_values(action, arg_strings)

    def parse_known_args(self, args=None, namespace=None):
        """argparse's, plus ``namespace.given_flags``: ``{dest: flag}`` for every flag on the
        command line (as registered: an alias under its own name), in command-line order, so
        validation can tell a value given from a default."""
        self._given = {}
        namespace, unknown = super().parse_known_args(args, namespace)
        namespace.given_flags = dict(self._given)
        return namespace, unknown

    def _get_value(self, action, arg_string):
        try:
            return super()._get_value(action, arg_string)
        except argparse.ArgumentError as e:  # e.g. "argument --lr: invalid float value: 'x'"
            self._bad_values.append(str(e))
            return None

    def _check_value(self, action, value):
        if value is None and self._bad_values:  # its conversion failed; reported already
            return
        try:
            super()._check_value(action, value)
        except argparse.ArgumentError as e:  # "argument --x: invalid choice: ..."
            self._bad_values.append(str(e))

    def parse_args(self, args=None, namespace=None):
        namespace, problems, _ = self.parse_collecting(args, namespace)
        if problems:
            self._fail(problems)
        return namespace

    def parse_collecting(self, args=None, namespace=None):
        """Parse without exiting on unknown flags, bad values or refused flags: returns
        ``(namespace, problems, values_ok)``, ``values_ok`` False when a value did not convert
        (its destination then holds None)."""
        self._bad_values = []
        namespace, unknown = self.parse_known_args(args, namespace)
        problems = ([f"unrecognized arguments: {' '.join(unknown)}"] if unknown else []) \
            + self._bad_values + _refused_flags(namespace)
        return namespace, problems, not self._bad_values

    def error(self, message):
        """argparse's own errors (missing value, missing required flag), with the bad values
        collected before it."""
        self._fail(self._bad_values + [message])

    def _fail(self, problems: List[str]):
        from megatron.errors import EXIT_FLAG_ERROR, exit_with_error

        exit_with_error(f"{'; '.join(problems)} (see {self.prog} --help)", EXIT_FLAG_ERROR)


def get_parser(extra_args_provider: Optional[Callable] = None,
               deepspeed_args: bool = True) -> argparse.ArgumentParser:
    """The full parser; ``extra_args_provider(parser)`` adds a script's own flags.
    ``deepspeed_args=False`` leaves out DeepSpeed's flags (and its slow import) for tools that
    build no engine; such a tool must define ``--deepspeed_config`` itself."""
    parser = _Parser(
        description="Megatron-DeepSpeed GPT training", allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for add in (_add_model_args, _add_training_args, _add_lr_args, _add_data_args,
                add_tokenizer_args, _add_checkpoint_args, _add_logging_args, _add_parallel_args,
                _add_run_control_args, _add_bloom_model_args, add_skip_step_args, add_moe_args):
        add(parser)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser) or parser
    if deepspeed_args:
        import deepspeed

        parser = deepspeed.add_config_arguments(parser)
    _add_compat_args(parser)
    return parser


def parse_args(argv: Optional[List[str]] = None, extra_args_provider: Optional[Callable] = None,
               world_size: Optional[int] = None, require_data: bool = True) -> argparse.Namespace:
    """Parse ``argv`` (default ``sys.argv``) and validate for ``world_size`` ranks
    (default ``$WORLD_SIZE`` or 1). Bad flags exit with status 2 and one line naming all of
    them (megatron.errors.exit_with_error)."""
    import sys

    from megatron.checkpoint.model_args import apply_checkpoint_args

    parser = get_parser(extra_args_provider)
    args, problems, values_ok = parser.parse_collecting(argv)
    if world_size is None:
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if values_ok:  # every value converted: validation adds its problems to the same one line
        try:
            apply_checkpoint_args(args, parser, sys.argv[1:] if argv is None else list(argv))
            validate_args(args, world_size, require_data)
        except ArgumentError as e:
            problems.append(str(e))
    if problems:
        parser._fail(problems)
    return args


def _require(args, *names: str) -> None:
    missing = [n for n in names if getattr(args, n) is None]
    if missing:
        flags = ", ".join("--" + n.replace("_", "-") for n in missing)
        raise ArgumentError(f"missing required flag(s): {flags}")


def _load_deepspeed_json(args) -> None:
    """``args.deepspeed_config_dict``: the ``--deepspeed_config`` JSON (None without the flag)."""
    from megatron.config.deepspeed_config import load_deepspeed_json

    args.deepspeed_config_dict = None
    if args.deepspeed_config is not None:
        try:
            args.deepspeed_config_dict = load_deepspeed_json(args.deepspeed_config)
        except ConfigError as e:
            raise ArgumentError(str(e)) from None


def _validate_step_batch_size_schedule(args, per_step: int) -> None:
    """``--step-batch-size-schedule`` into ``args.batch_size_steps`` ``[[samples, batch], ...]``;
    its last batch is the global batch size (megatron-core's calculator ignores
    ``--global-batch-size`` here; a different one given is refused, not ignored)."""
    from megatron.schedules.units import parse_step_batch_size_schedule

    text = args.step_batch_size_schedule
    if args.rampup_batch_size is not None:
        raise ArgumentError(f"--step-batch-size-schedule '{text}' and --rampup-batch-size "
                            f"{' '.join(str(x) for x in args.rampup_batch_size)} are mutually "
                            "exclusive; give one batch schedule")
    try:
        steps = parse_step_batch_size_schedule(text, args.seq_length)
    except ValueError as e:
        raise ArgumentError(f"--step-batch-size-schedule '{text}': {e}") from None
    bad = [str(b) for _, b in steps if b % per_step]
    if bad:
        raise ArgumentError(f"--step-batch-size-schedule '{text}': batch sizes {', '.join(bad)} "
                            f"are not multiples of --micro-batch-size {args.micro_batch_size} x "
                            f"data-parallel size {args.data_parallel_size} (= {per_step})")
    final = steps[-1][1]
    if args.global_batch_size is not None and args.global_batch_size != final:
        raise ArgumentError(f"--global-batch-size {args.global_batch_size} disagrees with "
                            f"--step-batch-size-schedule '{text}', whose last batch is {final}; "
                            "drop --global-batch-size")
    args.global_batch_size = final
    args.batch_size_steps = [list(step) for step in steps]


def _validate_batch(args, world_size: int) -> None:
    from megatron.config.deepspeed_config import global_batch_from_json

    _validate_layout_sizes(args, world_size)
    per_step = args.micro_batch_size * args.data_parallel_size
    args.batch_size_steps = None
    if args.step_batch_size_schedule is not None:
        _validate_step_batch_size_schedule(args, per_step)
    if args.global_batch_size is None and args.deepspeed_config_dict:
        args.global_batch_size = global_batch_from_json(args, args.deepspeed_config_dict)
        if args.global_batch_size is not None:
            args.startup_notes.append(f"--global-batch-size {args.global_batch_size} from "
                                      f"--deepspeed_config {args.deepspeed_config}")
    if args.global_batch_size is None:
        args.global_batch_size = per_step
    if args.micro_batch_size <= 0 or args.global_batch_size <= 0:
        raise ArgumentError(
            f"--micro-batch-size {args.micro_batch_size} and --global-batch-size "
            f"{args.global_batch_size} must be positive")
    if args.global_batch_size % per_step:
        raise ArgumentError(
            f"--global-batch-size {args.global_batch_size} is not divisible by --micro-batch-size "
            f"{args.micro_batch_size} x data-parallel size {args.data_parallel_size} (= {per_step})")
    if args.rampup_batch_size is not None:
        try:
            start, incr, samples = (int(x) for x in args.rampup_batch_size)
        except ValueError:
            raise ArgumentError(
                f"--rampup-batch-size {' '.join(args.rampup_batch_size)}: expected three integers "
                "START INCR SAMPLES") from None
        if start <= 0 or incr <= 0 or samples < 0:
            raise ArgumentError(f"--rampup-batch-size {start} {incr} {samples}: START and INCR must "
                                "be positive and SAMPLES non-negative")
        if start > args.global_batch_size or (args.global_batch_size - start) % incr:
            raise ArgumentError(
                f"--rampup-batch-size {start} {incr} {samples}: --global-batch-size "
                f"{args.global_batch_size} minus START must be a non-negative multiple of INCR")
        if start % per_step or incr % per_step:
            raise ArgumentError(
                f"--rampup-batch-size {start} {incr} {samples}: START and INCR must be multiples of "
                f"--micro-batch-size x data-parallel size (= {per_step})")
        args.rampup_batch_size = [start, incr, samples]
    args.gradient_accumulation_steps = args.global_batch_size // per_step


def _validate_layout_sizes(args, world_size: int) -> None:
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


def _validate_layout(args) -> None:
    """Layouts megatron-core or DeepSpeed cannot run, refused with the values named; recompute
    flags resolved to Megatron-LM's three."""
    from megatron.parallel.recompute import resolve_recompute_flags

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
    from megatron.parallel.ulysses import ulysses_layout_problem

    problem = ulysses_layout_problem(args)
    if problem:
        raise ArgumentError(problem)
    from megatron.model.gpt_model_pipe import partition_method_from_args

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
        zero = args.zero_stage  # the JSON's stage when no --zero-stage (_validate_deepspeed_config)
        if zero is not None and zero >= 2:
            from_flag = "zero_stage" in args.given_flags or not args.deepspeed_config_dict
            where = ("--zero-stage" if from_flag
                     else f"--deepspeed_config {args.deepspeed_config} zero_optimization.stage")
            raise ArgumentError(f"{where} {zero} with --pipeline-model-parallel-size {pp}: "
                                "DeepSpeed's pipe engine supports ZeRO stage 0 or 1 only")
    if args.checkpoint_num_layers < 1:
        raise ArgumentError(f"--checkpoint-num-layers {args.checkpoint_num_layers} must be positive")
    resolve_recompute_flags(args)


def _resolve_transformer_impl(args) -> None:
    """``--transformer-impl``: the default is Transformer Engine when it imports, else local (with
    a start-up warning when TE is installed but does not import); an explicit
    transformer_engine that cannot be met is an error naming why."""
    from megatron.model import transformer_engine_support

    # the run's one look for Transformer Engine: the attention backend and the layer spec use it
    te = args.transformer_engine_status = transformer_engine_support.transformer_engine_status()
    if args.transformer_impl is None:
        args.transformer_impl = "transformer_engine" if te.importable else "local"
        if te.problem is not None:
            args.startup_notes.append(f"warning: {te.describe_absence()}; using --transformer-impl "
                                      "local")
    elif args.transformer_impl == "transformer_engine" and not te.importable:
        raise ArgumentError(f"--transformer-impl transformer_engine: {te.describe_absence()}; "
                            "install it or give --transformer-impl local (without the flag, local "
                            "is used when Transformer Engine is absent)")


def _resolve_attention_backend(args) -> None:
    """``args.resolved_attention_backend``: the core attention of this run on this machine
    (megatron/model/attention_backends.py), resolved once, here; the model builds it and logs it.
    An explicit Transformer Engine backend that cannot run (TE absent or without a GPU, a kernel
    family with none for this run's batches) is refused here, naming what runs instead. What
    FlexAttention cannot do (train on a CPU, attention dropout) is refused when a run starts
    (``check_backend_trains``, before distributed start-up), not by parsing: resolved for
    forward use, FlexAttention may evaluate on a CPU; one that cannot run at all is left
    unresolved (None) for the run to refuse."""
    from megatron.model.attention_backends import TE_BACKENDS, resolve_attention_backend_from_args

    try:
        args.resolved_attention_backend = resolve_attention_backend_from_args(
            args, te=args.transformer_engine_status, training=False)
    except ArgumentError:
        if args.attention_backend in TE_BACKENDS:
            raise
        args.resolved_attention_backend = None


def _build_transformer_config(args) -> None:
    """``args.transformer_config``: megatron-core's ``TransformerConfig`` of the model flags,
    layout (TP, sequence parallelism), recompute and precision flags
    (megatron/model/gpt_model.py ``transformer_config_from_args``); the model is built from it.
    Its own checks (``ValueError`` from ``__post_init__``) are an ArgumentError here."""
    from megatron.model.gpt_model import transformer_config_from_args

    try:
        args.transformer_config = transformer_config_from_args(args)
    except ValueError as e:
        raise ArgumentError(f"megatron-core's TransformerConfig refuses the model flags (--num-layers "
                            f"{args.num_layers}, --hidden-size {args.hidden_size}, "
                            f"--num-attention-heads {args.num_attention_heads}, "
                            f"--tensor-model-parallel-size {args.tensor_model_parallel_size}, "
                            f"recompute and precision flags): {e}") from None


def _derive_train_iters(args) -> None:
    """``args.train_iters`` of a ``--train-samples`` run: the whole global batches that fit
    (megatron/schedules/units.py ``train_iterations_from_args``, rampup aware), after the
    ``--train-tokens`` budget; ``--train-iters`` runs keep theirs. Derived last, so the checks
    above still tell an iteration-based run (``--train-iters`` given) from a sample-based one."""
    from megatron.schedules.units import batch_schedule_from_args, train_iterations_from_args

    args.train_iters = train_iterations_from_args(args, batch_schedule_from_args(args))


def _validate_rotary(args) -> None:
    """``--rotary-*`` flags (or their aliases) configure RoPE; without it they are an error."""
    if args.position_embedding_type == "rope":
        return
    given = [f"{args.given_flags[d]} {getattr(args, d):g}" for d in ("rotary_percent", "rotary_base")
             if d in args.given_flags]
    if given:
        raise ArgumentError(f"{', '.join(given)} configure rotary position embeddings, but "
                            f"--position-embedding-type is {args.position_embedding_type}; add "
                            "--position-embedding-type rope or drop them")


def _validate_model(args) -> None:
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
    from megatron.model.attention_backends import ATTENTION_BACKEND_CHOICES

    if args.attention_backend not in ATTENTION_BACKEND_CHOICES:
        raise ArgumentError(f"--attention-backend {args.attention_backend}: unknown; choose one of "
                            f"{', '.join(ATTENTION_BACKEND_CHOICES)}")
    _resolve_transformer_impl(args)
    for name in ("hidden_dropout", "attention_dropout"):
        value = getattr(args, name)
        if not 0.0 <= value < 1.0:
            raise ArgumentError(f"--{name.replace('_', '-')} {value} must be in [0, 1)")


def _validate_training(args) -> None:
    if args.fp16 and args.bf16:
        raise ArgumentError("--fp16 and --bf16 are mutually exclusive; pick one")
    if args.train_iters is not None and args.train_samples is not None:
        raise ArgumentError(f"--train-iters {args.train_iters} and --train-samples "
                            f"{args.train_samples} are mutually exclusive; pick one")
    if args.train_iters is None and args.train_samples is None:
        raise ArgumentError("one of --train-iters or --train-samples is required")
    for name in ("train_iters", "train_samples"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ArgumentError(f"--{name.replace('_', '-')} {value} must be non-negative")
    if args.lr is None:
        raise ArgumentError("--lr is required")
    if args.lr < 0 or args.min_lr < 0:
        raise ArgumentError(f"--lr {args.lr} and --min-lr {args.min_lr} must be non-negative")
    if args.min_lr > args.lr:
        raise ArgumentError(f"--min-lr {args.min_lr} is above --lr {args.lr}")
    for name in ("log_interval", "eval_interval"):
        if getattr(args, name) <= 0:
            raise ArgumentError(f"--{name.replace('_', '-')} {getattr(args, name)} must be positive")
    if args.eval_iters < 0:
        raise ArgumentError(f"--eval-iters {args.eval_iters} must be non-negative")
    if args.save_interval is not None and args.save_interval <= 0:
        raise ArgumentError(f"--save-interval {args.save_interval} must be positive")
    if args.save_interval is not None and args.save is None:
        args.startup_notes.append(f"warning: --save-interval {args.save_interval} without --save: "
                                  "no checkpoints will be saved")
    _validate_phase_transitions(args)
    if args.calculate_per_token_loss and args.calculate_per_sample_loss:
        raise ArgumentError("--calculate-per-token-loss and --calculate-per-sample-loss are "
                            "mutually exclusive: the loss is averaged over tokens or over samples")


def _validate_phase_transitions(args) -> None:
    """``--phase-transition-iterations``: Megatron-LM's comma-separated list (or one number per
    argument) -> sorted distinct positive iterations."""
    texts = args.phase_transition_iterations
    if not texts:
        args.phase_transition_iterations = None
        return
    values = []
    for text in texts:
        for part in str(text).split(","):
            if not part.strip():
                continue
            try:
                value = int(part.strip())
            except ValueError:
                raise ArgumentError(f"--phase-transition-iterations: {part.strip()!r} is not an "
                                    "iteration number (give e.g. 1000,5000)") from None
            if value <= 0:
                raise ArgumentError(f"--phase-transition-iterations: iteration {value} must be "
                                    "positive")
            values.append(value)
    args.phase_transition_iterations = sorted(set(values))
    if args.save is None:
        args.startup_notes.append("warning: --phase-transition-iterations without --save: the run "
                                  "exits at each phase end without a checkpoint to continue from")


_FINITE_LR_FLAGS = ("lr", "min_lr", "lr_warmup_init", "lr_warmup_fraction", "weight_decay",
                    "start_weight_decay", "end_weight_decay", "power_scheduler_a",
                    "power_scheduler_b")


def _given_flags(args, *dests: str) -> List[str]:
    """``--flag VALUE`` for each of ``dests`` the user set (not None, not the default 0)."""
    return [f"--{d.replace('_', '-')} {getattr(args, d)}" for d in dests if getattr(args, d)]


def _validate_lr_units(args) -> None:
    """Iteration-based runs take *-iters warmup/decay flags, sample-based runs *-samples; the
    BigScience *-tokens flags go with either. Errors name only the flags the user gave."""
    import math

    for name in _FINITE_LR_FLAGS:
        value = getattr(args, name)
        if value is not None and not math.isfinite(value):
            raise ArgumentError(f"--{name.replace('_', '-')} {value} is not a finite number")
    for kind, dests in (("warmup", ("lr_warmup_fraction", "lr_warmup_iters", "lr_warmup_samples",
                                    "lr_warmup_tokens")),
                        ("decay", ("lr_decay_iters", "lr_decay_samples", "lr_decay_tokens")),
                        ("WSD decay", ("lr_wsd_decay_iters", "lr_wsd_decay_samples"))):
        given = _given_flags(args, *dests)
        if len(given) > 1:
            raise ArgumentError(f"{' and '.join(given)} both set the LR {kind} length; give one")
    for name in ("lr_warmup_iters", "lr_warmup_samples", "lr_warmup_tokens", "lr_decay_iters",
                 "lr_decay_samples", "lr_decay_tokens", "lr_wsd_decay_iters", "lr_wsd_decay_samples"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ArgumentError(f"--{name.replace('_', '-')} {value} must be non-negative")
    if args.train_iters is not None:
        bad = _given_flags(args, "lr_decay_samples", "lr_warmup_samples", "lr_wsd_decay_samples")
        if bad:
            raise ArgumentError(f"{', '.join(bad)} given with --train-iters {args.train_iters}; "
                                "use the -iters (or -tokens) variants for an iteration-based run")
    else:
        bad = _given_flags(args, "lr_decay_iters", "lr_warmup_iters", "lr_wsd_decay_iters")
        if bad:
            raise ArgumentError(f"{', '.join(bad)} given with --train-samples {args.train_samples}; "
                                "use the -samples (or -tokens) variants for a sample-based run")
    if args.lr_decay_style == "WSD" and not (args.lr_wsd_decay_iters or args.lr_wsd_decay_samples):
        raise ArgumentError("--lr-decay-style WSD needs --lr-wsd-decay-iters (or -samples)")
    if args.start_weight_decay is None:
        args.start_weight_decay = args.weight_decay
    if args.end_weight_decay is None:
        args.end_weight_decay = args.weight_decay
    if args.override_opt_param_scheduler and args.use_checkpoint_opt_param_scheduler:
        raise ArgumentError("--override-opt_param-scheduler and --use-checkpoint-opt_param-scheduler "
                            "are mutually exclusive")
    _validate_lr_schedule(args)


def _validate_lr_schedule(args) -> None:
    """Build the LR/WD schedules once, so bad shapes fail here with the flag or file named."""
    import numpy as np
    from megatron.optim import learning_rates as lrs
    from megatron.schedules.registry import ScheduleError
    from megatron.schedules.units import batch_schedule_from_args

    for name in ("lr_warmup_fraction",):
        value = getattr(args, name)
        if value is not None and not 0.0 <= value < 1.0:
            raise ArgumentError(f"--lr-warmup-fraction {value} must be in [0, 1)")
    if args.start_weight_decay < 0 or args.end_weight_decay < 0:
        raise ArgumentError(f"--start-weight-decay {args.start_weight_decay} and --end-weight-decay "
                            f"{args.end_weight_decay} must be non-negative")
    if args.weight_decay_incr_style == "constant" and args.start_weight_decay != args.end_weight_decay:
        raise ArgumentError(f"--weight-decay-incr-style constant with --start-weight-decay "
                            f"{args.start_weight_decay} != --end-weight-decay {args.end_weight_decay}")
    decays = [f for f in ("power_scheduler_decay_iters", "power_scheduler_decay_samples",
                          "power_scheduler_decay_tokens") if getattr(args, f) is not None]
    if len(decays) > 1:
        raise ArgumentError(f"{', '.join('--' + f.replace('_', '-') for f in decays)} are mutually "
                            "exclusive")
    for f in decays:
        if getattr(args, f) < 0:
            raise ArgumentError(f"--{f.replace('_', '-')} {getattr(args, f)} must be non-negative")
    if args.power_scheduler_a <= 0:
        raise ArgumentError(f"--power-scheduler-a {args.power_scheduler_a} must be positive")
    if args.power_scheduler_b >= 0:
        raise ArgumentError(f"--power-scheduler-b {args.power_scheduler_b} must be negative (the "
                            "Power Scheduler's lr = batch * a * tokens^b decays with the tokens)")
    if args.lr_decay_style == "power" and args.lr_schedule_config is None and not decays:
        given = _given_flags(args, "lr_decay_iters", "lr_decay_samples", "lr_decay_tokens")
        if given:
            raise ArgumentError(
                f"{given[0]} with --lr-decay-style power has no effect without a final decay "
                "phase: the power law runs to the end of training. Give its length with "
                "--power-scheduler-decay-iters/-samples/-tokens (it then ends at "
                f"{given[0].split()[0]}), or drop {given[0].split()[0]}")
    args.lr_schedule_config_dict = None
    if args.lr_schedule_config is not None:
        try:
            args.lr_schedule_config_dict = lrs.load_schedule_config(args.lr_schedule_config)
        except ValueError as e:
            raise ArgumentError(str(e)) from None
    where = (f"--lr-schedule-config {args.lr_schedule_config}" if args.lr_schedule_config
             else f"--lr-decay-style {args.lr_decay_style}")
    bs = batch_schedule_from_args(args)
    steps = lrs.scheduler_steps_from_args(args)
    spans = lrs.lr_span_flags(args)
    if args.lr_schedule_config is None and args.lr_decay_style != "power" \
            and steps["lr_warmup_steps"] >= steps["lr_decay_steps"]:
        raise ArgumentError(
            f"the warmup ({spans['warmup']}: {steps['lr_warmup_steps']:g} samples) must be shorter "
            f"than the decay span ({spans['decay']}: {steps['lr_decay_steps']:g} samples)")
    if args.lr_decay_style == "WSD" and args.lr_schedule_config is None \
            and steps["wsd_decay_steps"] > steps["lr_decay_steps"]:
        wsd = _given_flags(args, "lr_wsd_decay_iters", "lr_wsd_decay_samples")[0]
        raise ArgumentError(f"{wsd} ({steps['wsd_decay_steps']:g} samples) is longer than the decay "
                            f"span ({spans['decay']}: {steps['lr_decay_steps']:g} samples)")
    if args.lr_decay_style == "power" and args.lr_schedule_config is None:
        warmup, end, decay = lrs.power_spans_from_args(args, bs)
        if warmup + decay > end:
            phases = [f"the warmup ({spans['warmup']}: {warmup:g} tokens)"] if warmup else []
            phases += [f"the final decay ({flag}: {decay:g} tokens)"
                       for flag in _given_flags(args, *decays)]
            raise ArgumentError(f"{' and '.join(phases)} exceed the span they share "
                                f"({spans['decay']}: {end:g} tokens)")
    if args.lr_warmup_init < 0 or args.lr_warmup_init > args.lr:
        raise ArgumentError(f"--lr-warmup-init {args.lr_warmup_init} must be in [0, --lr {args.lr}]")
    try:
        context = lrs.schedule_context_from_args(args, bs)
        params = lrs.scheduler_params_from_args(args, bs)
        lr, wd = lrs.build_schedules(params, context)
    except (ScheduleError, ValueError) as e:
        raise ArgumentError(f"{where}: {e}") from None
    # sample the schedules over training (and every stage boundary) for negative or non-finite
    # values (a finite config can still overflow, e.g. a huge power-law amplitude)
    iters = int(context.total["iterations"])
    grid = np.unique(np.concatenate([np.linspace(0, iters, min(iters, 20000) + 1).astype(np.int64),
                                     [iters]]))
    samples = bs.samples_at_iterations(grid)
    for name, schedule in (("learning rate", lr), ("weight decay", wd)):
        values = schedule(lrs.progress_in(schedule.unit, grid, samples, bs.seq_length))
        bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
        if bad.size:
            raise ArgumentError(f"{where}: negative or invalid {name} {values[bad[0]]:g} at iteration "
                                f"{grid[bad[0]]}")


def _data_sources(args) -> List[str]:
    """The data flags in use, one entry per kind of source."""
    weighted = [f"--{split}-weighted-split-paths{suffix}" for split in ("train", "valid", "test")
                for suffix in ("", "-path")
                if getattr(args, f"{split}_weighted_split_paths{suffix.replace('-', '_')}")]
    sources = []
    if args.data_path:
        sources.append("--data-path")
    split_paths = [f"--{s}-data-path" for s in ("train", "valid", "test")
                   if getattr(args, f"{s}_data_path")]
    if split_paths:
        sources.append("/".join(split_paths))
    if args.data_blend_config:
        sources.append("--data-blend-config")
    if weighted:
        sources.append("/".join(weighted))
    return sources


def _validate_data(args, require_data: bool) -> None:
    """Exactly one kind of data source; blend files and weighted-split groups are parsed here so
    their errors (file, key, value) appear before any work starts."""
    sources = _data_sources(args)
    if require_data and not sources:
        raise ArgumentError("no training data: give --data-path, --train-data-path (with "
                            "--valid-data-path/--test-data-path), --data-blend-config or "
                            "--train-weighted-split-paths")
    if len(sources) > 1:
        raise ArgumentError(f"{' and '.join(sources)} are mutually exclusive; use one kind of "
                            "data source")
    args.data_blend = None
    if args.data_blend_config:
        from megatron.data.blend_config import load_blend_config

        args.data_blend = load_blend_config(args.data_blend_config)
    from megatron.data.weighted_splits import weighted_split_groups_from_args

    # Files are checked when datasets are built (T0 prefixes name inputs/targets pairs).
    args.weighted_split_groups = weighted_split_groups_from_args(args, check_files=False)
    from megatron.data.loss_weights import parse_dataset_loss_weights

    try:  # the names are checked against the training datasets when they are built
        parse_dataset_loss_weights(args.dataset_loss_weights)
    except ConfigError as e:
        raise ArgumentError(str(e)) from None
    if args.num_workers < 0:
        raise ArgumentError(f"--num-workers {args.num_workers} must be non-negative")


def _validate_tokenizer(args) -> None:
    """Tokenizer flags (megatron/tokenizer/flags.py); resolves the default --tokenizer-type."""
    from megatron.tokenizer.flags import check_tokenizer_args

    try:
        check_tokenizer_args(args)
    except ConfigError as e:
        raise ArgumentError(str(e)) from e


def _validate_deepspeed_config(args) -> None:
    """Flags and ``--deepspeed_config`` agree (megatron/config/deepspeed_config.py
    reconcile_with_flags; values only the JSON gives are taken into args and noted), then
    ``--use-distributed-optimizer`` (ZeRO stage 1 unless a stage >= 1 is given), the
    precision flags against the device and the mixed-precision recipe."""
    from megatron.config.deepspeed_config import reconcile_with_flags

    if args.deepspeed_config_dict is not None:
        try:
            taken = reconcile_with_flags(args, args.deepspeed_config_dict)
        except ConfigError as e:
            raise ArgumentError(str(e)) from None
        if taken:
            args.startup_notes.append(f"from --deepspeed_config {args.deepspeed_config}: "
                                      + ", ".join(taken))
    if args.use_distributed_optimizer:
        if args.zero_stage is None:
            args.zero_stage = 1
        elif args.zero_stage == 0:
            where = ("--zero-stage 0" if "zero_stage" in args.given_flags else
                     f"--deepspeed_config {args.deepspeed_config} zero_optimization.stage=0")
            raise ArgumentError(f"--use-distributed-optimizer (optimizer states sharded over the "
                                f"data-parallel ranks: DeepSpeed ZeRO stage 1 here) contradicts "
                                f"{where}; drop one")
        args.startup_notes.append(
            f"--use-distributed-optimizer: optimizer states sharded over the "
            f"{args.data_parallel_size} data-parallel rank(s) by DeepSpeed ZeRO stage "
            f"{args.zero_stage}")
    if args.fp16 and args.bf16:
        raise ArgumentError("--fp16 and --bf16 are mutually exclusive (one of them from "
                            f"--deepspeed_config {args.deepspeed_config}); pick one")
    _validate_precision_on_device(args)
    _resolve_precision(args)


def _resolve_precision(args) -> None:
    """Gradient accumulation and reduction dtypes (Megatron-LM's flags, the JSON's
    ``data_types.grad_accum_dtype`` and ``communication_data_type``) and the ZeRO stage of mixed
    precision (megatron/optim/precision.py ``resolve_precision_flags``)."""
    from megatron.config.deepspeed_config import json_value
    from megatron.optim.precision import resolve_precision_flags

    config = args.deepspeed_config_dict or {}
    try:
        args.startup_notes.extend(resolve_precision_flags(
            args, json_value(config, "data_types.grad_accum_dtype"),
            json_value(config, "communication_data_type")))
    except ConfigError as e:
        raise ArgumentError(str(e)) from None


def _validate_precision_on_device(args) -> None:
    """``--fp16``/``--bf16`` need the DeepSpeed accelerator to support the type (DeepSpeed's
    engine refuses it otherwise with a traceback); fp16 loss-scale values."""
    given = "fp16" if args.fp16 else "bf16" if args.bf16 else None
    if given is not None:
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        supported = (accelerator.is_fp16_supported() if given == "fp16"
                     else accelerator.is_bf16_supported())
        if not supported:
            flag = (f"--{given}" if given in args.given_flags else
                    f"--deepspeed_config {args.deepspeed_config} {given}.enabled=true")
            other = "--bf16" if given == "fp16" else "--fp16"
            raise ArgumentError(f"{flag}: DeepSpeed's {accelerator.device_name()} accelerator has "
                                f"no {given} support on this machine; use {other} or full "
                                "precision (drop the flag)")
    scale = args.initial_loss_scale
    if scale is not None:
        if not (math.isfinite(scale) and scale > 0 and math.log2(scale).is_integer()):
            raise ArgumentError(f"--initial-loss-scale {args.initial_loss_scale:g} must be a power "
                                "of 2 (DeepSpeed takes fp16.initial_scale_power = log2 of it)")
    if args.loss_scale is not None and not (math.isfinite(args.loss_scale) and args.loss_scale >= 0):
        raise ArgumentError(f"--loss-scale {args.loss_scale:g} must be non-negative (0: dynamic)")
    if args.min_loss_scale is not None and not (math.isfinite(args.min_loss_scale)
                                                and args.min_loss_scale >= 1
                                                and args.min_loss_scale == int(args.min_loss_scale)):
        raise ArgumentError(f"--min-loss-scale {args.min_loss_scale:g} must be a positive whole "
                            "number (DeepSpeed's fp16.min_loss_scale is an integer)")
    for dest in ("loss_scale_window", "hysteresis"):
        if getattr(args, dest) is not None and getattr(args, dest) < 1:
            raise ArgumentError(f"--{dest.replace('_', '-')} {getattr(args, dest)} must be at least 1")
    if not args.fp16:
        given_scale = [args.given_flags[d] for d in ("loss_scale", "initial_loss_scale",
                                                     "min_loss_scale", "loss_scale_window",
                                                     "hysteresis") if d in args.given_flags]
        if given_scale:
            args.startup_notes.append(f"{', '.join(given_scale)}: no effect without --fp16 "
                                      "(loss scaling is for float16 only)")


def _validate_run_control(args) -> None:
    """``--train-tokens`` (shortens the run to the budget, megatron/train/run_control.py),
    ``--reset-progress`` and ``--eval-only``/``--skip-train`` combinations."""
    from megatron.train.run_control import apply_token_budget
    from megatron.schedules.units import batch_schedule_from_args

    if args.train_tokens is not None and args.train_tokens <= 0:
        raise ArgumentError(f"--train-tokens {args.train_tokens} must be positive")
    if args.reset_progress:
        if args.load is None:
            raise ArgumentError("--reset-progress needs --load DIR (it resets the counters of the "
                                "checkpoint it loads)")
        if args.finetune:
            raise ArgumentError("--reset-progress and --finetune are mutually exclusive: both start "
                                "at iteration 0, --reset-progress keeps the optimizer state, "
                                "--finetune drops it; give one")
        if args.use_checkpoint_opt_param_scheduler:
            raise ArgumentError("--reset-progress restarts the LR/WD schedule from this run's flags; "
                                "it contradicts --use-checkpoint-opt_param-scheduler")
    if args.kill_switch_path is not None and not args.kill_switch_path.strip():
        raise ArgumentError("--kill-switch-path '': give a file path")
    if args.skip_train and args.eval_iters == 0:
        raise ArgumentError("--eval-only/--skip-train with --eval-iters 0 evaluates nothing; give "
                            "--eval-iters N (global batches per evaluation)")
    args.train_tokens_note = apply_token_budget(args, batch_schedule_from_args(args))


def _validate_logging(args) -> None:
    """``--wandb-project`` needs an importable ``wandb`` (imported here, only with the flag, so a
    missing one stops the run before any work); the other W&B flags without it log nothing."""
    project = getattr(args, "wandb_project", None)
    if not project:  # Megatron-LM's default '' too: no W&B
        others = [args.given_flags[d] for d in ("wandb_exp_name", "wandb_save_dir")
                  if d in args.given_flags]
        if others:
            args.startup_notes.append(f"{', '.join(others)} without --wandb-project: no W&B run "
                                      "(as in Megatron-LM)")
        return
    from megatron.metrics.wandb_writer import INSTALL_HINT, wandb_import_problem

    problem = wandb_import_problem()
    if problem is not None:
        raise ArgumentError(f"--wandb-project {project} needs the wandb package, which cannot be "
                            f"imported ({problem}); install it: {INSTALL_HINT}")


def _validate_pipe_accumulation(args) -> None:
    """A pipeline with gradient accumulation on a DeepSpeed release with the pipe engine's
    accumulation bug (megatron/parallel/pipe.py ``pipe_accumulation_problem``) is refused."""
    from importlib.metadata import PackageNotFoundError, version

    from megatron.parallel.pipe import pipe_accumulation_problem

    try:
        installed = version("deepspeed")
    except PackageNotFoundError:
        return
    micro_batches = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
    problem = pipe_accumulation_problem(installed, args.pipeline_model_parallel_size, micro_batches)
    if problem:
        raise ArgumentError(problem)


def _validate_bloom_model(args) -> None:
    """``--pad-vocab-size-to``: positive and divisible by the tensor-parallel size (that it is at
    least the tokenizer's vocabulary is checked when the tokenizer is built)."""
    n, tp = args.pad_vocab_size_to, args.tensor_model_parallel_size
    if n is None:
        return
    if n <= 0:
        raise ArgumentError(f"--pad-vocab-size-to {n} must be positive")
    if n % tp:
        raise ArgumentError(f"--pad-vocab-size-to {n} is not divisible by "
                            f"--tensor-model-parallel-size {tp} (each rank holds vocab / TP "
                            "embedding rows)")


def validate_args(args: argparse.Namespace, world_size: int = 1,
                  require_data: bool = True) -> argparse.Namespace:
    """Check flag combinations for ``world_size`` ranks and fill derived values in place.
    ``require_data=False`` lets tools that build no dataset (schedule previews) skip data flags."""
    _require(args, "num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size")
    # Every check whose inputs are valid runs, so one error names all problems of a command line;
    # a check is skipped when one it builds on (derived values) failed.
    if not hasattr(args, "given_flags"):  # a namespace not from get_parser(): nothing "given"
        args.given_flags = {}
    args.startup_notes = []
    checks = (("deepspeed json", (), lambda: _load_deepspeed_json(args)),
              ("batch", ("deepspeed json",), lambda: _validate_batch(args, world_size)),
              ("model", (), lambda: _validate_model(args)),
              ("training", (), lambda: _validate_training(args)),
              ("skip step", (), lambda: validate_skip_step_args(args)),
              ("run control", ("batch", "training"), lambda: _validate_run_control(args)),
              ("lr", ("batch", "training", "run control"), lambda: _validate_lr_units(args)),
              ("data", (), lambda: _validate_data(args, require_data)),
              ("tokenizer", (), lambda: _validate_tokenizer(args)),
              ("deepspeed", ("batch", "training"), lambda: _validate_deepspeed_config(args)),
              ("layout", ("batch", "model", "deepspeed"), lambda: _validate_layout(args)),
              ("BLOOM model", ("batch",), lambda: _validate_bloom_model(args)),
              ("pipe accumulation", ("batch", "layout"),
               lambda: _validate_pipe_accumulation(args)),
              ("logging", (), lambda: _validate_logging(args)),
              # after the flags they read (bf16/fp16 may come from --deepspeed_config)
              ("attention", ("model", "deepspeed"), lambda: _resolve_attention_backend(args)),
              ("moe", ("batch", "model", "layout"), lambda: validate_moe_args(args)),
              ("transformer config", ("model", "layout", "deepspeed", "moe"),
               lambda: _build_transformer_config(args)),
              ("train iters", ("batch", "training", "run control", "lr"),
               lambda: _derive_train_iters(args)))
    failed, errors = set(), []
    for name, needs, check in checks:
        if failed.intersection(needs):
            failed.add(name)
            continue
        try:
            check()
        except ArgumentError as e:
            failed.add(name)
            errors.append(str(e))
    if errors:
        raise ArgumentError("; ".join(errors))
    inert = _inert_flags(args)
    if inert:
        args.startup_notes.append(f"accepted without effect here (docs/compatibility.md): "
                                  f"{', '.join(inert)}")
    # lazy: megatron-core's configs load torch and megatron-core (seconds); --help needs neither
    from megatron.config.run_config import run_config_from_args

    args.run_config = run_config_from_args(args, args.startup_notes)
    return args
