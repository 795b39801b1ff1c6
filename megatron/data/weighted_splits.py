"""BigScience weighted split paths: ``--{train,valid,test}-weighted-split-paths`` and the
``--{train,valid,test}-weighted-split-paths-path FILE`` variants.

Each argument is one named group::

    "NAME: WEIGHT START:END PREFIX, WEIGHT START:END PREFIX, ..."

``START:END`` selects the documents of PREFIX in that fraction range, by position (``0.9:1`` is
the last tenth; it never overlaps ``0:0.9``). A ``-path`` FILE holds the same text: either the
whole argument text on one line with each group in double quotes (BigScience's xP3 files), or one
group per line (quotes optional: a line that does not start with a quote is one group, verbatim, so
a path may hold a ``'``); blank lines and ``#`` comment lines are skipped. NAME is the text before
the first ``:``, as in BigScience's parser (``VALID A: ...`` and ``train:0.3 0:0.95 A`` work).

Each group becomes a :class:`~megatron.data.blend_config.SplitBlend` with one static ``blend``
stage, so it is built by :mod:`megatron.data.curriculum.dataset` (megatron-core's blending rule).
"""
import os
import shlex
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from megatron.data.blend_config import BlendEntry, BlendStage, SplitBlend, missing_files_problem
from megatron.errors import ConfigError

__all__ = [
    "WeightedSplitError", "WeightedSplitItem", "WeightedSplitGroup", "parse_weighted_split_group",
    "parse_weighted_split_paths", "read_weighted_split_paths_file", "parse_weighted_split_flags",
    "build_weighted_split_datasets",
]


class WeightedSplitError(ConfigError):
    """A bad weighted-split-paths argument; the message names the flag and the text."""


@dataclass(frozen=True)
class WeightedSplitItem:
    weight: float
    start: float
    end: float
    prefix: str


@dataclass(frozen=True)
class WeightedSplitGroup:
    name: str
    items: Tuple[WeightedSplitItem, ...]

    def to_split_blend(self, where: str = "") -> SplitBlend:
        """The group as a static blend (one stage)."""
        entries = tuple(
            BlendEntry(path=it.prefix, weight=it.weight, split=(it.start, it.end),
                       where=f"{where} group {self.name!r} item {k}")
            for k, it in enumerate(self.items))
        w = f"{where} group {self.name!r}"
        return SplitBlend(stages=(BlendStage("blend", entries, None, w),), name=self.name, where=w)


def _fail(flag: str, text: str, msg: str) -> WeightedSplitError:
    return WeightedSplitError(f"{flag}: {msg} (in {text!r})")


