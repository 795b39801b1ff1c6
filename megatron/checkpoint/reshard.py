"""Resume a checkpoint on another layout: another tensor-, pipeline- or data-parallel size or ZeRO
stage (0, 1, 2), with the optimizer state.

Each rank rebuilds, for every parameter it holds, the full (tensor-parallel 1) tensor of the
weight's fp32 master value and of each optimizer state of the parameter's shape (Adam's ``exp_avg``
and ``exp_avg_sq``, SGD's momentum), plus the optimizer step, from the checkpoint's files as
described by its ``param_index.json``, through the one checkpoint reader
(megatron/checkpoint/reader.py, :meth:`CheckpointReader.full`); it then cuts out its own
tensor-parallel shard and writes it into the module, the torch optimizer (ZeRO stage 0) or its
fragment of DeepSpeed's flat ZeRO partitions. Parameters are matched by canonical name, so a
``GPTModelPipe`` stage and a ``GPTModel`` exchange state freely.

Files are opened memory-mapped and one full parameter is assembled at a time: a rank reads only
the parts of the checkpoint it needs and holds no more than one full parameter beyond its own
shards. The padded vocabulary (a multiple of ``--make-vocab-size-divisible-by`` x TP) may change
with TP: the embedding and output-layer rows are kept up to the smaller padded size (every real
token row is kept) and new padding rows start at zero, weights and moments alike.
"""
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from megatron.checkpoint.engine_index import canonical_namer, optimizer_format
from megatron.checkpoint.format import TORCH_OPTIMIZER, ZERO_OPTIMIZER
from megatron.checkpoint.reader import WEIGHT, CheckpointReader
from megatron.checkpoint.shards import full_shape, resize_vocab_rows, tp_shard
from megatron.errors import ReshardError
from megatron.model.param_names import VOCAB_PARAMETERS
from megatron.parallel.topology import ParallelLayout, current_layout


# ------------------------------------------------------------------ writing into this run's engine
def check_same_model(saved: CheckpointReader, named_params: Sequence[Tuple[str, torch.nn.Parameter]],
                     tp_size: int, load_dir: str, model_names: Optional[set] = None) -> None:
    """Raise :class:`ReshardError` naming the differences when this rank's parameters (canonical
    names) are not the checkpoint's same-shaped parameters (the vocabulary rows may differ), or
    when the checkpoint holds parameters outside ``model_names`` (every rank's canonical names)."""
    missing, different = [], []
    extra = sorted(set(saved.sources) - model_names) if model_names is not None else []
    for name, p in named_params:
        if name not in saved.sources:
            missing.append(name)
            continue
        dim = p.partition_dim if getattr(p, "tensor_model_parallel", False) else None
        here, there = full_shape(p.shape, dim, tp_size), saved.full_shape(name)
        if name in VOCAB_PARAMETERS:
            here, there = here[1:], there[1:]
        if here != there:
            different.append(f"{name} is {list(saved.full_shape(name))} there and "
                             f"{list(full_shape(p.shape, dim, tp_size))} here")
    if missing or different or extra:
        detail = "; ".join(different[:3] + [f"{n} is not in the checkpoint" for n in missing[:3]]
                           + [f"{n} is not in this model" for n in extra[:3]])
        raise ReshardError(
            f"--load {load_dir}: checkpoint {saved.directory} holds another model than this run "
            f"builds ({detail}); give the model flags it was trained with (--num-layers, "
            "--hidden-size, --ffn-hidden-size, --num-attention-heads, --num-query-groups, "
            "--swiglu, --untie-embeddings-and-output-weights, ...)")


def _local_value(saved: CheckpointReader, name: str, p: torch.Tensor, kind: str, tp_rank: int,
                 tp_size: int) -> torch.Tensor:
    full = saved.full(name, kind)
    dim = p.partition_dim if getattr(p, "tensor_model_parallel", False) else None
    if name in VOCAB_PARAMETERS:
        full = resize_vocab_rows(full, full_shape(p.shape, dim, tp_size)[0])
    return tp_shard(full, dim, getattr(p, "partition_stride", 1), tp_rank, tp_size)


def _flat_groups(optimizer) -> Tuple[List[List[torch.nn.Parameter]], List[torch.Tensor]]:
    """(the model's parameters per group, this rank's flat fp32 partition per group) of
    DeepSpeed's ZeRO-1/2 optimizer (``bit16_groups``, ``single_partition_of_fp32_groups``) or
    ``BF16_Optimizer`` (``bf16_groups``, ``fp32_groups_flat_partition``)."""
    if hasattr(optimizer, "bit16_groups"):
        return optimizer.bit16_groups, optimizer.single_partition_of_fp32_groups
    return optimizer.bf16_groups, optimizer.fp32_groups_flat_partition


