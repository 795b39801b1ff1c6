"""Llama (``LlamaForCausalLM``: RMSNorm, SwiGLU, grouped-query attention), chosen by
``--position-embedding-type rope``: its adapter and :data:`LLAMA`; Mixtral's
(megatron/checkpoint/hf/mixtral.py) extends it.

- Llama has ``q_proj``/``k_proj``/``v_proj``, query heads in group order (key head j serves
  query heads j*nh/ng ...), of megatron-core's grouped ``linear_qkv``.
- ``linear_fc1`` with SwiGLU is ``[gate; up]`` (megatron-core applies the activation to the first
  half), Llama's ``gate_proj`` and ``up_proj``.
- The position encoding is ``rope_theta`` and transformers' rope parameters (``rope_parameters``,
  and ``rope_scaling`` as transformers 4 names them): ``default``; ``linear``
  (``--rotary-seq-len-interpolation-factor``); ``llama3`` (``--use-rope-scaling
  --rope-scaling-factor``: megatron-core's frequency factors 1 and 4 and original length 8192);
  ``yarn`` (``--position-embedding-type yarn``, its ``attention_factor`` the one megatron-core
  computes from ``--mscale`` and ``--mscale-all-dim``). Other types, and ``llama3`` parameters
  megatron-core does not take, are refused on import.
"""
import math
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from megatron.checkpoint.hf.adapter import Family, Refuse, layer_parts, merge_qkv, split_qkv

# megatron-core's Llama 3.1 scaling (RotaryEmbedding._apply_scaling): only the factor is a flag
LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}
# transformers' YaRN keys -> flags (argparse dests), and the flags' defaults where a key is absent
_YARN_KEYS = {"original_max_position_embeddings": "yarn_original_max_position_embeddings",
              "beta_fast": "yarn_beta_fast", "beta_slow": "yarn_beta_slow"}


def yarn_attention_factor(flags: dict) -> float:
    """The factor megatron-core's YaRN multiplies cos and sin by (its concentration factor of
    ``--rotary-scaling-factor``, ``--mscale``, ``--mscale-all-dim``), a pure number."""
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (  # lazy: megatron-core (seconds), only for YaRN
        _yarn_get_concentration_factor,
    )

    return float(_yarn_get_concentration_factor(float(flags.get("rotary_scaling_factor", 1.0)),
                                                float(flags.get("mscale", 1.0)),
                                                float(flags.get("mscale_all_dim", 0.0))))


def rope_parameters(flags: dict) -> Dict[str, object]:
    """transformers' rope parameters (``rope_type`` and its keys, without ``rope_theta``) of the
    model flags ``flags``: what megatron-core computes, in transformers' terms."""
    if flags["position_embedding_type"] == "yarn":
        return {"rope_type": "yarn", "factor": float(flags.get("rotary_scaling_factor", 1.0)),
                "original_max_position_embeddings": flags.get(
                    "yarn_original_max_position_embeddings", 4096),
                "beta_fast": float(flags.get("yarn_beta_fast", 32.0)),
                "beta_slow": float(flags.get("yarn_beta_slow", 1.0)),
                "mscale": float(flags.get("mscale", 1.0)),
                "mscale_all_dim": float(flags.get("mscale_all_dim", 0.0)),
                "attention_factor": yarn_attention_factor(flags),
                "truncate": bool(flags.get("yarn_correction_range_round_to_int", True))}
    if flags.get("use_rope_scaling"):
        return {"rope_type": "llama3", "factor": float(flags.get("rope_scaling_factor", 8.0)),
                **LLAMA3_FIXED}
    if flags.get("rotary_seq_len_interpolation_factor") is not None:
        return {"rope_type": "linear", "factor": float(flags["rotary_seq_len_interpolation_factor"])}
    return {"rope_type": "default"}


