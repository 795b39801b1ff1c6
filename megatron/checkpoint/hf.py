"""Hugging Face transformers families of this project's GPT model: one ``to_hf``/``from_hf`` pair
per family, asserting names and shapes.

A family is chosen by the position embedding: ``learned_absolute`` is GPT-2 (``GPT2LMHeadModel``:
LayerNorm, GeLU, biases), ``rope`` is Llama (``LlamaForCausalLM``: RMSNorm, SwiGLU, grouped-query
attention), ``alibi`` is BLOOM (``BloomForCausalLM``: LayerNorm, tanh GeLU, embedding LayerNorm).
A mixture-of-experts model (``--num-experts``) with RoPE is Mixtral (``MixtralForCausalLM``: the
Llama layers with every MLP a top-k softmax-routed set of SwiGLU experts). Model flags a family's
transformers class cannot represent are refused by :func:`check_exportable` with the flag named.

Weight layouts (canonical ``GPTModel`` names, megatron/model/init.py):

- ``linear_qkv`` rows are grouped per query group: for each of the ``ng`` groups, its
  ``nh / ng`` query heads, then its key head, then its value head (``kv_channels`` rows each).
  BLOOM's ``query_key_value`` is exactly that with ``ng = nh``; GPT-2's ``c_attn`` is
  ``[Q; K; V]`` transposed (``Conv1D`` stores ``[in, out]``); Llama has ``q_proj``/``k_proj``/
  ``v_proj``, query heads in group order (key head j serves query heads j*nh/ng ...).
- ``linear_fc1`` with SwiGLU is ``[gate; up]`` (megatron-core applies the activation to the first
  half), Llama's ``gate_proj`` and ``up_proj``.
- Mixtral (the Hub's per-expert names, which transformers' ``save_pretrained`` writes and loads):
  ``mlp.router.weight`` is ``block_sparse_moe.gate.weight``; expert E's (the global id)
  ``linear_fc1`` is ``[w1; w3]`` (gate; up) of ``block_sparse_moe.experts.E``, its ``linear_fc2``
  is ``w2``. transformers >= 5 holds the experts fused in memory (``mlp.experts.gate_up_proj``
  ``[E, 2 x ffn, hidden]`` = every expert's ``[w1; w3]``, ``mlp.experts.down_proj``); files in that
  form are read through :func:`per_expert_view`.
- The vocabulary keeps the rows that take probability (the checkpoint's ``model_args.json``
  ``vocab_size``; the padding rows beyond it are dropped, since transformers softmaxes over every
  row of ``lm_head``); a checkpoint that records no ``vocab_size`` keeps every row.
- GeLU is the form megatron/model/gelu.py gives: ``gelu_new`` (tanh) or ``gelu`` (erf).
"""
import functools
import re
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch

from megatron.errors import ConfigError
from megatron.model.gelu import TANH, gelu_form
from megatron.model.moe import moe_layer_pattern

Getter = Callable[[str], torch.Tensor]


