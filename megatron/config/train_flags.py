"""The "training" flag group (batch sizes and batch schedules, run length, optimizer, seed,
precision and fp16 loss scaling, intervals, loss normalisation) and its checks: the batch
(gradient accumulation steps), the run length, LR bounds and intervals, and the ``train_iters``
of a ``--train-samples`` run."""
import argparse
from typing import List

from megatron.config.batch_flags import batch_schedule_from_args, train_iterations_from_args
from megatron.config.data_flags import validate_phase_transitions
from megatron.config.deepspeed_config import global_batch_from_json
from megatron.config.parallel_flags import validate_layout_sizes
from megatron.errors import ArgumentError
from megatron.schedules.units import parse_step_batch_size_schedule


def add_training_args(parser: argparse.ArgumentParser) -> None:
    """The "training" flag group."""
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


def _validate_step_batch_size_schedule(args, per_step: int) -> None:
    """``--step-batch-size-schedule`` into ``args.batch_size_steps`` ``[[samples, batch], ...]``;
    its last batch is the global batch size (megatron-core's calculator ignores
    ``--global-batch-size`` here; a different one given is refused, not ignored)."""
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


def validate_batch(args, world_size: int, notes: List[str]) -> None:
    """The data-parallel size of ``world_size`` ranks, the global batch (from the flags, the
    batch schedule or ``--deepspeed_config``) and its rampup, and
    ``args.gradient_accumulation_steps``."""
    validate_layout_sizes(args, world_size)
    per_step = args.micro_batch_size * args.data_parallel_size
    args.batch_size_steps = None
    if args.step_batch_size_schedule is not None:
        _validate_step_batch_size_schedule(args, per_step)
    if args.global_batch_size is None and args.deepspeed_config_dict:
        args.global_batch_size = global_batch_from_json(args, args.deepspeed_config_dict)
        if args.global_batch_size is not None:
            notes.append(f"--global-batch-size {args.global_batch_size} from "
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


def derive_train_iters(args) -> None:
    """``args.train_iters`` of a ``--train-samples`` run: the whole global batches that fit
    (megatron/config/batch_flags.py ``train_iterations_from_args``, rampup aware), after the
    ``--train-tokens`` budget; ``--train-iters`` runs keep theirs. Derived last, so the checks
    above still tell an iteration-based run (``--train-iters`` given) from a sample-based one."""
    args.train_iters = train_iterations_from_args(args, batch_schedule_from_args(args))


def validate_training(args, notes: List[str]) -> None:
    """Precision exclusivity, the run length, ``--lr``/``--min-lr``, the log, evaluation and save
    intervals, the phase transitions and the loss normalisation."""
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
        notes.append(f"warning: --save-interval {args.save_interval} without --save: "
                                  "no checkpoints will be saved")
    validate_phase_transitions(args, notes)
    if args.calculate_per_token_loss and args.calculate_per_sample_loss:
        raise ArgumentError("--calculate-per-token-loss and --calculate-per-sample-loss are "
                            "mutually exclusive: the loss is averaged over tokens or over samples")
