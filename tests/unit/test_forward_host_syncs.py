"""No host synchronisation inside the model: forward and backward of every CPU backend and batch
layout run with the tensor methods that read a device tensor back to the host patched to raise.

On a GPU each of these (``item``, ``tolist``, ``cpu``, ``numpy``, truth values and Python numbers of
tensors, ``nonzero`` and reading through a boolean mask) waits for the device to drain. The loader's side
(the collate's segment layout, the transfer) runs before the patch, as in training; everything the
model does per micro batch runs inside it: GPTModel with SDPA (training) and FlexAttention (forward,
as CPU evaluation runs it), a GPTModelPipe stage (with and without recompute), and the Transformer
Engine wrapper's own logic around a stand-in kernel."""
import contextlib
import sys
import types
from unittest import mock

import pytest
import torch

from megatron.config.parser import parse_args


class HostSync(AssertionError):
    pass


def _refuse(name):
    def method(self, *args, **kwargs):
        raise HostSync(f"Tensor.{name} inside the model's forward/backward")
    return method


def _refuse_bool_index(real):
    def method(self, index, *args):
        parts = index if isinstance(index, tuple) else (index,)
        if any(torch.is_tensor(p) and p.dtype == torch.bool for p in parts):
            raise HostSync("boolean-mask indexing inside the model's forward/backward")
        return real(self, index, *args)
    return method


@contextlib.contextmanager
def no_host_syncs():
    """Patch every host-reading tensor operation to raise :class:`HostSync` for the block."""
    names = ["item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "nonzero"]
    with contextlib.ExitStack() as stack:
        for name in names:
            stack.enter_context(mock.patch.object(torch.Tensor, name, _refuse(name)))
        stack.enter_context(mock.patch.object(torch, "nonzero", _refuse("torch.nonzero")))
        # reading through a boolean mask sizes its result on the host; assigning a scalar
        # through one (megatron-core's cross entropy does) is masked_fill_, no sync
        stack.enter_context(mock.patch.object(
            torch.Tensor, "__getitem__", _refuse_bool_index(torch.Tensor.__getitem__)))
        yield


def test_the_patch_catches_host_syncs():
    t = torch.ones(3)
    for sync in (lambda: t.sum().item(), lambda: t.tolist(), lambda: t.cpu(), lambda: bool(t[0]),
                 lambda: t[t > 0], lambda: t.nonzero(), lambda: float(t[0])):
        with no_host_syncs(), pytest.raises(HostSync):
            sync()
    with no_host_syncs():
        assert torch.equal(t[1:], torch.ones(2))  # slicing is no sync


@pytest.fixture(scope="module")
def one_rank(one_rank_model_parallel):
    yield


FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
         "--seq-length", "40", "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
         "--transformer-impl", "local", "--hidden-dropout", "0.1"]


def model_args(*extra):
    args = parse_args(FLAGS + list(extra), world_size=1, require_data=False)
    args.padded_vocab_size = 128
    return args


def loader_batch(kind, seed=0):
    """A collated micro batch (what ``_loader`` yields): plain causal, packed segments, prefixes
    only, or packed prefix-LM segments (padding at the end of the second sample)."""
    from megatron.model.masks import with_segment_layout
    g = torch.Generator().manual_seed(seed)
    b, s = 2, 40
    tokens = torch.randint(0, 128, (b, s), generator=g)
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1),
             "loss_mask": torch.ones(b, s), "position_ids": torch.arange(s).expand(b, s).contiguous()}
    lengths = [[7, 20, 13], [3, 17, 9, 11]]
    if kind in ("packed", "packed_prefix"):
        seg = torch.zeros(b, s, dtype=torch.int32)
        for n, row in enumerate(lengths):
            pos = 0
            for k, length in enumerate(row[:-1] if n else row):  # sample 1 ends in padding (id 0)
                seg[n, pos:pos + length] = k + 1
                pos += length
        batch["segment_ids"] = seg
    if kind in ("prefix", "packed_prefix"):
        pre = torch.zeros(b, s, dtype=torch.bool)
        pre[:, 0:4] = pre[:, 9:15] = pre[:, 22:24] = True
        batch["is_prefix"] = pre
    return with_segment_layout(batch)


KINDS = ["causal", "packed", "prefix", "packed_prefix"]


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_gpt_model_sdpa_forward_backward_without_host_syncs(one_rank, kind, alibi):
    from helpers.models import gpt_model
    from megatron.model.lm_loss import masked_lm_loss
    from megatron.model.masks import attention_structure_from_batch
    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    extra = ["--attention-dropout", "0.1"] + (["--position-embedding-type", "alibi"] if alibi else [])
    model = gpt_model(model_args(*extra))
    model_parallel_manual_seed(1)
    batch = loader_batch(kind)
    structure = attention_structure_from_batch(batch)
    for _ in range(2):  # the second micro batch reuses the layers' shared forms
        with no_host_syncs():
            per_token = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"],
                              packed_seq_params=structure)
            loss, _ = masked_lm_loss(per_token, batch["loss_mask"])
            loss.backward()
    assert torch.isfinite(loss.detach()).all()


