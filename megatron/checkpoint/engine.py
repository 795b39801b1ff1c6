"""Atomic checkpoint save and exact resume through DeepSpeed's engine.

Layout (megatron/checkpoint/format.py): ``DIR/iter_NNNNNNN/`` holds DeepSpeed's model/optimizer
files, the training state in the client state (iteration, consumed samples, scheduler), one
``rng_state_rank{R}.pt`` per rank and the JSON records. ``DIR/latest_checkpointed_iteration.txt``
is written last, atomically (temporary file + rename), after every rank has finished writing, so it
never points at an incomplete checkpoint: a run killed during a save resumes from the previous
complete checkpoint.

A checkpoint of another layout (or any, with ``--universal-checkpoint``) is resharded into this
run's engine from its ``param_index.json`` (megatron/checkpoint/reshard.py); otherwise DeepSpeed
loads its own files.

``save_checkpoint``'s ``after_files_written`` is called on every rank once that rank's files are
written, before the tracker update (tests/e2e/test_checkpoint_safety.py kills the run there).
"""
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional

import numpy as np
import torch

from megatron.checkpoint.engine_index import canonical_namer, write_param_index
from megatron.checkpoint.expert_weights import dense_checkpoint_layout, write_expert_weights
from megatron.checkpoint.format import (
    TRACKER_FILENAME,
    atomic_torch_save,
    checkpoint_tag,
    read_layout,
    read_param_index,
    read_tracker,
    write_data_mix,
    write_layout,
    write_model_args,
    write_tracker,
)
from megatron.checkpoint.multinode import require_same_iteration
from megatron.checkpoint.reader import CheckpointReader
from megatron.checkpoint.reshard import load_resharded
from megatron.errors import CheckpointError, ReshardError
from megatron.parallel.topology import ParallelLayout, current_layout
from megatron.utils.rank_utils import all_reduce_small, print_rank_0

CHECKPOINT_VERSION = 1
CLIENT_STATE_KEY = "megatron_training_state"  # our state inside DeepSpeed's client state


@dataclass
class TrainingState:
    """What the loop needs to continue exactly: iteration (optimizer steps done) and consumed
    training samples, plus any extra client state (scheduler, data-loader counters)."""

    iteration: int = 0
    consumed_samples: int = 0
    extra: Dict[str, Any] = field(default_factory=dict)


