"""Attention backends against a naive reference on packed / prefix-LM / ALiBi batches; ALiBi slopes
against BLOOM's; --attention-backend selection; Transformer Engine's arguments through a stand-in.
The backends in runs (one process, the launcher): tests/e2e/test_attention_backends_e2e.py."""
import math
import sys
import types

import numpy as np
import pytest
import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

HEADS, GROUPS, HEAD_DIM = 6, 3, 8


@pytest.fixture(scope="module", autouse=True)
def model_parallel(dist_group):
    from megatron.core import parallel_state
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1)
    yield


# ------------------------------------------------------------------ the naive reference
def reference_allowed(segment_ids, is_prefix, s):
    """[b, s, s] bool from the rule written out per pair: same segment, and causal or both in the
    prefix (no segment ids: one segment; no prefix flags: causal)."""
    b = 1 if segment_ids is None else segment_ids.shape[0]
    b = b if is_prefix is None else is_prefix.shape[0]
    out = np.zeros((b, s, s), dtype=bool)
    for n in range(b):
        for i in range(s):
            for j in range(s):
                same = segment_ids is None or segment_ids[n, i] == segment_ids[n, j]
                both_prefix = is_prefix is not None and is_prefix[n, i] and is_prefix[n, j]
                out[n, i, j] = same and (j <= i or both_prefix)
    return torch.from_numpy(out)


def naive_attention(q, k, v, allowed, scale, slopes=None):
    """softmax(q.k * scale + slope * (j - i), masked) v in float64; q [s,b,n,h], k/v [s,b,g,h]
    (query groups expanded), allowed [b, s, s]; returns [s, b, n*h]."""
    s, b, n, h = q.shape
    rep = n // k.shape[2]
    qb = q.permute(1, 2, 0, 3).double()
    kb = k.permute(1, 2, 0, 3).double().repeat_interleave(rep, dim=1)
    vb = v.permute(1, 2, 0, 3).double().repeat_interleave(rep, dim=1)
    scores = qb @ kb.transpose(-1, -2) * scale
    if slopes is not None:
        i = torch.arange(s, dtype=torch.float64)
        scores = scores + slopes.double()[None, :, None, None] * (i[None, :] - i[:, None])
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    out = torch.softmax(scores, dim=-1) @ vb
    return out.permute(2, 0, 1, 3).reshape(s, b, n * h)


