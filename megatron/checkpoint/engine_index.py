"""The parameter index of a training run's checkpoint (``param_index.json``), so that any layout can
read it.

``DIR/iter_N/param_index.json`` (written by rank 0 at every save, after gathering every rank's
part) says, for each rank that wrote files, where each of its parameters lives on disk and what it
is in layout-independent terms:

- the parameter's *canonical name* (its name in the tensor-parallel 1, pipeline-parallel 1
  ``GPTModel`` of the local layer spec, megatron/model/param_names.py: Transformer Engine's fused
  norm names are recorded under the local spec's), its local shape and its tensor-parallel split
  (``tp_dim``: megatron-core's ``partition_dim``, or null for replicated parameters; ``tp_stride``:
  ``partition_stride``, 2 for the SwiGLU ``linear_fc1`` whose rank holds ``[gate_r; up_r]``);
- the file and key of its weight (``mp_rank_XX_model_states.pt`` ``module`` for ``GPTModel``,
  DeepSpeed's ``layer_XX-model_YY-model_states.pt`` for a pipeline stage);
- the optimizer's parameter groups in order (the index a ZeRO-0 torch optimizer's state uses) and
  the file holding the optimizer state (the model-states file at ZeRO stage 0, this rank's
  ``zero_pp_rank_D_mp_rank_XX_optim_states.pt`` at stages 1 and 2, whose ``param_slice_mappings``
  locate each parameter in the flat partitions).

Under expert parallelism (``expert_model_parallel_size`` E > 1) data-parallel rank ``dp`` holds
the experts of expert-parallel rank ``ep = dp mod E``: the records of ranks ``0 < dp < E`` keep
their expert parameters (flagged ``expert``; weights in megatron/checkpoint/expert_weights.py's
files), whose ZeRO partitions are spread over the ranks of the same ``ep``.

A rank's ``dp`` is its rank in the group its ZeRO states are partitioned over: the data-parallel
group, or with DeepSpeed-Ulysses (``sequence_parallel_size`` > 1) the sequence-data-parallel group
of ``data_parallel_size x sequence_parallel_size`` ranks, which all hold the same parameters.

megatron/checkpoint/reader.py reads it back (megatron/checkpoint/format.py writes the file). Only
metadata is written (no tensor is copied).
"""
import os
from typing import Any, Dict, List

import torch

from megatron.checkpoint.expert_weights import is_expert_parallel_param, this_ranks_expert_file
from megatron.checkpoint.format import INDEX_VERSION, TORCH_OPTIMIZER, ZERO_OPTIMIZER
from megatron.checkpoint.format import write_param_index as write_param_index_file
from megatron.model.param_names import canonical_weight_name, global_expert_name


def optimizer_format(engine) -> str:
    """How ``engine`` stores its optimizer state: :data:`TORCH_OPTIMIZER`, :data:`ZERO_OPTIMIZER`
    (DeepSpeed's ZeRO stage 1/2 optimizer, and ``BF16_Optimizer``, bf16 with fp32 accumulation,
    which saves the same flat fp32 partitions, ``param_slice_mappings`` and base optimizer state
    in the ZeRO checkpoint files) or the class name of anything else (the fp16 wrappers of older
    stage-0 checkpoints, ZeRO-3), which cannot be resharded."""
    from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    optimizer = engine.optimizer
    if isinstance(optimizer, (DeepSpeedZeroOptimizer, BF16_Optimizer)):
        return ZERO_OPTIMIZER
    if isinstance(optimizer, torch.optim.Optimizer):
        return TORCH_OPTIMIZER
    return type(optimizer).__name__


def canonical_namer(module):
    """``local name -> canonical name`` for ``module``'s parameters: a ``GPTModelPipe`` maps its
    stage-local names to ``GPTModel``'s, and Transformer Engine's fused norm names become the
    local spec's, and an expert-parallel rank's experts get their global ids
    (megatron/model/param_names.py)."""
    gpt_name = getattr(module, "canonical_name", lambda name: name)
    first_expert = getattr(module, "first_local_expert", 0)
    return lambda name: canonical_weight_name(global_expert_name(gpt_name(name), first_expert))


def _weight_locations(engine, directory: str) -> Dict[str, List[str]]:
    """``local name -> [file name, key...]`` of every parameter whose weight this rank writes."""
    from deepspeed.pipe import PipelineModule

    module = engine.module
    if not isinstance(module, PipelineModule):
        model_file = os.path.basename(engine._get_ckpt_name(os.path.dirname(directory),
                                                            os.path.basename(directory)))
        return {name: [model_file, "module", name] for name, _ in module.named_parameters()}
    files = {}
    for local_idx, layer in enumerate(module.forward_funcs):
        if not hasattr(layer, "state_dict"):  # a tied layer's forward_fn: saved with its module
            continue
        path = os.path.basename(module.ckpt_layer_path(directory, local_idx))
        files[id(layer)] = path
    locations = {}
    for name, _ in module.named_parameters():
        head, _, rest = name.partition(".")
        if head == "tied_modules":
            key, _, rest = rest.partition(".")
            layer = module.tied_modules[key]
        else:
            layer = module._modules[head]
        if id(layer) in files:
            locations[name] = [files[id(layer)], rest]
    return locations


