"""Shared by the memory benchmarks: the process's peak resident set and the bytes autograd saves for
the backward pass of one forward."""
import contextlib
import resource
from typing import Dict, Iterator


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far, in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


@contextlib.contextmanager
def saved_for_backward(model) -> Iterator[Dict[int, int]]:
    """Count the storages autograd saves for backward inside the block, excluding ``model``'s
    parameters: yields a dict storage pointer -> bytes, filled as the forward runs (sum its values)."""
    import torch

    saved: Dict[int, int] = {}
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def pack(t):
        try:
            storage = t.untyped_storage()
            if storage.data_ptr() not in weights:
                saved[storage.data_ptr()] = storage.nbytes()
        except RuntimeError:  # tensors without storage (e.g. sparse or functional wrappers)
            pass
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield saved
