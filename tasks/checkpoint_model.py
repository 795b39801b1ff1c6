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

Mixture-of-experts checkpoints (``--num-experts``) of any expert/tensor/pipeline-parallel layout
are read with every expert (those of expert-parallel ranks >= 1 from their
``expert_states_ep_*`` files, by global expert id) into one expert-parallel size 1 model:
:func:`one_process_argv` makes a training command line's ``--expert-model-parallel-size N`` 1. In
eval mode the router is deterministic (no ``--moe-input-jitter-eps`` noise) and counts nothing
(no token counts, no load-balancing or z-loss: those are kept for training forwards with
gradients only). Token dropping (a capacity factor) is refused: which tokens an expert drops
depends on every token of the forward, so a request would have no score of its own.
"""
import os
import re
from typing import List, Sequence

import torch

from megatron.checkpoint.reader import CheckpointWeights
from megatron.errors import CheckpointError, ConfigError
from megatron.runtime.ports import launch_port

# The spellings of the expert-parallel size (Megatron-LM's, Microsoft Megatron-DeepSpeed's)
EXPERT_PARALLEL_FLAGS = ("--expert-model-parallel-size", "--moe-expert-parallel-size")


def one_process_argv(argv: Sequence[str]) -> List[str]:
    """``argv`` with every expert-parallel size (:data:`EXPERT_PARALLEL_FLAGS`, ``--flag N`` or
    ``--flag=N``) set to 1, a note printed for each: expert parallelism is a training layout, the
    one evaluation process holds every expert, whatever layout the checkpoint was saved at. The
    spelling is kept (Microsoft's spelling brings Microsoft's MoE defaults, part of the model the
    command line describes)."""
    out = list(argv)
    for i, token in enumerate(out):
        flag, eq, value = token.partition("=")
        if flag not in EXPERT_PARALLEL_FLAGS:
            continue
        if not eq:
            if i + 1 >= len(out) or not re.fullmatch(r"\d+", out[i + 1]):
                continue  # argparse names the missing or bad value
            value, out[i + 1] = out[i + 1], "1"
        else:
            out[i] = f"{flag}=1"
        if value != "1":
            print(f"{flag} {value}: evaluation runs one process holding every expert "
                  "(expert-parallel 1); the checkpoint's experts are read from every "
                  "expert-parallel rank's files")
    return out


def _capacity_factor_error(args) -> ConfigError:
    """The error for evaluating with a capacity factor: where the factor came from and how to
    route dropless instead."""
    factor = args.moe_expert_capacity_factor
    given = args.given_flags or {}
    spelling = given.get("moe_expert_capacity_factor")
    if spelling == "--moe-expert-capacity-factor" and not args.microsoft_moe_defaults:
        source, remedy = f"{spelling} {factor:g}", f"drop {spelling}"
    else:  # Microsoft's spellings and defaults, or the checkpoint's record: one flag routes dropless
        if spelling:
            source = f"{spelling} {factor:g}"
        elif "moe_token_dropping" in given:
            source = f"--moe-token-dropping (capacity factor {factor:g})"
        elif args.microsoft_moe_defaults:
            source = (f"token dropping at capacity factor {factor:g} (Microsoft "
                      "Megatron-DeepSpeed's default for its MoE spellings)")
        else:
            source = (f"--moe-expert-capacity-factor {factor:g} (the checkpoint's model_args.json, "
                      "--use-checkpoint-args)")
        remedy = "add --disable-moe-token-dropping"
    return ConfigError(
        f"{source}: token dropping cannot be evaluated: which tokens an expert drops depends on "
        "every token of the forward (the batch's other requests, their padding, the later tokens "
        f"of the same sequence), so a request has no score of its own; to score the checkpoint "
        f"dropless (every token reaches its top-{args.moe_router_topk} experts), {remedy}")


def check_moe_evaluable(args) -> None:
    """Refuse MoE flags whose forward gives a request no score of its own (a capacity factor),
    naming the flag and the dropless alternative; nothing for a dense or dropless model."""
    if args.num_experts is None:
        return
    if args.moe_expert_capacity_factor is not None:
        raise _capacity_factor_error(args)


def init_single_process() -> None:
    """A 1-process gloo group and megatron-core's model-parallel state (TP=1, PP=1), unless they
    exist."""
    from megatron.core import parallel_state

    if not torch.distributed.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:  # this process binds it at once: no retry needed
            os.environ["MASTER_PORT"] = str(launch_port())
        torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)


def _gpt_model(args) -> torch.nn.Module:
    """``build_gpt_model`` of the run's typed configs with the embedding rows of ``args``."""
    from megatron.model.gpt_model import build_gpt_model  # lazy: megatron-core + deepspeed (seconds)

    run = args.run_config
    return build_gpt_model(run.transformer, run.model, args.padded_vocab_size,
                           getattr(args, "vocab_size", None))


def build_model(args) -> torch.nn.Module:
    """The GPT model of ``args`` in eval mode with the ``--load`` weights (random initial weights
    without ``--load``); sets ``args.tokenizer``, ``args.padded_vocab_size`` (the checkpoint's
    embedding rows) and ``args.vocab_size`` (the rows that take probability); the tokenizer's
    (``apply_tokenizer_setup``) unless the caller set them already."""
    from megatron.config.tokenizer_flags import apply_tokenizer_setup  # lazy: megatron-core (seconds)
    from megatron.tokenizer.tokenizer import model_vocab_size  # lazy: megatron-core (seconds)

    init_single_process()
    check_moe_evaluable(args)
    if getattr(args, "tokenizer", None) is None:
        apply_tokenizer_setup(args)
    if not args.load:
        return _gpt_model(args).eval()
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
        model = _gpt_model(args)
        weights.copy_into(model)
    return model.eval()
