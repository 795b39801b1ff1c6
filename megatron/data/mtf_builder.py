"""T0 / multitask-finetuning data from the flags (``finetune_t0.py``'s datasets): the training set
is one weighted blend of packed MTF datasets (megatron/data/mtf_dataset.py), one per item of every
``--train-weighted-split-paths`` group, with the data ledger (megatron/data/mix_resume.py: a
resumed run continues every dataset where it stood, ``--override-data-mix`` takes edited weights
or items); each ``--valid-``/``--test-weighted-split-paths`` group is one named evaluation group,
blended the same way. Blends follow megatron-core's blending rule
(megatron/data/curriculum/, static weights). The groups are parsed by ``validate_args``
(megatron/data/weighted_splits.py); the sample counts are the pretraining builder's
(megatron/data/builder.py ``train_valid_test_num_samples``).
"""
import os
from typing import Dict, List, Sequence, Tuple

import numpy as np

from megatron.data.blend_config import BlendEntry, BlendStage, SplitBlend, short_dataset_name
from megatron.data.builder import train_valid_test_num_samples, training_data, training_mix
from megatron.data.curriculum.constituents import Constituent
from megatron.data.curriculum.dataset import build_mix_dataset
from megatron.data.data_config import DataConfig
from megatron.data.index_pack import IndexPack
from megatron.data.mix_ledger import gpt_files_fingerprint
from megatron.data.mix_resume import MixSources
from megatron.data.mtf_dataset import MTFDataset, MTFDocumentPair, PackedSamplesOnly, document_range, truncated_lengths
from megatron.data.train_data import EvalGroup, TrainData
from megatron.data.weighted_splits import WeightedSplitGroup
from megatron.schedules.units import batch_schedule

# (weight, start, end, prefix)
SplitItem = Tuple[float, float, float, str]


def weighted_split_groups(groups: Dict[str, List[WeightedSplitGroup]],
                          split: str) -> List[Tuple[str, List[SplitItem]]]:
    """The named groups of ``--{split}-weighted-split-paths`` (or ``...-path FILE``) of ``groups``
    (``DataConfig.weighted_split_groups``, parsed by ``megatron.config.data_flags``:
    megatron/data/weighted_splits.py), as (name, [(weight, start, end, prefix)]). Files are
    checked per inputs/targets pair by MTFDocumentPair."""
    return [(g.name, [(it.weight, it.start, it.end, it.prefix) for it in g.items])
            for g in groups[split]]


def items_blend(items: Sequence[SplitItem], name: str, where: str) -> SplitBlend:
    """One static blend of MTF items; an item listed twice (the same prefix and range, in two
    groups) is one dataset whose weight is the sum."""
    merged: Dict[Tuple[str, float, float], float] = {}
    for weight, start, end, prefix in items:
        merged[(prefix, start, end)] = merged.get((prefix, start, end), 0.0) + float(weight)
    entries = tuple(BlendEntry(path=prefix, weight=weight, split=(start, end),
                               where=f"{where} item {prefix} {start:g}:{end:g}")
                    for (prefix, start, end), weight in merged.items())
    return SplitBlend(stages=(BlendStage("blend", entries, None, where),), name=name, where=where)


def mtf_fingerprint(pair: MTFDocumentPair) -> str:
    """The fingerprint of an MTF prefix's two files (megatron/data/mix_ledger.py), their header
    counts taken from the pair's open indices (no header read again)."""
    def counts(ds):
        return len(ds.sequence_lengths), len(ds.document_indices)

    return (f"inputs: {gpt_files_fingerprint(pair.inputs_path, counts(pair.inputs))}; "
            f"targets: {gpt_files_fingerprint(pair.targets_path, counts(pair.targets))}")


def resolve_mtf_constituents(blend: SplitBlend, seq_length: int,
                             pairs: Dict[str, MTFDocumentPair]) -> List[Constituent]:
    """The blend's MTF datasets (one per prefix and document range), named after the prefix (a
    name taken twice gets ``_2``, ``_3``, ...); their epochs pack differently, so they have no
    fixed ``samples_per_epoch``."""
    out: List[Constituent] = []
    names = set()  # the names taken so far (a set: thousands of prefixes stay linear)
    for entry in (e for stage in blend.stages for e in stage.entries):
        if entry.path not in pairs:
            pairs[entry.path] = MTFDocumentPair(entry.path)
        pair = pairs[entry.path]
        lo, hi = document_range(len(pair), *entry.split)
        keep_in, keep_tg = truncated_lengths(pair.input_lengths[lo:hi], pair.target_lengths[lo:hi],
                                             seq_length)
        base, name, k = short_dataset_name(entry.path), short_dataset_name(entry.path), 1
        while name in names:
            k += 1
            name = f"{base}_{k}"
        names.add(name)
        out.append(Constituent(entry.path, entry.split, name, lo, hi, len(pair),
                               int(np.sum(keep_in) + np.sum(keep_tg)), None, mtf_fingerprint(pair)))
    return out


