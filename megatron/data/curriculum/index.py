"""Curriculum blending: global sample index -> (dataset id, dataset sample index) under
time-varying dataset weights, cached.

Algorithm (one pass, compiled):
    For every global sample ``i`` of a stage, the normalised target weights ``w_d(i)`` come from the
    weight schedules evaluated at the progress (iterations / samples / tokens, via
    :class:`~megatron.schedules.units.BatchSchedule`, rampup aware) of sample ``i``; the target
    integral is ``T_d(i) = sum_{j<i} w_d(j)`` and ``c_d(i)`` the samples of ``d`` among the first
    ``i``. Sample ``i`` goes to the dataset with the largest deficit, among those with a positive
    weight or a positive deficit (ties: lowest id):

    * static weights (one segment, no caps): deficit ``w_d * max(i, 1) - c_d(i)``, exactly
      megatron-core's ``build_blending_indices`` rule, so the index is *identical* to
      ``BlendedDataset``'s; ``|c_d(i) - T_d(i)| <= 1`` at every prefix;
    * time-varying weights / epochized caps: deficit ``T_d(i + 1) - c_d(i)`` (the current
      sample's weight included, which reacts to a weight jump one sample earlier). The chosen
      deficit is >= 1/D > 0, so no dataset is ever a full sample ahead (``c_d - T_d < 1``), and the
      lag stays within 2 samples (``T_d - c_d <= 2``; the property tests check it at every prefix
      against random linear/step schedules; the worst seen over ~3000 random 2..11-dataset runs
      was 1.48).

    Weights are piecewise constant between "segments" (one per iteration when every schedule is
    in iterations, one per sample for samples/tokens units, one in all for static weights), so
    ``T_d`` is kept as ``B_d + w_d * (i - s)``; the schedules are evaluated vectorised (numpy) per
    chunk of 2**20 samples and the C++ loop carries its state between chunks.

    Fast path for samples/tokens units (no caps, every schedule piecewise linear: linear, step,
    piecewise-linear, constant, staged of those; iterations-unit and static weights may be mixed
    in): the stage is cut at the schedules' breakpoints (and at iteration starts when an
    iterations-unit schedule is present), so every raw weight is affine on each segment; the
    schedules are evaluated at the segments' first and last samples only, and the kernel
    interpolates and normalises the raw weights of every sample itself. The target is thus the
    same exact per-sample integral as evaluating every sample (up to rounding), with the same
    rule and bounds, at a cost close to the static builder's. The kernel keeps the lag
    ``T_d - c_d`` itself (no precision lost as ``T_d`` grows). Other samples/tokens schedules
    (cosine, ...) or caps use the per-sample segments.

    ``epochized_blend`` stages add a cap per dataset (its samples per epoch x repetitions): an
    exhausted dataset drops out and the rest are renormalised, so each is drawn exactly its
    repetitions; without weights the weights are proportional to the samples each must give
    (they finish together); weights of the datasets still to draw all zero are an error, as in a
    plain blend (:class:`_CappedWeightsCheck`). Sequential stages are separate blends over
    consecutive sample ranges, so stages never mix; a dataset listed in two stages continues
    where it stopped.

The kernel (``curriculum_index.cpp``, loaded by kernel.py) is built at first use with
torch.utils.cpp_extension (once per environment, in ``$TORCH_EXTENSIONS_DIR``); without a compiler
a (slow) Python version of the same loops gives the same index. The index takes 5 bytes per
sample (uint8 id for < 256 datasets, int32 dataset-sample id for < 2**31 samples); it is cached
on disk (cache.py) under a key hashed from every input the build reads
(:attr:`CurriculumIndex.KEY_INPUTS`, megatron/data/cache_key.py).
"""
import inspect
import logging
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from megatron.data.blend_config import BlendConfigError, BlendEntry, BlendStage, SplitBlend
from megatron.data.cache_key import cache_key
from megatron.data.curriculum.blocked import (
    StageWeights,
    blocked_kernel_digest,
    build_blocked_stage,
    resolve_index_order,
)
from megatron.data.curriculum.cache import (
    cache_directory,
    new_index_files,
    publish_index,
    release_written,
    try_load_index,
)
from megatron.data.curriculum.constituents import Constituent
from megatron.data.curriculum.kernel import _kernel_source_digest, _KernelState
from megatron.data.curriculum.weights import WeightContext, _linear_breakpoints, _Progress, weight_schedule
from megatron.schedules.units import BatchSchedule

logger = logging.getLogger(__name__)

__all__ = ["CurriculumIndex"]

# v2: piecewise-linear samples/tokens fast path; v3: the key hashes KEY_INPUTS (the whole batch
# schedule, its steps included), so no entry of an earlier version is ever read
INDEX_VERSION = "curriculum-index-v3"
CHUNK = 1 << 20
# iteration_mixture: points of at least this many samples on average are counted one bincount each
MIXTURE_LONG_POINT = 1 << 14


@dataclass(frozen=True)
class _StagePlan:
    number: int         # the stage's position in the blend
    stage: BlendStage
    begin: int          # global sample range [begin, end)
    end: int
    ids: Tuple[int, ...]  # global constituent id of each entry
    caps: Tuple[int, ...]  # epochized: samples to draw per entry, else -1


