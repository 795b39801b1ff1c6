"""Silence warnings that are expected on every run and tell the user nothing actionable.

Kept free of torch imports so fast tools (tools/preview_schedule.py) can call it first.
"""
import importlib.util
import warnings


def quiet_known_warnings() -> None:
    """Hide (1) megatron-core's import-time notices that the optional Apex / Transformer Engine
    kernels are absent, when they are (expected on CPU; the fallbacks are the intended path; a
    package that is installed but fails to import keeps its notices, which explain why) and (2)
    torch's deprecation notice for ``all_gather_into_tensor``, which DeepSpeed calls, not this
    project. Call before importing megatron.core or deepspeed."""
    absent = [label for label, module in (("Apex", "apex"), ("Transformer Engine", "transformer_engine"))
              if importlib.util.find_spec(module) is None]
    if absent:
        warnings.filterwarnings("ignore", message=rf".*({'|'.join(absent)}).*not installed")
    warnings.filterwarnings("ignore", message=r"full scope is deprecated")
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated")
