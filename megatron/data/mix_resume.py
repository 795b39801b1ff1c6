"""The training mix of a run that starts or resumes: the phases of its data ledger
(megatron/data/mix_ledger.py), the index of the phase it trains in, and the checks and notes of a
resume under an edited mix.

At a resume from a checkpoint whose record says the run stands at global sample ``R``:

* the same mix (blend, dataset files, seed; same run length and batch schedule) continues the
  recorded phase: the same index as an uninterrupted run, so the resume is bitwise;
* the same mix with another run length or batch schedule (``--train-iters`` raised) extends the
  recorded phase when its index up to ``R`` is unchanged (weights in absolute progress), else
  starts a new phase at ``R``;
* an edited mix (a weight, a dataset added or removed, a stage appended, other files, another
  seed) is one error listing each change, unless ``--override-data-mix`` is given: then a new
  phase starts at ``R`` under the new mix, every dataset at its ledger position (a new dataset
  at its first sample; a removed one is no longer drawn and keeps its ledger entry), and a table
  of the datasets (weight at ``R`` under the old and the new mix, samples drawn, epochs) is
  printed.

Stage boundaries and weights of the new mix keep their meaning in absolute run progress (the
file is planned as if it applied from sample 0); only the part after ``R`` is drawn under it.
"""
import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron.data.blend_config import REPLAY_SUFFIX, SCALED_WEIGHT_TYPE, SplitBlend, short_dataset_name
from megatron.data.curriculum.blocked import resolve_index_order
from megatron.data.curriculum.constituents import REPLAY_FINGERPRINT, Constituent
from megatron.data.curriculum.dataset import Continuation, CurriculumDataset, build_mix_dataset
from megatron.data.curriculum.index import CurriculumIndex
from megatron.data.mix_ledger import (
    EvalGroupCounter,
    LedgerEntry,
    LedgerKey,
    MixPhase,
    MixRecord,
    blend_from_json,
    blend_to_json,
)
from megatron.errors import ConfigError
from megatron.schedules.seqlen_plan import SeqLengthPlan
from megatron.schedules.units import BatchSchedule

__all__ = ["DataResume", "MixSources", "MixHistory", "TrainMix", "continue_training_mix",
           "length_change_problem", "resumed_num_samples", "mix_changes", "eval_group_counters",
           "KIND_FLAGS"]

KIND_FLAGS = {"blend_config": "--data-blend-config", "data_path": "--data-path",
              "weighted_split": "--train-weighted-split-paths",
              "t0": "--train-weighted-split-paths (finetune_t0.py)"}


@dataclass(frozen=True)
class DataResume:
    """What the data builders take from the checkpoint a run resumes: its directory and
    iteration, its data record (None for a checkpoint written before records existed), whether an
    edited mix may be taken (``--override-data-mix``) and whether the run only evaluates (then
    another training mix is a note, not an error: nothing is drawn from it)."""

    load_dir: str
    iteration: int
    record: Optional[MixRecord]
    override: bool = False
    evaluate_only: bool = False  # --eval-only/--skip-train: nothing is drawn from the training mix


@dataclass(frozen=True)
class MixSources:
    """How one kind of training data is built: ``resolve(blend)`` gives the blend's datasets
    (:class:`~megatron.data.curriculum.constituents.Constituent`, with fingerprints), ``make_source(c, n,
    seed)`` serves dataset ``c``'s samples ``0..n - 1`` shuffled with ``seed`` (reading its
    indices from ``index_pack``, megatron/data/index_pack.py, when the sources use one);
    ``make_source(c, n, seed, prior)`` its samples since its last sequence-length change, given
    its length history ``prior`` (megatron/data/length_change.py)."""

    kind: str
    resolve: Callable[[SplitBlend], List[Constituent]]
    make_source: Callable[..., Any]
    cache_dir: Optional[str] = None
    order: str = "auto"  # --data-index-order: the order a new phase's index is built in
    index_pack: Any = None  # IndexPack the sources' indices are packed in (or None)
    seq_length: Optional[int] = None  # the sequence length of the samples they serve
    # the same sources at another sequence length (a phase before a --seq-length change); None
    # where the data cannot continue across such a change (packed T0 data)
    at_length: Optional[Callable[[int], "MixSources"]] = None

    def for_phase(self, phase: "MixPhase") -> "MixSources":
        """These sources at the sequence length of ``phase`` (its batch schedule's)."""
        length = int(phase.batch_schedule["seq_length"])
        if self.seq_length is None or length == self.seq_length or self.at_length is None:
            return self
        return self.at_length(length)


def _normalised(obj):
    """``obj`` as it reads back from JSON (tuples become lists, keys strings)."""
    return json.loads(json.dumps(obj, sort_keys=True, default=str))


def _batch_schedule_json(bs: BatchSchedule) -> Dict[str, Any]:
    """``bs`` as the ledger records it; a sequence-length plan (key ``seq_plan``) only when the
    run has one, so ledgers without stay as they were."""
    obj = {f.name: getattr(bs, f.name) for f in fields(bs) if f.name != "seq_plan"}
    if bs.seq_plan is not None:
        obj["seq_plan"] = bs.seq_plan.to_json()
    return _normalised(obj)


