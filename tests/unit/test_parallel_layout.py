"""Parallel layout flags: data-parallel size, refused layouts, recompute flag translation, and the
agreement of megatron-core's process groups with DeepSpeed's pipeline topology."""
import json

import pytest

from helpers.flags import parse as parse_tiny
from helpers.flags import tiny_run_flags
from megatron.errors import ArgumentError

BASE = tiny_run_flags(num_layers=4)


def parse(extra, world_size=1):
    return parse_tiny(extra, world_size, base=BASE)


@pytest.mark.parametrize("extra, world, tp, pp, dp", [
    ([], 8, 1, 1, 8),
    (["--tensor-model-parallel-size", "2"], 8, 2, 1, 4),
    (["--pipeline-model-parallel-size", "2"], 8, 1, 2, 4),
    (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 8, 2, 2, 2),
    (["--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "2"], 8, 4, 2, 1),
])
def test_data_parallel_size_is_world_over_tp_pp(extra, world, tp, pp, dp):
    args = parse(extra, world)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.data_parallel_size) == (tp, pp, dp)
    assert args.global_batch_size == 2 * dp


def test_partition_method_default_is_bigscience_type_transformer():
    assert parse([]).pp_partition_method == "type:transformer"


REFUSED_IDS = ['world-not-divisible-by-tp-pp',
               'world-not-divisible-by-pp',
               'tp-zero',
               'uniform-layers-not-divisible-by-pp',
               'fewer-layers-than-stages',
               'heads-not-divisible-by-tp',
               'query-groups-not-divisible-by-tp',
               'ffn-not-divisible-by-tp',
               'zero2-with-pp',
               'zero3-with-pp',
               'sp-without-tp',
               'sp-seq-not-divisible-by-tp',
               'no-pipeline-parallel-with-pp',
               'unknown-partition-method',
               'partition-bad-regex',
               'partition-empty-type',
               'full-recompute-without-method',
               'recompute-num-layers-too-many',
               'block-recompute-with-pp',
               'selective-with-method',
               'method-without-granularity',
               'checkpoint-activations-vs-selective',
               'checkpoint-num-layers-zero',
               'distribute-without-tp',
               'distribute-with-sp']


@pytest.mark.parametrize("extra, world, fragments", [
    (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 6,
     ["world size 6", "--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2", "(= 4)"]),
    (["--pipeline-model-parallel-size", "3"], 4, ["world size 4", "--pipeline-model-parallel-size 3"]),
    (["--tensor-model-parallel-size", "0"], 1, ["--tensor-model-parallel-size 0", "positive"]),
    (["--pipeline-model-parallel-size", "3", "--pp-partition-method", "uniform"], 3,
     ["--num-layers 4", "--pipeline-model-parallel-size 3", "uniform"]),
    (["--pipeline-model-parallel-size", "8", "--num-layers", "4"], 8,
     ["--num-layers 4", "--pipeline-model-parallel-size 8"]),
    (["--tensor-model-parallel-size", "8", "--num-attention-heads", "4"], 8,
     ["--num-attention-heads 4", "--tensor-model-parallel-size 8"]),
    (["--tensor-model-parallel-size", "2", "--num-query-groups", "1"], 2,
     ["--num-query-groups 1", "--tensor-model-parallel-size 2"]),
    (["--tensor-model-parallel-size", "2", "--ffn-hidden-size", "33"], 2,
     ["--ffn-hidden-size 33", "--tensor-model-parallel-size 2"]),
    (["--pipeline-model-parallel-size", "2", "--zero-stage", "2"], 2,
     ["--zero-stage 2", "--pipeline-model-parallel-size 2", "stage 0 or 1"]),
    (["--pipeline-model-parallel-size", "2", "--zero-stage", "3"], 2, ["--zero-stage 3"]),
    (["--sequence-parallel"], 2, ["--sequence-parallel", "--tensor-model-parallel-size > 1", "given 1"]),
    (["--sequence-parallel", "--tensor-model-parallel-size", "2", "--seq-length", "33",
      "--max-position-embeddings", "64"], 2, ["--seq-length 33", "--sequence-parallel"]),
    (["--no-pipeline-parallel", "--pipeline-model-parallel-size", "2"], 2,
     ["--no-pipeline-parallel", "--pipeline-model-parallel-size 2"]),
    (["--pp-partition-method", "balanced"], 1, ["--pp-partition-method balanced", "uniform",
                                                 "parameters", "type:REGEX"]),
    (["--pp-partition-method", "type:("], 1, ["--pp-partition-method type:(", "regular expression"]),
    (["--pp-partition-method", "type:"], 1, ["--pp-partition-method type:", "empty"]),
    (["--recompute-granularity", "full"], 1,
     ["--recompute-granularity full", "--recompute-method", "--recompute-num-layers"]),
    (["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers",
      "5"], 1, ["--recompute-num-layers 5", "[1, 4]"]),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers",
      "1", "--pipeline-model-parallel-size", "2"], 2,
     ["--recompute-method block", "--pipeline-model-parallel-size 2"]),
    (["--recompute-granularity", "selective", "--recompute-method", "uniform"], 1,
     ["--recompute-granularity selective", "--recompute-method uniform"]),
    (["--recompute-method", "uniform"], 1, ["--recompute-method", "--recompute-granularity full"]),
    (["--checkpoint-activations", "--recompute-granularity", "selective"], 1,
     ["--checkpoint-activations", "--recompute-granularity selective"]),
    (["--checkpoint-activations", "--checkpoint-num-layers", "0"], 1, ["--checkpoint-num-layers 0"]),
    (["--distribute-saved-activations", "--checkpoint-activations"], 1,
     ["--distribute-saved-activations", "--tensor-model-parallel-size > 1"]),
    (["--distribute-saved-activations", "--checkpoint-activations", "--sequence-parallel",
      "--tensor-model-parallel-size", "2"], 2, ["--distribute-saved-activations", "--sequence-parallel"]),
], ids=REFUSED_IDS)
def test_refused_layouts_name_flags_and_values(extra, world, fragments):
    with pytest.raises(ArgumentError) as err:
        parse(extra, world)
    for fragment in fragments:
        assert fragment in str(err.value), (fragment, str(err.value))


