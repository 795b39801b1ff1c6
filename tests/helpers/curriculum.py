"""Test helpers: a CurriculumIndex over fake constituents (no data files needed), and
megatron-core's blending rule as the peer of static blends."""
from typing import Optional, Sequence, Tuple

import numpy as np

from megatron.data.blend_config import parse_blend_config
from megatron.data.curriculum.constituents import Constituent
from megatron.data.curriculum.index import CurriculumIndex
from megatron.schedules.units import BatchSchedule


def write_corpus(prefix: str, lengths, seed: int = 0, eod: Optional[int] = None) -> str:
    """A megatron-core ``.bin/.idx`` dataset at ``prefix`` of one document per entry of ``lengths``
    (random byte-level tokens, seeded; the last one ``eod`` where given, as
    ``tools/preprocess_data.py --append-eod`` writes them); returns ``prefix``."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for n in lengths:
        tokens = rng.integers(0, 250, int(n)).astype(np.uint16)
        if eod is not None and n:
            tokens[-1] = eod
        builder.add_document(tokens, [int(n)])
    builder.finalize(prefix + ".idx")
    return prefix


def fake_constituents(split_blend, spe=10 ** 6, seq=16):
    """One fake dataset (no files) per distinct path and range of ``split_blend``, holding ``spe``
    samples per epoch (an int, or {path: int}); its fingerprint is its file name."""
    import os

    cons, seen = [], set()
    for stage in split_blend.stages:
        for e in stage.entries:
            if e.key not in seen:
                seen.add(e.key)
                s = spe if isinstance(spe, int) else spe[e.path]
                cons.append(Constituent(e.path, e.split, e.name, 0, 10, 10, s * seq + 1, s,
                                        f"fake {os.path.basename(e.path)}"
                                        + (" replay" if e.replay else ""), replay=e.replay))
    return cons


def fake_index(blend_obj, N, gbs=4, rampup=None, spe=10 ** 6, seq=16, order="auto"):
    """Index of ``N`` samples for the train blend ``blend_obj`` (a dict as in a blend file), each
    dataset holding ``spe`` samples per epoch (an int, or {path: int}), built in ``order``."""
    cfg = parse_blend_config({"train": blend_obj}, "t.yaml", check_files=False).train
    return CurriculumIndex(cfg, fake_constituents(cfg, spe, seq), N, BatchSchedule(gbs, rampup, seq),
                           order=order)


def megatron_blend_indices(weights: Sequence[float], num_samples: int) -> Tuple[np.ndarray, np.ndarray]:
    """megatron-core's blending rule (``BlendedDataset``, via its C++
    ``helpers.build_blending_indices``) on the normalised ``weights``: (dataset index int16,
    sample index within that dataset int64) per blended sample."""
    from megatron.core.datasets import helpers
    from megatron.core.datasets.utils import normalize

    dataset_index = np.zeros(num_samples, dtype=np.int16)
    dataset_sample = np.zeros(num_samples, dtype=np.int64)
    helpers.build_blending_indices(dataset_index, dataset_sample, normalize(list(weights)),
                                   len(weights), int(num_samples), False)
    return dataset_index, dataset_sample


def prefix_error(idx) -> np.ndarray:
    """(exact per-sample target integral - realised count) of every dataset of the built index
    ``idx`` at every prefix of its run, [D, N + 1] (samples)."""
    N = idx.num_samples
    tw = idx.target_weights(np.arange(N))
    T = np.concatenate([np.zeros((tw.shape[0], 1)), np.cumsum(tw, axis=1)], axis=1)
    C = np.zeros_like(T)
    C[np.asarray(idx.dataset_index, dtype=np.int64), np.arange(1, N + 1)] = 1
    return T - np.cumsum(C, axis=1)


def random_schedules():
    """A hypothesis strategy of 1 to 8 dataset weights: linear or step schedules in iterations,
    samples or tokens (up to 4 points over about 400 iterations, values from 0 to 100) or numbers;
    :func:`schedule_entries` scales their points to a batch size."""
    from hypothesis import strategies as st

    point = st.tuples(st.integers(0, 400), st.sampled_from([0.0, 0.05, 1.0, 3.0, 100.0]))
    sched = st.fixed_dictionaries({
        "type": st.sampled_from(["linear", "step"]),
        "unit": st.sampled_from(["iterations", "samples", "tokens"]),
        "points": st.lists(point, min_size=1, max_size=4, unique_by=lambda p: p[0]),
    })
    return st.lists(st.one_of(sched, st.sampled_from([0.5, 1.0, 7.0])), min_size=1, max_size=8)


def schedule_entries(scheds, gbs: int, seq: int):
    """Blend entries ``d0, d1, ...`` of :func:`random_schedules`' weights, their points (given in
    iterations) in each schedule's unit at ``gbs`` samples of ``seq`` tokens per iteration, and
    a ``floor`` entry of weight 0.01 (never all weights zero)."""
    entries = []
    for k, s in enumerate(scheds):
        if isinstance(s, dict):
            scale = {"iterations": 1, "samples": gbs, "tokens": gbs * seq}[s["unit"]]
            s = dict(s, points={x * scale: y for x, y in sorted(s["points"])})
        entries.append({"path": f"d{k}", "weight": s})
    entries.append({"path": "floor", "weight": 0.01})
    return entries
