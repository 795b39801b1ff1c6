"""Curriculum blending: global sample index -> (dataset id, dataset sample index) under
time-varying dataset weights, cached (the algorithm: ``index.py``'s docstring).

- ``weights.py``: dataset weights over training progress (weight schedules, the breakpoints of
  piecewise-linear ones for the fast path, global sample -> iterations / samples / tokens);
- ``constituents.py``: the constituent datasets of a blend (``Constituent``,
  ``resolve_constituents``);
- ``kernel.py``: the compiled index kernel (``curriculum_index.cpp``, built at first use) and its
  pure-Python twins;
- ``index.py``: ``CurriculumIndex``, the stages planned and the index built with the kernel;
- ``cache.py``: the index's on-disk cache;
- ``dataset.py``: ``CurriculumDataset``, ``Continuation`` and the builders from a blend.
"""