def _batch_schedule(obj: Dict[str, Any]) -> BatchSchedule:
    steps = obj.get("steps")
    plan = obj.get("seq_plan")
    return BatchSchedule(global_batch_size=int(obj["global_batch_size"]),
                         rampup=tuple(obj["rampup"]) if obj.get("rampup") else None,
                         seq_length=int(obj["seq_length"]),
                         steps=tuple(tuple(s) for s in steps) if steps else None,
                         seq_plan=SeqLengthPlan.from_json(plan) if plan else None)


# ------------------------------------------------------------------------------------ history
class MixHistory:
    """The phases of a run, rebuilt on demand: the index of any phase (each dataset at the ledger
    position its phase began with) and the ledger at any earlier global sample.
    ``constituents``/``blend``: the last phase's datasets and blend when the caller has resolved
    them already; ``current``: the last phase's dataset when it is built already."""

    def __init__(self, phases: Sequence[MixPhase], sources: MixSources,
                 constituents: Optional[List[Constituent]] = None,
                 blend: Optional[SplitBlend] = None,
                 current: Optional[CurriculumDataset] = None):
        self.phases = list(phases)
        self.sources = sources
        self._datasets: Dict[Tuple[int, bool], CurriculumDataset] = {}
        self._constituents: Dict[int, List[Constituent]] = {}
        self._blends: Dict[int, SplitBlend] = {}
        last = len(self.phases) - 1
        if constituents is not None:  # the last phase's, resolved from ``blend`` by the caller
            self._constituents[last] = list(constituents)
            self._blends[last] = blend
        if current is not None:
            self._datasets[(last, True)] = current

    def blend(self, p: int) -> SplitBlend:
        """Phase ``p``'s blend: as the caller parsed it (the current phase: its errors name the
        file and key), else from the record."""
        if p not in self._blends:
            phase = self.phases[p]
            self._blends[p] = blend_from_json(phase.blend, f"data ledger phase {p} (from sample "
                                                            f"{phase.begin})")
        return self._blends[p]

    def constituents(self, p: int) -> List[Constituent]:
        """The datasets of phase ``p``'s blend (its files must still exist)."""
        if p not in self._constituents:
            phase = self.phases[p]
            try:
                self._constituents[p] = self.sources.for_phase(phase).resolve(self.blend(p))
            except (ConfigError, OSError) as e:
                raise ConfigError(f"data ledger phase {p} (global samples from {phase.begin}): its "
                                  f"datasets cannot be read again: {e}") from None
        return self._constituents[p]

    def dataset(self, p: int, with_sources: bool = True) -> CurriculumDataset:
        """Phase ``p``'s :class:`CurriculumDataset` (its index over ``[begin, num_samples)``;
        without sources when only the index is needed)."""
        for key in ((p, True),) if with_sources else ((p, True), (p, False)):
            if key in self._datasets:
                return self._datasets[key]
        drawn_before = self.drawn_before if p > 0 else None
        if p > 0 and _seq_length(self.phases[p - 1]) != _seq_length(self.phases[p]):
            drawn_before = _across_length_change(self.phases[p - 1], self.phases[p])
        dataset = build_phase(self.phases[p], self.constituents(p), self.sources, drawn_before,
                              with_sources, self.blend(p))
        self._datasets[(p, with_sources)] = dataset
        return dataset

    def drawn_before(self, sample: int) -> Dict[LedgerKey, int]:
        """The ledger at global sample ``sample``: samples drawn before it per dataset key."""
        p = max(k for k, ph in enumerate(self.phases) if ph.begin <= sample)
        phase = self.phases[p]
        counts = phase.base_counts()
        ds = self.dataset(p, with_sources=False)
        stop = min(int(sample), ds.index.num_samples)
        for c, n in zip(self.constituents(p), ds.drawn_before(stop), strict=True):
            counts[c.ledger_key] = int(n)
        return counts