def rng_state() -> Dict[str, Any]:
    """The Python, NumPy and torch (CPU and CUDA) generator states of this process."""
    state = {"random": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["cuda_rng_tracker"] = _cuda_rng_tracker_states()
    else:  # the tracker's streams are CPU generator states there (megatron/parallel/cpu_rng.py)
        state["cpu_rng_tracker"] = _cuda_rng_tracker_states()
    return state


def _cuda_rng_tracker_states() -> Dict[str, Any]:
    """megatron-core's tensor-parallel CUDA RNG tracker streams (dropout inside model-parallel
    regions), which ``torch.cuda.get_rng_state`` does not cover; empty when there is none."""
    from megatron.core import tensor_parallel

    return dict(tensor_parallel.get_cuda_rng_tracker().get_states())


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore generator states saved by :func:`rng_state`."""
    random.setstate(state["random"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    if state.get("cuda_rng_tracker") and torch.cuda.is_available():
        from megatron.core import tensor_parallel

        tensor_parallel.get_cuda_rng_tracker().set_states(state["cuda_rng_tracker"])
    if state.get("cpu_rng_tracker") and not torch.cuda.is_available():
        from megatron.core import tensor_parallel

        tensor_parallel.get_cuda_rng_tracker().set_states(state["cpu_rng_tracker"])


def _rank() -> int:
    return torch.distributed.get_rank() if torch.distributed.is_initialized() else 0


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def save_checkpoint(engine, save_dir: str, state: TrainingState,
                    model_args: Optional[dict] = None,
                    after_files_written: Optional[Callable[[int], None]] = None,
                    data_mix: Optional[dict] = None) -> str:
    """Write the checkpoint of ``state.iteration`` under ``save_dir``; returns its directory.
    ``model_args`` (megatron/config/checkpoint_args.py ``model_args_from_args``) is
    written beside ``parallel_layout.json`` as ``model_args.json``, ``data_mix`` (the data
    ledger's record, megatron/data/mix_ledger.py) as ``data_mix.json``. ``after_files_written``
    (iteration) runs on each rank once its files are written, before the tracker update.

    All ranks must call this. The tracker file is updated only after every rank has written.
    """
    tag = checkpoint_tag(state.iteration)
    ours = {"checkpoint_version": CHECKPOINT_VERSION, "iteration": state.iteration,
            "consumed_samples": state.consumed_samples, "extra": dict(state.extra)}
    client_state = {CLIENT_STATE_KEY: ours}
    os.makedirs(save_dir, exist_ok=True)
    with dense_checkpoint_layout(engine):  # experts >= EP rank 1: write_expert_weights below
        engine.save_checkpoint(save_dir, tag=tag, client_state=client_state, save_latest=False)
    directory = os.path.join(save_dir, tag)
    if _rank() == 0:
        write_layout(directory, current_layout())
        if model_args is not None:
            write_model_args(directory, model_args)
        if data_mix is not None:
            write_data_mix(directory, data_mix)
    write_expert_weights(engine, directory, canonical_namer(engine.module))  # expert-parallel ranks >= 1 (DeepSpeed writes rank 0's)
    write_param_index(engine, directory)  # what a resume on another layout reads
    atomic_torch_save(rng_state(), os.path.join(directory, f"rng_state_rank{_rank()}.pt"))
    if after_files_written is not None:
        after_files_written(state.iteration)
    _barrier()
    if _rank() == 0:
        write_tracker(save_dir, state.iteration, fsync=True)
    _barrier()
    return directory


def load_checkpoint(engine, load_dir: str, finetune: bool = False, load_optimizer: bool = True,
                    load_rng: bool = True, universal: bool = False) -> Optional[TrainingState]:
    """Load the latest complete checkpoint of ``load_dir`` into ``engine``.

    A checkpoint written with another tensor-, pipeline-, sequence- or data-parallel size or ZeRO
    stage (or
    any checkpoint with ``universal``, ``--universal-checkpoint``) is resharded to this run's
    layout from its ``param_index.json`` (megatron/checkpoint/reshard.py); otherwise DeepSpeed
    loads its own files (and the per-rank RNG states are restored).
    Returns the saved :class:`TrainingState` (iteration 0 and no extra state with ``finetune``, which
    loads weights only), or None when ``load_dir`` holds no checkpoint yet.
    """
    iteration = read_tracker(load_dir)
    require_same_iteration(load_dir, iteration)  # never a silent fresh start on one node
    if iteration is None:
        return None
    tag = checkpoint_tag(iteration)
    directory = os.path.join(load_dir, tag)
    if not os.path.isdir(directory):
        raise CheckpointError(f"--load {load_dir}: {TRACKER_FILENAME} names iteration {iteration} "
                              f"but {directory} does not exist")
    if not any(name.endswith("model_states.pt") for name in os.listdir(directory)):
        raise CheckpointError(f"--load {load_dir}: checkpoint {directory} is incomplete (no "
                              "*model_states.pt file)")
    index = read_param_index(directory)
    if index is None and universal:
        raise CheckpointError(f"--universal-checkpoint: checkpoint {directory} has no "
                              "param_index.json (written before checkpoints carried one); load it "
                              "without --universal-checkpoint on the layout it was saved with")
    if index is not None and (universal or _layout_changed(index, engine)):
        state = _load_resharded(engine, load_dir, directory, index, finetune, load_optimizer)
        if load_rng and not finetune and not _layout_changed(index, engine):
            _load_rng(directory, load_dir)  # same ranks: their generator states still apply
        return state
    check_same_model_split(directory, load_dir, current_layout())
    error = None
    try:
        path, client_state = engine.load_checkpoint(
            load_dir, tag=tag, load_module_only=finetune,
            load_optimizer_states=load_optimizer and not finetune,
            load_lr_scheduler_states=False)
    except CheckpointError as e:
        error = e
    except Exception as e:  # torch/pickle/zip errors from deep inside: name the checkpoint instead
        error = CheckpointError(f"--load {load_dir}: checkpoint {directory} is corrupt or "
                                f"incompatible ({_brief(e)})")
    _raise_on_any_rank(error, load_dir)
    if path is None:
        raise CheckpointError(f"--load {load_dir}: checkpoint {directory} is incomplete "
                              "(DeepSpeed found no model states)")
    if finetune:
        return TrainingState()
    ours = (client_state or {}).get(CLIENT_STATE_KEY)
    if ours is None:
        raise CheckpointError(f"--load {load_dir}: {directory} has no training state (not written by "
                              "this project); use --finetune to load its weights only")
    state = TrainingState(iteration=int(ours["iteration"]),
                          consumed_samples=int(ours["consumed_samples"]),
                          extra=dict(ours.get("extra", {})))
    if load_rng:
        _load_rng(directory, load_dir)
    return state


def _load_rng(directory: str, load_dir: str) -> None:
    """Restore this rank's generator states from ``directory`` (when the file is there)."""
    rng_path = os.path.join(directory, f"rng_state_rank{_rank()}.pt")
    error = None
    if os.path.isfile(rng_path):
        try:
            set_rng_state(torch.load(rng_path, weights_only=False))
        except Exception as e:
            error = CheckpointError(f"--load {load_dir}: {rng_path} is corrupt ({_brief(e)}); "
                                    "use --no-load-rng to skip it")
    _raise_on_any_rank(error, load_dir)


def check_same_model_split(directory: str, load_dir: str, layout: ParallelLayout) -> None:
    """Raise :class:`CheckpointError` naming both layouts when the checkpoint in ``directory``
    (one without ``param_index.json``) was written with another tensor or pipeline-parallel
    size."""
    saved = read_layout(directory)
    if saved is None:
        saved_tp, saved_pp = 1, 1
        described = "tensor-parallel 1, pipeline-parallel 1 (it has no parallel_layout.json)"
    else:
        saved_tp, saved_pp, described = saved.tp, saved.pp, saved.describe()
    if (saved_tp, saved_pp) != (layout.tp, layout.pp):
        raise CheckpointError(
            f"--load {load_dir}: checkpoint {directory} was saved with {described} and this "
            f"run has {layout.describe()}; it has no param_index.json (written before checkpoints "
            f"carried one), so it resumes only on its own split (use --tensor-model-parallel-size "
            f"{saved_tp} --pipeline-model-parallel-size {saved_pp})")


def _layout_changed(index: Dict[str, Any], engine) -> bool:
    """True when the checkpoint described by ``index`` was written with another tensor-, pipeline-,
    Ulysses sequence- or data-parallel size or ZeRO stage than ``engine``'s (DeepSpeed's loader
    needs the same)."""
    layout = current_layout()
    if index.get("expert_model_parallel_size", 1) > 1 or layout.ep > 1:
        # DeepSpeed's loader finds only expert-parallel rank 0's experts in its files; the
        # expert files of the other ranks are read through the index
        # (megatron/checkpoint/expert_weights.py)
        return True
    saved = (index["tensor_model_parallel_size"], index["pipeline_model_parallel_size"],
             index.get("sequence_parallel_size", 1), index["data_parallel_size"],
             index["zero_stage"])
    return saved != (layout.tp, layout.pp, layout.sp, layout.dp, engine.zero_optimization_stage())


def _load_resharded(engine, load_dir: str, directory: str, index: Dict[str, Any], finetune: bool,
                    load_optimizer: bool) -> TrainingState:
    """:func:`load_checkpoint` through megatron/checkpoint/reshard.py: weights, optimizer state
    and training state. On another layout the RNG states (per rank of the old layout) are not
    restored: the generators keep this run's --seed streams."""
    saved = CheckpointReader(load_dir, directory=directory, weights=False, index=index)
    error, ours = None, None
    try:
        load_resharded(engine, saved, load_dir, load_optimizer and not finetune, log=print_rank_0)
        ours = saved.client_state(CLIENT_STATE_KEY)
    except ReshardError as e:
        error = CheckpointError(str(e))
    except Exception as e:  # unreadable files: name the checkpoint
        error = CheckpointError(f"--load {load_dir}: checkpoint {directory} is corrupt or "
                                f"incompatible ({_brief(e)})")
    finally:
        saved.close()
    _raise_on_any_rank(error, load_dir)
    if finetune:
        return TrainingState()
    if ours is None:
        raise CheckpointError(f"--load {load_dir}: {directory} has no training state (not written "
                              "by this project); use --finetune to load its weights only")
    engine.global_steps = int(ours["iteration"])
    engine.global_samples = int(ours["consumed_samples"])
    return TrainingState(iteration=int(ours["iteration"]),
                         consumed_samples=int(ours["consumed_samples"]),
                         extra=dict(ours.get("extra", {})))


def _brief(e: Exception) -> str:
    """``Type: first line of the message`` (torch's zip errors run over several sentences)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    text = text.split(". ")[0]
    return f"{type(e).__name__}: {text[:200]}" if text else type(e).__name__


def _raise_on_any_rank(error: Optional[CheckpointError], load_dir: str) -> None:
    """Raise ``error`` here, and a CheckpointError on every other rank, when any rank failed to
    read its part of a checkpoint (so no rank runs on into a collective its peer has left)."""
    failed = error is not None
    if torch.distributed.is_initialized():
        flag = all_reduce_small(torch.tensor([1.0 if failed else 0.0]), torch.distributed.ReduceOp.MAX)
        failed = bool(flag.item() > 0)
    if error is not None:
        raise error
    if failed:
        raise CheckpointError(f"--load {load_dir}: another rank could not read its part of the "
                              "checkpoint (see that rank's error)")
