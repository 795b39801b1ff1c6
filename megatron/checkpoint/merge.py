"""Weighted checkpoint merging (WSM, "warmup-stable-merge"): ``Σ wᵢ·θᵢ`` of checkpoints of one
model, of any layout, written as a checkpoint of any layout (tools/checkpoint/merge_checkpoints.py
is the command line).

**Weights.** Given (:func:`normalized_weights`: non-negative, not all zero, normalised to sum 1),
or derived from a decay shape in the one schedule language (megatron/schedules/,
:func:`weights_from_schedule`) by the mapping of Tian et al., *WSM: Decay-Free Learning Rate
Schedule via Checkpoint Merging for LLM Pre-training* (arXiv:2507.17634, Theorem 3.1): merging the
checkpoints ``θ_0 .. θ_k`` of a constant-LR run with weights ``c_0 .. c_k`` gives
``θ_0 − Σ_{i=1..k} w_i·g_i`` (``g_i`` the update between checkpoints ``i−1`` and ``i``), i.e. the
run whose updates were scaled by the decay ``w_i = Σ_{j≥i} c_j``; conversely

    c_0 = 1 − w_1,   c_j = w_j − w_{j+1} (0 < j < k),   c_k = w_k,

and a monotone decay ``1 ≥ w_1 ≥ ... ≥ w_k ≥ 0`` gives non-negative weights summing to 1. Here
``w_i`` is the decay schedule's mean value over the optimizer steps between checkpoints ``i−1``
and ``i`` (the schedule evaluated at every iteration, as the LR schedule is, relative to its value
at the first checkpoint), the schedule's progress 0 being the first checkpoint and its default span
the window (first to last checkpoint). For a linear decay to 0 over ``k`` intervals of ``K``
iterations: ``w_i = 1 − ((i−1)K + (K−1)/2) / (kK)``, so ``c_0 = (K−1)/(2kK)``, ``c_j = 1/k``,
``c_k = (K+1)/(2kK)`` (the trapezoid rule; ``tests/e2e/test_merge_checkpoints.py``).

**Exactness and memory.** Each merged tensor is ``Σ wᵢ·θᵢ`` accumulated in fp32 from the sources'
full (tensor-parallel 1) tensors as stored (megatron/checkpoint/reader.py, files memory-mapped,
pages released), one tensor at a time, and streamed into the output files
(megatron/checkpoint/writer.py with ``shapes``), written in the sources' dtype (the newest
source's, tensor by tensor). Memory beyond the interpreter is about one full tensor in fp32 plus one
source tensor.

**Refusals.** Checkpoints of different models: another set of parameter names, another shape (the
padded vocabulary included) or other recorded model flags; the error names the first tensor (or
flag) that differs and both checkpoints.

**Output.** The newest source's ``model_args.json`` and training state (iteration, consumed
samples, scheduler: ``--load OUT --no-load-optim`` continues the run from the merged weights;
``--finetune`` starts afresh from them), no optimizer state, ``param_index.json`` (any layout
loads it), and ``merge.json`` (megatron/checkpoint/format.py): the sources, their weights and
where the weights came from.
"""
import json
import math
import os
import resource
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np
import torch

from megatron.checkpoint.engine import CLIENT_STATE_KEY
from megatron.checkpoint.format import checkpoint_tag, read_tracker, resolve_checkpoint, write_merge_record
from megatron.checkpoint.reader import CheckpointReader
from megatron.checkpoint.writer import write_checkpoint
from megatron.errors import CheckpointError, ConfigError
from megatron.model.param_names import VOCAB_PARAMETERS, gpt_order, tensor_parallel_partition
from megatron.schedules.registry import ScheduleContext, ScheduleError, build_schedule, get_schedule_class, known_kinds

# Recorded model flags that may differ between checkpoints of one model: they only choose the
# padding of the vocabulary rows, which the shapes compare.
_PADDING_FLAGS = ("make_vocab_size_divisible_by", "pad_vocab_size_to")
SCHEDULE_FILE_KEY = "merge_schedule"
_SLICE = 1 << 22  # elements accumulated at a time (16 MiB of fp32)


