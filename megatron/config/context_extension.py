"""``--extend-context``: the directive that makes a resume a context-extension stage
(docs/context_extension.md), and the check every resume passes.

The check compares the context of the checkpoint's model, as its ``model_args.json`` records it
(megatron/checkpoint/model_args.py: ``--seq-length`` among ``defaults``, the position-encoding
flags among ``model``, ``--global-batch-size`` under ``run``), with this run's validated flags:

* without the directive, any change of the sequence length or the position encoding is one error
  naming each flag's old and new value and ``--extend-context``, also under
  ``--use-checkpoint-args`` (whose command-line values are kept, never replaced by the
  checkpoint's, megatron/config/checkpoint_args.py);
* learned absolute positions cannot grow past the checkpoint's ``--max-position-embeddings``
  (refused, naming RoPE), and an extension changes the encoding only between ``rope`` and
  ``yarn`` (the checkpoint's weights are of its type);
* with the directive, a changed ``--global-batch-size`` keeps the tokens per step
  (``seq_length x global_batch_size``), unless ``--extend-context free-batch``;
* the training data continues across a change of ``--seq-length`` token by token
  (megatron/data/length_change.py); packed T0 data cannot, which its data builder refuses.

:func:`check_context_extension` is the pure rule over the two records;
:func:`validate_context_extension` reads the checkpoint for ``validate_args``.
"""
import argparse
import os
from typing import Any, Dict, List, Optional, Tuple

from megatron.errors import ArgumentError

KEEP_TOKENS, FREE_BATCH = "keep-tokens", "free-batch"

# argparse dest -> flag of what makes the context of a model: its length and position encoding
CONTEXT_FLAGS = {
    "seq_length": "--seq-length",
    "max_position_embeddings": "--max-position-embeddings",
    "position_embedding_type": "--position-embedding-type",
    "rotary_base": "--rotary-base",
    "rotary_percent": "--rotary-percent",
    "rotary_seq_len_interpolation_factor": "--rotary-seq-len-interpolation-factor",
    "use_rope_scaling": "--use-rope-scaling",
    "rope_scaling_factor": "--rope-scaling-factor",
    "rotary_scaling_factor": "--rotary-scaling-factor",
    "yarn_original_max_position_embeddings": "--yarn-original-max-position-embeddings",
    "yarn_beta_fast": "--yarn-beta-fast",
    "yarn_beta_slow": "--yarn-beta-slow",
    "mscale": "--mscale",
    "mscale_all_dim": "--mscale-all-dim",
    "yarn_correction_range_round_to_int": "--yarn-correction-range-round-to-int",
}
CONTEXT_DESTS = tuple(CONTEXT_FLAGS)
ROTARY_TYPES = ("rope", "yarn")


def recorded_context(record: Dict[str, Any]) -> Dict[str, Any]:
    """The context of a checkpoint's ``model_args.json`` ``record``: ``{dest: value}`` of the
    :data:`CONTEXT_DESTS` it holds (``seq_length`` from ``defaults``), and ``global_batch_size``
    (sequences per step) when the record has a ``run`` section (checkpoints since issue 45)."""
    out = {k: v for k, v in (record.get("model") or {}).items() if k in CONTEXT_FLAGS}
    defaults = record.get("defaults") or {}
    if "seq_length" in defaults:
        out["seq_length"] = defaults["seq_length"]
    run = record.get("run") or {}
    if run.get("global_batch_size") is not None:
        out["global_batch_size"] = run["global_batch_size"]
    return out


def _differs(a, b) -> bool:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
            and not isinstance(a, bool) and not isinstance(b, bool):
        return float(a) != float(b)
    return a != b


def _show(dest: str, value) -> str:
    flag = CONTEXT_FLAGS.get(dest, "--" + dest.replace("_", "-"))
    if isinstance(value, bool):
        return flag if value else f"no {flag}"
    return f"{flag} {value:g}" if isinstance(value, float) else f"{flag} {value}"


def context_changes(old: Dict[str, Any], new: Dict[str, Any]) -> List[Tuple[str, Any, Any]]:
    """``(dest, old value, new value)`` for each :data:`CONTEXT_DESTS` flag the checkpoint's
    context ``old`` records and this run's ``new`` sets to another value."""
    return [(d, old[d], new.get(d)) for d in CONTEXT_DESTS if d in old and _differs(old[d], new.get(d))]


def _change_text(dest: str, a, b) -> str:
    flag = CONTEXT_FLAGS[dest]
    if isinstance(a, bool) or isinstance(b, bool):
        return f"{flag} {'on' if a else 'off'} -> {'on' if b else 'off'}"
    show = (lambda v: f"{v:g}" if isinstance(v, float) else str(v))
    return f"{flag} {show(a)} -> {show(b)}"