# ---------------------------------------------------------------------------- QKV layout
def split_qkv(qkv: torch.Tensor, heads: int, groups: int, head_dim: int
              ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q [heads*hd, ...], k [groups*hd, ...], v [groups*hd, ...])`` of megatron-core's grouped
    ``linear_qkv`` weight or bias."""
    rest = qkv.shape[1:]
    per_group = heads // groups
    view = qkv.reshape(groups, per_group + 2, head_dim, *rest)
    q = view[:, :per_group].reshape(heads * head_dim, *rest)
    return q, view[:, per_group].reshape(groups * head_dim, *rest), \
        view[:, per_group + 1].reshape(groups * head_dim, *rest)


def merge_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, heads: int, groups: int,
              head_dim: int) -> torch.Tensor:
    """Inverse of :func:`split_qkv`."""
    rest = q.shape[1:]
    per_group = heads // groups
    return torch.cat([q.reshape(groups, per_group, head_dim, *rest),
                      k.reshape(groups, 1, head_dim, *rest),
                      v.reshape(groups, 1, head_dim, *rest)], dim=1).reshape(-1, *rest)


# ---------------------------------------------------------------------------- families
@dataclass(frozen=True)
class Family:
    """One transformers family: ``name``, its ``architecture`` class name, ``model_type`` and the
    flags that choose it (``chosen_by``, for error messages)."""

    name: str
    architecture: str
    model_type: str
    chosen_by: str = "--position-embedding-type"


GPT2 = Family("GPT-2", "GPT2LMHeadModel", "gpt2")
LLAMA = Family("Llama", "LlamaForCausalLM", "llama")
BLOOM = Family("BLOOM", "BloomForCausalLM", "bloom")
MIXTRAL = Family("Mixtral", "MixtralForCausalLM", "mixtral",
                 "--position-embedding-type rope with --num-experts")
_BY_POSITION = {"learned_absolute": GPT2, "rope": LLAMA, "alibi": BLOOM}
_BY_MODEL_TYPE = {f.model_type: f for f in (GPT2, LLAMA, BLOOM, MIXTRAL)}
# Families with Llama's layers (RMSNorm, RoPE, SwiGLU, q/k/v projections): dense or MoE.
_LLAMA_STYLE = (LLAMA, MIXTRAL)


def family_of(flags: dict) -> Family:
    """The family of a checkpoint's model flags (``model_args.json`` ``model``): chosen by the
    position embedding, Mixtral for a RoPE model with experts."""
    position = flags["position_embedding_type"]
    if position not in _BY_POSITION:
        raise ConfigError(f"--position-embedding-type {position}: no transformers family has it "
                          f"(exportable: {', '.join(f'{k} ({v.name})' for k, v in _BY_POSITION.items())}; "
                          "rope with --num-experts: Mixtral)")
    if position == "rope" and flags.get("num_experts"):
        return MIXTRAL
    return _BY_POSITION[position]


def _refuse(family: Family, flag: str, why: str) -> None:
    raise ConfigError(f"{flag}: {family.architecture} ({family.name} style, chosen by "
                      f"{family.chosen_by}) cannot represent it: {why}")


def moe_pattern(flags: dict) -> List[int]:
    """1 for each MoE layer of a model with ``flags``, 0 for each dense one (all 0 without
    ``--num-experts``)."""
    if not flags.get("num_experts"):
        return [0] * flags["num_layers"]
    return moe_layer_pattern(flags.get("moe_layer_freq", 1), flags["num_layers"])


def moe_ffn_size(flags: dict) -> int:
    """Hidden size of each expert's MLP (``--moe-ffn-hidden-size``, default ``--ffn-hidden-size``)."""
    return flags.get("moe_ffn_hidden_size") or flags["ffn_hidden_size"]


def _check_mixtral(flags: dict) -> None:
    """Raise :class:`ConfigError` naming the first MoE flag ``MixtralForCausalLM`` cannot
    represent: Mixtral's router takes a softmax over every expert's logit, keeps the top-k and
    renormalises them to sum 1 (megatron-core's softmax over the top-k logits), every layer is
    MoE, every routed token is computed, no shared expert, no biases."""
    family, experts, topk = MIXTRAL, flags["num_experts"], flags.get("moe_router_topk", 2)
    if not flags["disable_bias_linear"]:
        _refuse(family, "no --disable-bias-linear", "its linear layers and router have no biases")
    if not all(moe_pattern(flags)):
        _refuse(family, f"--moe-layer-freq {flags.get('moe_layer_freq')}", "every layer of it is "
                "MoE (--moe-layer-freq 1); it has no dense MLP layers")
    shared = flags.get("moe_shared_expert_intermediate_size")
    if shared:
        _refuse(family, f"--moe-shared-expert-intermediate-size {shared}", "it has no shared expert")
    score = flags.get("moe_router_score_function", "softmax")
    if score != "softmax":
        _refuse(family, f"--moe-router-score-function {score}", "its router scores the experts "
                "with a softmax")
    if flags.get("moe_router_pre_softmax") and topk < experts:
        _refuse(family, "--moe-router-pre-softmax", f"its router renormalises the top-{topk} "
                "probabilities to sum 1 (megatron-core's softmax over the top-k logits, without "
                "--moe-router-pre-softmax); pre-softmax gates of the top "
                f"{topk} of {experts} experts are the probabilities, not renormalised"
                + (" (a top-1 Mixtral gate is always 1)" if topk == 1 else ""))
    capacity = flags.get("moe_expert_capacity_factor")
    if capacity is not None:
        _refuse(family, f"--moe-expert-capacity-factor {capacity}", "its experts compute every "
                "token routed to them (dropless); token dropping changes the outputs")
    balancing = flags.get("moe_router_load_balancing_type")
    if balancing == "sinkhorn":
        _refuse(family, "--moe-router-load-balancing-type sinkhorn", "Sinkhorn routing gates top-1 "
                "by a sigmoid, its router by a renormalised softmax")


