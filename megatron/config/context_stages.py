"""Context stages in one run (docs/context_extension.md#in-one-run): the ``context_stages`` list of
a ``--lr-schedule-config`` file, where at an iteration the sequence length, the position encoding
and the global batch change, as a resume with those flags and ``--extend-context`` would change
them.

::

    context_stages:
      - {start: 6, seq_length: 256, max_position_embeddings: 256, rotary_base: 500000,
         global_batch_size: 4}

Each stage is the command line of the stage before it with the stage's values given on it (the
flags' dests, :data:`STAGE_VALUE_KEYS`), validated in full (``validate_args`` on that namespace:
its typed configs are those of the two-launch version's second launch). ``start: K`` (iterations)
means the first ``K`` iterations train at the stage before and iteration ``K + 1`` on at this one,
as a resume from the checkpoint of iteration ``K`` would. The change between two stages follows
``--extend-context``'s rule (megatron/config/context_extension.py): the encoding changes only
between rope and yarn, learned absolute positions do not grow, and the tokens per step
(``seq_length x global_batch_size``) are kept unless the stage says ``extend_context:
free-batch``.

:func:`validate_context_stages` builds ``args.context_stages`` (:class:`ContextStages`, None
without the key); the training loop switches at each start (megatron/train/context_stages.py) and
the resume check of ``--load`` compares a checkpoint with the stage that trained it
(:meth:`ContextStages.recorded_at`).
"""
import argparse
import copy
import math
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from megatron.config.context_extension import (
    CONTEXT_DESTS,
    CONTEXT_FLAGS,
    FREE_BATCH,
    KEEP_TOKENS,
    ROTARY_TYPES,
    context_changes,
)
from megatron.errors import ArgumentError

STAGES_KEY = "context_stages"
# a stage's keys besides ``start`` and ``extend_context``: argparse dests and the type of value
STAGE_VALUE_KEYS: Dict[str, type] = {
    "seq_length": int, "max_position_embeddings": int, "position_embedding_type": str,
    "rotary_base": int, "rotary_percent": float, "rotary_seq_len_interpolation_factor": float,
    "use_rope_scaling": bool, "rope_scaling_factor": float, "rotary_scaling_factor": float,
    "yarn_original_max_position_embeddings": int, "yarn_beta_fast": float,
    "yarn_beta_slow": float, "mscale": float, "mscale_all_dim": float,
    "yarn_correction_range_round_to_int": bool, "global_batch_size": int}
STAGE_KEYS = ("start",) + tuple(STAGE_VALUE_KEYS) + ("extend_context",)
FLAGS = {**CONTEXT_FLAGS, "global_batch_size": "--global-batch-size"}
# what the entry points set in the validated namespace (the tokenizer and its embedding rows)
ENTRY_POINT_KEYS = ("tokenizer", "padded_vocab_size", "vocab_size")
# keys whose value may be null (the flag's "none")
NULLABLE = ("rotary_seq_len_interpolation_factor",)
assert set(CONTEXT_DESTS) <= set(STAGE_VALUE_KEYS)


@dataclass(frozen=True)
class ContextStage:
    """One stage: ``index`` (0: the command line's flags), the iteration it trains from
    (``start``: iterations ``start + 1 ..``), its validated namespace ``args`` (with its typed
    configs, ``args.run_config``), ``where`` it is written, its batch rule ``directive``
    (``keep-tokens`` or ``free-batch``; None for stage 0) and ``change``: what it changes of the
    stage before, one phrase per flag (empty for stage 0)."""

    index: int
    start: int
    args: argparse.Namespace
    where: str
    directive: Optional[str]
    change: Tuple[str, ...]

    def __repr__(self) -> str:  # vars(args) goes to W&B's config as text: keep it one short line
        return f"ContextStage({self.where}: {', '.join(self.change) or 'the flags'})"