def build_phase(phase: MixPhase, constituents: Sequence[Constituent], sources: MixSources,
                drawn_before: Optional[Callable[[int], Dict[LedgerKey, int]]],
                with_sources: bool = True, blend: Optional[SplitBlend] = None) -> CurriculumDataset:
    """The :class:`CurriculumDataset` of one phase: its blend (``blend``, which ``constituents``
    were resolved from, else the phase's recorded one) over ``[phase.begin, num_samples)``, each
    dataset starting at the phase's ledger (after a sequence-length change, at its samples since
    then, its length history in the ledger entry's ``prior``)."""
    if blend is None:
        blend = blend_from_json(phase.blend, f"data mix phase from sample {phase.begin}")
    continuation = None
    if phase.begin > 0:
        continuation = Continuation(phase.begin, phase.base_counts(), drawn_before)
    sources = sources.for_phase(phase)
    priors = {e.key: e.prior for e in phase.base if e.prior}
    seen = {e.key: e.seen for e in phase.base if e.seen}

    def make(c, n):
        if c.replay:
            if c.ledger_key not in seen:
                raise ConfigError(f"{blend.where}: {c.name}: a replay with no record of what its "
                                  "dataset gave before (its ledger entry has no 'seen')")
            return sources.make_source(c, n, phase.seed, (), seen[c.ledger_key])
        prior = priors.get(c.ledger_key)
        if prior:
            return sources.make_source(c, n, phase.seed, prior)
        return sources.make_source(c, n, phase.seed)

    return build_mix_dataset(blend, constituents, phase.num_samples,
                             _batch_schedule(phase.batch_schedule), phase.seed,
                             make if with_sources else (lambda c, n: None),
                             sources.cache_dir, continuation, phase.index_order,
                             sources.index_pack if with_sources else None)


def _seq_length(phase: MixPhase) -> int:
    return int(phase.batch_schedule["seq_length"])


def _across_length_change(before: MixPhase, after: MixPhase) -> Callable[[int], Dict[LedgerKey, int]]:
    """The ``drawn_before`` of a phase that begins with a change of the sequence length: an
    epochized stage running at its start would count its repetitions in samples of two lengths,
    which is refused in one line."""
    def refuse(stage_begin: int):
        raise ConfigError(
            f"--extend-context: --seq-length {_seq_length(before)} -> {_seq_length(after)} at global "
            f"sample {after.begin}: an epochized_blend stage (repetitions) that began at sample "
            f"{stage_begin} runs across the change, and its repetitions count samples of one "
            "length; end the stage before the extension (its 'until', or fewer repetitions) or "
            "start the extension's mix with a new stage")
    return refuse


# ------------------------------------------------------------------------------------ changes
def _entry_label(entry: Dict[str, Any]) -> str:
    name = short_dataset_name(entry["path"]) + (REPLAY_SUFFIX if entry.get("replay") else "")
    lo, hi = entry["split"]
    return name if (lo, hi) == (0.0, 1.0) else f"{name}[{lo:g}:{hi:g}]"


def _weight_text(weight) -> str:
    """A weight as the user wrote it, compactly: ``2``, ``step {0: 1, 6: 3} (iterations)``."""
    if isinstance(weight, (int, float)):
        return f"{weight:g}"
    if weight is None:
        return "by its repetitions"
    if weight.get("type") == SCALED_WEIGHT_TYPE:  # a group member: its share of the group's weight
        return f"{float(weight['scale']):g} x {_weight_text(weight['schedule'])}"
    rest = {k: v for k, v in weight.items() if k not in ("type", "unit", "points")}
    text = str(weight.get("type"))
    if isinstance(weight.get("points"), dict):
        text += " {" + ", ".join(f"{float(x):g}: {float(y):g}" for x, y in weight["points"].items()) + "}"
    if rest:
        text += " " + json.dumps(rest, sort_keys=True).replace('"', "")
    return f"{text} ({weight.get('unit', 'iterations')})"


def _until_text(until) -> str:
    return "the end of the run" if not until else f"{until[0]} {until[1]}"


def _stage_changes(k: int, old: Optional[dict], new: Optional[dict], prefix: str) -> List[str]:
    if old is None:
        names = ", ".join(_entry_label(e) for e in new["entries"])
        return [f"{prefix}added ({new['kind']} of {names}, until {_until_text(new['until'])})"]
    if new is None:
        return [f"{prefix}removed"]
    out = []
    if old["kind"] != new["kind"]:
        out.append(f"{prefix}{old['kind']} -> {new['kind']}")
    if (old.get("until") or None) != (new.get("until") or None):
        out.append(f"{prefix}until {_until_text(old.get('until'))} -> {_until_text(new.get('until'))}")
    key = (lambda e: (e["path"], tuple(e["split"]), bool(e.get("replay"))))
    before = {key(e): e for e in old["entries"]}
    after = {key(e): e for e in new["entries"]}
    for k_ in before:
        if k_ not in after:
            out.append(f"{prefix}{_entry_label(before[k_])} removed (weight "
                       f"{_weight_text(before[k_]['weight'])})")
    for k_, e in after.items():
        if k_ not in before:
            out.append(f"{prefix}{_entry_label(e)} added (weight {_weight_text(e['weight'])})")
            continue
        b = before[k_]
        if b["weight"] != e["weight"]:
            out.append(f"{prefix}{_entry_label(e)} weight {_weight_text(b['weight'])} -> "
                       f"{_weight_text(e['weight'])}")
        if b.get("repetitions") != e.get("repetitions"):
            out.append(f"{prefix}{_entry_label(e)} repetitions {b.get('repetitions')} -> "
                       f"{e.get('repetitions')}")
    return out


def batch_schedule_of(phase: MixPhase) -> BatchSchedule:
    """The batch schedule ``phase`` was planned for."""
    return _batch_schedule(phase.batch_schedule)