def test_zero_stage_from_deepspeed_json_refused_with_pipeline(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    with pytest.raises(ArgumentError) as err:
        parse(["--pipeline-model-parallel-size", "2", "--deepspeed_config", str(config)], 2)
    assert f"--deepspeed_config {config} zero_optimization.stage 2" in str(err.value)
    assert parse(["--pipeline-model-parallel-size", "2", "--zero-stage", "1"], 2).zero_stage == 1


@pytest.mark.parametrize("extra, expected", [
    ([], (None, None, None)),
    (["--checkpoint-activations"], ("full", "uniform", 1)),
    (["--checkpoint-activations", "--checkpoint-num-layers", "2"], ("full", "uniform", 2)),
    (["--deepspeed-activation-checkpointing"], ("full", "uniform", 1)),
    (["--checkpoint-activations", "--deepspeed-activation-checkpointing"], ("full", "uniform", 1)),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"],
     ("full", "block", 3)),
    (["--recompute-granularity", "selective"], ("selective", None, None)),
])
def test_recompute_flags_become_transformer_config_fields(extra, expected):
    from megatron.config.model_config import transformer_config_from_args

    args = parse(extra)
    config = transformer_config_from_args(args)
    assert (config.recompute_granularity, config.recompute_method,
            config.recompute_num_layers) == expected
    assert config.distribute_saved_activations is False


def test_sequence_parallel_reaches_transformer_config():
    from megatron.config.model_config import transformer_config_from_args

    args = parse(["--tensor-model-parallel-size", "2", "--sequence-parallel"], 2)
    config = transformer_config_from_args(args)
    assert config.sequence_parallel and config.tensor_model_parallel_size == 2


@pytest.mark.parametrize("tp, pp, dp", [(1, 1, 8), (2, 1, 4), (2, 2, 2), (4, 2, 1), (1, 4, 2),
                                        (2, 4, 1)])
