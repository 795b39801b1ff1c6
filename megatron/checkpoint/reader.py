"""The one reader of training checkpoints: full (tensor-parallel 1) tensors by canonical name, of a
checkpoint of any layout, one tensor at a time.

:class:`CheckpointReader` opens ``DIR/iter_NNNNNNN/`` written with any tensor-parallel (TP),
pipeline-parallel (PP) and data-parallel size and ZeRO stage 0-2. It serves

- **the model's weights as stored** (:meth:`CheckpointReader.items`, :meth:`~CheckpointReader.tensor`:
  the training dtype, bf16 runs give bf16), for the Hugging Face export, the evaluation tasks and
  checkpoint merging, with the model flags the checkpoint recorded (``model_args.json``)::

      with CheckpointReader("runs/ckpt") as reader:        # latest iteration, or iteration=N
          reader.model_args["model"]["hidden_size"]        # the recorded model flags (or None)
          for name, tensor in reader.items():              # streams, full TP=1 tensors
              ...

- **what a resume on another layout needs** (:meth:`~CheckpointReader.full`: the fp32 master
  weights and the optimizer states shaped like their parameter, :meth:`~CheckpointReader.client_state`),
  located by the checkpoint's ``param_index.json`` (megatron/checkpoint/engine_index.py), which
  megatron/checkpoint/reshard.py writes into this run's engine.

Names are canonical (megatron/model/param_names.py): a pipe stage's names and Transformer
Engine's fused norm names read as the local-spec ``GPTModel``'s. Tensor-parallel shards are merged
as megatron-core splits them (megatron/checkpoint/shards.py), by the split ``param_index.json``
records for each parameter (its ``partition_dim``/``partition_stride`` when saved); a checkpoint
without an index (older ones, Hugging Face imports of old) is split by name
(``param_names.tensor_parallel_partition``). The vocabulary keeps the checkpoint's padded rows.

Files read (DeepSpeed's names; data-parallel rank 0 writes the model states of each model-parallel
rank, so the data-parallel size does not matter):

- PP=1: ``mp_rank_{t:02d}_model_states.pt``, ``["module"]`` = tensor-parallel rank t's
  ``GPTModel`` state dict.
- PP>1 (DeepSpeed's pipe engine): ``layer_{i:02d}-model_{t:02d}-model_states.pt``, pipe layer i of
  tensor-parallel rank t (megatron/model/gpt_model_pipe.py): 0 the embedding, 1..L the transformer
  layers, L+1 the final norm, L+2 the untied output layer (a tied output layer is the embedding).

Files are opened with ``torch.load(mmap=True)``, so only the tensors asked for are read, one at a
time (optimizer states in the same files are never touched); once a full tensor is built, the file
pages of its shards are released (``madvise(MADV_DONTNEED)`` on the read-only mapping: they are
re-read from the file if asked again), so peak memory stays near the largest tensor, not the whole
checkpoint (:func:`shape` and :func:`dtype` read no data at all). The weights are the module's (the training dtype: bf16
runs give bf16); ZeRO stage 3 checkpoints keep no module weights and are refused.

Tensor-parallel shards are merged as megatron-core splits them (``partition_dim`` /
``partition_stride``, megatron/model/init.py): vocabulary rows (embedding, output layer), QKV
rows (grouped per query group, groups split whole over ranks, so shards concatenate) and fc1
rows along dim 0; with SwiGLU each fc1 shard is ``[gate_t; up_t]`` (stride 2), so gates and ups
are gathered separately into ``[gate; up]``; ``linear_proj``/``linear_fc2`` weights along dim 1;
everything else is replicated (taken from rank 0). The vocabulary keeps the checkpoint's padded
rows (``padded_vocab_size``, which Megatron pads to a multiple of divisor x TP).
"""
import os
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch

