"""The on-disk format of a checkpoint: its directory names and the small JSON records beside
DeepSpeed's files, each read and written here only (writes atomic: temporary file + rename).

``DIR/`` (a ``--save`` directory) holds ``latest_checkpointed_iteration.txt`` (the tracker, the
iteration of the newest complete checkpoint, written last) and one ``iter_NNNNNNN/`` per saved
iteration, which holds DeepSpeed's model/optimizer files, one ``rng_state_rank{R}.pt`` per rank,
and:

- ``parallel_layout.json``: tensor, pipeline and data-parallel sizes and the world size;
- ``model_args.json``: the model and tokenizer flags (megatron/checkpoint/model_args.py);
- ``param_index.json``: where each parameter lives, under its canonical name, and its
  tensor-parallel split (megatron/checkpoint/engine_index.py writes the record of a training run,
  megatron/checkpoint/writer.py that of an offline write), so any layout can read it;
- ``merge.json`` (merged checkpoints only, megatron/checkpoint/merge.py): the source checkpoints,
  their weights and where the weights came from;
- ``data_mix.json``: the data ledger (megatron/data/mix_ledger.py): per training dataset the
  samples drawn, and the history of the run's mixes, which a resume continues.
"""
import json
import os
from typing import Any, Dict, Optional, Tuple

import torch

from megatron.errors import CheckpointError, ConfigError
from megatron.parallel.topology import ParallelLayout
from megatron.utils.atomic_io import atomic_path, atomic_write_text

TRACKER_FILENAME = "latest_checkpointed_iteration.txt"
LAYOUT_FILENAME = "parallel_layout.json"
MODEL_ARGS_FILENAME = "model_args.json"
MODEL_ARGS_FORMAT_VERSION = 1
INDEX_FILENAME = "param_index.json"
INDEX_VERSION = 1
MERGE_FILENAME = "merge.json"  # a merged checkpoint's sources and weights (checkpoint/merge.py)
MERGE_FORMAT_VERSION = 1
DATA_MIX_FILENAME = "data_mix.json"  # the data ledger (megatron/data/mix_ledger.py MixRecord)
TORCH_OPTIMIZER = "torch"  # optimizer_format: a plain torch optimizer (ZeRO stage 0, fp32)
ZERO_OPTIMIZER = "zero"  # DeepSpeed's ZeRO stage 1/2 optimizer or BF16_Optimizer (flat fp32 partitions)


# ------------------------------------------------------------------ directories and the tracker
def checkpoint_tag(iteration: int) -> str:
    """Directory name of the checkpoint after ``iteration`` iterations."""
    return f"iter_{iteration:07d}"


def read_tracker(load_dir: str) -> Optional[int]:
    """The iteration recorded in ``load_dir``'s tracker file, or None when there is none."""
    path = os.path.join(load_dir, TRACKER_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        text = f.read().decode("utf-8", errors="replace").strip()
    try:
        return int(text)
    except ValueError:
        raise CheckpointError(f"--load {load_dir}: {TRACKER_FILENAME} holds {text!r}, "
                              "not an iteration number") from None


def write_tracker(save_dir: str, iteration: int, fsync: bool = False) -> None:
    """Point ``save_dir``'s tracker at ``iteration`` (atomically; call once every file of that
    checkpoint is written)."""
    atomic_write_text(os.path.join(save_dir, TRACKER_FILENAME), f"{iteration}\n", fsync=fsync)


def resolve_checkpoint(load_dir: str, iteration: Optional[int] = None,
                       iteration_flag: str = "--iteration") -> Tuple[str, int]:
    """``(DIR/iter_NNNNNNN, iteration)``: ``iteration`` or, by default, the tracker's latest one.
    Raises :class:`CheckpointError` naming ``--load`` and ``iteration_flag`` (the calling tool's
    flag for the iteration)."""
    if not os.path.isdir(load_dir):
        raise CheckpointError(f"--load {load_dir}: no such directory")
    if iteration is None:
        iteration = read_tracker(load_dir)
        if iteration is None:
            raise CheckpointError(f"--load {load_dir}: no {TRACKER_FILENAME} (no complete "
                                  f"checkpoint); give {iteration_flag} N to read iter_N")
    directory = os.path.join(load_dir, checkpoint_tag(iteration))
    if not os.path.isdir(directory):
        have = sorted(d for d in os.listdir(load_dir) if d.startswith("iter_"))
        raise CheckpointError(f"{iteration_flag} {iteration}: {directory} does not exist (--load "
                              f"{load_dir} has {', '.join(have) or 'no checkpoints'})")
    return directory, iteration


def atomic_torch_save(obj: Any, path: str) -> None:
    """``torch.save(obj, path)`` through a temporary file and a rename."""
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)


