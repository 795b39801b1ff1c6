"""Build the train / valid / test GPT datasets from args with megatron-core's dataset builder."""
import os
from typing import List, Optional, Tuple

import torch

from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
from megatron.core.datasets.utils import get_blend_from_list

from megatron.errors import ConfigError
from megatron.schedules.units import batch_schedule_from_args


def train_valid_test_num_samples(args) -> Tuple[int, int, int]:
    """Samples each split must provide: the whole training run, every evaluation of the validation
    set (``(train_iters // eval_interval + 1) x eval_iters`` global batches), and one test pass."""
    schedule = batch_schedule_from_args(args)
    train_samples = (args.train_samples if args.train_samples is not None
                     else schedule.samples_at_iteration(args.train_iters))
    evaluations = args.train_iters // args.eval_interval + 1
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
        create_attention_mask=args.reset_attention_mask,
        mid_level_dataset_surplus=0.005,
    )


def check_prefixes_exist(flag: str, paths: Optional[List[str]]) -> None:
    """Raise a ValueError naming ``flag`` and the prefix when a ``.bin`` or ``.idx`` is missing."""
    if not paths:
        return
    prefixes, _ = get_blend_from_list(paths)
    for prefix in prefixes:
        missing = [ext for ext in (".bin", ".idx") if not os.path.isfile(prefix + ext)]
        if missing:
            raise ConfigError(f"{flag}: dataset prefix {prefix!r} has no {' or '.join(missing)} file "
                             f"(expected {prefix}.bin and {prefix}.idx from tools/preprocess_data.py)")


def build_train_valid_test_datasets(args, tokenizer) -> List[Optional[torch.utils.data.Dataset]]:
    """[train, valid, test] datasets (None where a split is empty) sized for the whole run."""
    for flag in ("data_path", "train_data_path", "valid_data_path", "test_data_path"):
        check_prefixes_exist("--" + flag.replace("_", "-"), getattr(args, flag))
    sizes = list(train_valid_test_num_samples(args))
    builder = BlendedMegatronDatasetBuilder(
        GPTDataset, sizes, lambda: True, gpt_dataset_config(args, tokenizer))
    return builder.build()


def dataset_names(args) -> List[str]:
    """Short names of the training blend's datasets, in blend order (``dataset_id`` order):
    the basename of each prefix, with ``_text_document``/``_document`` stripped."""
    paths = args.data_path or args.train_data_path or []
    prefixes, _ = get_blend_from_list(paths) if paths else ([], None)
    names = []
    for prefix in prefixes:
        name = prefix.rstrip("/").split("/")[-1]
        for suffix in ("_text_document", "_document"):
            if name.endswith(suffix):
                name = name[: -len(suffix)]
        names.append(name)
    return names
