"""The parallel layout a checkpoint was written with, and the check that a resume of a checkpoint
without a parameter index uses the same tensor/pipeline split.

Each checkpoint directory holds ``parallel_layout.json`` (tensor, pipeline and data-parallel sizes
and the world size). DeepSpeed names model files by model-parallel rank (``mp_rank_XX``), each
holding that rank's shards. Checkpoints with ``param_index.json`` resume on any layout
(megatron/parallel/resharding.py); older ones only on their own tensor x pipeline split, which
:func:`check_same_model_split` enforces.
"""
import json
import os
from typing import Optional

from megatron.atomic_io import atomic_write_text
from megatron.parallel.topology import ParallelLayout

LAYOUT_FILENAME = "parallel_layout.json"


def current_layout() -> ParallelLayout:
    """This run's layout from megatron-core's parallel state."""
    import torch
    from megatron.core import parallel_state

    return ParallelLayout(tp=parallel_state.get_tensor_model_parallel_world_size(),
                          pp=parallel_state.get_pipeline_model_parallel_world_size(),
                          dp=parallel_state.get_data_parallel_world_size(),
                          world=torch.distributed.get_world_size())


def write_layout(directory: str, layout: ParallelLayout) -> None:
    """Write ``directory/parallel_layout.json`` atomically (call on one rank)."""
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
                          dp=d["data_parallel_size"], world=d["world_size"])


def check_same_model_split(directory: str, load_dir: str, layout: ParallelLayout) -> None:
    """Raise :class:`megatron.checkpointing.CheckpointError` naming both layouts when the
    checkpoint in ``directory`` was written with another tensor or pipeline-parallel size."""
    from megatron.checkpointing import CheckpointError

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
