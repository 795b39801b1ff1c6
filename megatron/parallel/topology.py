"""The parallel layout (tensor x pipeline x DeepSpeed-Ulysses sequence x data parallel) and its one
owner of process groups.

megatron-core's ``parallel_state`` creates every process group; DeepSpeed sees them through
:class:`MegatronCoreMPU` (the ``mpu`` object Megatron-DeepSpeed passes to ``deepspeed.initialize``)
and, for its pipeline engine, through :func:`deepspeed_topology`, whose rank -> (pipe, data, model)
coordinates are the same as ``parallel_state``'s (checked by :func:`check_topology_matches`).
Rank order is megatron-core's default ``tp-cp-ep-dp-pp``: tensor-parallel ranks are adjacent,
pipeline stages are farthest apart, which is DeepSpeed's ``['pipe', 'data', 'model']`` axis order.

DeepSpeed-Ulysses sequence parallelism (``--ds-sequence-parallel-size``, megatron/parallel/ulysses.py)
runs on megatron-core's context-parallel dimension: its groups are the ranks that hold slices of
one sequence (``cp`` in the rank order, between tensor and data parallel), so the
sequence-parallel group is ``parallel_state``'s context-parallel group and the
sequence-data-parallel group (over which DeepSpeed reduces gradients and partitions ZeRO states)
is its data-parallel group with context parallelism. The model itself is built with
``context_parallel_size`` 1 in its ``TransformerConfig``: megatron-core's ring attention never
runs, the Ulysses all-to-all does.
"""
from dataclasses import dataclass

import torch

from megatron.parallel.cpu_buffers import allocate_megatron_core_buffers_on_cpu


@dataclass(frozen=True)
class ParallelLayout:
    """How ``world`` ranks are split: ``tp`` x ``pp`` x ``sp`` x ``dp`` = ``world`` (``sp``: the
    DeepSpeed-Ulysses sequence-parallel size, ``--ds-sequence-parallel-size``)."""

    tp: int
    pp: int
    dp: int
    world: int
    sp: int = 1
    ep: int = 1

    def describe(self) -> str:
        """``tensor-parallel T, pipeline-parallel P[, Ulysses sequence-parallel S], data-parallel
        D[, expert-parallel E]`` (the start-up line's part; the Ulysses and expert-parallel sizes
        only when above 1; the expert-parallel ranks are data-parallel ranks of the dense layers)."""
        ulysses = f", Ulysses sequence-parallel {self.sp}" if self.sp > 1 else ""
        experts = f", expert-parallel {self.ep}" if self.ep > 1 else ""
        return (f"tensor-parallel {self.tp}, pipeline-parallel {self.pp}{ulysses}, "
                f"data-parallel {self.dp}{experts}")

    @property
    def zero_partitions(self) -> int:
        """Ranks one model replica's ZeRO states are partitioned over (and its gradients reduced
        over): data x Ulysses sequence parallel."""
        return self.dp * self.sp

    def as_dict(self) -> dict:
        """The layout as stored in checkpoints."""
        return {"tensor_model_parallel_size": self.tp, "pipeline_model_parallel_size": self.pp,
                "sequence_parallel_size": self.sp, "data_parallel_size": self.dp,
                "expert_model_parallel_size": self.ep, "world_size": self.world}


def initialize_model_parallel(layout: ParallelLayout, timeout_minutes: float = 10.0) -> None:
    """Create megatron-core's tensor/pipeline/(context = Ulysses sequence)/data-parallel groups
    of ``layout`` (the run's validated layout; once; ``torch.distributed`` must be initialised),
    each with the collective timeout ``timeout_minutes`` (``--distributed-timeout-minutes``;
    megatron-core's own default would be 30), and check that DeepSpeed's topology puts every
    rank at the same coordinates."""
    from megatron.core import parallel_state

    allocate_megatron_core_buffers_on_cpu()
    if torch.distributed.get_world_size() != layout.world:
        raise RuntimeError(f"validated for {layout.world} ranks but torch.distributed has "
                           f"{torch.distributed.get_world_size()}")
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp, pipeline_model_parallel_size=layout.pp,
            context_parallel_size=layout.sp, expert_model_parallel_size=layout.ep,
            distributed_timeout_minutes=timeout_minutes)
    check_topology_matches(layout)


