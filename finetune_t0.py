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

from megatron.runtime.known_warnings import quiet_known_warnings

quiet_known_warnings()

from megatron.config.parser import parse_args
from megatron.config.tokenizer_flags import apply_tokenizer_setup
from megatron.data.document_packing import CONCAT
from megatron.data.mtf_builder import build_mtf_data
from megatron.data.train_data import TrainData
from megatron.errors import ArgumentError
from megatron.model.gpt_model_pipe import gpt_model_for_layout
from megatron.runtime.process_exit import run_entry_point
from megatron.train.loop import pretrain


def extra_args_provider(parser):
    """The T0 flags; the weighted-split flags come from megatron/config/data_flags.py."""
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


def datasets_provider(args, resume=None) -> TrainData:
    """Train: the blend of all ``--train-weighted-split-paths`` items (by weight); one named
    EvalGroup per ``--valid-weighted-split-paths`` (and ``--test-...``) group
    (megatron/data/mtf_builder.py). Every sample carries ``segment_ids`` (checked by the blend,
    megatron/data/mtf_dataset.py, under every layout)."""
    return build_mtf_data(args.run_config.data, args.tokenizer, resume)


def model_provider(args):
    """The GPT model (vocab padded for the tokenizer; ``GPTModelPipe`` with
    --pipeline-model-parallel-size > 1); the packed batch's ``segment_ids`` keep segments apart
    (and ``is_prefix`` makes inputs bidirectional with --prefix-lm), the model builds the mask.
    The loss is ``sum(token_loss * loss_mask) / sum(loss_mask)``; with --norm-target-loss the
    weights of each target sum to 1, so that is the mean over targets of each target's mean token
    loss."""
    run = args.run_config
    return gpt_model_for_layout(run.transformer, run.model, args.padded_vocab_size, args.vocab_size)


def parse_t0_args(argv=None):
    """Parse flags with the T0 extras and check the T0-specific combinations."""
    args = parse_args(argv, extra_args_provider=extra_args_provider)
    if args.prefix_lm and not args.loss_on_targets_only:
        raise ArgumentError("--prefix-lm needs --loss-on-targets-only (inputs attend "
                            "bidirectionally, so a loss on them would see the answer)")
    if args.pack_documents != CONCAT:
        raise ArgumentError(f"--pack-documents {args.pack_documents}: finetune_t0.py packs its "
                            "(input, target) pairs itself (best-fit decreasing, "
                            "megatron/data/mtf_dataset.py); the flag is pretrain_gpt.py's")
    if not args.weighted_split_groups["train"]:
        raise ArgumentError("finetune_t0.py needs --train-weighted-split-paths (or "
                            "--train-weighted-split-paths-path)")
    return args


def main(argv=None):
    """Parse flags, build the tokenizer, finetune."""
    args = parse_t0_args(argv)
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    return pretrain(args, datasets_provider, model_provider, notes=setup.notes)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    run_entry_point(main)
