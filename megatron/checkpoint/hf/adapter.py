"""The shared part of the Hugging Face families: :class:`Family`, the adapter each family
implements (its transformers config from the model flags and back, its checks, and each
canonical ``GPTModel`` tensor to and from its transformers tensors), the grouped QKV layout
(:func:`split_qkv`, :func:`merge_qkv`) and the MoE helpers of the model flags.

- ``linear_qkv`` rows are grouped per query group: for each of the ``ng`` groups, its
  ``nh / ng`` query heads, then its key head, then its value head (``kv_channels`` rows each).
- A canonical name ``decoder.layers.N.<module>.<leaf>`` is mapped by the family's table of
  ``<module>`` names; the tensors a family splits or fuses (QKV, SwiGLU's ``[gate; up]``) are its
  adapter's own.
"""
from typing import Callable, Dict, Iterator, List, Optional, Tuple

import torch

from megatron.errors import ConfigError
from megatron.model.moe import moe_layer_pattern

Getter = Callable[[str], torch.Tensor]
# ``refuse(key, why)``: raises ConfigError naming the config.json key (flags_from_hf_config).
Refuse = Callable[[str, str], None]


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


# ---------------------------------------------------------------------------- MoE flags
def moe_pattern(flags: dict) -> List[int]:
    """1 for each MoE layer of a model with ``flags``, 0 for each dense one (all 0 without
    ``--num-experts``)."""
    if not flags.get("num_experts"):
        return [0] * flags["num_layers"]
    return moe_layer_pattern(flags.get("moe_layer_freq", 1), flags["num_layers"])


def moe_ffn_size(flags: dict) -> int:
    """Hidden size of each expert's MLP (``--moe-ffn-hidden-size``, default ``--ffn-hidden-size``)."""
    return flags.get("moe_ffn_hidden_size") or flags["ffn_hidden_size"]


def layer_parts(name: str) -> Tuple[Optional[str], str, str]:
    """``(layer number, module, leaf)`` of the canonical ``name``; the layer number is None
    outside ``decoder.layers`` (the module is then what lies between the third and the last dot,
    as inside a layer)."""
    parts = name.split(".")
    layer = parts[2] if parts[:2] == ["decoder", "layers"] else None
    return layer, ".".join(parts[3:-1]), parts[-1]


