"""Choosing the Hugging Face transformers family of this project's GPT model, and the functions
the converters call (tools/checkpoint/convert_to_hf.py, convert_from_hf.py), each delegating to
the chosen family's adapter (megatron/checkpoint/hf/gpt2.py, llama.py, bloom.py, mixtral.py),
asserting names and shapes.

A family is chosen by the position embedding: ``learned_absolute`` is GPT-2 (``GPT2LMHeadModel``:
LayerNorm, GeLU, biases), ``rope`` is Llama (``LlamaForCausalLM``: RMSNorm, SwiGLU, grouped-query
attention), ``alibi`` is BLOOM (``BloomForCausalLM``: LayerNorm, tanh GeLU, embedding LayerNorm).
A mixture-of-experts model (``--num-experts``) with RoPE is Mixtral (``MixtralForCausalLM``: the
Llama layers with every MLP a top-k softmax-routed set of SwiGLU experts). Model flags a family's
transformers class cannot represent are refused by :func:`check_exportable` with the flag named.

Weight layouts (canonical ``GPTModel`` names, megatron/model/init.py) are each family module's;
the canonical names and shapes of a model's flags (:func:`canonical_names`,
:func:`canonical_shapes`) are here. The vocabulary keeps the rows that take probability (the
checkpoint's ``model_args.json`` ``vocab_size``; the padding rows beyond it are dropped, since
transformers softmaxes over every row of ``lm_head``); a checkpoint that records no
``vocab_size`` keeps every row.
"""
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from megatron.checkpoint.hf.adapter import Family, Getter, moe_ffn_size, moe_pattern
from megatron.checkpoint.hf.bloom import BLOOM
from megatron.checkpoint.hf.gpt2 import GPT2
from megatron.checkpoint.hf.llama import LLAMA
from megatron.checkpoint.hf.mixtral import MIXTRAL
from megatron.errors import ConfigError

_BY_POSITION = {"learned_absolute": GPT2, "rope": LLAMA, "yarn": LLAMA, "alibi": BLOOM}
_BY_MODEL_TYPE = {f.model_type: f for f in (GPT2, LLAMA, BLOOM, MIXTRAL)}


def family_of(flags: dict) -> Family:
    """The family of a checkpoint's model flags (``model_args.json`` ``model``): chosen by the
    position embedding, Mixtral for a RoPE model with experts."""
    position = flags["position_embedding_type"]
    if position not in _BY_POSITION:
        raise ConfigError(f"--position-embedding-type {position}: no transformers family has it "
                          f"(exportable: {', '.join(f'{k} ({v.name})' for k, v in _BY_POSITION.items())}; "
                          "rope with --num-experts: Mixtral)")
    if position in ("rope", "yarn") and flags.get("num_experts"):
        return MIXTRAL
    return _BY_POSITION[position]


def check_exportable(flags: dict) -> Family:
    """The family of ``flags``; raises :class:`ConfigError` naming the first flag its
    transformers class cannot represent."""
    family = family_of(flags)
    family.check(flags)
    return family


def hf_config(flags: dict, vocab_size: int, dtype: torch.dtype,
              special_tokens: Optional[Dict[str, Optional[int]]] = None) -> dict:
    """The transformers ``config.json`` content for ``flags`` (checked by
    :func:`check_exportable`) with ``vocab_size`` embedding rows and weights of ``dtype``;
    ``special_tokens`` gives ``bos_token_id``/``eos_token_id`` (the tokenizer's; None: null)."""
    return check_exportable(flags).hf_config(flags, vocab_size, dtype, special_tokens)


def to_hf(name: str, tensor: torch.Tensor, flags: dict) -> Iterator[Tuple[str, torch.Tensor]]:
    """The transformers tensors made from the canonical tensor ``name`` (full, TP=1)."""
    yield from check_exportable(flags).to_hf(name, tensor, flags)


# ---------------------------------------------------------------------------- import
def flags_from_hf_config(config: dict, path: str) -> dict:
    """This project's model flags (``model_args.json`` ``model``) for a transformers
    ``config.json`` of a supported family; raises :class:`ConfigError` naming the config key it
    cannot represent or lacks."""
    try:
        flags = _flags_from_hf_config(config, path)
        config["vocab_size"]  # noqa: B018 (checked last, like the other keys)
        return flags
    except KeyError as e:
        raise ConfigError(f"--hf {path}: config.json lacks {e.args[0]!r} (needed for model_type "
                          f"{config.get('model_type')!r})") from None


def _flags_from_hf_config(config: dict, path: str) -> dict:
    model_type = config.get("model_type")
    if model_type not in _BY_MODEL_TYPE:
        raise ConfigError(f"--hf {path}: model_type {model_type!r} is not supported (supported: "
                          f"{', '.join(_BY_MODEL_TYPE)})")
    family = _BY_MODEL_TYPE[model_type]

    def refuse(key, why):
        raise ConfigError(f"--hf {path}: config.json {key}={config.get(key)!r}: {why}")

    # transformers' default: Mixtral unties, the older classes tie
    tied = bool(config.get("tie_word_embeddings", family.tied_by_default))
    base = {"untie_embeddings_and_output_weights": not tied, "pad_vocab_size_to": config.get("vocab_size"), "rotary_percent": 1.0, "rotary_base": 10000,
            "embed_layernorm": False, "openai_gelu": False, "bias_gelu_fusion": False,
            "swiglu": False, "disable_bias_linear": False}
    return family.flags_from_config(config, refuse, base)