def random_batch(seed, b=3, s=37, prefix=True, segments=True):
    """Random segment lengths (with padding 0 at the end of some samples) and prefix lengths."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((b, s), dtype=np.int32)
    pre = np.zeros((b, s), dtype=bool)
    for n in range(b):
        pos, k = 0, 1
        end = s - int(rng.integers(0, 6)) if segments else s
        while pos < end:
            length = min(int(rng.integers(1, 14)) if segments else s, end - pos)
            seg[n, pos:pos + length] = k
            pre[n, pos:pos + int(rng.integers(0, length + 1))] = True
            pos, k = pos + length, k + 1
    return (torch.from_numpy(seg) if segments else None), (torch.from_numpy(pre) if prefix else None)


def qkv(seed, s, b):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(s, b, HEADS, HEAD_DIM, generator=g),
            torch.randn(s, b, GROUPS, HEAD_DIM, generator=g),
            torch.randn(s, b, GROUPS, HEAD_DIM, generator=g))


def make_core(cls, alibi, dropout=0.0):
    config = TransformerConfig(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                               num_query_groups=GROUPS, attention_dropout=dropout,
                               use_cpu_initialization=True)
    return cls(config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self",
               alibi=alibi).eval()


def cpu_backends():
    from megatron.model.flex_attention import FlexCoreAttention
    from megatron.model.sdpa_attention import SDPAttention
    return [SDPAttention, FlexCoreAttention]


CASES = [dict(segments=True, prefix=True), dict(segments=True, prefix=False),
         dict(segments=False, prefix=True), dict(segments=False, prefix=False)]


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("backend", ["sdpa", "flex"])
def test_backend_equals_naive_reference(backend, case, alibi):
    from megatron.model.alibi import alibi_slopes
    from megatron.model.masks import attention_structure
    cls = dict(zip(["sdpa", "flex"], cpu_backends(), strict=False))[backend]
    core = make_core(cls, alibi)
    for seed in range(3):
        seg, pre = random_batch(seed, **CASES[case])
        s, b = 37, 3
        q, k, v = qkv(seed, s, b)
        structure = attention_structure(seg, pre)
        got = core(q, k, v, None, packed_seq_params=structure)
        allowed = reference_allowed(None if seg is None else seg.numpy(),
                                    None if pre is None else pre.numpy(), s).expand(b, s, s)
        want = naive_attention(q, k, v, allowed, 1 / math.sqrt(HEAD_DIM),
                               alibi_slopes(HEADS) if alibi else None)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_dense_sdpa_equals_segmentwise_sdpa():
    """The dense form (one SDPA over the sequence) and the per-segment form agree."""
    from megatron.model.alibi import alibi_slopes
    from megatron.model.masks import attention_structure
    from megatron.model.sdpa_attention import sdpa_dense, sdpa_segmentwise
    seg, pre = random_batch(7)
    q, k, v = (t.permute(1, 2, 0, 3) for t in qkv(7, 37, 3))
    k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    slopes = alibi_slopes(HEADS)
    dense = sdpa_dense(q, k, v, attention_structure(seg, pre), 0.3, slopes=slopes)
    segmentwise = sdpa_segmentwise(q, k, v, attention_structure(seg, pre), 0.3, slopes=slopes)
    torch.testing.assert_close(dense, segmentwise, rtol=1e-5, atol=1e-5)


def test_dense_mask_equals_reference_rule_and_block_mask():
    from megatron.model.masks import attention_structure, block_mask, dense_allowed_mask
    seg, pre = random_batch(3, s=300)
    structure = attention_structure(seg, pre)
    dense = dense_allowed_mask(structure, 300)[:, 0]
    assert torch.equal(dense[:, :40, :40], reference_allowed(seg[:, :40].numpy(), pre[:, :40].numpy(), 40))
    mask = block_mask(structure, 300, "cpu")
    # a block is computed exactly when the dense mask allows some pair in it
    blocks = mask.to_dense()[:, 0].bool()
    bs = 128
    for n in range(3):
        for qi in range(blocks.shape[1]):
            for ki in range(blocks.shape[2]):
                touched = bool(dense[n, qi * bs:(qi + 1) * bs, ki * bs:(ki + 1) * bs].any())
                assert bool(blocks[n, qi, ki]) == touched


def test_segment_ids_after_eod_match_megatron_core_reset_attention_mask():
    """The compact form of --reset-attention-mask equals megatron-core's dense mask."""
    from megatron.core.datasets.gpt_dataset import _get_ltor_masks_and_position_ids

    from megatron.data.document_segments import segment_ids_after_eod
    from megatron.model.masks import attention_structure, dense_allowed_mask
    eod = 0
    tokens = torch.tensor([5, 6, 0, 7, 8, 9, 0, 0, 4, 3, 2, 0, 1])
    core_mask, _, _ = _get_ltor_masks_and_position_ids(tokens, eod, reset_position_ids=False,
                                                       reset_attention_mask=True, eod_mask_loss=False,
                                                       create_attention_mask=True)
    seg = segment_ids_after_eod(tokens[None], eod)
    assert seg.dtype == torch.int32 and seg[0].tolist() == [1, 1, 1, 2, 2, 2, 2, 3, 4, 4, 4, 4, 5]
    ours = dense_allowed_mask(attention_structure(seg), len(tokens))[0, 0]
    assert torch.equal(ours, ~core_mask[0].bool())


