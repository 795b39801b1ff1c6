"""An adaptive run's mixture as a blend file (issue 46, "replay"): the phases of a checkpoint's
data ledger (megatron/data/mix_ledger.py), each a mix of static weights from the global sample
where it began (the blend file's, then one per mixer update or ``--override-data-mix`` edit),
written as ``sequential`` stages of a ``--data-blend-config`` file, one per phase, each ``until``
the next phase's first global sample.

A phase draws from its first global sample on with every dataset continuing at its ledger
position, as a ``sequential`` stage does, and both build the stage's index from its own first
sample; in the greedy order (``--data-index-order``) each sample goes to the dataset furthest
behind its target counted from that first sample, whatever the stage's end, so a run from the
exported file, with the recorded run length, batch schedule and seed, draws at every global sample
the (dataset, sample) the adaptive run drew (tests/unit/test_mixture_export.py, against the
adaptive run sample for sample, for each policy). The blocked order cuts a phase into blocks up to
the run's end and a stage up to its ``until``, which interleave differently: refused in one line. After the checkpoint's iteration the static run keeps the last phase's weights,
where the adaptive run would have gone on updating.

The ``valid``/``test`` groups and the entries' ``loss_weight`` are not in the ledger (they do not
choose samples): they are copied from the run's blend file when it is given.
"""
import os
from typing import Any, Dict, List, Optional, Tuple

from megatron.data.blend_config import BlendConfig, BlendEntry, BlendStage, SplitBlend
from megatron.data.mix_ledger import MixPhase, MixRecord, blend_from_json
from megatron.errors import ConfigError

__all__ = ["split_blend_to_file", "exported_blend_file", "mixer_updates"]

WHOLE = (0.0, 1.0)


def _entry_to_file(entry: BlendEntry, kind: str, loss_weight: float) -> Dict[str, Any]:
    """One entry in the blend file's spelling (``path``, ``weight``, ``split``, ...; only what
    differs from the defaults besides ``path``, and a ``blend`` entry's weight always)."""
    out: Dict[str, Any] = {"path": entry.path}
    if entry.weight is not None and (kind == "blend" or entry.weight != 1.0):
        out["weight"] = entry.weight
    if tuple(entry.split) != WHOLE:
        out["split"] = f"{entry.split[0]!r}:{entry.split[1]!r}"
    if entry.repetitions is not None:
        out["repetitions"] = entry.repetitions
    if loss_weight != 1.0:
        out["loss_weight"] = loss_weight
    if entry.replay:
        out["replay"] = True
    return out


def _stage_to_file(stage: BlendStage, loss_weights: Dict[Tuple, float]) -> Dict[str, Any]:
    out: Dict[str, Any] = {stage.kind: [
        _entry_to_file(e, stage.kind,
                       loss_weights.get((os.path.abspath(e.path), tuple(e.split)), e.loss_weight))
        for e in stage.entries]}
    if stage.until is not None:
        out["until"] = {stage.until[0]: stage.until[1]}
    return out


def split_blend_to_file(blend: SplitBlend) -> Dict[str, Any]:
    """A parsed split or group (:class:`SplitBlend`) in the blend file's spelling: ``{blend: [...]}``,
    ``{epochized_blend: [...]}`` or ``{sequential: [...]}`` (with its ``mixer``), paths absolute.
    Parsing it again gives the same blend."""
    if blend.sequential:
        out: Dict[str, Any] = {"sequential": [_stage_to_file(s, {}) for s in blend.stages]}
    else:
        out = _stage_to_file(blend.stages[0], {})
        out.pop("until", None)
    if blend.mixer is not None:
        out["mixer"] = blend.mixer.to_json()
    return out


def _phase_problem(k: int, phase, blend: SplitBlend) -> Optional[str]:
    """Why phase ``k`` cannot be one ``sequential`` stage, or None."""
    where = f"phase {k} (from iteration {phase.begin_iteration})"
    if blend.sequential or len(blend.stages) != 1 or blend.stages[0].kind != "blend":
        return (f"{where} draws a {'sequential' if blend.sequential else blend.stages[0].kind} "
                "mix; only phases of one 'blend' (an adaptive run's, or an edit to one) export "
                "as stages")
    replays = [e.path for e in blend.stages[0].entries if e.replay]
    if replays:
        return (f"{where} replays {replays[0]} (replay: true), the tokens its run drew before; a "
                "run from the exported file has drawn none")
    return None


