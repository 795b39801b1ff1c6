"""The data ledger a checkpoint carries: which training datasets a run has drawn from, how many
samples of each, and the history of mixes (phases) that drew them.

A *dataset* of the ledger is identified by its ``.bin/.idx`` prefix (absolute path), its document
range (``split``) and a fingerprint of its files (document and sequence counts and file sizes),
so a dataset rebuilt from other documents is another dataset. Its *position* is the number of its
samples drawn so far (``drawn``): sample ``k`` of a dataset is the same whatever the mix
(megatron/data/epoch_order.py), so a resumed run, under the same or an edited mix, continues every
dataset at ``drawn``.

A *phase* is one mix over a range of global samples: phase ``p`` drew global samples
``[begin_p, begin_{p+1})`` from its blend (a typed :class:`~megatron.data.blend_config.SplitBlend`
kept as JSON, so an edited or deleted blend file does not change the history), planned for the
run length and batch schedule it records, each dataset starting at the ledger position it had at
``begin_p``. The first phase begins at 0; ``--override-data-mix`` appends one at a resume
(megatron/data/mix_resume.py).

The record is the JSON object ``data_mix.json`` of a checkpoint directory (written and read by
megatron/checkpoint/format.py)::

    {"version": 1, "kind": "blend_config" | "data_path" | "weighted_split" | "t0",
     "iteration": I, "consumed_samples": S,
     "phases": [{"begin", "begin_iteration", "num_samples", "seed", "batch_schedule": {...},
                 "blend": {...}, "base": [ledger entries at begin]}, ...],
     "ledger": [{"name", "path", "split", "fingerprint", "samples_per_epoch", "drawn", "epoch",
                 "position", "prior": [{"seq_length", "drawn", "seed"}, ...]}, ...],
     "eval_groups": [{"split", "name", "first_evaluation"}, ...]}

``drawn`` counts samples (of that dataset) at the run's current sequence length; after a change of
``--seq-length`` (a context-extension stage) it restarts at 0 and ``prior`` keeps the samples
drawn at each earlier length (megatron/data/length_change.py; absent before any change);
``begin``/``num_samples``/``consumed_samples`` count
global samples; ``first_evaluation`` is the evaluation number at which a validation group joined
the run (its windows are counted from there).
"""
import os
import struct
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Dict, List, Optional, Tuple

from megatron.data.blend_config import BlendEntry, BlendStage, MixerConfig, SplitBlend
from megatron.errors import ConfigError

__all__ = ["RECORD_VERSION", "LedgerKey", "LengthSegment", "LedgerEntry", "MixPhase", "EvalGroupCounter",
           "MixRecord", "gpt_files_fingerprint", "ledger_key"]

RECORD_VERSION = 1
KINDS = ("blend_config", "data_path", "weighted_split", "t0")

# (absolute prefix, split start, split end, fingerprint)
LedgerKey = Tuple[str, float, float, str]


def gpt_files_fingerprint(prefix: str, counts: Optional[Tuple[int, int]] = None) -> str:
    """``"documents=D sequences=S idx_bytes=I bin_bytes=B"`` of a megatron-core indexed dataset
    (``prefix.idx`` header and the two file sizes): what tells a dataset apart from another one
    written at the same path. ``counts``: the header's (sequence count, document-index length)
    where the caller has the index open already (then only the sizes are read)."""
    idx = prefix + ".idx"
    if counts is None:
        with open(idx, "rb") as f:
            header = f.read(34)
        if len(header) < 34:
            raise ConfigError(f"dataset index {idx!r} is truncated (no header)")
        _, _, sequences, documents = struct.unpack("<QBQQ", header[9:34])
    else:
        sequences, documents = (int(c) for c in counts)
    return (f"documents={documents - 1 if documents else 0} sequences={sequences} "
            f"idx_bytes={os.path.getsize(idx)} bin_bytes={os.path.getsize(prefix + '.bin')}")


def ledger_key(path: str, split: Tuple[float, float], fingerprint: str) -> LedgerKey:
    """The ledger's identity of a dataset."""
    return (os.path.abspath(path), float(split[0]), float(split[1]), fingerprint)


@dataclass(frozen=True)
class LengthSegment:
    """``drawn`` samples of a dataset drawn at ``seq_length`` (their order seeded ``seed``),
    numbered from the dataset's previous sequence-length change (or its first sample): one step
    of its length history (megatron/data/length_change.py)."""

    seq_length: int
    drawn: int
    seed: int

    def to_json(self) -> Dict[str, int]:
        return {"seq_length": self.seq_length, "drawn": self.drawn, "seed": self.seed}

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "LengthSegment":
        return cls(int(obj["seq_length"]), int(obj["drawn"]), int(obj["seed"]))