def rope_flags(rope: dict, config: dict, refuse: Callable[[str], None]) -> dict:
    """The position-encoding flags of transformers' rope parameters ``rope`` (of ``config``):
    ``refuse(why)`` raises naming the config key they came from."""
    kind = rope.get("rope_type", rope.get("type", "default"))
    factor = rope.get("factor")
    if kind == "default":
        return {"position_embedding_type": "rope"}
    if kind == "linear":
        return {"position_embedding_type": "rope", "rotary_seq_len_interpolation_factor": float(factor)}
    if kind == "llama3":
        for key, value in LLAMA3_FIXED.items():
            if key in rope and float(rope[key]) != value:
                refuse(f"llama3 {key} {rope[key]}: megatron-core's Llama 3.1 scaling has {value:g}")
        return {"position_embedding_type": "rope", "use_rope_scaling": True,
                "rope_scaling_factor": float(factor)}
    if kind != "yarn":
        refuse(f"rope_type {kind!r}: supported are default, linear, llama3 and yarn")
    original = (rope.get("original_max_position_embeddings")
                or config.get("original_max_position_embeddings")
                or config["max_position_embeddings"])
    flags = {"position_embedding_type": "yarn", "yarn_original_max_position_embeddings": int(original),
             "rotary_scaling_factor": float(factor if factor is not None
                                            else config["max_position_embeddings"] / original),
             "yarn_correction_range_round_to_int": bool(rope.get("truncate", True))}
    for key in ("beta_fast", "beta_slow"):  # transformers: absent or 0 is the default
        if rope.get(key):
            flags[_YARN_KEYS[key]] = float(rope[key])
    # transformers uses mscale and mscale_all_dim only when both are non-zero, else 0.1 ln(s) + 1:
    # megatron-core's defaults (mscale 1, mscale_all_dim 0)
    if rope.get("mscale") and rope.get("mscale_all_dim"):
        flags.update(mscale=float(rope["mscale"]), mscale_all_dim=float(rope["mscale_all_dim"]))
    given = rope.get("attention_factor")
    if given is not None:
        ours = yarn_attention_factor(flags)
        if not math.isclose(float(given), ours, rel_tol=1e-6):
            refuse(f"yarn attention_factor {given} is not the {ours:.6g} megatron-core computes "
                   "from factor, mscale and mscale_all_dim")
    return flags


_LLAMA_LAYER = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
                "self_attention.linear_proj": "self_attn.o_proj", "mlp.linear_fc2": "mlp.down_proj"}


