"""Build the train / valid / test GPT datasets of ``pretrain_gpt.py`` from its data flags: a
``--data-blend-config`` curriculum, weighted split groups or Megatron-LM's ``--data-path``
static blends, the training set with its data ledger (megatron/data/mix_resume.py)."""
from dataclasses import replace
from typing import Dict, List, Optional, Sequence, Tuple

from megatron.core.datasets.utils import get_blend_from_list

from megatron.data.best_fit_dataset import PackingGPTDatasetConfig, packing_of
from megatron.data.blend_config import (
    BlendEntry,
    BlendStage,
    SplitBlend,
    dataset_prefix_problem,
    prefix_problems_message,
)
from megatron.data.curriculum.constituents import resolve_constituents
from megatron.data.curriculum.dataset import build_blend_config_datasets, build_curriculum_dataset, gpt_epoch_source
from megatron.data.data_config import DataConfig
from megatron.data.index_pack import IndexPack
from megatron.data.loss_weights import dataset_loss_weights, parse_dataset_loss_weights
from megatron.data.mix_resume import MixSources, continue_training_mix, eval_group_counters
from megatron.data.train_data import EvalGroup, TrainData
from megatron.data.weighted_splits import WeightedSplitError, build_weighted_split_datasets
from megatron.errors import ConfigError
from megatron.schedules.units import batch_schedule, planned_samples, train_iterations
from megatron.utils.rank_utils import print_rank_0


def train_valid_test_num_samples(config: DataConfig) -> Tuple[int, int, int]:
    """Samples each split must provide: the samples the planned training iterations consume (the
    sum of the batch schedule's global batch sizes over ``train_iters``, which is at most
    ``--train-samples``: a partial last batch is dropped), every evaluation of the validation set
    (``(train_iters // eval_interval + 1) x eval_iters`` global batches), and one test pass."""
    schedule = batch_schedule(config.batch)
    train_iters = train_iterations(config.train_iters, config.train_samples, schedule)
    train_samples = planned_samples(config.train_iters, config.train_samples, schedule)
    evaluations = train_iters // config.eval_interval + 1
    eval_samples = evaluations * config.eval_iters * config.global_batch_size
    test_samples = config.eval_iters * config.global_batch_size
    return train_samples, eval_samples, test_samples


def gpt_dataset_config(config: DataConfig, tokenizer) -> PackingGPTDatasetConfig:
    """megatron-core ``GPTDatasetConfig`` for the static blend given by the data flags, with
    ``--pack-documents`` (megatron/data/document_packing.py)."""
    split_paths = [config.train_data_path, config.valid_data_path, config.test_data_path]
    blend_per_split = None
    if any(split_paths):
        blend_per_split = [get_blend_from_list(p) if p else None for p in split_paths]
    return PackingGPTDatasetConfig(
        random_seed=config.seed,
        sequence_length=config.seq_length,
        blend=get_blend_from_list(config.data_path) if config.data_path else None,
        blend_per_split=blend_per_split,
        split=None if blend_per_split else config.split,
        path_to_cache=config.data_cache_path,
        tokenizer=tokenizer,
        reset_position_ids=config.reset_position_ids,
        reset_attention_mask=config.reset_attention_mask,
        eod_mask_loss=config.eod_mask_loss,
        create_attention_mask=False,  # --reset-attention-mask: segment_ids (document_segments.py)
        mid_level_dataset_surplus=0.005,
        pack_documents=config.pack_documents,
    )


def check_all_prefixes(sources: Sequence[Tuple[str, str, Optional[Sequence[str]]]]) -> None:
    """Raise one ConfigError for every unreadable prefix of ``sources`` (``(flag, context,
    prefixes)``; ``context`` prefixes each problem, e.g. a weighted-split group): the flag(s), the
    first few problems and how many more (megatron/data/blend_config.py ``prefix_problems_message``),
    so a blend of thousands of shards is checked at once before anything is built."""
    found = [(flag, context + text) for flag, context, prefixes in sources if prefixes
             for text in map(dataset_prefix_problem, prefixes) if text]
    if not found:
        return
    flags = list(dict.fromkeys(flag for flag, _ in found))
    if len(flags) == 1:
        raise ConfigError(prefix_problems_message(flags[0], [text for _, text in found]))
    raise ConfigError(prefix_problems_message(" and ".join(flags),
                                              [f"{flag}: {text}" for flag, text in found]))


def check_prefixes_exist(flag: str, paths: Optional[List[str]]) -> None:
    """Raise a ConfigError naming ``flag`` and the prefixes whose ``.bin`` or ``.idx`` is missing,
    truncated or corrupt (``paths``: ``--data-path`` words, weights or not)."""
    if paths:
        check_all_prefixes([(flag, "", get_blend_from_list(paths)[0])])


