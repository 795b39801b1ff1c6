"""Resume a checkpoint on another layout: another tensor-, pipeline- or data-parallel size or ZeRO
stage (0, 1, 2), with the optimizer state.

Each rank rebuilds, for every parameter it holds, the full (tensor-parallel 1) tensor of the
weight's fp32 master value and of each optimizer state of the parameter's shape (Adam's ``exp_avg``
and ``exp_avg_sq``, SGD's momentum), plus the optimizer step, from the checkpoint's files as
described by its ``param_index.json`` (megatron/parallel/param_index.py); it then cuts out its own
tensor-parallel shard and writes it into the module, the torch optimizer (ZeRO stage 0) or its
fragment of DeepSpeed's flat ZeRO partitions. Parameters are matched by canonical name, so a
``GPTModelPipe`` stage and a ``GPTModel`` exchange state freely.

Files are opened memory-mapped and one full parameter is assembled at a time: a rank reads only
the parts of the checkpoint it needs and holds no more than one full parameter beyond its own
shards. The padded vocabulary (a multiple of ``--make-vocab-size-divisible-by`` x TP) may change
with TP: the embedding and output-layer rows are kept up to the smaller padded size (every real
token row is kept) and new padding rows start at zero, weights and moments alike.
"""
import math
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from megatron.errors import ConfigError
from megatron.parallel.param_index import (TORCH_OPTIMIZER, ZERO_OPTIMIZER, canonical_namer,
                                           optimizer_format)

VOCAB_PARAMETERS = ("embedding.word_embeddings.weight", "output_layer.weight")
WEIGHT = "weight"  # the kind of the fp32 master value, beside the optimizer-state keys


class ReshardError(ConfigError):
    """The checkpoint cannot be resumed on this layout / model (the message says why)."""


# ------------------------------------------------------------------ tensor-parallel splits
def merge_tp_shards(shards: Sequence[torch.Tensor], dim: Optional[int],
                    stride: int = 1) -> torch.Tensor:
    """The full tensor whose megatron-core tensor-parallel shards (rank order) are ``shards``: rank
    r holds chunks r, r + TP, ... (``stride`` of them, each 1/stride of its shard) of the full
    tensor along ``dim``; a replicated parameter (``dim`` None) is its first shard."""
    from megatron.checkpoint_interop.full_state import merge_shards

    return shards[0] if dim is None else merge_shards(list(shards), dim, stride)


def tp_shard(full: torch.Tensor, dim: Optional[int], stride: int, tp_rank: int,
             tp_size: int) -> torch.Tensor:
    """Rank ``tp_rank``'s shard of ``full`` out of ``tp_size``, as megatron-core splits it (the
    inverse of :func:`merge_tp_shards`; only this rank's shard is built, unlike
    ``full_state.split_full``)."""
    if dim is None or tp_size == 1:
        return full
    chunks = torch.chunk(full, stride * tp_size, dim=dim)
    return torch.cat(chunks[tp_rank::tp_size], dim=dim)


def resize_vocab_rows(full: torch.Tensor, rows: int) -> torch.Tensor:
    """``full`` with ``rows`` rows along dim 0: truncated (dropping padding rows only, as both
    padded sizes hold every real token) or extended with zero rows."""
    if full.shape[0] >= rows:
        return full[:rows]
    return torch.cat([full, full.new_zeros((rows - full.shape[0], *full.shape[1:]))])


def full_shape(shape: Sequence[int], dim: Optional[int], tp_size: int) -> Tuple[int, ...]:
    """The tensor-parallel-1 shape of a local shard of ``shape`` split along ``dim``."""
    shape = list(shape)
    if dim is not None:
        shape[dim] *= tp_size
    return tuple(shape)


# ------------------------------------------------------------------ reading a saved checkpoint
def _base_state(zero_state: Dict[str, Any], group: int) -> Dict[str, Any]:
    """The torch optimizer state of flat group ``group`` in a ZeRO optimizer state dict (a torch
    ``state_dict``, or a list per group with ``elastic_checkpoint``)."""
    base = zero_state["base_optimizer_state"]
    return base[group] if isinstance(base, list) else base["state"].get(group, {})


