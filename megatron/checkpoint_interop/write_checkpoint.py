"""Write a full (TP=1, PP=1) ``GPTModel`` state as a training checkpoint of a given layout, in the
files DeepSpeed's engines read (the inverse of megatron/checkpoint_interop/full_state.py).

``write_checkpoint(save_dir, tensors, model_args, tp=2, pp=2)`` writes ``save_dir/iter_0000000/``
(weights only: no optimizer, scheduler or training state, so it is loaded with ``--finetune``),
``parallel_layout.json``, ``model_args.json`` and the tracker file:

- PP=1: ``mp_rank_{t:02d}_model_states.pt`` per tensor-parallel rank t, ``["module"]`` the rank's
  ``GPTModel`` state dict (with megatron-core's empty ``_extra_state`` entries, so a strict load
  accepts it), and ``param_index.json``, so ``--load`` reshards it to any layout;
- PP>1: DeepSpeed's pipe files ``layer_{i:02d}-model_{t:02d}-model_states.pt`` (pipe layer i,
  megatron/model/gpt_model_pipe.py) and one ``mp_rank_{r:02d}_model_states.pt`` per
  model-parallel rank without module weights.

Shards are cut as megatron-core cuts them (:func:`full_state.split_full`).
"""
import json
import os
import re
from typing import Dict, Iterable, List, Tuple

import torch

from megatron.checkpoint_interop.full_state import split_full, tensor_parallel_partition
from megatron.checkpoint_interop.model_args import write_model_args

# Linear modules of megatron-core's local spec that carry an (empty) _extra_state entry.
_EXTRA_STATE_MODULES = ("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2")


def _extra_state_keys(names: Iterable[str]) -> Dict[str, None]:
    """The ``_extra_state`` keys megatron-core's ``GPTModel.state_dict()`` has beside ``names``
    (the output layer has one, tied or not)."""
    keys = {}
    for name in names:
        module, _, leaf = name.rpartition(".")
        if leaf == "weight" and module.rpartition(".")[2] in _EXTRA_STATE_MODULES:
            keys[f"{module}._extra_state"] = None
    keys["output_layer._extra_state"] = None
    return keys


def _engine_fields(module, dp_world_size: int, mp_world_size: int) -> dict:
    """What DeepSpeed's ``save_checkpoint`` puts in ``mp_rank_*_model_states.pt``, weights only."""
    import deepspeed

    return {"module": module, "buffer_names": [], "optimizer": None, "param_shapes": None,
            "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
            "lr_scheduler": None, "data_sampler": None, "random_ltd": None,
            "sparse_tensor_module_names": [], "skipped_steps": 0, "global_steps": 0,
            "global_samples": 0, "dp_world_size": dp_world_size, "mp_world_size": mp_world_size,
            "ds_config": {}, "ds_version": deepspeed.__version__}


def _pipe_layer(name: str, num_layers: int) -> Tuple[int, str]:
    """(pipe layer index, key in that layer's file) of canonical ``name``."""
    m = re.match(r"decoder\.layers\.(\d+)\.(.*)$", name)
    if m:
        return int(m.group(1)) + 1, f"layer.{m.group(2)}"
    if name.startswith("decoder.final_layernorm."):
        return num_layers + 1, name[len("decoder."):]
    if name.startswith("embedding."):
        return 0, name
    if name.startswith("output_layer."):
        return num_layers + 2, name
    raise KeyError(f"{name} is not a GPTModel parameter name")


def _write_param_index(directory: str, shards: List[Dict[str, torch.Tensor]], gated: bool) -> None:
    """``param_index.json`` (megatron/parallel/param_index.py) of a pipeline-less checkpoint, so
    ``--load`` reshards it to any other layout (megatron/parallel/resharding.py); there is no
    optimizer state (weights only, loaded with ``--finetune``)."""
    from megatron.parallel.param_index import INDEX_FILENAME, INDEX_VERSION, TORCH_OPTIMIZER

    ranks = []
    for rank, state in enumerate(shards):
        model_file = f"mp_rank_{rank:02d}_model_states.pt"
        params = {}
        for name, tensor in state.items():
            partition = tensor_parallel_partition(name, gated)
            params[name] = {"canonical": name, "shape": list(tensor.shape),
                            "tp_dim": partition[0] if partition else None,
                            "tp_stride": partition[1] if partition else 1,
                            "weight": [model_file, "module", name]}
        ranks.append({"tp": rank, "pp": 0, "dp": 0, "model_states_file": model_file,
                      "optimizer_file": model_file, "groups": [list(state)], "params": params})
    index = {"version": INDEX_VERSION, "tensor_model_parallel_size": len(shards),
             "pipeline_model_parallel_size": 1, "data_parallel_size": 1, "zero_stage": 0,
             "optimizer_format": TORCH_OPTIMIZER, "ranks": ranks}
    with open(os.path.join(directory, INDEX_FILENAME), "w") as f:
        json.dump(index, f)


def write_checkpoint(save_dir: str, tensors: Dict[str, torch.Tensor], model_args: dict,
                     tp: int = 1, pp: int = 1, iteration: int = 0) -> str:
    """Write ``tensors`` (full canonical ``GPTModel`` parameters) as the checkpoint of
    ``iteration`` under ``save_dir`` with tensor-parallel size ``tp`` and pipeline-parallel size
    ``pp`` (see the module docstring); returns the ``iter_*`` directory."""
    from megatron.atomic_io import atomic_write_text
    from megatron.checkpointing import TRACKER_FILENAME, checkpoint_tag
    from megatron.parallel.layout_record import write_layout
    from megatron.parallel.topology import ParallelLayout

    directory = os.path.join(save_dir, checkpoint_tag(iteration))
    os.makedirs(directory, exist_ok=True)
    gated = bool(model_args["model"].get("swiglu"))
    shards = [{} for _ in range(tp)]
    for name, full in tensors.items():
        partition = tensor_parallel_partition(name, gated)
        parts = split_full(full, *partition, tp) if partition and tp > 1 else [full] * tp
        for rank in range(tp):
            shards[rank][name] = parts[rank].contiguous()
    if pp == 1:
        for rank in range(tp):
            module = dict(shards[rank])
            module.update(_extra_state_keys(module))
            torch.save(_engine_fields(module, 1, tp),
                       os.path.join(directory, f"mp_rank_{rank:02d}_model_states.pt"))
    else:
        num_layers = int(model_args["model"]["num_layers"])
        for rank in range(tp):
            layers: Dict[int, dict] = {}
            for name, tensor in shards[rank].items():
                index, key = _pipe_layer(name, num_layers)
                layers.setdefault(index, {})[key] = tensor
            for index, state in layers.items():
                # megatron-core's linear layers' empty extra state, as the pipe modules save it
                state.update({key.rsplit(".", 1)[0] + "._extra_state": None for key in list(state)
                              if re.search(r"(\.linear_\w+|^output_layer)\.weight$", key)})
                if index == 0:
                    state["output_projection._extra_state"] = None
                torch.save(state, os.path.join(directory,
                                               f"layer_{index:02d}-model_{rank:02d}-model_states.pt"))
        for rank in range(tp * pp):
            torch.save(_engine_fields(None, 1, tp * pp),
                       os.path.join(directory, f"mp_rank_{rank:02d}_model_states.pt"))
    if pp == 1:
        _write_param_index(directory, shards, gated)
    write_layout(directory, ParallelLayout(tp=tp, pp=pp, dp=1, world=tp * pp))
    write_model_args(directory, model_args)
    atomic_write_text(os.path.join(save_dir, TRACKER_FILENAME), f"{iteration}\n")
    return directory