def current_layout() -> ParallelLayout:
    """This run's layout from megatron-core's parallel state (initialised)."""
    from megatron.core import parallel_state

    return ParallelLayout(tp=parallel_state.get_tensor_model_parallel_world_size(),
                          pp=parallel_state.get_pipeline_model_parallel_world_size(),
                          dp=parallel_state.get_data_parallel_world_size(),
                          world=torch.distributed.get_world_size(),
                          sp=parallel_state.get_context_parallel_world_size(),
                          ep=parallel_state.get_expert_model_parallel_world_size())


def deepspeed_topology(layout: ParallelLayout):
    """DeepSpeed's ``PipeModelDataParallelTopology`` for ``layout`` (what ``PipelineModule`` takes
    as ``topology=``); with Ulysses sequence parallelism (no pipe then) a ``ProcessTopology`` with
    a ``sequence`` axis between ``data`` and ``model``, megatron-core's rank order."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology, ProcessTopology

    if layout.sp > 1:
        return ProcessTopology(axes=["pipe", "data", "sequence", "model"],
                               dims=[layout.pp, layout.dp, layout.sp, layout.tp])
    return PipeModelDataParallelTopology(num_pp=layout.pp, num_mp=layout.tp, num_dp=layout.dp)


def check_topology_matches(layout: ParallelLayout) -> None:
    """Raise unless, for every rank, DeepSpeed's topology coordinates (pipe, data, model) equal
    megatron-core's (pipeline, data, tensor) ranks. Checks the groups this rank belongs to, which
    over all ranks covers every rank."""
    from megatron.core import parallel_state

    topo = deepspeed_topology(layout)
    me = torch.distributed.get_rank()
    coord = topo.get_coord(me)
    ours = (parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_data_parallel_rank(),
            parallel_state.get_context_parallel_rank(),
            parallel_state.get_tensor_model_parallel_rank())
    theirs = (coord.pipe, coord.data, getattr(coord, "sequence", 0), coord.model)
    if theirs != ours:
        raise RuntimeError(f"rank {me}: DeepSpeed topology (pipe, data, sequence, model) = "
                           f"{theirs} but megatron-core parallel_state (pipeline, data, context, "
                           f"tensor) = {ours}")
    groups = {
        "model": parallel_state.get_tensor_model_parallel_group(),
        "data": parallel_state.get_data_parallel_group(),
        "pipe": parallel_state.get_pipeline_model_parallel_group(),
    }
    if layout.sp > 1:
        groups["sequence"] = parallel_state.get_context_parallel_group()
    for axis, group in groups.items():
        ours = sorted(torch.distributed.get_process_group_ranks(group))
        theirs = sorted(topo.get_axis_comm_lists(axis)[_index_of(topo.get_axis_comm_lists(axis), me)])
        if ours != theirs:
            raise RuntimeError(f"rank {me}: megatron-core's {axis}-parallel group {ours} differs "
                               f"from DeepSpeed's {theirs}")


def _index_of(lists, rank: int) -> int:
    for i, ranks in enumerate(lists):
        if rank in ranks:
            return i
    raise RuntimeError(f"rank {rank} is in none of {lists}")


class MegatronCoreMPU:
    """The model-parallel unit DeepSpeed is given (``deepspeed.initialize(mpu=...)``), answering
    from megatron-core's ``parallel_state``. "Model parallel" is Megatron's meaning, tensor x
    pipeline: DeepSpeed sums gradient norms and overflow flags over it and names checkpoint files
    ``mp_rank_XX`` by its rank. Tensor-parallel duplicates are skipped in norms through the
    ``tensor_model_parallel`` attribute megatron-core sets on sharded parameters.

    No ``get_sequence_parallel_*`` methods: those would tell DeepSpeed about Ulysses sequence
    parallelism, which is not Megatron's ``--sequence-parallel`` (that one lives in the TP group).
    """

    @staticmethod
    def _ps():
        from megatron.core import parallel_state

        return parallel_state

    # tensor x pipeline
    def get_model_parallel_group(self):
        return self._ps().get_model_parallel_group()

    def get_model_parallel_world_size(self) -> int:
        return torch.distributed.get_world_size(self.get_model_parallel_group())

    def get_model_parallel_rank(self) -> int:
        return torch.distributed.get_rank(self.get_model_parallel_group())

    def get_model_parallel_src_rank(self) -> int:
        return self._ps().get_model_parallel_src_rank()

    # data
    def get_data_parallel_group(self):
        return self._ps().get_data_parallel_group()

    def get_data_parallel_world_size(self) -> int:
        return self._ps().get_data_parallel_world_size()

    def get_data_parallel_rank(self) -> int:
        return self._ps().get_data_parallel_rank()

    def get_data_parallel_group_ranks(self):
        return torch.distributed.get_process_group_ranks(self.get_data_parallel_group())

    # DeepSpeed-Ulysses sequence (megatron-core's context-parallel dimension)
    def get_sequence_parallel_group(self):
        return self._ps().get_context_parallel_group()

    def get_sequence_parallel_world_size(self) -> int:
        return self._ps().get_context_parallel_world_size()

    def get_sequence_parallel_rank(self) -> int:
        return self._ps().get_context_parallel_rank()

    # data x sequence: where DeepSpeed reduces gradients and partitions ZeRO states
    def get_sequence_data_parallel_group(self):
        if self.get_sequence_parallel_world_size() == 1:
            return self.get_data_parallel_group()
        return self._ps().get_data_parallel_group(with_context_parallel=True)

    def get_sequence_data_parallel_world_size(self) -> int:
        return torch.distributed.get_world_size(self.get_sequence_data_parallel_group())

    def get_sequence_data_parallel_rank(self) -> int:
        return torch.distributed.get_rank(self.get_sequence_data_parallel_group())

    # tensor
    def get_tensor_model_parallel_group(self):
        return self._ps().get_tensor_model_parallel_group()

    def get_tensor_model_parallel_world_size(self) -> int:
        return self._ps().get_tensor_model_parallel_world_size()

    def get_tensor_model_parallel_rank(self) -> int:
        return self._ps().get_tensor_model_parallel_rank()

    def get_tensor_model_parallel_src_rank(self) -> int:
        return self._ps().get_tensor_model_parallel_src_rank()

    # DeepSpeed's older names for the tensor-parallel ("slice") group
    get_slice_parallel_group = get_tensor_model_parallel_group
    get_slice_parallel_world_size = get_tensor_model_parallel_world_size
    get_slice_parallel_rank = get_tensor_model_parallel_rank

    # pipeline
    def get_pipeline_model_parallel_group(self):
        return self._ps().get_pipeline_model_parallel_group()

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self._ps().get_pipeline_model_parallel_world_size()

    def get_pipeline_model_parallel_rank(self) -> int:
        return self._ps().get_pipeline_model_parallel_rank()

    # DeepSpeed's names for the pipeline group
    get_pipe_parallel_group = get_pipeline_model_parallel_group
    get_pipe_parallel_world_size = get_pipeline_model_parallel_world_size
    get_pipe_parallel_rank = get_pipeline_model_parallel_rank


def layout_line(layout: ParallelLayout, zero_stage: int, micro_batches: int,
                transformer) -> str:
    """The start-up line naming ``layout``, e.g. ``tensor-parallel 2, pipeline-parallel 2,
    data-parallel 1, ZeRO stage 1, micro-batches per iteration 4`` (``zero_stage``: the engine's;
    ``micro_batches``: micro-batches per rank per optimizer step at the full global batch), then
    sequence parallelism and recompute when on (from ``transformer``, the run's
    ``TransformerConfig``)."""
    line = (f"{layout.describe()}, ZeRO stage {zero_stage}, micro-batches per iteration "
            f"{micro_batches}")
    if transformer.sequence_parallel:
        line += ", sequence-parallel"
    if transformer.recompute_granularity == "selective":
        line += ", recompute selective (core attention)"
    elif transformer.recompute_granularity == "full":
        n = transformer.recompute_num_layers
        line += (f", recompute full ({transformer.recompute_method}, {n} "
                 f"layer{'s' if n != 1 else ''}"
                 f"{', saved inputs split over tensor-parallel ranks' if transformer.distribute_saved_activations else ''})")
    return line