# ------------------------------------------------------------------ parallel_layout.json
def write_layout(directory: str, layout: ParallelLayout) -> None:
    """Write ``directory/parallel_layout.json`` (call on one rank)."""
    atomic_write_text(os.path.join(directory, LAYOUT_FILENAME),
                      json.dumps(layout.as_dict(), indent=1) + "\n")


def read_layout(directory: str) -> Optional[ParallelLayout]:
    """The layout recorded in ``directory``, or None for checkpoints written before layouts were
    recorded (those are tensor-parallel 1, pipeline-parallel 1)."""
    path = os.path.join(directory, LAYOUT_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        d = json.load(f)
    return ParallelLayout(tp=d["tensor_model_parallel_size"], pp=d["pipeline_model_parallel_size"],
                          dp=d["data_parallel_size"], world=d["world_size"],
                          sp=d.get("sequence_parallel_size", 1),
                          ep=d.get("expert_model_parallel_size", 1))


# ------------------------------------------------------------------ model_args.json
def write_model_args(directory: str, record: dict) -> None:
    """Write ``directory/model_args.json`` (call on one rank)."""
    atomic_write_text(os.path.join(directory, MODEL_ARGS_FILENAME),
                      json.dumps(record, indent=1, sort_keys=True) + "\n")


def read_model_args(directory: str) -> Optional[dict]:
    """The record in ``directory/model_args.json`` (an ``iter_*`` directory), or None when the
    checkpoint predates recorded model flags. Raises :class:`ConfigError` for a file that is not
    such a record."""
    path = os.path.join(directory, MODEL_ARGS_FILENAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(record, dict) or record.get("format_version") != MODEL_ARGS_FORMAT_VERSION \
            or not isinstance(record.get("model"), dict):
        raise ConfigError(f"{path}: not a model_args.json record of format_version "
                          f"{MODEL_ARGS_FORMAT_VERSION} (expected keys format_version, model, "
                          "tokenizer)")
    return record


# ------------------------------------------------------------------ param_index.json
def write_param_index(directory: str, index: Dict[str, Any]) -> None:
    """Write ``directory/param_index.json`` (call on one rank)."""
    atomic_write_text(os.path.join(directory, INDEX_FILENAME), json.dumps(index) + "\n")


def read_param_index(directory: str) -> Optional[Dict[str, Any]]:
    """The index of the checkpoint in ``directory``, or None for checkpoints written without one."""
    path = os.path.join(directory, INDEX_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


# ------------------------------------------------------------------ merge.json
def write_merge_record(directory: str, record: Dict[str, Any]) -> None:
    """Write ``directory/merge.json``, the record of a merged checkpoint."""
    atomic_write_text(os.path.join(directory, MERGE_FILENAME),
                      json.dumps(dict(record, format_version=MERGE_FORMAT_VERSION), indent=1)
                      + "\n")


def read_merge_record(directory: str) -> Optional[Dict[str, Any]]:
    """The ``merge.json`` record of the checkpoint in ``directory``, or None when it is not a
    merged checkpoint."""
    path = os.path.join(directory, MERGE_FILENAME)
    if not os.path.isfile(path):
        return None
    with open(path) as f:
        return json.load(f)


# ------------------------------------------------------------------ data_mix.json
def write_data_mix(directory: str, record: Dict[str, Any]) -> None:
    """Write ``directory/data_mix.json``, the data ledger's record (JSON of
    megatron/data/mix_ledger.py ``MixRecord``; call on one rank)."""
    atomic_write_text(os.path.join(directory, DATA_MIX_FILENAME),
                      json.dumps(record, indent=1) + "\n")


def read_data_mix(directory: str) -> Optional[Dict[str, Any]]:
    """The ``data_mix.json`` record of the checkpoint in ``directory``, or None for a checkpoint
    written before checkpoints carried one. Raises :class:`ConfigError` for an unreadable file."""
    path = os.path.join(directory, DATA_MIX_FILENAME)
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable JSON file ({e})") from None