class SavedCheckpoint:
    """Full (tensor-parallel 1) tensors, by canonical name, of the checkpoint in ``directory``
    described by ``index`` (its param_index.json)."""

    def __init__(self, directory: str, index: Dict[str, Any]):
        self.directory = directory
        self.index = index
        self.tp_size = index["tensor_model_parallel_size"]
        self.dp_size = index["data_parallel_size"]
        self.format = index["optimizer_format"]
        self._files: Dict[str, Any] = {}
        self._ranks = {(r["pp"], r["tp"], r["dp"]): r for r in index["ranks"]}
        # canonical name -> (pp stage, local name); a tied weight is taken from its first stage
        self.sources: Dict[str, Tuple[int, str]] = {}
        for r in index["ranks"]:
            if r["dp"] != 0 or r["tp"] != 0:
                continue
            for local, p in r["params"].items():
                if p["canonical"] not in self.sources or r["pp"] < self.sources[p["canonical"]][0]:
                    self.sources[p["canonical"]] = (r["pp"], local)
        self._flat_index = {}
        for r in index["ranks"]:
            if r["dp"] == 0:
                order = [name for group in r["groups"] for name in group]
                self._flat_index[(r["pp"], r["tp"])] = {n: i for i, n in enumerate(order)}

    def _load(self, name: str) -> Any:
        if name not in self._files:
            path = os.path.join(self.directory, name)
            self._files[name] = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        return self._files[name]

    def close(self) -> None:
        """Drop the memory-mapped files."""
        self._files.clear()

    def param_info(self, canonical: str) -> Dict[str, Any]:
        """The index entry (shape, split) of ``canonical`` on saved tensor-parallel rank 0."""
        pp, local = self.sources[canonical]
        return self._ranks[(pp, 0, 0)]["params"][local]

    def full_shape(self, canonical: str) -> Tuple[int, ...]:
        """The saved full shape of ``canonical``."""
        info = self.param_info(canonical)
        return full_shape(info["shape"], info["tp_dim"], self.tp_size)

    def client_state(self, key: str) -> Optional[Dict[str, Any]]:
        """``key`` of the client state DeepSpeed saved with rank 0's model states."""
        return self._load(self._ranks[(0, 0, 0)]["model_states_file"]).get(key)

    def _zero_fragments(self, pp: int, tp: int, local: str, numel: int, kind: str) -> torch.Tensor:
        pieces = []
        for dp in range(self.dp_size):
            osd = self._load(self._ranks[(pp, tp, dp)]["optimizer_file"])["optimizer_state_dict"]
            for group, mapping in enumerate(osd["param_slice_mappings"]):
                if local in mapping:
                    address = mapping[local]
                    if kind == WEIGHT:
                        flat = osd["single_partition_of_fp32_groups"][group]
                    else:
                        flat = _base_state(osd, group)[kind]
                    pieces.append(flat.narrow(0, address.start, address.numel))
        value = torch.cat(pieces) if pieces else torch.empty(0)
        if value.numel() != numel:
            raise ReshardError(f"{self.directory}: {local} has {value.numel()} of {numel} elements "
                               "in the ZeRO partitions (incomplete checkpoint)")
        return value

    def _local(self, pp: int, tp: int, local: str, kind: str) -> torch.Tensor:
        rank = self._ranks[(pp, tp, 0)]
        info = rank["params"][local]
        shape = info["shape"]
        if self.format == ZERO_OPTIMIZER:
            return self._zero_fragments(pp, tp, local, math.prod(shape), kind).view(shape)
        if kind == WEIGHT:
            file, *keys = info["weight"]
            value = self._load(file)
            for key in keys:
                value = value[key]
            return value.float()
        state = self._load(rank["optimizer_file"])["optimizer"]["state"]
        entry = state.get(self._flat_index[(pp, tp)][local])
        if entry is None:  # never stepped
            return torch.zeros(shape)
        return entry[kind]

    def full(self, canonical: str, kind: str = WEIGHT) -> torch.Tensor:
        """The full fp32 tensor of ``kind`` (:data:`WEIGHT` or an optimizer-state key) of the
        parameter called ``canonical``."""
        pp, local = self.sources[canonical]
        info = self.param_info(canonical)
        tps = range(self.tp_size) if info["tp_dim"] is not None else range(1)
        shards = [self._local(pp, tp, self._local_name(pp, tp, canonical, local), kind)
                  for tp in tps]
        return merge_tp_shards(shards, info["tp_dim"], info["tp_stride"]).float()

    def _local_name(self, pp: int, tp: int, canonical: str, local: str) -> str:
        if tp == 0:
            return local
        names = self._ranks[(pp, tp, 0)]["params"]
        if local in names:
            return local
        return next(n for n, p in names.items() if p["canonical"] == canonical)

    def optimizer_keys(self) -> Tuple[List[str], Optional[float]]:
        """(the names of the optimizer states shaped like their parameter, the optimizer step);
        ([], None) when the checkpoint holds no optimizer state."""
        first = self._ranks[(0, 0, 0)]
        if self.format == ZERO_OPTIMIZER:
            osd = self._load(first["optimizer_file"])["optimizer_state_dict"]
            flat = osd["single_partition_of_fp32_groups"][0]
            entry = _base_state(osd, 0)
            keys = [k for k, v in entry.items() if torch.is_tensor(v) and v.dim() == 1
                    and v.numel() >= flat.numel()]
        else:  # a checkpoint written without optimizer (a Hugging Face import) has none
            optimizer = self._load(first["optimizer_file"]).get("optimizer") or {}
            entry = next(iter(optimizer.get("state", {}).values()), {})
            keys = [k for k, v in entry.items() if torch.is_tensor(v) and v.dim() > 0]
        step = entry.get("step")
        return keys, (float(step) if step is not None else None)


# ------------------------------------------------------------------ writing into this run's engine
def check_same_model(saved: SavedCheckpoint, named_params: Sequence[Tuple[str, torch.nn.Parameter]],
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


def _local_value(saved: SavedCheckpoint, name: str, p: torch.Tensor, kind: str, tp_rank: int,
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


def load_resharded(engine, saved: SavedCheckpoint, load_dir: str, load_optimizer: bool,
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
    log(f"resharded {saved.directory} (tensor-parallel {saved.tp_size}, pipeline-parallel "
        f"{saved.index['pipeline_model_parallel_size']}, data-parallel {saved.dp_size}, ZeRO stage "
        f"{saved.index['zero_stage']}) to tensor-parallel {tp_size}, pipeline-parallel "
        f"{parallel_state.get_pipeline_model_parallel_world_size()}, data-parallel "
        f"{parallel_state.get_data_parallel_world_size()}, ZeRO stage "
        f"{engine.zero_optimization_stage()}"
        + ("" if load_optimizer else " (weights only)"))
