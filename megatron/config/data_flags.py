"""The "data" flag group (``--data-path``, ``--*-data-path``, Megatron-LM's ``--data-args-path``
and ``--per-split-data-args-path``, ``--data-blend-config``, the weighted-split paths,
``--override-data-mix``, ``--phase-transition-iterations``, ``--dataset-loss-weights``, ...) and its
checks: one kind of data source, data-args files read, ``--data-path`` weights checked, blend files
and weighted-split groups parsed up front, loss weights, the phase transitions."""
import argparse
import json
import math
import os
from typing import List, Optional

from megatron.data.document_packing import BEST_FIT, CONCAT, PACKING_MODES
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
    g.add_argument("--data-args-path", default=None, metavar="FILE",
                   help="Megatron-LM's flag: a file holding the --data-path words ([WEIGHT] PREFIX "
                        "..., whitespace separated, any number per line) for blends too long for "
                        "a command line; instead of --data-path.")
    g.add_argument("--per-split-data-args-path", default=None, metavar="JSON",
                   help="Megatron-LM's flag: a JSON file {\"train\": [...], \"valid\": [...], "
                        "\"test\": [...]} holding the --train/--valid/--test-data-path words (a "
                        "list of words or one string of them; null: no data for that split); "
                        "instead of those flags.")
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
    g.add_argument("--data-index-order", default="auto", choices=("auto", "greedy", "blocked"),
                   help="The order of a blend's samples (docs/curriculum.md): 'greedy' draws "
                        "each sample from the dataset furthest behind its target (megatron-core's "
                        "BlendedDataset order for static weights; O(samples x datasets)); "
                        "'blocked' plans blocks of samples by largest remainders and interleaves "
                        "them by earliest deadline (O(samples x log datasets), for thousands of "
                        "datasets and billions of samples); 'auto' (default) takes greedy while "
                        "samples x datasets <= 2**32, else blocked. A resumed run keeps the order "
                        "its checkpoint's mix was drawn in.")
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
    g.add_argument("--pack-documents", default=CONCAT, choices=PACKING_MODES,
                   help="How a GPT dataset's documents become samples (training, validation and "
                        "test): 'concat' (default) is megatron-core's GPTDataset, the documents "
                        "concatenated and cut into --seq-length windows (most documents straddle "
                        "two samples); 'best-fit' packs whole documents best-fit decreasing into "
                        "samples of --seq-length + 1 tokens padded with loss-masked pads, cutting "
                        "only documents longer than that into chunks (docs/packing.md). "
                        "--reset-attention-mask and --reset-position-ids keep each document of a "
                        "sample its own under both. A resume continuing the checkpoint's data keeps "
                        "its checkpoint's value (and, with best-fit, its --seq-length).")
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
    if getattr(args, "data_args_path", None):
        sources.append("--data-args-path")
    split_paths = [f"--{s}-data-path" for s in ("train", "valid", "test")
                   if getattr(args, f"{s}_data_path")]
    if split_paths:
        sources.append("/".join(split_paths))
    if getattr(args, "per_split_data_args_path", None):
        sources.append("--per-split-data-args-path")
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
        raise ArgumentError("no training data: give --data-path (or --data-args-path), "
                            "--train-data-path (with --valid-data-path/--test-data-path; or "
                            "--per-split-data-args-path), --data-blend-config or "
                            "--train-weighted-split-paths")
    if len(sources) > 1:
        raise ArgumentError(f"{' and '.join(sources)} are mutually exclusive; use one kind of "
                            "data source")
    read_data_args_files(args)
    for split in ("", "train_", "valid_", "test_"):
        check_data_path_weights(args, f"{split}data_path")
    args.data_blend = None
    if args.data_blend_config:
        from megatron.data.blend_config import load_blend_config  # lazy: PyYAML (~9 ms); not --help

        args.data_blend = load_blend_config(args.data_blend_config)
    # Files are checked when datasets are built (T0 prefixes name inputs/targets pairs).
    args.weighted_split_groups = weighted_split_groups_from_args(args, check_files=False)

    try:  # the names are checked against the training datasets when they are built
        parse_dataset_loss_weights(args.dataset_loss_weights)
    except ConfigError as e:
        raise ArgumentError(str(e)) from None
    if args.num_workers < 0:
        raise ArgumentError(f"--num-workers {args.num_workers} must be non-negative")
    if require_data:
        check_packing_resume(args)


def check_packing_resume(args) -> None:
    """``--pack-documents`` at a resume that continues the checkpoint's training data (``--load``
    without ``--finetune``, ``--reset-progress`` or ``--skip-train``, from a trained checkpoint):
    the checkpoint's data ledger counts samples of its packing (its ``model_args.json`` records
    it under ``run``; absent: ``concat``), so another ``--pack-documents`` is refused, and under
    ``best-fit`` so is another ``--seq-length`` (the ledger counts bins of ``seq_length + 1``
    tokens: a position would point at other documents). A ``concat`` run across a length change is
    the sequence-length resume's (megatron/config/context_extension.py)."""
    if not args.load or args.finetune or args.reset_progress or args.skip_train:
        return
    from megatron.checkpoint.format import checkpoint_tag, read_model_args, read_tracker  # lazy: torch (~1 s)

    iteration = read_tracker(args.load)
    directory = os.path.join(args.load, checkpoint_tag(iteration)) if iteration else None
    record = read_model_args(directory) if directory and os.path.isdir(directory) else None
    if record is None:
        return
    old = (record.get("run") or {}).get("pack_documents", CONCAT)
    new = args.pack_documents
    if old != new:
        raise ArgumentError(
            f"--pack-documents {old} -> {new}: checkpoint {directory} drew its training data "
            f"packed {old}, and its data ledger counts those samples; give --reset-progress to start "
            f"the data and the LR schedule at sample 0, or keep --pack-documents {old}")
    old_seq = (record.get("defaults") or {}).get("seq_length")
    if new == BEST_FIT and old_seq is not None and old_seq != args.seq_length:
        raise ArgumentError(
            f"--pack-documents best-fit: --seq-length {old_seq} -> {args.seq_length}: the data "
            f"ledger of checkpoint {directory} counts bins of {old_seq} + 1 tokens, and a bin "
            "position at another length would point at other documents; give --reset-progress "
            f"to start the data at sample 0, or keep --seq-length {old_seq}")