def check_exportable(flags: dict) -> Family:
    """The family of ``flags``; raises :class:`ConfigError` naming the first flag its
    transformers class cannot represent."""
    family = family_of(flags)
    heads, groups = flags["num_attention_heads"], flags["num_query_groups"]
    if flags.get("num_experts") and family is not MIXTRAL:
        _refuse(family, f"--num-experts {flags['num_experts']}", "its MLP is dense (MoE models "
                "export as MixtralForCausalLM: --position-embedding-type rope, RMSNorm, --swiglu)")
    if flags.get("embed_layernorm") and family is not BLOOM:
        _refuse(family, "--embed-layernorm", "it has no LayerNorm on the word embeddings")
    if family in (GPT2, BLOOM):
        if flags["normalization"] != "LayerNorm":
            _refuse(family, f"--normalization {flags['normalization']}", "it has LayerNorm only")
        if flags["swiglu"]:
            _refuse(family, "--swiglu", "its MLP is GeLU")
        if flags["disable_bias_linear"]:
            _refuse(family, "--disable-bias-linear", "its linear layers have biases")
        if groups != heads:
            _refuse(family, f"--num-query-groups {groups}", "it has multi-head attention only "
                    f"(query groups = --num-attention-heads {heads})")
        if flags["kv_channels"] * heads != flags["hidden_size"]:
            _refuse(family, f"--kv-channels {flags['kv_channels']}", "its head size is "
                    "--hidden-size / --num-attention-heads")
    if family is BLOOM:
        if not flags.get("embed_layernorm"):
            _refuse(family, "no --embed-layernorm", "BLOOM always normalises the word embeddings")
        if gelu_form(flags) != TANH:
            _refuse(family, "--no-bias-gelu-fusion (erf GeLU)", "BLOOM's GeLU is the tanh "
                    "approximation; train with the default bias-GeLU rule or --openai-gelu")
    if family in _LLAMA_STYLE:
        if flags["normalization"] != "RMSNorm":
            _refuse(family, f"--normalization {flags['normalization']}", "it has RMSNorm only")
        if not flags["swiglu"]:
            _refuse(family, "no --swiglu", "its MLP is SwiGLU")
        if flags["rotary_percent"] != 1.0:
            _refuse(family, f"--rotary-percent {flags['rotary_percent']}", "it rotates every "
                    "channel of each head")
    if family is MIXTRAL:
        _check_mixtral(flags)
    return family


def hf_config(flags: dict, vocab_size: int, dtype: torch.dtype,
              special_tokens: Optional[Dict[str, Optional[int]]] = None) -> dict:
    """The transformers ``config.json`` content for ``flags`` (checked by
    :func:`check_exportable`) with ``vocab_size`` embedding rows and weights of ``dtype``;
    ``special_tokens`` gives ``bos_token_id``/``eos_token_id`` (the tokenizer's; None: null)."""
    family = check_exportable(flags)
    tied = not flags["untie_embeddings_and_output_weights"]
    special = {"bos_token_id": None, "eos_token_id": None, **(special_tokens or {})}
    common = {"architectures": [family.architecture], "model_type": family.model_type,
              "vocab_size": vocab_size, "tie_word_embeddings": tied,
              "torch_dtype": str(dtype).replace("torch.", ""), "use_cache": True, **special}
    if family is GPT2:
        return {**common, "n_embd": flags["hidden_size"], "n_layer": flags["num_layers"],
                "n_head": flags["num_attention_heads"], "n_inner": flags["ffn_hidden_size"],
                "n_positions": flags["max_position_embeddings"],
                "layer_norm_epsilon": flags["norm_epsilon"],
                "activation_function": "gelu_new" if gelu_form(flags) == TANH else "gelu",
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    if family is LLAMA:
        bias = not flags["disable_bias_linear"]
        return {**common, **_llama_style_config(flags),
                "intermediate_size": flags["ffn_hidden_size"],
                "attention_bias": bias, "mlp_bias": bias}
    if family is MIXTRAL:
        return {**common, **_llama_style_config(flags), "intermediate_size": moe_ffn_size(flags),
                "num_local_experts": flags["num_experts"],
                "num_experts_per_tok": flags["moe_router_topk"], "sliding_window": None,
                "router_jitter_noise": 0.0, "output_router_logits": False}
    return {**common, "hidden_size": flags["hidden_size"], "n_layer": flags["num_layers"],
            "n_head": flags["num_attention_heads"], "layer_norm_epsilon": flags["norm_epsilon"],
            "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0,
            "attention_dropout": 0.0}


def _llama_style_config(flags: dict) -> dict:
    """The ``config.json`` keys Llama and Mixtral share: sizes, attention, RoPE, RMSNorm."""
    return {"hidden_size": flags["hidden_size"], "num_hidden_layers": flags["num_layers"],
            "num_attention_heads": flags["num_attention_heads"],
            "num_key_value_heads": flags["num_query_groups"], "head_dim": flags["kv_channels"],
            "max_position_embeddings": flags["max_position_embeddings"],
            "rms_norm_eps": flags["norm_epsilon"], "hidden_act": "silu",
            "rope_theta": float(flags["rotary_base"]),
            "rope_parameters": {"rope_type": "default", "rope_theta": float(flags["rotary_base"])},
            "attention_dropout": 0.0}


_GPT2_LAYER = {"input_layernorm": "ln_1", "pre_mlp_layernorm": "ln_2",
               "self_attention.linear_proj": "attn.c_proj", "mlp.linear_fc1": "mlp.c_fc",
               "mlp.linear_fc2": "mlp.c_proj"}
_LLAMA_LAYER = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
                "self_attention.linear_proj": "self_attn.o_proj", "mlp.linear_fc2": "mlp.down_proj"}
