"""BLOOM's LayerNorm right after the word embeddings (``--embed-layernorm``).

As in BigScience's Megatron-DeepSpeed (where ``VocabParallelEmbedding`` holds it as ``norm``) the
norm belongs to the word embedding and normalises its output before anything is added to it
(learned position embeddings) and before the embedding dropout; in BLOOM (ALiBi, no position
embeddings) that is Hugging Face's ``word_embeddings_layernorm``. It is always a LayerNorm (BLOOM's
kind), with the model's ``--norm-epsilon``.

megatron-core's ``LanguageModelEmbedding`` has no such norm, so :func:`add_embedding_layernorm`
attaches one to its ``word_embeddings`` module (parameters ``embedding.word_embeddings.norm.weight``
and ``.bias``, initialised to ones and zeros by megatron/model/init.py like every norm) and applies
it to that module's output with a forward hook. The norm's parameters are replicated over the
tensor-parallel group; under ``--sequence-parallel`` without position embeddings megatron-core
reduce-scatters the word embeddings along the sequence, so the norm sees a sequence slice and its
parameters are tagged ``sequence_parallel`` (their gradients are summed over the group,
megatron/parallel/grads.py).
"""
import torch
from megatron.core.transformer.transformer_config import TransformerConfig

NORM_ATTR = "norm"


def _apply_norm(module: torch.nn.Module, inputs, output: torch.Tensor) -> torch.Tensor:
    return getattr(module, NORM_ATTR)(output)


def add_embedding_layernorm(embedding: torch.nn.Module, config: TransformerConfig) -> torch.nn.Module:
    """Give ``embedding`` (a megatron-core ``LanguageModelEmbedding``) a LayerNorm of
    ``config.hidden_size`` features on its word embeddings' output (see the module doc); returns
    the norm."""
    word_embeddings = embedding.word_embeddings
    if hasattr(word_embeddings, NORM_ATTR):
        raise ValueError("the word embeddings already have an embedding LayerNorm")
    norm = torch.nn.LayerNorm(config.hidden_size, eps=config.layernorm_epsilon,
                              device=word_embeddings.weight.device, dtype=config.params_dtype)
    sliced = bool(config.sequence_parallel and embedding.reduce_scatter_embeddings)
    for param in norm.parameters():
        param.sequence_parallel = sliced
    word_embeddings.add_module(NORM_ATTR, norm)
    word_embeddings.register_forward_hook(_apply_norm)
    return norm


def embedding_layernorm(embedding: torch.nn.Module):
    """The embedding LayerNorm of ``embedding`` (a ``LanguageModelEmbedding``), or None."""
    return getattr(embedding.word_embeddings, NORM_ATTR, None)
