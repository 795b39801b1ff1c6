"""Hugging Face transformers families of this project's GPT model: one ``to_hf``/``from_hf`` pair
per family, asserting names and shapes.

A family is chosen by the position embedding: ``learned_absolute`` is GPT-2 (``GPT2LMHeadModel``:
LayerNorm, GeLU, biases), ``rope`` is Llama (``LlamaForCausalLM``: RMSNorm, SwiGLU, grouped-query
attention), ``alibi`` is BLOOM (``BloomForCausalLM``: LayerNorm, tanh GeLU, embedding LayerNorm).
Model flags a family's transformers class cannot represent are refused by :func:`check_exportable`
with the flag named.

Weight layouts (canonical ``GPTModel`` names, megatron/model/init.py):

- ``linear_qkv`` rows are grouped per query group: for each of the ``ng`` groups, its
  ``nh / ng`` query heads, then its key head, then its value head (``kv_channels`` rows each).
  BLOOM's ``query_key_value`` is exactly that with ``ng = nh``; GPT-2's ``c_attn`` is
  ``[Q; K; V]`` transposed (``Conv1D`` stores ``[in, out]``); Llama has ``q_proj``/``k_proj``/
  ``v_proj``, query heads in group order (key head j serves query heads j*nh/ng ...).
- ``linear_fc1`` with SwiGLU is ``[gate; up]`` (megatron-core applies the activation to the first
  half), Llama's ``gate_proj`` and ``up_proj``.
- The vocabulary keeps the rows that take probability (the checkpoint's ``model_args.json``
  ``vocab_size``; the padding rows beyond it are dropped, since transformers softmaxes over every
  row of ``lm_head``); a checkpoint that records no ``vocab_size`` keeps every row.
- GeLU is the form megatron/model/gelu.py gives: ``gelu_new`` (tanh) or ``gelu`` (erf).
"""
from dataclasses import dataclass
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from megatron.errors import ConfigError
from megatron.model.gelu import TANH, gelu_form

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
    """One transformers family: ``name``, its ``architecture`` class name and ``model_type``."""

    name: str
    architecture: str
    model_type: str


GPT2 = Family("GPT-2", "GPT2LMHeadModel", "gpt2")
LLAMA = Family("Llama", "LlamaForCausalLM", "llama")
BLOOM = Family("BLOOM", "BloomForCausalLM", "bloom")
_BY_POSITION = {"learned_absolute": GPT2, "rope": LLAMA, "alibi": BLOOM}
_BY_MODEL_TYPE = {f.model_type: f for f in (GPT2, LLAMA, BLOOM)}


def family_of(flags: dict) -> Family:
    """The family of a checkpoint's model flags (``model_args.json`` ``model``)."""
    position = flags["position_embedding_type"]
    if position not in _BY_POSITION:
        raise ConfigError(f"--position-embedding-type {position}: no transformers family has it "
                          f"(exportable: {', '.join(f'{k} ({v.name})' for k, v in _BY_POSITION.items())})")
    return _BY_POSITION[position]


def _refuse(family: Family, flag: str, why: str) -> None:
    raise ConfigError(f"{flag}: {family.architecture} ({family.name} style, chosen by "
                      f"--position-embedding-type) cannot represent it: {why}")


def check_exportable(flags: dict) -> Family:
    """The family of ``flags``; raises :class:`ConfigError` naming the first flag its
    transformers class cannot represent."""
    family = family_of(flags)
    heads, groups = flags["num_attention_heads"], flags["num_query_groups"]
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
    if family is LLAMA:
        if flags["normalization"] != "RMSNorm":
            _refuse(family, f"--normalization {flags['normalization']}", "it has RMSNorm only")
        if not flags["swiglu"]:
            _refuse(family, "no --swiglu", "its MLP is SwiGLU")
        if flags["rotary_percent"] != 1.0:
            _refuse(family, f"--rotary-percent {flags['rotary_percent']}", "it rotates every "
                    "channel of each head")
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
        return {**common, "hidden_size": flags["hidden_size"],
                "intermediate_size": flags["ffn_hidden_size"],
                "num_hidden_layers": flags["num_layers"],
                "num_attention_heads": flags["num_attention_heads"],
                "num_key_value_heads": flags["num_query_groups"], "head_dim": flags["kv_channels"],
                "max_position_embeddings": flags["max_position_embeddings"],
                "rms_norm_eps": flags["norm_epsilon"], "hidden_act": "silu",
                "rope_theta": float(flags["rotary_base"]),
                "rope_parameters": {"rope_type": "default", "rope_theta": float(flags["rotary_base"])},
                "attention_bias": bias, "mlp_bias": bias, "attention_dropout": 0.0}
    return {**common, "hidden_size": flags["hidden_size"], "n_layer": flags["num_layers"],
            "n_head": flags["num_attention_heads"], "layer_norm_epsilon": flags["norm_epsilon"],
            "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0,
            "attention_dropout": 0.0}