def check_data_path_prefixes(config: DataConfig) -> None:
    """Every prefix of ``--data-path`` and ``--{train,valid,test}-data-path`` (or of the
    data-args files they were read from) readable, or one ConfigError for all that are not."""
    check_all_prefixes([(data_flag_name(dest, config.data_args_path,
                                        config.per_split_data_args_path), "",
                         get_blend_from_list(getattr(config, dest))[0])
                        for dest in ("data_path", "train_data_path", "valid_data_path",
                                     "test_data_path") if getattr(config, dest)])


def check_weighted_split_prefixes(groups) -> None:
    """Every prefix of the weighted-split ``groups`` (``{split: [WeightedSplitGroup]}``) readable,
    or one ConfigError for all that are not, each named with its group."""
    check_all_prefixes([(f"--{split}-weighted-split-paths", f"group {group.name}: ",
                         [item.prefix for item in group.items])
                        for split in ("train", "valid", "test") for group in groups[split]])


def data_flag_name(dest: str, data_args_path: Optional[str] = None,
                   per_split_data_args_path: Optional[str] = None) -> str:
    """The flag that gave the words of ``dest`` (``data_path``, ``train_data_path``, ...): the
    flag itself, or the file flag it was read from (``--data-args-path FILE``,
    ``--per-split-data-args-path FILE``, given as ``data_args_path`` /
    ``per_split_data_args_path``; megatron/config/data_flags.py)."""
    flag = "--" + dest.replace("_", "-")
    if dest == "data_path" and data_args_path:
        return f"--data-args-path {data_args_path}"
    if dest != "data_path" and per_split_data_args_path:
        return f"--per-split-data-args-path {per_split_data_args_path} ({dest.split('_')[0]})"
    return flag