def mtf_mix_sources(config: DataConfig, tokenizer, kind: str = "t0"):
    """How T0 datasets are built (megatron/data/mix_resume.py ``MixSources``): packed
    :class:`MTFDataset` samples (every epoch its own shuffle and packing, so sample ``k`` is the
    same whatever a run draws), padded with the tokenizer's pad id (its eod when it has none)."""
    pad_id = tokenizer.pad if hasattr(tokenizer, "pad") else tokenizer.eod
    pairs: Dict[str, MTFDocumentPair] = {}
    pack = IndexPack()

    def make_source(c: Constituent, num_samples: int, seed: int) -> MTFDataset:
        cache = config.data_cache_path or os.path.join(os.path.dirname(os.path.abspath(c.path)), "cache")
        return MTFDataset(c.name, c.path, config.seq_length, max(num_samples, 1), seed,
                          doc_range=c.split, cache_dir=cache, pad_id=pad_id,
                          prefix_lm=config.prefix_lm, loss_on_targets_only=config.loss_on_targets_only,
                          norm_target_loss=config.norm_target_loss, pair=pairs.get(c.path),
                          index_pack=pack)

    return MixSources(kind, lambda blend: resolve_mtf_constituents(blend, config.seq_length, pairs),
                      make_source, config.data_cache_path, config.data_index_order, pack)


def build_group_dataset(config: DataConfig, tokenizer, name: str, items: Sequence[SplitItem],
                        num_samples: int, split: str = "valid") -> PackedSamplesOnly:
    """An evaluation group: the weighted blend of its packed MTF items, ``num_samples`` long."""
    sources = mtf_mix_sources(config, tokenizer)
    blend = items_blend(items, name, f"--{split}-weighted-split-paths group {name!r}")
    dataset = build_mix_dataset(blend, sources.resolve(blend), num_samples,
                                batch_schedule(config.batch), config.seed,
                                lambda c, n: sources.make_source(c, n, config.seed),
                                config.data_cache_path, order=config.data_index_order,
                                index_pack=sources.index_pack)
    return PackedSamplesOnly(dataset)


def build_mtf_data(config: DataConfig, tokenizer, resume=None) -> TrainData:
    """Train: the blend of all ``--train-weighted-split-paths`` items (by weight), with per-dataset
    ids for the per-dataset loss and the data ledger (``resume``: the checkpoint a resumed run
    continues, megatron/data/mix_resume.py ``DataResume``); one named EvalGroup per
    ``--valid-weighted-split-paths`` (and ``--test-...``) group. Reads the T0 flags
    ``--prefix-lm``, ``--loss-on-targets-only`` and ``--norm-target-loss`` (finetune_t0.py)."""
    train_samples, valid_samples, test_samples = train_valid_test_num_samples(config)
    eval_groups = []
    for split, count in (("valid", valid_samples), ("test", test_samples)):
        if count <= 0:
            continue
        for name, items in weighted_split_groups(config.weighted_split_groups, split):
            eval_groups.append(EvalGroup(name, build_group_dataset(config, tokenizer, name, items,
                                                                   count, split), split))
    train_items = [item for _, items in weighted_split_groups(config.weighted_split_groups, "train")
                   for item in items]
    if not train_items or train_samples <= 0:
        return TrainData(train=None, eval_groups=eval_groups)
    blend = items_blend(train_items, "train", "--train-weighted-split-paths")
    mix = training_mix(config, mtf_mix_sources(config, tokenizer), blend, resume, eval_groups)
    return training_data(config, mix, blend, eval_groups, train=PackedSamplesOnly(mix.dataset))


__all__ = ["weighted_split_groups", "items_blend", "resolve_mtf_constituents", "mtf_mix_sources",
           "build_group_dataset", "build_mtf_data"]