@dataclass(frozen=True)
class ContextStages:
    """The stages of one run, stage 0 (the flags) first, their starts increasing."""

    stages: Tuple[ContextStage, ...]
    where: str

    def __repr__(self) -> str:
        return f"ContextStages({'; '.join(repr(s) for s in self.stages)})"

    def at(self, iteration: int) -> ContextStage:
        """The stage that trains the iteration after ``iteration`` completed ones."""
        return [s for s in self.stages if s.start <= int(iteration)][-1]

    def recorded_at(self, iteration: int) -> ContextStage:
        """The stage whose context a checkpoint of ``iteration`` records: the one that trained
        its last iteration (stage 0 at iteration 0). A checkpoint at a stage's start is the stage
        before's, as the first launch of the two-launch version leaves it."""
        return self.at(max(int(iteration) - 1, 0))

    def end(self, stage: ContextStage, train_iters: int) -> int:
        """The iteration after which ``stage`` ends: the next stage's start, or ``train_iters``."""
        later = [s.start for s in self.stages if s.index > stage.index]
        return later[0] if later else int(train_iters)

    def samples_before(self, stage: ContextStage) -> int:
        """Global samples consumed before ``stage`` starts, by the stages before it."""
        return sum(self._spans(stage)[0])

    def tokens_before(self, stage: ContextStage) -> int:
        """Tokens trained before ``stage`` starts: each earlier stage's samples at its length."""
        return sum(self._spans(stage)[1])

    def _spans(self, stage: ContextStage) -> Tuple[List[int], List[int]]:
        samples, tokens = [], []
        for s, nxt in zip(self.stages, self.stages[1:], strict=False):
            if s.index >= stage.index:
                break
            n = (nxt.start - s.start) * int(s.args.global_batch_size)
            samples.append(n)
            tokens.append(n * int(s.args.seq_length))
        return samples, tokens

    def tokens(self, consumed_samples: int) -> int:
        """Tokens trained in the first ``consumed_samples`` samples of the run: each sample at
        the length of the stage that drew it."""
        consumed = int(consumed_samples)
        stage = [s for s in self.stages if self.samples_before(s) <= consumed][-1]
        return self.tokens_before(stage) + (consumed - self.samples_before(stage)) * int(
            stage.args.seq_length)


def stage_args(args: argparse.Namespace, stage: ContextStage) -> argparse.Namespace:
    """``stage``'s namespace with what the entry point added to ``args`` after validation (the
    tokenizer and the embedding rows: megatron/config/tokenizer_flags.py
    ``apply_tokenizer_setup``); ``args`` itself for stage 0."""
    if stage.index == 0:
        return args
    for key, value in vars(args).items():
        if key in ENTRY_POINT_KEYS or not hasattr(stage.args, key):
            setattr(stage.args, key, value)
    return stage.args


def _number(value, kind: type, key: str, where: str):
    """``value`` of a stage's ``key`` as ``kind`` (a finite number; an integer for int keys; a
    string that spells a number, as YAML 1.1 leaves ``1e-4``, is that number)."""
    bad = ArgumentError(f"{where}: {key} {value!r}: expected "
                        f"{'an integer' if kind is int else 'a number'}")
    if isinstance(value, bool):
        raise bad
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise bad from None
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad
    if kind is int:
        if float(value) != int(value):
            raise bad
        return int(value)
    return float(value)


def parse_context_stages(entries, where: str) -> List[Dict[str, Any]]:
    """The ``context_stages`` list of the file ``where`` names, each entry as ``{key: value}``
    with its values typed (:data:`STAGE_VALUE_KEYS`), ``start`` an integer > 0 and increasing,
    ``extend_context`` ``keep-tokens`` (the default) or ``free-batch``. One-line
    :class:`ArgumentError` naming the entry, the key, the value and what is allowed otherwise."""
    if not isinstance(entries, list) or not entries:
        raise ArgumentError(f"{where}: {STAGES_KEY} must be a non-empty list of stages "
                            f"({{start: ITERATION, seq_length: ..., ...}}), got {entries!r}")
    out, last = [], 0
    for i, entry in enumerate(entries):
        label = f"{where} {STAGES_KEY}[{i}]"
        if not isinstance(entry, dict):
            raise ArgumentError(f"{label}: expected a mapping {{start: ITERATION, seq_length: ..., "
                                f"...}}, got {entry!r}")
        unknown = [str(k) for k in entry if k not in STAGE_KEYS]
        if unknown:
            raise ArgumentError(f"{label}: unknown key {unknown[0]!r} (allowed: "
                                f"{', '.join(STAGE_KEYS)})")
        if "start" not in entry:
            raise ArgumentError(f"{label}: missing key 'start' (the iteration after which the "
                                "stage trains)")
        start = _number(entry["start"], int, "start", label)
        if start <= last:
            raise ArgumentError(f"{label}: start {start} must be > "
                                f"{'0' if not out else f'the stage before it ({last})'}: a "
                                "stage trains from the iteration after its start")
        parsed: Dict[str, Any] = {"start": start}
        for key, kind in STAGE_VALUE_KEYS.items():
            if key not in entry:
                continue
            value = entry[key]
            if value is None and key in NULLABLE:
                parsed[key] = None
            elif kind is bool:
                if not isinstance(value, bool):
                    raise ArgumentError(f"{label}: {key} {value!r}: expected true or false")
                parsed[key] = value
            elif kind is str:
                if value not in ROTARY_TYPES:
                    raise ArgumentError(f"{label}: {key} {value!r}: a stage changes the encoding "
                                        f"only between {' and '.join(ROTARY_TYPES)}")
                parsed[key] = value
            else:
                parsed[key] = _number(value, kind, key, label)
        directive = entry.get("extend_context", KEEP_TOKENS)
        if directive not in (KEEP_TOKENS, FREE_BATCH):
            raise ArgumentError(f"{label}: extend_context {directive!r}: expected {KEEP_TOKENS} "
                                f"(the default: tokens per step kept) or {FREE_BATCH}")
        parsed["extend_context"] = directive
        if len(parsed) == 2:
            raise ArgumentError(f"{label}: the stage changes nothing; give at least one of "
                                f"{', '.join(STAGE_VALUE_KEYS)}")
        out.append(parsed)
        last = start
    return out


