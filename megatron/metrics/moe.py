"""The MoE side of training: the load-balancing loss's backward scale on DeepSpeed's engine, and
the MoE scalars logged beside ``lm_loss``.

**Backward scale.** megatron-core adds each router's auxiliary losses to the backward pass
through ``MoEAuxLossAutoScaler``. Their gradient is ``coefficient x scale``, and the scale must
equal what the LM loss is multiplied by before its backward. Megatron-LM sets
``loss_scale / num_microbatches``. DeepSpeed's engine divides the loss by the gradient
accumulation steps and multiplies it by the fp16 loss scale (1 under bf16/fp32), so
:meth:`MoETraining.begin_iteration` sets ``cur_scale / GAS`` before every iteration: the
batch-size rampup changes GAS, and dynamic loss scaling changes the scale.

**Logged scalars.** These are kept out of ``lm_loss`` and the per-dataset losses:
- ``load_balancing_loss`` (and ``seq_load_balancing_loss`` / ``z_loss`` when on): megatron-core's
  tracker values. Each is the unweighted loss (the coefficient divided out), averaged over MoE
  layers and over the micro-batches of the interval, summed over the ranks that split a
  micro-batch's tokens, and averaged over data-parallel replicas, as Megatron-LM logs it.
- ``tokens_per_expert_min`` / ``_max``: over the experts of every MoE layer, the tokens one expert
  received per iteration (summed over the global batch, averaged over the interval's iterations).

Both are read once per log interval: the counts stay on the device in between.
"""
from typing import Callable, Dict, List, Optional, Tuple

import torch

from megatron.model.model_config import MoELayout
from megatron.model.moe import moe_layer_pattern, moe_routers
from megatron.runtime.mcore_compat import MoEMetric, clear_moe_metrics, moe_metric_entries
from megatron.utils.rank_utils import all_reduce_small


