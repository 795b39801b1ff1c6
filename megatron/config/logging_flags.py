"""The "logging" flag group (TensorBoard, ``--metrics-jsonl``, Weights & Biases) and its check:
``--wandb-project`` needs an importable ``wandb``."""
import argparse
from typing import List

from megatron.errors import ArgumentError
from megatron.metrics.wandb_writer import INSTALL_HINT, wandb_import_problem


def add_logging_args(parser: argparse.ArgumentParser) -> None:
    """The "logging" flag group."""
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


def validate_logging(args, notes: List[str]) -> None:
    """``--wandb-project`` needs an importable ``wandb`` (imported here, only with the flag, so a
    missing one stops the run before any work); the other W&B flags without it log nothing."""
    project = args.wandb_project
    if not project:  # Megatron-LM's default '' too: no W&B
        others = [args.given_flags[d] for d in ("wandb_exp_name", "wandb_save_dir")
                  if d in args.given_flags]
        if others:
            notes.append(f"{', '.join(others)} without --wandb-project: no W&B run "
                                      "(as in Megatron-LM)")
        return

    problem = wandb_import_problem()
    if problem is not None:
        raise ArgumentError(f"--wandb-project {project} needs the wandb package, which cannot be "
                            f"imported ({problem}); install it: {INSTALL_HINT}")