def _show(value) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"{value:g}" if isinstance(value, float) else str(value)


def _context(ns: argparse.Namespace) -> Dict[str, Any]:
    out = {d: getattr(ns, d, None) for d in CONTEXT_DESTS}
    out["global_batch_size"] = ns.global_batch_size
    return out


def stage_change(old: argparse.Namespace, new: argparse.Namespace, directive: str,
                 label: str) -> Tuple[str, ...]:
    """What the stage ``new`` changes of the validated stage before it ``old``, one phrase per
    flag (``--seq-length 64 -> 256``), under ``--extend-context``'s rule with ``directive``
    (module docstring); one-line :class:`ArgumentError` naming the stage ``label`` otherwise."""
    a, b = _context(old), _context(new)
    old_type, new_type = a["position_embedding_type"], b["position_embedding_type"]
    if old_type != new_type and not (old_type in ROTARY_TYPES and new_type in ROTARY_TYPES):
        raise ArgumentError(f"{label}: position_embedding_type {old_type} -> {new_type}: a stage "
                            f"changes the encoding only between rope and yarn (the weights were "
                            f"trained with {old_type})")
    if old_type == "learned_absolute" and (
            b["max_position_embeddings"] != a["max_position_embeddings"]
            or b["seq_length"] > a["max_position_embeddings"]):
        raise ArgumentError(
            f"{label}: the model has learned absolute position embeddings for "
            f"{a['max_position_embeddings']} positions (--max-position-embeddings "
            f"{a['max_position_embeddings']}); a stage cannot change them (seq_length "
            f"{b['seq_length']}, max_position_embeddings {b['max_position_embeddings']} asked): "
            "extend the context of a model trained with RoPE (position_embedding_type rope or yarn)")
    old_tokens = a["seq_length"] * a["global_batch_size"]
    new_tokens = b["seq_length"] * b["global_batch_size"]
    if directive == KEEP_TOKENS and a["global_batch_size"] != b["global_batch_size"] \
            and old_tokens != new_tokens:
        keep = old_tokens / b["seq_length"]
        hint = f"global_batch_size: {int(keep)}, " if keep == int(keep) else ""
        raise ArgumentError(
            f"{label}: the stage keeps the tokens per step (extend_context: {KEEP_TOKENS}): "
            f"global_batch_size {a['global_batch_size']} -> {b['global_batch_size']} at "
            f"seq_length {a['seq_length']} -> {b['seq_length']} makes {old_tokens} -> "
            f"{new_tokens} tokens per step; give {hint}or extend_context: {FREE_BATCH} to change "
            "the batch freely")
    shown = [f"{CONTEXT_FLAGS[d]} {_show(x)} -> {_show(y)}" for d, x, y in context_changes(a, b)]
    if a["global_batch_size"] != b["global_batch_size"]:
        shown.append(f"--global-batch-size {a['global_batch_size']} -> {b['global_batch_size']}")
    if not shown:
        raise ArgumentError(f"{label}: the stage changes nothing of the stage before it")
    return tuple(shown)