class MoETraining:
    """MoE bookkeeping of one run's model (this rank's pipeline stage): see module doc. One of the
    loop's hooks (megatron/train/hooks.py ``LoopHook``)."""

    def __init__(self, model: torch.nn.Module, moe: MoELayout):
        self.routers = moe_routers(model)
        pattern = moe_layer_pattern(moe.moe_layer_freq, moe.num_layers)
        self.num_layers = moe.num_layers
        self.moe_layers = [i for i, moe in enumerate(pattern) if moe]  # 0-based layer numbers
        self.num_moe_layers = len(self.moe_layers)
        self.num_experts = moe.num_experts
        self.loss_names = tracked_loss_names(moe)
        self.per_layer = moe.moe_per_layer_logging
        self._scale = torch.ones(())  # CPU scalar: multiplies device tensors without a copy

    def wrap_forward_step(self, forward_step: Callable) -> Callable:
        """``forward_step`` as it is (the routers record what is logged)."""
        return forward_step

    def begin_iteration(self, engine) -> None:
        """Scale of the auxiliary losses' gradients for the coming iteration: the fp16 loss
        scale (1 without one) over the gradient accumulation steps (module doc)."""
        from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

        loss_scale = float(getattr(engine.optimizer, "cur_scale", 1.0) or 1.0)
        self._scale.fill_(loss_scale / engine.gradient_accumulation_steps())
        MoEAuxLossAutoScaler.set_loss_scale(self._scale)

    def end_iteration(self, iteration: int) -> None:
        """Nothing: the routers' counts stay on the device until the log line."""

    def save_state(self, state) -> None:
        """Nothing: MoE bookkeeping starts afresh each interval (no checkpointed state)."""

    def restore_state(self, state) -> None:
        """Nothing (see :meth:`save_state`)."""

    def log_fields(self, iterations: int) -> Tuple[str, Dict[str, float]]:
        """The log line's MoE segment (the per-layer values only in the record) and the
        training record's MoE scalars of the interval (:meth:`interval_record`)."""
        record = self.interval_record(iterations)
        line = " | ".join(f"{k.replace('_', ' ')}: {v:.4g}" for k, v in record.items()
                          if "_layer_" not in k)
        return line, record

    def interval_record(self, iterations: int) -> Dict[str, float]:
        """The MoE scalars of the log interval of ``iterations`` iterations (module doc), the
        same on every rank; resets both trackers. All ranks must call it."""
        from megatron.core import parallel_state  # lazy: megatron-core, once a model is built

        record: Dict[str, float] = {}
        dp_group = parallel_state.get_data_parallel_group()
        dp_size = parallel_state.get_data_parallel_world_size()
        pp_group = parallel_state.get_pipeline_model_parallel_group()
        tokens, forwards = self._routed(dp_group, pp_group)
        micro_batches = forwards.clamp(min=1)  # per layer: each stage counts its own
        recorded = moe_metric_entries()  # megatron-core's tracker, either release's
        for name in self.loss_names:  # the same on every stage: the PP reduction is collective
            entry = recorded.get(name, MoEMetric(None, None, needs_dp_avg=True))
            values = (torch.zeros(self.num_layers, dtype=torch.float64) if entry.values is None
                      else entry.values.detach().double().cpu())
            values = all_reduce_small(values, group=pp_group)  # each stage holds its layers
            if entry.reduce_group is not None:  # ranks splitting the tokens (within a stage)
                values = all_reduce_small(values, group=entry.reduce_group)
            if entry.needs_dp_avg:
                values = all_reduce_small(values, group=dp_group) / dp_size
            values = values / micro_batches
            record[name] = values.sum().item() / self.num_moe_layers
            if self.per_layer:
                for layer in self.moe_layers:
                    record[f"{name}_layer_{layer}"] = values[layer].item()
        clear_moe_metrics()
        per_iteration = tokens / max(iterations, 1)
        record["tokens_per_expert_min"] = per_iteration.min().item()
        record["tokens_per_expert_max"] = per_iteration.max().item()
        return record

    def _routed(self, dp_group, pp_group) -> Tuple[torch.Tensor, torch.Tensor]:
        """(``[MoE layers, experts]`` tokens routed in the interval over the global batch,
        ``[layers]`` training micro-batches each layer's router ran on one rank), every stage's
        layers."""
        from megatron.core import parallel_state

        table = torch.zeros(self.num_layers, self.num_experts, dtype=torch.float64)
        forwards = torch.zeros(self.num_layers, dtype=torch.float64)
        sequence_parallel = False
        for router in self.routers:
            counts, runs = router.take_tokens_per_expert()
            sequence_parallel = router.config.sequence_parallel
            forwards[router.layer_number - 1] += runs
            if counts is not None:
                table[router.layer_number - 1] += counts.cpu()
        if sequence_parallel:  # each tensor-parallel rank routed its own tokens
            table = all_reduce_small(table, group=parallel_state.get_tensor_model_parallel_group())
        table = all_reduce_small(table, group=dp_group)
        both = all_reduce_small(torch.cat([table.view(-1), forwards]), group=pp_group)
        table, forwards = both[:-self.num_layers].view_as(table), both[-self.num_layers:]
        return table[self.moe_layers], forwards


def tracked_loss_names(moe: MoELayout) -> List[str]:
    """The names megatron-core's router logs its auxiliary losses under for the MoE layout
    ``moe`` (its load-balancing type and the aux-loss and z-loss coefficients)."""
    names = []
    kind = moe.moe_router_load_balancing_type
    if moe.moe_aux_loss_coeff:
        names += {"aux_loss": ["load_balancing_loss"], "seq_aux_loss": ["seq_load_balancing_loss"],
                  "global_aux_loss": ["global_load_balancing_loss"]}.get(kind, [])
    if moe.moe_z_loss_coeff:
        names.append("z_loss")
    return names


def moe_training(model: torch.nn.Module, moe: Optional[MoELayout]) -> Optional[MoETraining]:
    """:class:`MoETraining` for a model with experts (``moe``: the run's MoE layout,
    ``args.run_config.model.moe``), else None (a dense model, ``moe`` None)."""
    if moe is None:
        return None
    return MoETraining(model, moe)
