"""``--data-blend-config FILE``: YAML/JSON blend files -> typed blend configuration.

File shape (see docs/curriculum.md)::

    train:                       # one of: blend | epochized_blend | sequential
      blend:
        - {path: data/web_text_document, weight: 1}
        - {path: data/code_text_document, split: "0:0.98",
           weight: {type: linear, unit: iterations, points: {0: 100, 100: 10, 1000: 0}}}
    valid:                       # a list of named groups
      - {name: web, path: data/web_text_document, split: "0.98:1"}
      - {name: mix, blend: [{path: a, weight: 1}, {path: b, weight: 2}]}

``sequential`` is a list of stages, each ``{blend: [...], until: {iterations|samples|tokens: N}}``
(``until`` is absolute run progress; the last blend stage may omit it and then runs to the end) or
``{epochized_blend: [...]}`` (ends when its repetitions are done). Stages never mix.

Every entry may carry ``split: "START:END"``: the documents of ``path`` in that fraction range, by
position. Relative paths are resolved against the working directory first, then against the
directory of the blend file. An entry may name a group instead of one ``path``: ``paths: [...]`` or
``glob: "dir/*_text_document"``; it is expanded into one entry per prefix, weighted by the group's
weight times the prefix's share of the group's tokens in ``split`` (:func:`range_tokens`,
:func:`scaled_weight`).

energon's metadataset spelling (``__module__: megatron.energon``, ``__class__: MetadatasetV2``,
``splits: {train: {blend|blend_epochized|sequential_schedule: ...}}``, weights ``{__class__:
WeightSchedule, linear|step: {x: w}}``) is read into the same typed config
(:func:`parse_energon_metadataset`); energon keys without a meaning here are refused by name.

Errors are ``BlendConfigError`` (a ``ValueError``) naming the file, the key and the offending value;
unknown keys are refused at every level, and every missing or corrupt prefix of the file is
reported in one error (:func:`prefix_problems_message`). Checks that need the run length (all
weights zero at some point, a schedule's values between its points) happen when the curriculum
index is built (``megatron.data.curriculum.index``).
"""
import glob as globlib
import json
import math
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Sequence, Tuple, Union

import yaml

from megatron.data.cache_key import NOT_KEYED
from megatron.errors import ConfigError

__all__ = ["REPLAY_SUFFIX", "blend_key", 
    "BlendConfigError", "BlendEntry", "BlendStage", "SplitBlend", "BlendConfig",
    "load_blend_config", "parse_blend_config", "parse_energon_metadataset", "is_energon_metadataset",
    "parse_split_range", "check_dataset_prefix",
    "short_dataset_name",
    "indexed_dataset_problem", "missing_files_problem", "dataset_prefix_problem",
    "prefix_problems_message",
    "range_tokens", "scaled_weight", "SCALED_WEIGHT_TYPE",
    "MixerConfig", "MIXER_POLICIES", "MIXER_KEYS", "MIXER_TARGETS",
]

SCALED_WEIGHT_TYPE = "scaled"
"""The weight of one prefix of a group entry (``paths:``/``glob:``) whose group weight is a
schedule: ``{type: scaled, unit, scale: FRACTION, schedule: GROUP_WEIGHT}`` (made by
:func:`scaled_weight`, evaluated by ``megatron/data/curriculum/weights.py``; not for blend files)."""
PROBLEMS_SHOWN = 5  # missing/corrupt prefixes named in one error; the rest are counted

UNITS = ("iterations", "samples", "tokens")
SCHEDULE_POINT_TYPES = ("linear", "step", "piecewise-linear", "piecewise_linear")

Weight = Union[float, Dict[str, Any]]


class BlendConfigError(ConfigError):
    """A blend configuration error; the message names the file, the key and the value."""


@dataclass(frozen=True)
class BlendEntry:
    """One dataset of a blend.

    Attributes:
        path: the ``.bin``/``.idx`` prefix (resolved).
        weight: a number or a schedule dict (``{type, unit?, points?...}``).
        split: ``(start, end)`` document fraction range, by position; ``(0.0, 1.0)`` = all.
        repetitions: epochs to draw (``epochized_blend`` only), else None.
        where: ``"FILE: key"`` for error messages.
        loss_weight: multiplies the loss weight of this dataset's tokens (the objective, not the
            sampling; megatron/optim/loss_normalization.py).
        replay: draws again from the tokens of the dataset the run drew before the phase this
            entry's mix began (a context-extension stage's "previous mix": a ledger dataset of
            its own, ``NAME_replay``; megatron/data/length_change.py), not from new ones.
    """

    path: str
    weight: Optional[Weight] = 1.0
    split: Tuple[float, float] = (0.0, 1.0)
    repetitions: Optional[float] = None
    where: str = field(default="", metadata=NOT_KEYED)
    loss_weight: float = field(default=1.0, metadata=NOT_KEYED)
    replay: bool = False

    @property
    def key(self) -> Tuple:
        """Identity of the constituent dataset: same path and range = same dataset (a replay of
        it is another)."""
        return blend_key(self.path, self.split, self.replay)

    @property
    def weight_is_static(self) -> bool:
        return not isinstance(self.weight, dict)

    @property
    def name(self) -> str:
        """Short name: :func:`short_dataset_name` of the prefix (``_replay`` added for a replay)."""
        return short_dataset_name(self.path) + (REPLAY_SUFFIX if self.replay else "")

    @property
    def qualified_name(self) -> str:
        """:attr:`name` plus the split range when it is not the whole dataset (tells apart two
        ranges of one prefix)."""
        if self.split == (0.0, 1.0):
            return self.name
        return f"{self.name}[{self.split[0]:g}:{self.split[1]:g}]"


@dataclass(frozen=True)
class BlendStage:
    """One blend: ``kind`` is "blend" or "epochized_blend"; ``until`` = (unit, N) or None."""

    kind: str
    entries: Tuple[BlendEntry, ...]
    until: Optional[Tuple[str, int]] = None
    where: str = field(default="", metadata=NOT_KEYED)


# the mixer's policies (megatron/data/mixer_policies.py) and each one's own keys with their defaults
MIXER_POLICIES: Dict[str, Dict[str, float]] = {
    "odm": {"smoothing": 0.9, "reward_scale": 10.0},
    "ado": {"warmup": 3, "history": 0.9, "average": 0.9},
    "loss_softmax": {"temperature": 1.0},
}
MIXER_KEYS = ("policy", "interval", "floor", "max_epochs", "target")
# what the mixer's weights move: the sampling (new data-ledger phases) or the per-dataset loss
# weights of the objective (DoReMi-style: the data order stays the static blend's)
MIXER_TARGETS = ("sampling", "loss_weight")