def _fraction(value: str, flag: str, text: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise _fail(flag, text, f"range bound {value!r} is not a number") from None
    if not 0.0 <= x <= 1.0:
        raise _fail(flag, text, f"range bound {value!r} lies outside [0, 1]")
    return x


def _is_number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def parse_weighted_split_group(text: str, flag: str = "--train-weighted-split-paths",
                               check_files: bool = True) -> WeightedSplitGroup:
    """``"NAME: W START:END PREFIX, ..."`` -> :class:`WeightedSplitGroup`. As in BigScience's
    parser, NAME is the text before the first ``:`` (stripped; it may hold spaces, and no space is
    needed after the colon: ``train:0.3 0:0.95 A``)."""
    raw = text.strip()
    if ":" not in raw:
        raise _fail(flag, text, "missing ':' after the group name (expected \"NAME: WEIGHT "
                                "START:END PREFIX, ...\")")
    name, rest = (part.strip() for part in raw.split(":", 1))
    if not name:
        raise _fail(flag, text, "empty group name (expected \"NAME: WEIGHT START:END PREFIX, ...\")")
    items, seen = [], set()
    parts = [p.strip() for p in rest.split(",")]
    if not any(parts):
        raise _fail(flag, text, f"group {name!r} lists no dataset")
    for part in parts:
        if not part:
            raise _fail(flag, text, f"empty item in group {name!r} (stray comma?)")
        fields = part.split()
        if len(fields) != 3:
            words = name.split()
            if len(words) > 1 and _is_number(words[-1]):  # "web 1 0:1 data/web"
                raise _fail(flag, text, "missing ':' after the group name: the text before the "
                                        f"first ':' ({name!r}) is taken as the name (expected "
                                        "\"NAME: WEIGHT START:END PREFIX, ...\")")
            raise _fail(flag, text, f"item {part!r} must be 'WEIGHT START:END PREFIX'")
        weight_s, range_s, prefix = fields
        try:
            weight = float(weight_s)
        except ValueError:
            raise _fail(flag, text, f"bad weight {weight_s!r} in item {part!r}") from None
        if not weight > 0 or weight != weight or weight == float("inf"):
            raise _fail(flag, text, f"bad weight {weight_s!r} in item {part!r}: weights must be "
                                    "positive and finite")
        if range_s.count(":") != 1:
            raise _fail(flag, text, f"bad range {range_s!r} in item {part!r}: expected START:END")
        start_s, end_s = range_s.split(":")
        start, end = _fraction(start_s, flag, text), _fraction(end_s, flag, text)
        if not start < end:
            raise _fail(flag, text, f"empty range {range_s!r} in item {part!r} (START must be < END)")
        problem = missing_files_problem(prefix) if check_files else None
        if problem:
            raise _fail(flag, text, problem)
        key = (prefix, start, end)
        if key in seen:
            raise _fail(flag, text, f"{prefix} {range_s} is listed twice in group {name!r}")
        seen.add(key)
        items.append(WeightedSplitItem(weight, start, end, prefix))
    return WeightedSplitGroup(name, tuple(items))


def parse_weighted_split_paths(texts: Optional[Sequence[str]], flag: str,
                               check_files: bool = True) -> List[WeightedSplitGroup]:
    """All groups of one flag (each of ``texts``, the flag's arguments, one group); group names
    must be unique."""
    groups, names = [], {}
    for text in texts or []:
        group = parse_weighted_split_group(text, flag, check_files)
        if group.name in names:
            raise WeightedSplitError(f"{flag}: group name {group.name!r} is used twice "
                                     f"({names[group.name]!r} and {text!r})")
        names[group.name] = text
        groups.append(group)
    return groups


def read_weighted_split_paths_file(path: str, flag: str) -> List[str]:
    """The group texts of a ``--*-weighted-split-paths-path`` FILE: quoted groups (any number per
    line, as in BigScience's xP3 files) or one group per line."""
    if not os.path.isfile(path):
        raise WeightedSplitError(f"{flag}: file {path!r} does not exist")
    with open(path, "r", encoding="utf-8") as f:
        lines = f.read().splitlines()
    texts = []
    for lineno, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped[0] in "\"'":  # quoted groups; an unquoted line is one group, verbatim
            try:
                texts.extend(t for t in shlex.split(stripped) if t.strip())
            except ValueError as exc:
                raise WeightedSplitError(f"{flag}: {path}:{lineno}: {exc} in {stripped!r}") from None
        else:
            texts.append(stripped)
    if not texts:
        raise WeightedSplitError(f"{flag}: file {path!r} holds no group")
    return texts


def parse_weighted_split_flags(paths: Dict[str, Optional[Sequence[str]]],
                               files: Dict[str, Optional[str]],
                               check_files: bool = True) -> Dict[str, List[WeightedSplitGroup]]:
    """``{"train": [...], "valid": [...], "test": [...]}`` from each split's
    ``--{split}-weighted-split-paths`` texts (``paths[split]``) or its
    ``--{split}-weighted-split-paths-path`` FILE (``files[split]``; mutually exclusive)."""
    out = {}
    for split in ("train", "valid", "test"):
        flag = f"--{split}-weighted-split-paths"
        texts = list(paths.get(split) or [])
        file_path = files.get(split)
        if file_path:
            if texts:
                raise WeightedSplitError(f"{flag} and {flag}-path are mutually exclusive")
            flag = flag + "-path"
            texts = read_weighted_split_paths_file(file_path, flag)
        out[split] = parse_weighted_split_paths(texts, flag, check_files)
    return out


def build_weighted_split_datasets(groups: Sequence[WeightedSplitGroup], num_samples: int, gpt_config,
                                  batch_schedule, split: str = "valid",
                                  cache_dir: Optional[str] = None, order: str = "auto"):
    """One :class:`~megatron.data.curriculum.dataset.CurriculumDataset` (static weights: megatron-core's
    blending) per group, each sized for ``num_samples``, built in ``order``
    (``--data-index-order``); returns ``[(name, dataset), ...]``."""
    from megatron.data.curriculum.dataset import build_curriculum_dataset  # lazy: torch (~1 s); validation needs none

    return [(g.name, build_curriculum_dataset(g.to_split_blend(f"--{split}-weighted-split-paths"),
                                              num_samples, gpt_config, batch_schedule, split,
                                              cache_dir, order=order))
            for g in groups]