_GPT2_LAYER = {"input_layernorm": "ln_1", "pre_mlp_layernorm": "ln_2",
               "self_attention.linear_proj": "attn.c_proj", "mlp.linear_fc1": "mlp.c_fc",
               "mlp.linear_fc2": "mlp.c_proj"}
_LLAMA_LAYER = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
                "self_attention.linear_proj": "self_attn.o_proj", "mlp.linear_fc2": "mlp.down_proj"}
_BLOOM_LAYER = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
                "self_attention.linear_qkv": "self_attention.query_key_value",
                "self_attention.linear_proj": "self_attention.dense",
                "mlp.linear_fc1": "mlp.dense_h_to_4h", "mlp.linear_fc2": "mlp.dense_4h_to_h"}


def _one_to_one(name: str, family: Family) -> Tuple[str, bool]:
    """``(transformers name, transposed)`` of a canonical tensor that maps to exactly one
    transformers tensor (GPT-2's ``Conv1D`` weights are stored transposed)."""
    if name == "embedding.word_embeddings.weight":
        return {GPT2: "transformer.wte.weight", LLAMA: "model.embed_tokens.weight",
                BLOOM: "transformer.word_embeddings.weight"}[family], False
    if name == "output_layer.weight":
        return "lm_head.weight", False
    if name == "embedding.position_embeddings.weight" and family is GPT2:
        return "transformer.wpe.weight", False
    if name.startswith("embedding.word_embeddings.norm.") and family is BLOOM:
        return f"transformer.word_embeddings_layernorm.{name.rsplit('.', 1)[1]}", False
    if name.startswith("decoder.final_layernorm."):
        leaf = name.rsplit(".", 1)[1]
        return (f"model.norm.{leaf}" if family is LLAMA else f"transformer.ln_f.{leaf}"), False
    parts = name.split(".")
    if parts[:2] == ["decoder", "layers"]:
        i, module, leaf = parts[2], ".".join(parts[3:-1]), parts[-1]
        table, prefix = {GPT2: (_GPT2_LAYER, f"transformer.h.{i}."),
                         LLAMA: (_LLAMA_LAYER, f"model.layers.{i}."),
                         BLOOM: (_BLOOM_LAYER, f"transformer.h.{i}.")}[family]
        if module in table:
            transposed = family is GPT2 and leaf == "weight" and module.startswith(("self", "mlp"))
            return f"{prefix}{table[module]}.{leaf}", transposed
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
    elif parts[:2] == ["decoder", "layers"] and family is LLAMA and module == "self_attention.linear_qkv":
        for proj, t in zip(("q_proj", "k_proj", "v_proj"), split_qkv(tensor, heads, groups, hd)):
            yield f"model.layers.{parts[2]}.self_attn.{proj}.{leaf}", t.contiguous()
    elif parts[:2] == ["decoder", "layers"] and family is LLAMA and module == "mlp.linear_fc1":
        gate, up = torch.chunk(tensor, 2, dim=0)
        yield f"model.layers.{parts[2]}.mlp.gate_proj.{leaf}", gate.contiguous()
        yield f"model.layers.{parts[2]}.mlp.up_proj.{leaf}", up.contiguous()
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

    tied = bool(config.get("tie_word_embeddings", True))
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
    if model_type == "llama":
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
        theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
        if float(theta) != int(theta):
            refuse("rope_theta", "--rotary-base is an integer")
        return {**base, "num_layers": config["num_hidden_layers"], "hidden_size": h,
                "ffn_hidden_size": config["intermediate_size"], "num_attention_heads": n,
                "num_query_groups": config.get("num_key_value_heads") or n,
                "kv_channels": config.get("head_dim") or h // n,
                "max_position_embeddings": config["max_position_embeddings"],
                "normalization": "RMSNorm", "norm_epsilon": config.get("rms_norm_eps", 1e-6),
                "swiglu": True, "position_embedding_type": "rope", "rotary_base": int(theta),
                "disable_bias_linear": not config.get("attention_bias", False)}
    if config.get("apply_residual_connection_post_layernorm"):
        refuse("apply_residual_connection_post_layernorm", "residuals are taken before the norms")
    h, n = config["hidden_size"], config["n_head"]
    return {**base, "num_layers": config["n_layer"], "hidden_size": h, "ffn_hidden_size": 4 * h,
            "num_attention_heads": n, "num_query_groups": n, "kv_channels": h // n,
            "max_position_embeddings": config.get("seq_length", 2048), "normalization": "LayerNorm",
            "norm_epsilon": config.get("layer_norm_epsilon", 1e-5), "openai_gelu": True,
            "embed_layernorm": True, "position_embedding_type": "alibi"}