@dataclass(frozen=True)
class MixerConfig:
    """``train: {blend: [...], mixer: {...}}``: every ``interval`` iterations ``policy`` (one of
    :data:`MIXER_POLICIES`) reads the interval's per-dataset training losses and sets the blend's
    next weights, each at least ``floor``; ``params``: the policy's own keys (sorted ``(key,
    value)`` pairs, defaults filled in). The blend's weights are the starting mix. ``target``
    (one of :data:`MIXER_TARGETS`): what the weights move, the sampling (default) or the
    datasets' loss weights (megatron/data/mixer_loss_weights.py; the sampling then stays the
    blend's)."""

    policy: str
    interval: int
    floor: float = 0.0
    params: Tuple[Tuple[str, float], ...] = ()
    where: str = field(default="", metadata=NOT_KEYED, compare=False)
    max_epochs: Optional[float] = None  # the cap on repetitions: epochs of a dataset at most
    target: str = "sampling"

    def param(self, key: str) -> float:
        return dict(self.params)[key]

    def to_json(self) -> Dict[str, Any]:
        out = {"policy": self.policy, "interval": self.interval, "floor": self.floor,
               **dict(self.params)}
        if self.max_epochs is not None:
            out["max_epochs"] = self.max_epochs
        if self.target != "sampling":  # only when set: the records of sampling mixers stay as they were
            out["target"] = self.target
        return out


@dataclass(frozen=True)
class SplitBlend:
    """What one split (or one named valid/test group) draws: stages in order (one for a plain
    ``blend``/``epochized_blend``; several for ``sequential``); ``mixer``: the adaptive mixer of a
    training ``blend`` (:class:`MixerConfig`), or None."""

    stages: Tuple[BlendStage, ...]
    name: Optional[str] = None
    sequential: bool = False
    where: str = field(default="", metadata=NOT_KEYED)
    mixer: Optional[MixerConfig] = None


@dataclass(frozen=True)
class BlendConfig:
    """The whole file: ``train`` (or None) and the named ``valid``/``test`` groups."""

    source: str
    train: Optional[SplitBlend] = None
    valid: Tuple[SplitBlend, ...] = ()
    test: Tuple[SplitBlend, ...] = ()

    def canonical(self) -> str:
        """Canonical JSON of the content (for cache keys)."""
        from dataclasses import asdict

        def clean(obj):
            if isinstance(obj, dict):
                return {str(k): clean(v) for k, v in obj.items() if k != "where" and k != "source"}
            if isinstance(obj, (list, tuple)):
                return [clean(v) for v in obj]
            return obj

        return json.dumps(clean(asdict(self)), sort_keys=True)


# ----------------------------------------------------------------------------------------------
REPLAY_SUFFIX = "_replay"


def blend_key(path: str, split: Tuple[float, float], replay: bool = False) -> Tuple:
    """The identity of a blend's dataset: ``(path, split start, split end)``, and ``"replay"``
    after them for a replay of it."""
    key = (path, float(split[0]), float(split[1]))
    return key + ("replay",) if replay else key


def short_dataset_name(prefix: str) -> str:
    """A dataset's name in logs and metrics: the basename of its ``.bin/.idx`` prefix without the
    suffix that ``tools/preprocess_data.py`` adds (``_text_document``, ``_inputs_document``,
    ``_targets_document``, ``_document``)."""
    name = prefix.rstrip("/").split("/")[-1]
    for suffix in ("_text_document", "_inputs_document", "_targets_document", "_document"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _err(where: str, msg: str) -> BlendConfigError:
    return BlendConfigError(f"{where}: {msg}")


def _check_keys(obj: Any, allowed: Sequence[str], where: str) -> None:
    if not isinstance(obj, dict):
        raise _err(where, f"expected a mapping, got {type(obj).__name__} {obj!r}")
    unknown = [k for k in obj if k not in allowed]
    if unknown:
        raise _err(where, f"unknown key {unknown[0]!r} (value {obj[unknown[0]]!r}); allowed keys: "
                          f"{', '.join(allowed)}")


def parse_split_range(text: Any, where: str) -> Tuple[float, float]:
    """``"START:END"`` -> (start, end) with 0 <= start < end <= 1."""
    if isinstance(text, (list, tuple)) and len(text) == 2:
        parts = list(text)
    elif isinstance(text, str) and text.count(":") == 1:
        parts = text.split(":")
    else:
        raise _err(where, f"split {text!r} is not of the form \"START:END\" (e.g. \"0.98:1\")")
    try:
        start, end = (float(p) for p in parts)
    except (TypeError, ValueError):
        raise _err(where, f"split {text!r}: START and END must be numbers") from None
    if not (0.0 <= start <= 1.0 and 0.0 <= end <= 1.0) or math.isnan(start) or math.isnan(end):
        raise _err(where, f"split {text!r} lies outside [0, 1]")
    if not start < end:
        raise _err(where, f"split {text!r} is empty (START must be < END)")
    return (start, end)


_IDX_MAGIC = b"MMIDIDX\x00\x00"
_IDX_HEADER_BYTES = 34  # magic (9), version <Q, dtype code <B, sequence count <Q, document count <Q
# megatron-core's indexed_dataset.DType codes -> item size in bytes
_IDX_DTYPE_SIZES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 8, 7: 4, 8: 2}


def indexed_dataset_problem(path: str) -> Optional[str]:
    """What is wrong with the ``path.idx``/``path.bin`` pair (megatron-core's indexed dataset
    format), or None if the header is sound and both files are as long as the header says.

    Reads only the 34-byte header and the last sequence's length and pointer, so it is cheap; it
    turns the bare ``AssertionError``/``struct.error``/``ValueError`` megatron-core raises on a
    truncated or foreign file into a message naming the file."""
    idx, bin_ = path + ".idx", path + ".bin"
    fix = "; rebuild it with tools/preprocess_data.py"
    size = os.path.getsize(idx)
    with open(idx, "rb") as f:
        header = f.read(_IDX_HEADER_BYTES)
        if len(header) < _IDX_HEADER_BYTES or header[:9] != _IDX_MAGIC:
            return (f"dataset index {idx!r} is truncated or not a Megatron .idx file ({size} bytes, "
                    f"no valid header){fix}")
        version, code, nseq, ndoc = struct.unpack("<QBQQ", header[9:])
        if version != 1 or code not in _IDX_DTYPE_SIZES:
            return (f"dataset index {idx!r} has an unsupported header (version {version}, dtype code "
                    f"{code}){fix}")
        need = _IDX_HEADER_BYTES + nseq * (4 + 8) + ndoc * 8
        if size < need:
            return (f"dataset index {idx!r} is truncated: {size} bytes, but its header ({nseq} "
                    f"sequences, {ndoc} documents) needs {need}{fix}")
        if nseq == 0:
            return None
        f.seek(_IDX_HEADER_BYTES + (nseq - 1) * 4)
        (last_len,) = struct.unpack("<i", f.read(4))
        f.seek(_IDX_HEADER_BYTES + nseq * 4 + (nseq - 1) * 8)
        (last_ptr,) = struct.unpack("<q", f.read(8))
    bin_need = last_ptr + last_len * _IDX_DTYPE_SIZES[code]
    bin_size = os.path.getsize(bin_)
    if bin_size < bin_need:
        return (f"dataset file {bin_!r} is truncated: {bin_size} bytes, but {idx!r} indexes "
                f"{bin_need}{fix}")
    return None


