"""What a datasets provider hands the training loop: the training set and named eval groups."""
from dataclasses import dataclass, field
from typing import List, Optional

import torch


@dataclass
class EvalGroup:
    """One named validation or test set; ``split`` is "valid" or "test"."""

    name: str
    dataset: torch.utils.data.Dataset
    split: str = "valid"


@dataclass
class TrainData:
    """What a datasets provider returns: the training set, its per-dataset names (index =
    ``dataset_id`` in samples, for per-dataset losses) and the evaluation groups."""

    train: Optional[torch.utils.data.Dataset]
    eval_groups: List[EvalGroup] = field(default_factory=list)
    dataset_names: List[str] = field(default_factory=list)
