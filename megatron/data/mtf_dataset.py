"""T0 / multitask-finetuning (MTF) datasets: inputs/targets document pairs, packing, masks.

Data layout (``tools/preprocess_data.py --json-keys inputs targets``): ``PREFIX_inputs_document``
and ``PREFIX_targets_document`` megatron-core indexed datasets; document ``i`` of one and document
``i`` of the other form one (input, target) pair.

Packing: several pairs go into one ``seq_length`` sample, each pair a *segment* (input tokens then
target tokens). Every epoch the pairs of the document range are shuffled, packed with best-fit
decreasing (items taken longest first, ties in shuffled order; each goes into the open pack with
the least room that still fits it, else a new pack), and the packs are shuffled. A pair longer than
the sequence is truncated, never dropped: the input loses tokens from the left first (the target is
kept), and only a target longer than the whole sequence loses its tail; truncations are counted
(``num_truncated``) and reported with a warning. A pair with an empty target is skipped (it takes
no packed position) and one with an empty input is packed as its target alone; both are counted
(``num_empty_targets``, ``num_empty_inputs``) and reported per dataset likewise. Epochs are added (each with its own shuffle) until
the requested number of samples exists, so sample ``i`` is a pure function of ``i`` (resuming at a
consumed-samples offset sees exactly the same data). The pack index is cached as ``.npy`` files in
the cache directory under a hash of everything it depends on (written atomically).

Each sample is a dict of tensors (``s`` = ``seq_length``):

``tokens`` [s] int64, padded with ``pad_id``;
``labels`` [s] int64: the next token within the same segment (GPT shift per segment); the last
    token of a segment and padding have no label (``pad_id`` there, loss weight 0);
``loss_mask`` [s] float32: weight of each position's label. With ``loss_on_targets_only`` (the T0
    default) it is non-zero exactly where the label is a target token of the same segment, else on
    every labelled position. With ``norm_target_loss`` each segment's weights are
    ``1 / (its number of loss positions)`` instead of 1 (BigScience MTF's normalisation);
``position_ids`` [s] int64 restarting at 0 for each segment (0 on padding);
``segment_ids`` [s] int32: 1..k for the k segments, 0 for padding;
``is_prefix`` [s] bool, only with ``prefix_lm``: the input tokens of each segment.

Attention is described by these two compactly (megatron/model/masks.py): a token attends only to
its own segment, causally, and with ``prefix_lm`` also bidirectionally among the segment's input
tokens (non-causal decoder). The model builds the mask its attention backend needs on the device.

How the forward step normalises: the loss of a micro batch is ``sum(token_loss * loss_mask) /
sum(loss_mask)`` (``megatron.train.steps.gpt_forward_step``). With 0/1 weights that is the mean over
target tokens; with ``norm_target_loss`` ``sum(loss_mask)`` is the number of targets in the micro
batch, so the loss is the mean over targets of each target's mean token loss: every target counts
equally, whatever its length.
"""
import os
import warnings
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from megatron.core.datasets.indexed_dataset import IndexedDataset

from megatron.data.blend_config import indexed_dataset_problem
from megatron.data.cache_key import cache_key
from megatron.errors import ConfigError
from megatron.runtime import jit_ops
from megatron.utils.atomic_io import atomic_path

INPUTS_KEY = "inputs"
TARGETS_KEY = "targets"
PACKING_VERSION = 1
# the pack index's cache key rule (v2: the declared KEY_INPUTS); entries of another rule are not read
PACK_INDEX_KEY_VERSION = "mtf-pack-index-v2"


class MTFFileNotFoundError(ConfigError, FileNotFoundError):
    """A missing inputs/targets file: a :class:`ConfigError` (entry points print ``error: ...``
    instead of a traceback) that is still a ``FileNotFoundError``."""


def mtf_paths(prefix: str) -> Tuple[str, str]:
    """The (inputs, targets) dataset prefixes of an MTF ``prefix``: ``PREFIX_inputs_document`` and
    ``PREFIX_targets_document``. A prefix already ending in ``_inputs_document`` (or
    ``_targets_document``) is accepted too."""
    for suffix in (f"_{INPUTS_KEY}_document", f"_{TARGETS_KEY}_document"):
        if prefix.endswith(suffix):
            prefix = prefix[: -len(suffix)]
    return f"{prefix}_{INPUTS_KEY}_document", f"{prefix}_{TARGETS_KEY}_document"