def test_structure_rejects_bad_shapes_and_dense_masks():
    from megatron.model.masks import AttentionStructure
    from megatron.model.sdpa_attention import SDPAttention
    with pytest.raises(ValueError, match="is_prefix has shape"):
        AttentionStructure(segment_ids=torch.ones(2, 5, dtype=torch.int32),
                           is_prefix=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        AttentionStructure(segment_ids=torch.ones(5, dtype=torch.int32))
    core = make_core(SDPAttention, alibi=False)
    q, k, v = qkv(0, 8, 1)
    with pytest.raises(ValueError, match="not a dense attention_mask"):
        core(q, k, v, torch.zeros(1, 1, 8, 8, dtype=torch.bool))
    # A segment that is not one run is refused where its layout is computed: in the loader's
    # collate (with_segment_layout), before any tensor reaches the device.
    from megatron.model.masks import attention_structure, collate_with_segment_layout
    split = torch.tensor([[1, 1, 2, 2, 2, 2, 0, 0], [1, 1, 2, 2, 1, 1, 0, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match="sample 1: segment 1 is split into separate runs"):
        attention_structure(split)
    with pytest.raises(ValueError, match="sample 1: segment 1 is split into separate runs"):
        collate_with_segment_layout([{"segment_ids": row} for row in split])


# ------------------------------------------------------------------ ALiBi slopes
def bloom_slopes(n):
    """BLOOM's slopes as HF transformers' build_alibi_tensor computes them."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    alibi = build_alibi_tensor(torch.ones(1, 3, dtype=torch.long), n, torch.float32)
    return alibi[:, 0, 1]  # [heads, 1, positions]: slope * position 1


@pytest.mark.parametrize("heads", list(range(1, 65)))
def test_alibi_slopes_equal_bloom(heads):
    from megatron.model.alibi import alibi_slopes
    ours = alibi_slopes(heads)
    assert ours.shape == (heads,)
    torch.testing.assert_close(ours, bloom_slopes(heads), rtol=1e-6, atol=0)


def test_alibi_slopes_closed_form():
    from megatron.model.alibi import alibi_slope_list
    assert alibi_slope_list(8) == [2.0 ** -(i + 1) for i in range(8)]
    # 12 heads: the 8-head slopes, then every other slope of 16 heads (2^-0.5, 2^-1.5, ...)
    assert alibi_slope_list(12)[8:] == pytest.approx([2.0 ** -(0.5 + i) for i in range(4)])


@pytest.mark.parametrize("heads,tp", [(12, 2), (12, 4), (6, 3), (64, 8)])
def test_alibi_slopes_per_tensor_parallel_rank(heads, tp):
    from megatron.model.alibi import alibi_slopes, alibi_slopes_for_partition
    parts = [alibi_slopes_for_partition(heads, tp, r) for r in range(tp)]
    assert all(len(p) == heads // tp for p in parts)
    assert torch.equal(torch.cat(parts), alibi_slopes(heads))


def test_alibi_core_attention_uses_its_ranks_heads(monkeypatch):
    """A core attention on tensor-parallel rank 1 of 2 holds heads 3..5 and their slopes."""
    from megatron.model.alibi import alibi_slope_list
    from megatron.model.sdpa_attention import SDPAttention

    class Group:
        def size(self):
            return 2

        def rank(self):
            return 1

    config = TransformerConfig(num_layers=1, hidden_size=48, num_attention_heads=6,
                               use_cpu_initialization=True)
    pg = types.SimpleNamespace(tp=Group())
    core = SDPAttention(config, 1, AttnMaskType.causal, "self", pg_collection=pg, alibi=True)
    assert core.num_attention_heads_per_partition == 3
    assert core.alibi_slope_values == alibi_slope_list(6)[3:]


def test_alibi_bad_inputs():
    from megatron.model.alibi import alibi_slopes, alibi_slopes_for_partition
    with pytest.raises(ValueError, match="at least one attention head"):
        alibi_slopes(0)
    with pytest.raises(ValueError, match="do not split over tensor-parallel size 4"):
        alibi_slopes_for_partition(6, 4, 0)


# ------------------------------------------------------------------ --attention-backend
def resolve(requested, device="cuda", te=True, impl="transformer_engine", structured=True,
            dropout=0.0, training=True, alibi=False, prefix=False, te_version=(2, 9),
            flash_attn=("flash-attn==2.8.3",), scores_mib=None):
    from megatron.model.attention_backends import resolve_attention_backend
    return resolve_attention_backend(requested, device_type=device, te_available=te,
                                     transformer_impl=impl, structured_batches=structured,
                                     attention_dropout=dropout, training=training, alibi=alibi,
                                     prefix_batches=prefix, te_version=te_version,
                                     flash_attn=flash_attn, dense_scores_mib=scores_mib)


@pytest.mark.parametrize("requested,kwargs,name,kernel", [
    ("auto", dict(device="cpu"), "sdpa", None),
    ("auto", dict(device="cpu", structured=False), "sdpa", None),
    ("auto", dict(), "flex", None),                        # GPU, packed, no dropout
    ("auto", dict(dropout=0.1), "te", None),               # GPU, packed, dropout: TE's thd format
    ("auto", dict(dropout=0.1, prefix=True), "te", None),  # GPU, prefix, dropout: TE arbitrary mask
    ("auto", dict(dropout=0.1, te=False), "sdpa", None),
    ("auto", dict(structured=False), "te", None),
    ("auto", dict(structured=False, impl="local"), "sdpa", None),
    ("auto", dict(structured=False, te=False), "sdpa", None),
    ("auto", dict(structured=False, te=False, alibi=True), "flex", None),  # no dense ALiBi bias
    ("auto", dict(structured=False, te=False, alibi=True, dropout=0.1), "sdpa", None),
    ("auto", dict(structured=False, alibi=True), "te", None),
    ("auto", dict(device="cpu", alibi=True), "sdpa", None),
    ("sdpa", dict(), "sdpa", None),
    ("local", dict(device="cpu"), "sdpa", None),
    ("flex", dict(), "flex", None),
    ("flex", dict(device="cpu", training=False), "flex", None),
    ("te", dict(), "te", None),
    ("unfused", dict(prefix=True), "te", "unfused"),       # the arbitrary mask: unfused only
    ("unfused", dict(te_version=(2, 12)), "te", "unfused"),  # thd: unfused from TE 2.12 on
    ("fused", dict(), "te", "fused"),
    ("flash", dict(structured=False), "te", "flash"),
    ("flash", dict(), "te", "flash"),  # packed documents without prefixes: TE's thd format
])
def test_backend_selection(requested, kwargs, name, kernel):
    backend = resolve(requested, **kwargs)
    assert (backend.name, backend.te_kernel) == (name, kernel)
    assert backend.describe().startswith(f"attention backend: {name}")
    assert f"--attention-backend {requested}" in backend.describe()


@pytest.mark.parametrize("requested,kwargs,message", [
    ("flex", dict(device="cpu"), "no backward pass on CPU"),
    ("flex", dict(dropout=0.1), "set --attention-dropout 0"),
    ("te", dict(te=False), "Transformer Engine is not installed"),
    ("unfused", dict(impl="local"), "needs --transformer-impl transformer_engine"),
    ("fused", dict(device="cpu"), "needs a CUDA device"),
    ("flash", dict(prefix=True), "take no arbitrary mask, which --prefix-lm batches need"),
    ("magic", dict(), "unknown; choose one of auto, flash"),
    # Transformer Engine combinations without a kernel, each naming what runs instead
    ("flash", dict(flash_attn=()), r"flash kernels come from the flash-attn package, which is not "
                                   r"installed \(pip install flash-attn\); use fused, te, flex or sdpa"),
    ("flash", dict(structured=False, flash_attn=("flash-attn-3==3.0.0b1",), dropout=0.1),
     r"the installed flash-attn-3==3.0.0b1 has no attention dropout \(flash-attn 2 has\); set "
     r"--attention-dropout 0 \(got 0.1\), install flash-attn, or use fused, te or sdpa"),
    ("fused", dict(prefix=True), r"fused \(cuDNN\) kernels take no arbitrary mask, which "
                                 r"--prefix-lm batches need \(only its unfused kernels do\); use "
                                 r"unfused or te .*, flex or sdpa"),
    ("fused", dict(prefix=True, dropout=0.1), r"flex \(with --attention-dropout 0\) or sdpa"),
    ("unfused", dict(), r"packed documents without prefixes run Transformer Engine's packed thd "
                        r"format, for which Transformer Engine 2.9 has no unfused kernel \(TE 2.12 "
                        r"adds one\); use fused, flash, te, flex or sdpa"),
    ("te", dict(te=False, impl="local"), "Transformer Engine is not installed"),
])
def test_backend_selection_errors_name_the_flag(requested, kwargs, message):
    from megatron.errors import ArgumentError
    with pytest.raises(ArgumentError, match=f"--attention-backend {requested}: .*{message}"):
        resolve(requested, **kwargs)


def test_unfused_te_kernel_states_what_it_stores():
    """Where TE's unfused kernel runs the arbitrary mask of prefix batches (auto with attention
    dropout, te, unfused), the start-up line says what it stores and how much; other choices
    carry no cost note."""
    for requested, kwargs in (("auto", dict(dropout=0.1)), ("te", {}), ("unfused", {})):
        line = resolve(requested, prefix=True, scores_mib=256.0, **kwargs).describe()
        assert ("cost: Transformer Engine's unfused kernel (the only one for the arbitrary mask "
                "prefix batches need) stores [b, h, s, s] attention probabilities for the backward "
                "(at least 256 MiB per layer)") in line, line
    assert "--attention-dropout 0 runs block-sparse FlexAttention instead" in \
        resolve("auto", prefix=True, dropout=0.1).describe()
    for requested, kwargs in (("auto", {}), ("auto", dict(dropout=0.1)), ("te", {}),
                              ("fused", {}), ("flash", dict(structured=False))):
        assert "cost:" not in resolve(requested, scores_mib=256.0, **kwargs).describe()


@pytest.mark.parametrize("flags,message", [
    (["--attention-backend", "fused", "--prefix-lm"], "--attention-backend fused: Transformer "
     "Engine's fused (cuDNN) kernels take no arbitrary mask"),
    (["--attention-backend", "unfused", "--reset-attention-mask"], "--attention-backend unfused: "
     "packed documents without prefixes run Transformer Engine's packed thd format"),
    (["--attention-backend", "flash"], "--attention-backend flash: Transformer Engine's flash "
     "kernels come from the flash-attn package, which is not installed"),
])
def test_validate_args_refuses_te_combinations_without_a_kernel(monkeypatch, capsys, flags, message):
    """On a GPU with Transformer Engine 2.9 and no flash-attn, parsing the flags fails with the
    reason; the combinations that have a kernel parse."""
    import argparse

    from megatron.config.parser import parse_args
    from megatron.model import transformer_engine_support
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(transformer_engine_support, "transformer_engine_status", lambda: (
        transformer_engine_support.TransformerEngineStatus(importable=True, version=(2, 9))))
    base = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
            "--seq-length", "8", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3"]

    def prefix_lm(parser: argparse.ArgumentParser):
        parser.add_argument("--prefix-lm", action="store_true")
        parser.set_defaults(packed_samples="--prefix-lm" in flags)
        return parser

    with pytest.raises(SystemExit):
        parse_args(base + flags, extra_args_provider=prefix_lm, require_data=False)
    assert message in capsys.readouterr().err
    ok = {"fused": ["--attention-backend", "fused", "--reset-attention-mask"],
          "unfused": ["--attention-backend", "unfused", "--prefix-lm"],
          "flash": ["--attention-backend", "te", "--prefix-lm"]}[flags[1]]
    assert parse_args(base + ok, extra_args_provider=prefix_lm,
                      require_data=False).attention_backend == ok[1]


def test_attention_backend_flag(capsys):
    from megatron.config.parser import parse_args
    base = ["--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2",
            "--seq-length", "8", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3"]
    assert parse_args(base, require_data=False).attention_backend == "auto"
    args = parse_args(base + ["--attention-backend", "flex", "--position-embedding-type", "alibi"],
                      require_data=False)
    assert (args.attention_backend, args.position_embedding_type) == ("flex", "alibi")
    with pytest.raises(SystemExit):
        parse_args(base + ["--attention-backend", "flash-attn"], require_data=False)
    assert "--attention-backend flash-attn: unknown; choose one of auto" in capsys.readouterr().err


def test_te_kernel_environment():
    from megatron.model.attention_backends import AttentionBackend, apply_te_kernel_environment
    env = {}
    apply_te_kernel_environment(AttentionBackend("te", "fused", "explicit", te_kernel="fused"), env)
    assert env == {"NVTE_FLASH_ATTN": "0", "NVTE_FUSED_ATTN": "1", "NVTE_UNFUSED_ATTN": "0"}
    env = {}
    apply_te_kernel_environment(AttentionBackend("te", "te", "explicit"), env)
    apply_te_kernel_environment(AttentionBackend("sdpa", "auto", "cpu"), env)
    assert env == {}


# ------------------------------------------------------------------ Transformer Engine stand-in
class FakeTEDotProductAttention(torch.nn.Module):
    """Stand-in for megatron-core's TEDotProductAttention and TE's DotProductAttention.forward:
    records its arguments and computes what TE documents for them (sbhd; True = masked;
    ``causal``; ``alibi`` bias ``-slope * |q - k|``; ``post_scale_bias`` added)."""

    calls = []

    def __init__(self, config, layer_number, attn_mask_type, attention_type, *args, **kwargs):
        super().__init__()
        self.scale = 1 / math.sqrt(config.kv_channels)

    def forward(self, q, k, v, attention_mask=None, attn_mask_type="causal",
                core_attention_bias_type="no_bias", core_attention_bias=None, alibi_slopes=None,
                qkv_format=None, cu_seqlens_q=None, cu_seqlens_kv=None, max_seqlen_q=None,
                max_seqlen_kv=None):
        FakeTEDotProductAttention.calls.append(dict(
            attn_mask_type=attn_mask_type, bias_type=core_attention_bias_type, qkv_format=qkv_format,
            mask=attention_mask, bias=core_attention_bias, slopes=alibi_slopes,
            cu_seqlens=cu_seqlens_q, max_seqlen=max_seqlen_q))
        if qkv_format == "thd":  # [t, h, d]: each cu_seqlens sequence on its own, causally
            assert attn_mask_type == "padding_causal" and attention_mask is None
            assert torch.equal(cu_seqlens_q, cu_seqlens_kv) and cu_seqlens_q.dtype == torch.int32
            bounds = cu_seqlens_q.tolist()
            assert max_seqlen_q == max(b - a for a, b in zip(bounds, bounds[1:], strict=False))
            outs = []
            for a, b in zip(bounds, bounds[1:], strict=False):
                sbhd = [t[a:b, None] for t in (q, k, v)]  # [len, 1, h, d]
                outs.append(FakeTEDotProductAttention.forward(
                    self, *sbhd, attn_mask_type="causal", alibi_slopes=alibi_slopes,
                    core_attention_bias_type=core_attention_bias_type)[:, 0])
            return torch.cat(outs, 0)
        s, b = q.shape[:2]
        if attn_mask_type == "causal":
            allowed = torch.ones(s, s, dtype=torch.bool).tril().expand(b, s, s)
        else:
            assert attn_mask_type == "arbitrary"
            allowed = ~attention_mask[:, 0]
        qb, kb, vb = (t.permute(1, 2, 0, 3).double() for t in (q, k, v))
        kb = kb.repeat_interleave(qb.shape[1] // kb.shape[1], 1)
        vb = vb.repeat_interleave(qb.shape[1] // vb.shape[1], 1)
        scores = qb @ kb.transpose(-1, -2) * self.scale
        i = torch.arange(s, dtype=torch.float64)
        if core_attention_bias_type == "alibi":
            scores = scores - alibi_slopes.double()[None, :, None, None] * (i[None] - i[:, None]).abs()
        elif core_attention_bias_type == "post_scale_bias":
            scores = scores + core_attention_bias.double()
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        out = torch.softmax(scores, dim=-1) @ vb
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


@pytest.fixture()
def fake_te(monkeypatch):
    te = types.ModuleType("transformer_engine")
    te_pytorch = types.ModuleType("transformer_engine.pytorch")
    te_pytorch.DotProductAttention = FakeTEDotProductAttention
    te.pytorch = te_pytorch
    ext = types.ModuleType("megatron.core.extensions.transformer_engine")
    ext.TEDotProductAttention = FakeTEDotProductAttention
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te_pytorch)
    monkeypatch.setitem(sys.modules, "megatron.core.extensions.transformer_engine", ext)
    FakeTEDotProductAttention.calls = []
    yield


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_te_gets_a_mask_type_honouring_the_structure(fake_te, case, alibi):
    from megatron.model.alibi import alibi_slopes
    from megatron.model.attention_backends import AttentionBackend, core_attention_spec
    from megatron.model.masks import attention_structure
    spec = core_attention_spec(AttentionBackend("te", "te", "explicit"), alibi=alibi)
    config = TransformerConfig(num_layers=1, hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS,
                               num_query_groups=GROUPS, use_cpu_initialization=True)
    core = spec.module(config, 1, AttnMaskType.causal, "self", **spec.params)
    seg, pre = random_batch(11, **CASES[case])
    q, k, v = qkv(11, 37, 3)
    structure = attention_structure(seg, pre)
    got = core(q, k, v, None, packed_seq_params=structure)
    call = FakeTEDotProductAttention.calls[0]  # the backend's call (the stand-in recurses for thd)
    if structure is None:
        assert call["attn_mask_type"] == "causal" and call["mask"] is None
    elif pre is None:  # segments only: TE's packed format, one sequence per segment
        assert (call["qkv_format"], call["attn_mask_type"]) == ("thd", "padding_causal")
        runs = [(n * 37 + a) for n in range(3) for a in range(37)
                if a == 0 or seg[n, a] != seg[n, a - 1]]
        assert call["cu_seqlens"].tolist() == runs + [3 * 37]
    else:  # never the plain causal mask when the batch has prefixes
        assert call["attn_mask_type"] == "arbitrary" and call["mask"].shape == (3, 1, 37, 37)
    if alibi:
        assert call["bias_type"] == ("post_scale_bias" if pre is not None else "alibi")
    allowed = reference_allowed(None if seg is None else seg.numpy(),
                                None if pre is None else pre.numpy(), 37).expand(3, 37, 37)
    want = naive_attention(q, k, v, allowed, 1 / math.sqrt(HEAD_DIM),
                           alibi_slopes(HEADS) if alibi else None)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------ T0 training: compact vs dense
class DenseReferenceAttention(torch.nn.Module):
    """Core attention that turns the batch's structure into the dense [b, 1, s, s] mask with its
    own rule (the pre-compact data loader's) and runs an explicit masked softmax."""

    def __init__(self, config, layer_number, attn_mask_type, attention_type, alibi=False, **kwargs):
        super().__init__()
        self.heads, self.groups = config.num_attention_heads, config.num_query_groups
        self.scale = 1 / math.sqrt(config.kv_channels)
        self.slopes = None
        if alibi:
            self.slopes = torch.tensor([2.0 ** (-8 * (h + 1) / self.heads) for h in range(self.heads)])

    def forward(self, q, k, v, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        s, b = q.shape[:2]
        seg, pre = packed_seq_params.segment_ids, packed_seq_params.is_prefix
        same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, :, None] > 0)
        allowed = same & torch.ones(s, s, dtype=torch.bool).tril()
        allowed |= same & pre[:, :, None] & pre[:, None, :]
        pad = (seg == 0)
        allowed |= pad[:, :, None] & torch.eye(s, dtype=torch.bool)  # padding: itself only
        rep = self.heads // self.groups
        qb = q.permute(1, 2, 0, 3)
        kb = k.permute(1, 2, 0, 3).repeat_interleave(rep, 1)
        vb = v.permute(1, 2, 0, 3).repeat_interleave(rep, 1)
        scores = qb @ kb.transpose(-1, -2) * self.scale
        if self.slopes is not None:
            i = torch.arange(s, dtype=torch.float32)
            scores = scores + self.slopes[None, :, None, None] * (i[None, :] - i[:, None])
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        return (torch.softmax(scores, dim=-1) @ vb).permute(2, 0, 1, 3).reshape(s, b, -1)


def t0_losses(model, batches, iterations):
    from megatron.model.masks import attention_structure_from_batch
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for it in range(iterations):
        batch = batches[it % len(batches)]
        per_token = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                          packed_seq_params=attention_structure_from_batch(batch))
        loss = (per_token * batch["loss_mask"]).sum() / batch["loss_mask"].sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("position", ["learned_absolute", "alibi"])
def test_t0_prefix_lm_losses_compact_equal_dense_reference(monkeypatch, position):
    """10 training iterations on packed --prefix-lm --norm-target-loss T0 batches: the compact
    path (SDPA backend) and the dense reference mask built from the same batches give the same
    losses."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    import megatron.model.gpt_model as gpt_model
    from helpers.models import gpt_model as build
    from megatron.config.parser import parse_args
    from megatron.data.mtf_dataset import pack_sample

    args = parse_args(["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
                       "--seq-length", "64", "--micro-batch-size", "4", "--train-iters", "10",
                       "--lr", "3e-3", "--transformer-impl", "local", "--hidden-dropout", "0",
                       "--attention-dropout", "0", "--position-embedding-type", position],
                      require_data=False)
    args.padded_vocab_size = 256
    rng = np.random.default_rng(0)
    batches = []
    for _ in range(5):
        samples = []
        for _ in range(4):
            pairs, used = [], 0
            while True:
                n_in, n_tg = int(rng.integers(1, 20)), int(rng.integers(1, 8))
                if used + n_in + n_tg > 60:
                    break
                pairs.append((rng.integers(0, 200, n_in), rng.integers(0, 200, n_tg)))
                used += n_in + n_tg
            samples.append(pack_sample(pairs, 64, 255, prefix_lm=True, norm_target_loss=True))
        batches.append({k: torch.stack([s[k] for s in samples]) for k in samples[0]})
    compact = t0_losses(build(args), batches, 10)
    monkeypatch.setattr(gpt_model, "core_attention_spec",
                        lambda backend, alibi: ModuleSpec(module=DenseReferenceAttention,
                                                          params={"alibi": alibi}))
    dense_model = build(args)
    assert any(isinstance(m, DenseReferenceAttention) for m in dense_model.modules())
    dense = t0_losses(dense_model, batches, 10)
    assert compact[-1] < compact[0] - 0.1  # it trains
    np.testing.assert_allclose(compact, dense, rtol=1e-5)


# ------------------------------------------------------------------ pretraining: --reset-attention-mask
def test_document_segments_wrap_train_and_eval_sets():
    from megatron.data.document_segments import with_document_segments
    from megatron.data.train_data import EvalGroup, TrainData

    class Samples(list):
        names = ["web"]

    eod = 2
    train = Samples([{"tokens": torch.tensor([5, 2, 7, 7, 2, 9]),
                      "attention_mask": torch.zeros(1, 6, 6, dtype=torch.bool)}])
    data = with_document_segments(TrainData(train, [EvalGroup("v", Samples(train))], ["web"]), eod)
    for ds in (data.train, data.eval_groups[0].dataset):
        sample = ds[0]
        assert "attention_mask" not in sample  # the dense mask never reaches the model
        assert sample["segment_ids"].tolist() == [1, 1, 2, 2, 2, 3] and len(ds) == 1
    assert data.train.names == ["web"] and data.dataset_names == ["web"]


@pytest.mark.parametrize("position", ["learned_absolute", "alibi"])
def test_flex_model_forward_equals_sdpa_model_on_cpu(monkeypatch, position):
    """Through the whole GPTModel (same weights): FlexAttention's logits (forward only, as CPU
    evaluation may run it) equal SDPA's on a packed prefix-LM batch."""
    import megatron.model.gpt_model as gpt_model
    from helpers.models import gpt_model as build
    from megatron.config.parser import parse_args
    from megatron.model.flex_attention import FlexCoreAttention
    from megatron.model.masks import attention_structure

    args = parse_args(["--num-layers", "2", "--hidden-size", "48", "--num-attention-heads", "6",
                       "--seq-length", "37", "--micro-batch-size", "3", "--train-iters", "1",
                       "--lr", "0", "--transformer-impl", "local", "--hidden-dropout", "0",
                       "--attention-dropout", "0", "--position-embedding-type", position],
                      require_data=False)
    args.padded_vocab_size = 128
    seg, pre = random_batch(5)
    tokens = torch.randint(0, 128, (3, 37), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(37).expand(3, 37)
    sdpa_model = build(args).eval()
    monkeypatch.setattr(gpt_model, "attention_backend",
                        lambda choice: resolve("flex", device="cpu", training=False))
    flex_model = build(args).eval()
    assert any(isinstance(m, FlexCoreAttention) for m in flex_model.modules())
    with torch.no_grad():
        want = sdpa_model(tokens, positions, None, packed_seq_params=attention_structure(seg, pre))
        got = flex_model(tokens, positions, None, packed_seq_params=attention_structure(seg, pre))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
