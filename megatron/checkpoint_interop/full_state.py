"""The full model state of a training checkpoint of any layout, one tensor at a time.

:class:`FullStateReader` opens ``DIR/iter_NNNNNNN/`` written with any tensor-parallel (TP),
pipeline-parallel (PP) and data-parallel size and ZeRO stage 0-2, and yields every parameter as
the full (TP=1, PP=1) tensor under its canonical ``GPTModel`` name
(``decoder.layers.7.mlp.linear_fc1.weight``, megatron/model/init.py), together with the model
flags the checkpoint recorded (``model_args.json``, megatron/checkpoint_interop/model_args.py)::

    with FullStateReader("runs/ckpt") as reader:          # latest iteration, or iteration=N
        reader.model_args["model"]["hidden_size"]          # the recorded model flags (or None)
        for name, tensor in reader.items():                # streams, full TP=1 tensors
            ...
    state = load_full_state_dict("runs/ckpt")              # the same, as one dict

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
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from megatron.checkpoint_interop.model_args import read_model_args
from megatron.errors import ConfigError
from megatron.parallel.layout_record import read_layout
from megatron.parallel.topology import ParallelLayout

_LAYER_FILE = re.compile(r"^layer_(\d+)-model_(\d+)-model_states\.pt$")
_ROW_SPLIT = ("embedding.word_embeddings.weight", "output_layer.weight")
_ROW_SPLIT_SUFFIXES = (".linear_qkv.weight", ".linear_qkv.bias", ".linear_fc1.weight",
                       ".linear_fc1.bias")
_COLUMN_SPLIT_SUFFIXES = (".linear_proj.weight", ".linear_fc2.weight")


def resolve_checkpoint(load_dir: str, iteration: Optional[int] = None,
                       iteration_flag: str = "--iteration") -> Tuple[str, int]:
    """``(DIR/iter_NNNNNNN, iteration)``: ``iteration`` or, by default, the tracker's latest one.
    Raises :class:`megatron.checkpointing.CheckpointError` naming ``--load`` and
    ``iteration_flag`` (the calling tool's flag for the iteration)."""
    from megatron.checkpointing import CheckpointError, TRACKER_FILENAME, checkpoint_tag, read_tracker

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


def tensor_parallel_partition(name: str, gated: bool = False) -> Optional[Tuple[int, int]]:
    """``(partition_dim, partition_stride)`` of the canonical parameter ``name`` under tensor
    parallelism (megatron-core's), or None when every rank holds the whole tensor. ``gated``: the
    MLP is SwiGLU, so fc1 has stride 2 (each shard ``[gate_t; up_t]``)."""
    if name.endswith((".linear_fc1.weight", ".linear_fc1.bias")):
        return 0, 2 if gated else 1
    if name in _ROW_SPLIT or name.endswith(_ROW_SPLIT_SUFFIXES):
        return 0, 1
    if name.endswith(_COLUMN_SPLIT_SUFFIXES):
        return 1, 1
    return None


def merge_shards(shards: List[torch.Tensor], dim: int, stride: int) -> torch.Tensor:
    """The full tensor of tensor-parallel ``shards`` (rank order) split along ``dim`` with
    ``stride``: each shard is ``stride`` chunks; the full tensor is chunk 0 of every rank, then
    chunk 1 of every rank ... (inverse of megatron-core's ``_initialize_affine_weight_cpu``)."""
    if len(shards) == 1:
        return shards[0]
    if stride == 1:
        return torch.cat(shards, dim=dim)
    per_rank = [torch.split(s, s.shape[dim] // stride, dim=dim) for s in shards]
    return torch.cat([chunks[k] for k in range(stride) for chunks in per_rank], dim=dim)


def split_full(full: torch.Tensor, dim: int, stride: int, tp_size: int) -> List[torch.Tensor]:
    """Inverse of :func:`merge_shards`: the ``tp_size`` shards megatron-core gives each rank."""
    chunks = torch.split(full, full.shape[dim] // (stride * tp_size), dim=dim)
    return [torch.cat(chunks[r::tp_size], dim=dim).clone() for r in range(tp_size)]


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


# Transformer Engine's layer spec fuses the norms into the following linear layer; these are the
# local spec's (canonical) names of those norm parameters.
_TE_NORM_NAMES = {"self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
                  "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
                  "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
                  "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias"}


def canonical_weight_name(name: str) -> Optional[str]:
    """The canonical (local layer spec) name of a ``GPTModel`` state-dict key, or None for keys
    that are not weights (megatron-core's and Transformer Engine's ``_extra_state``). Transformer
    Engine's fused norm weights (``linear_qkv.layer_norm_weight``) get the local spec's names
    (``input_layernorm.weight``), so a checkpoint reads the same whichever implementation trained
    it."""
    if name.endswith("_extra_state"):
        return None
    m = re.match(r"(decoder\.layers\.\d+\.)(.*)$", name)
    if m and m.group(2) in _TE_NORM_NAMES:
        return m.group(1) + _TE_NORM_NAMES[m.group(2)]
    return name


def _pipe_canonical(key: str, layer_index: int) -> Optional[str]:
    """Canonical name of ``key`` in pipe layer file ``layer_index`` (None: not a weight of the
    GPTModel, e.g. the tied output projection's empty extra state)."""
    if key.endswith("._extra_state") or key.startswith("output_projection."):
        return None
    if key.startswith("layer."):
        return canonical_weight_name(f"decoder.layers.{layer_index - 1}.{key[len('layer.'):]}")
    if key.startswith("final_layernorm."):
        return f"decoder.{key}"
    if key.startswith(("embedding.", "output_layer.")):
        return key
    raise ConfigError(f"pipe layer {layer_index}: unknown parameter {key!r} (not written by "
                      "megatron/model/gpt_model_pipe.py)")


class FullStateReader:
    """Reads the full (TP=1, PP=1) ``GPTModel`` parameters of a checkpoint of any layout (see the
    module docstring). ``load_dir`` is a ``--save`` directory; ``iteration`` defaults to the
    latest. Attributes: ``directory`` (the ``iter_*`` directory), ``iteration``, ``layout``
    (:class:`ParallelLayout` written with it), ``model_args`` (the ``model_args.json`` record or
    None), ``names`` (canonical parameter names in ``GPTModel`` order). Use as a context manager or
    call :meth:`close` to unmap the files."""

    def __init__(self, load_dir: str, iteration: Optional[int] = None):
        from megatron.checkpointing import CheckpointError

        self.load_dir = load_dir
        self.directory, self.iteration = resolve_checkpoint(load_dir, iteration)
        self.layout = read_layout(self.directory) or ParallelLayout(tp=1, pp=1, dp=1, world=1)
        self.model_args = read_model_args(self.directory)
        self._files: Dict[str, dict] = {}
        # canonical name -> [(file, key in that file)] per tensor-parallel rank
        self._where: Dict[str, List[Tuple[str, str]]] = {}
        files = os.listdir(self.directory)
        self._check_zero_stage(files)
        tp = self.layout.tp
        layer_files = {}
        for f in files:
            m = _LAYER_FILE.match(f)
            if m:
                layer_files[(int(m.group(1)), int(m.group(2)))] = f
        if layer_files:
            self._index_pipe(layer_files, tp)
        else:
            self._index_plain(files, tp)
        if not self._where:
            raise CheckpointError(f"--load {load_dir}: checkpoint {self.directory} holds no model "
                                  "weights")
        self.names = list(self._where)

    # ------------------------------------------------------------------ indexing
    def _load(self, filename: str) -> dict:
        from megatron.checkpointing import CheckpointError

        if filename not in self._files:
            path = os.path.join(self.directory, filename)
            try:
                self._files[filename] = torch.load(path, map_location="cpu", mmap=True,
                                                   weights_only=False)
            except Exception as e:
                raise CheckpointError(f"--load {self.load_dir}: {path} is corrupt or not a torch "
                                      f"checkpoint ({type(e).__name__}: "
                                      f"{str(e).splitlines()[0][:200] if str(e) else ''})") from None
        return self._files[filename]

    def _check_zero_stage(self, files: List[str]) -> None:
        from megatron.checkpointing import CheckpointError

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
        from megatron.checkpointing import CheckpointError

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

    def _index_pipe(self, layer_files: Dict[Tuple[int, int], str], tp: int) -> None:
        from megatron.checkpointing import CheckpointError

        for layer in sorted({i for i, _ in layer_files}):
            for rank in range(tp):
                filename = layer_files.get((layer, rank))
                if filename is None:
                    raise CheckpointError(
                        f"--load {self.load_dir}: checkpoint {self.directory} (tensor-parallel "
                        f"size {tp}) lacks layer_{layer:02d}-model_{rank:02d}-model_states.pt")
                for key, value in self._load(filename).items():
                    name = _pipe_canonical(key, layer)
                    if name is not None and torch.is_tensor(value):
                        self._where.setdefault(name, []).append((filename, key))
            # layer files are small: drop this layer's mappings once indexed (reopened on read)
            self._files = {k: v for k, v in self._files.items() if not _LAYER_FILE.match(k)}
        self.names = sorted(self._where, key=_gpt_order)
        self._where = {n: self._where[n] for n in self.names}

    # ------------------------------------------------------------------ reading
    def tensor(self, name: str) -> torch.Tensor:
        """The full (tensor-parallel shards merged) tensor called ``name``."""
        from megatron.checkpointing import CheckpointError

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
        gated = name.endswith((".linear_fc1.weight", ".linear_fc1.bias")) \
            and self._fc1_stride(name) == 2
        return tensor_parallel_partition(name, gated) if self.layout.tp > 1 else None

    def shape(self, name: str) -> Tuple[int, ...]:
        """The full shape of ``name`` (from the shards' metadata; no data is read)."""
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

    def close(self) -> None:
        """Unmap every checkpoint file."""
        self._files.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _gpt_order(name: str):
    """Sort key: embedding, decoder layers by number, final norm, output layer."""
    m = re.match(r"decoder\.layers\.(\d+)\.", name)
    if name.startswith("embedding."):
        return (0, 0, name)
    if m:
        return (1, int(m.group(1)), name)
    if name.startswith("decoder."):
        return (2, 0, name)
    return (3, 0, name)


def load_full_state_dict(load_dir: str, iteration: Optional[int] = None
                         ) -> Tuple[Dict[str, torch.Tensor], Optional[dict]]:
    """``(full TP=1/PP=1 GPTModel parameters by canonical name, model_args.json record or None)``
    of the checkpoint in ``load_dir`` (latest iteration unless ``iteration``)."""
    with FullStateReader(load_dir, iteration) as reader:
        return reader.state_dict(), reader.model_args
