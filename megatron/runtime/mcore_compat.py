"""Where megatron-core 0.16 and 0.17-0.19 differ for this project, in one place, by feature
detection (what the installed megatron-core has), never by its version number.
docs/megatron_core_versions.md lists each difference and why it matters here.

- Layer specs: 0.16 describes a submodule as a ``ModuleSpec`` (``.submodules``); from 0.17 the
  MoE layer and its experts are ``functools.partial(Module, submodules=...)`` builders
  (:func:`spec_submodules` reads either).
- Grouped GEMM without Transformer Engine: 0.16 builds its legacy ``GroupedMLP`` (the
  ``grouped_gemm`` package's kernels) for ``--moe-grouped-gemm`` with ``--transformer-impl
  local``; 0.17+ removed it and builds one GEMM per expert instead, silently
  (:func:`legacy_grouped_gemm_available`).
- MoE logging: 0.16 keeps the routers' auxiliary losses in a dict tracker whose entries say
  ``reduce_group_has_dp``; 0.17+ has ``get_moe_metrics_tracker()`` whose entries say the inverse,
  ``needs_dp_avg`` (the old functions are deprecated for removal) (:func:`moe_metric_entries`,
  :func:`clear_moe_metrics`).
- YaRN's attention factor: 0.16's attention reads it from its config at every forward; 0.19's
  caches it at construction (``Attention._yarn_concentration_factor``), so a switch of the
  config in place must refresh it (:func:`refresh_yarn_attention_factor`).
- The window query ``GPTDataset._query_document_sample_shuffle_indices``: 0.16 returns (tokens,
  document ids); 0.19 adds each document's token count, which its ``__getitem__`` unpacks
  (:func:`window_query_returns_document_lengths`).

Every function imports megatron-core when called, so importing this module costs nothing.
"""
import functools
from dataclasses import dataclass
from typing import Any, Dict, Optional


def spec_submodules(spec: Any) -> Any:
    """The submodules a layer-spec entry builds its module with: a ``ModuleSpec``'s
    ``submodules`` (megatron-core 0.16), or the ``submodules=`` argument of a
    ``functools.partial`` builder (0.17+ builds the MoE layer and its experts so); None when it
    has none."""
    if isinstance(spec, functools.partial):
        return spec.keywords.get("submodules")
    return getattr(spec, "submodules", None)


def build_submodule(spec: Any, config: Any, layer_number: int) -> Any:
    """One layer's submodule (its MLP or MoE layer) built from its spec entry as megatron-core's
    ``TransformerLayer`` builds it: a ``functools.partial`` builder called with ``config``, then
    told its layer number (0.17+), or ``build_module(spec, config=..., layer_number=...)``
    (0.16)."""
    if isinstance(spec, functools.partial):
        module = spec(config=config)
        if hasattr(module, "set_layer_number"):
            module.set_layer_number(layer_number)
        return module
    from megatron.core.transformer.spec_utils import build_module  # lazy: megatron-core

    return build_module(spec, config=config, layer_number=layer_number)


@dataclass(frozen=True)
class MoEMetric:
    """One auxiliary loss the routers recorded: per-layer ``values`` (a ``[num_layers]`` tensor),
    the ``reduce_group`` whose ranks split a micro batch's tokens (summed over, or None), and
    whether the values still need averaging over the data-parallel replicas."""

    values: Any
    reduce_group: Optional[Any]
    needs_dp_avg: bool


def _moe_metrics_tracker() -> Optional[Any]:
    """megatron-core's MoE metrics tracker (0.17+), or None where it keeps the dict tracker of
    0.16."""
    try:
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker  # lazy: megatron-core
    except ImportError:  # megatron-core 0.16
        return None
    return get_moe_metrics_tracker()


def moe_metric_entries() -> Dict[str, MoEMetric]:
    """The routers' recorded auxiliary losses by name (``load_balancing_loss``, ``z_loss``, ...),
    from megatron-core's MoE metrics tracker (0.17+) or its dict tracker (0.16)."""
    tracker = _moe_metrics_tracker()
    if tracker is None:
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker  # lazy: megatron-core

        return {name: MoEMetric(entry.get("values"), entry.get("reduce_group"),
                                not entry.get("reduce_group_has_dp", False))
                for name, entry in get_moe_layer_wise_logging_tracker().items()}
    return {name: MoEMetric(entry.values, entry.reduce_group, entry.needs_dp_avg)
            for name, entry in tracker.metrics.items()}


def clear_moe_metrics() -> None:
    """Zero what the routers recorded (the start of the next log interval)."""
    tracker = _moe_metrics_tracker()
    if tracker is None:
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker  # lazy: megatron-core

        clear_aux_losses_tracker()
    else:
        tracker.clear()


def legacy_grouped_gemm_available() -> bool:
    """Whether the installed megatron-core still has its legacy ``GroupedMLP``, the grouped-GEMM
    experts it builds without Transformer Engine (0.16; removed in 0.17)."""
    from megatron.core.transformer.moe import experts  # lazy: megatron-core

    return hasattr(experts, "GroupedMLP")


def refresh_yarn_attention_factor(module: Any) -> bool:
    """Recompute the YaRN attention factor a megatron-core attention module cached at
    construction (0.19: ``_yarn_concentration_factor``, from its ``config``'s ``yarn_*`` fields;
    1.0 without them), after those fields changed in place. Returns whether ``module`` caches
    one (False on 0.16, whose attention reads the config at every forward)."""
    if not hasattr(module, "_yarn_concentration_factor"):
        return False
    from megatron.core.models.common.embeddings import yarn_rotary_pos_embedding  # lazy: megatron-core

    module._yarn_concentration_factor = (
        yarn_rotary_pos_embedding._yarn_get_concentration_factor_from_config(module.config))
    return True


@functools.lru_cache(maxsize=1)
def window_query_returns_document_lengths() -> bool:
    """Whether megatron-core's ``GPTDataset._query_document_sample_shuffle_indices`` returns a
    third value, each document part's token count (0.19; its ``__getitem__`` unpacks three),
    read from the method's return annotation (``Tuple[ndarray, ndarray, list]`` against
    0.16's ``Tuple[ndarray, ndarray]``)."""
    import typing  # lazy: only the dataset classes ask

    from megatron.core.datasets.gpt_dataset import GPTDataset  # lazy: megatron-core

    hints = typing.get_type_hints(GPTDataset._query_document_sample_shuffle_indices)
    return len(typing.get_args(hints["return"])) == 3
