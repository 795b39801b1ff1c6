"""Every tensor of a nested state (optimizer state dicts, checkpoint files), by its path."""
import torch


def tensors_by_path(obj, prefix=""):
    """Every tensor inside ``obj`` (nested dicts, lists) by its path, cloned."""
    if torch.is_tensor(obj):
        return {prefix: obj.detach().clone()}
    found = {}
    if isinstance(obj, dict):
        for key, value in obj.items():
            found.update(tensors_by_path(value, f"{prefix}/{key}"))
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            found.update(tensors_by_path(value, f"{prefix}[{i}]"))
    return found
