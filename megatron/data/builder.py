"""Build the train / valid / test GPT datasets from args with megatron-core's dataset builder."""
import os
from typing import List, Optional, Tuple

import torch

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.utils import get_blend_from_list

from megatron.data.blend_config import indexed_dataset_problem
from megatron.data.train_data import EvalGroup, TrainData
from megatron.errors import ConfigError
from megatron.rank_utils import print_rank_0
from megatron.schedules.units import (batch_schedule_from_args, train_iterations_from_args,
                                      train_samples_from_args)


def train_valid_test_num_samples(args) -> Tuple[int, int, int]:
    """Samples each split must provide: the samples the planned training iterations consume (the
    sum of the batch schedule's global batch sizes over ``train_iters``, which is at most
    ``--train-samples``: a partial last batch is dropped), every evaluation of the validation set
    (``(train_iters // eval_interval + 1) x eval_iters`` global batches), and one test pass."""
    schedule = batch_schedule_from_args(args)
    train_iters = train_iterations_from_args(args, schedule)
    train_samples = train_samples_from_args(args, schedule)
    evaluations = train_iters // args.eval_interval + 1
    eval_samples = evaluations * args.eval_iters * args.global_batch_size
    test_samples = args.eval_iters * args.global_batch_size
    return train_samples, eval_samples, test_samples


def gpt_dataset_config(args, tokenizer) -> GPTDatasetConfig:
    """megatron-core ``GPTDatasetConfig`` for the static blend given by the data flags."""
    split_paths = [args.train_data_path, args.valid_data_path, args.test_data_path]
    blend_per_split = None
    if any(split_paths):
        blend_per_split = [get_blend_from_list(p) if p else None for p in split_paths]
    return GPTDatasetConfig(
        random_seed=args.seed,
        sequence_length=args.seq_length,
        blend=get_blend_from_list(args.data_path) if args.data_path else None,
        blend_per_split=blend_per_split,
        split=None if blend_per_split else args.split,
        path_to_cache=args.data_cache_path,
        tokenizer=tokenizer,
        reset_position_ids=args.reset_position_ids,
        reset_attention_mask=args.reset_attention_mask,
        eod_mask_loss=args.eod_mask_loss,
        create_attention_mask=False,  # --reset-attention-mask: segment_ids (document_segments.py)
        mid_level_dataset_surplus=0.005,
    )


def check_prefixes_exist(flag: str, paths: Optional[List[str]]) -> None:
    """Raise a ValueError naming ``flag`` and the prefix when a ``.bin`` or ``.idx`` is missing,
    truncated or corrupt."""
    if not paths:
        return
    prefixes, _ = get_blend_from_list(paths)
    for prefix in prefixes:
        missing = [ext for ext in (".bin", ".idx") if not os.path.isfile(prefix + ext)]
        if missing:
            raise ConfigError(f"{flag}: dataset prefix {prefix!r} has no {' or '.join(missing)} file "
                             f"(expected {prefix}.bin and {prefix}.idx from tools/preprocess_data.py)")
        problem = indexed_dataset_problem(prefix)
        if problem:
            raise ConfigError(f"{flag}: {problem}")


