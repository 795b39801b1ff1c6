"""The "data" flag group (``--data-path``, ``--*-data-path``, ``--data-blend-config``, the
weighted-split paths, ``--override-data-mix``, ``--phase-transition-iterations``,
``--dataset-loss-weights``, ...) and its checks: one kind of data source, blend files and
weighted-split groups parsed up front, loss weights, the phase transitions."""
import argparse
from typing import List

from megatron.data.loss_weights import parse_dataset_loss_weights
from megatron.errors import ArgumentError, ConfigError


def add_data_args(parser: argparse.ArgumentParser) -> None:
    """The "data" flag group."""
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


def validate_phase_transitions(args, notes: List[str]) -> None:
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
        notes.append("warning: --phase-transition-iterations without --save: the run "
                                  "exits at each phase end without a checkpoint to continue from")


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


def validate_data(args, require_data: bool) -> None:
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
        from megatron.data.blend_config import load_blend_config  # lazy: PyYAML (~9 ms); not --help

        args.data_blend = load_blend_config(args.data_blend_config)
    from megatron.data.weighted_splits import weighted_split_groups_from_args  # lazy: PyYAML (~9 ms); not --help

    # Files are checked when datasets are built (T0 prefixes name inputs/targets pairs).
    args.weighted_split_groups = weighted_split_groups_from_args(args, check_files=False)

    try:  # the names are checked against the training datasets when they are built
        parse_dataset_loss_weights(args.dataset_loss_weights)
    except ConfigError as e:
        raise ArgumentError(str(e)) from None
    if args.num_workers < 0:
        raise ArgumentError(f"--num-workers {args.num_workers} must be non-negative")
