"""megatron-core's MoE layer in the model's layer spec: the model's MoE summary line, a router that
also runs on a CPU and counts the tokens each expert receives, and the per-layer specs of
``--moe-layer-freq``.

megatron-core 0.16's ``TopKRouter.gating`` moves a CPU weight to the GPU. Its gating GEMM also
names a Transformer Engine function that is undefined when TE is absent. :class:`MoERouter`
computes the same product (``input @ weight.T`` in ``--moe-router-dtype``) with torch where the
weight lives on the CPU, and uses megatron-core's gating where it lives on a GPU.

The router also counts, per micro-batch, how many tokens each expert is sent (after token
dropping). The counts stay on the device; the loop reads them once per log interval
(megatron/metrics/moe.py). Like megatron-core's aux-loss tracker, it counts only training
forwards with gradients. That counts a recomputed layer once, and an evaluation not at all.

``--moe-input-jitter-eps`` multiplies the router's input by uniform noise in training only:
megatron-core 0.16 applies it in eval mode too, which made validation losses and evaluation
scores change from one forward to the next.
"""
from typing import List, Optional, Tuple, Union

import torch
from megatron.core.tensor_parallel.layers import RowParallelLinear
from megatron.core.transformer.moe.router import TopKRouter
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.transformer_block import LayerNormImpl, TransformerBlockSubmodules

from megatron.model.model_config import MoELayout
from megatron.runtime.mcore_compat import spec_submodules


def moe_layer_pattern(freq: Union[int, List[int]], num_layers: int) -> List[int]:
    """1 for each MoE layer, 0 for each dense one (megatron-core's reading of ``moe_layer_freq``:
    every ``freq``-th layer from the first, or the given 0/1 list)."""
    if isinstance(freq, int):
        return [1 if i % freq == 0 else 0 for i in range(num_layers)]
    return list(freq)


def describe_moe(moe: MoELayout) -> str:
    """The start-up line of the MoE layout ``moe``, e.g. ``MoE: 8 experts (FFN 512) in 4 of 4 layers,
    top-2 softmax router, aux_loss x 0.01, dropless, allgather dispatcher, expert-parallel 2``."""
    pattern = moe_layer_pattern(moe.moe_layer_freq, moe.num_layers)
    capacity = ("dropless" if moe.moe_expert_capacity_factor is None else
                f"capacity factor {moe.moe_expert_capacity_factor:g} (drop by "
                f"{moe.moe_token_drop_policy})")
    parts = [f"MoE: {moe.num_experts} experts (FFN {moe.moe_ffn_hidden_size}) in "
             f"{sum(pattern)} of {moe.num_layers} layers",
             f"top-{moe.moe_router_topk} {moe.moe_router_score_function} router"
             f"{' (pre-softmax)' if moe.moe_router_pre_softmax else ''}",
             f"{moe.moe_router_load_balancing_type} x {moe.moe_aux_loss_coeff:g}"]
    if moe.moe_z_loss_coeff:
        parts.append(f"z-loss x {moe.moe_z_loss_coeff:g}")
    if moe.moe_shared_expert_intermediate_size:
        parts.append(f"shared expert {moe.moe_shared_expert_intermediate_size}")
    parts += [capacity, f"{moe.moe_token_dispatcher_type} dispatcher",
              f"expert-parallel {moe.expert_model_parallel_size}"]
    return ", ".join(parts)


class MoERouter(TopKRouter):
    """megatron-core's top-k router (same routing, aux and z losses), runnable on a CPU, keeping
    ``tokens_per_expert``: tokens routed to each global expert since the last
    :meth:`take_tokens_per_expert` (float64, on the router's device)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tokens_per_expert: Optional[torch.Tensor] = None
        self.training_forwards = 0  # micro-batches counted (host-side: no device sync)

    def apply_input_jitter(self, input: torch.Tensor) -> torch.Tensor:
        """``input`` times ``--moe-input-jitter-eps`` noise in training, unchanged in eval mode
        (the noise is a training regulariser: a score must not depend on a random draw)."""
        if not self.training:
            return input
        return super().apply_input_jitter(input)

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        """Router logits ``[..., num_experts]`` of ``input`` ``[..., hidden]``."""
        if self.weight.device.type != "cpu":
            return super().gating(input)
        dtype = {"fp32": torch.float32, "fp64": torch.float64}.get(self.config.moe_router_dtype,
                                                                    input.dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        return torch.nn.functional.linear(input.to(dtype), self.weight.to(dtype), bias)

    def routing(self, logits: torch.Tensor, padding_mask: Optional[torch.Tensor] = None):
        probs, routing_map = super().routing(logits, padding_mask=padding_mask)
        if self.training and torch.is_grad_enabled():
            counts = routing_map.sum(dim=0, dtype=torch.float64).detach()
            self.tokens_per_expert = counts if self.tokens_per_expert is None \
                else self.tokens_per_expert + counts
            self.training_forwards += 1
        return probs, routing_map

    def take_tokens_per_expert(self) -> Tuple[Optional[torch.Tensor], int]:
        """(the token counts, the number of training micro-batches) since the last call (None
        and 0 when no training forward ran); both reset."""
        counts, self.tokens_per_expert = self.tokens_per_expert, None
        forwards, self.training_forwards = self.training_forwards, 0
        return counts, forwards


class ExpertRowParallelLinear(RowParallelLinear):
    """megatron-core's ``RowParallelLinear`` for the experts' ``linear_fc2``, whose output may take
    an in-place update. megatron-core 0.16's expert MLP adds its gated bias in place
    (``output += bias * probs``). Without expert-parallel or tensor-parallel communication, the
    output comes straight out of ``reduce_from_tensor_model_parallel_region``, which returns its
    input: autograd forbids that in-place add, so a model with biased experts (the default,
    without ``--disable-bias-linear``) fails at expert-parallel size 1. There, and only with a
    bias, the output is copied first."""

    def forward(self, input_):
        output, output_bias = super().forward(input_)
        if output_bias is not None and not self.explicit_expert_comm:
            output = output.clone()
        return output, output_bias


def use_moe_router(layer_spec: ModuleSpec) -> ModuleSpec:
    """``layer_spec`` with its MoE layer's router replaced by :class:`MoERouter` and the local
    experts' ``RowParallelLinear`` by :class:`ExpertRowParallelLinear` (in place)."""
    moe_layer = spec_submodules(layer_spec.submodules.mlp)  # MoESubmodules (either release's form)
    moe_layer.router = MoERouter
    experts = spec_submodules(moe_layer.experts)
    if getattr(experts, "linear_fc2", None) is RowParallelLinear:
        experts.linear_fc2 = ExpertRowParallelLinear
    return layer_spec


def layer_specs_for_pattern(dense: ModuleSpec, moe: ModuleSpec,
                            pattern: List[int]) -> Union[ModuleSpec, TransformerBlockSubmodules]:
    """The spec ``GPTModel`` takes for layers whose MoE pattern is ``pattern`` (1 MoE, 0 dense):
    the MoE layer's spec when every layer is MoE, else the block of per-layer specs (with the
    final norm megatron-core's block would use)."""
    if all(pattern):
        return moe
    return TransformerBlockSubmodules(layer_specs=[moe if p else dense for p in pattern],
                                      layer_norm=LayerNormImpl)


def moe_routers(model: torch.nn.Module) -> List[MoERouter]:
    """The model's :class:`MoERouter` modules, in layer order (empty for a dense model)."""
    return [m for m in model.modules() if isinstance(m, MoERouter)]
