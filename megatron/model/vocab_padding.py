"""Padding rows of the vocabulary take no probability, so every tensor-parallel size is one model.

Megatron pads the embedding and output layer to a multiple of ``--make-vocab-size-divisible-by`` x
TP rows (``megatron/tokenizer/tokenizer.py``), so the byte-level vocabulary (258 tokens) has 384
rows at TP 1 and 512 at TP 2. In Megatron-LM the padding rows are ordinary logits: they take part
in the softmax, so changing TP changes the model. Here the logits of every row at or beyond the
model's vocabulary size are set to ``-inf`` where the output layer produces them: the softmax, the
vocab-parallel cross entropy and everything that predicts a token see only the real rows, and the
padding rows get no gradient (``exp(-inf) = 0`` and the fill passes no gradient back).

The padding rows are a tail of the global vocabulary, so on each tensor-parallel rank they are a
tail of the rank's columns (possibly none, possibly all): one in-place slice fill, no mask tensor
and no host synchronisation.
"""
from typing import Optional

import torch


def local_padding_start(vocab_size: Optional[int], padded_vocab_size: int, tp_rank: int,
                        tp_size: int) -> Optional[int]:
    """The first column of this tensor-parallel rank's logits ``[..., padded / TP]`` that is a
    padding row (global row index >= ``vocab_size``), or None when the rank holds no padding row
    (also when ``vocab_size`` is None or covers every row: nothing is masked)."""
    if vocab_size is None or vocab_size >= padded_vocab_size:
        return None
    if padded_vocab_size % tp_size:
        raise ValueError(f"padded vocabulary {padded_vocab_size} is not divisible by the "
                         f"tensor-parallel size {tp_size}")
    per_rank = padded_vocab_size // tp_size
    first = tp_rank * per_rank
    if vocab_size >= first + per_rank:
        return None
    return max(0, vocab_size - first)


def mask_padding_logits_(logits: torch.Tensor, start: Optional[int]) -> torch.Tensor:
    """Set ``logits[..., start:]`` to ``-inf`` in place (no-op for ``start`` None) and return
    ``logits``. Autograd passes no gradient to the filled entries."""
    if start is not None:
        logits[..., start:] = float("-inf")
    return logits


def tp_coordinates():
    """(tensor-parallel rank, size) from megatron-core's parallel state."""
    from megatron.core import parallel_state

    return (parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_world_size())


def mask_output_layer_padding(output_layer: torch.nn.Module, vocab_size: Optional[int],
                              padded_vocab_size: int) -> Optional[int]:
    """Make ``output_layer`` (megatron-core's vocab-parallel ``ColumnParallelLinear``, which
    returns ``(logits, bias)``) give ``-inf`` logits for the padding rows of this rank, with a
    forward hook (parameter names stay megatron-core's). Returns the local start column, or None
    when this rank holds no padding row (no hook is added)."""
    tp_rank, tp_size = tp_coordinates()
    start = local_padding_start(vocab_size, padded_vocab_size, tp_rank, tp_size)
    if start is None:
        return None

    def hook(module, inputs, output):
        logits = output[0] if isinstance(output, tuple) else output
        mask_padding_logits_(logits, start)

    output_layer.register_forward_hook(hook)
    return start