from megatron.checkpoint.expert_weights import EXPERT_FILE
from megatron.checkpoint.format import (
    ZERO_OPTIMIZER,
    read_layout,
    read_model_args,
    read_param_index,
    resolve_checkpoint,
)
from megatron.checkpoint.shards import full_shape, merge_shards, merge_tp_shards
from megatron.errors import CheckpointError, ReshardError
from megatron.model.param_names import (
    EMBEDDING,
    canonical_weight_name,
    gpt_order,
    pipe_key_to_canonical,
    tensor_parallel_partition,
)
from megatron.parallel.topology import ParallelLayout

_LAYER_FILE = re.compile(r"^layer_(\d+)-model_(\d+)-model_states\.pt$")
WEIGHT = "weight"  # the kind of the fp32 master value, beside the optimizer-state keys
MODEL_STATES = "mp_rank_00_model_states.pt"


def _libc():
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        return libc
    except (OSError, AttributeError):  # no libc madvise (not Linux): pages stay until unmapped
        return None


_LIBC = _libc()
_MADV_DONTNEED = 4


def release_file_pages(tensor: torch.Tensor) -> None:
    """Drop the resident pages of a tensor loaded with ``torch.load(mmap=True)`` (a private,
    never-written file mapping: the kernel re-reads them from the file on the next access), so
    reading a checkpoint tensor by tensor does not accumulate the whole file in memory. Only for
    memory-mapped tensors: on ordinary memory this would discard data."""
    if _LIBC is None or tensor.numel() == 0:
        return
    import mmap

    storage = tensor.untyped_storage()
    start, size = storage.data_ptr(), storage.nbytes()
    low = start // mmap.PAGESIZE * mmap.PAGESIZE
    high = -(-(start + size) // mmap.PAGESIZE) * mmap.PAGESIZE
    _LIBC.madvise(low, high - low, _MADV_DONTNEED)


def _base_state(zero_state: Dict[str, Any], group: int) -> Dict[str, Any]:
    """The torch optimizer state of flat group ``group`` in a ZeRO optimizer state dict (a torch
    ``state_dict``, or a list per group with ``elastic_checkpoint``)."""
    base = zero_state["base_optimizer_state"]
    return base[group] if isinstance(base, list) else base["state"].get(group, {})


class CheckpointReader:
    """Full (TP=1, PP=1) tensors of a checkpoint of any layout (see the module docstring).
    ``load_dir`` is a ``--save`` directory; ``iteration`` defaults to the latest (or give the
    ``iter_*`` ``directory`` itself). Attributes: ``directory``, ``iteration``, ``layout``
    (:class:`ParallelLayout` written with it), ``model_args`` (the ``model_args.json`` record or
    None), ``index`` (``param_index.json`` or None), ``names`` (canonical parameter names in
    ``GPTModel`` order). The weight files are checked and indexed on construction unless
    ``weights`` is False (a resume reads through the index only). Use as a context manager or call
    :meth:`close` to unmap the files."""

    def __init__(self, load_dir: str, iteration: Optional[int] = None,
                 directory: Optional[str] = None, weights: bool = True,
                 index: Optional[Dict[str, Any]] = None):
        self.load_dir = load_dir
        if directory is None:
            self.directory, self.iteration = resolve_checkpoint(load_dir, iteration)
        else:
            self.directory = directory
            tail = os.path.basename(directory.rstrip("/"))
            self.iteration = int(tail[len("iter_"):]) if re.fullmatch(r"iter_\d+", tail) else None
        self.layout = read_layout(self.directory) or ParallelLayout(tp=1, pp=1, dp=1, world=1)
        self.model_args = read_model_args(self.directory)
        self.index = index if index is not None else read_param_index(self.directory)
        self._files: Dict[str, Any] = {}
        self._index_params()
        # canonical name -> [(file, key in that file)] per tensor-parallel rank
        self._where: Dict[str, List[Tuple[str, str]]] = {}
        self._expert_files: set = set()
        self.names: List[str] = []
        if weights:
            self._index_weights()

    @classmethod
    def at(cls, directory: str, index: Optional[Dict[str, Any]] = None) -> "CheckpointReader":
        """A reader of the ``iter_*`` ``directory`` through its parameter index only (``index``,
        else its ``param_index.json``): what a resume on another layout reads."""
        return cls(os.path.dirname(directory.rstrip("/")), directory=directory, weights=False,
                   index=index)

    # ------------------------------------------------------------------ files
    def _load_raw(self, filename: str) -> Any:
        if filename not in self._files:
            path = os.path.join(self.directory, filename)
            self._files[filename] = torch.load(path, map_location="cpu", mmap=True,
                                               weights_only=False)
        return self._files[filename]

    def _load(self, filename: str) -> dict:
        try:
            return self._load_raw(filename)
        except Exception as e:
            path = os.path.join(self.directory, filename)
            raise CheckpointError(f"--load {self.load_dir}: {path} is corrupt or not a torch "
                                  f"checkpoint ({type(e).__name__}: "
                                  f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None

    def close(self) -> None:
        """Unmap every checkpoint file."""
        self._files.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ the parameter index
    def _index_params(self) -> None:
        """Canonical name -> where the index puts it (``sources``), per saved rank."""
        self.sources: Dict[str, Tuple[int, str, int]] = {}
        self._ranks: Dict[Tuple[int, int, int], Dict[str, Any]] = {}
        self._flat_index: Dict[Tuple[int, int, int], Dict[str, int]] = {}
        if self.index is None:
            return
        index = self.index
        self.tp_size = index["tensor_model_parallel_size"]
        self.dp_size = index["data_parallel_size"]
        self.ep_size = index.get("expert_model_parallel_size", 1)
        # ranks each replica's ZeRO partitions are spread over (data x Ulysses sequence parallel)
        self.zero_partitions = self.dp_size * index.get("sequence_parallel_size", 1)
        self.format = index["optimizer_format"]
        for r in index["ranks"]:
            self._ranks[(r["pp"], r["tp"], r["dp"])] = r
            for p in r.get("params", {}).values():  # Transformer Engine names read as local ones
                p["canonical"] = canonical_weight_name(p["canonical"]) or p["canonical"]
        # canonical name -> (pp stage, local name, data-parallel rank of the record); a tied
        # weight is taken from its first stage; the experts of expert-parallel rank e from the
        # record of data-parallel rank e
        for r in index["ranks"]:
            if r["tp"] != 0 or "params" not in r:
                continue
            for local, p in r["params"].items():
                known = self.sources.get(p["canonical"])
                if known is None or (r["pp"], r["dp"]) < (known[0], known[2]):
                    self.sources[p["canonical"]] = (r["pp"], local, r["dp"])
        for r in index["ranks"]:
            if "groups" in r:
                order = [name for group in r["groups"] for name in group]
                self._flat_index[(r["pp"], r["tp"], r["dp"])] = {n: i for i, n in enumerate(order)}

    def param_info(self, canonical: str) -> Dict[str, Any]:
        """The index entry (shape, split) of ``canonical`` on saved tensor-parallel rank 0."""
        pp, local, dp = self.sources[canonical]
        return self._ranks[(pp, 0, dp)]["params"][local]

    def full_shape(self, canonical: str) -> Tuple[int, ...]:
        """The saved full shape of ``canonical`` (from the index)."""
        info = self.param_info(canonical)
        return full_shape(info["shape"], info["tp_dim"], self.tp_size)

    def client_state(self, key: str) -> Optional[Dict[str, Any]]:
        """``key`` of the client state DeepSpeed saved with rank 0's model states."""
        return self._load_raw(self._ranks[(0, 0, 0)]["model_states_file"]).get(key)

    def _zero_fragments(self, pp: int, tp: int, local: str, numel: int, kind: str,
                        expert_rank: Optional[int] = None) -> torch.Tensor:
        """The ZeRO partitions' pieces of ``local``, in partition order: over every data-parallel
        rank, or for an expert of expert-parallel rank ``expert_rank`` over the ranks holding its
        experts (its expert-data-parallel group: ``dp mod E == expert_rank``)."""
        pieces = []
        for dp in range(self.zero_partitions):
            if expert_rank is not None and dp % self.ep_size != expert_rank:
                continue
            osd = self._load_raw(self._ranks[(pp, tp, dp)]["optimizer_file"])["optimizer_state_dict"]
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

    def _local(self, pp: int, tp: int, local: str, kind: str, dp: int = 0) -> torch.Tensor:
        rank = self._ranks[(pp, tp, dp)]
        info = rank["params"][local]
        shape = info["shape"]
        if self.format == ZERO_OPTIMIZER:
            numel = 1
            for size in shape:
                numel *= size
            expert_rank = dp % self.ep_size if info.get("expert") else None
            return self._zero_fragments(pp, tp, local, numel, kind, expert_rank).view(shape)
        if kind == WEIGHT:
            file, *keys = info["weight"]
            value = self._load_raw(file)
            for key in keys:
                value = value[key]
            return value.float()
        state = self._load_raw(rank["optimizer_file"])["optimizer"]["state"]
        entry = state.get(self._flat_index[(pp, tp, dp)][local])
        if entry is None:  # never stepped
            return torch.zeros(shape)
        return entry[kind]

    def full(self, canonical: str, kind: str = WEIGHT) -> torch.Tensor:
        """The full fp32 tensor of ``kind`` (:data:`WEIGHT`, the master weight, or an
        optimizer-state key) of the parameter called ``canonical``, located by the index."""
        pp, local, dp = self.sources[canonical]
        info = self.param_info(canonical)
        tps = range(self.tp_size) if info["tp_dim"] is not None else range(1)
        shards = [self._local(pp, tp, self._local_name(pp, tp, canonical, local, dp), kind, dp)
                  for tp in tps]
        return merge_tp_shards(shards, info["tp_dim"], info["tp_stride"]).float()

    def _local_name(self, pp: int, tp: int, canonical: str, local: str, dp: int = 0) -> str:
        if tp == 0:
            return local
        names = self._ranks[(pp, tp, dp)]["params"]
        if local in names:
            return local
        return next(n for n, p in names.items() if p["canonical"] == canonical)

    def optimizer_keys(self) -> Tuple[List[str], Optional[float]]:
        """(the names of the optimizer states shaped like their parameter, the optimizer step);
        ([], None) when the checkpoint holds no optimizer state."""
        first = self._ranks[(0, 0, 0)]
        if self.format == ZERO_OPTIMIZER:
            osd = self._load_raw(first["optimizer_file"])["optimizer_state_dict"]
            flat = osd["single_partition_of_fp32_groups"][0]
            entry = _base_state(osd, 0)
            keys = [k for k, v in entry.items() if torch.is_tensor(v) and v.dim() == 1
                    and v.numel() >= flat.numel()]
        else:  # a checkpoint written without optimizer (a Hugging Face import) has none
            optimizer = self._load_raw(first["optimizer_file"]).get("optimizer") or {}
            entry = next(iter(optimizer.get("state", {}).values()), {})
            keys = [k for k, v in entry.items() if torch.is_tensor(v) and v.dim() > 0]
        step = entry.get("step")
        return keys, (float(step) if step is not None else None)

    # ------------------------------------------------------------------ the stored weights
    def _index_weights(self) -> None:
        files = os.listdir(self.directory)
        self._check_zero_stage(files)
        tp = self.layout.tp
        layer_files = {}
        for f in files:
            m = _LAYER_FILE.match(f)
            if m:
                layer_files[(int(m.group(1)), int(m.group(2)))] = f
        if layer_files:
            self._index_expert_files(files)
            self._index_pipe(layer_files, tp)
        else:
            self._index_plain(files, tp)
        if not self._where:
            raise CheckpointError(f"--load {self.load_dir}: checkpoint {self.directory} holds no "
                                  "model weights")
        # experts of other expert-parallel ranks come from their own files: back into layer order
        self.names = sorted(self._where, key=gpt_order) if self._expert_files else list(self._where)

    def _check_zero_stage(self, files: List[str]) -> None:
        first = sorted(f for f in files if f.startswith("mp_rank_") and f.endswith("_model_states.pt"))
        if not first:
            raise CheckpointError(f"--load {self.load_dir}: checkpoint {self.directory} is "
                                  "incomplete (no mp_rank_*_model_states.pt file)")
        config = self._load(first[0]).get("ds_config") or {}
        stage = (config.get("zero_optimization") or {}).get("stage", 0)
        if stage == 3:
            raise CheckpointError(
                f"--load {self.load_dir}: checkpoint {self.directory} was written with ZeRO stage 3, "
                "which keeps no module weights in mp_rank_*_model_states.pt; read it with "
                "DeepSpeed's zero_to_fp32.py (TP=1) or train with --zero-stage 0-2")

    def _index_plain(self, files: List[str], tp: int) -> None:
        self._index_expert_files(files)
        for rank in range(tp):
            filename = f"mp_rank_{rank:02d}_model_states.pt"
            if filename not in files:
                raise CheckpointError(f"--load {self.load_dir}: checkpoint {self.directory} "
                                      f"(tensor-parallel size {tp}) lacks {filename}")
            module = self._load(filename).get("module")
            if not isinstance(module, dict):
                raise CheckpointError(f"--load {self.load_dir}: {filename} in {self.directory} "
                                      "holds no module state")
            for key, value in module.items():
                name = canonical_weight_name(key)
                if name is not None and torch.is_tensor(value):
                    self._where.setdefault(name, []).append((filename, key))

    def _index_expert_files(self, files: List[str]) -> None:
        """The experts of expert-parallel ranks >= 1 (megatron/checkpoint/expert_weights.py),
        listed by tensor-parallel rank like DeepSpeed's files (canonical names are their keys)."""
        for filename in sorted(f for f in files if EXPERT_FILE.match(f)):
            self._expert_files.add(filename)
            for key, value in self._load(filename)["module"].items():
                if torch.is_tensor(value):
                    self._where.setdefault(key, []).append((filename, key))

    def _index_pipe(self, layer_files: Dict[Tuple[int, int], str], tp: int) -> None:
        for layer in sorted({i for i, _ in layer_files}):
            for rank in range(tp):
                filename = layer_files.get((layer, rank))
                if filename is None:
                    raise CheckpointError(
                        f"--load {self.load_dir}: checkpoint {self.directory} (tensor-parallel "
                        f"size {tp}) lacks layer_{layer:02d}-model_{rank:02d}-model_states.pt")
                for key, value in self._load(filename).items():
                    name = pipe_key_to_canonical(layer, key)
                    if name is not None and torch.is_tensor(value):
                        self._where.setdefault(name, []).append((filename, key))
            # layer files are small: drop this layer's mappings once indexed (reopened on read)
            self._files = {k: v for k, v in self._files.items() if not _LAYER_FILE.match(k)}
        names = sorted(self._where, key=gpt_order)
        self._where = {n: self._where[n] for n in names}

    def tensor(self, name: str) -> torch.Tensor:
        """The full (tensor-parallel shards merged) stored weight called ``name``."""
        places = self._where.get(name)
        if places is None:
            raise KeyError(f"{name} is not a parameter of checkpoint {self.directory}")
        if len(places) != self.layout.tp:
            raise CheckpointError(f"--load {self.load_dir}: {name} is in {len(places)} of the "
                                  f"{self.layout.tp} tensor-parallel files of {self.directory}")
        shards = [self._tensors_of(f)[k] for f, k in places]
        partition = self._partition(name)
        if partition is None or len(shards) == 1:
            full = shards[0].clone()
        else:
            full = merge_shards(shards, *partition)
        for shard in shards:
            release_file_pages(shard)
        return full

    def _partition(self, name: str) -> Optional[Tuple[int, int]]:
        """``(dim, stride)`` of ``name``'s tensor-parallel split, None when replicated: the
        index's record of the live parameter where there is one, else by name."""
        if self.layout.tp == 1:
            return None
        if name in self.sources:
            info = self.param_info(name)
            return None if info["tp_dim"] is None else (info["tp_dim"], info["tp_stride"])
        gated = name.endswith((".linear_fc1.weight", ".linear_fc1.bias")) \
            and self._fc1_stride(name) == 2
        return tensor_parallel_partition(name, gated)

    def shape(self, name: str) -> Tuple[int, ...]:
        """The full shape of stored weight ``name`` (from the shards' metadata; no data is read)."""
        shards = [self._tensors_of(f)[k].shape for f, k in self._where[name]]
        partition = self._partition(name)
        if partition is None:
            return tuple(shards[0])
        full = list(shards[0])
        full[partition[0]] = sum(s[partition[0]] for s in shards)
        return tuple(full)

    def dtype(self, name: str) -> torch.dtype:
        """The dtype of ``name`` as stored."""
        f, k = self._where[name][0]
        return self._tensors_of(f)[k].dtype

    def _tensors_of(self, filename: str) -> dict:
        """The name -> tensor dict of a model file; pipe layer files stay open for one layer at a
        time (keeps few files mapped)."""
        layer = _LAYER_FILE.match(filename)
        if layer is None:
            return self._load(filename)["module"]
        for other in [k for k in self._files if _LAYER_FILE.match(k)]:
            if _LAYER_FILE.match(other).group(1) != layer.group(1):
                del self._files[other]
        return self._load(filename)

    def _fc1_stride(self, fc1_name: str) -> int:
        """2 when fc1 is gated (SwiGLU: its rows are twice fc2's input width), else 1."""
        prefix = fc1_name.rsplit(".linear_fc1.", 1)[0]
        fc2 = self._where[f"{prefix}.linear_fc2.weight"][0]
        fc1 = self._where[f"{prefix}.linear_fc1.weight"][0]
        return self._tensors_of(fc1[0])[fc1[1]].shape[0] // self._tensors_of(fc2[0])[fc2[1]].shape[1]

    def items(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """``(canonical name, full tensor)`` for every parameter (embedding, layers by number,
        final norm, output layer), one tensor built at a time."""
        for name in self.names:
            yield name, self.tensor(name)

    def state_dict(self) -> Dict[str, torch.Tensor]:
        """All full tensors in one dict (holds the whole model; prefer :meth:`items`)."""
        return dict(self.items())


def load_full_state_dict(load_dir: str, iteration: Optional[int] = None
                         ) -> Tuple[Dict[str, torch.Tensor], Optional[dict]]:
    """``(full TP=1/PP=1 GPTModel parameters by canonical name, model_args.json record or None)``
    of the checkpoint in ``load_dir`` (latest iteration unless ``iteration``)."""
    with CheckpointReader(load_dir, iteration) as reader:
        return reader.state_dict(), reader.model_args


def checkpoint_iteration_dir(load: str, iteration: Optional[int] = None) -> str:
    """``DIR/iter_NNNNNNN`` of ``--load DIR`` (the tracker's iteration unless ``iteration``), or
    ``load`` itself when it is a file. A missing directory, tracker or iteration is a
    ``CheckpointError`` naming ``--load``, ``--load-iteration`` and the path."""
    if os.path.isfile(load):
        return load
    if not os.path.isdir(load):
        raise CheckpointError(f"--load {load}: no such checkpoint directory or file")
    return resolve_checkpoint(load, iteration, iteration_flag="--load-iteration")[0]


class CheckpointWeights:
    """The full (TP=1, PP=1) weights of ``--load`` for a tensor- and pipeline-parallel size 1
    model (the evaluation tasks, tasks/checkpoint_model.py): a ``--save`` directory read by
    :class:`CheckpointReader` (``DIR/latest_checkpointed_iteration.txt``'s iteration, or
    ``iteration``), or a TP=1/PP=1 model-states file (``.../mp_rank_00_model_states.pt``: its
    ``module`` weights). A context manager; ``source`` names what is read (the ``iter_*``
    directory or the file)."""

    def __init__(self, load: str, iteration: Optional[int] = None):
        self.load = load
        self.source = checkpoint_iteration_dir(load, iteration)
        self._reader = None
        self._module = None
        if os.path.isfile(self.source):
            try:
                state = torch.load(self.source, map_location="cpu", mmap=True, weights_only=False)
            except Exception as e:
                raise CheckpointError(f"--load {load}: {self.source} is not a torch checkpoint "
                                      f"({type(e).__name__})") from None
            module = state.get("module", state) if isinstance(state, dict) else None
            if not isinstance(module, dict):
                raise CheckpointError(f"--load {load}: {self.source} holds no module weights")
            self._module = {k: v for k, v in module.items() if torch.is_tensor(v)}
        else:
            self._reader = CheckpointReader(os.path.dirname(self.source),
                                            int(self.source.rsplit("_", 1)[1]))

    def items(self) -> Iterator[Tuple[str, torch.Tensor]]:
        """``(GPTModel parameter name, full tensor)`` pairs, one tensor built at a time."""
        return self._reader.items() if self._reader is not None else iter(self._module.items())

    def vocab_rows(self) -> Optional[int]:
        """Embedding rows (the padded vocabulary size) of the checkpoint, or None if unknown."""
        if self._reader is not None:
            recorded = (self._reader.model_args or {}).get("padded_vocab_size")
            if recorded:
                return int(recorded)
            return int(self._reader.tensor(EMBEDDING).shape[0]) if EMBEDDING in \
                self._reader.names else None
        weight = self._module.get(EMBEDDING)
        return None if weight is None else int(weight.shape[0])

    def real_vocab_rows(self) -> Optional[int]:
        """Vocabulary rows that take probability: the ``vocab_size`` the checkpoint's
        ``model_args.json`` records; every row for a ``model_args.json`` written before the
        padding rows were masked (its training softmax covered them); None (the tokenizer's
        vocabulary, as training here does) when nothing is recorded (a model-states file)."""
        if self._reader is None or self._reader.model_args is None:
            return None
        recorded = self._reader.model_args.get("vocab_size")
        return int(recorded) if recorded else self.vocab_rows()

    @torch.no_grad()
    def copy_into(self, model: torch.nn.Module) -> None:
        """Copy every weight into ``model`` (cast to its dtype); a CheckpointError when a weight
        is missing on either side or has another shape (the model flags differ)."""
        own = {canonical_weight_name(k) or k: v for k, v in model.state_dict().items()
               if torch.is_tensor(v)}
        seen, shapes, unexpected = set(), [], []
        for name, tensor in self.items():
            target = own.get(name)
            if target is None:
                unexpected.append(name)
            elif tensor.shape != target.shape:
                shapes.append(f"{name}: checkpoint {list(tensor.shape)}, model "
                              f"{list(target.shape)}")
            else:
                target.copy_(tensor)
                seen.add(name)
        if shapes:
            raise CheckpointError(
                f"--load {self.load}: {self.source} does not fit the model flags (--hidden-size, "
                f"--num-attention-heads, --ffn-hidden-size, ...): {len(shapes)} weights differ in "
                f"shape, e.g. {'; '.join(shapes[:3])}")
        missing = [k for k in own if k not in seen and not k.endswith("_extra_state")]
        if missing or unexpected:
            raise CheckpointError(
                f"--load {self.load}: {self.source} does not fit the model flags (--num-layers, "
                f"--untie-embeddings-and-output-weights, ...): the checkpoint lacks {missing[:5]} "
                f"and has no place in the model for {unexpected[:5]}")

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
        self._module = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def load_model_weights(model: torch.nn.Module, load: str, iteration: Optional[int] = None) -> str:
    """Fill ``model`` with the weights of ``--load`` (see the module docstring); returns what was
    read (the ``iter_*`` directory or the file)."""
    with CheckpointWeights(load, iteration) as weights:
        weights.copy_into(model)
        return weights.source