def check_context_extension(old: Dict[str, Any], new: Dict[str, Any], directive: Optional[str],
                            where: str) -> List[str]:
    """The resume check of ``where`` (the checkpoint directory) from the checkpoint's context
    ``old`` (:func:`recorded_context`) and this run's flags ``new`` (``{dest: value}``, with
    ``global_batch_size``); ``directive`` is ``--extend-context``'s value (None without it).
    Returns the start-up notes; raises one-line :class:`ArgumentError` (see the module docstring)."""
    changes = context_changes(old, new)
    old_type = old.get("position_embedding_type", new.get("position_embedding_type"))
    new_type = new.get("position_embedding_type")
    if old_type == "learned_absolute":
        limit = old.get("max_position_embeddings")
        longer = [(d, new.get(d)) for d in ("seq_length", "max_position_embeddings")
                  if limit is not None and new.get(d) is not None and new[d] > limit]
        if longer or new_type != old_type:
            asked = ", ".join(_show(d, v) for d, v in longer) or _show("position_embedding_type", new_type)
            raise ArgumentError(
                f"--load {where}: the checkpoint's model has learned absolute position embeddings "
                f"for {limit} positions (--max-position-embeddings {limit}); they cannot grow past "
                f"that or become another encoding ({asked} asked): extend the context of a model "
                "trained with RoPE (--position-embedding-type rope or yarn)")
    if changes and directive is None:
        raise ArgumentError(
            f"--load {where}: this resume changes the context of the checkpoint's model: "
            + ", ".join(_change_text(d, a, b) for d, a, b in changes)
            + "; give --extend-context to make it a context-extension stage, or resume with the "
              "checkpoint's values")
    if directive is None:
        return []
    if new_type != old_type and not (old_type in ROTARY_TYPES and new_type in ROTARY_TYPES):
        raise ArgumentError(
            f"--extend-context: --position-embedding-type {old_type} -> {new_type}: an extension "
            f"stage changes the encoding only between rope and yarn (the checkpoint's weights "
            f"were trained with {old_type})")
    old_seq, new_seq = old.get("seq_length"), new.get("seq_length")
    old_gbs, new_gbs = old.get("global_batch_size"), new.get("global_batch_size")
    if directive == KEEP_TOKENS and old_gbs is not None and new_gbs is not None \
            and old_gbs != new_gbs and old_seq is not None \
            and old_seq * old_gbs != new_seq * new_gbs:
        keep = old_seq * old_gbs / new_seq
        hint = f"--global-batch-size {int(keep)}, " if keep == int(keep) else ""
        raise ArgumentError(
            f"--extend-context keeps the tokens per step: --global-batch-size {old_gbs} -> "
            f"{new_gbs} at --seq-length {old_seq} -> {new_seq} makes {old_seq * old_gbs} -> "
            f"{new_seq * new_gbs} tokens per step; give {hint}or --extend-context free-batch to "
            "change the batch freely")
    shown = [_change_text(d, a, b) for d, a, b in changes]
    if old_gbs is not None and new_gbs is not None and old_gbs != new_gbs:
        shown.append(f"--global-batch-size {old_gbs} -> {new_gbs}")
    return [f"--extend-context: a context-extension stage from {where}: "
            + (", ".join(shown) if shown else "nothing changes")]


def validate_context_extension(args: argparse.Namespace, notes: List[str],
                               training: bool = True) -> None:
    """Run :func:`check_context_extension` for a training run (``training``: validate_args'
    ``require_data``; the evaluation tools, which parse without data, evaluate at the length and
    encoding their command line gives) that resumes ``--load`` (not ``--finetune``, which starts
    a new run): the checkpoint's ``model_args.json`` against ``args``. Without a checkpoint or a
    record (checkpoints before model flags were recorded) there is nothing to compare;
    ``--extend-context`` then is refused, as it needs a resume. With context stages in one run
    (``args.context_stages``) the checkpoint of iteration ``I`` is compared with the stage that
    trained iteration ``I``."""
    directive = getattr(args, "extend_context", None)
    if not training or getattr(args, "context_stage_index", None) is not None:
        return  # a context stage's namespace: the run's own check picks the stage to compare
    if not args.load or args.finetune:
        if directive is not None:
            raise ArgumentError(f"--extend-context {directive}: needs a resume (--load DIR of a "
                                "checkpoint, without --finetune)")
        return
    from megatron.checkpoint.format import checkpoint_tag, read_model_args, read_tracker  # lazy: torch (~1 s)

    iteration = read_tracker(args.load)
    directory = os.path.join(args.load, checkpoint_tag(iteration)) if iteration is not None else None
    record = read_model_args(directory) if directory and os.path.isdir(directory) else None
    if record is None:
        if directive is not None:
            raise ArgumentError(f"--extend-context: --load {args.load} holds no checkpoint with "
                                "recorded model flags (model_args.json) to extend")
        return
    old = recorded_context(record)
    # with context stages in one run (megatron/config/context_stages.py), the checkpoint is
    # compared with the stage that trained it: a resume at or after a stage's start from that
    # run's checkpoint needs no directive
    stages = getattr(args, "context_stages", None)
    if stages is not None:
        args = stages.recorded_at(iteration).args
    if iteration == 0:
        # an imported (or untrained) checkpoint: its seq_length is the model's maximum, nothing was
        # trained at it, so a run may take any length; its encoding is still the weights'
        old.pop("seq_length", None)
        old.pop("global_batch_size", None)
    new = {d: getattr(args, d, None) for d in CONTEXT_DESTS}
    new["global_batch_size"] = args.global_batch_size
    notes.extend(check_context_extension(old, new, directive, directory))


__all__ = ["KEEP_TOKENS", "FREE_BATCH", "CONTEXT_FLAGS", "CONTEXT_DESTS", "recorded_context",
           "context_changes", "check_context_extension", "validate_context_extension"]
