"""Layout-independent initial weights (megatron/model/init.py): the TP=2 shards of every
parameter put together equal the TP=1 model's parameter; a pipeline stage that maps its layer
names to global ones draws the single-rank model's layers; megatron-core's init kinds."""
import math

import pytest
import torch

from megatron.config.arguments import validate_args
from megatron.config.parser import get_parser


def _args(extra=()):
    args = validate_args(get_parser().parse_args(
        ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3", "--transformer-impl", "local",
         "--untie-embeddings-and-output-weights", "--seed", "9", *extra]), 2 if "--tensor-model-parallel-size" in extra else 1,
        require_data=False)
    args.padded_vocab_size = 128
    return args


@pytest.fixture
def tp1_state(dist_group):
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def _unshard(shards, like):
    """Inverse of megatron-core's split: chunks of size/stride along partition_dim, interleaved."""
    if not getattr(like, "tensor_model_parallel", False):
        assert all(torch.equal(s, shards[0]) for s in shards)
        return shards[0]
    dim, stride = like.partition_dim, like.partition_stride
    per_rank = [torch.split(s, s.shape[dim] // stride, dim=dim) for s in shards]
    return torch.cat([chunks[i] for i in range(stride) for chunks in per_rank], dim=dim)


@pytest.mark.parametrize("extra, block_elements", [([], None), (["--swiglu"], None),
                                                   (["--num-query-groups", "2"], None),
                                                   (["--swiglu"], 100)])
def test_tp2_shards_concatenate_to_the_tp1_weights(tp1_state, extra, block_elements):
    """Also with blocks of 100 elements (a few rows: every weight is drawn in several blocks, so a
    rank draws only some of them for row-split weights and slices each for column-split ones)."""
    from helpers.models import gpt_model
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.init import initialize_parameters

    model = gpt_model(_args(extra))
    if block_elements:
        initialize_parameters(model.named_parameters(), transformer_config_from_args(_args(extra)), 9,
                              block_elements=block_elements)
    full = dict(model.named_parameters())
    tp2_args = _args(extra + ["--tensor-model-parallel-size", "2"])
    config = transformer_config_from_args(tp2_args)
    sharded_kinds = set()
    for name, param in full.items():
        shards = []
        for rank in range(2):
            shard = torch.empty(_shard_shape(param, name, extra))
            for attr in ("tensor_model_parallel", "partition_dim", "partition_stride"):
                if hasattr(param, attr):
                    setattr(shard, attr, getattr(param, attr))
            if getattr(param, "tensor_model_parallel", False):
                shard.partition_stride = 2 if (name.endswith("linear_fc1.weight") and "--swiglu" in extra) \
                    else 1
                sharded_kinds.add(name.split(".")[-2])
            initialize_parameters([(name, shard)], config, 9, tp_rank=rank, tp_size=2,
                                  block_elements=block_elements)
            shards.append(shard)
        torch.testing.assert_close(_unshard(shards, shards[0]), param.detach(), rtol=0, atol=0, msg=name)
    assert {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "word_embeddings",
            "output_layer"} <= sharded_kinds


def _shard_shape(param, name, extra):
    shape = list(param.shape)
    if getattr(param, "tensor_model_parallel", False):
        shape[param.partition_dim] //= 2
    return shape


def test_pipeline_stage_with_global_names_draws_the_same_layers(tp1_state):
    """A 2-layer model whose layers are named 2 and 3 (the second of two pipeline stages) gets the
    4-layer model's layers 2 and 3."""
    from helpers.models import gpt_model
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.init import initialize_parameters

    whole = dict(gpt_model(_args()).named_parameters())
    stage_args = _args(["--num-layers", "2"])
    stage = gpt_model(stage_args)

    def to_global(name):
        parts = name.split(".")
        if parts[:2] == ["decoder", "layers"]:
            parts[2] = str(int(parts[2]) + 2)
        return ".".join(parts)

    initialize_parameters(stage.named_parameters(), transformer_config_from_args(_args()), 9,
                          canonical_name=to_global)
    for name, param in stage.named_parameters():
        assert torch.equal(param, whole[to_global(name)]), name
    assert not torch.equal(whole["decoder.layers.0.mlp.linear_fc1.weight"],
                           whole["decoder.layers.1.mlp.linear_fc1.weight"])


def test_init_kinds_follow_megatron_core(tp1_state):
    from helpers.models import gpt_model

    args = _args()
    params = dict(gpt_model(args).named_parameters())
    std = args.init_method_std
    scaled = std / math.sqrt(2 * args.num_layers)
    for name, p in params.items():
        if name.endswith("bias"):
            assert torch.count_nonzero(p) == 0, name
        elif p.dim() == 1:
            assert torch.all(p == 1), name
        elif name.endswith(("linear_proj.weight", "linear_fc2.weight")):
            assert abs(p.std().item() - scaled) < 0.25 * scaled, name
        else:
            assert abs(p.std().item() - std) < 0.25 * std, name
    # a different --seed gives different weights; the same seed the same ones
    other = dict(gpt_model(_args(["--seed", "10"])).named_parameters())
    again = dict(gpt_model(_args()).named_parameters())
    name = "decoder.layers.0.self_attention.linear_qkv.weight"
    assert not torch.equal(other[name], params[name]) and torch.equal(again[name], params[name])