def check_split_has_documents(data_path: List[str], split: str) -> None:
    """Raise a ConfigError naming ``--split`` and the prefix when a split with a non-zero share
    selects no document of a ``--data-path`` prefix (megatron-core, which rounds each split's
    document range as here, would loop forever sizing that empty split)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    bounds = convert_split_vector_to_split_matrix(parse_and_normalize_split(split))
    prefixes, _ = get_blend_from_list(data_path)
    for prefix in prefixes:
        with open(prefix + ".idx", "rb") as f:  # header checked by check_prefixes_exist
            f.seek(18)
            n = int.from_bytes(f.read(8), "little")  # sequences: what megatron-core splits
        for name, bound in zip(("train", "valid", "test"), bounds, strict=True):
            if bound is not None and int(round(bound[1] * n)) <= int(round(bound[0] * n)):
                raise ConfigError(
                    f"--split {split}: the {name} split ({bound[0]:g} to {bound[1]:g} of the "
                    f"documents) selects none of the {n} documents of --data-path prefix "
                    f"{prefix!r}; give more documents or a larger {name} share (or share 0)")


def _eval_groups(valid, test) -> List[EvalGroup]:
    return ([EvalGroup(name, ds, "valid") for name, ds in valid]
            + [EvalGroup(name, ds, "test") for name, ds in test])


def gpt_mix_sources(config: DataConfig, kind: str, gpt_config, pack: Optional[IndexPack] = None):
    """How GPT training datasets are built for the data ledger (megatron/data/mix_resume.py):
    their constituents from the ``.idx`` files, and each one's samples from a one-epoch
    megatron-core ``GPTDataset`` reshuffled per epoch (or its best-fit bins, ``--pack-documents``),
    with a phase's seed (after a change of the sequence length, its samples since then:
    megatron/data/length_change.py). ``at_length`` gives the same sources at another
    ``seq_length`` (a phase of the run before such a change), sharing ``pack``."""
    def resolve(blend):
        return resolve_constituents(blend, gpt_config.sequence_length,
                                    gpt_config.add_extra_token_to_sequence, packing_of(gpt_config))

    pack = pack if pack is not None else IndexPack()

    def make_source(constituent, num_samples, seed, prior=(), replay_of=()):
        config_ = gpt_config if seed == gpt_config.random_seed else replace(gpt_config,
                                                                            random_seed=seed)
        return gpt_epoch_source(constituent, num_samples, config_, "train", pack, prior,
                                replay_of)

    def at_length(seq_length: int):
        return gpt_mix_sources(config, kind, replace(gpt_config, sequence_length=int(seq_length)),
                               pack)

    return MixSources(kind, resolve, make_source, config.data_cache_path, config.data_index_order,
                      pack, int(gpt_config.sequence_length), at_length)


def training_mix(config: DataConfig, sources, blend, resume=None,
                 eval_groups: Sequence[EvalGroup] = ()):
    """The run's :class:`~megatron.data.mix_resume.TrainMix` for the training ``blend``: from
    sample 0, or continuing the checkpoint of ``resume`` (``--override-data-mix`` takes an
    edited mix); ``eval_groups`` get their counters (a group new at a resume starts at its first
    window). Notes (the edit's table, groups added or removed) go to the rank-0 log."""
    schedule = batch_schedule(config.batch)
    mix = continue_training_mix(sources, blend, train_valid_test_num_samples(config)[0], schedule,
                                config.seed, resume)
    record = resume.record if resume is not None else None
    counters, notes = eval_group_counters(record, [(g.split, g.name) for g in eval_groups],
                                          resume.iteration if resume is not None else 0,
                                          config.eval_interval)
    for group, counter in zip(eval_groups, counters, strict=True):
        group.first_evaluation = counter.first_evaluation
    mix.eval_groups = counters
    for note in mix.notes + notes:
        print_rank_0(note)
    return mix


def training_data(config: DataConfig, mix, blend, eval_groups, train=None) -> TrainData:
    """The TrainData of a training mix: its dataset (``train``: it wrapped), names, ledger and
    each dataset's loss weight (``loss_weight`` entries of ``blend`` or
    ``--dataset-loss-weights``, megatron/data/loss_weights.py)."""
    weights = dataset_loss_weights(mix.dataset.constituents, blend,
                                   parse_dataset_loss_weights(config.dataset_loss_weights))
    if weights is not None:
        print_rank_0("loss weights: " + ", ".join(f"{c.name} {w:g}" for c, w in
                                                    zip(mix.dataset.constituents, weights, strict=True)))
    return TrainData(train=mix.dataset if train is None else train, eval_groups=eval_groups,
                     dataset_names=list(mix.dataset.names), mix=mix, loss_weights=weights)


def _weighted_split_data(config: DataConfig, tokenizer, resume=None) -> TrainData:
    """``--{train,valid,test}-weighted-split-paths``: one training blend, one eval set per group."""
    groups = config.weighted_split_groups
    if len(groups["train"]) > 1:
        names = ", ".join(g.name for g in groups["train"])
        raise WeightedSplitError(f"--train-weighted-split-paths: give one training group (got "
                                 f"{len(groups['train'])}: {names}); put all its items in it")
    check_weighted_split_prefixes(groups)
    n_train, n_valid, n_test = train_valid_test_num_samples(config)
    gpt_config = gpt_dataset_config(config, tokenizer)
    schedule = batch_schedule(config.batch)
    built = {split: build_weighted_split_datasets(groups[split], n, gpt_config, schedule, split,
                                                  config.data_cache_path, config.data_index_order)
             for split, n in (("valid", n_valid), ("test", n_test)) if groups[split] and n > 0}
    eval_groups = _eval_groups(built.get("valid", []), built.get("test", []))
    if not groups["train"] or n_train <= 0:
        return TrainData(train=None, eval_groups=eval_groups)
    blend = groups["train"][0].to_split_blend("--train-weighted-split-paths")
    mix = training_mix(config, gpt_mix_sources(config, "weighted_split", gpt_config), blend,
                       resume, eval_groups)
    return training_data(config, mix, blend, eval_groups)


def _blend_config_data(config: DataConfig, tokenizer, resume=None) -> TrainData:
    """``--data-blend-config``: a curriculum training set and the file's named eval groups."""
    gpt_config = gpt_dataset_config(config, tokenizer)
    _, valid, test = build_blend_config_datasets(
        replace(config.data_blend, train=None), train_valid_test_num_samples(config), gpt_config,
        batch_schedule(config.batch), config.data_cache_path, order=config.data_index_order)
    eval_groups = _eval_groups(valid, test)
    if config.data_blend.train is None or train_valid_test_num_samples(config)[0] <= 0:
        return TrainData(train=None, eval_groups=eval_groups)
    mix = training_mix(config, gpt_mix_sources(config, "blend_config", gpt_config),
                       config.data_blend.train, resume, eval_groups)
    _print_epochs(mix.dataset)
    return training_data(config, mix, config.data_blend.train, eval_groups)


EPOCHS_LISTED = 20  # a start-up line lists every dataset's epochs up to this many datasets


def epochs_text(epochs: Dict[str, float]) -> str:
    """``name epochs, ...`` of every dataset, or for more than :data:`EPOCHS_LISTED` the ten drawn
    most (in epochs) and how many more, and how many of those are not drawn at all: a blend of
    thousands keeps a one-line summary."""
    if len(epochs) <= EPOCHS_LISTED:
        return ", ".join(f"{name} {e:.2f}" for name, e in epochs.items())
    top = sorted(epochs.items(), key=lambda item: -item[1])[:10]
    idle = sum(1 for e in epochs.values() if e == 0)
    return (", ".join(f"{name} {e:.2f}" for name, e in top)
            + f", ... and {len(epochs) - 10} more ({idle} not drawn)")


def _print_epochs(train) -> None:
    epochs = epochs_text(train.epochs)
    part = (f"samples {train.begin} to {len(train) - 1} of {len(train)} (continuing the data "
            "ledger)" if train.begin else f"{len(train)} training samples")
    print_rank_0(f"curriculum: {part} from {len(train.names)} datasets; epochs drawn by the end: "
                 f"{epochs}")


def data_path_blends(config: DataConfig) -> Dict[str, Optional[SplitBlend]]:
    """``{"train"|"valid"|"test": SplitBlend or None}`` of ``--data-path``/``--split`` (each
    split's document range of every prefix, as megatron-core's builder cuts it) or of
    ``--{train,valid,test}-data-path`` (whole files). Without weights a blend of several prefixes
    weighs each by its samples per epoch (megatron-core: "weights inferred from the lengths"; its
    best-fit bins under ``--pack-documents best-fit``)."""
    from megatron.core.datasets.blended_megatron_dataset_config import (
        convert_split_vector_to_split_matrix,
        parse_and_normalize_split,
    )

    if config.data_path:
        bounds = convert_split_vector_to_split_matrix(parse_and_normalize_split(config.split))
        sources = {split: (config.data_path, bound)
                   for split, bound in zip(("train", "valid", "test"), bounds, strict=True)}
        flag = "--data-path"
    else:
        sources = {split: (getattr(config, f"{split}_data_path"), (0.0, 1.0))
                   for split in ("train", "valid", "test")}
        flag = None
    out: Dict[str, Optional[SplitBlend]] = {}
    for split, (paths, bound) in sources.items():
        if not paths or bound is None or not bound[1] > bound[0]:
            out[split] = None
            continue
        where = flag or f"--{split}-data-path"
        prefixes, weights = get_blend_from_list(paths)

        # blend_of is called in this iteration only: its loop variables are this split's (B023)
        def blend_of(ws):
            entries = tuple(BlendEntry(path=p, weight=float(w), split=(float(bound[0]), float(bound[1])),  # noqa: B023
                                       where=f"{where} {p}") for p, w in zip(prefixes, ws, strict=True))  # noqa: B023
            return SplitBlend(stages=(BlendStage("blend", entries, None, where),), name=split,  # noqa: B023
                              where=where)  # noqa: B023

        if weights is None:
            weights = [1.0] * len(prefixes)
            if len(prefixes) > 1:
                weights = [c.samples_per_epoch for c in
                           resolve_constituents(blend_of(weights), config.seq_length,
                                                packing=config.pack_documents)]
        out[split] = blend_of(weights)
    return out


def _static_blend_data(config: DataConfig, tokenizer, resume=None) -> TrainData:
    """``--data-path``/``--split`` or ``--{train,valid,test}-data-path``: Megatron-LM's static
    blends (each split's documents, megatron-core's blending rule and one-epoch GPTDatasets; see
    :func:`data_path_blends`), the training blend with the data ledger."""
    check_data_path_prefixes(config)
    if config.data_path:
        check_split_has_documents(config.data_path, config.split)
    blends = data_path_blends(config)
    gpt_config = gpt_dataset_config(config, tokenizer)
    schedule = batch_schedule(config.batch)
    n_train, n_valid, n_test = train_valid_test_num_samples(config)
    eval_groups = [EvalGroup(split, build_curriculum_dataset(blends[split], n, gpt_config, schedule,
                                                             split, config.data_cache_path,
                                                             order=config.data_index_order), split)
                   for split, n in (("valid", n_valid), ("test", n_test))
                   if blends[split] is not None and n > 0]
    if blends["train"] is None or n_train <= 0:
        return TrainData(train=None, eval_groups=eval_groups)
    mix = training_mix(config, gpt_mix_sources(config, "data_path", gpt_config),
                       blends["train"], resume, eval_groups)
    return training_data(config, mix, blends["train"], eval_groups)


def build_pretraining_data(config: DataConfig, tokenizer, resume=None) -> TrainData:
    """Training set and evaluation groups for ``pretrain_gpt.py`` from whichever data flags are
    given (validated to be exactly one kind by ``megatron.config.data_flags``). ``resume``
    (megatron/data/mix_resume.py ``DataResume``): the checkpoint a resumed run continues, whose
    data ledger the training mix continues. The indices are built once per cache directory: by
    rank 0 on a directory every node shares, by each node's first rank on a node-local one
    (megatron/data/rank0_first.py)."""
    if config.data_blend is not None:
        return _blend_config_data(config, tokenizer, resume)
    if any(config.weighted_split_groups.values()):
        return _weighted_split_data(config, tokenizer, resume)
    return _static_blend_data(config, tokenizer, resume)