# ------------------------------------------------------------------ which checkpoints
def select_iterations(load_dir: str, iterations: Optional[Sequence[int]] = None,
                      window: Optional[int] = None, every: Optional[int] = None,
                      window_end: Optional[int] = None) -> List[int]:
    """The iterations to merge, ascending: ``iterations`` (``--iterations``), or the ``window``
    checkpoints ``every`` iterations apart ending at ``window_end`` (default: the latest complete
    checkpoint of ``load_dir``). Every one must be a complete checkpoint of ``load_dir``."""
    if (iterations is None) == (window is None):
        raise ConfigError("give the checkpoints to merge with --iterations I1 I2 ... or with "
                          "--window N --every K (not both)")
    latest = read_tracker(load_dir) if os.path.isdir(load_dir) else None
    if iterations is not None:
        flag = "--iterations"
        if every is not None or window_end is not None:
            raise ConfigError("--every and --window-end go with --window, not with --iterations")
        if not iterations:
            raise ConfigError("--iterations: give at least one iteration")
        seen = set()
        for it in iterations:
            if it < 0:
                raise ConfigError(f"--iterations {it}: iterations are non-negative")
            if it in seen:
                raise ConfigError(f"--iterations: {it} is given twice")
            seen.add(it)
        chosen = list(iterations)
    else:
        flag = "--window/--every"
        if window < 1:
            raise ConfigError(f"--window {window}: must be at least 1 checkpoint")
        if every is None or every < 1:
            raise ConfigError(f"--window {window} needs --every K, the iterations between "
                              f"checkpoints (a positive number; got {every})")
        end = window_end
        if end is None:
            resolve_checkpoint(load_dir, None, iteration_flag="--window-end")
            end = latest
        chosen = [end - (window - 1 - i) * every for i in range(window)]
        if chosen[0] < 0:
            raise ConfigError(f"--window {window} --every {every} ending at iteration {end} starts "
                              f"before iteration 0 (at {chosen[0]})")
    for it in chosen:
        resolve_checkpoint(load_dir, it, iteration_flag=flag)
        if latest is not None and it > latest:
            raise CheckpointError(
                f"{flag}: iteration {it} is newer than the latest complete checkpoint of --load "
                f"{load_dir} ({latest}, latest_checkpointed_iteration.txt): "
                f"{os.path.join(load_dir, checkpoint_tag(it))} may be incomplete")
    return chosen


# ------------------------------------------------------------------ weights
def normalized_weights(weights: Sequence[float], iterations: Sequence[int]) -> List[float]:
    """``--weights`` normalised to sum 1; refused: another count than checkpoints, a negative or
    non-finite value, all zero."""
    if len(weights) != len(iterations):
        raise ConfigError(f"--weights has {len(weights)} values for {len(iterations)} checkpoints "
                          f"(iterations {' '.join(map(str, iterations))}): give one weight per "
                          "checkpoint")
    for w, it in zip(weights, iterations, strict=True):
        if not math.isfinite(w):
            raise ConfigError(f"--weights {w} (iteration {it}): weights must be finite numbers")
        if w < 0:
            raise ConfigError(f"--weights {w} (iteration {it}): weights must be non-negative "
                              "(a merge is a weighted average)")
    total = math.fsum(weights)
    if total <= 0:
        raise ConfigError(f"--weights {' '.join(f'{w:g}' for w in weights)}: all zero; at least "
                          "one checkpoint needs a positive weight")
    return [w / total for w in weights]


def wsm_coefficients(multipliers: Sequence[float]) -> List[float]:
    """The merge weights ``c_0 .. c_k`` that emulate the decay ``w_1 .. w_k`` (WSM, Theorem 3.1):
    ``c_0 = 1 − w_1``, ``c_j = w_j − w_{j+1}``, ``c_k = w_k`` (so ``w_i = Σ_{j≥i} c_j``);
    ``[1.0]`` for no interval (one checkpoint)."""
    w = [1.0, *[float(x) for x in multipliers], 0.0]
    return [w[j] - w[j + 1] for j in range(len(w) - 1)]


