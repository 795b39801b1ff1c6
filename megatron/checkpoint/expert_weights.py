"""The expert weights of an expert-parallel checkpoint (``--expert-model-parallel-size`` > 1).

DeepSpeed writes each model-parallel rank's module state from data-parallel rank 0 only
(``mp_rank_XX_model_states.pt``). Under expert parallelism, that rank holds only the experts of
expert-parallel rank 0. The experts of every other expert-parallel rank are written here, by that
rank's expert-data-parallel rank 0: one file per (expert-parallel rank E >= 1, tensor-parallel
rank T), ``expert_states_ep_EE_mp_rank_TT.pt``, holding ``{"module": {canonical name: tensor}}``
(global expert ids, megatron/model/param_names.py). ``param_index.json`` points each of those
experts at its file (megatron/checkpoint/engine_index.py), and megatron/checkpoint/reader.py
reads the files beside DeepSpeed's. The optimizer states of the experts are in DeepSpeed's ZeRO
files, partitioned over each expert's expert-data-parallel group.
"""
import os
import re

import torch

from megatron.checkpoint.format import atomic_torch_save

EXPERT_FILE = re.compile(r"expert_states_ep_(\d+)_mp_rank_(\d+)\.pt$")


def expert_weights_file(ep_rank: int, tp_rank: int) -> str:
    """The file name of the experts of expert-parallel rank ``ep_rank`` on tensor-parallel rank
    ``tp_rank``."""
    return f"expert_states_ep_{ep_rank:02d}_mp_rank_{tp_rank:02d}.pt"


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
    from megatron.core import parallel_state

    module = {canonical(n): p.detach().clone() for n, p in engine.module.named_parameters()
              if is_expert_parallel_param(p)}
    name = expert_weights_file(parallel_state.get_expert_model_parallel_rank(),
                               parallel_state.get_tensor_model_parallel_rank())
    atomic_torch_save({"module": module}, os.path.join(directory, name))