def _refusals(args, where: str, entries: Sequence[Dict[str, Any]]) -> None:
    """What context stages cannot run with, one line each."""
    if args.use_checkpoint_args:
        raise ArgumentError(f"{where}: {STAGES_KEY} with --use-checkpoint-args: the stages set the "
                            "context by iteration from the command line's flags; give the model "
                            "flags instead of taking them from the checkpoint")
    if args.train_samples is not None or args.train_tokens is not None:
        flag = ("--train-samples", args.train_samples) if args.train_samples is not None \
            else ("--train-tokens", args.train_tokens)
        raise ArgumentError(f"{where}: {STAGES_KEY} need --train-iters: the stages' batches and "
                            f"lengths differ, so {flag[0]} {flag[1]} is no fixed number of "
                            "iterations")
    if args.rampup_batch_size is not None or args.step_batch_size_schedule is not None:
        flag = ("--rampup-batch-size " + " ".join(map(str, args.rampup_batch_size))
                if args.rampup_batch_size is not None
                else f"--step-batch-size-schedule '{args.step_batch_size_schedule}'")
        raise ArgumentError(f"{where}: {STAGES_KEY} set the global batch by iteration and {flag} "
                            "by samples; give one")
    if args.seq_length_plan is not None:
        raise ArgumentError(f"{where}: {STAGES_KEY} and a sequence-length curriculum "
                            "(--seq-length-schedule, seq_length_schedule, DeepSpeed's "
                            "curriculum_learning) both set the sequence length; give one")
    if getattr(args, "packed_samples", False) and any("seq_length" in e for e in entries):
        raise ArgumentError(f"{where}: {STAGES_KEY} change seq_length, and packed T0 data cannot "
                            "continue across a change of the sequence length (its packs are built "
                            "for one length)")
    iters = args.train_iters
    late = [e["start"] for e in entries if e["start"] >= iters]
    if late:
        raise ArgumentError(f"{where}: {STAGES_KEY} start {late[0]} is not before the end of "
                            f"training (--train-iters {iters})")


def validate_context_stages(args, raw: Optional[Dict[str, Any]], world_size: int,
                            require_data: bool, validate: Callable, notes: List[str]) -> None:
    """``args.context_stages``: the :class:`ContextStages` of the ``context_stages`` key of
    ``--lr-schedule-config`` (None without), each stage ``raw`` (the namespace's values before
    validation) with the stages' values up to it set as given flags and validated by
    ``validate(namespace, world_size, require_data)`` (``validate_args``); errors name the
    stage; the start-up line goes to ``notes``. A stage's own namespace gets None."""
    args.context_stages = None
    config = args.lr_schedule_config_dict
    if getattr(args, "context_stage_index", None) is not None or not config \
            or STAGES_KEY not in config:
        return
    where = f"--lr-schedule-config {args.lr_schedule_config}"
    entries = parse_context_stages(config[STAGES_KEY], where)
    _refusals(args, where, entries)
    stages = [ContextStage(0, 0, args, "the command line", None, ())]
    values: Dict[str, Any] = {}
    given_before = dict(raw.get("given_flags") or {})
    for i, entry in enumerate(entries):
        label = f"{where} {STAGES_KEY}[{i}] (from iteration {entry['start']})"
        values.update({k: v for k, v in entry.items() if k in STAGE_VALUE_KEYS})
        ns = argparse.Namespace(**copy.deepcopy(raw))
        given = dict(given_before)
        for key, value in values.items():
            # a value at the flag's default that the command line did not give stays "not given"
            if key in given_before or value != raw.get(key):
                given[key] = FLAGS[key]
            setattr(ns, key, value)
        ns.given_flags = given
        ns.context_stage_index = i + 1
        try:
            validate(ns, world_size, require_data)
        except ArgumentError as e:
            raise ArgumentError(f"{label}: {e}") from None
        change = stage_change(stages[-1].args, ns, entry["extend_context"], label)
        stages.append(ContextStage(i + 1, entry["start"], ns, f"{where} {STAGES_KEY}[{i}]",
                                   entry["extend_context"], change))
    args.context_stages = ContextStages(tuple(stages), where)
    notes.append(stages_note(args.context_stages))


def stages_note(stages: ContextStages) -> str:
    """The start-up line of a run's context stages."""
    parts = [f"after iteration {s.start}: {', '.join(s.change)}" for s in stages.stages[1:]]
    return f"context stages in one run ({stages.where}): " + "; ".join(parts)


__all__ = ["STAGES_KEY", "STAGE_KEYS", "STAGE_VALUE_KEYS", "ContextStage", "ContextStages",
           "parse_context_stages", "stage_change", "stage_args", "validate_context_stages",
           "stages_note"]