def blend_file_phase(phases: Sequence[MixPhase]) -> MixPhase:
    """The last phase of a blend file (not a segment the adaptive mixer appended): the mix a
    resume's blend file is compared with."""
    return next(p for p in reversed(phases) if p.mixer is None)


def _mixer_text(mixer: Optional[Dict[str, Any]]) -> str:
    return "none" if not mixer else json.dumps(mixer, sort_keys=True).replace('"', "")


def mix_changes(record: MixRecord, kind: str, blend_json: Dict[str, Any], seed: int,
                constituents: Sequence[Constituent], order: str = "auto") -> List[str]:
    """What differs between the checkpoint's current mix and this run's, one phrase per change
    (empty when it is the same mix): the data flag, datasets added or removed, weights,
    repetitions, stages, files of a dataset (its fingerprint), ``--seed`` and an
    ``--data-index-order`` other than the one the checkpoint's mix was drawn in (``auto`` keeps
    the checkpoint's)."""
    current = blend_file_phase(record.phases)  # a mixer's segments are not edits
    out = []
    if order != "auto" and order != current.index_order:
        out.append(f"--data-index-order {current.index_order} -> {order} (the checkpoint's mix was "
                   f"drawn in the {current.index_order} order)")
    if record.kind != kind:
        out.append(f"training data from {KIND_FLAGS[record.kind]} -> {KIND_FLAGS[kind]}")
    if current.seed != seed:
        out.append(f"--seed {current.seed} -> {seed} (every dataset's sample order changes: "
                   "samples of the epochs in progress may repeat)")
    if current.blend.get("mixer") != blend_json.get("mixer"):
        out.append(f"mixer {_mixer_text(current.blend.get('mixer'))} -> "
                   f"{_mixer_text(blend_json.get('mixer'))}")
    old_stages, new_stages = current.blend["stages"], blend_json["stages"]
    single = len(old_stages) == 1 and len(new_stages) == 1
    for k in range(max(len(old_stages), len(new_stages))):
        out += _stage_changes(k, old_stages[k] if k < len(old_stages) else None,
                              new_stages[k] if k < len(new_stages) else None,
                              "" if single else f"stage {k}: ")
    recorded = {(e.path, tuple(e.split), e.fingerprint.endswith(REPLAY_FINGERPRINT)): e
                for e in record.ledger}
    for c in constituents:
        e = recorded.get((c.ledger_key[0], tuple(c.split), c.replay))
        if e is not None and e.fingerprint != c.fingerprint:
            out.append(f"{c.name}: its files changed ({e.fingerprint} -> {c.fingerprint}); it is a "
                       "new dataset to the ledger (starts at its first sample)")
    return out


