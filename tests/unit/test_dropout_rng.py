"""Megatron-LM's dropout RNG: attention dropout on megatron-core's model-parallel stream (seed + 2718
+ tensor-parallel rank, as its DotProductAttention forks it), each pipeline stage seeded with
--seed + 100 x its rank, initial weights untouched by either; recompute reproduces the masks."""
import random

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

HEADS, HEAD_DIM, S, B = 4, 8, 24, 2


@pytest.fixture(scope="module", autouse=True)
def model_parallel(dist_group):
    from megatron.core import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)
    yield


def sdpa_core(dropout=0.5):
    from megatron.model.sdpa_attention import SDPAttention
    config = TransformerConfig(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                               attention_dropout=dropout, use_cpu_initialization=True)
    return SDPAttention(config, 1, AttnMaskType.causal, "self").train()


def qkv(seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(S, B, HEADS, HEAD_DIM, generator=g) for _ in range(3))


def megatron_core_dropout_attention(q, k, v, p):
    """megatron-core DotProductAttention's order (its CUDA-only code, written out on CPU): causal
    softmax, then dropout inside ``get_cuda_rng_tracker().fork()``, then the values."""
    from megatron.core import tensor_parallel
    qb, kb, vb = (t.permute(1, 2, 0, 3) for t in (q, k, v))
    scores = qb @ kb.transpose(-1, -2) / HEAD_DIM ** 0.5
    scores = scores.masked_fill(torch.ones(S, S, dtype=torch.bool).triu(1), float("-inf"))
    with tensor_parallel.get_cuda_rng_tracker().fork():
        probs = F.dropout(torch.softmax(scores, -1), p)
    return (probs @ vb).permute(2, 0, 1, 3).reshape(S, B, -1)


def packed_structure():
    from megatron.model.masks import attention_structure
    seg = torch.tensor([[1] * 5 + [2] * 11 + [3] * 8, [1] * 17 + [0] * 7], dtype=torch.int32)
    pre = torch.zeros(B, S, dtype=torch.bool)
    pre[:, :3] = True
    return attention_structure(seg, pre)


def test_attention_dropout_is_megatron_cores_per_tensor_parallel_rank_stream():
    """SDPA's dropout masks come from the model-parallel stream: equal to megatron-core's
    DotProductAttention on the same stream, different on another tensor-parallel rank, and the
    default generator (hidden dropout, the data-parallel stream) does not move."""
    from megatron.parallel.cpu_rng import model_parallel_manual_seed
    core, (q, k, v) = sdpa_core(), qkv()
    outputs = []
    for tp_rank in (0, 1):
        torch.manual_seed(11)
        model_parallel_manual_seed(11, tp_rank=tp_rank)
        default_before = torch.get_rng_state()
        got = core(q, k, v, None)
        assert torch.equal(torch.get_rng_state(), default_before)
        model_parallel_manual_seed(11, tp_rank=tp_rank)
        torch.testing.assert_close(got, megatron_core_dropout_attention(q, k, v, 0.5),
                                   rtol=1e-5, atol=1e-5)
        outputs.append(got)
    assert not torch.allclose(outputs[0], outputs[1])


def test_packed_attention_dropout_differs_per_tensor_parallel_rank():
    """The same on the vectorised per-segment path of packed prefix-LM batches."""
    from megatron.parallel.cpu_rng import model_parallel_manual_seed
    core, (q, k, v) = sdpa_core(), qkv(1)
    outputs = {}
    for tp_rank in (0, 1, 0):
        model_parallel_manual_seed(5, tp_rank=tp_rank)
        default_before = torch.get_rng_state()
        out = core(q, k, v, None, packed_seq_params=packed_structure())
        assert torch.equal(torch.get_rng_state(), default_before)
        if tp_rank in outputs:
            assert torch.equal(out, outputs[tp_rank])  # the stream, not chance, decides the mask
        outputs[tp_rank] = out
    assert not torch.allclose(outputs[0], outputs[1])
    core.eval()
    model_parallel_manual_seed(5, tp_rank=0)
    assert not torch.allclose(core(q, k, v, None, packed_seq_params=packed_structure()), outputs[0])


def test_each_pipeline_stage_gets_seed_plus_100_times_its_rank(monkeypatch):
    """set_seeds: Python, NumPy, torch and the tracker's streams of stage 2 start from --seed + 200
    (Megatron-LM's _set_random_seed); the initial weights are the same for every stage's seeds."""
    from megatron.core import parallel_state, tensor_parallel

    from helpers.models import gpt_model
    from megatron.config.parser import parse_args
    from megatron.parallel.initialize import set_seeds

    args = parse_args(["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4",
                       "--seq-length", "8", "--micro-batch-size", "1", "--train-iters", "1",
                       "--lr", "1e-3", "--transformer-impl", "local"], require_data=False)
    args.padded_vocab_size = 64
    weights = {}
    for stage in (0, 2):
        # read by set_seeds in this iteration; after the loop it sees the last stage either way (B023)
        monkeypatch.setattr(parallel_state, "get_pipeline_model_parallel_rank", lambda: stage)  # noqa: B023
        set_seeds(1234)
        seed = 1234 + 100 * stage
        assert torch.initial_seed() == seed
        assert random.random() == random.Random(seed).random()
        assert np.random.random() == np.random.RandomState(seed).random_sample()
        with tensor_parallel.get_cuda_rng_tracker().fork():
            drawn = torch.rand(3)
        assert torch.equal(drawn, torch.rand(3, generator=torch.Generator().manual_seed(seed + 2718)))
        weights[stage] = {n: p.detach().clone() for n, p in gpt_model(args).named_parameters()}
    for name, value in weights[0].items():
        assert torch.equal(value, weights[2][name]), name