def _read_schedule_file(path: str) -> Any:
    try:
        with open(path) as f:
            text = f.read()
        if path.endswith(".json"):
            config = json.loads(text)
        else:
            import yaml
            config = yaml.safe_load(text)
    except Exception as e:  # OSError, yaml.YAMLError, json.JSONDecodeError
        raise ConfigError(f"--weights-from-schedule {path}: cannot read it ({e})") from None
    if isinstance(config, dict) and SCHEDULE_FILE_KEY in config:
        unknown = sorted(set(config) - {SCHEDULE_FILE_KEY})
        if unknown:
            raise ConfigError(f"--weights-from-schedule {path}: unknown key {unknown[0]!r} (known "
                              f"key: {SCHEDULE_FILE_KEY})")
        config = config[SCHEDULE_FILE_KEY]
    return config


def decay_schedule(spec: str, span: int):
    """The decay schedule ``spec`` names: a schedule kind with ``from`` and ``to`` keys (e.g.
    ``linear``, ``cosine``, ``wsd``: from 1 to 0 over the window, ``wsd`` decaying over all of it),
    or a YAML/JSON file holding a schedule (or ``merge_schedule: SCHEDULE``) in the language of
    docs/schedules.md, in iterations since the first checkpoint; ``span`` (iterations from the first
    to the last checkpoint) is the default span. Returns ``(schedule, its config)``."""
    if os.path.isfile(spec):
        config = _read_schedule_file(spec)
    elif spec in known_kinds():
        if "from" not in get_schedule_class(spec).keys:
            raise ConfigError(f"--weights-from-schedule {spec}: the {spec!r} kind has no "
                              "'from'/'to' keys to decay from 1 to 0; give it with its keys in a "
                              f"YAML/JSON file ({SCHEDULE_FILE_KEY}: {{type: {spec}, ...}})")
        config = {"type": spec, "from": 1.0, "to": 0.0}
        if spec == "wsd":
            config["decay"] = max(span, 1)
    elif spec.endswith((".yaml", ".yml", ".json")):
        raise ConfigError(f"--weights-from-schedule {spec}: no such file")
    else:
        raise ConfigError(f"--weights-from-schedule {spec!r}: neither a schedule file nor a "
                          f"schedule kind (known kinds: {', '.join(known_kinds())})")
    try:
        context = ScheduleContext(total={"iterations": float(max(span, 1))})
        schedule = build_schedule(config, context)
    except ScheduleError as e:
        raise ConfigError(f"--weights-from-schedule {spec}: {e}") from None
    if schedule.unit != "iterations":
        raise ConfigError(f"--weights-from-schedule {spec}: unit {schedule.unit!r}; a merge "
                          "schedule runs in iterations (since the first checkpoint)")
    return schedule, config


def decay_multipliers(schedule, iterations: Sequence[int], where: str = "the schedule"
                      ) -> List[float]:
    """``w_1 .. w_k``: the mean of ``schedule`` over the optimizer steps between consecutive
    checkpoints ``iterations`` (ascending), relative to its value at the first checkpoint (the
    schedule's progress 0)."""
    first, last = iterations[0], iterations[-1]
    values = np.asarray(schedule(np.arange(0, max(last - first, 1), dtype=np.float64)),
                        dtype=np.float64)
    peak = float(schedule(0.0))
    if not math.isfinite(peak) or peak <= 0:
        raise ConfigError(f"{where}: its value at the first checkpoint (progress 0) is {peak:g}; a "
                          "decay starts from a positive value")
    if not np.all(np.isfinite(values)):
        raise ConfigError(f"{where}: not finite between iterations {first} and {last}")
    return [float(values[a - first:b - first].mean()) / peak
            for a, b in zip(iterations[:-1], iterations[1:], strict=False)]


