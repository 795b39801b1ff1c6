#!/usr/bin/env python
"""Merge checkpoints of one run into one checkpoint: the weighted average ``Σ wᵢ·θᵢ`` (WSM,
warmup-stable-merge: checkpoint merging in place of a learning-rate decay).

    python tools/checkpoint/merge_checkpoints.py --load DIR \
        (--iterations I1 I2 ... | --window N --every K [--window-end I]) \
        (--weights W1 W2 ... | --weights-from-schedule FILE|KIND) --save OUT \
        [--target-tensor-parallel-size T] [--target-pipeline-parallel-size P]

- ``--iterations`` names the checkpoints; ``--window N --every K`` takes the last N checkpoints K
  iterations apart (ending at ``--window-end``, default the latest complete one).
- ``--weights`` (one per checkpoint, in the order of ``--iterations``, or ascending for a window)
  are normalised to sum 1; negative, non-finite or all-zero weights are refused.
  ``--weights-from-schedule`` derives them from a decay in the schedule language
  (docs/schedules.md): a kind with ``from``/``to`` keys (``linear``, ``cosine``, ``wsd``,
  ``inverse-square-root``: from 1 to 0 over the window) or a YAML/JSON file with a schedule (or
  ``merge_schedule: ...``) in iterations since the first checkpoint, mapped to checkpoint weights
  as the WSM paper does (megatron/checkpoint/merge.py).
- Sources of any tensor/pipeline/data-parallel layout and ZeRO stage 0-2, also mixed; checkpoints of
  different models (names, shapes, padded vocabulary, model flags) are refused naming the first
  tensor that differs.
- ``OUT/iter_N/`` (N the newest source's iteration) is written with the layout
  ``--target-tensor-parallel-size`` x ``--target-pipeline-parallel-size`` (default 1 x 1), in the
  sources' dtype, with their ``model_args.json``, the newest source's training state (``--load OUT
  --no-load-optim`` continues the run from the merged weights, ``--finetune`` starts from them),
  ``param_index.json`` and ``merge.json`` (sources and weights). It loads, evaluates
  (``tasks/``) and exports (``convert_to_hf.py``) like any checkpoint.

Tensors are merged in fp32 one at a time and streamed into the output files: memory is about one
full tensor beyond the interpreter. One line per tensor group is printed, and the time and peak
memory at the end.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()

from megatron.errors import ConfigError  # noqa: E402
from megatron.runtime.process_exit import run_entry_point  # noqa: E402


def get_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    g = p.add_argument_group("sources")
    g.add_argument("--load", required=True, help="Checkpoint directory (a training run's --save).")
    g.add_argument("--iterations", type=int, nargs="+", default=None, metavar="I",
                   help="Iterations of the checkpoints to merge.")
    g.add_argument("--window", type=int, default=None, metavar="N",
                   help="Merge the last N checkpoints, --every K iterations apart.")
    g.add_argument("--every", type=int, default=None, metavar="K",
                   help="Iterations between the checkpoints of --window.")
    g.add_argument("--window-end", type=int, default=None, metavar="I",
                   help="Newest checkpoint of --window (default: the latest complete one).")
    g = p.add_argument_group("weights")
    g.add_argument("--weights", type=float, nargs="+", default=None, metavar="W",
                   help="One weight per checkpoint (normalised to sum 1).")
    g.add_argument("--weights-from-schedule", default=None, metavar="FILE|KIND",
                   help="Derive the weights from a decay schedule (a kind such as linear, cosine, "
                        "wsd, or a YAML/JSON schedule file), by the WSM mapping.")
    g = p.add_argument_group("output")
    g.add_argument("--save", required=True,
                   help="Directory of the merged checkpoint (new or empty).")
    g.add_argument("--target-tensor-parallel-size", type=int, default=1, metavar="T",
                   help="Tensor-parallel size of the merged checkpoint's files (default 1).")
    g.add_argument("--target-pipeline-parallel-size", type=int, default=1, metavar="P",
                   help="Pipeline-parallel size of the merged checkpoint's files (default 1).")
    return p.parse_args(argv)


def merge(args: argparse.Namespace) -> dict:
    """Select the checkpoints, compute the weights, merge (megatron/checkpoint/merge.py)."""
    from megatron.checkpoint.merge import (  # lazy: torch (~1 s); --help needs none
        merge_checkpoints,
        normalized_weights,
        select_iterations,
        weights_from_schedule,
    )

    if (args.weights is None) == (args.weights_from_schedule is None):
        raise ConfigError("give the merge weights with --weights W1 W2 ... or with "
                          "--weights-from-schedule FILE|KIND (one of the two)")
    iterations = select_iterations(args.load, args.iterations, args.window, args.every,
                                   args.window_end)
    if args.weights is not None:
        weights = normalized_weights(args.weights, iterations)
        pairs = sorted(zip(iterations, weights, strict=True))
        source = {"flag": "--weights", "values": list(args.weights)}
    else:
        ordered = sorted(iterations)
        weights, multipliers, config = weights_from_schedule(args.weights_from_schedule, ordered)
        pairs = list(zip(ordered, weights, strict=True))
        source = {"flag": "--weights-from-schedule", "value": args.weights_from_schedule,
                  "schedule": config, "decay_multipliers": multipliers}
        print("weights from the decay " + ", ".join(
            f"w_{i + 1} = {w:.6g}" for i, w in enumerate(multipliers)) + " (WSM: c_0 = 1 - w_1, "
            "c_j = w_j - w_{j+1}, c_k = w_k)")
    return merge_checkpoints(args.load, [p[0] for p in pairs], [p[1] for p in pairs], args.save,
                             tp=args.target_tensor_parallel_size,
                             pp=args.target_pipeline_parallel_size, weights_from=source)


def main(argv=None) -> dict:
    return merge(get_args(argv))


if __name__ == "__main__":
    run_entry_point(main)