# ---------------------------------------------------------------------------- the adapter
class Family:
    """One transformers family and its state-dict adapter: ``name``, its ``architecture`` class
    name, ``model_type`` and the flags that choose it (``chosen_by``, for error messages).

    A subclass gives the transformers names (``embeddings``: the word embeddings' tensor,
    ``final_norm``: the final norm's module, ``layers``: the prefix of layer N's modules,
    ``layer_table``: a layer's canonical module -> transformers module) and its own
    :meth:`check`, :meth:`config_keys` and :meth:`flags_from_config`; it overrides
    :meth:`to_hf`, :meth:`hf_sources` and :meth:`merge` for the tensors it splits or fuses and
    :meth:`one_to_one` for the one-to-one tensors outside the table. One instance per family."""

    name: str
    architecture: str
    model_type: str
    chosen_by: str = "--position-embedding-type"
    moe: bool = False             # its MLPs are experts (--num-experts)
    embed_layernorm: bool = False  # it normalises the word embeddings (--embed-layernorm)
    tied_by_default: bool = True  # transformers' default of tie_word_embeddings
    embeddings: str
    final_norm: str
    layers: str
    layer_table: Dict[str, str]

    def refuse(self, flag: str, why: str) -> None:
        """Raise :class:`ConfigError`: ``flag`` cannot be represented by this family's class."""
        raise ConfigError(f"{flag}: {self.architecture} ({self.name} style, chosen by "
                          f"{self.chosen_by}) cannot represent it: {why}")

    # ------------------------------------------------------------------------ export checks, config
    def check(self, flags: dict) -> None:
        """Raise :class:`ConfigError` naming the first flag of ``flags`` this family's class
        cannot represent (subclasses extend it, calling this first): experts and the embedding
        LayerNorm only where the family has them."""
        if flags.get("num_experts") and not self.moe:
            self.refuse(f"--num-experts {flags['num_experts']}", "its MLP is dense (MoE models "
                        "export as MixtralForCausalLM: --position-embedding-type rope, RMSNorm, --swiglu)")
        if flags.get("embed_layernorm") and not self.embed_layernorm:
            self.refuse("--embed-layernorm", "it has no LayerNorm on the word embeddings")

    def hf_config(self, flags: dict, vocab_size: int, dtype: torch.dtype,
                  special_tokens: Optional[Dict[str, Optional[int]]] = None) -> dict:
        """The ``config.json`` content of ``flags`` (checked): the keys every family has, then
        :meth:`config_keys`."""
        tied = not flags["untie_embeddings_and_output_weights"]
        special = {"bos_token_id": None, "eos_token_id": None, **(special_tokens or {})}
        common = {"architectures": [self.architecture], "model_type": self.model_type,
                  "vocab_size": vocab_size, "tie_word_embeddings": tied,
                  "torch_dtype": str(dtype).replace("torch.", ""), "use_cache": True, **special}
        return {**common, **self.config_keys(flags)}

    def config_keys(self, flags: dict) -> dict:
        """The family's own ``config.json`` keys for ``flags`` (sizes, norms, activation)."""
        raise NotImplementedError

    # ------------------------------------------------------------------------ import
    def flags_from_config(self, config: dict, refuse: Refuse, base: dict) -> dict:
        """This project's model flags of the family's ``config.json`` ``config``: ``base`` (the
        flags every family sets) completed; ``refuse(key, why)`` raises naming the key."""
        raise NotImplementedError

    # ------------------------------------------------------------------------ tensors
    def one_to_one(self, name: str) -> Tuple[str, bool]:
        """``(transformers name, transposed)`` of a canonical tensor that maps to exactly one
        transformers tensor."""
        if name == "embedding.word_embeddings.weight":
            return self.embeddings, False
        if name == "output_layer.weight":
            return "lm_head.weight", False
        if name.startswith("decoder.final_layernorm."):
            return f"{self.final_norm}.{name.rsplit('.', 1)[1]}", False
        layer, module, leaf = layer_parts(name)
        if layer is not None and module in self.layer_table:
            return f"{self.layers}.{layer}.{self.layer_table[module]}.{leaf}", \
                self.transposed(module, leaf)
        raise ConfigError(f"{name}: no {self.architecture} weight corresponds to it")

    def transposed(self, module: str, leaf: str) -> bool:
        """Whether the transformers tensor of a layer's ``module`` ``leaf`` is stored
        transposed."""
        return False

    def to_hf(self, name: str, tensor: torch.Tensor, flags: dict
              ) -> Iterator[Tuple[str, torch.Tensor]]:
        """The transformers tensors made from the canonical tensor ``name`` (full, TP=1)."""
        hf_name, transposed = self.one_to_one(name)
        yield hf_name, tensor.t().contiguous() if transposed else tensor

    def hf_sources(self, name: str, flags: dict) -> List[str]:
        """The transformers tensor names the canonical tensor ``name`` is made from."""
        return [self.one_to_one(name)[0]]

    def from_hf(self, name: str, get: Getter, flags: dict) -> torch.Tensor:
        """The canonical tensor ``name`` built from transformers tensors (``get(hf_name)``, read
        in the order of :meth:`hf_sources`): the inverse of :meth:`to_hf`."""
        return self.merge(name, [get(n) for n in self.hf_sources(name, flags)], flags)

    def merge(self, name: str, sources: List[torch.Tensor], flags: dict) -> torch.Tensor:
        """The canonical tensor ``name`` of its transformers tensors ``sources`` (those
        :meth:`hf_sources` names)."""
        transposed = self.one_to_one(name)[1]
        return sources[0].t().contiguous() if transposed else sources[0]


def check_gelu_layernorm(family: Family, flags: dict) -> None:
    """The checks GPT-2 and BLOOM share: LayerNorm, a GeLU MLP, biases, multi-head attention of
    head size ``--hidden-size / --num-attention-heads``."""
    heads, groups = flags["num_attention_heads"], flags["num_query_groups"]
    if flags["normalization"] != "LayerNorm":
        family.refuse(f"--normalization {flags['normalization']}", "it has LayerNorm only")
    if flags["swiglu"]:
        family.refuse("--swiglu", "its MLP is GeLU")
    if flags["disable_bias_linear"]:
        family.refuse("--disable-bias-linear", "its linear layers have biases")
    if groups != heads:
        family.refuse(f"--num-query-groups {groups}", "it has multi-head attention only "
                      f"(query groups = --num-attention-heads {heads})")
    if flags["kv_channels"] * heads != flags["hidden_size"]:
        family.refuse(f"--kv-channels {flags['kv_channels']}", "its head size is "
                      "--hidden-size / --num-attention-heads")
