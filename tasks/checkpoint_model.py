"""The model an evaluation task scores: built from the model flags, weights from a checkpoint.

``build_model(args)`` (used by ``zero_shot_rank_classification.py`` and ``eval_harness``) starts a
one-process group when none exists (megatron-core layers need the model-parallel state), builds
the tokenizer and a tensor- and pipeline-parallel size 1 ``GPTModel`` and fills it from ``--load``:

- a ``--save`` directory: ``DIR/latest_checkpointed_iteration.txt``'s iteration, or
  ``--load-iteration N``. Checkpoints of any tensor/pipeline/data-parallel layout (ZeRO 0-2) are
  read as full TP=1/PP=1 weights, one tensor at a time, by
  ``megatron/checkpoint_interop/full_state.py``;
- a model-states file of a TP=1/PP=1 checkpoint (``.../mp_rank_00_model_states.pt``): its
  ``module`` weights.

The embedding keeps the checkpoint's padded vocabulary rows (a run with tensor-parallel size 2
pads to a multiple of 2 x ``--make-vocab-size-divisible-by``) and its padding rows take no
probability (the rows its ``model_args.json`` records as ``vocab_size`` do, else the tokenizer's;
a ``model_args.json`` written before padding was masked softmaxes over every row, as it was
trained), so log-probabilities are the softmax the training loss used. A weight that the model or the checkpoint lacks, or of another
shape, is a :class:`megatron.checkpointing.CheckpointError` naming ``--load`` and the model flags
to check; with ``--use-checkpoint-args`` the flags come from the checkpoint itself.
"""
import os
from typing import Iterator, Optional, Tuple

import torch

MODEL_STATES = "mp_rank_00_model_states.pt"
EMBEDDING = "embedding.word_embeddings.weight"


def checkpoint_iteration_dir(load: str, iteration: Optional[int] = None) -> str:
    """``DIR/iter_NNNNNNN`` of ``--load DIR`` (the tracker's iteration unless ``iteration``), or
    ``load`` itself when it is a file. A missing directory, tracker or iteration is a
    ``CheckpointError`` naming ``--load``, ``--load-iteration`` and the path."""
    from megatron.checkpoint_interop.full_state import resolve_checkpoint
    from megatron.checkpointing import CheckpointError

    if os.path.isfile(load):
        return load
    if not os.path.isdir(load):
        raise CheckpointError(f"--load {load}: no such checkpoint directory or file")
    return resolve_checkpoint(load, iteration, iteration_flag="--load-iteration")[0]


class CheckpointWeights:
    """The full (TP=1, PP=1) weights of ``--load`` (see the module docstring); a context manager.
    ``source`` names what is read (the ``iter_*`` directory or the file)."""

    def __init__(self, load: str, iteration: Optional[int] = None):
        from megatron.checkpointing import CheckpointError

        self.load = load
        self.source = checkpoint_iteration_dir(load, iteration)
        self._reader = None
        self._module = None
        if os.path.isfile(self.source):
            try:
                state = torch.load(self.source, map_location="cpu", mmap=True, weights_only=False)
            except Exception as e:
                raise CheckpointError(f"--load {load}: {self.source} is not a torch checkpoint "
                                      f"({type(e).__name__})") from None
            module = state.get("module", state) if isinstance(state, dict) else None
            if not isinstance(module, dict):
                raise CheckpointError(f"--load {load}: {self.source} holds no module weights")
            self._module = {k: v for k, v in module.items() if torch.is_tensor(v)}
        else:
            from megatron.checkpoint_interop.full_state import FullStateReader

            self._reader = FullStateReader(os.path.dirname(self.source),
                                           int(self.source.rsplit("_", 1)[1]))

    def items(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """``(GPTModel parameter name, full tensor)`` pairs, one tensor built at a time."""
        return self._reader.items() if self._reader is not None else iter(self._module.items())

    def vocab_rows(self) -> Optional[int]:
        """Embedding rows (the padded vocabulary size) of the checkpoint, or None if unknown."""
        if self._reader is not None:
            recorded = (self._reader.model_args or {}).get("padded_vocab_size")
            if recorded:
                return int(recorded)
            return int(self._reader.tensor(EMBEDDING).shape[0]) if EMBEDDING in \
                self._reader.names else None
        weight = self._module.get(EMBEDDING)
        return None if weight is None else int(weight.shape[0])

    def real_vocab_rows(self) -> Optional[int]:
        """Vocabulary rows that take probability: the ``vocab_size`` the checkpoint's
        ``model_args.json`` records; every row for a ``model_args.json`` written before the
        padding rows were masked (its training softmax covered them); None (the tokenizer's
        vocabulary, as training here does) when nothing is recorded (a model-states file)."""
        if self._reader is None or self._reader.model_args is None:
            return None
        recorded = self._reader.model_args.get("vocab_size")
        return int(recorded) if recorded else self.vocab_rows()

    @torch.no_grad()
    def copy_into(self, model: torch.nn.Module) -> None:
        """Copy every weight into ``model`` (cast to its dtype); a CheckpointError when a weight
        is missing on either side or has another shape (the model flags differ)."""
        from megatron.checkpointing import CheckpointError

        own = {k: v for k, v in model.state_dict().items() if torch.is_tensor(v)}
        seen, shapes, unexpected = set(), [], []
        for name, tensor in self.items():
            target = own.get(name)
            if target is None:
                unexpected.append(name)
            elif tensor.shape != target.shape:
                shapes.append(f"{name}: checkpoint {list(tensor.shape)}, model "
                              f"{list(target.shape)}")
            else:
                target.copy_(tensor)
                seen.add(name)
        if shapes:
            raise CheckpointError(
                f"--load {self.load}: {self.source} does not fit the model flags (--hidden-size, "
                f"--num-attention-heads, --ffn-hidden-size, ...): {len(shapes)} weights differ in "
                f"shape, e.g. {'; '.join(shapes[:3])}")
        missing = [k for k in own if k not in seen and not k.endswith("_extra_state")]
        if missing or unexpected:
            raise CheckpointError(
                f"--load {self.load}: {self.source} does not fit the model flags (--num-layers, "
                f"--untie-embeddings-and-output-weights, ...): the checkpoint lacks {missing[:5]} "
                f"and has no place in the model for {unexpected[:5]}")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._module = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_model_weights(model: torch.nn.Module, load: str, iteration: Optional[int] = None) -> str:
    """Fill ``model`` with the weights of ``--load`` (see the module docstring); returns what was
    read (the ``iter_*`` directory or the file)."""
    with CheckpointWeights(load, iteration) as weights:
        weights.copy_into(model)
        return weights.source


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
    embedding rows) and ``args.vocab_size`` (the rows that take probability)."""
    from megatron.checkpointing import CheckpointError
    from megatron.model.gpt_model import build_gpt_model
    from megatron.tokenizer import build_tokenizer
    from megatron.tokenizer.tokenizer import model_vocab_size

    init_single_process()
    args.tokenizer = build_tokenizer(args)
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
        # the rows the checkpoint's softmax covered (else the tokenizer's, set by build_tokenizer)
        real = weights.real_vocab_rows()
        if real:
            args.vocab_size = model_vocab_size(args.tokenizer.vocab_size, args.padded_vocab_size,
                                               real)
        model = build_gpt_model(args)
        weights.copy_into(model)
    return model.eval()
