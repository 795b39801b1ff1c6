"""``--pack-documents``: how a GPT pretraining dataset's documents become samples, and the
best-fit packing itself (the dataset serving its bins: megatron/data/best_fit_dataset.py).

``concat`` (the default) is megatron-core's ``GPTDataset``: the documents shuffled and
concatenated, cut into windows of ``seq_length + 1`` tokens (the ``+ 1``: the label of the last
position), so most documents straddle two samples and a sample starts mid-document.

``best-fit`` packs whole documents instead ("Fewer Truncations Improve Language Modeling", Ding
et al. 2024): a sample is a *bin* of ``capacity = seq_length + 1`` tokens (``seq_length`` without
megatron-core's extra token). A document longer than the capacity is first cut into chunks of
``capacity`` tokens, the last one shorter (chunk ``j`` of a document holds its tokens
``[j * capacity, min(length, (j + 1) * capacity))``): the only documents split across samples,
and no token is dropped. The chunks (whole documents mostly) are then packed best-fit decreasing
by the T0 packer (megatron/data/mtf_dataset.py ``pack_lengths``, compiled in
``mtf_packing.cpp``): longest first, ties in an order drawn from the seed; each into the open bin
with the least room that still fits it (among bins of equal room, the one that reached that room
last), else into a new bin. A bin's documents follow each other in placement order, each ending
with its own EOD token as in the ``.bin`` file (a full chunk fills its bin alone, so two
documents in a bin are always whole documents or last chunks), and the bin is padded to the
capacity with megatron-core's pad id, whose labels take no loss. The bins are one epoch; epoch 0
shows them in an order drawn from the seed, later epochs reshuffle them
(megatron/data/epoch_order.py).

The number of bins depends on the document lengths and the capacity only: equal-length chunks
are interchangeable to the packer, so the seed's tie order changes which documents share a bin,
never how many bins there are. It is a dataset's samples per epoch
(megatron/data/curriculum/constituents.py), known before any index is built.
"""
from typing import Dict, Tuple

import numpy as np

from megatron.data.cache_key import array_digest

__all__ = ["CONCAT", "BEST_FIT", "PACKING_MODES", "BEST_FIT_VERSION", "TIES_TAG", "BINS_TAG",
           "bin_capacity", "document_chunks", "best_fit_bins", "best_fit_bin_count"]

CONCAT, BEST_FIT = "concat", "best-fit"
PACKING_MODES = (CONCAT, BEST_FIT)
BEST_FIT_VERSION = 1  # the packing rule: in the name (and so the cache key) of every packed index
TIES_TAG = 0x6266     # "bf": the seed's stream of the tie order, apart from other users of it
BINS_TAG = 0x6262     # "bb": the seed's stream of epoch 0's bin order


def bin_capacity(seq_length: int, add_extra_token: bool = True) -> int:
    """Tokens of one best-fit bin: ``seq_length`` plus megatron-core's extra (label) token."""
    return int(seq_length) + int(add_extra_token)


def document_chunks(lengths: np.ndarray, capacity: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(document, chunk, tokens)`` of every item the documents of ``lengths`` (tokens each)
    make: one item per document of at most ``capacity`` tokens, ``ceil(length / capacity)``
    chunks of a longer one (chunk ``j``: tokens ``j * capacity`` on, ``tokens`` of them); an empty
    document makes none. ``document`` indexes ``lengths``; int64 arrays."""
    lengths = np.asarray(lengths, dtype=np.int64)
    counts = -(-lengths // int(capacity))
    documents = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    first_item = np.cumsum(counts) - counts
    chunks = np.arange(len(documents), dtype=np.int64) - np.repeat(first_item, counts)
    tokens = np.minimum(int(capacity), lengths[documents] - chunks * int(capacity))
    return documents, chunks, tokens


def best_fit_bins(lengths: np.ndarray, capacity: int,
                  seed: int) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The best-fit-decreasing packing (module docstring) of the documents of ``lengths`` into
    bins of ``capacity`` tokens, ties in the order of ``seed``: ``(document, chunk, offsets)``,
    bin ``b`` holding the items ``offsets[b]:offsets[b + 1]`` of ``document``/``chunk`` (see
    :func:`document_chunks`), in placement order; bins in creation order."""
    from megatron.data.mtf_dataset import pack_lengths  # lazy: megatron-core (~2 s); not at --help

    documents, chunks, tokens = document_chunks(lengths, capacity)
    ties = np.random.default_rng([int(seed), TIES_TAG]).permutation(len(tokens))
    placed, offsets = pack_lengths(tokens[ties], int(capacity))
    pick = ties[placed]
    return documents[pick], chunks[pick], offsets


_BIN_COUNTS: Dict[Tuple[str, int], int] = {}  # (lengths' sha256, capacity) -> bins, per process
_BIN_COUNTS_KEPT = 1 << 16


def best_fit_bin_count(lengths: np.ndarray, capacity: int) -> int:
    """The number of bins :func:`best_fit_bins` makes of ``lengths`` at ``capacity`` (for any
    seed), remembered per process (a resolve of the same blend asks again)."""
    key = (array_digest(np.asarray(lengths, dtype=np.int64))["sha256"], int(capacity))
    count = _BIN_COUNTS.get(key)
    if count is None:
        from megatron.data.mtf_dataset import pack_lengths  # lazy: megatron-core (~2 s); not at --help

        _, _, tokens = document_chunks(lengths, capacity)
        count = len(pack_lengths(tokens, int(capacity))[1]) - 1
        if len(_BIN_COUNTS) >= _BIN_COUNTS_KEPT:
            _BIN_COUNTS.clear()
        _BIN_COUNTS[key] = count
    return count
