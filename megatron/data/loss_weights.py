"""Loss weights per training dataset, apart from how often it is sampled: ``loss_weight: W`` on a
blend-file entry, or ``--dataset-loss-weights NAME=W ...`` for any kind of training data
(``--data-path``, weighted split paths, a blend file). A dataset's weight multiplies the loss
weight of its tokens before the loss is normalised (megatron/optim/loss_normalization.py), so it weighs
its tokens against the other datasets' without changing the data order.
"""
from typing import Dict, List, Optional, Sequence

from megatron.errors import ConfigError

__all__ = ["parse_dataset_loss_weights", "dataset_loss_weights"]

FLAG = "--dataset-loss-weights"


def parse_dataset_loss_weights(texts: Optional[Sequence[str]]) -> Dict[str, float]:
    """``["web=1", "code=2.5"]`` -> ``{"web": 1.0, "code": 2.5}``; :class:`ConfigError` naming the
    flag and the item for anything else (a weight must be positive and finite)."""
    out: Dict[str, float] = {}
    for text in texts or []:
        name, sep, value = str(text).rpartition("=")
        try:
            weight = float(value) if sep and name else None
        except ValueError:
            weight = None
        if weight is None:
            raise ConfigError(f"{FLAG}: {text!r} is not NAME=WEIGHT (a dataset's short name, as in "
                              "the per-dataset losses of the log, e.g. web=2)")
        if not 0 < weight < float("inf"):
            raise ConfigError(f"{FLAG}: {text!r}: the weight must be positive and finite")
        if name in out:
            raise ConfigError(f"{FLAG}: {name!r} is given twice")
        out[name] = weight
    return out


def dataset_loss_weights(constituents, blend, flag_weights: Dict[str, float]) -> Optional[List[float]]:
    """Each training dataset's loss weight (in ``constituents``' order, the ``dataset_id``
    order), or None when every weight is 1: from the blend's entries (``loss_weight``; one
    dataset listed in several stages must have one weight) or from ``flag_weights`` (by dataset
    name; every name must be a training dataset's), not both."""
    from_blend: Dict[tuple, float] = {}
    for stage in blend.stages:
        for entry in stage.entries:
            previous = from_blend.setdefault(entry.key, entry.loss_weight)
            if previous != entry.loss_weight:
                raise ConfigError(f"{entry.where}.loss_weight: {entry.loss_weight:g}, but "
                                  f"{entry.name} has loss_weight {previous:g} in another stage; "
                                  "a dataset has one loss weight")
    blend_given = any(w != 1.0 for w in from_blend.values())
    if flag_weights and blend_given:
        raise ConfigError(f"{FLAG} and loss_weight in the blend file both give loss weights; give "
                          "them one way")
    names = [c.name for c in constituents]
    unknown = sorted(set(flag_weights) - set(names))
    if unknown:
        raise ConfigError(f"{FLAG}: {', '.join(unknown)} is not a training dataset; the training "
                          f"datasets are {', '.join(names)}")
    weights = [flag_weights.get(c.name, from_blend.get(c.blend_key, 1.0))
               for c in constituents]
    return None if all(w == 1.0 for w in weights) else weights