def exported_blend_file(record: MixRecord, original: Optional[BlendConfig] = None
                        ) -> Tuple[Dict[str, Any], List[str]]:
    """``(blend file, notes)``: the ``train`` section as ``sequential`` stages, one per phase of
    ``record`` (its static weights, ``until: {samples: next phase's first global sample}``; the
    last without), ``valid``/``test`` and the training entries' ``loss_weight`` from
    ``original`` (the run's parsed blend file, or None: training only); ``notes`` are the lines
    for the file's header: what it was exported from and the flags a run needs to draw the same
    samples (run length and batch schedule, seed, index order). Raises :class:`ConfigError`
    naming the phase that a stage cannot express (a T0 mix, a sequential or epochized mix, a
    replay), a change of run length, batch schedule, seed or order between phases, and phases
    drawn in the blocked order (the module docstring)."""
    if record.kind == "t0":
        raise ConfigError("the checkpoint's data is a T0 mix (finetune_t0.py): its phases are "
                          "not blend files")
    first = record.phases[0]
    if first.index_order != "greedy" and len(record.phases) > 1:
        raise ConfigError(
            f"the run's mix was drawn in the {first.index_order} order (--data-index-order), whose "
            "blocks run from a phase's first sample to the end of the run, while a sequential "
            "stage's end at its 'until': no blend file draws the same samples. Give an adaptive "
            "run to be exported --data-index-order greedy (O(samples x datasets), about 2 ns each: "
            "seconds for a billion samples of a few datasets)")
    stages = []
    loss_weights: Dict[Tuple, float] = {}
    if original is not None and original.train is not None:
        loss_weights = {(os.path.abspath(e.path), tuple(e.split)): e.loss_weight
                        for s in original.train.stages for e in s.entries}
    for k, phase in enumerate(record.phases):
        for field in ("num_samples", "batch_schedule", "seed", "index_order"):
            if getattr(phase, field) != getattr(first, field):
                raise ConfigError(f"phase {k} (from iteration {phase.begin_iteration}) was planned "
                                  f"with {field} {getattr(phase, field)!r}, phase 0 with "
                                  f"{getattr(first, field)!r}: one static run cannot draw both")
        blend = blend_from_json(phase.blend, where=f"data_mix.json phase {k}")
        problem = _phase_problem(k, phase, blend)
        if problem:
            raise ConfigError(problem)
        stage = _stage_to_file(blend.stages[0], loss_weights)
        if k + 1 < len(record.phases):
            stage["until"] = {"samples": record.phases[k + 1].begin}
        stages.append(stage)
    out: Dict[str, Any] = {"train": {"sequential": stages}}
    if original is not None:
        for split in ("valid", "test"):
            groups = getattr(original, split)
            if groups:
                out[split] = [dict(name=g.name, **split_blend_to_file(g)) for g in groups]
    updates = sum(p.mixer is not None for p in record.phases)
    notes = [
        f"the data mix of a run at iteration {record.iteration} ({record.consumed_samples} global "
        f"samples): {len(record.phases)} phases, {updates} of them adaptive-mixer updates, as "
        "sequential stages (megatron/data/mixture_export.py)",
        "a run from this file draws the same (dataset, sample) at every global sample with the "
        f"recorded plan: {first.num_samples} global samples, batch schedule "
        f"{_plain(first.batch_schedule)}, --seed {first.seed}, --data-index-order "
        f"{first.index_order}; after iteration {record.iteration} it keeps the last weights",
    ]
    if original is None:
        notes.append("no --data-blend-config given: no valid/test groups, every loss_weight 1")
    return out, notes


def _plain(obj: Dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in obj.items() if v is not None)


def mixer_updates(phases: List[MixPhase]) -> List[Dict[str, Any]]:
    """The adaptive mixer's updates among a data ledger's ``phases``: per update ``{"iteration",
    "begin" (global sample), "weights": {dataset: weight}, "losses": {dataset: loss}}``, plus
    ``"fallback"`` where a cap lowered a weight (the names are the phase blend's datasets)."""
    out = []
    for k, phase in enumerate(phases):
        if phase.mixer is None:
            continue
        blend = blend_from_json(phase.blend, where=f"data_mix.json phase {k}")
        names = [e.name for e in blend.stages[0].entries]
        m = phase.mixer
        update = {"iteration": m["iteration"], "policy": m.get("policy"), "begin": phase.begin,
                  "weights": dict(zip(names, m["weights"], strict=True)),
                  "losses": dict(zip(names, m["losses"], strict=True))}
        if m.get("fallback"):
            update["fallback"] = m["fallback"]
        out.append(update)
    return out