# ---------------------------------------------------------------------------- canonical names
def _mlp_width(name: str, flags: dict) -> int:
    """Hidden width of the MLP whose ``linear_fc1``/``linear_fc2`` is the canonical ``name``: an
    expert's (``--moe-ffn-hidden-size``), the shared expert's, or the dense MLP's."""
    if ".mlp.experts." in name:
        return moe_ffn_size(flags)
    if ".mlp.shared_experts." in name:
        return flags["moe_shared_expert_intermediate_size"]
    return flags["ffn_hidden_size"]


def canonical_shapes(flags: dict, vocab_rows: int) -> Dict[str, Tuple[int, ...]]:
    """Full (TP=1) shape of every canonical parameter of a model with ``flags`` and
    ``vocab_rows`` embedding rows (megatron-core's local layer spec)."""
    h, hd = flags["hidden_size"], flags["kv_channels"]
    qkv = (flags["num_attention_heads"] + 2 * flags["num_query_groups"]) * hd
    gated = 2 if flags["swiglu"] else 1
    shapes = {}
    for name in canonical_names(flags):
        module, leaf = name.rsplit(".", 2)[-2:]
        rows = {"linear_qkv": (qkv, h), "linear_proj": (h, flags["num_attention_heads"] * hd),
                "router": (flags.get("num_experts"), h)}
        if module in ("linear_fc1", "linear_fc2"):
            width = _mlp_width(name, flags)
            rows[module] = (width * gated, h) if module == "linear_fc1" else (h, width)
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            shapes[name] = (vocab_rows, h)
        elif name == "embedding.position_embeddings.weight":
            shapes[name] = (flags["max_position_embeddings"], h)
        elif module in rows:
            shapes[name] = rows[module] if leaf == "weight" else (rows[module][0],)
        else:  # norms
            shapes[name] = (h,)
    return shapes


def _mlp_names(prefix: str, flags: dict, moe: bool) -> List[str]:
    """Canonical MLP parameter names of the layer ``prefix`` (``decoder.layers.N.``): the dense
    MLP's, or an MoE layer's router, experts (global ids) and shared expert (no biases in
    megatron-core)."""
    bias = not flags["disable_bias_linear"]

    def linear(module: str, with_bias: bool = bias) -> List[str]:
        return [f"{prefix}{module}.weight"] + ([f"{prefix}{module}.bias"] if with_bias else [])

    if not moe:
        return linear("mlp.linear_fc1") + linear("mlp.linear_fc2")
    names = linear("mlp.router")
    for e in range(flags["num_experts"]):
        names += linear(f"mlp.experts.local_experts.{e}.linear_fc1")
        names += linear(f"mlp.experts.local_experts.{e}.linear_fc2")
    if flags.get("moe_shared_expert_intermediate_size"):
        names += linear("mlp.shared_experts.linear_fc1", False)
        names += linear("mlp.shared_experts.linear_fc2", False)
    return names


def canonical_names(flags: dict) -> List[str]:
    """The canonical ``GPTModel`` parameter names of a model with ``flags``."""
    bias = not flags["disable_bias_linear"]
    norm = ["weight"] + (["bias"] if flags["normalization"] == "LayerNorm" else [])
    names = ["embedding.word_embeddings.weight"]
    if flags["position_embedding_type"] == "learned_absolute":
        names.append("embedding.position_embeddings.weight")
    if flags.get("embed_layernorm"):
        names += ["embedding.word_embeddings.norm.weight", "embedding.word_embeddings.norm.bias"]
    for i, moe in enumerate(moe_pattern(flags)):
        p = f"decoder.layers.{i}."
        names += [p + f"input_layernorm.{leaf}" for leaf in norm]
        for module in ("self_attention.linear_qkv", "self_attention.linear_proj"):
            names += [p + f"{module}.weight"] + ([p + f"{module}.bias"] if bias else [])
        names += [p + f"pre_mlp_layernorm.{leaf}" for leaf in norm]
        names += _mlp_names(p, flags, bool(moe))
    names += [f"decoder.final_layernorm.{leaf}" for leaf in norm]
    if flags["untie_embeddings_and_output_weights"]:
        names.append("output_layer.weight")
    return names


def hf_sources(name: str, flags: dict) -> List[str]:
    """The transformers tensor names the canonical tensor ``name`` is made from."""
    return check_exportable(flags).hf_sources(name, flags)


def from_hf(name: str, get: Getter, flags: dict) -> torch.Tensor:
    """The canonical tensor ``name`` built from transformers tensors (``get(hf_name)``): the
    inverse of :func:`to_hf`."""
    return check_exportable(flags).from_hf(name, get, flags)