class CurriculumIndex:
    """Global sample index -> (dataset id, dataset sample index) for one split / group.

    Args:
        blend: the typed split blend (from :mod:`megatron.data.blend_config`).
        constituents: from :func:`resolve_constituents` (id = position).
        num_samples: N, the samples of the run.
        batch_schedule: for progress conversions.
        seed: part of the cache key (the index itself is deterministic).
        cache_dir: where to cache the index (None: no caching).
        write_cache: write a missing cache entry (False on ranks that only read).

    A continuation (a mix edited at a resume, megatron/data/mix_resume.py) covers only the
    global samples ``[begin, N)``: ``base[d]`` samples of dataset ``d`` were drawn before ``begin``
    (the ledger), so its samples continue at ``base[d]``; stage boundaries and weights keep their
    meaning in absolute run progress (the plan is the file's as if it applied from sample 0), and
    the blend restarts at ``begin`` (its deficits start at zero there, as a fresh blend would). An
    ``epochized_blend`` stage running at ``begin`` draws what its repetitions still ask, given the
    samples really drawn since the stage's start: ``drawn_before(s)`` gives the per-dataset
    counts drawn before global sample ``s`` (the run's history).

    Attributes: ``dataset_index`` (uint8/int16 [N - begin]) and ``dataset_sample_index``
    (int32/int64 [N - begin]) for global samples ``begin..N-1``, ``counts`` (samples drawn per
    dataset in ``[begin, N)``), ``totals`` (``base + counts``), ``names``, ``epochs`` ({name:
    epochs drawn by the end of the run}), ``cache_path`` (directory used, or None), ``cache_hit``.
    ``build=False`` plans only (target weights, no index).
    """

    def __init__(self, blend: SplitBlend, constituents: Sequence[Constituent], num_samples: int,
                 batch_schedule: BatchSchedule, seed: int = 1234, cache_dir: Optional[str] = None,
                 write_cache: bool = True, begin: int = 0, base: Optional[Sequence[int]] = None,
                 drawn_before: Optional[Callable[[int], np.ndarray]] = None, build: bool = True,
                 order: str = "auto"):
        if num_samples <= 0:
            raise ValueError(f"num_samples must be positive, got {num_samples}")
        if not 0 <= int(begin) <= int(num_samples):
            raise ValueError(f"begin {begin} outside [0, num_samples {num_samples}]")
        self.blend = blend
        self.constituents = list(constituents)
        self.num_samples = int(num_samples)
        self.begin = int(begin)
        D = len(self.constituents)
        self.base = (np.zeros(D, dtype=np.int64) if base is None
                     else np.asarray(base, dtype=np.int64).reshape(D))
        self._drawn_before = drawn_before
        self.batch_schedule = batch_schedule
        self.seed = seed
        self.write_cache = write_cache
        self.names = [c.name for c in self.constituents]
        self.progress = _Progress(batch_schedule, self.num_samples)
        self.context = WeightContext(batch_schedule, self.num_samples)
        self._key_index = {c.blend_key: i for i, c in enumerate(self.constituents)}
        self._schedules: Dict[Tuple[int, int], Any] = {}
        self._static: Dict[int, Tuple[np.ndarray, List[int]]] = {}  # by stage number
        self.plans = self._plan()
        if D > 32767:
            raise BlendConfigError(f"{blend.where}: {D} datasets; at most 32767 are supported")
        self.order = resolve_index_order(order, self.num_samples - self.begin, D)
        self.id_dtype = np.uint8 if D <= 255 else np.int16
        self.sample_dtype = (np.int32 if self.num_samples + int(self.base.max(initial=0)) < 2 ** 31 - 1
                             else np.int64)
        self.cache_path = None
        self.cache_hit = False
        # samples per dataset drawn before N (the ledger at the end), when the build or the
        # cache entry knows them without a pass over the index
        self._known_totals: Optional[np.ndarray] = None
        if not build:
            return
        self.dataset_index, self.dataset_sample_index = self._load_or_build(cache_dir)
        # a fresh build knows its counts (the kernels' own), a cache entry records them: no pass
        # over an index of a billion samples for them
        self.counts = (self._known_totals - self.base if self._known_totals is not None
                       else self._counts())
        self.totals = self.base + self.counts
        self.epochs = {c.name: float(self.totals[i]) / c.samples_per_epoch
                       for i, c in enumerate(self.constituents) if c.samples_per_epoch}

    @property
    def length(self) -> int:
        """Global samples the index covers (``N - begin``)."""
        return self.num_samples - self.begin

    def drawn_before(self, sample: int) -> np.ndarray:
        """Samples drawn per dataset before global sample ``sample`` (``begin <= sample <= N``):
        the ledger at that point. Counts the shorter side of the index: the samples before
        ``sample`` from the base, or those from ``sample`` on taken from the index's totals (a
        ledger at 90% of a billion samples reads a tenth of them)."""
        if not self.begin <= int(sample) <= self.num_samples:
            raise ValueError(f"sample {sample} outside [{self.begin}, {self.num_samples}]")
        stop, length = int(sample) - self.begin, len(self.dataset_index)
        totals = getattr(self, "totals", None)
        if totals is not None and length - stop < stop:
            counts, lo, hi, sign = totals.copy(), stop, length, -1
        else:
            counts, lo, hi, sign = self.base.copy(), 0, stop, 1
        for a in range(lo, hi, 1 << 24):
            counts += sign * np.bincount(self.dataset_index[a:min(hi, a + (1 << 24))],
                                         minlength=len(self.constituents))
        return counts

    # -- planning ------------------------------------------------------------------------------
    def _schedule(self, dataset: int, stage: int, entry: BlendEntry):
        """The weight schedule of ``entry``, dataset ``dataset`` in stage number ``stage``."""
        key = (dataset, stage)
        if key not in self._schedules:
            try:
                self._schedules[key] = weight_schedule(entry.weight, self.context)
            except BlendConfigError:
                raise
            except Exception as exc:
                raise BlendConfigError(f"{entry.where}.weight: invalid schedule "
                                       f"{entry.weight!r}: {exc}") from exc
        return self._schedules[key]

    def _plan(self) -> List[_StagePlan]:
        plans, begin = [], 0
        where = self.blend.where
        for k, stage in enumerate(self.blend.stages):
            ids = tuple(self._key_index[e.key] for e in stage.entries)
            if stage.kind == "epochized_blend":
                if any(not self.constituents[i].samples_per_epoch for i in ids):
                    raise BlendConfigError(f"{stage.where}: epochized_blend needs datasets with a "
                                           "fixed number of samples per epoch")
                caps = tuple(int(round(e.repetitions * self.constituents[i].samples_per_epoch))
                             for e, i in zip(stage.entries, ids, strict=True))
                for e, c in zip(stage.entries, caps, strict=True):
                    if c <= 0:
                        raise BlendConfigError(f"{e.where}.repetitions: {e.repetitions!r} epochs "
                                               "of this dataset is less than one sample")
                end = begin + sum(caps)
                if begin < self.begin < end:  # running at a continuation's start
                    caps = self._remaining_caps(stage, begin, ids, caps)
                    begin, end = self.begin, self.begin + sum(caps)
            else:
                caps = tuple(-1 for _ in ids)
                if stage.until is None:
                    end = self.num_samples
                else:
                    end = self.progress.samples_for(*stage.until)
                    if end <= begin and begin > self.begin > 0:
                        # a continuation whose epochized stage, finishing its repetitions, ran
                        # past this stage's end: nothing of it is left to draw
                        end = begin
                    elif end <= begin:
                        raise BlendConfigError(
                            f"{stage.where}.until: {stage.until[0]}={stage.until[1]} ends at sample "
                            f"{end}, not after the stage's start (sample {begin}): a stage with "
                            "nothing to draw")
            lo, hi = max(begin, self.begin), min(end, self.num_samples)
            if lo < hi:
                plans.append(_StagePlan(k, stage, lo, hi, ids, caps))
            begin = end
            if stage.until is None and stage.kind == "blend":
                break
        if begin < self.num_samples:
            raise BlendConfigError(f"{where}: the stages provide {begin} samples but the run needs "
                                   f"{self.num_samples}; end with a blend stage without 'until' or "
                                   "add repetitions")
        return plans

    def _remaining_caps(self, stage: BlendStage, stage_begin: int, ids: Tuple[int, ...],
                        caps: Tuple[int, ...]) -> Tuple[int, ...]:
        """An epochized stage that began at ``stage_begin`` and runs at this continuation's
        start: what each dataset still has to give, its cap less what the run really drew from
        it since ``stage_begin`` (``base`` less ``drawn_before(stage_begin)``)."""
        if self._drawn_before is None:
            raise BlendConfigError(
                f"{stage.where}: this epochized_blend stage began at sample {stage_begin} and "
                f"runs at the resume point (sample {self.begin}); continuing it needs the run's "
                "history (the checkpoint's data ledger)")
        before = np.asarray(self._drawn_before(stage_begin), dtype=np.int64).reshape(-1)
        done = self.base[list(ids)] - before[list(ids)]
        return tuple(int(max(c - d, 0)) for c, d in zip(caps, done, strict=True))

    def _stage_units(self, plan: _StagePlan) -> Optional[str]:
        """Finest segment granularity the stage's schedules need: None (static), 'iterations',
        'samples'."""
        units = set()
        for e, i in zip(plan.stage.entries, plan.ids, strict=True):
            if isinstance(e.weight, dict):
                units.add(getattr(self._schedule(i, plan.number, e), "unit", "iterations"))
        if units & {"samples", "tokens"}:
            return "samples"
        return "iterations" if units else None

    def _static_weights(self, plan: _StagePlan) -> Tuple[np.ndarray, List[int]]:
        """(each entry's weight where it is a number or a default (its cap), 0 where it is a
        schedule; the positions of the schedules) of ``plan``'s stage: a stage of thousands of
        static entries is weighted with one array, not an entry at a time."""
        if plan.number not in self._static:
            static = np.zeros(len(plan.ids), dtype=np.float64)
            dynamic = []
            for k, (e, cap) in enumerate(zip(plan.stage.entries, plan.caps, strict=True)):
                if e.weight is None:
                    static[k] = float(cap)
                elif isinstance(e.weight, dict):
                    dynamic.append(k)
                else:
                    static[k] = float(e.weight)
            self._static[plan.number] = (static, dynamic)
        return self._static[plan.number]

    def _dynamic_weights(self, plan: _StagePlan, samples: np.ndarray, check: bool = True,
                         out: Optional[np.ndarray] = None, rows: Optional[List[int]] = None
                         ) -> np.ndarray:
        """[k, len(samples)] raw weights of the entries of ``plan`` that follow a schedule (in the
        order of :meth:`_static_weights`' positions) at global sample indices; written into rows
        ``rows`` of ``out`` when given (returned)."""
        _, dynamic = self._static_weights(plan)
        if out is None:
            out = np.empty((len(dynamic), len(samples)), dtype=np.float64)
            rows = range(len(dynamic))
        progress: Dict[str, np.ndarray] = {}
        for row, k in zip(rows, dynamic, strict=True):
            e, i = plan.stage.entries[k], plan.ids[k]
            sched = self._schedule(i, plan.number, e)
            unit = getattr(sched, "unit", "iterations")
            if unit not in progress:
                progress[unit] = self.progress.of(samples, unit)
            p = progress[unit]
            out[row] = sched(p)
            if check:
                v = out[row]
                if not (v.min(initial=0.0) >= 0 and np.isfinite(v.max(initial=0.0))):
                    bad = ~np.isfinite(v) | (v < 0)
                    j = int(np.argmax(bad))
                    raise BlendConfigError(
                        f"{e.where}.weight: schedule {e.weight!r} gives weight {v[j]!r} at "
                        f"{unit} {p[j]:g} (sample {int(samples[j])}); weights must be finite "
                        "and non-negative")
        return out

    def _raw_weights(self, plan: _StagePlan, samples: np.ndarray, check: bool = True) -> np.ndarray:
        """[D_stage, len(samples)] raw (unnormalised) weights at global sample indices."""
        static, dynamic = self._static_weights(plan)
        out = np.empty((len(plan.ids), len(samples)), dtype=np.float64)
        if not dynamic:
            out[:] = static[:, None]
        elif len(dynamic) < len(static):  # the constant rows; the schedules write the others
            constant = np.ones(len(static), dtype=bool)
            constant[dynamic] = False
            out[constant] = static[constant, None]
        return self._dynamic_weights(plan, samples, check, out, dynamic)

    @staticmethod
    def _normalise(raw: np.ndarray, sums_out: Optional[list] = None) -> np.ndarray:
        """Columns of ``raw`` [D, n] divided by their sums (all-zero columns stay zero)."""
        sums = raw.sum(axis=0)
        inv = np.zeros_like(sums)
        np.divide(1.0, sums, out=inv, where=sums > 0)
        raw *= inv
        if sums_out is not None:
            sums_out.append(sums)
        return raw

    # -- building ------------------------------------------------------------------------------
    def _build(self, out_id: Optional[np.ndarray] = None,
               out_sample: Optional[np.ndarray] = None) -> Tuple[np.ndarray, np.ndarray]:
        """The index arrays over global samples ``[begin, N)`` (``out[i - begin]``), filled into
        ``out_id``/``out_sample`` when given (the cache's memory maps), else into new arrays."""
        if out_id is None:
            out_id = np.empty(self.length, dtype=self.id_dtype)
            out_sample = np.empty(self.length, dtype=self.sample_dtype)
        global_counts = self.base.copy()
        for plan in self.plans:
            if self.order == "blocked":
                global_counts[list(plan.ids)] += self._build_blocked(plan, global_counts, out_id,
                                                                     out_sample)
                continue
            Ds = len(plan.ids)
            base = global_counts[list(plan.ids)]
            all_default = all(e.weight is None for e in plan.stage.entries)
            granularity = None if all_default else self._stage_units(plan)
            # static weights without caps: megatron-core's exact rule (identical index); otherwise
            # the deficit includes the current sample's weight (tighter under changing weights)
            lead = granularity is not None or any(c >= 0 for c in plan.caps)
            all_positive = granularity is None and all(
                e.weight is None or (not isinstance(e.weight, dict) and e.weight > 0)
                for e in plan.stage.entries)
            bounds = self._linear_segments(plan) if granularity == "samples" else None
            state = _KernelState(Ds, np.asarray(plan.caps), base, True, lead=lead,
                                 all_positive=all_positive)
            if bounds is not None:
                self._build_linear(plan, state, bounds, out_id, out_sample)
            else:
                self._build_segments(plan, state, granularity, out_id, out_sample)
            if Ds:  # stage-local ids -> global ids
                mapping = np.asarray(plan.ids, dtype=self.id_dtype)
                if not np.array_equal(mapping, np.arange(Ds, dtype=self.id_dtype)):
                    lo, hi = plan.begin - self.begin, plan.end - self.begin
                    out_id[lo:hi] = mapping[out_id[lo:hi]]
            global_counts[list(plan.ids)] += state.counts
        self._known_totals = global_counts
        return out_id, out_sample

    def _breakpoints(self, plan: _StagePlan) -> List[Tuple[str, Optional[np.ndarray]]]:
        """``(unit, breakpoints)`` of every scheduled weight of ``plan``'s stage, in entry order:
        the schedule's unit and the finite points (in that unit) where it is not affine (steps,
        ramps' ends), or None for a smooth schedule (cosine, ...)."""
        out = []
        for e, i in zip(plan.stage.entries, plan.ids, strict=True):
            if not isinstance(e.weight, dict):
                continue
            sched = self._schedule(i, plan.number, e)
            points = _linear_breakpoints(sched)
            out.append((getattr(sched, "unit", "iterations"),
                        None if points is None else points[np.isfinite(points)]))
        return out

    def _cuts_around(self, at, before: int, after: int) -> np.ndarray:
        """Global samples ``q - before`` to ``q + after`` around each sample position ``q`` of
        ``at`` (``at`` clipped to [-4, num_samples + 4] first, then truncated to integers): where
        segments or blocks must start so that none holds a breakpoint, with a margin for float
        rounding."""
        q = np.clip(np.asarray(at, dtype=np.float64), -4, self.num_samples + 4).astype(np.int64)
        return (q[:, None] + np.arange(-before, after + 1, dtype=np.int64)).reshape(-1)

    def _blocked_cuts(self, plan: _StagePlan) -> np.ndarray:
        """Stage-local samples where a block of the blocked order must start: the first samples at
        and after every breakpoint (a step, a ramp's end) of the stage's piecewise-linear weight
        schedules, in any unit (:meth:`_breakpoints`; a breakpoint at sample position x cuts at
        ceil(x) - 1 to ceil(x) + 1)."""
        cuts = [np.zeros(0, dtype=np.int64)]
        for unit, points in self._breakpoints(plan):
            if points is None:
                continue  # smooth (cosine, ...): the block size bounds its error
            if unit == "iterations":
                at = self.batch_schedule.samples_at_iterations(
                    np.clip(np.ceil(points), 0, self.progress.num_iterations).astype(np.int64))
            else:
                at = np.ceil(self.batch_schedule.convert(points, unit, "samples"))
            cuts.append(self._cuts_around(at, 1, 1) - plan.begin)
        cuts = np.unique(np.concatenate(cuts))
        return cuts[(cuts > 0) & (cuts < plan.end - plan.begin)]

    def _build_blocked(self, plan: _StagePlan, global_counts: np.ndarray, out_id: np.ndarray,
                       out_sample: np.ndarray) -> np.ndarray:
        """Fill ``plan``'s samples in the blocked order (megatron/data/curriculum/blocked.py);
        returns the samples drawn per dataset of the stage."""
        lo, hi = plan.begin - self.begin, plan.end - self.begin
        ids = np.asarray(plan.ids, dtype=np.int64)
        counts = global_counts[ids].astype(np.int64)

        def zero_error(j: int, detail: str):
            self._all_zero_error(plan, plan.begin + j, detail)

        static, dynamic = self._static_weights(plan)
        weights = StageWeights(static, np.asarray(dynamic, dtype=np.int64),
                               lambda pos: self._dynamic_weights(plan, plan.begin + pos))
        return build_blocked_stage(
            plan.end - plan.begin, weights,
            self._blocked_cuts(plan), np.asarray(plan.caps, dtype=np.int64), counts, ids,
            out_id[lo:hi], out_sample[lo:hi], zero_error,
            written=lambda a, b: release_written((out_id, out_sample), lo + a, lo + b))

    def _build_segments(self, plan: _StagePlan, state: "_KernelState", granularity: Optional[str],
                        out_id: np.ndarray, out_sample: np.ndarray) -> None:
        """Piecewise-constant weights: one segment per iteration / per sample / in all."""
        # the kernel (which releases the GIL) fills chunk k in a worker thread while this
        # thread evaluates the weight schedules of chunk k + 1
        capped = _CappedWeightsCheck(plan.caps) if any(c >= 0 for c in plan.caps) else None
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending, chunk, written = None, None, (0, 0)
            for lo, hi, starts, norm in self._chunks(plan, granularity):
                if pending is not None:
                    self._check_rc(plan, pending.result())
                    self._check_capped(plan, capped, *chunk, out_id)
                    release_written((out_id, out_sample), *written)
                o_lo, o_hi = plan.begin - self.begin + lo, plan.begin - self.begin + hi
                pending = pool.submit(state.run, lo, hi, starts, norm, out_id[o_lo:o_hi],
                                      out_sample[o_lo:o_hi])
                chunk, written = (lo, hi, starts, norm), (o_lo, o_hi)
            if pending is not None:
                self._check_rc(plan, pending.result())
                self._check_capped(plan, capped, *chunk, out_id)
                release_written((out_id, out_sample), *written)

    def _check_capped(self, plan: _StagePlan, check: Optional["_CappedWeightsCheck"], lo: int,
                      hi: int, starts: np.ndarray, norm: np.ndarray, out_id: np.ndarray) -> None:
        """Epochized stages: raise :meth:`_all_zero_error` at the first sample of the filled chunk
        [lo, hi) (stage-local) where the datasets still to draw all have weight zero."""
        if check is None:
            return
        ids = out_id[plan.begin - self.begin + lo:plan.begin - self.begin + hi]
        bad = check.first_zero(lo, hi, starts, norm, ids)
        if bad is None:
            return
        count = check.counts_before + np.bincount(ids[:bad - lo], minlength=len(plan.ids))
        caps = np.asarray(plan.caps)
        active = count < caps
        names = [self.constituents[i].name for i in plan.ids]
        detail = ""
        if not active.all():
            given = [f"{names[k]!r} has given its {caps[k]} samples"
                     for k in np.flatnonzero(~active)]
            left = [f"{names[k]!r} has {caps[k] - count[k]} left at weight 0"
                    for k in np.flatnonzero(active)]
            detail = (f" ({', '.join(given)}; {', '.join(left)}: an epochized_blend draws by its "
                      "weights, so give the datasets still to draw a positive weight there or "
                      "fewer repetitions)")
        self._all_zero_error(plan, plan.begin + bad, detail)

    # Samples/tokens-unit schedules that are piecewise linear (linear, step, piecewise-linear,
    # constant, staged of those): rather than evaluating and normalising the weights of every
    # sample in numpy, the stage is cut into segments on which every raw weight is affine in the
    # sample index (cuts at the schedules' breakpoints, at iteration starts if an iterations-unit
    # schedule is present, and at chunk starts); the schedules are evaluated at each segment's
    # first and last sample only and the kernel normalises per sample. The target is the same
    # per-sample integral as evaluating every sample (up to rounding), so the same bounds hold.
    linear_fast_path = True

    def _linear_segments(self, plan: _StagePlan) -> Optional[Tuple[np.ndarray, bool]]:
        """(sorted global sample indices where a segment must start, iterations-unit schedule
        present) when the fast path applies to ``plan``, else None. The cuts are those of
        :meth:`_breakpoints` (a breakpoint at sample position x cuts at floor(x) - 1 to
        floor(x) + 2)."""
        if not self.linear_fast_path or any(c >= 0 for c in plan.caps):
            return None
        cuts, iterations = [np.zeros(0, dtype=np.int64)], False
        seq_plan = self.batch_schedule.seq_plan
        for unit, points in self._breakpoints(plan):
            if unit == "iterations":
                iterations = True
                continue
            if unit not in ("samples", "tokens"):
                return None
            if unit == "tokens" and seq_plan is not None and seq_plan.truncates:
                return None  # tokens are not samples x seq length under a truncating curriculum
            if points is None:
                return None
            scale = 1.0 if unit == "samples" else float(self.batch_schedule.seq_length)
            # a breakpoint between samples q and q + 1 (or at q): q and q + 1 start segments,
            # so no segment has a breakpoint inside it (q - 1, q + 2: float rounding margin)
            cuts.append(self._cuts_around(np.floor(points / scale), 1, 2))
        return np.unique(np.concatenate(cuts)), iterations

    def _build_linear(self, plan: _StagePlan, state: "_KernelState", bounds, out_id: np.ndarray,
                      out_sample: np.ndarray) -> None:
        cuts, iterations = bounds
        length = plan.end - plan.begin

        def chunks():
            for lo in range(0, length, CHUNK):
                hi = min(length, lo + CHUNK)
                g_lo, g_hi = plan.begin + lo, plan.begin + hi
                parts = [np.array([g_lo], dtype=np.int64), cuts[(cuts > g_lo) & (cuts < g_hi)]]
                if iterations:
                    parts.append(self.progress.iteration_starts(g_lo + 1, g_hi))
                starts = np.unique(np.concatenate(parts))
                lasts = np.append(starts[1:], g_hi) - 1
                first = self._raw_weights(plan, starts)
                last = first.copy()
                multi = np.flatnonzero(lasts > starts)
                if len(multi):
                    last[:, multi] = self._raw_weights(plan, lasts[multi])
                # raw weights are affine and non-negative on a segment: their sum is zero inside
                # it only if zero at an end
                zero = np.concatenate([starts[~(first.sum(axis=0) > 0)],
                                       lasts[~(last.sum(axis=0) > 0)]])
                if len(zero):
                    self._all_zero_error(plan, int(zero.min()))
                slope = (last - first) / np.maximum(lasts - starts, 1).astype(np.float64)
                yield lo, hi, starts - plan.begin, first, slope

        # the kernel (which releases the GIL) fills chunk k while this thread prepares chunk k + 1
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending, written = None, (0, 0)
            for lo, hi, starts, first, slope in chunks():
                if pending is not None:
                    self._check_rc(plan, pending.result())
                    release_written((out_id, out_sample), *written)
                o_lo, o_hi = plan.begin - self.begin + lo, plan.begin - self.begin + hi
                pending = pool.submit(state.run_pl, lo, hi, starts, first, slope,
                                      out_id[o_lo:o_hi], out_sample[o_lo:o_hi])
                written = (o_lo, o_hi)
            if pending is not None:
                self._check_rc(plan, pending.result())
                release_written((out_id, out_sample), *written)

    def _chunks(self, plan: _StagePlan, granularity: Optional[str]):
        """Per chunk of the stage: (lo, hi) stage-local, segment starts (stage-local) and their
        normalised weights [D_stage, segments]."""
        Ds, length = len(plan.ids), plan.end - plan.begin
        for lo in range(0, length, CHUNK):
            hi = min(length, lo + CHUNK)
            g_lo, g_hi = plan.begin + lo, plan.begin + hi
            if granularity is None:
                starts = np.array([g_lo] if lo == 0 else [], dtype=np.int64)
            elif granularity == "iterations":
                starts = self.progress.iteration_starts(g_lo, g_hi)
                if lo == 0 and (len(starts) == 0 or starts[0] != g_lo):
                    starts = np.concatenate([[g_lo], starts]).astype(np.int64)
            else:
                starts = np.arange(g_lo, g_hi, dtype=np.int64)
            if len(starts):
                sums: list = []
                norm = self._normalise(self._raw_weights(plan, starts), sums)
                if not any(c >= 0 for c in plan.caps):
                    zero = np.flatnonzero(~(sums[0] > 0))
                    if len(zero):
                        self._all_zero_error(plan, int(starts[zero[0]]))
            else:
                norm = np.zeros((Ds, 0))
            yield lo, hi, starts - plan.begin, norm

    def _check_rc(self, plan: _StagePlan, rc: int) -> None:
        if rc != 0:
            self._all_zero_error(plan, plan.begin - rc - 1)

    def _all_zero_error(self, plan: _StagePlan, i: int, detail: str = ""):
        it = int(self.progress.iteration_of(np.array([i]))[0])
        raise BlendConfigError(
            f"{plan.stage.where}: all weights are zero at sample {i} (iteration {it}) of a run of "
            f"{self.num_samples} samples: nothing to draw there{detail}")

    def _counts(self) -> np.ndarray:
        """Samples drawn per dataset in ``[begin, N)``."""
        return self.drawn_before(self.num_samples) - self.base

    # -- cache ---------------------------------------------------------------------------------
    # What the build reads, each hashed whole into the cache key (megatron/data/cache_key.py:
    # dataclasses field by field, so a field added to the batch schedule, a constituent or a blend
    # entry is keyed without being named here): the typed blend, the constituents (document
    # ranges, tokens, samples per epoch and passes, the files' fingerprint), the run's samples, the
    # whole batch schedule (rampup, steps, sequence-length plan), the seed, a continuation's start
    # and ledger, the stage plans (a continuation's shortened epochized stages: what
    # ``drawn_before`` contributes), the dtypes, the weight fast path's switch and the kernel.
    KEY_INPUTS = ("blend", "constituents", "num_samples", "batch_schedule", "seed", "begin", "base",
                  "plans", "id_dtype", "sample_dtype", "linear_fast_path", "kernel", "order")
    # constructor arguments that are not keyed, and why (tests check the two lists cover them all)
    NOT_KEYED_ARGUMENTS = {
        "cache_dir": "where the index is cached, not what it holds",
        "write_cache": "whether this rank writes the cache",
        "drawn_before": "read only for a continuation's epochized stage, whose caps 'plans' holds",
        "build": "plans only: no index is built or cached",
    }

    @property
    def kernel(self) -> str:
        """The digest of the kernel's source (its build rule) of the index's order."""
        return _kernel_source_digest() if self.order == "greedy" else blocked_kernel_digest()

    def cache_key(self) -> str:
        """The index's cache key: the SHA-256 (32 hex digits) of :attr:`KEY_INPUTS`; the JSON it
        hashes is kept in ``self.description``."""
        key, self.description = cache_key(INDEX_VERSION,
                                          {name: getattr(self, name) for name in self.KEY_INPUTS})
        return key

    @classmethod
    def constructor_arguments(cls) -> Tuple[str, ...]:
        """The constructor's argument names (tests check each is keyed or says why not)."""
        return tuple(p for p in inspect.signature(cls.__init__).parameters if p != "self")

    def _load_or_build(self, cache_dir: Optional[str]):
        if not cache_dir:  # nothing is looked up or written: no key (O(D) JSON at thousands)
            return self._build()
        key = self.cache_key()
        path = cache_directory(cache_dir, key)
        self.cache_path = path
        loaded = try_load_index(path, self.num_samples, self.length, self.id_dtype,
                                self.sample_dtype)
        if loaded is not None:
            self.cache_hit = True
            ids, samples, counts = loaded
            if counts is not None and len(counts) == len(self.constituents):
                self._known_totals = self.base + counts
            return ids, samples
        if not self.write_cache:
            return self._build()
        try:
            tmp, ids, samples = new_index_files(path, self.length, self.id_dtype, self.sample_dtype)
        except OSError as exc:  # read-only cache dir: build in memory
            logger.warning("curriculum index: cannot write the cache %s (%s)", path, exc)
            return self._build()
        try:
            self._build(ids, samples)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        try:
            publish_index(tmp, path, (ids, samples), self.description, self.num_samples,
                          self.names, self._known_totals - self.base)
        except OSError as exc:  # the disk filled up, or the like: keep what was built
            logger.warning("curriculum index: cannot write the cache %s (%s)", path, exc)
            return np.array(ids), np.array(samples)
        loaded = try_load_index(path, self.num_samples, self.length, self.id_dtype,
                                self.sample_dtype)
        return loaded[:2] if loaded is not None else (ids, samples)

    # -- previews ------------------------------------------------------------------------------
    def target_weights(self, sample_indices) -> np.ndarray:
        """[D, n] normalised target mixture at the given global sample indices (epochized
        stages without weights: proportional to the samples each dataset must give)."""
        samples = np.asarray(sample_indices, dtype=np.int64).reshape(-1)
        out = np.zeros((len(self.constituents), len(samples)))
        for plan in self.plans:
            sel = (samples >= plan.begin) & (samples < plan.end)
            if not sel.any():
                continue
            norm = self._normalise(self._raw_weights(plan, samples[sel], check=False))
            for k, gid in enumerate(plan.ids):
                out[gid, sel] += norm[k]
        return out

    def iteration_mixture(self, num_iterations: Optional[int] = None,
                          per_point: int = 1) -> np.ndarray:
        """[D, points] fraction of the global batches drawn from each dataset by the built index:
        one point per ``per_point`` iterations (``ceil(num_iterations / per_point)`` points; 1:
        one per iteration), so a run of a million iterations over thousands of datasets stays a
        few million numbers. Point ``p`` counts the samples of iterations ``p x per_point`` to
        ``(p + 1) x per_point - 1`` (a contiguous range of the index, from the batch schedule):
        one bincount per point where points are long, else one per chunk of points labelled by
        repetition, so no per-sample iteration is computed (a billion samples: seconds)."""
        n_it = self.progress.num_iterations if num_iterations is None else int(num_iterations)
        per_point = max(1, int(per_point))
        points = -(-n_it // per_point)
        D = len(self.constituents)
        acc = np.zeros((points, D), dtype=np.int64)
        firsts = np.minimum(np.arange(points + 1, dtype=np.int64) * per_point, n_it)
        # index positions (samples from self.begin) where each point starts; the last: the end
        bounds = np.clip(self.batch_schedule.samples_at_iterations(firsts), self.begin,
                         self.num_samples) - self.begin
        ids = self.dataset_index
        if bounds[-1] - bounds[0] >= points * MIXTURE_LONG_POINT:  # few long points
            for p in np.flatnonzero(bounds[1:] > bounds[:-1]).tolist():
                acc[p] = np.bincount(np.asarray(ids[bounds[p]:bounds[p + 1]]), minlength=D)
        else:  # many short points: each chunk's samples labelled by their point
            step = max(1, CHUNK * 4 // max(1, int((bounds[-1] - bounds[0]) // max(points, 1))))
            for p0 in range(0, points, step):
                p1 = min(points, p0 + step)
                lo, hi = int(bounds[p0]), int(bounds[p1])
                if hi <= lo:
                    continue
                labels = np.repeat(np.arange(p1 - p0, dtype=np.int64), np.diff(bounds[p0:p1 + 1]))
                counts = np.bincount(labels * D + np.asarray(ids[lo:hi]), minlength=(p1 - p0) * D)
                acc[p0:p1] += counts.reshape(p1 - p0, D)
        acc = acc.T.astype(np.float64)
        tot = acc.sum(axis=0, keepdims=True)
        return np.divide(acc, tot, out=np.zeros_like(acc), where=tot > 0)

    def target_iteration_mixture(self, num_iterations: Optional[int] = None,
                                 per_point: int = 1) -> np.ndarray:
        """[D, points] target mixture at the first sample of each point's first iteration (one
        point per ``per_point`` iterations)."""
        n_it = self.progress.num_iterations if num_iterations is None else int(num_iterations)
        firsts = self.batch_schedule.samples_at_iterations(
            np.arange(0, n_it, max(1, int(per_point)), dtype=np.int64))
        return self.target_weights(np.minimum(firsts, self.num_samples - 1))


class _CappedWeightsCheck:
    """Where an epochized stage's weights leave nothing to draw.

    With caps the kernel, finding the weights of the datasets still to draw all zero, draws by
    what each has left, against the weights. This finds the first such sample instead (so an
    epochized blend gives the same error as a plain one), from each chunk after the kernel filled
    it: the weights are those of the chunk's segments, a dataset drops out after its cap-th draw."""

    def __init__(self, caps: Sequence[int]):
        self.caps = np.asarray(caps, dtype=np.int64)
        self.counts_before = np.zeros(len(self.caps), dtype=np.int64)  # at the chunk's start
        # first stage-local sample at which each dataset has given its cap (drops out)
        self.done = np.full(len(self.caps), np.iinfo(np.int64).max, dtype=np.int64)
        self.weights = None  # normalised weights of the last segment seen

    def first_zero(self, lo: int, hi: int, starts: np.ndarray, norm: np.ndarray,
                   ids: np.ndarray) -> Optional[int]:
        """First stage-local sample in [lo, hi) where the datasets not yet done all have weight
        zero, or None. ``starts``/``norm``: the chunk's segment starts (stage-local) and
        normalised weights [D, len(starts)]; ``ids``: the stage-local ids the kernel drew."""
        ids = np.asarray(ids)
        counts = np.bincount(ids, minlength=len(self.caps)).astype(np.int64)
        for k in np.flatnonzero((self.caps >= 0) & (self.done > hi)):
            need = int(self.caps[k] - self.counts_before[k])
            if 0 < need <= counts[k]:
                self.done[k] = lo + int(np.flatnonzero(ids == k)[need - 1]) + 1
        starts = np.asarray(starts, dtype=np.int64)
        # the weights change at segment starts, the active set after a dataset's last draw
        drops = self.done[(self.done >= lo) & (self.done < hi)]
        points = np.unique(np.concatenate([[lo], starts, drops]))
        seg = np.searchsorted(starts, points, side="right") - 1
        cols = (norm[:, np.maximum(seg, 0)] if norm.shape[1]
                else np.zeros((len(self.caps), len(points))))
        if (seg < 0).any():
            cols[:, seg < 0] = self.weights[:, None]
        active = self.done[:, None] > points[None, :]
        zero = np.flatnonzero(~((cols * active).sum(axis=0) > 0))
        if norm.shape[1]:
            self.weights = norm[:, -1].copy()
        if len(zero):
            return int(points[zero[0]])
        self.counts_before = self.counts_before + counts
        return None
