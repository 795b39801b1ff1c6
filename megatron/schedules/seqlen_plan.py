"""The trained sequence length of every iteration (:class:`SeqLengthPlan`) and the tokens a run
has trained under it. A leaf: numpy only, so the unit conversions (megatron/schedules/units.py)
can count real tokens without knowing how the plan was made (megatron/schedules/seqlen.py)."""
import hashlib
from dataclasses import dataclass, field

import numpy as np

MODES = ("truncate", "split")


@dataclass(frozen=True, eq=False)
class SeqLengthPlan:
    """Tokens per sample, k, trained by each iteration of a sequence-length curriculum.

    Attributes:
        full_length: ``--seq-length`` (tokens per sample the data gives and evaluation uses).
        mode: ``truncate`` (each sample keeps its first k tokens: an iteration trains global
            batch x k tokens) or ``split`` (each sample is cut into ``full_length / k`` samples of
            k tokens: an iteration trains global batch x ``full_length`` tokens).
        lengths: k of iterations 0, 1, ... (0-based: the iteration after that many completed
            ones); iterations past the table train its last value.
        spec: the spelling the plan came from (a JSON-able dict), for checkpoints and messages.
    """

    full_length: int
    mode: str
    lengths: np.ndarray
    spec: dict = field(default_factory=dict)

    def __post_init__(self):
        lengths = np.asarray(self.lengths, dtype=np.int64)
        if lengths.ndim != 1 or lengths.size == 0:
            raise ValueError("a sequence-length plan needs the length of at least one iteration")
        lengths.setflags(write=False)
        object.__setattr__(self, "lengths", lengths)
        if self.mode not in MODES:
            raise ValueError(f"sequence-length mode {self.mode!r}; allowed: {', '.join(MODES)}")

    def length_at(self, iteration: int) -> int:
        """k (tokens per sample) of the iteration after ``iteration`` completed iterations."""
        return int(self.lengths[min(max(int(iteration), 0), self.lengths.size - 1)])

    def lengths_at(self, iterations) -> np.ndarray:
        """Vectorised :meth:`length_at` (int64)."""
        it = np.clip(np.asarray(iterations, dtype=np.int64), 0, self.lengths.size - 1)
        return self.lengths[it]

    @property
    def truncates(self) -> bool:
        """Whether iterations train fewer tokens than global batch x ``full_length``."""
        return self.mode == "truncate"

    def to_json(self) -> dict:
        """The plan as JSON-able values: the lengths run-length encoded (``[[k, iterations],
        ...]``), so a long run's plan stays small in a ledger."""
        change = np.flatnonzero(np.diff(self.lengths)) + 1
        starts = np.concatenate([[0], change])
        counts = np.diff(np.concatenate([starts, [self.lengths.size]]))
        return {"full_length": int(self.full_length), "mode": self.mode, "spec": self.spec,
                "runs": [[int(self.lengths[s]), int(c)] for s, c in zip(starts, counts, strict=True)]}

    @classmethod
    def from_json(cls, obj: dict) -> "SeqLengthPlan":
        """The plan of :meth:`to_json`'s ``obj``."""
        lengths = np.concatenate([np.full(int(c), int(k), dtype=np.int64) for k, c in obj["runs"]])
        return cls(int(obj["full_length"]), obj["mode"], lengths, dict(obj.get("spec") or {}))

    def fingerprint(self) -> str:
        """What a data index built over this plan is keyed on (:meth:`digest`)."""
        return self.digest()

    def digest(self) -> str:
        """A short hash of the lengths and mode (cache keys of data built from token progress)."""
        h = hashlib.sha256(self.mode.encode())
        h.update(np.int64(self.full_length).tobytes())
        h.update(self.lengths.tobytes())
        return h.hexdigest()[:16]