def canonical_shapes(flags: dict, vocab_rows: int) -> Dict[str, Tuple[int, ...]]:
    """Full (TP=1) shape of every canonical parameter of a model with ``flags`` and
    ``vocab_rows`` embedding rows (megatron-core's local layer spec)."""
    h, hd = flags["hidden_size"], flags["kv_channels"]
    qkv = (flags["num_attention_heads"] + 2 * flags["num_query_groups"]) * hd
    ffn = flags["ffn_hidden_size"]
    rows = {"linear_qkv": (qkv, h), "linear_proj": (h, flags["num_attention_heads"] * hd),
            "linear_fc1": (ffn * (2 if flags["swiglu"] else 1), h), "linear_fc2": (h, ffn)}
    shapes = {}
    for name in canonical_names(flags):
        module, leaf = name.rsplit(".", 2)[-2:]
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            shapes[name] = (vocab_rows, h)
        elif name == "embedding.position_embeddings.weight":
            shapes[name] = (flags["max_position_embeddings"], h)
        elif module in rows:
            shapes[name] = rows[module] if leaf == "weight" else (rows[module][0],)
        else:  # norms
            shapes[name] = (h,)
    return shapes


def canonical_names(flags: dict) -> List[str]:
    """The canonical ``GPTModel`` parameter names of a model with ``flags``."""
    bias = not flags["disable_bias_linear"]
    norm = ["weight"] + (["bias"] if flags["normalization"] == "LayerNorm" else [])
    names = ["embedding.word_embeddings.weight"]
    if flags["position_embedding_type"] == "learned_absolute":
        names.append("embedding.position_embeddings.weight")
    if flags.get("embed_layernorm"):
        names += ["embedding.word_embeddings.norm.weight", "embedding.word_embeddings.norm.bias"]
    for i in range(flags["num_layers"]):
        p = f"decoder.layers.{i}."
        names += [p + f"input_layernorm.{leaf}" for leaf in norm]
        for module in ("self_attention.linear_qkv", "self_attention.linear_proj"):
            names += [p + f"{module}.weight"] + ([p + f"{module}.bias"] if bias else [])
        names += [p + f"pre_mlp_layernorm.{leaf}" for leaf in norm]
        for module in ("mlp.linear_fc1", "mlp.linear_fc2"):
            names += [p + f"{module}.weight"] + ([p + f"{module}.bias"] if bias else [])
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
        if family is LLAMA and module == "self_attention.linear_qkv":
            return [f"model.layers.{parts[2]}.self_attn.{p}.{leaf}" for p in ("q_proj", "k_proj", "v_proj")]
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
    if family is LLAMA and module == "self_attention.linear_qkv":
        return merge_qkv(*sources, heads, groups, hd)
    if family is LLAMA and module == "mlp.linear_fc1":
        return torch.cat(sources, dim=0)
    if family is GPT2 and module == "self_attention.linear_qkv":
        fused = sources[0].t() if name.endswith("weight") else sources[0]
        q, k, v = torch.split(fused, [heads * hd, groups * hd, groups * hd], dim=0)
        return merge_qkv(q, k, v, heads, groups, hd)
    transposed = _one_to_one(name, family)[1]
    return sources[0].t().contiguous() if transposed else sources[0]
