"""The expert weights of an expert-parallel checkpoint (``--expert-model-parallel-size`` > 1).

DeepSpeed writes each model-parallel rank's module state from data-parallel rank 0 only
(``mp_rank_XX_model_states.pt``). Under expert parallelism, that rank holds only the experts of
expert-parallel rank 0. The experts of every other expert-parallel rank are written here, by that
rank's expert-data-parallel rank 0: one file per (expert-parallel rank E >= 1, tensor-parallel
rank T), ``expert_states_ep_EE_mp_rank_TT.pt`` (``expert_states_ep_EE_pp_SS_mp_rank_TT.pt`` for
pipeline stage S of a pipeline-parallel run), holding ``{"module": {canonical name: tensor}}``
(global expert ids, megatron/model/param_names.py). ``param_index.json`` points each of those
experts at its file (megatron/checkpoint/engine_index.py), and megatron/checkpoint/reader.py
reads the files beside DeepSpeed's. The optimizer states of the experts are in DeepSpeed's ZeRO
files, partitioned over each expert's expert-data-parallel group.
"""
import contextlib
import os
import re

import torch

from megatron.checkpoint.format import atomic_torch_save

EXPERT_FILE = re.compile(r"expert_states_ep_(\d+)(?:_pp_(\d+))?_mp_rank_(\d+)\.pt$")


def expert_weights_file(ep_rank: int, tp_rank: int, pp_rank: int = None) -> str:
    """The file name of the experts of expert-parallel rank ``ep_rank`` on tensor-parallel rank
    ``tp_rank`` (and pipeline stage ``pp_rank``, None without pipeline parallelism)."""
    stage = "" if pp_rank is None else f"_pp_{pp_rank:02d}"
    return f"expert_states_ep_{ep_rank:02d}{stage}_mp_rank_{tp_rank:02d}.pt"


def this_ranks_expert_file() -> str:
    """:func:`expert_weights_file` of this rank (megatron-core's parallel state)."""
    from megatron.core import parallel_state

    pipeline = parallel_state.get_pipeline_model_parallel_world_size() > 1
    return expert_weights_file(parallel_state.get_expert_model_parallel_rank(),
                               parallel_state.get_tensor_model_parallel_rank(),
                               parallel_state.get_pipeline_model_parallel_rank() if pipeline else None)


def is_expert_parallel_param(param: torch.nn.Parameter) -> bool:
    """megatron-core's mark of an expert split over expert-parallel ranks (``allreduce`` False)."""
    return getattr(param, "allreduce", True) is False


def writes_expert_weights() -> bool:
    """Whether this rank writes an expert file: expert-parallel rank >= 1, expert-data-parallel
    rank 0 (its replicas hold the same experts)."""
    from megatron.core import parallel_state

    return (parallel_state.get_expert_model_parallel_world_size() > 1
            and parallel_state.get_expert_model_parallel_rank() > 0
            and parallel_state.get_expert_data_parallel_rank() == 0)


def write_expert_weights(engine, directory: str, canonical) -> None:
    """Write this rank's expert file into the checkpoint ``directory`` when it is a writer
    (:func:`writes_expert_weights`), its tensors keyed by ``canonical(name)`` (the engine
    index's namer, which gives experts their global ids); every rank may call it."""
    if not writes_expert_weights():
        return
    module = {canonical(n): p.detach().clone() for n, p in engine.module.named_parameters()
              if is_expert_parallel_param(p)}
    atomic_torch_save({"module": module}, os.path.join(directory, this_ranks_expert_file()))


@contextlib.contextmanager
def dense_checkpoint_layout(engine):
    """Within the block the engine saves as for a dense model (module doc): DeepSpeed's own MoE
    checkpoint path (``has_moe_layers``) would write a pipeline stage's whole module under its
    stage-local names instead of the pipe's layer files, and its per-expert files know only
    DeepSpeed's MoE layer; the experts of expert-parallel ranks >= 1 are written by
    :func:`write_expert_weights` instead."""
    has_moe_layers = getattr(engine, "has_moe_layers", False)
    engine.has_moe_layers = False
    try:
        yield
    finally:
        engine.has_moe_layers = has_moe_layers