def weights_from_schedule(spec: str, iterations: Sequence[int]
                          ) -> Tuple[List[float], List[float], Any]:
    """``(merge weights c_0..c_k, decay multipliers w_1..w_k, schedule config)`` of the decay
    ``spec`` (:func:`decay_schedule`) over the checkpoints ``iterations`` (ascending). A schedule
    that rises somewhere (a negative weight) is refused naming the interval."""
    schedule, config = decay_schedule(spec, iterations[-1] - iterations[0])
    where = f"--weights-from-schedule {spec}"
    w = decay_multipliers(schedule, iterations, where)
    c = wsm_coefficients(w)
    bounds = [None, *iterations[1:], None]
    for j, value in enumerate(c):
        if value < -1e-12:
            if j == 0:
                what = (f"its mean over iterations {iterations[0]}-{iterations[1]} is {w[0]:.6g} "
                        f"times its value at iteration {iterations[0]}")
            elif j == len(w):
                what = f"it is negative ({w[-1]:.6g}) before iteration {iterations[-1]}"
            else:
                what = (f"it rises from {w[j - 1]:.6g} to {w[j]:.6g} around iteration "
                        f"{bounds[j]}")
            raise ConfigError(f"{where}: a merge emulates only a decay that never rises and stays "
                              f"non-negative; {what} (weight c_{j} = {value:.6g})")
    c = [max(value, 0.0) for value in c]
    total = math.fsum(c)
    if total <= 0:
        raise ConfigError(f"{where}: every weight is zero")
    return [value / total for value in c], w, config


# ------------------------------------------------------------------ the same model
def _describe(reader) -> str:
    return f"{reader.directory} ({reader.layout.describe()})"


def check_same_model(readers: Sequence[Any]) -> None:
    """Raise :class:`CheckpointError` when the checkpoints (CheckpointReaders) are not of one
    model: names the first tensor (in ``GPTModel`` order) whose presence or shape differs (the
    padded vocabulary as such), or the recorded model flag that differs, and both checkpoints."""
    ref = readers[-1]
    for other in readers[:-1]:
        a, b = set(other.names), set(ref.names)
        if a != b:
            name = sorted(a ^ b, key=gpt_order)[0]
            has, lacks = (other, ref) if name in a else (ref, other)
            raise CheckpointError(f"checkpoints of different models: {name} is in "
                                  f"{_describe(has)} but not in {_describe(lacks)}")
        for name in ref.names:
            s_other, s_ref = tuple(other.shape(name)), tuple(ref.shape(name))
            if s_other == s_ref:
                continue
            if name in VOCAB_PARAMETERS and s_other[1:] == s_ref[1:]:
                raise CheckpointError(
                    f"checkpoints of different models: the padded vocabulary differs, {name} has "
                    f"{s_other[0]} rows in {_describe(other)} and {s_ref[0]} in {_describe(ref)} "
                    "(a run pads to a multiple of --make-vocab-size-divisible-by x TP; "
                    "--pad-vocab-size-to N keeps one size under every TP)")
            raise CheckpointError(f"checkpoints of different models: {name} is {list(s_other)} in "
                                  f"{_describe(other)} and {list(s_ref)} in {_describe(ref)}")
        flags_a = (other.model_args or {}).get("model")
        flags_b = (ref.model_args or {}).get("model")
        if flags_a and flags_b:
            for key in sorted(set(flags_a) | set(flags_b)):
                if key not in _PADDING_FLAGS and flags_a.get(key) != flags_b.get(key):
                    raise CheckpointError(
                        f"checkpoints of different models: --{key.replace('_', '-')} is "
                        f"{flags_a.get(key)!r} in {_describe(other)} and {flags_b.get(key)!r} in "
                        f"{_describe(ref)} (model_args.json)")
        for key in ("vocab_size",):
            va, vb = (other.model_args or {}).get(key), (ref.model_args or {}).get(key)
            if va is not None and vb is not None and va != vb:
                raise CheckpointError(f"checkpoints of different models: {va} vocabulary rows "
                                      f"take probability in {_describe(other)}, {vb} in "
                                      f"{_describe(ref)}")


