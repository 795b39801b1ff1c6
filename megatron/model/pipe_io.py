"""The input format of the GPT ``PipelineModule`` (megatron/model/gpt_model_pipe.py, which says
what flows where): :func:`pipe_batch` turns the loader's batch dict into the ``(inputs, labels)``
tuples DeepSpeed's pipe engine feeds to the first and the last stage."""
from typing import Dict, Tuple

import torch

from megatron.data.device_transfer import batch_to_device


def pipe_batch(batch: Dict[str, torch.Tensor], device=None) -> Tuple[tuple, tuple]:
    """``((tokens, position_ids, *attention), (labels, loss_mask[, dataset_id]))`` from a loader
    batch (the first stage reads the inputs, the last stage the labels); ``attention`` is the
    batch's compact attention structure (``segment_ids`` with ``cu_seqlens``, ``is_prefix``) in
    the pipe's form. With ``device`` the batch goes there in one non-blocking copy first
    (megatron/data/device_transfer.py), so the engine's own per-tensor move has nothing to do."""
    from megatron.model.gpt_model_pipe import attention_tensors  # lazy: megatron-core + deepspeed (seconds)
    from megatron.model.masks import CU_SEQLENS_KEY, IS_PREFIX_KEY, SEGMENT_IDS_KEY  # lazy: megatron-core (seconds)

    if device is not None:
        batch = batch_to_device(batch, device)
    inputs = [batch["tokens"], batch["position_ids"],
              *attention_tensors(batch.get(SEGMENT_IDS_KEY), batch.get(IS_PREFIX_KEY),
                                 batch.get(CU_SEQLENS_KEY))]
    labels = [batch["labels"], batch["loss_mask"]]
    if batch.get("dataset_id") is not None:
        labels.append(torch.as_tensor(batch["dataset_id"]).view(-1))
    return tuple(inputs), tuple(labels)
