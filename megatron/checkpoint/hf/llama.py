"""Llama (``LlamaForCausalLM``: RMSNorm, SwiGLU, grouped-query attention), chosen by
``--position-embedding-type rope``: its adapter and :data:`LLAMA`; Mixtral's
(megatron/checkpoint/hf/mixtral.py) extends it.

- Llama has ``q_proj``/``k_proj``/``v_proj``, query heads in group order (key head j serves
  query heads j*nh/ng ...), of megatron-core's grouped ``linear_qkv``.
- ``linear_fc1`` with SwiGLU is ``[gate; up]`` (megatron-core applies the activation to the first
  half), Llama's ``gate_proj`` and ``up_proj``.
"""
from typing import Iterator, List, Optional, Tuple

import torch

from megatron.checkpoint.hf.adapter import Family, Refuse, layer_parts, merge_qkv, split_qkv

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
                "rope_theta": float(flags["rotary_base"]),
                "rope_parameters": {"rope_type": "default", "rope_theta": float(flags["rotary_base"])},
                "attention_dropout": 0.0}

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