@dataclass
class LedgerEntry:
    """One dataset of the ledger: identity, ``drawn`` samples so far, and where that leaves it:
    ``epoch`` (completed epochs) and ``position`` (in the epoch in progress)."""

    name: str
    path: str
    split: Tuple[float, float]
    fingerprint: str
    samples_per_epoch: Optional[int]
    drawn: int = 0
    epoch: int = 0
    position: int = 0
    prior: Tuple[LengthSegment, ...] = ()  # samples drawn at earlier sequence lengths
    # a replay (``replay: true`` entry): the history of its dataset when the replay began, which
    # says what it drew before (the tokens the replay draws again)
    seen: Tuple[LengthSegment, ...] = ()

    @property
    def key(self) -> LedgerKey:
        return ledger_key(self.path, self.split, self.fingerprint)

    def to_json(self) -> Dict[str, Any]:
        out = asdict(self)
        out["split"] = list(self.split)
        del out["prior"], out["seen"]
        if self.prior:  # only after a length change: earlier records stay as they were
            out["prior"] = [s.to_json() for s in self.prior]
        if self.seen:
            out["seen"] = [s.to_json() for s in self.seen]
        return out

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "LedgerEntry":
        return cls(name=obj["name"], path=obj["path"], split=tuple(obj["split"]),
                   fingerprint=obj["fingerprint"], samples_per_epoch=obj.get("samples_per_epoch"),
                   drawn=int(obj["drawn"]), epoch=int(obj.get("epoch", 0)),
                   position=int(obj.get("position", 0)),
                   prior=tuple(LengthSegment.from_json(s) for s in obj.get("prior", ())),
                   seen=tuple(LengthSegment.from_json(s) for s in obj.get("seen", ())))

    def history(self, seq_length: int, seed: int) -> Tuple[LengthSegment, ...]:
        """Every length segment of this dataset, its current one (``drawn`` samples at
        ``seq_length``, seeded ``seed``) last when it has drawn any."""
        return self.prior + ((LengthSegment(int(seq_length), self.drawn, int(seed)),)
                             if self.drawn else ())

    def after_length_change(self, seq_length: int, seed: int) -> "LedgerEntry":
        """This entry once the run's sequence length changes from ``seq_length`` (the length its
        ``drawn`` samples have; drawn in the order seeded ``seed``): its samples so far join
        ``prior`` and its count restarts at 0 (megatron/data/length_change.py)."""
        return replace(self, drawn=0, position=0, prior=self.history(seq_length, seed))


@dataclass
class MixPhase:
    """One mix of the run, from global sample ``begin`` (after ``begin_iteration`` iterations)
    until the next phase begins: its blend (JSON of a SplitBlend), the run length
    ``num_samples`` (global samples) and batch schedule (BatchSchedule fields) its plan was made
    for, the seed of its datasets' shuffles, and the ledger at ``begin`` (``base``: every dataset
    drawn before it, with its ``drawn`` count)."""

    begin: int
    blend: Dict[str, Any]
    num_samples: int
    batch_schedule: Dict[str, Any]
    seed: int
    base: List[LedgerEntry] = field(default_factory=list)
    begin_iteration: int = 0
    order: Optional[str] = None  # the index's order; None: a record from before orders (greedy)
    # a segment the adaptive mixer appended (issue 46): {"iteration", "losses", "drawn",
    # "remaining", "weights", "state"} (its inputs, the weights of this phase's blend and the
    # policy's state after the update); None for a phase of the blend file
    mixer: Optional[Dict[str, Any]] = None

    @property
    def index_order(self) -> str:
        """The order this phase's index is drawn in (``greedy`` for a record that has none: the
        only order there was)."""
        return self.order or "greedy"

    def to_json(self) -> Dict[str, Any]:
        out = {"begin": self.begin, "begin_iteration": self.begin_iteration, "blend": self.blend,
               "num_samples": self.num_samples, "batch_schedule": self.batch_schedule,
               "seed": self.seed, "base": [e.to_json() for e in self.base]}
        if self.order is not None:
            out["order"] = self.order
        if self.mixer is not None:
            out["mixer"] = self.mixer
        return out

    @classmethod
    def from_json(cls, obj: Dict[str, Any]) -> "MixPhase":
        return cls(begin=int(obj["begin"]), blend=obj["blend"], num_samples=int(obj["num_samples"]),
                   batch_schedule=dict(obj["batch_schedule"]), seed=int(obj["seed"]),
                   base=[LedgerEntry.from_json(e) for e in obj.get("base", [])],
                   begin_iteration=int(obj.get("begin_iteration", 0)), order=obj.get("order"),
                   mixer=obj.get("mixer"))

    def static_weights(self) -> List[float]:
        """Each dataset's weight in this phase's blend, in its entries' order (a blend of numbers
        only: an adaptive mixer's, whose weights are static)."""
        return [float(e["weight"]) for stage in self.blend["stages"] for e in stage["entries"]]

    def base_counts(self) -> Dict[LedgerKey, int]:
        """``{dataset key: samples drawn before begin}``."""
        return {e.key: e.drawn for e in self.base}


@dataclass
class EvalGroupCounter:
    """A validation or test group and the evaluation number at which it joined the run: its
    ``k``-th evaluation reads its ``k``-th window, ``k`` counted from ``first_evaluation``."""

    split: str
    name: str
    first_evaluation: int = 0


