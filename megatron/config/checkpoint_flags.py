"""The "checkpointing" flag group (``--save``, ``--load``, ``--finetune``, ``--no-load-*``,
``--universal-checkpoint``, ``--use-checkpoint-args``, ``--extend-context``). ``--use-checkpoint-args``
is applied by megatron/config/checkpoint_args.py, ``--extend-context`` checked by
megatron/config/context_extension.py; ``--save-interval`` is checked with the training flags
(megatron/config/train_flags.py)."""
import argparse


def add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    """The "checkpointing" flag group."""
    g = parser.add_argument_group("checkpointing")
    g.add_argument("--save", default=None, help="Directory to save checkpoints to.")
    g.add_argument("--save-interval", type=int, default=None, help="Iterations between saves.")
    g.add_argument("--load", default=None, help="Directory to resume from.")
    g.add_argument("--finetune", action="store_true",
                   help="Load model weights only; reset iteration, optimizer and scheduler.")
    g.add_argument("--no-load-optim", action="store_true")
    g.add_argument("--no-load-rng", action="store_true")
    g.add_argument("--universal-checkpoint", action="store_true",
                   help="BigScience's flag: load --load through the layout-independent path "
                        "(megatron/checkpoint/reshard.py) even on the layout it was saved with. "
                        "A checkpoint of another TP/PP/DP size or ZeRO stage takes that path "
                        "without the flag.")
    g.add_argument("--use-checkpoint-args", action="store_true",
                   help="Take the model and tokenizer flags from the model_args.json of the "
                        "checkpoint in --load; flags given that disagree with it are an error, "
                        "except the length and position-encoding flags, which are kept and need "
                        "--extend-context at a resume (megatron/checkpoint/model_args.py).")
    g.add_argument("--extend-context", nargs="?", const="keep-tokens", default=None,
                   choices=["keep-tokens", "free-batch"],
                   help="This resume is a context-extension stage (docs/context_extension.md): "
                        "it may change --seq-length, the position encoding (rope/yarn flags), "
                        "the LR schedule's run shape and the global batch, by the factor that "
                        "keeps tokens per step (keep-tokens, the default) or freely "
                        "(free-batch). Without it such changes at a resume are refused.")
    # what --use-checkpoint-args sets (megatron/config/checkpoint_args.py apply_checkpoint_args):
    # the checkpoint's model_args.json record and the note when the command line's tokenizer wins
    parser.set_defaults(checkpoint_model_args=None, checkpoint_tokenizer_note=None)
