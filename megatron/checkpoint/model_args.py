"""The model flags a checkpoint records (``model_args.json``) and ``--use-checkpoint-args``: which
flags, and how two records' tokenizers compare. The record is made from the validated flags, and
``--use-checkpoint-args`` applied to them, by megatron/config/checkpoint_args.py (the flags are
read in megatron/config/ only).

Every checkpoint directory ``DIR/iter_NNNNNNN/`` holds ``model_args.json`` (read and written by
megatron/checkpoint/format.py) beside
``parallel_layout.json``: the flags that shape the model (``--num-layers``, ``--hidden-size``,
``--swiglu`` ...) and the tokenizer (``--tokenizer-type`` and its files), after ``validate_args``
filled derived values (``--ffn-hidden-size``, ``--num-query-groups``, ``--kv-channels``), plus the
padded vocabulary size the embedding was built with. Shape of the file::

    {"format_version": 1, "model": {dest: value}, "tokenizer": {dest: value},
     "defaults": {"seq_length": N}, "run": {"global_batch_size": B},
     "padded_vocab_size": V, "vocab_size": R}

``run`` (since issue 45; absent before) is not a model flag: the resume check of
``--extend-context`` (megatron/config/context_extension.py) reads the checkpoint's tokens per step
from it, and ``--use-checkpoint-args`` never takes it.

``vocab_size`` is the number of rows that take probability (the tokenizer's vocabulary; the rest
of the ``padded_vocab_size`` rows are padding, megatron/model/vocab_padding.py); checkpoints that
lack it softmaxed over every row.

With ``--use-checkpoint-args`` (Megatron-LM's flag) the model and tokenizer flags come from the
checkpoint in ``--load``: a flag not given on the command line takes the checkpoint's value; a flag
given with another value is an error naming both. The sequence-length and position-encoding
flags are the exception: the command line's value is kept, and a training resume refuses the
change without ``--extend-context`` (megatron/config/context_extension.py). (Megatron-LM silently
keeps the command line's value for some flags and the checkpoint's for others; a silent mix of
two models is worse than a clear error.) Tokenizer flags are another exception, as in Megatron-LM: given on the command line,
they replace the checkpoint's (aliases of one tokenizer compare equal, so nothing is noted then),
provided the tokenizer's vocabulary fits the checkpoint's embedding rows. ``defaults`` (``--seq-length``) fill only flags not given: finetuning at another
sequence length is legitimate. Relative tokenizer paths are relative to the ``--load`` directory
(imported checkpoints keep their tokenizer files there, tools/checkpoint/convert_from_hf.py).
"""
import os

# Flags (argparse dests) that shape the model; each recorded when this parser defines it.
MODEL_ARG_NAMES = (
    "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
    "kv_channels", "max_position_embeddings", "normalization", "norm_epsilon", "swiglu",
    "openai_gelu", "bias_gelu_fusion", "position_embedding_type", "rotary_percent", "rotary_base",
    # RoPE's scalings (megatron/config/model_flags.py): linear, Llama 3.1's, YaRN's
    "rotary_seq_len_interpolation_factor", "use_rope_scaling", "rope_scaling_factor",
    "rotary_scaling_factor", "yarn_original_max_position_embeddings", "yarn_beta_fast",
    "yarn_beta_slow", "mscale", "mscale_all_dim", "yarn_correction_range_round_to_int",
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