def check_target_layout(reader, tp: int, pp: int) -> None:
    """Refuse an output layout the model does not split into, naming the flag."""
    flags = (reader.model_args or {}).get("model", {})
    if tp < 1 or pp < 1:
        raise ConfigError(f"--target-tensor-parallel-size {tp} and --target-pipeline-parallel-size "
                          f"{pp} must be positive")
    for key in ("num_attention_heads", "num_query_groups"):
        if flags.get(key) and flags[key] % tp:
            raise ConfigError(f"--target-tensor-parallel-size {tp} does not divide "
                              f"--{key.replace('_', '-')} {flags[key]}")
    layers = flags.get("num_layers")
    if layers and pp > layers:
        raise ConfigError(f"--target-pipeline-parallel-size {pp} exceeds the {layers} layers")
    gated = bool(flags.get("swiglu"))
    for name in reader.names:
        partition = tensor_parallel_partition(name, gated)
        shape = reader.shape(name)
        if partition and shape[partition[0]] % (partition[1] * tp):
            raise ConfigError(f"--target-tensor-parallel-size {tp} does not divide {name} "
                              f"{list(shape)} along dim {partition[0]}"
                              + (" (the padded vocabulary rows)" if name in VOCAB_PARAMETERS
                                 else ""))


# ------------------------------------------------------------------ the merge
def _group(name: str) -> str:
    """The tensor group of a canonical name (one progress line each): embedding, one decoder
    layer, final norm, output layer."""
    parts = name.split(".")
    if parts[0] == "decoder" and parts[1] == "layers":
        return ".".join(parts[:3])
    return ".".join(parts[:2]) if parts[0] == "decoder" else parts[0]


def peak_rss_bytes() -> int:
    """This process's peak resident memory (``getrusage``; kilobytes on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _trim_heap() -> None:
    """Give the C heap's free memory back to the system (glibc ``malloc_trim``; tensors below
    its mmap threshold are freed into the heap, which otherwise keeps growing with them)."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        try:
            import ctypes
            _MALLOC_TRIM = ctypes.CDLL("libc.so.6").malloc_trim
        except (OSError, AttributeError):  # not glibc
            _MALLOC_TRIM = False
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM = None


def _accumulate(acc: torch.Tensor, tensor: torch.Tensor, weight: float) -> None:
    """``acc += weight * tensor`` in fp32, a slice at a time: a bf16 ``tensor`` is cast slice by
    slice (a whole-tensor mixed-dtype ``add_`` would materialise an fp32 copy of it)."""
    for into, part in zip(acc.view(-1).split(_SLICE), tensor.reshape(-1).split(_SLICE), strict=True):
        into.add_(part, alpha=weight)


def merged_tensors(readers: Sequence[Any], weights: Sequence[float], names: Sequence[str],
                   dtypes: Dict[str, torch.dtype], log: Callable[[str], None] = print,
                   cast: bool = True) -> Iterator[Tuple[str, torch.Tensor]]:
    """``(name, Σ wᵢ·θᵢ)`` for each of ``names``, accumulated in fp32 one tensor at a time (a zero
    weight's checkpoint is not read), cast to ``dtypes[name]`` (left in fp32 unless ``cast``:
    the streaming writer casts as it copies, sparing a copy); logs one line per tensor group."""
    group, count, numel, start = None, 0, 0, time.perf_counter()

    def flush():
        _trim_heap()
        if group is not None:
            log(f"merged {group}: {count} tensors, {numel / 1e6:.2f}M parameters, "
                f"{time.perf_counter() - start:.2f} s")

    for name in names:
        if _group(name) != group:
            flush()
            group, count, numel, start = _group(name), 0, 0, time.perf_counter()
        acc = None
        for reader, w in zip(readers, weights, strict=True):
            if w == 0:
                continue
            tensor = reader.tensor(name)
            if acc is None:
                acc = torch.zeros(tensor.shape, dtype=torch.float32)
            _accumulate(acc, tensor, w)
            del tensor
        count, numel = count + 1, numel + acc.numel()
        yield name, acc.to(dtypes[name]) if cast else acc
        del acc
    flush()


