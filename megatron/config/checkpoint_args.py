"""The model flags of a run as a checkpoint records them (``model_args.json``: the format and the
flags are megatron/checkpoint/model_args.py) and ``--use-checkpoint-args``, which sets the flags
from a checkpoint's record before validation. A checkpoint records the run's flags by design
(Megatron-LM writes ``args`` into every checkpoint and checks them on load), so the record is made
here, where the flags may be read.
"""
import argparse
import os
from typing import Dict, Iterable, List, Optional, Set

from megatron.checkpoint.format import MODEL_ARGS_FILENAME, checkpoint_tag, read_model_args, read_tracker
from megatron.checkpoint.format import MODEL_ARGS_FORMAT_VERSION as FORMAT_VERSION
from megatron.checkpoint.model_args import (
    DEFAULT_ARG_NAMES,
    MODEL_ARG_NAMES,
    TOKENIZER_ARG_NAMES,
    TOKENIZER_PATH_NAMES,
    describe_tokenizer,
    resolve_tokenizer_paths,
    same_tokenizer,
)
from megatron.config.context_extension import CONTEXT_FLAGS
from megatron.data.document_packing import CONCAT
from megatron.errors import ArgumentError


def model_args_from_args(args: argparse.Namespace) -> dict:
    """The ``model_args.json`` record of a validated ``args`` (megatron/checkpoint/model_args.py's
    module docstring), once the entry point set the padded vocabulary size."""
    def pick(names):
        return {n: getattr(args, n) for n in names if hasattr(args, n)}

    tokenizer = pick(TOKENIZER_ARG_NAMES)
    for name in TOKENIZER_PATH_NAMES:
        if tokenizer.get(name) and os.path.exists(tokenizer[name]):
            tokenizer[name] = os.path.abspath(tokenizer[name])
    return {"format_version": FORMAT_VERSION, "model": pick(MODEL_ARG_NAMES),
            "tokenizer": tokenizer, "defaults": pick(DEFAULT_ARG_NAMES),
            "run": {"global_batch_size": getattr(args, "global_batch_size", None),
                    "pack_documents": getattr(args, "pack_documents", CONCAT)},
            "padded_vocab_size": getattr(args, "padded_vocab_size", None),
            "vocab_size": getattr(args, "vocab_size", None)}


def explicit_dests(parser: argparse.ArgumentParser, argv: Iterable[str]) -> Set[str]:
    """The argparse dests whose flags appear in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``,
    under any of their aliases); the parser takes no abbreviations, so matching is exact."""
    by_option = {opt: action.dest for action in parser._actions for opt in action.option_strings}
    given = set()
    for token in argv:
        if token.startswith("--"):
            dest = by_option.get(token.split("=", 1)[0])
            if dest is not None:
                given.add(dest)
    return given


def _flag_name(parser: argparse.ArgumentParser, dest: str) -> str:
    for action in parser._actions:
        if action.dest == dest and action.option_strings:
            return action.option_strings[0]
    return "--" + dest.replace("_", "-")


def _show(parser, dest: str, value) -> str:
    flag = _flag_name(parser, dest)
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    return f"{flag} {value}"


def apply_checkpoint_args(args: argparse.Namespace, parser: argparse.ArgumentParser,
                          argv: List[str]) -> Optional[dict]:
    """``--use-checkpoint-args``: set the model and tokenizer flags of ``args`` from the
    ``model_args.json`` of the latest checkpoint in ``--load`` (megatron/checkpoint/model_args.py); returns
    the record, or None without ``--use-checkpoint-args``. Raises ``ArgumentError`` naming the flag,
    the command line's value and the checkpoint's when they disagree (except the context flags,
    megatron/config/context_extension.py ``CONTEXT_FLAGS``: the command line's value is kept, never
    the checkpoint's, and ``validate_args``' resume check refuses a change without
    ``--extend-context``), and when ``--load`` holds no
    checkpoint or one without recorded model flags. Call before ``validate_args``."""
    if not args.use_checkpoint_args:
        return None
    if not args.load:
        raise ArgumentError("--use-checkpoint-args needs --load DIR (the checkpoint whose model "
                            "flags to use)")
    iteration = read_tracker(args.load)
    if iteration is None:
        raise ArgumentError(f"--use-checkpoint-args: --load {args.load} holds no checkpoint "
                            "(no latest_checkpointed_iteration.txt)")
    directory = os.path.join(args.load, checkpoint_tag(iteration))
    record = read_model_args(directory)
    if record is None:
        raise ArgumentError(f"--use-checkpoint-args: checkpoint {directory} has no "
                            f"{MODEL_ARGS_FILENAME} (written before checkpoints recorded their "
                            "model flags); give the model flags instead")
    given = explicit_dests(parser, argv)
    values: Dict[str, object] = dict(record["model"])
    # checkpoints written before the bias-GeLU rule was recorded computed erf GeLU
    values.setdefault("bias_gelu_fusion", False)
    tokenizer = resolve_tokenizer_paths(record.get("tokenizer") or {}, args.load)
    args.checkpoint_tokenizer_note = None
    if given.intersection(TOKENIZER_ARG_NAMES):
        # tokenizer flags on the command line win (Megatron-LM's load_args_from_checkpoint never
        # takes tokenizer files from the checkpoint); whether the vocabulary fits the
        # checkpoint's embedding rows is checked when the tokenizer is built
        mine = {name: getattr(args, name, None) for name in TOKENIZER_ARG_NAMES}
        if not same_tokenizer(mine, tokenizer):
            args.checkpoint_tokenizer_note = (
                "--use-checkpoint-args: tokenizer from the command line instead of the "
                f"checkpoint's ({describe_tokenizer(tokenizer)})")
    else:
        values.update(tokenizer)
    conflicts = []
    for dest, value in values.items():
        if not hasattr(args, dest):
            if value in (None, False):
                continue  # a flag this parser lacks, at its neutral value
            raise ArgumentError(f"--use-checkpoint-args: checkpoint {directory} sets "
                                f"{_show(parser, dest, value)}, a flag this program does not have")
        if dest in given and getattr(args, dest) != value and dest in CONTEXT_FLAGS:
            continue  # the command line's context stays; the resume check refuses it without --extend-context
        if dest in given and getattr(args, dest) != value:
            conflicts.append(f"{_show(parser, dest, getattr(args, dest))} (command line) vs "
                             f"{_show(parser, dest, value)} (checkpoint)")
        else:
            setattr(args, dest, value)
    for dest, value in (record.get("defaults") or {}).items():
        if hasattr(args, dest) and dest not in given:
            setattr(args, dest, value)
    if conflicts:
        raise ArgumentError(f"--use-checkpoint-args: the command line disagrees with the model "
                            f"flags of checkpoint {directory}: {'; '.join(conflicts)}; drop those "
                            "flags (the checkpoint's values are used) or drop --use-checkpoint-args")
    args.checkpoint_model_args = record
    return record
