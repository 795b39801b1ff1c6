"""BLOOM (``BloomForCausalLM``: LayerNorm, tanh GeLU, embedding LayerNorm), chosen by
``--position-embedding-type alibi``: its adapter and :data:`BLOOM`.

- BLOOM's ``query_key_value`` is megatron-core's grouped ``linear_qkv`` with ``ng = nh``, so
  every tensor maps one to one.
- GeLU is the tanh form (``gelu_new``) of megatron/model/gelu.py.
"""
from typing import Tuple

from megatron.checkpoint.hf.adapter import Family, Refuse, check_gelu_layernorm
from megatron.model.gelu import TANH, gelu_form

_BLOOM_LAYER = {"input_layernorm": "input_layernorm", "pre_mlp_layernorm": "post_attention_layernorm",
                "self_attention.linear_qkv": "self_attention.query_key_value",
                "self_attention.linear_proj": "self_attention.dense",
                "mlp.linear_fc1": "mlp.dense_h_to_4h", "mlp.linear_fc2": "mlp.dense_4h_to_h"}


class BloomFamily(Family):
    """``BloomForCausalLM``: ALiBi, a LayerNorm on the word embeddings, fused QKV of the grouped
    layout."""

    name, architecture, model_type = "BLOOM", "BloomForCausalLM", "bloom"
    embed_layernorm = True
    embeddings = "transformer.word_embeddings.weight"
    final_norm = "transformer.ln_f"
    layers = "transformer.h"
    layer_table = _BLOOM_LAYER

    def check(self, flags: dict) -> None:
        super().check(flags)
        check_gelu_layernorm(self, flags)
        if not flags.get("embed_layernorm"):
            self.refuse("no --embed-layernorm", "BLOOM always normalises the word embeddings")
        if gelu_form(flags) != TANH:
            self.refuse("--no-bias-gelu-fusion (erf GeLU)", "BLOOM's GeLU is the tanh "
                        "approximation; train with the default bias-GeLU rule or --openai-gelu")

    def config_keys(self, flags: dict) -> dict:
        return {"hidden_size": flags["hidden_size"], "n_layer": flags["num_layers"],
                "n_head": flags["num_attention_heads"], "layer_norm_epsilon": flags["norm_epsilon"],
                "apply_residual_connection_post_layernorm": False, "hidden_dropout": 0.0,
                "attention_dropout": 0.0}

    def flags_from_config(self, config: dict, refuse: Refuse, base: dict) -> dict:
        if config.get("apply_residual_connection_post_layernorm"):
            refuse("apply_residual_connection_post_layernorm", "residuals are taken before the norms")
        h, n = config["hidden_size"], config["n_head"]
        return {**base, "num_layers": config["n_layer"], "hidden_size": h, "ffn_hidden_size": 4 * h,
                "num_attention_heads": n, "num_query_groups": n, "kv_channels": h // n,
                "max_position_embeddings": config.get("seq_length", 2048), "normalization": "LayerNorm",
                "norm_epsilon": config.get("layer_norm_epsilon", 1e-5), "openai_gelu": True,
                "embed_layernorm": True, "position_embedding_type": "alibi"}

    def one_to_one(self, name: str) -> Tuple[str, bool]:
        if name.startswith("embedding.word_embeddings.norm."):
            return f"transformer.word_embeddings_layernorm.{name.rsplit('.', 1)[1]}", False
        return super().one_to_one(name)


BLOOM = BloomFamily()
