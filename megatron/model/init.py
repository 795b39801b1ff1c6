"""Layout-independent initial weights: every parameter is drawn from --seed and its canonical name.

The canonical name is the parameter's name in the TP=1, PP=1 ``GPTModel`` state dict, with global
layer numbers (``decoder.layers.7.mlp.linear_fc1.weight``). Each parameter's *full-size* tensor is
defined by megatron-core's init for its kind, drawn on the CPU generator in blocks of whole rows,
block k seeded from (seed, name, k); this rank's tensor-parallel shard is cut out of it the way
megatron-core shards (``partition_dim``/``partition_stride``), drawing only the blocks it needs.
So the model is the same model under every (TP, PP) layout, and a pipeline stage holding layers
4..7 draws exactly what a single rank does.
The vocabulary rows are ``padded_vocab_size`` (the tokenizer set-up's), which depends on TP (Megatron-LM pads to a
multiple of ``--make-vocab-size-divisible-by`` x TP); the real rows are the first rows of the
full tensor, drawn alike whatever the padding, and the padding rows take no probability
(megatron/model/vocab_padding.py), so layouts are the same model.
"""
import hashlib
import math
from typing import Callable, Iterable, Optional, Tuple

import torch
from megatron.core.transformer.transformer_config import TransformerConfig

_SCALED = ("linear_proj.weight", "linear_fc2.weight")
BLOCK_ELEMENTS = 1 << 24  # elements drawn per generator seed (64 MiB of float32)


def name_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed from ``seed`` and a canonical parameter name (stable across runs,
    processes and Python versions, unlike ``hash``)."""
    digest = hashlib.sha256(f"{seed}/{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_kind(name: str, param: torch.Tensor) -> str:
    """``zeros`` for biases (also norm biases), ``ones`` for norm weights (1-D weights),
    ``scaled_normal`` for the output projections of attention and MLP (megatron-core's
    ``output_layer_init_method``), ``embedding`` for word/position embeddings, else ``normal``."""
    if name.endswith("bias"):
        return "zeros"
    if param.dim() == 1:
        return "ones"
    if name.endswith(_SCALED):
        return "scaled_normal"
    if "embedding" in name:
        return "embedding"
    return "normal"


def _full_shape(param: torch.Tensor, tp_size: int) -> Tuple[int, ...]:
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] *= tp_size
    return tuple(shape)


def _shard(full: torch.Tensor, param: torch.Tensor, tp_rank: int, tp_size: int) -> torch.Tensor:
    """This rank's part of ``full``, as megatron-core's ``_initialize_affine_weight_cpu`` splits
    it: chunks of (partition size / stride) along ``partition_dim``, every ``tp_size``-th from
    ``tp_rank``."""
    if not getattr(param, "tensor_model_parallel", False) or tp_size == 1:
        return full
    dim, stride = param.partition_dim, getattr(param, "partition_stride", 1)
    chunks = torch.split(full, param.shape[dim] // stride, dim=dim)
    return torch.cat(chunks[tp_rank::tp_size], dim=dim)


def _init_method(kind: str, config: TransformerConfig) -> Callable:
    return {"normal": config.init_method, "scaled_normal": config.output_layer_init_method,
            "embedding": config.embedding_init_method or config.init_method}[kind]


def local_initial_value(name: str, param: torch.Tensor, config: TransformerConfig, seed: int,
                        tp_rank: int, tp_size: int,
                        block_elements: int = BLOCK_ELEMENTS) -> torch.Tensor:
    """This rank's float32 initial value of the parameter called ``name`` (see module doc).

    The full-size tensor is defined block by block along dim 0 (blocks of ``block_elements //
    row size`` full rows, block k drawn from the generator seeded with (seed, name, k)), so only
    the blocks holding this rank's rows are drawn and never more than one block of a
    column-split (``partition_dim`` 1) tensor is held in full."""
    kind = init_kind(name, param)
    if kind == "zeros":
        return torch.zeros(param.shape)
    if kind == "ones":
        return torch.ones(param.shape)
    full_shape = _full_shape(param, tp_size)
    row_size = math.prod(full_shape[1:])
    block_rows = max(1, block_elements // row_size)
    split_rows = getattr(param, "tensor_model_parallel", False) and param.partition_dim == 0
    rows = _shard(torch.arange(full_shape[0]), param, tp_rank, tp_size) if split_rows \
        else torch.arange(full_shape[0])
    out = torch.empty(param.shape)
    method = _init_method(kind, config)
    block_of_row = rows // block_rows
    with torch.random.fork_rng(devices=[]):
        for k in torch.unique(block_of_row).tolist():
            start = k * block_rows
            block = torch.empty((min(block_rows, full_shape[0] - start), *full_shape[1:]))
            torch.manual_seed(name_seed(seed, f"{name}#{k}"))
            method(block)
            if not split_rows:
                block = _shard(block, param, tp_rank, tp_size)  # columns (dim 1) or unsplit
            mine = torch.nonzero(block_of_row == k).view(-1)
            out[mine] = block[rows[mine] - start]
    return out


def initialize_parameters(named_params: Iterable[Tuple[str, torch.nn.Parameter]],
                          config: TransformerConfig, seed: int,
                          canonical_name: Optional[Callable[[str], str]] = None,
                          tp_rank: Optional[int] = None, tp_size: Optional[int] = None,
                          block_elements: Optional[int] = None) -> int:
    """Overwrite each parameter with its layout-independent initial value (see module doc);
    ``canonical_name`` maps a module's parameter name to the TP=1/PP=1 GPTModel name (identity
    for GPTModel; a pipe model maps its stage-local names). ``tp_rank``/``tp_size`` default to
    megatron-core's parallel state; ``block_elements`` (default :data:`BLOCK_ELEMENTS`) is the
    draw granularity, part of the definition of the weights. Returns the number of parameters
    initialised."""
    block_elements = block_elements or BLOCK_ELEMENTS
    if tp_rank is None or tp_size is None:
        from megatron.core import parallel_state

        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        tp_size = parallel_state.get_tensor_model_parallel_world_size()
    count = 0
    with torch.no_grad():
        for local_name, param in named_params:
            name = canonical_name(local_name) if canonical_name else local_name
            value = local_initial_value(name, param, config, seed, tp_rank, tp_size, block_elements)
            param.copy_(value.to(param.dtype))
            count += 1
    return count
