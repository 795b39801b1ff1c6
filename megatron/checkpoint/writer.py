"""Write a full (TP=1, PP=1) ``GPTModel`` state as a training checkpoint of a given layout, in the
files DeepSpeed's engines read (the inverse of megatron/checkpoint/reader.py).

``write_checkpoint(save_dir, tensors, model_args, tp=2, pp=2)`` writes ``save_dir/iter_0000000/``
(weights only: no optimizer or scheduler, so it is loaded with ``--finetune``, or with ``--load``
when ``training_state`` is given), 
``parallel_layout.json``, ``model_args.json`` and the tracker file:

- PP=1: ``mp_rank_{t:02d}_model_states.pt`` per tensor-parallel rank t, ``["module"]`` the rank's
  ``GPTModel`` state dict (with megatron-core's empty ``_extra_state`` entries, so a strict load
  accepts it);
- PP>1: DeepSpeed's pipe files ``layer_{i:02d}-model_{t:02d}-model_states.pt`` (pipe layer i,
  megatron/model/gpt_model_pipe.py) and one ``mp_rank_{r:02d}_model_states.pt`` per
  model-parallel rank without module weights;

and, at any PP, ``param_index.json`` (the pipe layers assigned to stages in contiguous runs), so
``--load`` reshards it to any layout. Shards are cut as megatron-core cuts them
(megatron/checkpoint/shards.py ``split_full``), by the split each name implies
(megatron/model/param_names.py).

**Streaming** (``shapes=`` given, any iterable of ``(name, tensor)``): every file is first written
by ``torch.save`` with its tensor bytes left out (``torch.serialization.skip_data``: a sparse file
of the final size), then each tensor's shards are copied into their place through a shared memory
map of the file (``torch.load(mmap=True)`` under ``set_default_mmap_options(MAP_SHARED)``) as the
tensor arrives, and the mapped pages are released; the zip records' CRC-32s are set last. Memory
then holds one full tensor and its shards, never the model (checkpoint merging,
megatron/checkpoint/merge.py). ``training_state`` adds the training loop's client state, so the
checkpoint resumes with ``--load`` (e.g. ``--no-load-optim``) and not only ``--finetune``.
"""
import os
import re
import struct
import zipfile
import zlib
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

import torch

from megatron.checkpoint.engine import CLIENT_STATE_KEY
from megatron.checkpoint.format import (
    INDEX_VERSION,
    TORCH_OPTIMIZER,
    checkpoint_tag,
    write_layout,
    write_model_args,
    write_param_index,
    write_tracker,
)
from megatron.checkpoint.reader import release_file_pages
from megatron.checkpoint.shards import split_full
from megatron.errors import CheckpointError, ConfigError
from megatron.model.param_names import canonical_to_pipe_key, tensor_parallel_partition
from megatron.parallel.topology import ParallelLayout

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


def _engine_fields(module, dp_world_size: int, mp_world_size: int,
                   training_state: Optional[dict] = None) -> dict:
    """What DeepSpeed's ``save_checkpoint`` puts in ``mp_rank_*_model_states.pt``, weights only
    (with ``training_state``, also the client state our training loop saves and its step counts)."""
    import deepspeed

    fields = {"module": module, "buffer_names": [], "optimizer": None, "param_shapes": None,
              "frozen_param_shapes": None, "shared_params": {}, "frozen_param_fragments": None,
              "lr_scheduler": None, "data_sampler": None, "random_ltd": None,
              "sparse_tensor_module_names": [], "skipped_steps": 0, "global_steps": 0,
              "global_samples": 0, "dp_world_size": dp_world_size, "mp_world_size": mp_world_size,
              "ds_config": {}, "ds_version": deepspeed.__version__}
    if training_state is not None:
        fields["global_steps"] = int(training_state["iteration"])
        fields["global_samples"] = int(training_state["consumed_samples"])
        fields[CLIENT_STATE_KEY] = training_state
    return fields


def _index_entry(name: str, tensor: torch.Tensor, gated: bool, weight: List[str]) -> dict:
    partition = tensor_parallel_partition(name, gated)
    return {"canonical": name, "shape": list(tensor.shape),
            "tp_dim": partition[0] if partition else None,
            "tp_stride": partition[1] if partition else 1, "weight": weight}


