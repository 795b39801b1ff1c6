"""A micro batch to the device in one copy: its tensors packed into one pinned host buffer, sent with
one non-blocking host-to-device transfer, and unpacked there as views of the one device buffer.

Sending each tensor on its own from pageable memory costs one transfer (and a host wait) per
tensor; from one pinned buffer the copy is asynchronous, so the host queues the step's kernels while
the batch travels. Values are bit-identical (a byte copy). On the CPU nothing is copied.
"""
from typing import Dict, List, Mapping, Sequence, Tuple

import torch

ALIGNMENT = 16  # bytes; every tensor starts at a multiple, so any dtype's view is aligned

Slot = Tuple[int, int, torch.dtype, torch.Size]  # (byte offset, bytes, dtype, shape)


def _aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


def pack_tensors(tensors: Sequence[torch.Tensor], pin_memory: bool) -> Tuple[torch.Tensor, List[Slot]]:
    """One uint8 host buffer holding every tensor's bytes (each at an aligned offset), pinned when
    ``pin_memory``, and the slots :func:`unpack_tensors` reads them back from."""
    slots, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        slots.append((offset, nbytes, t.dtype, t.shape))
        offset += _aligned(nbytes)
    buffer = torch.empty(max(offset, ALIGNMENT), dtype=torch.uint8, pin_memory=pin_memory)
    for t, (start, nbytes, dtype, shape) in zip(tensors, slots, strict=True):
        if nbytes:
            buffer[start:start + nbytes].view(dtype).view(shape).copy_(t)
    return buffer, slots


def unpack_tensors(buffer: torch.Tensor, slots: Sequence[Slot]) -> List[torch.Tensor]:
    """The tensors of :func:`pack_tensors` as views of ``buffer`` (on whichever device it is)."""
    out = []
    for start, nbytes, dtype, shape in slots:
        if nbytes == 0:
            out.append(torch.empty(shape, dtype=dtype, device=buffer.device))
        else:
            out.append(buffer[start:start + nbytes].view(dtype).view(shape))
    return out


def batch_to_device(batch: Mapping[str, object], device) -> Dict[str, object]:
    """``batch`` with its tensors on ``device``, moved in one non-blocking transfer from pinned
    memory (values that are not tensors, such as the host segment layout, stay as they are). On a
    CPU device the tensors are returned as they are."""
    device = torch.device(device)
    keys = [k for k, v in batch.items() if torch.is_tensor(v)]
    if device.type == "cpu" or not keys:
        return dict(batch)
    buffer, slots = pack_tensors([batch[k] for k in keys], pin_memory=True)
    on_device = buffer.to(device, non_blocking=True)
    return {**batch, **dict(zip(keys, unpack_tensors(on_device, slots), strict=True))}


def to_device_async(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` on ``device`` without the host waiting for the device: a host tensor bound for a
    GPU goes from pinned memory with a non-blocking copy (from pageable memory the copy would
    first wait for the device's queue); on the CPU, or already there, it is returned as it is."""
    device = torch.device(device)
    if tensor.device == device or device.type == "cpu":
        return tensor.to(device)
    if tensor.device.type == "cpu" and not tensor.is_pinned():
        tensor = tensor.pin_memory()
    return tensor.to(device, non_blocking=True)
