"""Test helpers: a CurriculumIndex over fake constituents (no data files needed), and
megatron-core's blending rule as the peer of static blends."""
from typing import Sequence, Tuple

import numpy as np

from megatron.data.blend_config import parse_blend_config
from megatron.data.curriculum.constituents import Constituent
from megatron.data.curriculum.index import CurriculumIndex
from megatron.schedules.units import BatchSchedule


def write_corpus(prefix: str, lengths, seed: int = 0) -> str:
    """A megatron-core ``.bin/.idx`` dataset at ``prefix`` of one document per entry of ``lengths``
    (random byte-level tokens, seeded); returns ``prefix``."""
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    rng = np.random.default_rng(seed)
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=np.uint16)
    for n in lengths:
        builder.add_document(rng.integers(0, 250, int(n)).astype(np.uint16), [int(n)])
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
                                        f"fake {os.path.basename(e.path)}"))
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
