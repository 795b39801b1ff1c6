"""``--reset-attention-mask`` for pretraining: samples carry the ``segment_ids`` of their documents.

A pretraining sample concatenates documents separated by EOD tokens. With ``--reset-attention-mask``
a token attends only to tokens of its own document; the sample says so compactly with per-token
``segment_ids`` (megatron/model/masks.py ``segment_ids_after_eod``: a new document starts right after
each EOD), instead of megatron-core's dense ``[1, s, s]`` ``attention_mask``.
"""
from dataclasses import replace
from typing import Dict

import torch

from megatron.data.train_data import TrainData


class DocumentSegments(torch.utils.data.Dataset):
    """``dataset``'s samples with ``segment_ids`` [s] int32 added from their ``tokens`` (a dense
    ``attention_mask`` the dataset may carry is dropped); other attributes come from ``dataset``."""

    def __init__(self, dataset: torch.utils.data.Dataset, eod: int):
        self.dataset = dataset
        self.eod = int(eod)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index) -> Dict[str, torch.Tensor]:
        from megatron.model.masks import segment_ids_after_eod

        sample = dict(self.dataset[index])
        sample.pop("attention_mask", None)
        sample["segment_ids"] = segment_ids_after_eod(torch.as_tensor(sample["tokens"]), self.eod)
        return sample

    def __getattr__(self, name):
        if name == "dataset":
            raise AttributeError(name)
        return getattr(self.dataset, name)


def with_document_segments(data: TrainData, eod: int) -> TrainData:
    """``data`` with every training and evaluation dataset wrapped in :class:`DocumentSegments`."""
    wrap = (lambda ds: None if ds is None else DocumentSegments(ds, eod))
    return replace(data, train=wrap(data.train),
                   eval_groups=[replace(g, dataset=wrap(g.dataset)) for g in data.eval_groups])