def weighted_split_groups_from_args(args, check_files: bool = True):
    """``{"train": [...], "valid": [...], "test": [...]}`` (megatron/data/weighted_splits.py
    ``WeightedSplitGroup``) from ``args.{split}_weighted_split_paths`` or
    ``args.{split}_weighted_split_paths_path`` (mutually exclusive)."""
    from megatron.data.weighted_splits import parse_weighted_split_flags  # lazy: PyYAML (~9 ms); not --help

    splits = ("train", "valid", "test")
    return parse_weighted_split_flags(
        {split: getattr(args, f"{split}_weighted_split_paths", None) for split in splits},
        {split: getattr(args, f"{split}_weighted_split_paths_path", None) for split in splits},
        check_files)


def _data_words(value, flag: str, where: str) -> Optional[List[str]]:
    """The ``--data-path`` words of one value of a data-args file: a list of words (strings or
    numbers) or one string of them (Megatron-LM splits it on whitespace); None or empty: none."""
    if value is None:
        return None
    if isinstance(value, str):
        words = value.split()
    elif isinstance(value, list) and all(isinstance(w, (str, int, float)) and not isinstance(w, bool)
                                         for w in value):
        words = [w if isinstance(w, str) else repr(w) for w in value]
        words = [part for w in words for part in w.split()]
    else:
        raise ArgumentError(f"{flag}: {where} is {value!r}; give a list of [WEIGHT] PREFIX words, "
                            "one string of them, or null")
    return words or None


def read_data_args_files(args) -> None:
    """Megatron-LM's ``--data-args-path FILE`` (the ``--data-path`` words, whitespace separated)
    and ``--per-split-data-args-path JSON`` (``{"train": ..., "valid": ..., "test": ...}``, each
    the words of ``--{split}-data-path``): read into ``args.data_path`` /
    ``args.{split}_data_path``, which then mean what those flags mean (Megatron-LM's
    ``get_blend_and_blend_per_split``)."""
    path = getattr(args, "data_args_path", None)
    if path:
        flag = "--data-args-path"
        if not os.path.isfile(path):
            raise ArgumentError(f"{flag}: file {path!r} does not exist")
        with open(path, "r", encoding="utf-8") as f:
            words = f.read().split()
        if not words:
            raise ArgumentError(f"{flag}: file {path!r} holds no word; give the --data-path words "
                                "([WEIGHT] PREFIX ...)")
        args.data_path = words
    path = getattr(args, "per_split_data_args_path", None)
    if path:
        flag = "--per-split-data-args-path"
        if not os.path.isfile(path):
            raise ArgumentError(f"{flag}: file {path!r} does not exist")
        try:
            with open(path, "r", encoding="utf-8") as f:
                obj = json.load(f)
        except ValueError as exc:
            raise ArgumentError(f"{flag}: {path}: not JSON: {exc}") from None
        splits = ("train", "valid", "test")
        if not isinstance(obj, dict):
            raise ArgumentError(f"{flag}: {path} holds {type(obj).__name__}; give a JSON object "
                                "with keys train, valid, test")
        unknown = [k for k in obj if k not in splits]
        missing = [k for k in splits if k not in obj]
        if unknown or missing:
            what = (f"unknown key {unknown[0]!r} (value {obj[unknown[0]]!r})" if unknown
                    else f"missing key {missing[0]!r}")
            raise ArgumentError(f"{flag}: {path}: {what}; the keys are train, valid, test (as "
                                "Megatron-LM reads the file; null for a split without data)")
        for split in splits:
            setattr(args, f"{split}_data_path", _data_words(obj[split], flag, f"{path}: {split}"))
        if not args.train_data_path and not args.valid_data_path and not args.test_data_path:
            raise ArgumentError(f"{flag}: {path} gives no split any data")


def check_data_path_weights(args, dest: str) -> None:
    """The weights of ``args.<dest>`` (``[WEIGHT] PREFIX ...`` words) are finite and >= 0, and not
    all zero (megatron-core would divide by their sum)."""
    words = getattr(args, dest, None)
    if not words or len(words) % 2:
        return
    from megatron.data.builder import data_flag_name  # lazy: megatron-core datasets; not --help

    weights = []
    for w in words[::2]:
        try:
            weights.append(float(w))
        except ValueError:
            return  # prefixes only (megatron-core: weights inferred from the lengths)
    flag = data_flag_name(dest, getattr(args, "data_args_path", None),
                          getattr(args, "per_split_data_args_path", None))
    for w, prefix, value in zip(words[::2], words[1::2], weights, strict=True):
        if math.isnan(value) or math.isinf(value) or value < 0:
            raise ArgumentError(f"{flag}: weight {w!r} of {prefix!r} is not allowed; weights "
                                "must be finite and >= 0")
    if not any(weights):
        raise ArgumentError(f"{flag}: every weight is zero ({len(weights)} datasets): nothing to "
                            "draw; give a dataset a weight > 0")