def _stage_of_layers(num_pipe_layers: int, pp: int) -> List[int]:
    """The pipeline stage of each pipe layer: contiguous runs, as even as they divide."""
    return [layer * pp // num_pipe_layers for layer in range(num_pipe_layers)]


def _write_index(directory: str, shards: List[Dict[str, torch.Tensor]], gated: bool, pp: int,
                 num_layers: int) -> None:
    """``param_index.json`` (megatron/checkpoint/engine_index.py's format) of the written files,
    so ``--load`` reshards the checkpoint to any other layout (megatron/checkpoint/reshard.py);
    there is no optimizer state (weights only, loaded with ``--finetune``)."""
    tp = len(shards)
    ranks = []
    if pp == 1:
        for rank, state in enumerate(shards):
            model_file = f"mp_rank_{rank:02d}_model_states.pt"
            params = {name: _index_entry(name, tensor, gated, [model_file, "module", name])
                      for name, tensor in state.items()}
            ranks.append({"tp": rank, "pp": 0, "dp": 0, "model_states_file": model_file,
                          "optimizer_file": model_file, "groups": [list(state)], "params": params})
    else:
        stage_of = _stage_of_layers(num_layers + 3, pp)
        for stage in range(pp):
            for rank, state in enumerate(shards):
                model_file = f"mp_rank_{stage * tp + rank:02d}_model_states.pt"
                params = {}
                for name, tensor in state.items():
                    layer, key = canonical_to_pipe_key(name, num_layers)
                    if stage_of[layer] == stage:
                        layer_file = f"layer_{layer:02d}-model_{rank:02d}-model_states.pt"
                        params[f"{layer}.{key}"] = _index_entry(name, tensor, gated,
                                                                [layer_file, key])
                ranks.append({"tp": rank, "pp": stage, "dp": 0, "model_states_file": model_file,
                              "optimizer_file": model_file, "groups": [list(params)],
                              "params": params})
    write_param_index(directory, {
        "version": INDEX_VERSION, "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp, "data_parallel_size": 1, "zero_stage": 0,
        "optimizer_format": TORCH_OPTIMIZER, "ranks": ranks})


def _split(name: str, full: torch.Tensor, gated: bool, tp: int) -> List[torch.Tensor]:
    """The ``tp`` shards of ``full`` as megatron-core cuts them (replicated: ``full`` itself)."""
    partition = tensor_parallel_partition(name, gated)
    return split_full(full, *partition, tp) if partition and tp > 1 else [full] * tp


def _checkpoint_files(shards: List[Dict[str, torch.Tensor]], tp: int, pp: int, num_layers: int,
                      training_state: Optional[dict]) -> Iterator[Tuple[str, Any]]:
    """``(file name, object to torch.save)`` of every model file of the layout, in writing order."""
    if pp == 1:
        for rank in range(tp):
            module = dict(shards[rank])
            module.update(_extra_state_keys(module))
            yield (f"mp_rank_{rank:02d}_model_states.pt",
                   _engine_fields(module, 1, tp, training_state))
        return
    for rank in range(tp):
        layers: Dict[int, dict] = {}
        for name, tensor in shards[rank].items():
            index, key = canonical_to_pipe_key(name, num_layers)
            layers.setdefault(index, {})[key] = tensor
        for index, state in layers.items():
            # megatron-core's linear layers' empty extra state, as the pipe modules save it
            state.update({key.rsplit(".", 1)[0] + "._extra_state": None for key in list(state)
                          if re.search(r"(\.linear_\w+|^output_layer)\.weight$", key)})
            if index == 0:
                state["output_projection._extra_state"] = None
            yield f"layer_{index:02d}-model_{rank:02d}-model_states.pt", state
    for rank in range(tp * pp):
        yield (f"mp_rank_{rank:02d}_model_states.pt",
               _engine_fields(None, 1, tp * pp, training_state))


def _location(name: str, rank: int, pp: int, num_layers: int) -> Tuple[str, Tuple[str, ...]]:
    """(file, keys inside it) of tensor-parallel rank ``rank``'s shard of ``name``."""
    if pp == 1:
        return f"mp_rank_{rank:02d}_model_states.pt", ("module", name)
    index, key = canonical_to_pipe_key(name, num_layers)
    return f"layer_{index:02d}-model_{rank:02d}-model_states.pt", (key,)


def _check_divisible(name: str, shape: Tuple[int, ...], gated: bool, tp: int) -> None:
    partition = tensor_parallel_partition(name, gated)
    if partition and tp > 1 and shape[partition[0]] % (partition[1] * tp):
        raise ConfigError(f"tensor-parallel size {tp} does not divide {name} "
                          f"{list(shape)} along dim {partition[0]}"
                          + (" (in gate and up halves)" if partition[1] > 1 else ""))


def _open_shared(path: str) -> dict:
    """The model file ``path`` loaded memory-mapped with a *shared* mapping: writing its tensors
    writes the file."""
    import mmap

    with torch.serialization.set_default_mmap_options(mmap.MAP_SHARED):
        return torch.load(path, map_location="cpu", mmap=True, weights_only=False)


def _rewrite_zip_crcs(path: str) -> None:
    """Set the CRC-32 of every record of the torch zip file ``path`` whose bytes were written
    after ``torch.save`` (in its central directory and its data descriptor or local header), so the
    file is a valid zip archive, as ``torch.save`` writes it."""
    with zipfile.ZipFile(path) as archive:
        infos, start_dir = archive.infolist(), archive.start_dir
    with open(path, "r+b") as f:
        central, position = {}, start_dir
        for _ in infos:
            f.seek(position)
            head = f.read(46)
            if struct.unpack_from("<I", head, 0)[0] != 0x02014B50:
                raise CheckpointError(f"{path}: unexpected zip central directory")
            n, e, c = struct.unpack_from("<HHH", head, 28)
            central[f.read(n).decode("utf-8")] = position + 16
            position += 46 + n + e + c
        for info in infos:
            f.seek(info.header_offset)
            local = f.read(30)
            flags = struct.unpack_from("<H", local, 6)[0]
            n, e = struct.unpack_from("<HH", local, 26)
            data = info.header_offset + 30 + n + e
            f.seek(data)
            crc, remaining = 0, info.compress_size
            while remaining:
                chunk = f.read(min(remaining, 1 << 24))
                crc, remaining = zlib.crc32(chunk, crc), remaining - len(chunk)
            if crc == info.CRC:
                continue
            packed = struct.pack("<I", crc)
            f.seek(central[info.filename])
            f.write(packed)
            if flags & 0x08:  # a data descriptor after the data (optionally with its signature)
                f.seek(data + info.compress_size)
                signed = f.read(4) == b"PK\x07\x08"
                f.seek(data + info.compress_size + (4 if signed else 0))
            else:
                f.seek(info.header_offset + 14)
            f.write(packed)


def _write_streamed(directory: str, tensors: Iterable[Tuple[str, torch.Tensor]],
                    shapes: Mapping[str, Tuple[Sequence[int], torch.dtype]], gated: bool, tp: int,
                    pp: int, num_layers: int, training_state: Optional[dict]
                    ) -> List[Dict[str, torch.Tensor]]:
    """Write the model files of ``shapes`` with their bytes left out (``torch.save`` under
    ``torch.serialization.skip_data``), then fill each tensor in place through a shared memory map
    as ``tensors`` yields it, releasing its pages once written; returns the shards' shapes (meta
    tensors) for the index."""
    plan = {name: (tuple(int(s) for s in shape), dtype) for name, (shape, dtype) in shapes.items()}
    meta = [{} for _ in range(tp)]
    for name, (shape, dtype) in plan.items():
        _check_divisible(name, shape, gated, tp)
        parts = _split(name, torch.empty(shape, dtype=dtype, device="meta"), gated, tp)
        for rank in range(tp):
            meta[rank][name] = parts[rank]
    # placeholders: allocated, never touched (no resident memory), bytes not written
    placeholders = [{n: torch.empty(t.shape, dtype=t.dtype) for n, t in m.items()} for m in meta]
    pending: Dict[str, int] = {}
    with torch.serialization.skip_data():
        for filename, obj in _checkpoint_files(placeholders, tp, pp, num_layers, training_state):
            torch.save(obj, os.path.join(directory, filename))
    del placeholders
    for name in plan:
        for rank in range(tp):
            filename = _location(name, rank, pp, num_layers)[0]
            pending[filename] = pending.get(filename, 0) + 1
    opened: Dict[str, dict] = {}
    written = set()
    for name, full in tensors:
        if name not in plan:
            raise ValueError(f"{name} is not among the tensors announced in shapes")
        if name in written:
            raise ValueError(f"{name} was given twice")
        shape, dtype = plan[name]
        if tuple(full.shape) != shape or full.dtype.is_floating_point != dtype.is_floating_point:
            raise ValueError(f"{name} is {list(full.shape)} {full.dtype}; shapes announced "
                             f"{list(shape)} {dtype}")
        if full.dtype != dtype and tp > 1 and tensor_parallel_partition(name, gated):
            full = full.to(dtype)  # cast before the shards are cut (smaller copies)
        for rank, part in enumerate(_split(name, full, gated, tp)):
            filename, keys = _location(name, rank, pp, num_layers)
            if filename not in opened:
                opened[filename] = _open_shared(os.path.join(directory, filename))
            target = opened[filename]
            for key in keys:
                target = target[key]
            target.copy_(part)  # casts to the announced dtype
            release_file_pages(target)  # a shared mapping: the data stays in the file
            del target, part
            pending[filename] -= 1
            if pending[filename] == 0:
                del opened[filename]  # unmapped
        written.add(name)
        del full  # not held while the next tensor is made
    opened.clear()
    missing = [name for name in plan if name not in written]
    if missing:
        raise ValueError(f"{len(missing)} tensors announced in shapes were not given "
                         f"(first: {missing[0]}); {directory} is incomplete")
    for filename in pending:
        _rewrite_zip_crcs(os.path.join(directory, filename))
    return meta


def write_checkpoint(save_dir: str,
                     tensors: Union[Mapping[str, torch.Tensor], Iterable[Tuple[str, torch.Tensor]]],
                     model_args: dict, tp: int = 1, pp: int = 1, iteration: int = 0,
                     shapes: Optional[Mapping[str, Tuple[Sequence[int], torch.dtype]]] = None,
                     training_state: Optional[dict] = None) -> str:
    """Write ``tensors`` (full canonical ``GPTModel`` parameters) as the checkpoint of
    ``iteration`` under ``save_dir`` with tensor-parallel size ``tp`` and pipeline-parallel size
    ``pp`` (see the module docstring); returns the ``iter_*`` directory.

    ``tensors`` is a dict of every tensor (all held in memory while the shards are cut) or, given
    ``shapes`` (canonical name -> (full shape, dtype) of every tensor, known before the first is
    written), any iterable of ``(name, full tensor)`` pairs in any order: **streamed**, each tensor
    written into its place in the files as it comes (cast to the dtype of ``shapes``), so memory
    holds one tensor (and its shards) at a time. Both give the same files. ``training_state`` (the
    ``megatron/checkpoint/engine.py`` training state: iteration, consumed samples, extra client
    state such as the scheduler) goes into the model-states files as a training run's save puts
    it, so ``--load`` without ``--finetune`` (e.g. ``--no-load-optim``) continues from it."""
    directory = os.path.join(save_dir, checkpoint_tag(iteration))
    os.makedirs(directory, exist_ok=True)
    gated = bool(model_args["model"].get("swiglu"))
    num_layers = int(model_args["model"]["num_layers"])
    if shapes is not None:
        pairs = tensors.items() if isinstance(tensors, Mapping) else tensors
        shards = _write_streamed(directory, pairs, shapes, gated, tp, pp, num_layers,
                                 training_state)
    else:
        shards = [{} for _ in range(tp)]
        for name, full in tensors.items():
            parts = _split(name, full, gated, tp)
            for rank in range(tp):
                shards[rank][name] = parts[rank].contiguous()
        for filename, obj in _checkpoint_files(shards, tp, pp, num_layers, training_state):
            torch.save(obj, os.path.join(directory, filename))
    _write_index(directory, shards, gated, pp, num_layers)
    write_layout(directory, ParallelLayout(tp=tp, pp=pp, dp=1, world=tp * pp))
    write_model_args(directory, model_args)
    write_tracker(save_dir, iteration)
    return directory