# ------------------------------------------------------------------------------------ the mix
@dataclass
class TrainMix:
    """The training data of a run with its ledger: ``dataset`` draws the current phase (the last
    of ``phases``); ``ledger(consumed)`` is the ledger once ``consumed`` global samples are
    drawn; ``record(...)`` is what a checkpoint stores."""

    kind: str
    phases: List[MixPhase]
    dataset: CurriculumDataset
    sources: Optional[MixSources] = None
    notes: List[str] = field(default_factory=list)
    eval_groups: List[EvalGroupCounter] = field(default_factory=list)
    # the adaptive mixer's interval in progress (MixRecord.mixer), kept up to date by the loop
    mixer_progress: Optional[Dict[str, Any]] = None

    def mixer_weights(self) -> Optional[Dict[str, float]]:
        """``{dataset name: weight}`` the current phase draws with (normalised) when the blend
        has an adaptive mixer (the blend file's at first, then the last update's), else None."""
        phase = self.phases[-1]
        if not phase.blend.get("mixer"):
            return None
        weights = phase.static_weights()
        total = sum(weights)
        return {c.name: w / total for c, w in zip(self.dataset.constituents, weights, strict=True)}

    def mixer_loss_weights(self) -> Optional[Dict[str, float]]:
        """``{dataset name: loss weight}`` in force (unitless multipliers of the tokens' loss
        mask) when the blend's adaptive mixer moves the loss weights (``target: loss_weight``)
        and has updated them, else None (megatron/train/mixer.py keeps them in
        :attr:`mixer_progress`)."""
        weights = (self.mixer_progress or {}).get("loss_weights")
        if weights is None:
            return None
        return {c.name: float(w) for c, w in zip(self.dataset.constituents, weights, strict=True)}

    def mixer_segment(self) -> Optional[Dict[str, Any]]:
        """The record of the mixer's last update (the current phase's), or None."""
        return self.phases[-1].mixer

    def append_mixer_segment(self, weights: Sequence[float], consumed: int, iteration: int,
                             segment: Dict[str, Any]) -> CurriculumDataset:
        """A new phase from global sample ``consumed`` (after ``iteration``): the current blend
        with the static ``weights`` (one per dataset, in its order), every dataset continuing at
        its ledger position, ``segment`` its record (inputs, weights, the policy's state); the
        new :attr:`dataset` (the same build a resume makes from the record)."""
        current = self.phases[-1]
        blend = json.loads(json.dumps(current.blend))
        entries = [e for stage in blend["stages"] for e in stage["entries"]]
        if len(entries) != len(weights):
            raise ConfigError(f"mixer: {len(weights)} weights for a blend of {len(entries)} datasets")
        for entry, w in zip(entries, weights, strict=True):
            entry["weight"] = float(w)
        phase = MixPhase(int(consumed), blend, current.num_samples, current.batch_schedule,
                         current.seed, self.ledger(consumed), int(iteration), current.order,
                         mixer=_normalised(segment))
        history = self.history()
        split_blend = blend_from_json(blend, f"data mix phase from sample {phase.begin}")
        dataset = build_phase(phase, self.sources.for_phase(phase).resolve(split_blend),
                              self.sources, history.drawn_before, blend=split_blend)
        self.phases.append(phase)
        self.dataset = dataset
        return dataset

    def history(self) -> "MixHistory":
        """The run's phases, rebuilt on demand (the current one is :attr:`dataset`)."""
        return MixHistory(self.phases, self.sources, self.dataset.constituents,
                          self.dataset.index.blend, self.dataset)

    def ledger(self, consumed: int) -> List[LedgerEntry]:
        """Every dataset drawn so far (the current phase's and those of earlier phases), with its
        samples drawn before global sample ``consumed``."""
        phase = self.phases[-1]
        entries = {e.key: replace(e) for e in phase.base}
        stop = min(max(int(consumed), self.dataset.begin), len(self.dataset))
        counts = self.dataset.drawn_before(stop)
        for i, c in enumerate(self.dataset.constituents):
            drawn = int(counts[i])
            if drawn == 0 and c.ledger_key not in entries:
                continue
            known = entries.get(c.ledger_key)
            entries[c.ledger_key] = LedgerEntry(c.name, c.ledger_key[0], tuple(c.split),
                                                c.fingerprint, c.samples_per_epoch, drawn,
                                                prior=known.prior if known else (),
                                                seen=known.seen if known else ())
        names = set()
        for e in entries.values():
            e.epoch, e.position = _epoch_and_position(e, self.dataset)
            base, k = e.name, 2
            while e.name in names:
                e.name, k = f"{base}#{k}", k + 1
            names.add(e.name)
        return list(entries.values())

    def samples_drawn(self, consumed: int) -> Dict[str, int]:
        """``{dataset name: samples drawn}`` once ``consumed`` global samples are drawn."""
        return {e.name: e.drawn for e in self.ledger(consumed)}

    def record(self, iteration: int, consumed: int) -> MixRecord:
        """The checkpoint's record at ``iteration`` (``consumed`` global samples drawn)."""
        return MixRecord(self.kind, int(iteration), int(consumed), list(self.phases),
                         self.ledger(consumed), list(self.eval_groups),
                         mixer=self.mixer_progress)


def _epoch_and_position(entry: LedgerEntry, dataset: CurriculumDataset) -> Tuple[int, int]:
    """(epochs completed, position in the epoch in progress) of ``entry.drawn``: from the samples
    per epoch, else (packed T0 data, whose epochs differ in length; a dataset whose sequence
    length changed, whose first samples since then finish the epoch it was in) from its source's
    epochs, else as recorded."""
    if entry.samples_per_epoch and not entry.prior:
        return divmod(entry.drawn, entry.samples_per_epoch)
    for c, source in zip(dataset.constituents, dataset.datasets, strict=True):
        if c.ledger_key == entry.key and source is not None and hasattr(source, "epoch_and_position"):
            return source.epoch_and_position(entry.drawn)
    return entry.epoch, entry.position


def _phase_at_resume(record: MixRecord, history: MixHistory, sources: MixSources,
                     blend: SplitBlend, constituents, blend_json, bs_json, num_samples: int,
                     seed: int) -> Tuple[MixPhase, CurriculumDataset]:
    """A new phase of ``blend`` from the checkpoint's resume point, every dataset at its ledger
    position, and its dataset."""
    current = record.phases[-1]
    base = [replace(e) for e in record.ledger]
    drawn_before = history.drawn_before
    if _seq_length(current) != int(bs_json["seq_length"]):
        # a context-extension stage: every dataset's samples so far join its length history
        base = [e.after_length_change(_seq_length(current), current.seed) for e in base]
    base += _replays_begun(constituents, base, current, record.consumed_samples, blend)
    phase = MixPhase(record.consumed_samples, blend_json, int(num_samples), bs_json, int(seed),
                     base, record.iteration,
                     resolve_index_order(sources.order, int(num_samples) - record.consumed_samples,
                                         len(constituents)))
    if _seq_length(current) != _seq_length(phase):
        drawn_before = _across_length_change(current, phase)
    return phase, build_phase(phase, constituents, sources, drawn_before, blend=blend)