_MIXTRAL_LAYER = {"input_layernorm": "input_layernorm",
                  "pre_mlp_layernorm": "post_attention_layernorm",
                  "self_attention.linear_proj": "self_attn.o_proj",
                  "mlp.router": "block_sparse_moe.gate"}
_BLOOM_LAYER = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
                "self_attention.linear_qkv": "self_attention.query_key_value",
                "self_attention.linear_proj": "self_attention.dense",
                "mlp.linear_fc1": "mlp.dense_h_to_4h", "mlp.linear_fc2": "mlp.dense_4h_to_h"}


# An expert's linear layer inside a layer (module path after ``decoder.layers.N.``): global id, layer.
_EXPERT = re.compile(r"mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)")


def _mixtral_fc1(name: str) -> Optional[List[str]]:
    """``[w1, w3]`` names (gate, up) of the Mixtral expert whose canonical ``linear_fc1`` is
    ``name``; None when ``name`` is not an expert's ``linear_fc1``."""
    parts = name.split(".")
    expert = _EXPERT.fullmatch(".".join(parts[3:-1])) if parts[:2] == ["decoder", "layers"] else None
    if not expert or expert.group(2) != "linear_fc1":
        return None
    prefix = f"model.layers.{parts[2]}.block_sparse_moe.experts.{expert.group(1)}"
    return [f"{prefix}.w1.{parts[-1]}", f"{prefix}.w3.{parts[-1]}"]


def _one_to_one(name: str, family: Family) -> Tuple[str, bool]:
    """``(transformers name, transposed)`` of a canonical tensor that maps to exactly one
    transformers tensor (GPT-2's ``Conv1D`` weights are stored transposed)."""
    if name == "embedding.word_embeddings.weight":
        return {GPT2: "transformer.wte.weight", LLAMA: "model.embed_tokens.weight",
                MIXTRAL: "model.embed_tokens.weight",
                BLOOM: "transformer.word_embeddings.weight"}[family], False
    if name == "output_layer.weight":
        return "lm_head.weight", False
    if name == "embedding.position_embeddings.weight" and family is GPT2:
        return "transformer.wpe.weight", False
    if name.startswith("embedding.word_embeddings.norm.") and family is BLOOM:
        return f"transformer.word_embeddings_layernorm.{name.rsplit('.', 1)[1]}", False
    if name.startswith("decoder.final_layernorm."):
        leaf = name.rsplit(".", 1)[1]
        return (f"model.norm.{leaf}" if family in _LLAMA_STYLE else f"transformer.ln_f.{leaf}"), False
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        i, module, leaf = parts[2], ".".join(parts[3:-1]), parts[-1]
        table, prefix = {GPT2: (_GPT2_LAYER, f"transformer.h.{i}."),
                         LLAMA: (_LLAMA_LAYER, f"model.layers.{i}."),
                         MIXTRAL: (_MIXTRAL_LAYER, f"model.layers.{i}."),
                         BLOOM: (_BLOOM_LAYER, f"transformer.h.{i}.")}[family]
        if module in table:
            transposed = family is GPT2 and leaf == "weight" and module.startswith(("self", "mlp"))
            return f"{prefix}{table[module]}.{leaf}", transposed
        expert = _EXPERT.fullmatch(module)
        if family is MIXTRAL and expert and expert.group(2) == "linear_fc2":
            return f"{prefix}block_sparse_moe.experts.{expert.group(1)}.w2.{leaf}", False
    raise ConfigError(f"{name}: no {family.architecture} weight corresponds to it")


