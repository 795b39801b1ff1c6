"""What a datasets provider hands the training loop: the training set and named eval groups."""
from dataclasses import dataclass, field
from typing import Any, List, Optional

import torch


@dataclass
class EvalGroup:
    """One named validation or test set; ``split`` is "valid" or "test". ``first_evaluation`` is
    the run's evaluation number at which the group joined (a group added at a resume reads its
    windows from its first one on: megatron/data/mix_resume.py ``eval_group_counters``)."""

    name: str
    dataset: torch.utils.data.Dataset
    split: str = "valid"
    first_evaluation: int = 0


@dataclass
class TrainData:
    """What a datasets provider returns: the training set, its per-dataset names (index =
    ``dataset_id`` in samples, for per-dataset losses) and the evaluation groups. ``mix`` is the
    training mix with its data ledger (megatron/data/mix_resume.py ``TrainMix``): what a
    checkpoint records of the data, and ``samples_drawn`` for the logs; None for a training set
    without one. ``loss_weights``: each dataset's loss weight (index = ``dataset_id``,
    megatron/data/loss_weights.py), None when every weight is 1."""

    train: Optional[torch.utils.data.Dataset]
    eval_groups: List[EvalGroup] = field(default_factory=list)
    dataset_names: List[str] = field(default_factory=list)
    mix: Optional[Any] = None
    loss_weights: Optional[List[float]] = None