def _document_lengths(ds: IndexedDataset) -> np.ndarray:
    """Tokens per document (a document may hold several sequences)."""
    seq_lengths = np.asarray(ds.sequence_lengths, dtype=np.int64)
    doc_idx = np.asarray(ds.document_indices, dtype=np.int64)
    if len(doc_idx) - 1 == len(seq_lengths):
        return seq_lengths
    if len(seq_lengths) == 0:
        return np.zeros(len(doc_idx) - 1, dtype=np.int64)
    sums = np.add.reduceat(seq_lengths, doc_idx[:-1].clip(max=len(seq_lengths) - 1))
    sums[doc_idx[:-1] == doc_idx[1:]] = 0
    return sums


class MTFDocumentPair:
    """The inputs and targets indexed datasets of one MTF prefix, aligned by document.

    Raises FileNotFoundError naming the missing file, and ValueError naming both files when their
    document counts differ.
    """

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.inputs_path, self.targets_path = mtf_paths(prefix)
        for path in (self.inputs_path, self.targets_path):
            for ext in (".idx", ".bin"):
                if not os.path.isfile(path + ext):
                    raise MTFFileNotFoundError(
                        f"MTF dataset {prefix!r}: {path + ext} does not exist (expected "
                        f"tools/preprocess_data.py --json-keys {INPUTS_KEY} {TARGETS_KEY} output)")
            problem = indexed_dataset_problem(path)
            if problem:
                raise ConfigError(f"MTF dataset {prefix!r}: {problem}")
        self.inputs = IndexedDataset(self.inputs_path)
        self.targets = IndexedDataset(self.targets_path)
        n_in = len(self.inputs.document_indices) - 1
        n_tg = len(self.targets.document_indices) - 1
        if n_in != n_tg:
            raise ConfigError(
                f"MTF dataset {prefix!r}: {self.inputs_path}.idx holds {n_in} documents but "
                f"{self.targets_path}.idx holds {n_tg}; inputs and targets must pair up one to one")
        self.num_documents = n_in
        self.input_lengths = _document_lengths(self.inputs)
        self.target_lengths = _document_lengths(self.targets)
        self._one_seq_per_doc = (len(self.inputs) == n_in and len(self.targets) == n_tg)

    def __len__(self) -> int:
        return self.num_documents

    def _read(self, ds: IndexedDataset, doc: int, offset: int, length: int) -> np.ndarray:
        if self._one_seq_per_doc:
            return ds.get(doc, offset=offset, length=length)
        lo, hi = ds.document_indices[doc], ds.document_indices[doc + 1]
        full = np.concatenate([ds[i] for i in range(lo, hi)]) if hi > lo else np.zeros(0, np.int64)
        return full[offset: offset + length]

    def read_pair(self, doc: int, seq_length: int) -> Tuple[np.ndarray, np.ndarray]:
        """Input and target tokens of document ``doc``, truncated to fit ``seq_length`` (see
        :func:`truncated_lengths`)."""
        in_len, tg_len = int(self.input_lengths[doc]), int(self.target_lengths[doc])
        keep_in, keep_tg = truncated_lengths(in_len, tg_len, seq_length)
        inp = self._read(self.inputs, doc, in_len - keep_in, keep_in) if keep_in else np.zeros(0, np.int64)
        tgt = self._read(self.targets, doc, 0, keep_tg) if keep_tg else np.zeros(0, np.int64)
        return inp.astype(np.int64), tgt.astype(np.int64)

    def fingerprint(self) -> Dict:
        """What identifies these files for the pack cache."""
        out = {}
        for path in (self.inputs_path, self.targets_path):
            st = os.stat(path + ".idx")
            out[os.path.abspath(path)] = [st.st_size, int(st.st_mtime)]
        out["documents"] = self.num_documents
        out["tokens"] = [int(self.input_lengths.sum()), int(self.target_lengths.sum())]
        return out


def document_range(num_documents: int, start: float, end: float) -> Tuple[int, int]:
    """Documents ``[lo, hi)`` of the fraction range ``start:end`` (``0.9:1`` is the last tenth and
    never overlaps ``0:0.9``)."""
    if not 0.0 <= start <= end <= 1.0:
        raise ConfigError(f"document range {start}:{end} must satisfy 0 <= START <= END <= 1")
    return int(round(start * num_documents)), int(round(end * num_documents))


