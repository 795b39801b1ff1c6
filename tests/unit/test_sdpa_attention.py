"""SDPA core attention against a naive masked-softmax reference, and inside a GPTModel (packed
batches with prefixes and ALiBi in every backend: tests/unit/test_attention_backends.py)."""
import math

import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from helpers.flags import parse


@pytest.fixture(scope="module", autouse=True)
def model_parallel(dist_group):
    from megatron.core import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)
    yield


def naive_attention(q, k, v, masked, scale):
    """q,k,v [s,b,n,h]; masked [b|1, n|1, sq, sk] bool True = masked; returns [s, b, n*h]."""
    qb, kb, vb = (t.permute(1, 2, 0, 3).double() for t in (q, k, v))
    scores = qb @ kb.transpose(-1, -2) * scale
    scores = scores.masked_fill(masked, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    probs = torch.nan_to_num(probs, nan=0.0)
    out = probs @ vb
    s, b = q.shape[0], q.shape[1]
    return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def make_attention(heads=4, groups=4, hidden=32, mask_type=AttnMaskType.causal):
    from megatron.model.sdpa_attention import SDPAttention
    config = TransformerConfig(num_layers=1, hidden_size=hidden, num_attention_heads=heads,
                               num_query_groups=groups, attention_dropout=0.0,
                               use_cpu_initialization=True)
    return SDPAttention(config, layer_number=1, attn_mask_type=mask_type, attention_type="self").eval()


def qkv(s=12, b=3, n=4, groups=4, h=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, b, n, h, generator=g)
    k = torch.randn(s, b, groups, h, generator=g)
    v = torch.randn(s, b, groups, h, generator=g)
    return q, k, v


def test_causal_without_mask_matches_reference():
    attn = make_attention()
    q, k, v = qkv()
    causal = torch.triu(torch.ones(12, 12, dtype=torch.bool), 1)[None, None]
    expected = naive_attention(q, k, v, causal, 1 / math.sqrt(8))
    got = attn(q, k, v, attention_mask=None)
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_packed_structure_matches_reference():
    """Two segments (the second with a 3-token prefix) against the naive masked softmax."""
    from megatron.model.masks import attention_structure
    attn = make_attention()
    q, k, v = qkv(seed=1)
    seg = torch.tensor([[1] * 5 + [2] * 7] * 3, dtype=torch.int32)
    pre = torch.zeros(3, 12, dtype=torch.bool)
    pre[:, 5:8] = True
    i = torch.arange(12)
    allowed = (seg[:, :, None] == seg[:, None, :]) & (
        (i[None, None, :] <= i[None, :, None]) | (pre[:, :, None] & pre[:, None, :]))
    expected = naive_attention(q, k, v, ~allowed[:, None], 1 / math.sqrt(8))
    got = attn(q, k, v, None, packed_seq_params=attention_structure(seg, pre))
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_grouped_query_attention_matches_reference():
    attn = make_attention(heads=4, groups=2)
    q, k, v = qkv(groups=2, seed=4)
    causal = torch.triu(torch.ones(12, 12, dtype=torch.bool), 1)[None, None]
    k_full, v_full = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
    expected = naive_attention(q, k_full, v_full, causal, 1 / math.sqrt(8))
    torch.testing.assert_close(attn(q, k, v, None).double(), expected, rtol=1e-5, atol=1e-5)


def test_gpt_model_uses_sdpa_and_segments_change_output():
    from helpers.models import gpt_model
    from megatron.model.masks import attention_structure
    from megatron.model.sdpa_attention import SDPAttention
    args = parse(["--hidden-size", "32", "--ffn-hidden-size", "64", "--hidden-dropout", "0",
                  "--attention-dropout", "0", "--seq-length", "16", "--max-position-embeddings",
                  "16", "--transformer-impl", "local", "--use-cpu-initialization", "--seed", "0"])
    args.padded_vocab_size = 128  # what the entry point's tokenizer set-up derives
    torch.manual_seed(0)
    model = gpt_model(args).eval()
    assert any(isinstance(m, SDPAttention) for m in model.modules())
    tokens = torch.randint(0, 100, (2, 16))
    pos = torch.arange(16).expand(2, 16)
    one_segment = attention_structure(torch.ones(2, 16, dtype=torch.int32))
    # two segments of 8: tokens after position 8 no longer see the first segment
    two_segments = attention_structure(torch.tensor([[1] * 8 + [2] * 8] * 2, dtype=torch.int32))
    with torch.no_grad():
        implicit = model(tokens, pos, None)
        explicit = model(tokens, pos, None, packed_seq_params=one_segment)
        packed = model(tokens, pos, None, packed_seq_params=two_segments)
    torch.testing.assert_close(implicit, explicit, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(packed[:, :8], implicit[:, :8], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(packed[:, 8:], implicit[:, 8:])