def _groups(engine, names: Dict[int, str]) -> List[List[str]]:
    optimizer = engine.optimizer
    # DeepSpeed's wrappers keep the model's parameters in bit16_groups (ZeRO 1/2), bf16_groups
    # (BF16_Optimizer: bf16 with fp32 accumulation, megatron/optim/precision.py) or fp16_groups
    # (FP16_Optimizer and FP16_UnfusedOptimizer, which older checkpoints ran at ZeRO 0), and fp32
    # copies, not model parameters, in param_groups
    groups = next((getattr(optimizer, a) for a in ("bit16_groups", "bf16_groups", "fp16_groups")
                   if getattr(optimizer, a, None) is not None), None)
    if groups is None:
        groups = [group["params"] for group in optimizer.param_groups]
    return [[names[id(p)] for p in group] for group in groups]


def rank_record(engine, directory: str) -> Dict[str, Any]:
    """This rank's part of the index (see the module docstring) for the checkpoint being written
    to ``directory``."""
    from megatron.core import parallel_state

    module = engine.module
    canonical = canonical_namer(module)
    names = {id(p): n for n, p in module.named_parameters()}
    locations = _weight_locations(engine, directory)
    ep_rank = parallel_state.get_expert_model_parallel_rank()
    expert_file = this_ranks_expert_file()
    params = {}
    for name, p in module.named_parameters():
        split = getattr(p, "tensor_model_parallel", False)
        expert = is_expert_parallel_param(p)
        weight = locations.get(name)
        if expert and ep_rank > 0:  # megatron/checkpoint/expert_weights.py
            weight = [expert_file, "module", canonical(name)]
        params[name] = {"canonical": canonical(name), "shape": list(p.shape),
                        "tp_dim": int(p.partition_dim) if split else None,
                        "tp_stride": int(getattr(p, "partition_stride", 1)) if split else 1,
                        "weight": weight, **({"expert": True} if expert else {})}
    tag_dir, tag = os.path.dirname(directory), os.path.basename(directory)
    model_states_file = os.path.basename(engine._get_ckpt_name(tag_dir, tag))
    optimizer_file = model_states_file
    if optimizer_format(engine) == ZERO_OPTIMIZER:
        optimizer_file = os.path.basename(engine._get_zero_ckpt_name(tag_dir, tag))
    return {"tp": parallel_state.get_tensor_model_parallel_rank(),
            "pp": parallel_state.get_pipeline_model_parallel_rank(),
            "dp": parallel_state.get_data_parallel_rank(
                with_context_parallel=parallel_state.get_context_parallel_world_size() > 1),
            "ep": ep_rank,
            "model_states_file": model_states_file, "optimizer_file": optimizer_file,
            "groups": _groups(engine, names), "params": params}


def write_param_index(engine, directory: str) -> None:
    """Gather every rank's :func:`rank_record` and write ``directory/param_index.json`` on rank 0
    (all ranks must call this)."""
    from megatron.core import parallel_state

    record = rank_record(engine, directory)
    records = [record]
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        records = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(records, record)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    ep_size = parallel_state.get_expert_model_parallel_world_size()
    for r in records:
        if r["dp"] == 0:
            continue
        if r["dp"] < ep_size:  # another expert-parallel rank: its experts are its own
            r["params"] = {n: p for n, p in r["params"].items() if p.get("expert")}
            del r["model_states_file"]
        else:  # the same parameters as a data-parallel rank below the expert-parallel size
            del r["groups"], r["params"], r["model_states_file"]
    ps = parallel_state
    write_param_index_file(directory, {"version": INDEX_VERSION,
             "tensor_model_parallel_size": ps.get_tensor_model_parallel_world_size(),
             "pipeline_model_parallel_size": ps.get_pipeline_model_parallel_world_size(),
             "data_parallel_size": parallel_state.get_data_parallel_world_size(),
             "sequence_parallel_size": parallel_state.get_context_parallel_world_size(),
             "expert_model_parallel_size": ep_size,
             "zero_stage": int(engine.zero_optimization_stage()),
             "optimizer_format": optimizer_format(engine),
             "ranks": sorted(records, key=lambda r: (r["pp"], r["tp"], r["dp"]))})