def truncated_lengths(input_length, target_length, seq_length):
    """(kept input tokens, kept target tokens) of a pair in a ``seq_length`` sample: the target is
    kept whole when it fits and the input loses tokens from the left; a target longer than the
    sequence keeps its first ``seq_length`` tokens and no input. Works on ints and arrays."""
    keep_tg = np.minimum(target_length, seq_length)
    keep_in = np.minimum(input_length, seq_length - keep_tg)
    if np.ndim(keep_in) == 0:
        return int(keep_in), int(keep_tg)
    return keep_in, keep_tg


PACK_KERNEL_SOURCE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mtf_packing.cpp")
PACK_KERNEL_NAME = "megatron_mtf_packing"
# below this many items the Python loop is quick and no kernel is built or loaded
PACK_KERNEL_MIN_ITEMS = 2048
_PACK_KERNEL: Dict[str, object] = {}  # {"fn": the built module, or None: the Python twin serves}


def _load_pack_kernel():
    """The compiled packing loop (``mtf_packing.cpp``: ``pack``), or None where it cannot be
    built (then :func:`_pack_in_python` gives the same packs, slowly). Built once per
    environment, loaded once per process."""
    if "fn" not in _PACK_KERNEL:
        _PACK_KERNEL["fn"] = jit_ops.load_op_or_none(
            PACK_KERNEL_NAME, [PACK_KERNEL_SOURCE_PATH], ["-O3"],
            "the T0 packing kernel (megatron/data/mtf_packing.cpp)", "about 20 s")
    return _PACK_KERNEL["fn"]


def pack_lengths(lengths: Sequence[int], seq_length: int) -> Tuple[np.ndarray, np.ndarray]:
    """Best-fit-decreasing bin packing of items with ``lengths`` (each 1..seq_length tokens) into
    bins of ``seq_length`` tokens. Items are taken longest first (stable: equal lengths keep their
    given order); each goes into the open bin with the least room that still fits it (among bins
    of equal room the one that reached it last), else into a new bin.

    Returns ``(items, offsets)``: bin ``b`` holds item indices ``items[offsets[b]:offsets[b+1]]``
    (in placement order); bins are numbered in creation order. From
    :data:`PACK_KERNEL_MIN_ITEMS` items on, the loop runs compiled (``mtf_packing.cpp``, about
    25 ns per item against about 1.5 us in Python); both give identical packs.
    """
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if lengths.size and (lengths.min() < 1 or lengths.max() > seq_length):
        raise ValueError(f"item lengths must be in [1, {seq_length}], got "
                         f"[{lengths.min()}, {lengths.max()}]")
    # longest first, stable: the room left by each length sorted ascending (a radix sort where
    # it fits 16 bits, several times faster than sorting -lengths as int64; the same order)
    room = seq_length - lengths
    order = np.argsort(room.astype(np.uint16 if seq_length < 2 ** 16 else np.int64, copy=False),
                       kind="stable").astype(np.int64, copy=False)
    kernel = _load_pack_kernel() if len(lengths) >= PACK_KERNEL_MIN_ITEMS else None
    if kernel is None:
        return _pack_in_python(lengths, order, int(seq_length))
    items = np.empty(len(lengths), dtype=np.int64)
    offsets = np.empty(len(lengths) + 1, dtype=np.int64)
    bins = kernel.pack(lengths, order, int(seq_length), items, offsets)
    return items, offsets[:bins + 1].copy()


def _pack_in_python(lengths: np.ndarray, order: np.ndarray,
                    seq_length: int) -> Tuple[np.ndarray, np.ndarray]:
    """:func:`pack_lengths`'s loop in Python (the kernel's twin): the items of ``lengths`` taken
    in ``order``, each into the open bin with the least room that fits it, else a new bin."""
    bins: List[List[int]] = []
    by_room: List[List[int]] = [[] for _ in range(seq_length + 1)]  # open bins by remaining room
    occupied = 0  # bit r set <=> by_room[r] is non-empty
    lengths_list = lengths.tolist()
    for idx in order.tolist():
        length = lengths_list[idx]
        fitting = occupied >> length
        if fitting:
            room = length + (fitting & -fitting).bit_length() - 1  # least room >= length
            candidates = by_room[room]
            b = candidates.pop()
            if not candidates:
                occupied &= ~(1 << room)
        else:
            b = len(bins)
            bins.append([])
            room = seq_length
        bins[b].append(idx)
        room -= length
        if room > 0:
            by_room[room].append(b)
            occupied |= 1 << room
    offsets = np.zeros(len(bins) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(b) for b in bins])
    items = np.fromiter((i for b in bins for i in b), dtype=np.int64, count=int(offsets[-1]))
    return items, offsets