def _replays_begun(constituents, base: List[LedgerEntry], current: MixPhase, consumed: int,
                   blend: SplitBlend) -> List[LedgerEntry]:
    """The ledger entries of the replays (``replay: true``) a new phase at global sample
    ``consumed`` begins, each holding what its dataset had drawn by then (``seen``: its length
    history); one-line :class:`ConfigError` for a replay of a dataset the run never drew."""
    known = {e.key: e for e in base}
    out = []
    for c in constituents:
        if not c.replay or c.ledger_key in known:
            continue
        entry = known.get(c.replayed().ledger_key)
        seen = entry.history(_seq_length(current), current.seed) if entry is not None else ()
        if not seen:
            raise ConfigError(f"{blend.where}: {c.name} (replay: true) replays "
                              f"{c.replayed().name}, of which the run drew nothing before global "
                              f"sample {consumed}: a replay draws again from what was drawn; "
                              "drop 'replay' to draw it afresh")
        out.append(LedgerEntry(c.name, c.ledger_key[0], tuple(c.split), c.fingerprint, None, 0,
                               seen=tuple(seen)))
    return out


def _index_prefix_equal(a: CurriculumDataset, b: CurriculumDataset, stop: int) -> bool:
    n = stop - a.begin
    return (a.begin == b.begin and np.array_equal(a.dataset_index[:n], b.dataset_index[:n])
            and np.array_equal(a.dataset_sample_index[:n], b.dataset_sample_index[:n]))


def resumed_num_samples(num_samples: int, batch_schedule: BatchSchedule,
                        record: MixRecord) -> int:
    """Global samples the training index must hold when the run resumes from ``record``: the
    checkpoint's consumed samples plus what ``batch_schedule`` draws in the iterations left (from
    the checkpoint's iteration to the ``num_samples`` run's last), and at least ``num_samples``.
    Equal to ``num_samples`` when the batch schedule is the checkpoint's; larger when the global
    batch shrank at the resume (16 -> 4 sequences after 96 samples, 12 iterations in all: 120,
    not 12 x 4 = 48)."""
    iterations = batch_schedule.iterations_for_samples(int(num_samples))
    left = batch_schedule.samples_at_iteration(iterations) - batch_schedule.samples_at_iteration(
        min(int(record.iteration), iterations))
    return max(int(num_samples), int(record.consumed_samples) + int(left))


def length_change_problem(sources: MixSources, blend: SplitBlend, old_length: int,
                          new_length: int, consumed: int) -> Optional[str]:
    """Why the training data of ``sources`` and ``blend`` cannot continue at global sample
    ``consumed`` across a change of the sequence length from ``old_length`` to ``new_length``
    (megatron/data/length_change.py), or None when it can: packed data (no ``at_length``) and
    epochized_blend stages cannot."""
    if sources.at_length is None:
        return (f"--seq-length {old_length} -> {new_length}: the {KIND_FLAGS[sources.kind]} "
                "training data cannot continue across a change of the sequence length (its packs "
                "are built for one length); give --reset-progress to start it at sample 0, or "
                f"keep --seq-length {old_length}")
    epochized = [s.where for s in blend.stages if s.kind == "epochized_blend"]
    if epochized:
        return (f"--seq-length {old_length} -> {new_length} at global sample {consumed}: "
                f"{epochized[0]} is an epochized_blend stage, whose repetitions count samples of "
                "one length and place the stages after it by them; give the extension a mix "
                "without epochized_blend stages (with --override-data-mix), or keep --seq-length "
                f"{old_length}")
    return None


