"""T0 / multitask-finetuning data from the flags (``finetune_t0.py``'s datasets): the training set
is one weighted blend of packed MTF datasets (megatron/data/mtf_dataset.py), one per item of every
``--train-weighted-split-paths`` group; each ``--valid-``/``--test-weighted-split-paths`` group is
one named evaluation group, blended the same way. The groups are parsed by ``validate_args``
(megatron/data/weighted_splits.py); the sample counts are the pretraining builder's
(megatron/data/builder.py ``train_valid_test_num_samples``).
"""
import os
from typing import List, Sequence, Tuple

from megatron.data.blend_config import short_dataset_name
from megatron.data.builder import train_valid_test_num_samples
from megatron.data.mtf_dataset import MTFBlendedDataset, MTFDataset
from megatron.data.train_data import EvalGroup, TrainData

# (weight, start, end, prefix)
SplitItem = Tuple[float, float, float, str]


def weighted_split_groups(args, split: str) -> List[Tuple[str, List[SplitItem]]]:
    """The named groups of ``--{split}-weighted-split-paths`` (or ``...-path FILE``), parsed by
    ``megatron.arguments`` (megatron/data/weighted_splits.py), as (name, [(weight, start, end,
    prefix)]). Files are checked per inputs/targets pair by MTFDocumentPair."""
    return [(g.name, [(it.weight, it.start, it.end, it.prefix) for it in g.items])
            for g in args.weighted_split_groups[split]]


def build_group_dataset(args, tokenizer, name: str, items: Sequence[SplitItem], num_samples: int,
                        with_dataset_id: bool = False) -> MTFBlendedDataset:
    """A weighted blend of packed MTF datasets, one per group item, ``num_samples`` long, padded
    with the tokenizer's pad id (its eod when it has none)."""
    pad_id = tokenizer.pad if hasattr(tokenizer, "pad") else tokenizer.eod

    def factory(k: int, n: int) -> MTFDataset:
        weight, start, end, prefix = items[k]
        cache = args.data_cache_path or os.path.join(os.path.dirname(os.path.abspath(prefix)), "cache")
        return MTFDataset(
            f"{name}_{k}_{short_dataset_name(prefix)}", prefix, args.seq_length, n, args.seed,
            doc_range=(start, end), cache_dir=cache, pad_id=pad_id, prefix_lm=args.prefix_lm,
            loss_on_targets_only=args.loss_on_targets_only,
            norm_target_loss=args.norm_target_loss,
            dataset_id=k if with_dataset_id else None)

    names = [short_dataset_name(item[3]) for item in items]
    return MTFBlendedDataset([item[0] for item in items], num_samples, factory, names)


def dataset_names(groups) -> List[str]:
    """Per-dataset loss names of the training blend (item order), made unique."""
    names = []
    for _, items in groups:
        for item in items:
            base = short_dataset_name(item[3])
            name, k = base, 1
            while name in names:
                k += 1
                name = f"{base}_{k}"
            names.append(name)
    return names


def build_mtf_data(args, tokenizer) -> TrainData:
    """Train: the blend of all ``--train-weighted-split-paths`` items (by weight), with per-dataset
    ids for the per-dataset loss; one named EvalGroup per ``--valid-weighted-split-paths`` (and
    ``--test-...``) group. Reads the T0 flags ``--prefix-lm``, ``--loss-on-targets-only`` and
    ``--norm-target-loss`` (finetune_t0.py)."""
    train_samples, valid_samples, test_samples = train_valid_test_num_samples(args)
    train_groups = weighted_split_groups(args, "train")
    train_items = [item for _, items in train_groups for item in items]
    train = build_group_dataset(args, tokenizer, "train", train_items, train_samples,
                                with_dataset_id=True)
    eval_groups = []
    for split, count in (("valid", valid_samples), ("test", test_samples)):
        for name, items in weighted_split_groups(args, split):
            eval_groups.append(EvalGroup(name, build_group_dataset(args, tokenizer, name, items,
                                                                   count), split))
    return TrainData(train=train, eval_groups=eval_groups, dataset_names=dataset_names(train_groups))