def _atomic_save_npy(path: str, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, array)


class MTFDataset(torch.utils.data.Dataset):
    """Packed (input, target) samples from documents ``start:end`` of one MTF prefix.

    Args:
        name: short name (logs, cache file names).
        prefix: MTF prefix (``PREFIX_inputs_document`` / ``PREFIX_targets_document``).
        seq_length: tokens per sample.
        num_samples: samples the dataset must provide (more epochs are added as needed; at least
            one epoch is always built).
        seed: shuffling seed.
        doc_range: fractions ``(start, end)`` of the documents to use.
        cache_dir: directory for the ``.npy`` pack index (None: build in memory every time).
        index_pack: the :class:`~megatron.data.index_pack.IndexPack` the pack index is kept in
            (one segment per directory and build, shared by every dataset of a blend); None: its
            own three ``.npy`` files in ``cache_dir``.
        pad_id: padding token id.
        prefix_lm: bidirectional attention over each segment's inputs.
        loss_on_targets_only: loss on target tokens only (else on every labelled token; refused
            together with ``prefix_lm``, whose inputs see the tokens they would predict).
        norm_target_loss: weight each segment's loss tokens by 1 / their count.
        dataset_id: when not None, samples carry ``dataset_id`` (per-dataset training losses).
    """

    def __init__(self, name: str, prefix: str, seq_length: int, num_samples: int, seed: int,
                 doc_range: Tuple[float, float] = (0.0, 1.0), cache_dir: Optional[str] = None,
                 pad_id: int = 0, prefix_lm: bool = False, loss_on_targets_only: bool = True,
                 norm_target_loss: bool = False, dataset_id: Optional[int] = None,
                 pair: Optional[MTFDocumentPair] = None, index_pack=None):
        if prefix_lm and not loss_on_targets_only:
            raise ConfigError("prefix_lm with loss on input tokens leaks the answer (input tokens "
                             "attend bidirectionally); use loss_on_targets_only with prefix_lm")
        if seq_length < 2:
            raise ValueError(f"seq_length {seq_length} must be at least 2")
        self.name = name
        self.pair = pair if pair is not None else MTFDocumentPair(prefix)
        self.seq_length = int(seq_length)
        self.seed = int(seed)
        self.pad_id = int(pad_id)
        self.prefix_lm = prefix_lm
        self.loss_on_targets_only = loss_on_targets_only
        self.norm_target_loss = norm_target_loss
        self.dataset_id = dataset_id
        self.lo, self.hi = document_range(len(self.pair), *doc_range)
        in_len = self.pair.input_lengths[self.lo:self.hi]
        tg_len = self.pair.target_lengths[self.lo:self.hi]
        keep_in, keep_tg = truncated_lengths(in_len, tg_len, self.seq_length)
        self.num_truncated = int(((keep_in < in_len) | (keep_tg < tg_len)).sum())
        self.pair_lengths = (keep_in + keep_tg).astype(np.int64)
        # a pair without a target has nothing to learn: it takes no packed position
        self.documents = np.nonzero(tg_len > 0)[0]
        self.num_empty_targets = int(len(tg_len) - len(self.documents))
        self.num_empty_inputs = int(((in_len == 0) & (tg_len > 0)).sum())
        if len(self.documents) == 0:
            raise ConfigError(f"MTF dataset {name!r} ({prefix}, documents {self.lo}:{self.hi}) has "
                              "no (input, target) pair with a target")
        self._report_defects()
        self.num_samples = max(int(num_samples), 1)
        self.index_pack = index_pack
        self.items, self.offsets, self.epoch_starts = self._load_or_build(cache_dir)

    def _report_defects(self) -> None:
        """Warn (once per dataset, at construction) about pairs that are truncated, have an empty
        target (skipped) or an empty input (packed with their target alone)."""
        total = self.hi - self.lo
        if self.num_truncated:
            warnings.warn(f"MTF dataset {self.name!r}: {self.num_truncated} of {total} pairs "
                          f"exceed --seq-length {self.seq_length} and were truncated (inputs from "
                          "the left first)", stacklevel=2)
        if self.num_empty_targets:
            warnings.warn(f"MTF dataset {self.name!r}: {self.num_empty_targets} of {total} pairs "
                          "have an empty target and are skipped (a T0 record needs a target; "
                          "they take no packed positions)", stacklevel=2)
        if self.num_empty_inputs:
            warnings.warn(f"MTF dataset {self.name!r}: {self.num_empty_inputs} of {total} pairs "
                          "have an empty input; each is packed as its target alone (no loss on "
                          "the first target token, which nothing precedes)", stacklevel=2)

    # ---------------------------------------------------------------- index
    # What the pack index's build reads, each hashed whole into its cache key
    # (megatron/data/cache_key.py): the files (their fingerprint), the document range, the pairs
    # kept (those with a target) and their lengths after truncation, the length, the seed, the
    # samples asked and the packing rule's version (it seeds the epochs' orders too).
    KEY_INPUTS = ("pair", "lo", "hi", "documents", "pair_lengths", "seq_length", "seed",
                  "num_samples", "packing_version")
    packing_version = PACKING_VERSION

    def _cache_key(self) -> str:
        """The pack index's cache key: the SHA-256 (24 hex digits) of :attr:`KEY_INPUTS`."""
        return cache_key(PACK_INDEX_KEY_VERSION,
                         {name: getattr(self, name) for name in self.KEY_INPUTS}, length=24)[0]

    def _load_or_build(self, cache_dir: Optional[str]):
        if cache_dir and self.index_pack is not None:
            key = f"mtf-{self._cache_key()}"
            arrays = self.index_pack.lookup(cache_dir, key)
            if arrays is None:
                arrays = self._build()
                self.index_pack.add(cache_dir, key, self.name, arrays)
            return arrays
        if cache_dir:
            base = os.path.join(cache_dir, f"mtf_{self.name.replace(os.sep, '_')}_{self._cache_key()}")
            paths = [f"{base}_{part}.npy" for part in ("items", "offsets", "epochs")]
            if all(os.path.isfile(p) for p in paths):
                return tuple(np.load(p, mmap_mode="r") for p in paths)
        arrays = self._build()
        if cache_dir:
            try:
                os.makedirs(cache_dir, exist_ok=True)
                for path, array in zip(paths, arrays, strict=True):
                    _atomic_save_npy(path, array)
            except OSError as e:
                warnings.warn(f"MTF dataset {self.name!r}: could not write the pack cache in "
                              f"{cache_dir} ({e}); continuing without it", stacklevel=2)
        return arrays

    def pack_epoch(self, epoch: int) -> Tuple[np.ndarray, np.ndarray]:
        """Packs of one epoch, in sample order: (document indices relative to the range, offsets)."""
        rng = np.random.default_rng([self.seed, epoch, self.packing_version])
        docs = self.documents[rng.permutation(len(self.documents))]
        items, offsets = pack_lengths(self.pair_lengths[docs], self.seq_length)
        order = rng.permutation(len(offsets) - 1)
        sizes = np.diff(offsets)[order]
        starts = offsets[:-1][order]
        gather = np.repeat(starts - np.concatenate([[0], np.cumsum(sizes)[:-1]]), sizes) + \
            np.arange(int(sizes.sum()))
        new_offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        return docs[items[gather]], new_offsets

    def _build(self):
        all_items, all_offsets, epoch_starts = [], [np.zeros(1, np.int64)], [0]
        total_packs, total_items, epoch = 0, 0, 0
        while total_packs < self.num_samples:
            items, offsets = self.pack_epoch(epoch)
            all_items.append(items)
            all_offsets.append(offsets[1:] + total_items)
            total_items += len(items)
            total_packs += len(offsets) - 1
            epoch_starts.append(total_packs)
            epoch += 1
        return (np.concatenate(all_items).astype(np.int64),
                np.concatenate(all_offsets).astype(np.int64), np.asarray(epoch_starts, np.int64))

    @property
    def num_epochs(self) -> int:
        return len(self.epoch_starts) - 1

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def efficiency(self) -> float:
        """Non-padding tokens / all tokens over the built samples."""
        used = self.pair_lengths[np.asarray(self.items)].sum()
        return float(used) / (len(self) * self.seq_length)

    # ---------------------------------------------------------------- samples
    def documents_of_sample(self, index: int) -> np.ndarray:
        """Absolute document indices packed into sample ``index`` (segment order)."""
        return np.asarray(self.items[self.offsets[index]:self.offsets[index + 1]]) + self.lo

    def sample_documents(self, index: int) -> List[List[int]]:
        """``[[document, first_token, last_token], ...]`` of sample ``index``, one per segment in
        order: the pair's document number (the same in the inputs and targets files) and the
        range of its tokens packed, counted over the input followed by the target (an input
        truncated from the left starts after 0; ``last_token`` inclusive)."""
        out = []
        for doc in self.documents_of_sample(index).tolist():
            in_len, tg_len = int(self.pair.input_lengths[doc]), int(self.pair.target_lengths[doc])
            keep_in, keep_tg = truncated_lengths(in_len, tg_len, self.seq_length)
            out.append([int(doc), in_len - keep_in, in_len + keep_tg - 1])
        return out

    def epoch_and_position(self, index: int) -> Tuple[int, int]:
        """(epoch, position within that epoch's packs) of sample ``index`` (epochs differ in
        length: each packs its own shuffle)."""
        starts = np.asarray(self.epoch_starts)
        epoch = int(np.searchsorted(starts, index, side="right")) - 1
        return epoch, int(index) - int(starts[epoch])

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} outside [0, {len(self)}) of MTF dataset {self.name!r}")
        pairs = [self.pair.read_pair(int(d), self.seq_length) for d in self.documents_of_sample(index)]
        sample = pack_sample(pairs, self.seq_length, self.pad_id, prefix_lm=self.prefix_lm,
                             loss_on_targets_only=self.loss_on_targets_only,
                             norm_target_loss=self.norm_target_loss)
        if self.dataset_id is not None:
            sample["dataset_id"] = torch.tensor(self.dataset_id, dtype=torch.int64)
        return sample


