"""Silence warnings that are expected on every run and tell the user nothing actionable.

Kept free of torch imports so fast tools (tools/preview_schedule.py) can call it first.
"""
import importlib.util
import logging
import warnings

# megatron-core 0.19's GPTModel logs this at every model build: the project builds GPTModel on
# purpose (docs/megatron_core_versions.md says what HybridModel means for it)
_GPT_MODEL_DEPRECATION = "GPTModel IS DEPRECATED"


class _DropMessage(logging.Filter):
    """A logging filter dropping the records whose message starts with ``prefix``."""

    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


def quiet_known_warnings() -> None:
    """Hide (1) megatron-core's import-time notices that the optional Apex / Transformer Engine
    kernels are absent, when they are (expected on CPU; the fallbacks are the intended path; a
    package that is installed but fails to import keeps its notices, which explain why) and (2)
    torch's deprecation notice for ``all_gather_into_tensor``, which DeepSpeed calls, not this
    project; (3) megatron-core 0.19's notices that GPTModel is deprecated (logged at every model
    build) and that a single process without torch.distributed or ``RANK`` counts as rank 0
    (tools that build no process group). Call before importing megatron.core or deepspeed."""
    absent = [label for label, module in (("Apex", "apex"), ("Transformer Engine", "transformer_engine"))
              if importlib.util.find_spec(module) is None]
    if absent:
        warnings.filterwarnings("ignore", message=rf".*({'|'.join(absent)}).*not installed")
    warnings.filterwarnings("ignore", message=r"full scope is deprecated")
    warnings.filterwarnings("ignore", category=FutureWarning,
                            message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated")
    warnings.filterwarnings("ignore", message=r"Could not determine rank from torch\.distributed")
    gpt_model_logger = logging.getLogger("megatron.core.models.gpt.gpt_model")
    if not any(isinstance(f, _DropMessage) for f in gpt_model_logger.filters):
        gpt_model_logger.addFilter(_DropMessage(_GPT_MODEL_DEPRECATION))
