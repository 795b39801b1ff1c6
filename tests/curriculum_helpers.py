"""Test helper: a CurriculumIndex over fake constituents (no data files needed)."""
from megatron.data.blend_config import parse_blend_config
from megatron.data.curriculum import Constituent, CurriculumIndex
from megatron.schedules.units import BatchSchedule


def fake_index(blend_obj, N, gbs=4, rampup=None, spe=10 ** 6, seq=16):
    """Index of ``N`` samples for the train blend ``blend_obj`` (a dict as in a blend file), each
    dataset holding ``spe`` samples per epoch (an int, or {path: int})."""
    cfg = parse_blend_config({"train": blend_obj}, "t.yaml", check_files=False).train
    cons, seen = [], set()
    for stage in cfg.stages:
        for e in stage.entries:
            if e.key not in seen:
                seen.add(e.key)
                s = spe if isinstance(spe, int) else spe[e.path]
                cons.append(Constituent(e.path, e.split, e.name, 0, 10, 10, s * seq + 1, s))
    return CurriculumIndex(cfg, cons, N, BatchSchedule(gbs, rampup, seq))