def missing_files_problem(path: str) -> Optional[str]:
    """The one wording, for every data flag and blend file, of a dataset prefix ``path`` whose
    ``.bin`` or ``.idx`` is missing (the first missing file named, and the other when it is
    missing too), or None when both exist. Checks existence only; no file is opened."""
    missing = [path + ext for ext in (".bin", ".idx") if not os.path.isfile(path + ext)]
    if not missing:
        return None
    nor = f", nor {missing[1]!r}" if len(missing) > 1 else ""
    return (f"dataset file {missing[0]!r} does not exist{nor} (the prefix {path!r} needs "
            f"{path}.bin and {path}.idx, from tools/preprocess_data.py)")


# prefix -> the stat of its .idx and .bin when dataset_prefix_problem last found them readable
_READABLE: Dict[str, Tuple[int, ...]] = {}


def _files_state(path: str) -> Optional[Tuple[int, ...]]:
    """(inode, bytes, mtime in ns) of ``path.idx`` and of ``path.bin``, or None if one is missing."""
    try:
        a, b = os.stat(path + ".idx"), os.stat(path + ".bin")
    except OSError:
        return None
    return (a.st_ino, a.st_size, a.st_mtime_ns, b.st_ino, b.st_size, b.st_mtime_ns)


def dataset_prefix_problem(path: str) -> Optional[str]:
    """What is wrong with the dataset prefix ``path`` (a missing ``.bin``/``.idx``:
    :func:`missing_files_problem`, or what :func:`indexed_dataset_problem` finds in the header),
    or None when it is readable. A prefix found readable is not read again in this process while
    its two files keep their inode, size and modification time (two ``stat`` calls): the start-up
    checks and the constituents' resolution read each header once."""
    state = _files_state(path)
    if state is not None and _READABLE.get(path) == state:
        return None
    problem = missing_files_problem(path) or indexed_dataset_problem(path)
    if problem is None and state is not None:
        _READABLE[path] = state
    return problem


def prefix_problems_message(label: str, problems: Sequence[str], shown: int = PROBLEMS_SHOWN) -> str:
    """One line for all the unreadable dataset prefixes of ``label`` (a flag or a blend file):
    the single problem as it is, or their number, the first ``shown`` and how many more."""
    if len(problems) == 1:
        return f"{label}: {problems[0]}"
    more = f"; ... and {len(problems) - shown} more" if len(problems) > shown else ""
    return (f"{label}: {len(problems)} dataset prefixes are missing or unreadable (each needs a "
            f".bin and an .idx from tools/preprocess_data.py): " + "; ".join(problems[:shown]) + more)


def check_dataset_prefix(path: str, where: str) -> None:
    """Raise naming ``where`` if ``path.bin`` or ``path.idx`` is missing, truncated or corrupt."""
    problem = dataset_prefix_problem(path)
    if problem:
        raise _err(where, problem)


class _PrefixChecks:
    """The dataset prefixes of one blend file, checked as they are parsed (when ``enabled``) and
    reported together at the end (:meth:`raise_if_any`), so a file with a thousand missing shards
    is one error naming the first few."""

    def __init__(self, enabled: bool):
        self.enabled = bool(enabled)
        self.problems: list = []  # (where, problem)

    def check(self, path: str, where: str) -> bool:
        """Whether ``path`` is readable (always True when checks are off); records why not."""
        if not self.enabled:
            return True
        problem = dataset_prefix_problem(path)
        if problem:
            self.problems.append((where, problem))
        return problem is None

    def raise_if_any(self, source: str) -> None:
        if not self.problems:
            return
        if len(self.problems) == 1:
            raise _err(*self.problems[0])
        strip = source + ": "
        texts = [f"{w[len(strip):] if w.startswith(strip) else w}: {p}" for w, p in self.problems]
        raise BlendConfigError(prefix_problems_message(source, texts))


def _checks(check_files) -> _PrefixChecks:
    return check_files if isinstance(check_files, _PrefixChecks) else _PrefixChecks(check_files)


def _resolve_path(path: Any, base_dir: Optional[str], where: str, check_files) -> str:
    if not isinstance(path, str) or not path:
        raise _err(where, f"path must be a non-empty string, got {path!r}")
    resolved = path
    if (base_dir and not os.path.isabs(path) and not os.path.exists(path + ".idx")
            and os.path.exists(os.path.join(base_dir, path) + ".idx")):
        resolved = os.path.join(base_dir, path)
    if isinstance(check_files, _PrefixChecks):
        check_files.check(resolved, where)
    elif check_files:
        check_dataset_prefix(resolved, where)
    return resolved


