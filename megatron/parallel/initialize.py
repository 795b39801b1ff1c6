"""Process setup: torch.distributed through DeepSpeed, megatron-core model parallel state, seeds."""
import os
import random
import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import List, Optional

import numpy as np
import torch

from megatron.errors import ConfigError
from megatron.parallel.cpu_rng import model_parallel_manual_seed
from megatron.parallel.cuda_connections import apply_max_connections
from megatron.parallel.topology import ParallelLayout, initialize_model_parallel
from megatron.runtime import cpu_comm, lost_peers
from megatron.runtime.jit_ops import build_done
from megatron.runtime.ports import busy_port_message

DEFAULT_TIMEOUT_MINUTES = 10.0  # --distributed-timeout-minutes' default (Megatron-LM's)


@dataclass(frozen=True)
class DistributedConfig:
    """How the processes connect: ``--distributed-backend`` (None: :func:`default_backend`) and
    ``--distributed-timeout-minutes`` (``RunConfig.distributed``)."""

    distributed_backend: Optional[str]
    distributed_timeout_minutes: float


def default_backend() -> str:
    """nccl when CUDA is usable, else gloo (DeepSpeed's CPU accelerator would pick oneCCL)."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def initialize_distributed(layout: ParallelLayout, distributed_backend: Optional[str],
                           timeout_minutes: float = DEFAULT_TIMEOUT_MINUTES) -> List[str]:
    """Start torch.distributed (DeepSpeed's launcher sets RANK/WORLD_SIZE/MASTER_*; a plain
    ``python`` run becomes a 1-rank group) and megatron-core's tensor/pipeline/data-parallel
    groups of ``layout`` (megatron/parallel/topology.py), with ``distributed_backend``
    (``--distributed-backend``; None: :func:`default_backend`). Every process group gets
    ``timeout_minutes`` (``--distributed-timeout-minutes``): the world group and the rendezvous
    (``deepspeed.init_distributed``), megatron-core's groups (``initialize_model_parallel``) and
    the groups DeepSpeed makes later (torch's default for a ``new_group`` without a timeout, set
    here). Every rank then records the host of every rank, so a collective whose peer dies or
    hangs ends in one line naming it (megatron/runtime/lost_peers.py). Returns the start-up notes
    it has (on a GPU: how ``CUDA_DEVICE_MAX_CONNECTIONS`` was set)."""
    import deepspeed  # noqa: F401  (unused, kept: deepspeed is loaded before start-up, as it always was)

    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    notes = []
    if torch.cuda.is_available():
        notes += _apply_cuda_max_connections(layout.tp)  # before this process touches the GPU
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    timeout = timedelta(minutes=timeout_minutes)
    # DeepSpeed's groups (its pipe grid, ZeRO's, the sequence-data-parallel ones) are made with
    # torch's new_group and no timeout, which takes this module global (30 min by default)
    torch.distributed.distributed_c10d.default_pg_timeout = timeout
    if not torch.distributed.is_initialized():
        _init_deepspeed_distributed(distributed_backend, timeout, timeout_minutes)
    initialize_model_parallel(layout, timeout_minutes)
    hosts = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(hosts, socket.gethostname())
    lost_peers.record_world(hosts, timeout_minutes)
    if len(set(hosts)) > 1:
        notes.append(nodes_line(hosts, timeout_minutes))
    return notes


def nodes_line(hosts: List[str], timeout_minutes: float) -> str:
    """The start-up line of a run on several hosts: ``2 nodes: node0 (ranks 0-1), node1 (ranks
    2-3); collective timeout 10 min (--distributed-timeout-minutes 10)``."""
    by_host = {}
    for rank, host in enumerate(hosts):
        by_host.setdefault(host, []).append(rank)
    listed = ", ".join(f"{host} (ranks {lost_peers.rank_ranges(ranks)})"
                       for host, ranks in by_host.items())
    return (f"{len(by_host)} nodes: {listed}; collective timeout "
            f"{lost_peers.describe_timeout(timeout_minutes)}")


def _apply_cuda_max_connections(tensor_model_parallel_size: int) -> List[str]:
    """``CUDA_DEVICE_MAX_CONNECTIONS`` as Megatron-LM requires it (megatron/parallel/cuda_connections.py);
    the note saying so, if any."""
    note = apply_max_connections(
        tensor_model_parallel_size, "cuda", os.environ,
        lambda: torch.cuda.get_device_capability(int(os.environ["LOCAL_RANK"])))
    return [note] if note else []


def _init_deepspeed_distributed(distributed_backend: Optional[str], timeout: timedelta,
                                timeout_minutes: float) -> None:
    """``deepspeed.init_distributed`` with ``timeout`` (the rendezvous waits that long too), a
    notice before DeepSpeed's one-time CPU op build, a one-line error for a busy MASTER_PORT, for
    ranks that never arrive and for a master that cannot be reached, and no shared-memory buffers
    left behind (see megatron/runtime/cpu_comm.py)."""
    import deepspeed
    from deepspeed.accelerator import get_accelerator

    on_cpu = get_accelerator().device_name() == "cpu"
    local_rank = int(os.environ["LOCAL_RANK"])
    claim = cpu_comm.announce_shm_op_build() if on_cpu else None
    try:
        deepspeed.init_distributed(dist_backend=distributed_backend or default_backend(),
                                   verbose=False, timeout=timeout)
    except torch.distributed.DistError as e:
        if isinstance(e, torch.distributed.DistNetworkError) and "EADDRINUSE" in str(e):
            # one line, exit status 1: launchers retry on it once (megatron/runtime/ports.py)
            raise ConfigError(busy_port_message(os.environ["MASTER_ADDR"],
                                                os.environ["MASTER_PORT"])) from None
        problem = rendezvous_problem(str(e), timeout_minutes)
        if problem is None:
            raise
        raise ConfigError(problem) from None
    finally:
        build_done(claim)
    if on_cpu:
        torch.distributed.barrier()  # every rank has mapped every rank's all-reduce buffer
        cpu_comm.unlink_own_shm_buffer(torch.distributed.get_rank())
        if local_rank == 0:
            cpu_comm.remove_stale_shm_buffers()


def rendezvous_problem(error: str, timeout_minutes: float) -> Optional[str]:
    """The one line for a rendezvous that failed with ``error`` (torch's store error): ranks that
    never arrived, or a master this rank cannot reach; None for anything else."""
    import re

    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    world, rank = os.environ.get("WORLD_SIZE"), os.environ.get("RANK")
    waited = lost_peers.describe_timeout(timeout_minutes)
    joined = re.search(r"(\d+)/(\d+) clients joined", error)
    if joined or "wait timeout" in error:  # the master's count, or a rank waiting on the others
        count = (f"only {joined.group(1)} of the {world} ranks" if joined
                 else f"not all of the {world} ranks")
        return (f"{count} (WORLD_SIZE {world}: every node's launcher with its --node_rank) "
                f"reached the master at {addr}:{port} within {waited}: a node did not start, or "
                f"reaches the master on another address or interface (--master_addr, the "
                f"hostfile, GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME)")
    if "timed out" in error.lower() or "connect" in error.lower():
        return (f"rank {rank} cannot reach the master at {addr}:{port} (--master_addr / "
                f"MASTER_ADDR, --master_port) within {waited}: no process listens there or the "
                f"address is not reachable from this host ({socket.gethostname()}); check "
                f"--master_addr, the hostfile and GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME")
    return None


def stage_seed(seed: int, pipeline_rank: int) -> int:
    """The seed of pipeline stage ``pipeline_rank`` for ``--seed seed``: ``seed + 100 *
    pipeline_rank``, as Megatron-LM's ``_set_random_seed`` gives each stage its own dropout."""
    return seed + 100 * pipeline_rank


def set_seeds(seed: int) -> None:
    """Megatron-LM's seeding (``initialize.py`` ``_set_random_seed``): Python, NumPy and torch get
    :func:`stage_seed` (``--seed`` + 100 x this rank's pipeline stage, the same on the tensor- and
    data-parallel ranks of a stage), and megatron-core's RNG tracker is seeded from it
    (``model_parallel_cuda_manual_seed``: data-parallel stream that seed, model-parallel stream
    seed + 2718 + tensor-parallel rank; CPU generator states without CUDA,
    megatron/parallel/cpu_rng.py). Initial weights do not come from these generators
    (megatron/model/init.py draws them from --seed and each parameter's name), so they stay the
    same for every layout."""
    from megatron.core import parallel_state

    pipeline_rank = (parallel_state.get_pipeline_model_parallel_rank()
                     if parallel_state.model_parallel_is_initialized() else 0)
    seed = stage_seed(seed, pipeline_rank)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    model_parallel_manual_seed(seed)
