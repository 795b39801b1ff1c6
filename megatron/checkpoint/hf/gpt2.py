"""GPT-2 (``GPT2LMHeadModel``: LayerNorm, GeLU, biases), chosen by ``--position-embedding-type
learned_absolute``: its adapter and :data:`GPT2`.

- GPT-2's ``c_attn`` is ``[Q; K; V]`` transposed (``Conv1D`` stores ``[in, out]``, as every
  linear layer's weight of a GPT-2 layer).
- GeLU is the form megatron/model/gelu.py gives: ``gelu_new`` (tanh) or ``gelu`` (erf).
"""
from typing import Iterator, List, Tuple

import torch

from megatron.checkpoint.hf.adapter import Family, Refuse, check_gelu_layernorm, layer_parts, merge_qkv, split_qkv
from megatron.model.gelu import TANH, gelu_form

_GPT2_LAYER = {"input_layernorm": "ln_1", "pre_mlp_layernorm": "ln_2",
               "self_attention.linear_proj": "attn.c_proj", "mlp.linear_fc1": "mlp.c_fc",
               "mlp.linear_fc2": "mlp.c_proj"}


class GPT2Family(Family):
    """``GPT2LMHeadModel``: one fused ``c_attn``, ``Conv1D`` weights (transposed), learned
    positions."""

    name, architecture, model_type = "GPT-2", "GPT2LMHeadModel", "gpt2"
    embeddings = "transformer.wte.weight"
    final_norm = "transformer.ln_f"
    layers = "transformer.h"
    layer_table = _GPT2_LAYER

    def check(self, flags: dict) -> None:
        super().check(flags)
        check_gelu_layernorm(self, flags)

    def config_keys(self, flags: dict) -> dict:
        return {"n_embd": flags["hidden_size"], "n_layer": flags["num_layers"],
                "n_head": flags["num_attention_heads"], "n_inner": flags["ffn_hidden_size"],
                "n_positions": flags["max_position_embeddings"],
                "layer_norm_epsilon": flags["norm_epsilon"],
                "activation_function": "gelu_new" if gelu_form(flags) == TANH else "gelu",
                "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}

    def flags_from_config(self, config: dict, refuse: Refuse, base: dict) -> dict:
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

    def one_to_one(self, name: str) -> Tuple[str, bool]:
        if name == "embedding.position_embeddings.weight":
            return "transformer.wpe.weight", False
        return super().one_to_one(name)

    def transposed(self, module: str, leaf: str) -> bool:
        return leaf == "weight" and module.startswith(("self", "mlp"))

    def to_hf(self, name: str, tensor: torch.Tensor, flags: dict
              ) -> Iterator[Tuple[str, torch.Tensor]]:
        layer, module, leaf = layer_parts(name)
        if layer is not None and module == "self_attention.linear_qkv":
            heads, groups, hd = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"]
            fused = torch.cat(split_qkv(tensor, heads, groups, hd), dim=0)
            yield (f"{self.layers}.{layer}.attn.c_attn.{leaf}",
                   fused.t().contiguous() if leaf == "weight" else fused)
        else:
            yield from super().to_hf(name, tensor, flags)

    def hf_sources(self, name: str, flags: dict) -> List[str]:
        layer, module, leaf = layer_parts(name)
        if layer is not None and module == "self_attention.linear_qkv":
            return [f"{self.layers}.{layer}.attn.c_attn.{leaf}"]
        return super().hf_sources(name, flags)

    def merge(self, name: str, sources: List[torch.Tensor], flags: dict) -> torch.Tensor:
        if layer_parts(name)[1] == "self_attention.linear_qkv":
            heads, groups, hd = flags["num_attention_heads"], flags["num_query_groups"], flags["kv_channels"]
            fused = sources[0].t() if name.endswith("weight") else sources[0]
            q, k, v = torch.split(fused, [heads * hd, groups * hd, groups * hd], dim=0)
            return merge_qkv(q, k, v, heads, groups, hd)
        return super().merge(name, sources, flags)


GPT2 = GPT2Family()