def pack_sample(pairs: Sequence[Tuple[np.ndarray, np.ndarray]], seq_length: int, pad_id: int,
                prefix_lm: bool = False, loss_on_targets_only: bool = True,
                norm_target_loss: bool = False) -> Dict[str, torch.Tensor]:
    """One sample (dict of tensors, see the module docstring) from (input, target) token arrays
    that together fit in ``seq_length``."""
    tokens = np.full(seq_length, pad_id, dtype=np.int64)
    labels = np.full(seq_length, pad_id, dtype=np.int64)
    loss_mask = np.zeros(seq_length, dtype=np.float32)
    position_ids = np.zeros(seq_length, dtype=np.int64)
    segment_ids = np.zeros(seq_length, dtype=np.int32)
    is_input = np.zeros(seq_length, dtype=bool)
    pos = 0
    for k, (inp, tgt) in enumerate(pairs, start=1):
        n_in, n = len(inp), len(inp) + len(tgt)
        if n == 0:
            continue
        if pos + n > seq_length:
            raise ValueError(f"pairs of {pos + n} tokens do not fit in seq_length {seq_length}")
        seg = np.concatenate([np.asarray(inp, np.int64), np.asarray(tgt, np.int64)])
        end = pos + n
        tokens[pos:end] = seg
        labels[pos:end - 1] = seg[1:]
        position_ids[pos:end] = np.arange(n)
        segment_ids[pos:end] = k
        is_input[pos:pos + n_in] = True
        # position j predicts token j + 1; it is a target token when j + 1 >= pos + n_in
        first = pos + max(n_in, 1) - 1 if loss_on_targets_only else pos
        count = end - 1 - first
        if count > 0:
            loss_mask[first:end - 1] = 1.0 / count if norm_target_loss else 1.0
        pos = end
    sample = {
        "tokens": torch.from_numpy(tokens), "labels": torch.from_numpy(labels),
        "loss_mask": torch.from_numpy(loss_mask), "position_ids": torch.from_numpy(position_ids),
        "segment_ids": torch.from_numpy(segment_ids),
    }
    if prefix_lm:
        sample["is_prefix"] = torch.from_numpy(is_input)
    return sample


# -------------------------------------------------------------------- blends
class PackedSamplesOnly(torch.utils.data.Dataset):
    """A T0 blend (megatron/data/mtf_builder.py) that refuses a sample without ``segment_ids``:
    checked where every layout reads its samples (the pipe engine never calls a forward step), so
    attention can never cross the segments of a packed sample unnoticed."""

    def __init__(self, dataset: torch.utils.data.Dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        sample = self.dataset[index]
        if sample.get("segment_ids") is None:
            raise ValueError(f"T0 samples must carry segment_ids (blend sample {index}, dataset "
                             f"{int(sample.get('dataset_id', -1))})")
        return sample

    def __getattr__(self, name):
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)
