"""The model an evaluation task scores: built from the model flags, weights from a checkpoint.

``build_model(args)`` (used by ``zero_shot_rank_classification.py`` and ``eval_harness``) starts a
one-process group when none exists (megatron-core layers need the model-parallel state), builds
the tokenizer and a tensor- and pipeline-parallel size 1 ``GPTModel`` and fills it from ``--load``:

- a ``--save`` directory: ``DIR/latest_checkpointed_iteration.txt``'s iteration, or
  ``--load-iteration N``. Checkpoints of any tensor/pipeline/data-parallel layout (ZeRO 0-2) are
  read as full TP=1/PP=1 weights, one tensor at a time, by the one checkpoint reader
  (``megatron/checkpoint/reader.py``, ``CheckpointWeights``);
- a model-states file of a TP=1/PP=1 checkpoint (``.../mp_rank_00_model_states.pt``): its
  ``module`` weights.

The embedding keeps the checkpoint's padded vocabulary rows (a run with tensor-parallel size 2
pads to a multiple of 2 x ``--make-vocab-size-divisible-by``) and its padding rows take no
probability (the rows its ``model_args.json`` records as ``vocab_size`` do, else the tokenizer's;
a ``model_args.json`` written before padding was masked softmaxes over every row, as it was
trained), so log-probabilities are the softmax the training loss used. A weight that the model or the checkpoint lacks, or of another
shape, is a :class:`megatron.errors.CheckpointError` naming ``--load`` and the model flags
to check; with ``--use-checkpoint-args`` the flags come from the checkpoint itself.
"""
import os

import torch

from megatron.checkpoint.reader import CheckpointWeights
from megatron.errors import CheckpointError


def init_single_process() -> None:
    """A 1-process gloo group and megatron-core's model-parallel state (TP=1, PP=1), unless they
    exist."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)


def build_model(args) -> torch.nn.Module:
    """The GPT model of ``args`` in eval mode with the ``--load`` weights (random initial weights
    without ``--load``); sets ``args.tokenizer``, ``args.padded_vocab_size`` (the checkpoint's
    embedding rows) and ``args.vocab_size`` (the rows that take probability); the tokenizer's
    (``tokenizer_setup``) unless the caller set them already."""
    from megatron.model.gpt_model import build_gpt_model
    from megatron.tokenizer import tokenizer_setup
    from megatron.tokenizer.tokenizer import model_vocab_size

    init_single_process()
    if getattr(args, "tokenizer", None) is None:
        tokenizer_setup(args).apply(args)
    if not args.load:
        return build_gpt_model(args).eval()
    with CheckpointWeights(args.load, args.load_iteration) as weights:
        rows = weights.vocab_rows()
        if rows is not None and rows != args.padded_vocab_size:
            if rows < args.tokenizer.vocab_size:
                raise CheckpointError(
                    f"--load {args.load}: the checkpoint embeds {rows} tokens but the tokenizer "
                    f"(--tokenizer-type {args.tokenizer_type or args.tokenizer.name}) has "
                    f"{args.tokenizer.vocab_size}; give the tokenizer flags it was trained with")
            args.padded_vocab_size = rows
        # the rows the checkpoint's softmax covered (else the tokenizer's, from tokenizer_setup)
        real = weights.real_vocab_rows()
        if real:
            args.vocab_size = model_vocab_size(args.tokenizer.vocab_size, args.padded_vocab_size,
                                               real)
        model = build_gpt_model(args)
        weights.copy_into(model)
    return model.eval()
