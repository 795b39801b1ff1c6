"""Activation recompute on CPU: megatron-core's checkpointed forward runs without CUDA and, with
dropout, gives the same losses and gradients as no recompute (the recomputed forward replays the
saved generator state)."""
from unittest import mock

import pytest
import torch

from megatron.config.arguments import validate_args
from megatron.config.parser import get_parser


def _model(extra):
    from helpers.models import gpt_model

    args = validate_args(get_parser().parse_args(
        ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3", "--transformer-impl", "local",
         "--hidden-dropout", "0.2", "--attention-dropout", "0.2", *extra]), 1, require_data=False)
    args.padded_vocab_size = 128
    torch.manual_seed(0)
    return gpt_model(args)


def _packed_prefix_structure():
    """Two samples of packed segments (the second ending in padding), prefixes in each."""
    from megatron.model.masks import attention_structure

    seg = torch.tensor([[1] * 5 + [2] * 7 + [3] * 4, [1] * 9 + [2] * 3 + [0] * 4], dtype=torch.int32)
    pre = torch.zeros(2, 16, dtype=torch.bool)
    pre[:, :2] = pre[:, 9:11] = True
    return attention_structure(seg, pre)


def _three_steps(model, packed=False):
    """Loss and one weight's gradient norm for three forward/backward passes with dropout on
    (``packed``: on packed prefix-LM batches, SDPA's per-segment path)."""
    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    torch.manual_seed(5)
    model_parallel_manual_seed(5)
    tokens = torch.randint(0, 100, (2, 16))
    position_ids = torch.arange(16).expand(2, 16)
    out = []
    for _ in range(3):
        structure = _packed_prefix_structure() if packed else None
        loss = model(tokens, position_ids, None, labels=tokens, packed_seq_params=structure).mean()
        loss.backward()
        out.append((loss.item(), model.decoder.layers[0].mlp.linear_fc1.weight.grad.norm().item()))
    return out


@pytest.fixture
def model_parallel_state(dist_group):
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


@pytest.mark.parametrize("flags, calls", [
    (["--checkpoint-activations"], 2 * 3),  # one checkpoint per layer per forward
    (["--recompute-granularity", "full", "--recompute-method", "uniform",
      "--recompute-num-layers", "2"], 1 * 3),
    (["--recompute-granularity", "full", "--recompute-method", "block",
      "--recompute-num-layers", "1"], 1 * 3),
    (["--recompute-granularity", "selective"], 2 * 3),  # core attention of each layer
])
@pytest.mark.parametrize("packed", [False, True])
def test_recompute_gives_identical_losses_and_grads_with_dropout(model_parallel_state, flags, calls,
                                                                 packed):
    """Attention dropout runs on the tracker's model-parallel stream (megatron-core's fork), hidden
    dropout on the default one; the recomputed forward replays both."""
    from megatron.core.tensor_parallel import random as mrandom

    reference = _three_steps(_model([]), packed)
    real_apply = mrandom.CheckpointFunction.apply
    with mock.patch.object(mrandom.CheckpointFunction, "apply", side_effect=real_apply) as spy:
        recomputed = _three_steps(_model(flags), packed)
    assert spy.call_count == calls
    assert recomputed == reference
    # each dropout really is on: without it the losses differ
    for off in (["--attention-dropout", "0"], ["--hidden-dropout", "0"]):
        assert _three_steps(_model(off), packed)[0] != reference[0]


def test_cpu_tracker_fork_uses_its_own_stream_and_restores_the_default(model_parallel_state):
    from megatron.core import tensor_parallel

    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    model_parallel_manual_seed(1)
    torch.manual_seed(3)
    expected_default = torch.rand(4)
    torch.manual_seed(3)
    with tensor_parallel.get_cuda_rng_tracker().fork():
        forked = torch.rand(4)
    assert torch.equal(torch.rand(4), expected_default)  # the default stream did not move
    expected_forked = torch.rand(4, generator=torch.Generator().manual_seed(1 + 2718))
    assert torch.equal(forked, expected_forked)  # model-parallel stream: seed + 2718 + tp_rank



def test_checkpoint_rng_state_carries_the_cpu_tracker_streams(model_parallel_state):
    """Exact resume with dropout under TP on CPU: the tracker's model-parallel stream is saved and
    restored with the other generator states (megatron/checkpoint/engine.py rng_state)."""
    from megatron.core import tensor_parallel

    from megatron.checkpoint.engine import rng_state, set_rng_state
    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    model_parallel_manual_seed(4)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    with tracker.fork():
        torch.rand(3)  # move the stream off its seed
    saved = rng_state()
    with tracker.fork():
        expected = torch.rand(5)
    model_parallel_manual_seed(99)  # a fresh process would start elsewhere
    set_rng_state(saved)
    with tracker.fork():
        assert torch.equal(torch.rand(5), expected)