def test_deepspeed_topology_matches_megatron_core_rank_generator(tp, pp, dp):
    """For every rank of a world of 8, DeepSpeed's (pipe, data, model) coordinates and group
    members equal megatron-core's rank generator (the one initialize_model_parallel uses, order
    tp-cp-ep-dp-pp)."""
    from megatron.core.parallel_state import RankGenerator

    from megatron.parallel.topology import ParallelLayout, deepspeed_topology

    layout = ParallelLayout(tp=tp, pp=pp, dp=dp, world=tp * pp * dp)
    topo = deepspeed_topology(layout)
    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=pp, cp=1, order="tp-cp-ep-dp-pp")
    for ours, axis in (("tp", "model"), ("dp", "data"), ("pp", "pipe")):
        assert sorted(map(sorted, gen.get_ranks(ours))) == sorted(map(sorted, topo.get_axis_comm_lists(axis)))
    for rank in range(layout.world):
        coord = topo.get_coord(rank)
        tp_group = next(g for g in gen.get_ranks("tp") if rank in g)
        dp_group = next(g for g in gen.get_ranks("dp") if rank in g)
        pp_group = next(g for g in gen.get_ranks("pp") if rank in g)
        assert (coord.model, coord.data, coord.pipe) == (
            tp_group.index(rank), dp_group.index(rank), pp_group.index(rank))


@pytest.mark.parametrize("tp, sp, dp", [(1, 2, 4), (2, 2, 2), (2, 4, 1), (4, 2, 1)])
def test_ulysses_topology_matches_megatron_core_context_parallel_ranks(tp, sp, dp):
    """With DeepSpeed-Ulysses, the sequence axis of the topology is megatron-core's
    context-parallel dimension (between tensor and data parallel in tp-cp-ep-dp-pp): the same
    groups and coordinates for every rank of a world of 8."""
    from megatron.core.parallel_state import RankGenerator

    from megatron.parallel.topology import ParallelLayout, deepspeed_topology

    layout = ParallelLayout(tp=tp, pp=1, dp=dp, world=tp * sp * dp, sp=sp)
    assert layout.zero_partitions == dp * sp
    topo = deepspeed_topology(layout)
    gen = RankGenerator(tp=tp, ep=1, dp=dp, pp=1, cp=sp, order="tp-cp-ep-dp-pp")
    for ours, axis in (("tp", "model"), ("dp", "data"), ("cp", "sequence")):
        assert sorted(map(sorted, gen.get_ranks(ours))) == sorted(
            map(sorted, topo.get_axis_comm_lists(axis))), axis
    for rank in range(layout.world):
        cp_group = next(g for g in gen.get_ranks("cp") if rank in g)
        assert topo.get_coord(rank).sequence == cp_group.index(rank)


def test_mpu_adapter_answers_every_call_deepspeed_makes(dist_group):
    """The adapter has each mpu method DeepSpeed 0.19 calls (the Ulysses sequence-parallel ones
    included) and answers from parallel_state for a 1-rank world."""
    import os
    import re

    import deepspeed
    import torch
    from megatron.core import parallel_state

    from megatron.parallel.topology import MegatronCoreMPU, ParallelLayout, check_topology_matches

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    root = os.path.dirname(deepspeed.__file__)
    called = set()
    for folder in ("runtime", "utils"):
        for dirpath, _, files in os.walk(os.path.join(root, folder)):
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(dirpath, name)) as f:
                        called |= set(re.findall(r"mpu\.(get_[a-z_]+)\(", f.read()))
    absent = {m for m in called if not hasattr(MegatronCoreMPU, m)}
    assert absent == set(), absent
    assert {"get_sequence_parallel_world_size", "get_sequence_data_parallel_group"} <= called
    mpu = MegatronCoreMPU()
    assert mpu.get_sequence_parallel_world_size() == mpu.get_sequence_data_parallel_world_size() == 1
    assert mpu.get_sequence_data_parallel_group() is mpu.get_data_parallel_group()
    assert mpu.get_model_parallel_world_size() == mpu.get_data_parallel_world_size() == 1
    assert mpu.get_data_parallel_group_ranks() == [0]
    assert mpu.get_tensor_model_parallel_rank() == mpu.get_pipe_parallel_rank() == 0
    check_topology_matches(ParallelLayout(1, 1, 1, torch.distributed.get_world_size()))