class LlamaFamily(Family):
    """``LlamaForCausalLM``: RMSNorm, RoPE, SwiGLU, q/k/v projections; the layers of every
    Llama-style family (dense or MoE)."""

    name, architecture, model_type = "Llama", "LlamaForCausalLM", "llama"
    embeddings = "model.embed_tokens.weight"
    final_norm = "model.norm"
    layers = "model.layers"
    layer_table = _LLAMA_LAYER

    def check(self, flags: dict) -> None:
        super().check(flags)
        if flags["normalization"] != "RMSNorm":
            self.refuse(f"--normalization {flags['normalization']}", "it has RMSNorm only")
        if not flags["swiglu"]:
            self.refuse("no --swiglu", "its MLP is SwiGLU")
        if flags["rotary_percent"] != 1.0:
            self.refuse(f"--rotary-percent {flags['rotary_percent']}", "it rotates every "
                        "channel of each head")

    def config_keys(self, flags: dict) -> dict:
        bias = not flags["disable_bias_linear"]
        return {**self.llama_style_config(flags), "intermediate_size": flags["ffn_hidden_size"],
                "attention_bias": bias, "mlp_bias": bias}

    def llama_style_config(self, flags: dict) -> dict:
        """The ``config.json`` keys Llama and Mixtral share: sizes, attention, RoPE, RMSNorm."""
        return {"hidden_size": flags["hidden_size"], "num_hidden_layers": flags["num_layers"],
                "num_attention_heads": flags["num_attention_heads"],
                "num_key_value_heads": flags["num_query_groups"], "head_dim": flags["kv_channels"],
                "max_position_embeddings": flags["max_position_embeddings"],
                "rms_norm_eps": flags["norm_epsilon"], "hidden_act": "silu",
                "rope_theta": float(flags["rotary_base"]), **self.rope_config(flags),
                "attention_dropout": 0.0}

    def rope_config(self, flags: dict) -> dict:
        """``rope_parameters`` (transformers 5) of ``flags``, and ``rope_scaling`` (transformers
        4's name) when the RoPE is scaled."""
        params = rope_parameters(flags)
        scaled = {"rope_scaling": params} if params["rope_type"] != "default" else {}
        return {"rope_parameters": {**params, "rope_theta": float(flags["rotary_base"])}, **scaled}

    def flags_from_config(self, config: dict, refuse: Refuse, base: dict) -> dict:
        return self.llama_flags(config, refuse, base)

    def llama_flags(self, config: dict, refuse: Refuse, base: dict,
                    theta_default: float = 10000.0, eps_default: float = 1e-6) -> dict:
        """Model flags of a Llama ``config.json`` (``refuse(key, why)`` raises naming the key);
        ``theta_default``/``eps_default``: ``rope_theta``/``rms_norm_eps`` where the config has
        none."""
        if config.get("hidden_act", "silu") != "silu":
            refuse("hidden_act", "only silu (SwiGLU) is supported")
        rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
        rope_key = "rope_parameters" if config.get("rope_parameters") else "rope_scaling"
        position = rope_flags(rope, config, lambda why: refuse(rope_key, why))
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
                "swiglu": True, "rotary_base": int(theta), **position,
                "disable_bias_linear": not config.get("attention_bias", False)}

    def gated_fc1(self, name: str) -> Optional[List[str]]:
        """``[gate, up]`` names of the SwiGLU MLP whose canonical ``linear_fc1`` is ``name``; None
        when ``name`` is not such a ``linear_fc1``."""
        layer, module, leaf = layer_parts(name)
        if layer is None or module != "mlp.linear_fc1":
            return None
        return [f"{self.layers}.{layer}.mlp.{p}.{leaf}" for p in ("gate_proj", "up_proj")]

    def to_hf(self, name: str, tensor: torch.Tensor, flags: dict
              ) -> Iterator[Tuple[str, torch.Tensor]]:
        layer, module, leaf = layer_parts(name)
        if layer is not None and module == "self_attention.linear_qkv":
            heads, groups, hd = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"]
            for proj, t in zip(("q_proj", "k_proj", "v_proj"), split_qkv(tensor, heads, groups, hd), strict=True):
                yield f"{self.layers}.{layer}.self_attn.{proj}.{leaf}", t.contiguous()
        elif self.gated_fc1(name):
            for hf_name, half in zip(self.gated_fc1(name), torch.chunk(tensor, 2, dim=0), strict=True):
                yield hf_name, half.contiguous()
        else:
            yield from super().to_hf(name, tensor, flags)

    def hf_sources(self, name: str, flags: dict) -> List[str]:
        layer, module, leaf = layer_parts(name)
        if layer is not None and module == "self_attention.linear_qkv":
            return [f"{self.layers}.{layer}.self_attn.{p}.{leaf}" for p in ("q_proj", "k_proj", "v_proj")]
        return self.gated_fc1(name) or super().hf_sources(name, flags)

    def merge(self, name: str, sources: List[torch.Tensor], flags: dict) -> torch.Tensor:
        if layer_parts(name)[1] == "self_attention.linear_qkv":
            heads, groups, hd = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"]
            return merge_qkv(*sources, heads, groups, hd)
        if self.gated_fc1(name):
            return torch.cat(sources, dim=0)
        return super().merge(name, sources, flags)


LLAMA = LlamaFamily()
