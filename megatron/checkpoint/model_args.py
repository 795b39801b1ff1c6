"""The model flags a checkpoint records (``model_args.json``) and ``--use-checkpoint-args``.

Every checkpoint directory ``DIR/iter_NNNNNNN/`` holds ``model_args.json`` (read and written by
megatron/checkpoint/format.py) beside
``parallel_layout.json``: the flags that shape the model (``--num-layers``, ``--hidden-size``,
``--swiglu`` ...) and the tokenizer (``--tokenizer-type`` and its files), after ``validate_args``
filled derived values (``--ffn-hidden-size``, ``--num-query-groups``, ``--kv-channels``), plus the
padded vocabulary size the embedding was built with. Shape of the file::

    {"format_version": 1, "model": {dest: value}, "tokenizer": {dest: value},
     "defaults": {"seq_length": N}, "padded_vocab_size": V, "vocab_size": R}

``vocab_size`` is the number of rows that take probability (the tokenizer's vocabulary; the rest
of the ``padded_vocab_size`` rows are padding, megatron/model/vocab_padding.py); checkpoints that
lack it softmaxed over every row.

With ``--use-checkpoint-args`` (Megatron-LM's flag) the model and tokenizer flags come from the
checkpoint in ``--load``: a flag not given on the command line takes the checkpoint's value; a flag
given with another value is an error naming both (Megatron-LM silently keeps the command line's
value for some flags and the checkpoint's for others; a silent mix of two models is worse than a
clear error). Tokenizer flags are the exception, as in Megatron-LM: given on the command line,
they replace the checkpoint's (aliases of one tokenizer compare equal, so nothing is noted then),
provided the tokenizer's vocabulary fits the checkpoint's embedding rows. ``defaults`` (``--seq-length``) fill only flags not given: finetuning at another
sequence length is legitimate. Relative tokenizer paths are relative to the ``--load`` directory
(imported checkpoints keep their tokenizer files there, tools/checkpoint/convert_from_hf.py).
"""
import argparse
import os
from typing import Dict, Iterable, List, Optional, Set

from megatron.checkpoint.format import MODEL_ARGS_FILENAME, checkpoint_tag, read_model_args, read_tracker
from megatron.checkpoint.format import MODEL_ARGS_FORMAT_VERSION as FORMAT_VERSION
from megatron.errors import ArgumentError

# Flags (argparse dests) that shape the model; each recorded when this parser defines it.
MODEL_ARG_NAMES = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "max_position_embeddings", "normalization", "norm_epsilon", "swiglu",
    "openai_gelu", "bias_gelu_fusion", "position_embedding_type", "rotary_percent", "rotary_base",
    "untie_embeddings_and_output_weights", "disable_bias_linear", "make_vocab_size_divisible_by",
    "pad_vocab_size_to", "embed_layernorm",
    # mixture of experts (megatron/config/moe_flags.py): the experts' shapes and how tokens reach them
    "num_experts", "moe_ffn_hidden_size", "moe_layer_freq", "moe_shared_expert_intermediate_size",
    "moe_router_topk", "moe_router_pre_softmax", "moe_router_score_function", "moe_router_dtype",
    "moe_expert_capacity_factor", "moe_token_drop_policy",
)
# Tokenizer flags (dests); paths among them are stored absolute (or relative to the checkpoint
# root for imported checkpoints).
TOKENIZER_ARG_NAMES = ("tokenizer_type", "vocab_file", "merge_file", "tokenizer_model",
                       "tokenizer_name_or_path", "vocab_extra_ids")
TOKENIZER_PATH_NAMES = ("vocab_file", "merge_file", "tokenizer_model", "tokenizer_name_or_path")
# Taken from the checkpoint only when not given (they do not change the weights' shapes).
DEFAULT_ARG_NAMES = ("seq_length",)


def model_args_from_args(args: argparse.Namespace) -> dict:
    """The ``model_args.json`` record of a validated ``args`` (see the module docstring)."""
    def pick(names):
        return {n: getattr(args, n) for n in names if hasattr(args, n)}

    tokenizer = pick(TOKENIZER_ARG_NAMES)
    for name in TOKENIZER_PATH_NAMES:
        if tokenizer.get(name) and os.path.exists(tokenizer[name]):
            tokenizer[name] = os.path.abspath(tokenizer[name])
    return {"format_version": FORMAT_VERSION, "model": pick(MODEL_ARG_NAMES),
            "tokenizer": tokenizer, "defaults": pick(DEFAULT_ARG_NAMES),
            "padded_vocab_size": getattr(args, "padded_vocab_size", None),
            "vocab_size": getattr(args, "vocab_size", None)}


def resolve_tokenizer_paths(tokenizer_flags: dict, load_dir: str) -> dict:
    """A copy of a record's ``tokenizer`` flags with relative paths made relative to the
    checkpoint root ``load_dir`` (where imported checkpoints keep their tokenizer files)."""
    flags = dict(tokenizer_flags)
    for name in TOKENIZER_PATH_NAMES:
        if flags.get(name) and not os.path.isabs(flags[name]):
            flags[name] = os.path.normpath(os.path.join(load_dir, flags[name]))
    return flags


# Two spellings of one tokenizer: (type, file flag) -> the canonical pair.
_TOKENIZER_ALIASES = {("PretrainedFromHF", "tokenizer_name_or_path"):
                      ("HuggingFaceTokenizer", "tokenizer_model")}


def _canonical_tokenizer(flags: dict) -> dict:
    """``flags`` (tokenizer dests) with aliased types and their file flags in one spelling,
    unset values dropped and paths made real, so two spellings of one tokenizer compare equal."""
    out = {k: v for k, v in flags.items() if v not in (None, False, "")}
    for (alias, alias_flag), (canonical, canonical_flag) in _TOKENIZER_ALIASES.items():
        if out.get("tokenizer_type") == alias:
            out["tokenizer_type"] = canonical
            if alias_flag in out:
                out[canonical_flag] = out.pop(alias_flag)
    for name in TOKENIZER_PATH_NAMES:
        if name in out:
            out[name] = os.path.realpath(out[name])
    return out


def same_tokenizer(a: dict, b: dict) -> bool:
    """Whether tokenizer flags ``a`` and ``b`` (dests -> values) name the same tokenizer:
    ``--tokenizer-type PretrainedFromHF --tokenizer-name-or-path DIR`` (BigScience) is
    ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR`` (Megatron-LM)."""
    return _canonical_tokenizer(a) == _canonical_tokenizer(b)


def describe_tokenizer(flags: dict) -> str:
    """The tokenizer flags ``flags`` as a command line would give them (type first)."""
    given = {k: flags[k] for k in TOKENIZER_ARG_NAMES if flags.get(k) not in (None, False, "")}
    return " ".join(f"--{k.replace('_', '-')} {v}" for k, v in given.items()) or "no flags"


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
    ``model_args.json`` of the latest checkpoint in ``--load`` (see the module docstring); returns
    the record, or None without ``--use-checkpoint-args``. Raises ``ArgumentError`` naming the flag,
    the command line's value and the checkpoint's when they disagree, and when ``--load`` holds no
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