def to_hf(name: str, tensor: torch.Tensor, flags: dict) -> Iterator[Tuple[str, torch.Tensor]]:
    """The transformers tensors made from the canonical tensor ``name`` (full, TP=1)."""
    family = check_exportable(flags)
    heads, groups, hd = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"]
    parts = name.split(".")
    module, leaf = ".".join(parts[3:-1]), parts[-1]
    if parts[:2] == ["decoder", "layers"] and family is GPT2 and module == "self_attention.linear_qkv":
        fused = torch.cat(split_qkv(tensor, heads, groups, hd), dim=0)
        yield (f"transformer.h.{parts[2]}.attn.c_attn.{leaf}",
               fused.t().contiguous() if leaf == "weight" else fused)
    elif parts[:2] == ["decoder", "layers"] and family in _LLAMA_STYLE and module == "self_attention.linear_qkv":
        for proj, t in zip(("q_proj", "k_proj", "v_proj"), split_qkv(tensor, heads, groups, hd)):
            yield f"model.layers.{parts[2]}.self_attn.{proj}.{leaf}", t.contiguous()
    elif parts[:2] == ["decoder", "layers"] and family is LLAMA and module == "mlp.linear_fc1":
        gate, up = torch.chunk(tensor, 2, dim=0)
        yield f"model.layers.{parts[2]}.mlp.gate_proj.{leaf}", gate.contiguous()
        yield f"model.layers.{parts[2]}.mlp.up_proj.{leaf}", up.contiguous()
    elif family is MIXTRAL and _mixtral_fc1(name):
        for hf_name, half in zip(_mixtral_fc1(name), torch.chunk(tensor, 2, dim=0)):
            yield hf_name, half.contiguous()
    else:
        hf_name, transposed = _one_to_one(name, family)
        yield hf_name, tensor.t().contiguous() if transposed else tensor


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

    def refuse(key, why):
        raise ConfigError(f"--hf {path}: config.json {key}={config.get(key)!r}: {why}")

    # transformers' default: Mixtral unties, the older classes tie
    tied = bool(config.get("tie_word_embeddings", model_type != "mixtral"))
    base = {"untie_embeddings_and_output_weights": not tied, "pad_vocab_size_to": config.get("vocab_size"), "rotary_percent": 1.0, "rotary_base": 10000,
            "embed_layernorm": False, "openai_gelu": False, "bias_gelu_fusion": False,
            "swiglu": False, "disable_bias_linear": False}
    if model_type == "gpt2":
        act = config.get("activation_function", "gelu_new")
        if act not in ("gelu", "gelu_new", "gelu_pytorch_tanh"):
            refuse("activation_function", "only gelu and the tanh GeLU (gelu_new) are supported")
        for key in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn"):
            if config.get(key):
                refuse(key, "not supported")
        if config.get("scale_attn_weights", True) is False:
            refuse("scale_attn_weights", "attention is always scaled by 1/sqrt(head size)")
        h, n = config["n_embd"], config["n_head"]
        return {**base, "num_layers": config["n_layer"], "hidden_size": h,
                "ffn_hidden_size": config.get("n_inner") or 4 * h, "num_attention_heads": n,
                "num_query_groups": n, "kv_channels": h // n,
                "max_position_embeddings": config["n_positions"], "normalization": "LayerNorm",
                "norm_epsilon": config.get("layer_norm_epsilon", 1e-5),
                "openai_gelu": act != "gelu", "position_embedding_type": "learned_absolute"}
    if model_type == "mixtral":
        return _mixtral_flags(config, refuse, base)
    if model_type == "llama":
        return _llama_flags(config, refuse, base)
    if config.get("apply_residual_connection_post_layernorm"):
        refuse("apply_residual_connection_post_layernorm", "residuals are taken before the norms")
    h, n = config["hidden_size"], config["n_head"]
    return {**base, "num_layers": config["n_layer"], "hidden_size": h, "ffn_hidden_size": 4 * h,
            "num_attention_heads": n, "num_query_groups": n, "kv_channels": h // n,
            "max_position_embeddings": config.get("seq_length", 2048), "normalization": "LayerNorm",
            "norm_epsilon": config.get("layer_norm_epsilon", 1e-5), "openai_gelu": True,
            "embed_layernorm": True, "position_embedding_type": "alibi"}