@dataclass
class MixRecord:
    """What a checkpoint records of the run's data (see the module docstring)."""

    kind: str
    iteration: int
    consumed_samples: int
    phases: List[MixPhase]
    ledger: List[LedgerEntry]
    eval_groups: List[EvalGroupCounter] = field(default_factory=list)
    version: int = RECORD_VERSION
    # the adaptive mixer's interval in progress (issue 46): {"since": iteration of its last
    # update, "sums", "counts": the global per-dataset loss sums and weights since}; None without
    mixer: Optional[Dict[str, Any]] = None

    def to_json(self) -> Dict[str, Any]:
        out = {"version": self.version, "kind": self.kind, "iteration": self.iteration,
               "consumed_samples": self.consumed_samples,
               "phases": [p.to_json() for p in self.phases],
               "ledger": [e.to_json() for e in self.ledger],
               "eval_groups": [asdict(g) for g in self.eval_groups]}
        if self.mixer is not None:
            out["mixer"] = self.mixer
        return out

    @classmethod
    def from_json(cls, obj: Dict[str, Any], where: str = "data_mix.json") -> "MixRecord":
        version = obj.get("version")
        if version != RECORD_VERSION:
            raise ConfigError(f"{where}: data ledger version {version!r} is not supported "
                              f"(this code reads version {RECORD_VERSION})")
        if obj.get("kind") not in KINDS:
            raise ConfigError(f"{where}: unknown data kind {obj.get('kind')!r} (known: "
                              f"{', '.join(KINDS)})")
        return cls(kind=obj["kind"], iteration=int(obj["iteration"]),
                   consumed_samples=int(obj["consumed_samples"]),
                   phases=[MixPhase.from_json(p) for p in obj["phases"]],
                   ledger=[LedgerEntry.from_json(e) for e in obj["ledger"]],
                   eval_groups=[EvalGroupCounter(**g) for g in obj.get("eval_groups", [])],
                   mixer=obj.get("mixer"))

    def drawn(self) -> Dict[LedgerKey, int]:
        """``{dataset key: samples drawn}`` at ``consumed_samples``."""
        return {e.key: e.drawn for e in self.ledger}

    def phase_at(self, sample: int) -> int:
        """Index of the phase that drew global sample ``sample``."""
        index = 0
        for k, phase in enumerate(self.phases):
            if phase.begin <= sample:
                index = k
        return index


def blend_to_json(blend) -> Dict[str, Any]:
    """A :class:`~megatron.data.blend_config.SplitBlend` as JSON (paths absolute, weights as
    written: numbers or schedule dicts), for the record and for comparing two mixes."""
    def entry(e):
        out = {"path": os.path.abspath(e.path), "weight": e.weight, "split": list(e.split)}
        if e.repetitions is not None:
            out["repetitions"] = e.repetitions
        if e.replay:
            out["replay"] = True
        return out

    out = {"name": blend.name, "sequential": bool(blend.sequential),
           "stages": [{"kind": s.kind, "until": list(s.until) if s.until else None,
                       "entries": [entry(e) for e in s.entries]} for s in blend.stages]}
    if blend.mixer is not None:  # only with one: ledgers without stay as they were
        out["mixer"] = blend.mixer.to_json()
    return out


def blend_from_json(obj: Dict[str, Any], where: str = "data_mix.json"):
    """The :class:`~megatron.data.blend_config.SplitBlend` of :func:`blend_to_json`'s JSON;
    ``where`` prefixes the entries' error locations."""
    stages = []
    for k, s in enumerate(obj["stages"]):
        w = f"{where} stage {k}"
        entries = tuple(BlendEntry(path=e["path"], weight=_weight_from_json(e["weight"]),
                                   split=tuple(float(x) for x in e["split"]),
                                   repetitions=e.get("repetitions"), where=f"{w} entry {i}",
                                   replay=bool(e.get("replay", False)))
                        for i, e in enumerate(s["entries"]))
        until = (s["until"][0], int(s["until"][1])) if s.get("until") else None
        stages.append(BlendStage(s["kind"], entries, until, w))
    mixer = None
    if obj.get("mixer"):
        m = dict(obj["mixer"])
        cap = m.pop("max_epochs", None)
        target = m.pop("target", "sampling")
        mixer = MixerConfig(m.pop("policy"), int(m.pop("interval")), float(m.pop("floor")),
                            tuple(sorted(m.items())), f"{where} mixer",
                            None if cap is None else float(cap), str(target))
    return SplitBlend(stages=tuple(stages), name=obj.get("name"),
                      sequential=bool(obj.get("sequential")), where=where, mixer=mixer)


def _weight_from_json(weight):
    """JSON turns a schedule's ``points`` keys into strings: back to numbers (as parsed), in a
    group member's scaled schedule (``{type: scaled, schedule: ...}``) too."""
    if isinstance(weight, dict) and isinstance(weight.get("schedule"), dict):
        weight = dict(weight, schedule=_weight_from_json(weight["schedule"]))
    if isinstance(weight, dict) and isinstance(weight.get("points"), dict):
        return dict(weight, points={float(x): y for x, y in weight["points"].items()})
    return weight
