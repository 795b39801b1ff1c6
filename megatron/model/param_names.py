"""The names of the GPT model's parameters, in one place: canonical ``GPTModel`` names, the pipe
engine's layer files, Transformer Engine's fused-norm names, and the tensor-parallel split a name
implies.

- **Canonical names** are the tensor-parallel 1, pipeline-parallel 1 ``GPTModel``'s names with the
  local layer spec (``decoder.layers.7.mlp.linear_fc1.weight``, megatron/model/init.py). Every
  checkpoint reader and writer (megatron/checkpoint/) and the Hugging Face mapping speak them.
- **Pipe layers** (megatron/model/gpt_model_pipe.py, DeepSpeed's
  ``layer_{i:02d}-model_{t:02d}-model_states.pt``): pipe layer 0 is the embedding, 1..L the
  transformer layers (key ``layer.X`` of layer i is ``decoder.layers.{i-1}.X``), L+1 the final
  norm, L+2 the untied output layer.
- **Transformer Engine** fuses each norm into the linear layer after it
  (``self_attention.linear_qkv.layer_norm_weight``); :func:`canonical_weight_name` gives the local
  spec's name (``input_layernorm.weight``), so a checkpoint reads the same whichever
  implementation trained it.
- **Experts** (megatron-core's MoE layer) are named by their global expert id
  (``decoder.layers.3.mlp.experts.local_experts.5.linear_fc1.weight``) whatever the
  expert-parallel size; a rank's local index becomes the global one through
  :func:`global_expert_name`. The router is ``mlp.router.weight``.
- **Tensor-parallel split by name** (:func:`tensor_parallel_partition`) is for files that carry no
  ``param_index.json`` (which records megatron-core's ``partition_dim``/``partition_stride`` of
  the live parameters, the authority wherever it exists) and for writing a full state as shards.
"""
import re
from typing import Optional, Tuple

from megatron.errors import ConfigError

EMBEDDING = "embedding.word_embeddings.weight"
OUTPUT_LAYER = "output_layer.weight"
VOCAB_PARAMETERS = (EMBEDDING, OUTPUT_LAYER)  # rows: the padded vocabulary

_ROW_SPLIT_SUFFIXES = (".linear_qkv.weight", ".linear_qkv.bias", ".linear_fc1.weight",
                       ".linear_fc1.bias")
_COLUMN_SPLIT_SUFFIXES = (".linear_proj.weight", ".linear_fc2.weight")

# Transformer Engine's layer spec fuses the norms into the following linear layer; these are the
# local spec's (canonical) names of those norm parameters.
TE_NORM_NAMES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                 "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
                 "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
                 "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias"}
_LAYER = re.compile(r"(decoder\.layers\.\d+\.)(.*)$")


def canonical_weight_name(name: str) -> Optional[str]:
    """The canonical (local layer spec) name of a ``GPTModel`` parameter or state-dict key, or
    None for keys that are not weights (megatron-core's and Transformer Engine's
    ``_extra_state``). Transformer Engine's fused norm weights get the local spec's names."""
    if name.endswith("_extra_state"):
        return None
    m = _LAYER.match(name)
    if m and m.group(2) in TE_NORM_NAMES:
        return m.group(1) + TE_NORM_NAMES[m.group(2)]
    return name


_LOCAL_EXPERT = re.compile(r"(\.mlp\.experts\.local_experts\.)(\d+)(\.)")


def global_expert_name(name: str, first_expert: int) -> str:
    """The canonical name of an expert parameter of a rank whose first local expert is global
    expert ``first_expert`` (expert-parallel rank x experts per rank): ``local_experts.{i}``
    becomes ``local_experts.{first_expert + i}``; other names are unchanged."""
    if not first_expert:
        return name
    return _LOCAL_EXPERT.sub(lambda m: f"{m.group(1)}{first_expert + int(m.group(2))}{m.group(3)}",
                             name)


def pipe_key_to_gpt_name(layer_index: int, key: str) -> Optional[str]:
    """The ``GPTModel`` name of ``key`` in pipe layer ``layer_index`` (the layer's file or its
    module), before Transformer Engine names are mapped; None for what is not a ``GPTModel``
    weight (extra state, the tied output projection)."""
    if key.endswith("._extra_state") or key.startswith("output_projection."):
        return None
    if key.startswith("layer."):
        return f"decoder.layers.{layer_index - 1}.{key[len('layer.'):]}"
    if key.startswith("final_layernorm."):
        return f"decoder.{key}"
    if key.startswith(("embedding.", "output_layer.")):
        return key
    raise ConfigError(f"pipe layer {layer_index}: unknown parameter {key!r} (not written by "
                      "megatron/model/gpt_model_pipe.py)")


def pipe_key_to_canonical(layer_index: int, key: str) -> Optional[str]:
    """The canonical name of ``key`` in pipe layer file ``layer_index`` (see
    :func:`pipe_key_to_gpt_name`, then :func:`canonical_weight_name`)."""
    name = pipe_key_to_gpt_name(layer_index, key)
    return None if name is None else canonical_weight_name(name)


def canonical_to_pipe_key(name: str, num_layers: int) -> Tuple[int, str]:
    """``(pipe layer index, key in that layer)`` of canonical ``name`` in a model of
    ``num_layers`` transformer layers (the inverse of :func:`pipe_key_to_gpt_name`)."""
    m = re.match(r"decoder\.layers\.(\d+)\.(.*)$", name)
    if m:
        return int(m.group(1)) + 1, f"layer.{m.group(2)}"
    if name.startswith("decoder.final_layernorm."):
        return num_layers + 1, name[len("decoder."):]
    if name.startswith("embedding."):
        return 0, name
    if name.startswith("output_layer."):
        return num_layers + 2, name
    raise KeyError(f"{name} is not a GPTModel parameter name")


def gpt_order(name: str):
    """Sort key of canonical names in ``GPTModel`` order: embedding, decoder layers by number,
    final norm, output layer."""
    m = re.match(r"decoder\.layers\.(\d+)\.", name)
    if name.startswith("embedding."):
        return (0, 0, name)
    if m:
        return (1, int(m.group(1)), name)
    if name.startswith("decoder."):
        return (2, 0, name)
    return (3, 0, name)


def tensor_parallel_partition(name: str, gated: bool = False) -> Optional[Tuple[int, int]]:
    """``(partition_dim, partition_stride)`` of the canonical parameter ``name`` under tensor
    parallelism (megatron-core's), or None when every rank holds the whole tensor. ``gated``: the
    MLP is SwiGLU, so fc1 has stride 2 (each shard ``[gate_t; up_t]``)."""
    if name.endswith((".linear_fc1.weight", ".linear_fc1.bias")):
        return 0, 2 if gated else 1
    if name in VOCAB_PARAMETERS or name.endswith(_ROW_SPLIT_SUFFIXES):
        return 0, 1
    if name.endswith(_COLUMN_SPLIT_SUFFIXES):
        return 1, 1
    return None