def _llama_flags(config: dict, refuse: Callable[[str, str], None], base: dict,
                 theta_default: float = 10000.0, eps_default: float = 1e-6) -> dict:
    """Model flags of a Llama ``config.json`` (``refuse(key, why)`` raises naming the key);
    ``theta_default``/``eps_default``: ``rope_theta``/``rms_norm_eps`` where the config has none."""
    if config.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", "only silu (SwiGLU) is supported")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if rope.get("rope_type", rope.get("type", "default")) != "default":
        refuse("rope_parameters" if "rope_parameters" in config else "rope_scaling",
               "only the default (unscaled) RoPE is supported")
    if config.get("pretraining_tp", 1) != 1:
        refuse("pretraining_tp", "must be 1")
    if bool(config.get("attention_bias")) != bool(config.get("mlp_bias")):
        refuse("mlp_bias", f"differs from attention_bias={config.get('attention_bias')!r}: "
               "--disable-bias-linear covers both")
    h, n = config["hidden_size"], config["num_attention_heads"]
    theta = rope.get("rope_theta", config.get("rope_theta", theta_default))
    if float(theta) != int(theta):
        refuse("rope_theta", "--rotary-base is an integer")
    return {**base, "num_layers": config["num_hidden_layers"], "hidden_size": h,
            "ffn_hidden_size": config["intermediate_size"], "num_attention_heads": n,
            "num_query_groups": config.get("num_key_value_heads") or n,
            "kv_channels": config.get("head_dim") or h // n,
            "max_position_embeddings": config["max_position_embeddings"],
            "normalization": "RMSNorm", "norm_epsilon": config.get("rms_norm_eps", eps_default),
            "swiglu": True, "position_embedding_type": "rope", "rotary_base": int(theta),
            "disable_bias_linear": not config.get("attention_bias", False)}


def _mixtral_flags(config: dict, refuse: Callable[[str, str], None], base: dict) -> dict:
    """Model flags of a Mixtral ``config.json``: Llama's layers (no biases) with every MLP
    ``num_local_experts`` SwiGLU experts of ``intermediate_size``, top-``num_experts_per_tok``
    softmax routing renormalised over the chosen (megatron-core's softmax over the top-k logits),
    dropless, no shared expert. Defaults are transformers' ``MixtralConfig``'s."""
    window = config.get("sliding_window")
    if window is not None and window < config["max_position_embeddings"]:
        refuse("sliding_window", "attention here is over the whole sequence (no sliding window)")
    for key in ("attention_bias", "mlp_bias"):
        if config.get(key):
            refuse(key, "Mixtral has no biases")
    experts, topk = config.get("num_local_experts", 8), config.get("num_experts_per_tok", 2)
    if not 1 <= topk <= experts:
        refuse("num_experts_per_tok", f"must be between 1 and num_local_experts={experts}")
    if topk == 1:
        refuse("num_experts_per_tok", "a top-1 Mixtral gate is always 1, so its router learns "
               "nothing; this project's top-1 router (--moe-router-topk 1 "
               "--moe-router-pre-softmax) gates by the probability, another model")
    flags = _llama_flags(config, refuse, base, theta_default=1e6, eps_default=1e-5)
    ffn = config["intermediate_size"]
    return {**flags, "ffn_hidden_size": ffn, "disable_bias_linear": True,
            "num_experts": experts, "moe_router_topk": topk, "moe_ffn_hidden_size": ffn,
            "moe_layer_freq": 1, "moe_shared_expert_intermediate_size": None,
            "moe_router_pre_softmax": False, "moe_router_score_function": "softmax",
            "moe_router_dtype": None, "moe_expert_capacity_factor": None,
            "moe_token_drop_policy": "probs"}


# transformers >= 5's in-memory Mixtral experts: every expert of a layer in one 3-D tensor.
_FUSED_EXPERTS = re.compile(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)")
_FUSED_GATE = re.compile(r"model\.layers\.(\d+)\.mlp\.gate\.weight")


