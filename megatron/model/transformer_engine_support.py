"""Whether Transformer Engine can run here, found by importing it: a TE that is installed but fails
to import (a CUDA or cuDNN library missing, a build for another torch) is reported with its error,
never chosen. Also which of the flash-attn packages TE's flash kernels need are installed.

Transformer Engine's own rules this project's ``--attention-backend`` checks follow from what it
reports (read in TE's ``attention/dot_product_attention/utils.py``, ``get_attention_backend``):

- its flash kernels come from the ``flash-attn`` (2.x), ``flash-attn-3`` or ``flash-attn-4``
  distributions (TE's ``FlashAttentionUtils`` looks them up by distribution name); the 3 and 4
  kernels have no attention dropout;
- an ``arbitrary`` mask (what prefix-LM batches need) runs on its unfused kernel only;
- its unfused kernel takes the packed ``thd`` format from TE 2.12 on (before, ``thd`` disables it).
"""
import dataclasses
import importlib
import importlib.metadata
import importlib.util
from typing import Optional, Tuple

FLASH_ATTN_DISTRIBUTIONS = ("flash-attn", "flash-attn-3", "flash-attn-4")
FLASH_ATTN_WITH_DROPOUT = ("flash-attn",)  # TE disables FlashAttention 3 and 4 for dropout
UNFUSED_THD_MIN_VERSION = (2, 12)


@dataclasses.dataclass(frozen=True)
class TransformerEngineStatus:
    """What importing Transformer Engine found: ``importable``; its ``version`` (major, minor)
    when it imports; ``problem``, the import error, when it is installed but does not import;
    ``flash_attn``, the installed flash-attn distributions (``name==version``)."""

    importable: bool
    version: Optional[Tuple[int, int]] = None
    problem: Optional[str] = None
    flash_attn: Tuple[str, ...] = ()

    @property
    def installed(self) -> bool:
        """True when a ``transformer_engine`` package is present, importable or not."""
        return self.importable or self.problem is not None

    def describe_absence(self) -> str:
        """Why TE cannot be used, for error messages and start-up notes."""
        if self.problem is not None:
            return f"Transformer Engine is installed but does not import ({self.problem})"
        return "Transformer Engine is not installed (the module transformer_engine does not import)"


def installed_flash_attn() -> Tuple[str, ...]:
    """``name==version`` of each installed distribution of :data:`FLASH_ATTN_DISTRIBUTIONS`."""
    found = []
    for name in FLASH_ATTN_DISTRIBUTIONS:
        try:
            found.append(f"{name}=={importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            continue
    return tuple(found)


def transformer_engine_status() -> TransformerEngineStatus:
    """Import ``transformer_engine.pytorch`` (only when a ``transformer_engine`` package exists, so
    machines without it pay nothing) and report what happened."""
    if importlib.util.find_spec("transformer_engine") is None:
        return TransformerEngineStatus(importable=False)
    try:
        importlib.import_module("transformer_engine.pytorch")
    except Exception as e:  # ImportError, OSError from a missing CUDA library, RuntimeError, ...
        message = " ".join(str(e).split())[:300]
        return TransformerEngineStatus(importable=False, problem=f"{type(e).__name__}: {message}")
    from megatron.core.utils import get_te_version

    version = get_te_version()
    return TransformerEngineStatus(importable=True, version=(version.major, version.minor),
                                   flash_attn=installed_flash_attn())


def transformer_engine_available() -> bool:
    """True when Transformer Engine imports (GPU installs); never required. Importing is the
    test: an installed TE that fails to import is not available. A run asks once, in
    ``validate_args`` (``args.transformer_engine_status``)."""
    return transformer_engine_status().importable
