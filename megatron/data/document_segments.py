"""``--reset-attention-mask`` for pretraining: samples carry the ``segment_ids`` of their documents.

A pretraining sample concatenates documents separated by EOD tokens. With ``--reset-attention-mask``
a token attends only to tokens of its own document; the sample says so compactly with per-token
``segment_ids`` (:func:`segment_ids_after_eod`: a new document starts right after each EOD),
instead of megatron-core's dense ``[1, s, s]`` ``attention_mask``; the model builds each attention
backend's form of them (megatron/model/masks.py).
"""
from dataclasses import replace
from typing import Dict

import torch

from megatron.data.train_data import TrainData

SEGMENT_IDS_DTYPE = torch.int32


def segment_ids_after_eod(tokens: torch.Tensor, eod: int) -> torch.Tensor:
    """``[b, s]`` int32 segment ids of pretraining samples under ``--reset-attention-mask``: a new
    document starts right after every EOD token (the EOD belongs to the document it ends), as
    megatron-core's ``_get_ltor_masks_and_position_ids`` masks. Segments count from 1."""
    is_eod = (tokens == eod).to(SEGMENT_IDS_DTYPE)
    return (1 + torch.cumsum(is_eod, dim=-1, dtype=SEGMENT_IDS_DTYPE) - is_eod).to(SEGMENT_IDS_DTYPE)


class DocumentSegments(torch.utils.data.Dataset):
    """``dataset``'s samples with ``segment_ids`` [s] int32 added from their ``tokens`` (a dense
    ``attention_mask`` the dataset may carry is dropped); other attributes come from ``dataset``."""

    def __init__(self, dataset: torch.utils.data.Dataset, eod: int):
        self.dataset = dataset
        self.eod = int(eod)

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index) -> Dict[str, torch.Tensor]:
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
