"""The sequence-length curriculum's schedule (sequence-length warmup, Li, Zhang and He 2022,
arXiv 2108.06084): the number of tokens per sample, k, that each training iteration trains on.

This module holds the schedule only; nothing trains with it yet (issue "Sequence-length
curriculum"). It reads DeepSpeed's legacy ``"curriculum_learning"`` section
(``curriculum_type: "seqlen"``) and gives, for every iteration, the length DeepSpeed's own
``CurriculumScheduler`` gives for the same config, as Microsoft Megatron-DeepSpeed's loop asks it:

* ``fixed_linear`` / ``fixed_root``: ``floor((step / total_curriculum_step) ** (1 / root_degree) x
  (max - min) + min)``, rounded down to a multiple of ``difficulty_step``, at least ``min``
  rounded up to that multiple, at most ``max`` (``fixed_linear``: ``root_degree`` 1);
* ``fixed_discrete``: ``difficulty[i]`` while ``step <= max_step[i]``, the last difficulty after;
* the step is the completed optimizer steps + 1 (Microsoft's ``update_difficulty(iteration + 1)``
  before each iteration), and the length stops changing once it has reached ``max_difficulty``
  (``CurriculumScheduler.update_difficulty``).
"""
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Tuple

import numpy as np

from megatron.errors import ConfigError

KINDS = ("fixed_linear", "fixed_root", "fixed_discrete")


@dataclass(frozen=True)
class SeqLengthCurriculum:
    """A sequence-length curriculum in DeepSpeed's terms: lengths from ``min_length`` to
    ``max_length`` tokens (DeepSpeed's ``min_difficulty``/``max_difficulty``) by ``kind``.
    ``fixed_linear``/``fixed_root`` reach ``max_length`` after ``total_steps`` iterations in
    multiples of ``multiple_of`` tokens (``difficulty_step``) along a ``root_degree`` root;
    ``fixed_discrete`` trains ``lengths[i]`` up to iteration ``max_steps[i]``."""

    kind: str
    min_length: int
    max_length: int
    total_steps: int = 0
    multiple_of: int = 1
    root_degree: float = 1.0
    lengths: Tuple[int, ...] = ()
    max_steps: Tuple[int, ...] = ()

    def difficulty(self, step: int) -> int:
        """DeepSpeed's ``CurriculumScheduler.get_difficulty(step)``: the length (tokens) of
        ``step``, counted from 1."""
        if self.kind == "fixed_discrete":
            if step > self.max_steps[-1]:
                return self.lengths[-1]
            return next(length for length, last in zip(self.lengths, self.max_steps, strict=False)
                        if step <= last)
        fraction = (float(step) / self.total_steps) ** (1.0 / self.root_degree)
        length = math.floor(fraction * (self.max_length - self.min_length) + self.min_length)
        length -= length % self.multiple_of
        length = max(length, -(-self.min_length // self.multiple_of) * self.multiple_of)
        return min(length, self.max_length)

    def lengths_for_iterations(self, iterations: int) -> np.ndarray:
        """The length (tokens per sample) trained at each of iterations 1..``iterations``, as
        DeepSpeed's scheduler gives it when asked before every iteration with the completed
        steps + 1: it starts at ``min_length`` and stops changing once at ``max_length``."""
        out = np.empty(iterations, dtype=np.int64)
        current = self.min_length
        for i in range(iterations):
            if current < self.max_length:
                current = self.difficulty(i + 1)
            out[i] = current
        return out


def _require(section: Dict[str, Any], key: str, where: str) -> Any:
    if key not in section:
        raise ConfigError(f"{where}: missing '{key}'")
    return section[key]


def _positive_int(value: Any, key: str, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{where}: '{key}' is {value!r}; expected a positive integer")
    return value


def seqlen_curriculum_from_deepspeed(section: Dict[str, Any],
                                     where: str = "curriculum_learning") -> SeqLengthCurriculum:
    """The :class:`SeqLengthCurriculum` of DeepSpeed's legacy ``"curriculum_learning"`` section
    (``where`` names it in errors): ``curriculum_type`` ``"seqlen"``, ``min_difficulty``,
    ``max_difficulty``, ``schedule_type`` (one of :data:`KINDS`) and its ``schedule_config``.
    ConfigError names the key, the value and what is allowed."""
    kind_of_curriculum = section.get("curriculum_type", "seqlen")
    if kind_of_curriculum != "seqlen":
        raise ConfigError(f"{where}: curriculum_type {kind_of_curriculum!r}: only 'seqlen' (the "
                          "sequence-length curriculum) is a curriculum of this kind")
    low = _positive_int(_require(section, "min_difficulty", where), "min_difficulty", where)
    high = _positive_int(_require(section, "max_difficulty", where), "max_difficulty", where)
    if low > high:
        raise ConfigError(f"{where}: min_difficulty {low} is above max_difficulty {high}")
    kind = _require(section, "schedule_type", where)
    if kind not in KINDS:
        raise ConfigError(f"{where}: schedule_type {kind!r}; allowed: {', '.join(KINDS)}")
    config = _require(section, "schedule_config", where)
    inner = f"{where}.schedule_config"
    if kind == "fixed_discrete":
        lengths: List[int] = [_positive_int(v, "difficulty", inner)
                              for v in _require(config, "difficulty", inner)]
        max_steps: List[int] = [_positive_int(v, "max_step", inner)
                                for v in _require(config, "max_step", inner)]
        if not max_steps or len(lengths) != len(max_steps) + 1:
            raise ConfigError(f"{inner}: 'difficulty' has {len(lengths)} entries and 'max_step' "
                              f"{len(max_steps)}; expected one difficulty more than max steps "
                              "(the last one holds after the last max step)")
        return SeqLengthCurriculum(kind, low, high, lengths=tuple(lengths),
                                   max_steps=tuple(max_steps))
    total = _positive_int(_require(config, "total_curriculum_step", inner),
                          "total_curriculum_step", inner)
    step = _positive_int(_require(config, "difficulty_step", inner), "difficulty_step", inner)
    degree = 1.0
    if kind == "fixed_root":
        degree = _require(config, "root_degree", inner)
        if isinstance(degree, bool) or not isinstance(degree, (int, float)) or degree <= 0:
            raise ConfigError(f"{inner}: 'root_degree' is {degree!r}; expected a positive number")
    return SeqLengthCurriculum(kind, low, high, total_steps=total, multiple_of=step,
                               root_degree=float(degree))