def range_tokens(path: str, split: Tuple[float, float] = (0.0, 1.0)) -> int:
    """Tokens of the documents of dataset prefix ``path`` in the fraction range ``split`` (the
    range cut as megatron-core cuts it: sequences ``round(start x n)`` to ``round(end x n)``),
    from the ``.idx`` alone: the byte pointers of the range's first and last sequence and the
    last one's length, in items of the file's dtype (three small reads, however large the file)."""
    with open(path + ".idx", "rb") as f:
        _, code, nseq, _ = struct.unpack("<QBQQ", f.read(_IDX_HEADER_BYTES)[9:])
        beg, end = int(round(split[0] * nseq)), int(round(split[1] * nseq))
        if end <= beg:
            return 0
        f.seek(_IDX_HEADER_BYTES + (end - 1) * 4)
        (last_len,) = struct.unpack("<i", f.read(4))
        f.seek(_IDX_HEADER_BYTES + nseq * 4 + beg * 8)
        (first_ptr,) = struct.unpack("<q", f.read(8))
        f.seek(_IDX_HEADER_BYTES + nseq * 4 + (end - 1) * 8)
        (last_ptr,) = struct.unpack("<q", f.read(8))
    return int((last_ptr - first_ptr) // _IDX_DTYPE_SIZES[code] + last_len)


def scaled_weight(weight: Optional[Weight], factor: float) -> Optional[Weight]:
    """``weight`` times ``factor``: a number times it, None (an epochized entry's default) as is,
    a schedule dict wrapped as ``{type: scaled, unit, scale, schedule}`` (:data:`SCALED_WEIGHT_TYPE`)."""
    if weight is None:
        return None
    if not isinstance(weight, dict):
        return float(weight) * float(factor)
    if weight.get("type") == SCALED_WEIGHT_TYPE:
        return dict(weight, scale=float(weight["scale"]) * float(factor))
    return {"type": SCALED_WEIGHT_TYPE, "unit": weight.get("unit", "iterations"),
            "scale": float(factor), "schedule": weight}


def _number(value: Any, where: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = float(value) if isinstance(value, str) else None
        except ValueError:
            value = None
        if value is None:
            raise _err(where, f"{what} must be a number")
    value = float(value)
    if math.isnan(value) or math.isinf(value):
        raise _err(where, f"{what} is not finite")
    return value


def _positive(obj: Dict[str, Any], key: str, where: str, why: str = "") -> float:
    """``obj[key]`` as a number > 0; else one error at ``where.key`` naming the value (and
    ``why``, the reason, when given)."""
    value = _number(obj[key], f"{where}.{key}", f"{key} {obj[key]!r}")
    if not value > 0:
        raise _err(f"{where}.{key}", f"{key} {obj[key]!r} must be > 0" + (f" ({why})" if why else ""))
    return value


def _parse_weight(value: Any, where: str) -> Weight:
    if isinstance(value, dict):
        return _parse_schedule(value, where)
    weight = _number(value, where, f"weight {value!r}")
    if weight < 0:
        raise _err(where, f"weight {value!r} is negative")
    return weight


def _parse_schedule(spec: Dict[str, Any], where: str, points_key: str = "points") -> Dict[str, Any]:
    """Validate the parts of a weight schedule dict this module understands (``unit``,
    ``points``, constant values); other keys are left to the schedule registry. ``points_key``
    is what the file called ``points`` (energon's ``linear``/``step``), for error locations."""
    out = dict(spec)
    if "type" not in spec:
        raise _err(where, f"weight schedule {spec!r} has no 'type' (e.g. linear, step, cosine)")
    unit = spec.get("unit", "iterations")
    if unit not in UNITS:
        raise _err(where + ".unit", f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    out["unit"] = unit
    if "points" in spec:
        points = spec["points"]
        if isinstance(points, dict):
            items = list(points.items())
        elif isinstance(points, (list, tuple)) and all(
                isinstance(p, (list, tuple)) and len(p) == 2 for p in points):
            items = [tuple(p) for p in points]
        else:
            raise _err(f"{where}.{points_key}", f"points {points!r} must be a mapping {{progress: "
                                                "weight}} or a list of [progress, weight] pairs")
        if not items:
            raise _err(f"{where}.{points_key}", "points is empty")
        xs, ys = [], []
        for x, y in items:
            xv = _number(x, f"{where}.{points_key}", f"point {x!r}")
            yv = _number(y, f"{where}.{points_key}[{x!r}]", f"weight {y!r}")
            if yv < 0:
                raise _err(f"{where}.{points_key}[{x!r}]", f"weight {y!r} is negative")
            if xv < 0:
                raise _err(f"{where}.{points_key}", f"point {x!r} is negative")
            xs.append(xv)
            ys.append(yv)
        for a, b in zip(xs, xs[1:], strict=False):
            if not b > a:
                raise _err(f"{where}.{points_key}", f"points are not sorted in increasing order: "
                                                    f"{b:g} comes after {a:g} (points {points!r})")
        out["points"] = {x: y for x, y in zip(xs, ys, strict=True)}
    _check_schedule_keys(spec, where)
    _check_schedule_values(spec, where)
    return out


def _check_schedule_keys(spec: Dict[str, Any], where: str) -> None:
    """Unknown schedule types and keys of ``spec``: asks the schedule registry when it is there."""
    try:
        from megatron.schedules import registry  # lazy: numpy, only for schedule-valued weights
        from megatron.schedules.base import allowed_keys  # lazy: numpy, only for schedule-valued weights
    except ImportError:
        return
    if "type" not in spec:
        raise _err(where, f"weight schedule {spec!r} has no 'type' (e.g. linear, step, cosine)")
    try:
        cls = registry.get_schedule_class(spec["type"])
    except ValueError as exc:
        raise _err(where + ".type", str(exc)) from None
    allowed = allowed_keys(cls)
    for key in spec:
        if key not in allowed:
            raise _err(where, f"unknown key {key!r} (value {spec[key]!r}) for schedule type "
                              f"{spec['type']!r}; allowed keys: {', '.join(sorted(allowed))}")


# the keys of a weight schedule (megatron/schedules/builtin.py and their aliases) whose values
# are weights, so must be finite and non-negative
_WEIGHT_VALUE_KEYS = ("value", "from", "to", "warmup_from", "start_value", "end_value", "min", "max",
                      "learning_rate", "min_lr", "initial_lr", "final_lr")


def _check_weight_value(value: Any, where: str) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return  # not a number: the schedule registry names it
    if math.isnan(value) or math.isinf(value) or value < 0:
        raise _err(where, f"weight {value!r} is not allowed; weights must be finite and >= 0")


def _check_schedule_values(spec: Dict[str, Any], where: str) -> None:
    """The weight-valued keys of schedule ``spec`` (and of its ``stages``' schedules, with the
    stages' keys) are finite and non-negative numbers."""
    for key in _WEIGHT_VALUE_KEYS:
        if key in spec:
            _check_weight_value(spec[key], f"{where}.{key}")
    stages = spec.get("stages")
    if spec.get("type") != "staged" or not isinstance(stages, list):
        return
    for i, stage in enumerate(stages):
        ws = f"{where}.stages[{i}]"
        _check_keys(stage, ("start", "schedule", "value"), ws)
        sub = stage.get("schedule", stage.get("value"))
        if isinstance(sub, dict):
            _check_schedule_keys(sub, ws + ".schedule")
            _check_schedule_values(sub, ws + ".schedule")
        else:
            _check_weight_value(sub, ws + ".schedule")


def _parse_until(value: Any, where: str) -> Tuple[str, int]:
    _check_keys(value, UNITS, where)
    if len(value) != 1:
        raise _err(where, f"until {value!r} must give exactly one of {', '.join(UNITS)}")
    (unit, n), = value.items()
    n = _number(n, where + f".{unit}", f"until {n!r}")
    if n <= 0 or n != int(n):
        raise _err(where + f".{unit}", f"until {value[unit]!r} must be a positive integer")
    return (unit, int(n))


PATH_KEYS = ("path", "paths", "glob")
"""An entry's dataset(s): one prefix, a list of prefixes or a glob of prefixes (a group)."""


def _glob_prefixes(pattern: Any, base_dir: Optional[str], where: str) -> list:
    """The prefixes whose ``.idx`` matches ``pattern + ".idx"``, sorted (relative patterns: the
    working directory first, then the blend file's directory, as paths)."""
    if not isinstance(pattern, str) or not pattern:
        raise _err(where, f"glob must be a non-empty string such as \"data/*_text_document\", got "
                          f"{pattern!r}")
    found = sorted(m[:-len(".idx")] for m in globlib.glob(pattern + ".idx"))
    if not found and base_dir and not os.path.isabs(pattern):
        found = sorted(m[:-len(".idx")] for m in globlib.glob(os.path.join(base_dir, pattern) + ".idx"))
    if not found:
        looked = f" (looked here and under {base_dir})" if base_dir and not os.path.isabs(pattern) else ""
        raise _err(where, f"glob {pattern!r} matches no dataset: no file matches {pattern + '.idx'!r}"
                          f"{looked}; give a pattern of .bin/.idx prefixes, e.g. "
                          "\"data/*_text_document\"")
    return found


def _group_members(item: Dict[str, Any], w: str, base_dir, checks: "_PrefixChecks") -> list:
    """[(resolved prefix, where)] of an entry: its ``path``, or each prefix of its ``paths``/``glob``."""
    keys = [k for k in PATH_KEYS if k in item]
    if len(keys) != 1:
        raise _err(w, f"give exactly one of {', '.join(PATH_KEYS)} (got "
                      f"{', '.join(keys) or 'none'}): a dataset prefix, a list of prefixes or a glob")
    key = keys[0]
    if key == "path":
        return [(_resolve_path(item["path"], base_dir, w + ".path", checks), w)]
    if key == "paths":
        paths = item["paths"]
        if not isinstance(paths, list) or not paths:
            raise _err(w + ".paths", f"paths must be a non-empty list of dataset prefixes, got "
                                     f"{paths!r}")
        members = [(_resolve_path(p, base_dir, f"{w}.paths[{j}]", checks), f"{w}.paths[{j}]")
                   for j, p in enumerate(paths)]
    else:
        members = [(p, f"{w}.glob[{j}]")
                   for j, p in enumerate(_glob_prefixes(item["glob"], base_dir, w + ".glob"))]
        for p, wj in members:
            checks.check(p, wj)
    return members


def _group_weights(members: list, weight: Optional[Weight], split: Tuple[float, float], w: str,
                   checks: "_PrefixChecks") -> list:
    """Each member's weight: the group's ``weight`` times the member's share of the group's
    tokens in ``split`` (:func:`range_tokens`). With unreadable members (reported by ``checks``,
    or files not checked) the shares are equal."""
    if len(members) == 1:
        return [weight]
    if any(dataset_prefix_problem(p) for p, _ in members):
        if checks.enabled:  # the missing prefixes are reported; the weights are never used
            return [weight] * len(members)
        return [scaled_weight(weight, 1.0 / len(members))] * len(members)
    tokens = [range_tokens(p, split) for p, _ in members]
    total = sum(tokens)
    if total <= 0:
        raise _err(w, f"the group's {len(members)} datasets hold no token in split "
                      f"{split[0]:g}:{split[1]:g}: a group with nothing to draw")
    return [scaled_weight(weight, t / total) for t in tokens]


def _parse_entries(items: Any, kind: str, where: str, base_dir, check_files) -> Tuple[BlendEntry, ...]:
    if not isinstance(items, list):
        raise _err(where, f"{kind} must be a list of entries, got {type(items).__name__} {items!r}")
    if not items:
        raise _err(where, f"{kind} is empty: a stage with nothing to draw")
    checks = _checks(check_files)
    allowed = PATH_KEYS + ("weight", "split", "loss_weight") + (
        ("repetitions",) if kind == "epochized_blend" else ("replay",))
    entries, seen = [], {}
    for i, item in enumerate(items):
        w = f"{where}[{i}]"
        _check_keys(item, allowed, w)
        if not any(k in item for k in PATH_KEYS):
            raise _err(w, "missing key 'path' (or 'paths', 'glob' for a group of prefixes)")
        if kind == "blend" and "weight" not in item:
            raise _err(w, "missing key 'weight'")
        members = _group_members(item, w, base_dir, checks)
        if "weight" in item:
            weight = _parse_weight(item["weight"], w + ".weight")
        else:  # epochized_blend default: proportional to the remaining samples
            weight = None
        split = parse_split_range(item["split"], w + ".split") if "split" in item else (0.0, 1.0)
        reps = None
        if kind == "epochized_blend":
            if "repetitions" not in item:
                raise _err(w, "missing key 'repetitions'")
            reps = _positive(item, "repetitions", w)
        loss_weight = 1.0
        if "loss_weight" in item:
            loss_weight = _positive(item, "loss_weight", w, "a dataset not to learn from is left out")
        replay = item.get("replay", False)
        if not isinstance(replay, bool):
            raise _err(w + ".replay", f"replay {replay!r}: give true (draw again from the tokens "
                                      "of this dataset the run drew before this mix) or false")
        weights = _group_weights(members, weight, split, w, checks)
        for (path, wm), weight_m in zip(members, weights, strict=True):
            entry = BlendEntry(path=path, weight=weight_m, split=split, repetitions=reps, where=wm,
                               loss_weight=loss_weight, replay=replay)
            if entry.key in seen:
                raise _err(wm if wm != w else w + ".path",
                           f"dataset {path!r} (split {split[0]:g}:{split[1]:g}"
                           f"{', replay' if replay else ''}) is listed twice in "
                           f"this blend (also at {seen[entry.key]})")
            seen[entry.key] = wm
            entries.append(entry)
    if all(e.weight_is_static and e.weight is not None and e.weight == 0 for e in entries):
        raise _err(where, f"all weights are zero: a stage with nothing to draw (static weight 0 "
                          f"for all {len(entries)} datasets); give a dataset a weight > 0")
    return tuple(entries)


_BLEND_FORMS = ("blend", "epochized_blend", "sequential")


def _parse_mixer(spec: Any, entries: Tuple[BlendEntry, ...], where: str) -> MixerConfig:
    """The ``mixer:`` beside a training ``blend:`` (:class:`MixerConfig`); one line naming the key
    and value for an unknown policy, key or target, a non-positive interval, a negative floor,
    floors summing above 1, ``max_epochs`` with ``target: loss_weight`` (nothing is drawn more
    often) or a weight schedule in the blend (its weights are the starting mix)."""
    if not isinstance(spec, dict):
        raise _err(where, f"expected a mapping {{policy, interval, floor, ...}}, got {spec!r}")
    policy = spec.get("policy")
    if policy not in MIXER_POLICIES:
        raise _err(where + ".policy", f"unknown policy {policy!r}; allowed: "
                                      f"{', '.join(MIXER_POLICIES)}")
    _check_keys(spec, MIXER_KEYS + tuple(MIXER_POLICIES[policy]), where)
    if "interval" not in spec:
        raise _err(where, "missing key 'interval' (iterations between two updates of the weights)")
    interval = spec["interval"]
    if isinstance(interval, bool) or not isinstance(interval, int) or interval <= 0:
        raise _err(where + ".interval", f"interval {interval!r} must be a positive whole number "
                                        "of iterations")
    floor = _number(spec.get("floor", 0.0), where + ".floor", f"floor {spec.get('floor')!r}")
    if floor < 0:
        raise _err(where + ".floor", f"floor {spec['floor']!r} is negative; a floor is a weight "
                                     "in [0, 1/datasets]")
    if floor * len(entries) > 1 + 1e-12:
        raise _err(where + ".floor", f"floor {spec['floor']!r} x {len(entries)} datasets = "
                                     f"{floor * len(entries):g} is above 1; the floors must sum "
                                     f"to at most 1 (floor <= {1 / len(entries):g})")
    for e in entries:
        if not e.weight_is_static:
            raise _err(e.where + ".weight", f"a weight schedule ({e.weight!r}) beside a mixer: the "
                                            "mixer sets the weights, the blend's are the starting "
                                            "mix; give a number")
    target = spec.get("target", "sampling")
    if target not in MIXER_TARGETS:
        raise _err(where + ".target", f"unknown target {target!r}; allowed: {', '.join(MIXER_TARGETS)} "
                                      "(what the mixer's weights move)")
    max_epochs = None
    if "max_epochs" in spec:
        if target == "loss_weight":
            raise _err(where + ".max_epochs", f"max_epochs {spec['max_epochs']!r} beside target "
                                              "loss_weight: the sampling stays the blend's, so no "
                                              "dataset is drawn more often; leave max_epochs out")
        max_epochs = _positive(spec, "max_epochs", where, "the epochs of a dataset the mixer may draw")
    params = []
    for key, default in sorted(MIXER_POLICIES[policy].items()):
        value = _number(spec.get(key, default), f"{where}.{key}", f"{key} {spec.get(key)!r}")
        if value < 0 or (key == "temperature" and value == 0):
            raise _err(f"{where}.{key}", f"{key} {spec[key]!r} must be "
                                         f"{'> 0' if key == 'temperature' else '>= 0'}")
        if key in ("smoothing", "history", "average") and value >= 1:
            raise _err(f"{where}.{key}", f"{key} {spec[key]!r} must be in [0, 1)")
        params.append((key, int(value) if key == "warmup" else value))
    return MixerConfig(str(policy), int(interval), floor, tuple(params), where, max_epochs,
                       str(target))


def _parse_split_blend(obj: Any, where: str, base_dir, check_files, name=None,
                       mixer_allowed: bool = False) -> SplitBlend:
    forms = [k for k in _BLEND_FORMS if isinstance(obj, dict) and k in obj]
    if len(forms) != 1:
        raise _err(where, f"give exactly one of {', '.join(_BLEND_FORMS)} (got {obj!r})")
    form = forms[0]
    # nothing beside the form (`{blend: [...], foo: 1}`) but a training blend's mixer
    _check_keys(obj, _BLEND_FORMS + (("mixer",) if mixer_allowed and form == "blend" else ()),
                where)
    if form in ("blend", "epochized_blend"):
        entries = _parse_entries(obj[form], form, f"{where}.{form}", base_dir, check_files)
        mixer = _parse_mixer(obj["mixer"], entries, f"{where}.mixer") if "mixer" in obj else None
        return SplitBlend(stages=(BlendStage(form, entries, None, f"{where}.{form}"),), name=name,
                          where=where, mixer=mixer)
    stages_spec = obj["sequential"]
    w = f"{where}.sequential"
    if not isinstance(stages_spec, list) or not stages_spec:
        raise _err(w, f"sequential must be a non-empty list of stages, got {stages_spec!r}")
    stages = []
    last_until: Optional[Tuple[str, int]] = None
    for i, spec in enumerate(stages_spec):
        ws = f"{w}[{i}]"
        _check_keys(spec, ("blend", "epochized_blend", "until"), ws)
        kinds = [k for k in ("blend", "epochized_blend") if k in spec]
        if len(kinds) != 1:
            raise _err(ws, f"a stage needs exactly one of blend, epochized_blend (got {spec!r})")
        kind = kinds[0]
        until = _stage_until(spec, kind, ws, i == len(stages_spec) - 1, last_until)
        last_until = until or last_until
        entries = _parse_entries(spec[kind], kind, f"{ws}.{kind}", base_dir, check_files)
        stages.append(BlendStage(kind, entries, until, ws))
    return SplitBlend(stages=tuple(stages), name=name, sequential=True, where=where)


def _stage_until(spec: Dict[str, Any], kind: str, ws: str, is_last: bool,
                 last_until: Optional[Tuple[str, int]]) -> Optional[Tuple[str, int]]:
    """The ``until`` (unit, N) of a sequential stage ``spec`` of ``kind``, or None: only blend
    stages take one, every blend stage but the last needs one, and it must lie after the previous
    stage's ``last_until`` when both are in the same unit."""
    if "until" not in spec:
        if kind == "blend" and not is_last:
            raise _err(ws, "a blend stage other than the last needs 'until: {iterations|samples|"
                           "tokens: N}'")
        return None
    if kind == "epochized_blend":
        raise _err(ws + ".until", "an epochized_blend stage ends when its repetitions are "
                                  f"done; 'until' ({spec['until']!r}) is not allowed")
    until = _parse_until(spec["until"], ws + ".until")
    if last_until and last_until[0] == until[0] and until[1] <= last_until[1]:
        raise _err(ws + ".until", f"until {until[0]}={until[1]} is not after the previous "
                                  f"stage's {last_until[0]}={last_until[1]}: a stage with "
                                  "nothing to draw")
    return until


def _parse_groups(obj: Any, split: str, where: str, base_dir, check_files) -> Tuple[SplitBlend, ...]:
    if isinstance(obj, dict):  # a single unnamed blend form: one group named after the split
        return (_parse_split_blend(obj, where, base_dir, check_files, name=split),)
    if not isinstance(obj, list) or not obj:
        raise _err(where, f"{split} must be a non-empty list of named groups, got {obj!r}")
    groups, names = [], {}
    for i, item in enumerate(obj):
        w = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise _err(w, f"expected a mapping, got {item!r}")
        if "name" not in item or not isinstance(item["name"], str) or not item["name"]:
            raise _err(w, f"a {split} group needs a non-empty 'name' (got {item.get('name')!r})")
        name = item["name"]
        if name in names:
            raise _err(w + ".name", f"group name {name!r} is used twice (also at {names[name]})")
        names[name] = w
        if any(k in item for k in PATH_KEYS):
            _check_keys(item, ("name",) + PATH_KEYS + ("split", "weight"), w)
            entry = {k: v for k, v in item.items() if k != "name"}
            entry.setdefault("weight", 1.0)
            entries = _parse_entries([entry], "blend", w, base_dir, check_files)
            groups.append(SplitBlend(stages=(BlendStage("blend", entries, None, w),), name=name,
                                     where=w))
        else:
            _check_keys(item, ("name",) + _BLEND_FORMS, w)
            groups.append(_parse_split_blend({k: v for k, v in item.items() if k != "name"}, w,
                                             base_dir, check_files, name=name))
    return tuple(groups)


def parse_blend_config(data: Any, source: str = "<blend config>", base_dir: Optional[str] = None,
                       check_files: bool = True) -> BlendConfig:
    """Typed :class:`BlendConfig` from already-loaded YAML/JSON ``data`` (this module's spelling, or
    energon's metadataset spelling: :func:`parse_energon_metadataset`); ``source`` names the file
    in errors."""
    if is_energon_metadataset(data):
        return parse_energon_metadataset(data, source, base_dir, check_files)
    _check_keys(data, ("train", "valid", "test"), source)
    check_files = checks = _checks(check_files)
    train = None
    if data.get("train") is not None:
        train = _parse_split_blend(data["train"], f"{source}: train", base_dir, check_files,
                                   name="train", mixer_allowed=True)
    valid = _parse_groups(data["valid"], "valid", f"{source}: valid", base_dir, check_files) \
        if data.get("valid") is not None else ()
    test = _parse_groups(data["test"], "test", f"{source}: test", base_dir, check_files) \
        if data.get("test") is not None else ()
    checks.raise_if_any(source)
    return BlendConfig(source=source, train=train, valid=valid, test=test)


# ----------------------------------------------------------------------------------------------
# megatron-energon's metadataset spelling (docs/curriculum.md, "Energon's metadataset spelling"),
# read into the same typed config as this module's spelling.
ENERGON_MODULE = "megatron.energon"
ENERGON_CLASSES = ("MetadatasetV2", "Metadataset")
ENERGON_WEIGHT_CLASS = "WeightSchedule"
ENERGON_WEIGHT_KINDS = ("linear", "step")
# energon's split names -> ours (energon calls the validation split "val")
ENERGON_SPLITS = {"train": "train", "val": "valid", "valid": "valid", "test": "test"}
# energon's blend forms (and ours, also accepted) -> the kind they are here
ENERGON_FORMS = {"blend": "blend", "datasets": "blend", "blend_epochized": "epochized_blend",
                 "epochized_blend": "epochized_blend", "sequential_schedule": "sequential",
                 "sequential": "sequential"}
ENERGON_STAGE_FORMS = ("blend", "epochized_blend", "blend_epochized")
# energon keys with no meaning here: refused by name rather than as unknown
ENERGON_UNSUPPORTED = ("subflavors", "subflavor", "split_part", "shuffle_over_epochs_multiplier",
                       "dataset_config", "split_config", "subset", "aux", "join", "joiner",
                       "nonmatch", "path")


def is_energon_metadataset(data: Any) -> bool:
    """Whether loaded blend-file ``data`` is written in energon's metadataset spelling (has
    ``__module__``, ``__class__`` or ``splits`` at the top)."""
    return isinstance(data, dict) and any(k in data for k in ("__module__", "__class__", "splits"))


def _check_energon_keys(obj: Any, allowed: Sequence[str], where: str) -> None:
    """:func:`_check_keys`, except that a key energon knows but this parser does not implement
    gets its own error naming it."""
    if isinstance(obj, dict):
        for key in obj:
            if key not in allowed and key in ENERGON_UNSUPPORTED:
                raise _err(where, f"key {key!r} (value {obj[key]!r}) is energon's and not supported "
                                  f"here; allowed keys here: {', '.join(allowed)}")
    _check_keys(obj, allowed, where)


def _check_energon_class(obj: Dict[str, Any], classes: Sequence[str], where: str) -> None:
    """``__module__`` (if given) must be ``megatron.energon`` and ``__class__`` (if given) one of
    ``classes``."""
    module = obj.get("__module__", ENERGON_MODULE)
    if module != ENERGON_MODULE:
        raise _err(where, f"__module__ {module!r} is not supported; allowed: {ENERGON_MODULE}")
    if "__class__" in obj and obj["__class__"] not in classes:
        raise _err(where, f"__class__ {obj['__class__']!r} is not supported; allowed: "
                          f"{', '.join(classes)} (of {ENERGON_MODULE})")


def _energon_weight(value: Any, where: str) -> Weight:
    """An energon blend weight as ours: a number stays a number; ``{__module__: megatron.energon,
    __class__: WeightSchedule, linear|step: {x: w}}`` (or energon's short ``{linear|step: {...}}``)
    becomes ``{type: linear|step, unit: iterations, points: {x: w}}`` (x in iterations here;
    energon's x is the per-rank batch index). Our own schedule dicts (with ``type``) pass."""
    energon_keys = {"__module__", "__class__"} | set(ENERGON_WEIGHT_KINDS)
    if not isinstance(value, dict) or ("type" in value and not energon_keys & set(value)):
        return value  # ours: checked with the entry
    _check_energon_keys(value, ("__module__", "__class__") + ENERGON_WEIGHT_KINDS, where)
    _check_energon_class(value, (ENERGON_WEIGHT_CLASS,), where)
    kinds = [k for k in ENERGON_WEIGHT_KINDS if k in value]
    if len(kinds) != 1:
        raise _err(where, f"an energon {ENERGON_WEIGHT_CLASS} needs exactly one of "
                          f"{', '.join(ENERGON_WEIGHT_KINDS)} (got {', '.join(kinds) or 'neither'})")
    kind = kinds[0]
    return _parse_schedule({"type": kind, "unit": "iterations", "points": value[kind]}, where,
                           points_key=kind)


def _energon_entries(items: Any, kind: str, where: str, base_dir, check_files) -> Tuple[BlendEntry, ...]:
    """energon dataset references as entries of a ``kind`` stage: weights translated
    (:func:`_energon_weight`), energon's defaults filled (weight 1 in a blend, repetitions 1 in an
    epochized blend)."""
    allowed = ("path", "weight", "split", "loss_weight") + (("repetitions",) if kind == "epochized_blend" else ())
    if not isinstance(items, list):
        return _parse_entries(items, kind, where, base_dir, check_files)  # its error
    ours = []
    for i, item in enumerate(items):
        w = f"{where}[{i}]"
        _check_energon_keys(item, allowed, w)
        item = dict(item)
        if "weight" in item:
            item["weight"] = _energon_weight(item["weight"], w + ".weight")
        elif kind == "blend":
            item["weight"] = 1.0
        if kind == "epochized_blend":
            item.setdefault("repetitions", 1)
        ours.append(item)
    return _parse_entries(ours, kind, where, base_dir, check_files)


def _energon_stage(spec: Any, ws: str) -> Tuple[str, Optional[str], Any]:
    """(kind, key, entries) of one ``sequential_schedule`` stage: ``{blend|epochized_blend|
    blend_epochized: [...]}`` (+ ``until``), or a dataset ``{path, weight?, split?, until?}``,
    which is a blend stage of that one dataset (key None)."""
    if isinstance(spec, dict) and "path" in spec:
        _check_energon_keys(spec, ("path", "weight", "split", "until"), ws)
        return "blend", None, [{k: v for k, v in spec.items() if k != "until"}]
    _check_energon_keys(spec, ENERGON_STAGE_FORMS + ("until",), ws)
    keys = [k for k in ENERGON_STAGE_FORMS if k in spec]
    if len(keys) != 1:
        raise _err(ws, f"a stage needs exactly one of {', '.join(ENERGON_STAGE_FORMS)}, or is a "
                       f"dataset {{path: ...}} (got {spec!r})")
    return ENERGON_FORMS[keys[0]], keys[0], spec[keys[0]]


def _energon_sequential(stages_spec: Any, w: str, base_dir, check_files) -> Tuple[BlendStage, ...]:
    """The stages of an energon ``sequential_schedule`` (same rules as ``sequential``)."""
    if not isinstance(stages_spec, list) or not stages_spec:
        raise _err(w, f"{w.rsplit('.', 1)[-1]} must be a non-empty list of stages, got "
                      f"{stages_spec!r}")
    stages, last_until = [], None
    for i, spec in enumerate(stages_spec):
        ws = f"{w}[{i}]"
        kind, key, items = _energon_stage(spec, ws)
        until = _stage_until(spec, kind, ws, i == len(stages_spec) - 1, last_until)
        last_until = until or last_until
        entries = _energon_entries(items, kind, f"{ws}.{key}" if key else ws, base_dir, check_files)
        stages.append(BlendStage(kind, entries, until, ws))
    return tuple(stages)


def _energon_split_blend(obj: Any, where: str, base_dir, check_files, name: str) -> SplitBlend:
    """One energon split: a blend form of :data:`ENERGON_FORMS` or a single dataset
    ``{path: ..., split?}`` (a blend of that dataset)."""
    if isinstance(obj, dict) and "path" in obj:
        _check_energon_keys(obj, ("path", "split"), where)
        entries = _energon_entries([obj], "blend", where, base_dir, check_files)
        return SplitBlend(stages=(BlendStage("blend", entries, None, where),), name=name,
                          where=where)
    _check_energon_keys(obj, tuple(ENERGON_FORMS), where)
    keys = [k for k in ENERGON_FORMS if k in obj]
    if len(keys) != 1:
        raise _err(where, f"give exactly one of {', '.join(ENERGON_FORMS)}, or a dataset "
                          f"{{path: ...}} (got {obj!r})")
    key = keys[0]
    kind, w = ENERGON_FORMS[key], f"{where}.{key}"
    if kind == "sequential":
        return SplitBlend(stages=_energon_sequential(obj[key], w, base_dir, check_files), name=name,
                          sequential=True, where=where)
    entries = _energon_entries(obj[key], kind, w, base_dir, check_files)
    return SplitBlend(stages=(BlendStage(kind, entries, None, w),), name=name, where=where)


def parse_energon_metadataset(data: Dict[str, Any], source: str = "<blend config>",
                              base_dir: Optional[str] = None, check_files: bool = True) -> BlendConfig:
    """Typed :class:`BlendConfig` from energon's metadataset spelling::

        __module__: megatron.energon
        __class__: MetadatasetV2          # or Metadataset
        splits:
          train: {blend|blend_epochized|sequential_schedule: ...}   # or a dataset {path: ...}
          val: {path: ...}                # one group, named after the split

    energon's keys with the same meaning as ours are read as ours; the others are refused by
    name. Weight schedule positions are global iterations here (energon: the per-rank batch
    index)."""
    _check_energon_keys(data, ("__module__", "__class__", "splits"), source)
    _check_energon_class(data, ENERGON_CLASSES, source)
    if not isinstance(data.get("splits"), dict):
        raise _err(source, f"an energon metadataset needs 'splits: {{train: ..., val: ..., test: "
                           f"...}}' (got {data.get('splits')!r})")
    splits, where = data["splits"], f"{source}: splits"
    _check_energon_keys(splits, tuple(ENERGON_SPLITS), where)
    if "val" in splits and "valid" in splits:
        raise _err(where, "'val' and 'valid' are the same split; give one")
    parsed: Dict[str, Any] = {"train": None, "valid": (), "test": ()}
    check_files = checks = _checks(check_files)
    for key, value in splits.items():
        if value is None:
            continue
        if not isinstance(value, dict):
            raise _err(f"{where}.{key}", f"expected a blend or a dataset {{path: ...}} (a mapping), "
                                         f"got {value!r}")
        blend = _energon_split_blend(value, f"{where}.{key}", base_dir, check_files, name=key)
        split = ENERGON_SPLITS[key]
        parsed[split] = blend if split == "train" else (blend,)
    checks.raise_if_any(source)
    return BlendConfig(source=source, **parsed)


def load_blend_config(path: str, check_files: bool = True) -> BlendConfig:
    """Load ``--data-blend-config FILE`` (``.json`` as JSON, anything else as YAML)."""
    if not os.path.isfile(path):
        raise BlendConfigError(f"--data-blend-config: file {path!r} does not exist")
    with open(path, "r", encoding="utf-8") as f:
        text = f.read()
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise BlendConfigError(f"{path}: cannot parse: {exc}") from exc
    if data is None:
        raise BlendConfigError(f"{path}: the file is empty")
    return parse_blend_config(data, source=path, base_dir=os.path.dirname(os.path.abspath(path)),
                              check_files=check_files)