def continue_training_mix(sources: MixSources, blend: SplitBlend, num_samples: int,
                          batch_schedule: BatchSchedule, seed: int,
                          resume: Optional[DataResume]) -> TrainMix:
    """The training mix of this run (see the module docstring): a first phase, the checkpoint's
    phases continued, or a new phase at the resume point. Raises :class:`ConfigError` listing
    the changes when the mix was edited without ``--override-data-mix``."""
    blend_json = _normalised(blend_to_json(blend))
    bs_json = _batch_schedule_json(batch_schedule)
    constituents = sources.resolve(blend)
    fresh = MixPhase(0, blend_json, int(num_samples), bs_json, int(seed),
                     order=resolve_index_order(sources.order, int(num_samples), len(constituents)))
    replays = [c.name for c in constituents if c.replay]
    if replays and (resume is None or resume.record is None):
        raise ConfigError(f"{blend.where}: {replays[0]} (replay: true) needs a resumed run (--load "
                          "of a checkpoint with a data ledger) that drew from its dataset: a "
                          "replay draws again from what was drawn before this mix")
    if resume is None or resume.record is None:
        notes = []
        if resume is not None:
            notes.append(f"data: checkpoint {resume.load_dir} (iteration {resume.iteration}) has no "
                         "data ledger (written before checkpoints carried data_mix.json): the "
                         "training mix is planned from sample 0, as that run planned it")
        dataset = build_phase(fresh, constituents, sources, None, blend=blend)
        return TrainMix(sources.kind, [fresh], dataset, sources, notes)
    record = resume.record
    consumed = record.consumed_samples
    num_samples = resumed_num_samples(num_samples, batch_schedule, record)
    current = record.phases[-1]
    changes = mix_changes(record, sources.kind, blend_json, seed, constituents, sources.order)
    length_change = _seq_length(current) != int(batch_schedule.seq_length)
    if length_change:
        problem = length_change_problem(sources, blend, _seq_length(current),
                                        int(batch_schedule.seq_length), consumed)
        if problem is not None:
            raise ConfigError(f"--load {resume.load_dir}: {problem}")
    segment = current.mixer is not None  # the last phase is the adaptive mixer's: its own blend
    if segment and not changes and (current.num_samples != num_samples
                                    or current.batch_schedule != bs_json or length_change):
        raise ConfigError(
            f"--load {resume.load_dir}: the adaptive mixer's weights of iteration "
            f"{current.mixer['iteration']} were planned for the checkpoint's run length and batch "
            "schedule; resume with the same --train-iters/--train-samples, batch sizes and "
            "--seq-length, or give --override-data-mix to restart the mixer from the blend file")
    keep = not (changes or length_change or segment)
    history = MixHistory(record.phases, sources, constituents if keep else None,
                         blend if keep else None)
    new_phase = (lambda: _phase_at_resume(record, history, sources, blend, constituents,
                                          blend_json, bs_json, num_samples, seed))
    if length_change and (not changes or resume.override):
        phase, dataset = new_phase()
        notes = [f"--extend-context: the training data continues at --seq-length "
                 f"{batch_schedule.seq_length} from global sample {consumed} (iteration "
                 f"{resume.iteration}): each dataset finishes the epoch it was in with the tokens "
                 f"of it not drawn at --seq-length {_seq_length(current)}, then continues"]
        if changes:
            notes += [f"--override-data-mix: the training data mix changes at iteration "
                      f"{resume.iteration} (global sample {consumed}): " + "; ".join(changes),
                      *mix_table(record, history, dataset, consumed)]
        return TrainMix(sources.kind, list(record.phases) + [phase], dataset, sources, notes)
    if not changes:
        if current.num_samples == num_samples and current.batch_schedule == bs_json:
            dataset = history.dataset(len(record.phases) - 1)
            problem = _ledger_problem(record, dataset, resume)
            if problem is None:
                return TrainMix(sources.kind, list(record.phases), dataset, sources,
                                mixer_progress=record.mixer)
            if not resume.override:
                raise ConfigError(problem + "; give --override-data-mix to continue from the ledger")
            phase, dataset = new_phase()
            return TrainMix(sources.kind, list(record.phases) + [phase], dataset, sources,
                            [f"--override-data-mix: {problem}; continuing from the ledger"])
        return _extend_or_start_phase(record, history, sources, blend, constituents, blend_json,
                                      bs_json, num_samples, seed, resume)
    if resume.evaluate_only and not resume.override:
        phase, dataset = new_phase()
        note = (f"data: the training data mix differs from the checkpoint's ({'; '.join(changes)}); "
                "this run only evaluates, so nothing is drawn from it")
        return TrainMix(sources.kind, list(record.phases) + [phase], dataset, sources, [note])
    if not resume.override:
        raise ConfigError(
            f"--load {resume.load_dir}: the training data mix differs from the one the checkpoint "
            f"(iteration {resume.iteration}, global sample {consumed}) was trained on: "
            + "; ".join(changes) + ". Give --override-data-mix to continue under this mix (every "
            "dataset continues at its ledger position; the checkpoint's mix stays in its "
            "history), or resume with the checkpoint's mix")
    phase, dataset = new_phase()
    notes = [f"--override-data-mix: the training data mix changes at iteration {resume.iteration} "
             f"(global sample {consumed}): " + "; ".join(changes),
             *mix_table(record, history, dataset, consumed)]
    return TrainMix(sources.kind, list(record.phases) + [phase], dataset, sources, notes)


def _extend_or_start_phase(record: MixRecord, history: MixHistory, sources: MixSources,
                           blend: SplitBlend, constituents, blend_json, bs_json, num_samples: int,
                           seed: int, resume: DataResume) -> TrainMix:
    """The same mix with another run length or batch schedule: the recorded phase planned for
    the new run, when that draws the same samples up to the resume point; else a new phase at
    the resume point (the weights depend on the run's length)."""
    consumed = record.consumed_samples
    last = len(record.phases) - 1
    current = record.phases[-1]
    extended = replace(current, num_samples=int(num_samples), batch_schedule=bs_json)
    recorded = history.dataset(last, with_sources=False)
    problem = _ledger_problem(record, recorded, resume)
    if problem is not None and not resume.override:
        raise ConfigError(problem + "; give --override-data-mix to continue from the ledger")
    candidate = build_phase(extended, constituents, sources,
                            history.drawn_before if last > 0 else None, blend=blend)
    # a mixer of the loss weights planned nothing for the run's length: it goes on as recorded
    progress = record.mixer if blend.mixer is not None and blend.mixer.target == "loss_weight" \
        else None
    if problem is None and consumed <= candidate.index.num_samples \
            and _index_prefix_equal(recorded, candidate, consumed):
        return TrainMix(sources.kind, list(record.phases[:-1]) + [extended], candidate, sources,
                        mixer_progress=progress)
    phase, dataset = _phase_at_resume(record, history, sources, blend, constituents, blend_json,
                                      bs_json, num_samples, seed)
    note = (f"data: the run's length or batch schedule changed and the blend's weights depend on "
            f"it: the mix continues from global sample {consumed} with every dataset at its "
            "ledger position")
    return TrainMix(sources.kind, list(record.phases) + [phase], dataset, sources, [note],
                    mixer_progress=progress)


