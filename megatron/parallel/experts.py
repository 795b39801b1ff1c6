"""Expert parallelism (``--expert-model-parallel-size``) on DeepSpeed's engine, with
megatron-core's expert groups.

megatron-core's ``parallel_state`` creates the groups. The expert-parallel group is the ranks
that split one MoE layer's experts. The expert-data-parallel group is the ranks that hold the same
experts; it has world / (TP x EP x PP) ranks. megatron-core marks each expert parameter of an
expert-parallel layer ``allreduce = False``, which is the attribute DeepSpeed's ``is_moe_param``
reads. DeepSpeed then needs three things to reduce those parameters over their
expert-data-parallel group only, in ZeRO stages 1/2 as at stage 0:

- ``param.group_name``, the key of the parameter's groups in DeepSpeed's group registry
  (``ep_size_{EP}``, DeepSpeed's own naming): :func:`mark_expert_parameters`;
- megatron-core's expert groups registered under that key (``deepspeed.utils.groups``): done by
  :meth:`DeepSpeedExpertGroups.set_deepspeed_parallelism`, which the engine calls on every module
  that has it, as for its own MoE layer;
- the engine's ``has_moe_layers``, which it sets when the model holds a
  ``deepspeed.moe.layer.MoE``. :class:`DeepSpeedExpertGroups` is such a module. It has no
  parameters and does not run; it only states the experts' count, their group name, and where
  their groups come from. The experts themselves stay megatron-core's.

The optimizer's parameter groups are then split by DeepSpeed's
``split_params_into_different_moe_groups_for_optimizer`` (megatron/optim/optimizer.py), so the expert
parameters of each group sit in a group marked ``moe`` that ZeRO partitions over the
expert-data-parallel group. The dense parameters are reduced over the data-parallel group as
before. Gradient norms add each expert shard once: DeepSpeed sums the expert groups' squared
norms over the ranks holding distinct experts.

Under the pipe engine every stage must then hold an MoE layer (:func:`check_stages_hold_experts`):
ZeRO computes one gradient norm per parameter group with a collective over the model-parallel
group, which spans the stages, so a stage without experts (no ``moe`` group) would skip the
collectives of the others and every rank would wait forever.
"""
import torch
from deepspeed.moe.layer import MoE

from megatron.errors import ConfigError


def expert_group_name(expert_parallel_size: int) -> str:
    """DeepSpeed's registry key of the expert groups of size ``expert_parallel_size``."""
    return f"ep_size_{expert_parallel_size}"


def register_expert_groups(name: str) -> None:
    """Put megatron-core's expert-parallel and expert-data-parallel groups (this rank's) into
    DeepSpeed's group registry under ``name`` (what the engine, ZeRO and the gradient norm read)."""
    from deepspeed.utils import groups
    from megatron.core import parallel_state

    ep = parallel_state.get_expert_model_parallel_group()
    edp = parallel_state.get_expert_data_parallel_group()
    groups._EXPERT_PARALLEL_GROUP[name] = ep
    groups._EXPERT_PARALLEL_GROUP_RANKS[name] = torch.distributed.get_process_group_ranks(ep)
    groups._EXPERT_DATA_PARALLEL_GROUP[name] = edp
    groups._EXPERT_DATA_PARALLEL_GROUP_RANKS[name] = torch.distributed.get_process_group_ranks(edp)


class DeepSpeedExpertGroups(MoE):
    """What DeepSpeed's engine needs to know of the model's expert-parallel MoE layers (module
    doc): a parameterless ``deepspeed.moe.layer.MoE`` that registers megatron-core's expert groups
    when the engine asks. It never runs a forward."""

    def __init__(self, num_experts: int, expert_parallel_size: int):
        torch.nn.Module.__init__(self)  # none of DeepSpeed's MoE layer is built
        self.num_experts = num_experts
        self.ep_size = expert_parallel_size
        self.num_local_experts = num_experts // expert_parallel_size
        self.expert_group_name = expert_group_name(expert_parallel_size)

    def set_deepspeed_parallelism(self, use_data_before_expert_parallel_: bool = False) -> None:
        """Called by the engine at start-up: register megatron-core's groups (the rank order is
        megatron-core's, whatever ``use_data_before_expert_parallel_`` says)."""
        register_expert_groups(self.expert_group_name)

    def forward(self, *args, **kwargs):
        raise RuntimeError("DeepSpeedExpertGroups only describes the expert groups to DeepSpeed; "
                           "the MoE layers are megatron-core's")


def mark_expert_parameters(model: torch.nn.Module, expert_parallel_size: int) -> int:
    """Give every expert-parallel parameter (``allreduce`` False, megatron-core's mark) DeepSpeed's
    ``group_name`` and attach a :class:`DeepSpeedExpertGroups` to ``model`` (as
    ``deepspeed_expert_groups``). Returns the number of expert parameters; 0 leaves the model
    untouched (expert-parallel size 1: the experts are reduced as dense parameters are)."""
    if expert_parallel_size == 1:
        return 0
    name = expert_group_name(expert_parallel_size)
    count = 0
    for param in model.parameters():
        if getattr(param, "allreduce", True) is False:
            param.group_name = name
            count += 1
    if count:
        from megatron.core.transformer.moe.moe_layer import MoELayer

        experts = {m.config.num_moe_experts for m in model.modules() if isinstance(m, MoELayer)}
        model.deepspeed_expert_groups = DeepSpeedExpertGroups(max(experts), expert_parallel_size)
    return count


def check_stages_hold_experts(model: torch.nn.Module, moe_pattern, expert_parallel_size: int,
                              flags: str) -> None:
    """ConfigError when ``model`` is a pipeline whose stages do not all hold an MoE layer (1s of
    ``moe_pattern``, one per transformer layer) at expert-parallel size > 1 (module doc); ``flags``
    names the MoE layer flag as given. Nothing for one stage or expert-parallel size 1."""
    per_stage = getattr(model, "transformer_layers_per_stage", None)
    if expert_parallel_size == 1 or per_stage is None:
        return
    counts, start, empty = per_stage(), 0, []
    if len(counts) < 2:
        return
    for stage, count in enumerate(counts):  # a stage of no transformer layer has no experts either
        if not any(moe_pattern[start:start + count]):
            layers = f"layers {start + 1}-{start + count}" if count else "no transformer layer"
            empty.append(f"stage {stage} ({layers})")
        start += count
    if empty:
        raise ConfigError(
            f"{flags} with --pipeline-model-parallel-size {len(counts)} and "
            f"--expert-model-parallel-size {expert_parallel_size}: pipeline {', '.join(empty)} "
            "holds no MoE layer, and DeepSpeed's ZeRO computes the experts' gradient norm with "
            "collectives every stage must join; give every stage an MoE layer (--moe-layer-freq, "
            "or the partition: --pp-partition-method), or use --expert-model-parallel-size 1")


def first_local_expert(num_experts) -> int:
    """The global id of this rank's first expert: its expert-parallel rank x experts per rank
    (0 for a dense model, ``num_experts`` None)."""
    if not num_experts:
        return 0
    from megatron.core import parallel_state

    ep_size = parallel_state.get_expert_model_parallel_world_size()
    return parallel_state.get_expert_model_parallel_rank() * (num_experts // ep_size)