def _zero_targets(optimizer, keys: List[str], step: Optional[float]) -> Dict[int, Tuple[Any, ...]]:
    """``id(param) -> (hp fragment address, lp fragment address, flat fp32 partition, its state)``
    for this rank's fragments of DeepSpeed's flat fp32 partitions (ZeRO-1/2 or BF16_Optimizer),
    creating the states ``keys`` (zeros) and the step when the optimizer has not stepped yet."""
    targets = {}
    groups, flats = _flat_groups(optimizer)
    for group_index, group in enumerate(groups):
        flat = flats[group_index]
        state = optimizer.optimizer.state[flat]
        for key in keys:
            if key not in state:
                state[key] = torch.zeros_like(flat)
        if step is not None:
            state["step"] = torch.tensor(step, dtype=torch.float32)
        for p in group:
            mapping = getattr(p, "_hp_mapping", None)
            if mapping is not None:
                targets[id(p)] = (mapping.hp_fragment_address, mapping.lp_fragment_address,
                                  flat, state)
    optimizer._hp_optimizer_states_linked = False  # relink the fragments to these states
    return targets


def _write_zero_fragment(target: Tuple[Any, ...], kind: str, value: torch.Tensor) -> None:
    hp, lp, flat, state = target
    part = value.reshape(-1).narrow(0, lp.start, lp.numel)
    (flat if kind == WEIGHT else state[kind]).narrow(0, hp.start, hp.numel).copy_(part)


def load_resharded(engine, saved: CheckpointReader, load_dir: str, load_optimizer: bool,
                   log: Callable[[str], None] = print) -> None:
    """Write the checkpoint ``saved`` into ``engine``'s module and (with ``load_optimizer``) its
    optimizer, resharded to this rank's layout."""
    from megatron.core import parallel_state

    canonical = canonical_namer(engine.module)
    named = [(canonical(n), p) for n, p in engine.module.named_parameters()]
    model_names = {n for n, _ in named}
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        gathered = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(gathered, sorted(model_names))
        model_names = set().union(*gathered)
    fmt = optimizer_format(engine)
    if load_optimizer:
        for what, value in (("the checkpoint", saved.format), ("this run", fmt)):
            if value not in (TORCH_OPTIMIZER, ZERO_OPTIMIZER):
                raise ReshardError(
                    f"--load {load_dir}: {what} keeps its optimizer state in DeepSpeed's {value}; "
                    "resuming on another layout with the optimizer state needs fp32 training at "
                    "ZeRO stage 0, DeepSpeed's ZeRO stage 1/2 optimizer or its BF16_Optimizer "
                    "(docs/precision.md) (or use --no-load-optim)")
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    tp_size = parallel_state.get_tensor_model_parallel_world_size()
    check_same_model(saved, named, tp_size, load_dir, model_names)
    keys, step = saved.optimizer_keys() if load_optimizer else ([], None)
    zero = _zero_targets(engine.optimizer, keys, step) if fmt == ZERO_OPTIMIZER else None
    with torch.no_grad():
        for name, p in named:  # one parameter at a time: memory beyond the run's own state is
            for kind in [WEIGHT, *keys]:  # one full tensor and one shard
                value = _local_value(saved, name, p, kind, tp_rank, tp_size)
                if kind == WEIGHT:
                    p.copy_(value.to(p.dtype))
                if zero is not None:  # a parameter outside this rank's partition has no fragment
                    if id(p) in zero:
                        _write_zero_fragment(zero[id(p)], kind, value)
                elif kind != WEIGHT:  # ZeRO 0: the module's weight is the master
                    engine.optimizer.state[p][kind] = value.clone()  # not a view of the file
            if fmt == TORCH_OPTIMIZER and step is not None:
                engine.optimizer.state[p]["step"] = torch.tensor(step, dtype=torch.float32)
    if fmt not in (TORCH_OPTIMIZER, ZERO_OPTIMIZER):  # older fp16 wrappers, weights only:
        engine.optimizer.refresh_fp32_params()  # their fp32 masters from the loaded weights

    index = saved.index
    was = ParallelLayout(tp=saved.tp_size, pp=index["pipeline_model_parallel_size"],
                         dp=saved.dp_size, world=0, sp=index.get("sequence_parallel_size", 1),
                         ep=index.get("expert_model_parallel_size", 1))
    log(f"resharded {saved.directory} ({was.describe()}, ZeRO stage {index['zero_stage']}) to "
        f"{current_layout().describe()}, ZeRO stage {engine.zero_optimization_stage()}"
        + ("" if load_optimizer else " (weights only)"))