def _ledger_problem(record: MixRecord, dataset: CurriculumDataset,
                    resume: DataResume) -> Optional[str]:
    """None when the rebuilt index draws what the checkpoint's ledger says was drawn, else what
    differs (the data files, or the code that builds the index, changed since)."""
    stop = min(record.consumed_samples, len(dataset))
    if stop < dataset.begin:
        return None
    counts = dataset.drawn_before(stop)
    recorded = record.drawn()
    for c, n in zip(dataset.constituents, counts, strict=True):
        want = recorded.get(c.ledger_key, 0)
        if int(n) != want:
            return (f"--load {resume.load_dir}: the checkpoint's data ledger says {c.name} gave "
                    f"{want} samples by global sample {record.consumed_samples}, but the index "
                    f"rebuilt from the same mix gives {int(n)}: the data or the index code changed "
                    "since")
    return None


def mix_table(record: MixRecord, history: MixHistory, dataset: CurriculumDataset,
              consumed: int) -> List[str]:
    """The lines of the table printed when a mix is edited: per dataset, its normalised weight
    at the resume point under the old and the new mix, the samples drawn and the epochs."""
    old_weights: Dict[LedgerKey, float] = {}
    try:
        last = len(history.phases) - 1
        plan = CurriculumIndex(blend_from_json(history.phases[last].blend),
                               history.constituents(last), history.phases[last].num_samples,
                               _batch_schedule(history.phases[last].batch_schedule), build=False)
        w = plan.target_weights([min(consumed, plan.num_samples - 1)])[:, 0]
        old_weights = {c.ledger_key: float(x) for c, x in zip(plan.constituents, w, strict=True)}
    except ConfigError:
        pass  # the old mix's files are gone: its weights show as n/a
    new = dataset.index.target_weights([min(consumed, len(dataset) - 1)])[:, 0]
    new_weights = {c.ledger_key: float(x) for c, x in zip(dataset.constituents, new, strict=True)}
    drawn = {e.key: e for e in record.ledger}
    keys = list(drawn) + [c.ledger_key for c in dataset.constituents if c.ledger_key not in drawn]
    names = {e.key: e.name for e in record.ledger}
    names.update({c.ledger_key: c.name for c in dataset.constituents})
    spe = {c.ledger_key: c.samples_per_epoch for c in dataset.constituents}
    rows = [("dataset", "weight old", "weight new", "samples drawn", "epochs")]
    for key in keys:
        e = drawn.get(key)
        n = e.drawn if e else 0
        per_epoch = spe.get(key) or (e.samples_per_epoch if e else None)
        fmt = (lambda w: "n/a" if w is None else f"{w:.4f}")
        rows.append((names[key], fmt(old_weights.get(key)) if old_weights else "n/a",
                     fmt(new_weights.get(key, 0.0)), str(n),
                     f"{n / per_epoch:.3f}" if per_epoch else f"{e.epoch if e else 0} + {e.position if e else 0}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    return ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            for row in rows]


# ------------------------------------------------------------------------------ evaluation
def eval_group_counters(record: Optional[MixRecord], groups: Sequence[Tuple[str, str]],
                        iteration: int, eval_interval: int) -> Tuple[List[EvalGroupCounter], List[str]]:
    """Each ``(split, name)`` group's counter: a group of the checkpoint keeps its
    ``first_evaluation``; a group new at this resume (at ``iteration``) starts with its first
    window at the next evaluation (number ``iteration // eval_interval``). Returns the counters
    and notes naming the groups added and removed."""
    recorded = {(g.split, g.name): g for g in (record.eval_groups if record else [])}
    counters, notes = [], []
    for split, name in groups:
        if (split, name) in recorded or record is None:
            counters.append(recorded.get((split, name), EvalGroupCounter(split, name, 0)))
        else:
            first = int(iteration) // int(eval_interval)
            counters.append(EvalGroupCounter(split, name, first))
            notes.append(f"data: {split} group {name!r} is new at this resume: its evaluations "
                         f"start at its first window (evaluation {first} of the run)")
    for split, name in recorded:
        if (split, name) not in set(groups):
            notes.append(f"data: {split} group {name!r} of the checkpoint is not evaluated any more")
    return counters, notes