def per_expert_view(names: Set[str], get: Getter, num_experts: int) -> Tuple[Set[str], Getter]:
    """``(names, get)`` of Mixtral weights with transformers' fused in-memory tensors
    (``model.layers.N.mlp.gate.weight``, ``mlp.experts.gate_up_proj`` ``[E, 2 x ffn, hidden]``,
    ``mlp.experts.down_proj`` ``[E, hidden, ffn]``, as ``state_dict()`` holds them in
    transformers >= 5) seen under the Hub's per-expert names (``block_sparse_moe.gate.weight``,
    ``block_sparse_moe.experts.E.w1/w3/w2.weight``) that :func:`hf_sources` asks for; the other
    names as they are (``num_experts``: the fused tensors' first dimension). A fused tensor is
    read once while the experts are taken in order (the last two read are kept)."""
    fused = functools.lru_cache(maxsize=2)(get)
    view: Dict[str, Callable[[], torch.Tensor]] = {}
    for name in names:
        gate, experts = _FUSED_GATE.fullmatch(name), _FUSED_EXPERTS.fullmatch(name)
        if gate:
            view[f"model.layers.{gate.group(1)}.block_sparse_moe.gate.weight"] = \
                functools.partial(get, name)
        elif experts:
            prefix = f"model.layers.{experts.group(1)}.block_sparse_moe.experts"
            for e in range(num_experts):
                if experts.group(2) == "down_proj":
                    view[f"{prefix}.{e}.w2.weight"] = functools.partial(_expert_slice, fused, name, e, None)
                else:
                    for half, w in enumerate(("w1", "w3")):
                        view[f"{prefix}.{e}.{w}.weight"] = functools.partial(
                            _expert_slice, fused, name, e, half)
        else:
            view[name] = functools.partial(get, name)
    return set(view), lambda name: view[name]()


def _expert_slice(fused: Getter, name: str, expert: int, half: Optional[int]) -> torch.Tensor:
    """Expert ``expert`` of the fused tensor ``name`` (a copy); ``half`` 0/1: the gate/up rows of
    ``gate_up_proj``, None: the whole matrix."""
    tensor = fused(name)[expert]
    if half is not None:
        tensor = torch.chunk(tensor, 2, dim=0)[half]
    return tensor.clone()


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
    family = check_exportable(flags)
    parts = name.split(".")
    module, leaf = ".".join(parts[3:-1]), parts[-1]
    if parts[:2] == ["decoder", "layers"]:
        if family is GPT2 and module == "self_attention.linear_qkv":
            return [f"transformer.h.{parts[2]}.attn.c_attn.{leaf}"]
        if family in _LLAMA_STYLE and module == "self_attention.linear_qkv":
            return [f"model.layers.{parts[2]}.self_attn.{p}.{leaf}" for p in ("q_proj", "k_proj", "v_proj")]
        if family is MIXTRAL and _mixtral_fc1(name):
            return _mixtral_fc1(name)
        if family is LLAMA and module == "mlp.linear_fc1":
            return [f"model.layers.{parts[2]}.mlp.{p}.{leaf}" for p in ("gate_proj", "up_proj")]
    return [_one_to_one(name, family)[0]]


def from_hf(name: str, get: Getter, flags: dict) -> torch.Tensor:
    """The canonical tensor ``name`` built from transformers tensors (``get(hf_name)``): the
    inverse of :func:`to_hf`."""
    family = check_exportable(flags)
    heads, groups, hd = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"]
    sources = [get(n) for n in hf_sources(name, flags)]
    module = ".".join(name.split(".")[3:-1])
    if family in _LLAMA_STYLE and module == "self_attention.linear_qkv":
        return merge_qkv(*sources, heads, groups, hd)
    if (family is LLAMA and module == "mlp.linear_fc1") or (family is MIXTRAL and _mixtral_fc1(name)):
        return torch.cat(sources, dim=0)
    if family is GPT2 and module == "self_attention.linear_qkv":
        fused = sources[0].t() if name.endswith("weight") else sources[0]
        q, k, v = torch.split(fused, [heads * hd, groups * hd, groups * hd], dim=0)
        return merge_qkv(q, k, v, heads, groups, hd)
    transposed = _one_to_one(name, family)[1]
    return sources[0].t().contiguous() if transposed else sources[0]