@pytest.mark.parametrize("kind", KINDS)
def test_gpt_model_flex_forward_without_host_syncs(one_rank, kind, monkeypatch):
    import megatron.model.gpt_model as gpt_model
    from helpers.models import gpt_model as build
    from megatron.model.attention_backends import resolve_attention_backend
    from megatron.model.masks import attention_structure_from_batch

    monkeypatch.setattr(gpt_model, "attention_backend", lambda choice: resolve_attention_backend(
        "flex", device_type="cpu", te_available=False, transformer_impl="local",
        structured_batches=True, attention_dropout=0.0, training=False))
    model = build(model_args("--attention-dropout", "0")).eval()
    batch = loader_batch(kind)
    with torch.no_grad(), no_host_syncs():
        out = model(batch["tokens"], batch["position_ids"], None,
                    packed_seq_params=attention_structure_from_batch(batch))
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("interval", [0, 1])
@pytest.mark.parametrize("kind", KINDS)
def test_pipe_stage_forward_backward_without_host_syncs(one_rank, kind, interval):
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from helpers.models import layer_spec
    from megatron.config.model_config import transformer_config_from_args
    from megatron.model.gpt_model_pipe import GPTModelPipe
    from megatron.model.pipe_io import pipe_batch
    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    args = model_args("--attention-dropout", "0.1")
    pipe = GPTModelPipe(transformer_config_from_args(args), layer_spec(args), 128,
                        args.max_position_embeddings,
                        PipeModelDataParallelTopology(num_pp=1, num_mp=1, num_dp=1),
                        activation_checkpoint_interval=interval)
    pipe._precompute_checkpointable_values()
    model_parallel_manual_seed(2)
    inputs, labels = pipe_batch(loader_batch(kind))  # what DeepSpeed's engine feeds the stage
    with no_host_syncs():
        loss = pipe.loss_fn(pipe(inputs), labels)
        loss.backward()
    pipe.loss_function.pop_records()
    assert torch.isfinite(loss.detach())


class _StandInTE(torch.nn.Module):
    """megatron-core's TEDotProductAttention / TE's DotProductAttention.forward stand-in: records the
    keyword arguments and returns zeros of TE's output shape (no kernel, so no sync of its own)."""

    calls = []

    def __init__(self, config, layer_number, attn_mask_type, attention_type, *args, **kwargs):
        super().__init__()
        self.config = config

    def forward(self, q, k, v, **kwargs):
        _StandInTE.calls.append(kwargs)
        return q.new_zeros(*q.shape[:-2], q.shape[-2] * q.shape[-1])


@pytest.mark.parametrize("alibi", [False, True])
@pytest.mark.parametrize("kind", KINDS)
def test_transformer_engine_wrapper_without_host_syncs(monkeypatch, kind, alibi):
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.model.attention_backends import AttentionBackend, core_attention_spec
    from megatron.model.masks import attention_structure_from_batch

    te = types.ModuleType("transformer_engine")
    te.pytorch = types.ModuleType("transformer_engine.pytorch")
    te.pytorch.DotProductAttention = _StandInTE
    ext = types.ModuleType("megatron.core.extensions.transformer_engine")
    ext.TEDotProductAttention = _StandInTE
    monkeypatch.setitem(sys.modules, "transformer_engine", te)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", te.pytorch)
    monkeypatch.setitem(sys.modules, "megatron.core.extensions.transformer_engine", ext)
    monkeypatch.setattr("megatron.core.parallel_state.get_tensor_model_parallel_world_size", lambda: 1)
    monkeypatch.setattr("megatron.core.parallel_state.get_tensor_model_parallel_rank", lambda: 0)
    _StandInTE.calls = []
    spec = core_attention_spec(AttentionBackend("te", "te", "explicit"), alibi=alibi)
    config = TransformerConfig(num_layers=1, hidden_size=32, num_attention_heads=4,
                               use_cpu_initialization=True)
    core = spec.module(config, 1, AttnMaskType.causal, "self", **spec.params)
    batch = loader_batch(kind)
    structure = attention_structure_from_batch(batch)
    q, k, v = (torch.randn(40, 2, 4, 8) for _ in range(3))
    with no_host_syncs():
        for _ in range(2):  # two layers' worth: the slopes and forms are built once
            out = core(q, k, v, None, packed_seq_params=structure)
    assert out.shape == (40, 2, 32)
    call = _StandInTE.calls[-1]
    if kind == "packed":
        layout = structure.layout
        assert call["qkv_format"] == "thd" and call["max_seqlen_q"] == layout.max_seqlen
        assert call["cu_seqlens_q"].tolist() == list(layout.starts) + [80]
    if alibi and kind in ("causal", "packed"):
        assert call["alibi_slopes"] is _StandInTE.calls[0]["alibi_slopes"]  # cached, not rebuilt