def check_split_has_documents(data_path: List[str], split: str) -> None:
    """Raise a ConfigError naming ``--split`` and the prefix when a split with a non-zero share
    selects no document of a ``--data-path`` prefix (megatron-core, which rounds each split's
    document range as here, would loop forever sizing that empty split)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix, parse_and_normalize_split)

    bounds = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    prefixes, _ = get_blend_from_list(data_path)
    for prefix in prefixes:
        with open(prefix + ".idx", "rb") as f:  # header checked by check_prefixes_exist
            f.seek(18)
            n = int.from_bytes(f.read(8), "little")  # sequences: what megatron-core splits
        for name, bound in zip(("train", "valid", "test"), bounds):
            if bound is not None and int(round(bound[1] * n)) <= int(round(bound[0] * n)):
                raise ConfigError(
                    f"--split {split}: the {name} split ({bound[0]:g} to {bound[1]:g} of the "
                    f"documents) selects none of the {n} documents of --data-path prefix "
                    f"{prefix!r}; give more documents or a larger {name} share (or share 0)")


def build_train_valid_test_datasets(args, tokenizer) -> List[Optional[torch.utils.data.Dataset]]:
    """[train, valid, test] datasets (None where a split is empty) sized for the whole run."""
    for flag in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        check_prefixes_exist("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.data_path:
        check_split_has_documents(args.data_path, args.split)
    sizes = list(train_valid_test_num_samples(args))
    builder = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, gpt_dataset_config(args, tokenizer))
    return builder.build()


def dataset_names(args) -> List[str]:
    """Short names of the training blend's datasets, in blend order (``dataset_id`` order):
    see :func:`~megatron.data.blend_config.short_dataset_name`."""
    from megatron.data.blend_config import short_dataset_name

    paths = args.data_path or args.train_data_path or []
    prefixes, _ = get_blend_from_list(paths) if paths else ([], None)
    return [short_dataset_name(prefix) for prefix in prefixes]


def _eval_groups(valid, test) -> List[EvalGroup]:
    return ([EvalGroup(name, ds, "valid") for name, ds in valid]
            + [EvalGroup(name, ds, "test") for name, ds in test])


def _weighted_split_data(args, tokenizer) -> TrainData:
    """``--{train,valid,test}-weighted-split-paths``: one training blend, one eval set per group."""
    from megatron.data.weighted_splits import WeightedSplitError, build_weighted_split_datasets

    groups = args.weighted_split_groups
    if len(groups["train"]) > 1:
        names = ", ".join(g.name for g in groups["train"])
        raise WeightedSplitError(f"--train-weighted-split-paths: give one training group (got "
                                 f"{len(groups['train'])}: {names}); put all its items in it")
    for split in ("train", "valid", "test"):
        for group in groups[split]:
            for item in group.items:
                check_prefixes_exist(f"--{split}-weighted-split-paths group {group.name}", [item.prefix])
    n_train, n_valid, n_test = train_valid_test_num_samples(args)
    config = gpt_dataset_config(args, tokenizer)
    schedule = batch_schedule_from_args(args)
    built = {split: build_weighted_split_datasets(groups[split], n, config, schedule, split,
                                                  args.data_cache_path)
             for split, n in (("train", n_train), ("valid", n_valid), ("test", n_test))
             if groups[split] and n > 0}
    train = built.get("train", [(None, None)])[0][1]
    return TrainData(train=train, eval_groups=_eval_groups(built.get("valid", []), built.get("test", [])),
                     dataset_names=list(train.names) if train is not None else [])


def _blend_config_data(args, tokenizer) -> TrainData:
    """``--data-blend-config``: a curriculum training set and the file's named eval groups."""
    from megatron.data.curriculum import build_blend_config_datasets

    train, valid, test = build_blend_config_datasets(
        args.data_blend, train_valid_test_num_samples(args), gpt_dataset_config(args, tokenizer),
        batch_schedule_from_args(args), args.data_cache_path)
    if train is not None:
        epochs = ", ".join(f"{name} {e:.2f}" for name, e in train.epochs.items())
        print_rank_0(f"curriculum: {len(train)} training samples from {len(train.names)} datasets; "
                     f"epochs drawn: {epochs}")
    return TrainData(train=train, eval_groups=_eval_groups(valid, test),
                     dataset_names=list(train.names) if train is not None else [])


def _static_blend_data(args, tokenizer) -> TrainData:
    """``--data-path``/``--split`` or ``--{train,valid,test}-data-path``: megatron-core blends."""
    train, valid, test = build_train_valid_test_datasets(args, tokenizer)
    groups = []
    if valid is not None:
        groups.append(EvalGroup("valid", valid, "valid"))
    if test is not None:
        groups.append(EvalGroup("test", test, "test"))
    return TrainData(train=train, eval_groups=groups, dataset_names=dataset_names(args))


def build_pretraining_data(args, tokenizer) -> TrainData:
    """Training set and evaluation groups for ``pretrain_gpt.py`` from whichever data flags are
    given (validated to be exactly one kind by ``megatron.arguments``). With ranks on several
    hosts the index cache directories must be shared first (megatron/data/shared_cache.py)."""
    from megatron.data.shared_cache import index_cache_dirs, require_shared_cache_dirs

    require_shared_cache_dirs(index_cache_dirs(args), flag_given=bool(args.data_cache_path))
    if getattr(args, "data_blend", None) is not None:
        return _blend_config_data(args, tokenizer)
    if any(getattr(args, "weighted_split_groups", {}).values()):
        return _weighted_split_data(args, tokenizer)
    return _static_blend_data(args, tokenizer)
