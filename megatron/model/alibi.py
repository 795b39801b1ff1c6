"""ALiBi (Press et al., "Train Short, Test Long"), as BLOOM uses it: ``--position-embedding-type alibi``.

Every head ``h`` adds ``slope[h] * (k - q)`` to its attention score between query position ``q`` and
key position ``k`` (after the ``1/sqrt(d)`` scaling, before the softmax); no position embedding is
added to the tokens. BLOOM (and HF ``build_alibi_tensor``) adds ``slope[h] * k`` instead: within one
softmax row the two differ by the constant ``slope[h] * q``, so the attention probabilities are the
same. The ``k - q`` form makes packing free: the distance between two tokens of one segment does not
depend on where the segment starts in the sample, so a packed segment attends exactly as it would
alone. With ``--prefix-lm`` the same formula holds over the bidirectional prefix (keys after the
query get a positive bias there, as in BigScience's non-causal ALiBi runs).

Under tensor parallelism each rank holds ``heads / TP`` consecutive heads and uses their slopes
(:func:`alibi_slopes_for_partition`); under DeepSpeed-Ulysses sequence parallelism each
sequence-parallel rank attends with ``1 / SP`` consecutive heads of its tensor-parallel rank's and
uses theirs.
"""
import math
from typing import List

import torch

POSITION_EMBEDDING_TYPE = "alibi"


def _power_of_two_slopes(n: int) -> List[float]:
    start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
    return [start * start ** i for i in range(n)]


def alibi_slope_list(num_heads: int) -> List[float]:
    """The ALiBi slopes of ``num_heads`` heads (the paper's and BLOOM's): the geometric sequence
    ``2^(-8/n), 2^(-16/n), ...`` for a power of two ``n``; otherwise the slopes of the closest
    smaller power of two followed by every other slope of twice that power."""
    if num_heads < 1:
        raise ValueError(f"ALiBi needs at least one attention head, got {num_heads}")
    if math.log2(num_heads).is_integer():
        return _power_of_two_slopes(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return (_power_of_two_slopes(closest)
            + alibi_slope_list(2 * closest)[0::2][: num_heads - closest])


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """``[num_heads]`` float32 tensor of :func:`alibi_slope_list`."""
    return torch.tensor(alibi_slope_list(num_heads), dtype=torch.float32)


def alibi_head_range(num_heads: int, tp_size: int = 1, tp_rank: int = 0, sp_size: int = 1,
                     sp_rank: int = 0) -> range:
    """The heads (of all ``num_heads``) that tensor-parallel rank ``tp_rank`` of ``tp_size`` holds,
    and of those the ones Ulysses sequence-parallel rank ``sp_rank`` of ``sp_size`` attends with:
    ``heads / TP`` consecutive heads per tensor-parallel rank, split into ``SP`` consecutive runs
    (the order of DeepSpeed's head all-to-all)."""
    if num_heads % (tp_size * sp_size):
        raise ValueError(f"{num_heads} heads do not split over tensor-parallel size {tp_size} x "
                         f"sequence-parallel size {sp_size}")
    if not 0 <= tp_rank < tp_size or not 0 <= sp_rank < sp_size:
        raise ValueError(f"tensor-parallel rank {tp_rank} outside [0, {tp_size}) or "
                         f"sequence-parallel rank {sp_rank} outside [0, {sp_size})")
    per_sp = num_heads // (tp_size * sp_size)
    start = tp_rank * (num_heads // tp_size) + sp_rank * per_sp
    return range(start, start + per_sp)


def alibi_slope_list_for_partition(num_heads: int, tp_size: int = 1, tp_rank: int = 0,
                                   sp_size: int = 1, sp_rank: int = 0) -> List[float]:
    """The slopes of the heads :func:`alibi_head_range` gives (a Python list of floats)."""
    heads = alibi_head_range(num_heads, tp_size, tp_rank, sp_size, sp_rank)
    return alibi_slope_list(num_heads)[heads.start:heads.stop]


def alibi_slopes_for_partition(num_heads: int, tp_size: int = 1, tp_rank: int = 0,
                               sp_size: int = 1, sp_rank: int = 0) -> torch.Tensor:
    """``[heads of this rank]`` float32 tensor of :func:`alibi_slope_list_for_partition`."""
    return torch.tensor(alibi_slope_list_for_partition(num_heads, tp_size, tp_rank, sp_size,
                                                       sp_rank), dtype=torch.float32)


def alibi_bias(slopes: torch.Tensor, q_len: int, k_len: int) -> torch.Tensor:
    """Dense ALiBi bias ``[heads, q_len, k_len]`` (float32, on the slopes' device): entry
    ``[h, q, k] = slopes[h] * (k - q)``."""
    q = torch.arange(q_len, device=slopes.device, dtype=torch.float32)
    k = torch.arange(k_len, device=slopes.device, dtype=torch.float32)
    return slopes.float()[:, None, None] * (k[None, None, :] - q[None, :, None])


def model_position_embedding_type(position_embedding_type: str) -> str:
    """The ``position_embedding_type`` megatron-core's ``GPTModel`` / ``LanguageModelEmbedding``
    is built with: ``none`` for ALiBi (the bias lives in the core attention), else unchanged."""
    return "none" if position_embedding_type == POSITION_EMBEDDING_TYPE else position_embedding_type
