"""Silence warnings that are expected on every run and tell the user nothing actionable.

Kept free of torch imports so fast tools (tools/preview_schedule.py) can call it first.
"""
import warnings


def quiet_known_warnings() -> None:
    """Hide (1) megatron-core's import-time notices that the optional Apex / Transformer Engine
    kernels are absent (expected on CPU; the fallbacks are the intended path) and (2) torch's
    deprecation notice for ``all_gather_into_tensor``, which DeepSpeed calls, not this project.
    Call before importing megatron.core or deepspeed."""
    warnings.filterwarnings("ignore", message=r".*(Apex|Transformer Engine).*not installed")
    warnings.filterwarnings("ignore", message=r"full scope is deprecated")
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated")