def merge_checkpoints(load_dir: str, iterations: Sequence[int], weights: Sequence[float],
                      save_dir: str, tp: int = 1, pp: int = 1,
                      weights_from: Optional[Dict[str, Any]] = None,
                      log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Write ``Σ wᵢ·θᵢ`` of the checkpoints ``iterations`` of ``load_dir`` (``weights`` summing to
    1, in the same order) to ``save_dir`` as the checkpoint of the newest iteration with
    tensor-parallel size ``tp`` and pipeline-parallel size ``pp`` (see the module docstring).
    ``weights_from`` is recorded in ``merge.json``. Returns a summary (``directory``,
    ``iteration``, ``parameters``, ``seconds``, ``peak_rss_bytes``, ``sources``)."""
    start = time.perf_counter()
    if len(weights) != len(iterations):
        raise ConfigError(f"{len(weights)} weights for {len(iterations)} checkpoints")
    pairs = sorted(zip(iterations, weights, strict=True))
    iterations, weights = [p[0] for p in pairs], [p[1] for p in pairs]
    if os.path.abspath(save_dir) == os.path.abspath(load_dir):
        raise ConfigError(f"--save {save_dir} is --load: write the merged checkpoint to a new "
                          "directory")
    if os.path.isdir(save_dir) and os.listdir(save_dir):
        raise ConfigError(f"--save {save_dir} exists and is not empty; give a new directory")
    readers = []
    try:
        for it in iterations:
            resolve_checkpoint(load_dir, it, iteration_flag="--iterations")
            readers.append(CheckpointReader(load_dir, it))
        newest = readers[-1]
        if newest.model_args is None:
            raise CheckpointError(f"--load {load_dir}: {newest.directory} has no model_args.json "
                                  "(written before checkpoints recorded their model flags); the "
                                  "merged checkpoint needs it")
        check_same_model(readers)
        check_target_layout(newest, tp, pp)
        names = list(newest.names)
        dtypes = {name: newest.dtype(name) for name in names}
        shapes = {name: (tuple(newest.shape(name)), dtypes[name]) for name in names}
        for reader in readers[:-1]:
            differ = [n for n in names if reader.dtype(n) != dtypes[n]]
            if differ:
                log(f"note: {reader.directory} stores {differ[0]} as {reader.dtype(differ[0])}; "
                    f"the merge is written as the newest checkpoint's {dtypes[differ[0]]}")
        training_state = None
        if newest.index is not None:
            training_state = newest.client_state(CLIENT_STATE_KEY)
        sources = [{"load": os.path.abspath(load_dir), "iteration": r.iteration,
                    "directory": os.path.abspath(r.directory), "layout": r.layout.as_dict(),
                    "zero_stage": (r.index or {}).get("zero_stage"), "weight": w}
                   for r, w in zip(readers, weights, strict=True)]
        log(f"merging {len(readers)} checkpoints of --load {load_dir}: "
            + ", ".join(f"iteration {r.iteration} ({r.layout.describe()}) x {w:.6g}"
                        for r, w in zip(readers, weights, strict=True)))
        iteration = newest.iteration
        directory = os.path.join(save_dir, checkpoint_tag(iteration))
        os.makedirs(directory, exist_ok=True)
        # the record first: the tracker, written last by the writer, marks the checkpoint complete
        write_merge_record(directory, {
            "iteration": iteration, "sources": sources, "weights": list(weights),
            "weights_from": weights_from or {"weights": list(weights)},
            "tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp,
            "training_state_from": newest.iteration if training_state is not None else None})
        write_checkpoint(save_dir, merged_tensors(readers, weights, names, dtypes, log, cast=False),
                         newest.model_args, tp=tp, pp=pp, iteration=iteration, shapes=shapes,
                         training_state=training_state)
        parameters = sum(math.prod(s) for s, _ in shapes.values())
    finally:
        for reader in readers:
            reader.close()
    seconds, peak = time.perf_counter() - start, peak_rss_bytes()
    log(f"wrote {directory} (tensor-parallel {tp}, pipeline-parallel {pp}): {parameters} "
        f"parameters in {seconds:.1f} s, peak memory (RSS) {peak / 2 ** 30:.2f} GiB"
        + ("" if training_state is not None else
           "; no training state in the newest source: load it with --finetune"))
    return {"directory": directory, "iteration": iteration, "parameters": parameters,
            "seconds": seconds, "peak_rss_bytes": peak, "sources": sources}
