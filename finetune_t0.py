"""Multitask prompted finetuning (T0 / BigScience MTF) of a GPT model on packed (input, target) pairs.

Launch: ``deepspeed --num_gpus N finetune_t0.py [Megatron flags] --train-weighted-split-paths
"TRAIN: 1 0:1 data/p3_train" --valid-weighted-split-paths "VALID_A: 1 0:1 data/task_a" ...``
(see examples/finetune_t0/). Data comes from ``tools/preprocess_data.py --json-keys inputs targets``.

Extra flags: ``--prefix-lm`` (non-causal decoder: bidirectional attention over each input),
``--loss-on-targets-only`` / ``--no-loss-on-targets-only`` (default: targets only, as T0),
``--norm-target-loss`` (every target counts equally). ``--finetune --load DIR`` starts from a
pretrained checkpoint's weights only.
"""
import os
from typing import List, Sequence, Tuple

from megatron.known_warnings import quiet_known_warnings

quiet_known_warnings()

from megatron.arguments import ArgumentError, parse_args
from megatron.errors import run_entry_point
from megatron.data.blend_config import short_dataset_name
from megatron.data.builder import train_valid_test_num_samples
from megatron.data.mtf_dataset import MTFBlendedDataset, MTFDataset
from megatron.model.gpt_model_pipe import gpt_model_for_layout
from megatron.tokenizer import build_tokenizer
from megatron.training import EvalGroup, TrainData, gpt_forward_step, pretrain

# (weight, start, end, prefix)
SplitItem = Tuple[float, float, float, str]


def extra_args_provider(parser):
    """The T0 flags; the weighted-split flags come from megatron/arguments.py."""
    g = parser.add_argument_group("T0 multitask finetuning")
    g.add_argument("--prefix-lm", action="store_true",
              help="Non-causal decoder: each segment's input tokens attend to each other "
                   "bidirectionally; target tokens attend causally.")
    g.add_argument("--loss-on-targets-only", dest="loss_on_targets_only",
              action="store_true", default=True,
              help="Loss on target tokens only (the T0 default).")
    g.add_argument("--no-loss-on-targets-only", dest="loss_on_targets_only",
              action="store_false", help="Loss on input and target tokens (causal decoder only).")
    g.add_argument("--norm-target-loss", action="store_true",
              help="Weight each target's tokens by 1/len(target) so every target counts equally.")
    # Not a flag: T0 batches are packed (segment_ids), which --attention-backend auto considers.
    parser.set_defaults(packed_samples=True)
    return parser


# ------------------------------------------------------------------ weighted split groups
def weighted_split_groups(args, split: str) -> List[Tuple[str, List[SplitItem]]]:
    """The named groups of ``--{split}-weighted-split-paths`` (or ``...-path FILE``), parsed by
    ``megatron.arguments`` (megatron/data/weighted_splits.py), as (name, [(weight, start, end,
    prefix)]). Files are checked per inputs/targets pair by MTFDocumentPair."""
    return [(g.name, [(it.weight, it.start, it.end, it.prefix) for it in g.items])
            for g in args.weighted_split_groups[split]]


# ------------------------------------------------------------------ datasets
def build_group_dataset(args, name: str, items: Sequence[SplitItem], num_samples: int,
                        with_dataset_id: bool = False) -> MTFBlendedDataset:
    """A weighted blend of packed MTF datasets, one per group item, ``num_samples`` long."""
    pad_id = args.tokenizer.pad if hasattr(args.tokenizer, "pad") else args.tokenizer.eod

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


def datasets_provider(args) -> TrainData:
    """Train: the blend of all ``--train-weighted-split-paths`` items (by weight); one named
    EvalGroup per ``--valid-weighted-split-paths`` (and ``--test-...``) group."""
    train_samples, valid_samples, test_samples = train_valid_test_num_samples(args)
    train_groups = weighted_split_groups(args, "train")
    train_items = [item for _, items in train_groups for item in items]
    train = build_group_dataset(args, "train", train_items, train_samples, with_dataset_id=True)
    eval_groups = []
    for split, count in (("valid", valid_samples), ("test", test_samples)):
        for name, items in weighted_split_groups(args, split):
            eval_groups.append(EvalGroup(name, build_group_dataset(args, name, items, count), split))
    return TrainData(train=train, eval_groups=eval_groups, dataset_names=dataset_names(train_groups))


def model_provider(args):
    """The GPT model (vocab padded for the tokenizer; ``GPTModelPipe`` with
    --pipeline-model-parallel-size > 1); masks come with each batch."""
    return gpt_model_for_layout(args)


def forward_step(engine, batch):
    """``gpt_forward_step`` with the packed batch: its ``segment_ids`` keep segments apart (and
    ``is_prefix`` makes inputs bidirectional with --prefix-lm; the model builds the mask), and the
    loss is ``sum(token_loss * loss_mask) / sum(loss_mask)``; with --norm-target-loss the weights of
    each target sum to 1, so that is the mean over targets of each target's mean token loss."""
    if batch.get("segment_ids") is None:
        raise ValueError("T0 batches must carry segment_ids")
    return gpt_forward_step(engine, batch)


def parse_t0_args(argv=None):
    """Parse flags with the T0 extras and check the T0-specific combinations."""
    args = parse_args(argv, extra_args_provider=extra_args_provider)
    if args.prefix_lm and not args.loss_on_targets_only:
        raise ArgumentError("--prefix-lm needs --loss-on-targets-only (inputs attend "
                            "bidirectionally, so a loss on them would see the answer)")
    if not args.weighted_split_groups["train"]:
        raise ArgumentError("finetune_t0.py needs --train-weighted-split-paths (or "
                            "--train-weighted-split-paths-path)")
    return args


def main(argv=None):
    """Parse flags, build the tokenizer, finetune."""
    args = parse_t0_args(argv)
    args.tokenizer = build_tokenizer(args)  # also sets args.padded_vocab_size
    return pretrain(args, datasets_provider, model_provider, forward_step)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_entry_point(main)
