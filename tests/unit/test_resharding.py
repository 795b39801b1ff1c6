"""Resharding a checkpoint to another layout (megatron/checkpoint/reshard.py), in process: the
tensor-parallel merge and split invert megatron-core's (strided SwiGLU fc1 included); Adam moments
of a TP 2 shard pair put together equal the TP 1 moments; padded vocabulary rows; a checkpoint of
another model is refused naming the parameter. The end-to-end resumes (TP 2 x PP 2 -> DP 2 and
PP 2) are in tests/e2e/test_pipeline_parallel.py."""
import json

import pytest
import torch

from megatron.checkpoint.reader import CheckpointReader
from megatron.checkpoint.reshard import check_same_model
from megatron.checkpoint.shards import merge_tp_shards, resize_vocab_rows, tp_shard
from megatron.errors import ReshardError
from megatron.model.init import _shard


def _like(shape, dim, stride):
    """A tensor carrying megatron-core's tensor-parallel attributes for a shard of ``shape``."""
    t = torch.empty(shape)
    t.tensor_model_parallel, t.partition_dim, t.partition_stride = True, dim, stride
    return t


@pytest.mark.parametrize("dim, stride, tp", [(0, 1, 2), (1, 1, 2), (0, 2, 2), (0, 2, 4), (1, 1, 4)])
def test_merge_and_split_invert_megatron_cores_split(dim, stride, tp):
    full = torch.randn(16, 8)
    local_shape = list(full.shape)
    local_shape[dim] //= tp
    like = _like(local_shape, dim, stride)
    shards = [_shard(full, like, r, tp) for r in range(tp)]  # what megatron-core's ranks hold
    assert torch.equal(merge_tp_shards(shards, dim, stride), full)
    for r in range(tp):
        assert torch.equal(tp_shard(full, dim, stride, r, tp), shards[r])
    if stride == 2 and dim == 0:  # SwiGLU fc1: rank r holds [gate_r; up_r]
        gate, up = full.chunk(2)
        assert torch.equal(shards[0], torch.cat([gate.chunk(tp)[0], up.chunk(tp)[0]]))


def test_replicated_parameters_are_not_split():
    norm = torch.randn(8)
    assert merge_tp_shards([norm, norm.clone()], None) is norm
    assert tp_shard(norm, None, 1, 1, 2) is norm


def test_adam_moments_of_a_tp2_shard_pair_are_the_tp1_moments():
    """AdamW over a TP 1 fc1 weight and over its two TP 2 (stride 2) shards, same gradients: the
    merged shard moments equal the TP 1 moments, and splitting the TP 1 state gives each shard's."""
    torch.manual_seed(0)
    full = torch.nn.Parameter(torch.randn(8, 4))
    shards = [torch.nn.Parameter(tp_shard(full.detach(), 0, 2, r, 2).clone()) for r in range(2)]
    opt_full = torch.optim.AdamW([full], lr=1e-2)
    opt_shards = torch.optim.AdamW(shards, lr=1e-2)
    for _ in range(3):
        grad = torch.randn(8, 4)
        full.grad = grad
        for r, s in enumerate(shards):
            s.grad = tp_shard(grad, 0, 2, r, 2)
        opt_full.step()
        opt_shards.step()
    for key in ("exp_avg", "exp_avg_sq"):
        merged = merge_tp_shards([opt_shards.state[s][key] for s in shards], 0, 2)
        torch.testing.assert_close(merged, opt_full.state[full][key], rtol=1e-6, atol=0)
        assert merged.abs().sum() > 0
    torch.testing.assert_close(merge_tp_shards([s.detach() for s in shards], 0, 2), full.detach())


def test_padded_vocabulary_rows_keep_every_token_row():
    full = torch.arange(12.0).view(6, 2)
    assert torch.equal(resize_vocab_rows(full, 4), full[:4])
    grown = resize_vocab_rows(full, 8)
    assert torch.equal(grown[:6], full) and torch.equal(grown[6:], torch.zeros(2, 2))


def _saved(params, tp=2):
    """A CheckpointReader over an index only (no files are read by the model check)."""
    index = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1,
             "data_parallel_size": 1, "zero_stage": 0, "optimizer_format": "torch",
             "ranks": [{"tp": t, "pp": 0, "dp": 0, "model_states_file": "m.pt",
                        "optimizer_file": "m.pt", "groups": [list(params)],
                        "params": {n: dict(p, canonical=n, weight=["m.pt", "module", n])
                                   for n, p in params.items()}} for t in range(tp)]}
    return CheckpointReader.at("/ckpt/iter_0000010", index)


SAVED = {"embedding.word_embeddings.weight": {"shape": [130, 64], "tp_dim": 0, "tp_stride": 1},
         "decoder.layers.0.mlp.linear_fc1.weight": {"shape": [128, 64], "tp_dim": 0,
                                                    "tp_stride": 2},
         "decoder.final_layernorm.weight": {"shape": [64], "tp_dim": None, "tp_stride": 1}}


def _here(fc1_rows=256, vocab_rows=256):
    """This run's parameters at TP 1 (canonical names)."""
    return [("embedding.word_embeddings.weight", _like([vocab_rows, 64], 0, 1)),
            ("decoder.layers.0.mlp.linear_fc1.weight", _like([fc1_rows, 64], 0, 2)),
            ("decoder.final_layernorm.weight", torch.empty(64))]


def test_same_model_on_another_layout_passes_padded_vocab_may_differ():
    saved = _saved(SAVED)
    assert saved.full_shape("decoder.layers.0.mlp.linear_fc1.weight") == (256, 64)
    check_same_model(saved, _here(vocab_rows=260), 1, "/ckpt", set(SAVED))  # no error


def test_another_model_is_refused_naming_the_parameter_and_flags():
    with pytest.raises(ReshardError) as e:
        check_same_model(_saved(SAVED), _here(fc1_rows=512), 1, "/ckpt", set(SAVED))
    assert ("--load /ckpt: checkpoint /ckpt/iter_0000010 holds another model than this run builds "
            "(decoder.layers.0.mlp.linear_fc1.weight is [256, 64] there and [512, 64] here)"
            ) in str(e.value)
    assert "--ffn-hidden-size" in str(e.value)


def test_a_checkpoint_with_parameters_this_model_lacks_is_refused():
    saved = _saved(dict(SAVED, **{"output_layer.weight": {"shape": [130, 64], "tp_dim": 0,
                                                          "tp_stride": 1}}))
    with pytest.raises(ReshardError, match="output_layer.weight is not in this model"):
        check_same_model(saved, _here(), 1, "/ckpt", set(SAVED))


def test_universal_checkpoint_needs_the_param_index(tmp_path):
    from megatron.checkpoint.engine import load_checkpoint
    from megatron.errors import CheckpointError

    directory = tmp_path / "iter_0000004"
    directory.mkdir()
    (directory / "mp_rank_00_model_states.pt").write_bytes(b"")
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4\n")
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(engine=None, load_dir=str(tmp_path), universal=True)
    assert str(e.value) == (f"--universal-checkpoint: checkpoint {directory} has no "
                            "param_index.json (written before checkpoints carried one); load it "
                            "without --universal-checkpoint on the layout it was saved with")


class FP16_UnfusedOptimizer:  # noqa: N801 (DeepSpeed's class name is what the message shows)
    """Stands for DeepSpeed's stage-0 fp16 wrapper (older fp16/bf16 checkpoints), whose state is
    not in a reshardable form."""

    refreshed = 0

    def refresh_fp32_params(self):
        self.refreshed += 1


def test_unreshardable_optimizer_is_refused_naming_it():
    from types import SimpleNamespace

    from megatron.checkpoint.reshard import load_resharded

    engine = SimpleNamespace(module=torch.nn.Linear(2, 2), optimizer=FP16_UnfusedOptimizer())
    with pytest.raises(ReshardError) as e:
        load_resharded(engine, _saved(SAVED), "/ckpt", load_optimizer=True)
    assert str(e.value) == (
        "--load /ckpt: this run keeps its optimizer state in DeepSpeed's FP16_UnfusedOptimizer; "
        "resuming on another layout with the optimizer state needs fp32 training at ZeRO stage 0, "
        "DeepSpeed's ZeRO stage 1/2 optimizer or its BF16_Optimizer (docs/precision.md) (or use "
        "--no-load-optim)")


def test_checkpoint_without_index_resumes_only_on_its_own_split(tmp_path):
    """Checkpoints written before param_index.json existed keep the old same-split check."""
    from megatron.checkpoint.engine import check_same_model_split
    from megatron.checkpoint.format import write_layout
    from megatron.errors import CheckpointError
    from megatron.parallel.topology import ParallelLayout

    write_layout(str(tmp_path), ParallelLayout(tp=2, pp=1, dp=1, world=2))
    check_same_model_split(str(tmp_path), "/ckpt", ParallelLayout(tp=2, pp=1, dp=2, world=4))
    with pytest.raises(CheckpointError) as e:
        check_same_model_split(str(tmp_path), "/ckpt", ParallelLayout(tp=1, pp=1, dp=1, world=1))
    assert str(e.value) == (
        f"--load /ckpt: checkpoint {tmp_path} was saved with tensor-parallel 2, "
        "pipeline-parallel 1, data-parallel 1 and this run has tensor-parallel 1, "
        "pipeline-parallel 1, data-parallel 1; "
        "it has no param_index.json (written before checkpoints carried one), so it resumes only "
        "on its own split (use --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1)")


# ------------------------------------------------------------------ load_resharded in process
def _module(shapes):
    """A module whose parameters have the given dotted names and shapes, with megatron-core's
    tensor-parallel attributes where ``tp_dim`` is set."""
    root = torch.nn.Module()
    for name, (shape, dim, stride) in shapes.items():
        *path, leaf = name.split(".")
        node = root
        for part in path:
            if not hasattr(node, part):
                node.add_module(part, torch.nn.Module())
            node = getattr(node, part)
        param = torch.nn.Parameter(torch.zeros(shape))
        if dim is not None:
            param.tensor_model_parallel = True
            param.partition_dim, param.partition_stride = dim, stride
        node.register_parameter(leaf, param)
    return root


def _write_tp2_checkpoint(directory, full, step=5.0, tp=2):
    """A ZeRO-0 (torch AdamW) checkpoint of ``tp`` tensor-parallel ranks holding the shards of the
    ``full`` {name: (weight, exp_avg, exp_avg_sq, dim, stride)} tensors; returns its index."""
    names = list(full)
    ranks = []
    for r in range(tp):
        shard = {n: [tp_shard(t, d, s, r, tp) if d is not None else t for t in full[n][:3]]
                 for n, (*_, d, s) in full.items()}
        model_file = f"mp_rank_{r:02d}_model_states.pt"
        torch.save({"module": {n: v[0] for n, v in shard.items()},
                    "optimizer": {"state": {i: {"step": torch.tensor(step), "exp_avg": shard[n][1],
                                                "exp_avg_sq": shard[n][2]}
                                            for i, n in enumerate(names)}, "param_groups": []},
                    "megatron_training_state": {"iteration": 7, "consumed_samples": 56}},
                   directory / model_file)
        ranks.append({"tp": r, "pp": 0, "dp": 0, "model_states_file": model_file,
                      "optimizer_file": model_file, "groups": [names],
                      "params": {n: {"canonical": n, "shape": list(shard[n][0].shape),
                                     "tp_dim": full[n][3], "tp_stride": full[n][4],
                                     "weight": [model_file, "module", n]} for n in names}})
    return {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": 1,
            "data_parallel_size": 1, "zero_stage": 0, "optimizer_format": "torch", "ranks": ranks}


@pytest.fixture
def tp1_parallel_state(dist_group):
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


@pytest.mark.parametrize("vocab_rows", [6, 8, 12])
def test_load_resharded_tp2_checkpoint_into_tp1_model_and_adam(tmp_path, tp1_parallel_state,
                                                                vocab_rows):
    """Weights, Adam moments and step of a TP 2 checkpoint land merged in a TP 1 model and its
    torch AdamW; the vocabulary (8 padded rows saved) is cut to 6 or grown to 12 with zeros."""
    from types import SimpleNamespace

    from megatron.checkpoint.reshard import load_resharded

    torch.manual_seed(3)
    full = {"embedding.word_embeddings.weight": (*torch.randn(3, 8, 4), 0, 1),
            "decoder.layers.0.mlp.linear_fc1.weight": (*torch.randn(3, 8, 4), 0, 2),
            "decoder.layers.0.mlp.linear_fc2.weight": (*torch.randn(3, 4, 4), 1, 1),
            "decoder.final_layernorm.weight": (*torch.randn(3, 4), None, 1)}
    index = _write_tp2_checkpoint(tmp_path, full)
    shapes = {n: ((vocab_rows, 4) if "word" in n else tuple(v[0].shape), v[3], v[4])
              for n, v in full.items()}
    module = _module(shapes)
    engine = SimpleNamespace(module=module, optimizer=torch.optim.AdamW(module.parameters()),
                             zero_optimization_stage=lambda: 0)
    saved = CheckpointReader.at(str(tmp_path), index)
    lines = []
    load_resharded(engine, saved, str(tmp_path), load_optimizer=True, log=lines.append)
    assert saved.client_state("megatron_training_state")["iteration"] == 7
    assert lines == [f"resharded {tmp_path} (tensor-parallel 2, pipeline-parallel 1, data-parallel "
                     "1, ZeRO stage 0) to tensor-parallel 1, pipeline-parallel 1, data-parallel 1, "
                     "ZeRO stage 0"]
    for name, p in module.named_parameters():
        state = engine.optimizer.state[p]
        assert float(state["step"]) == 5.0
        for value, expected in zip((p.detach(), state["exp_avg"], state["exp_avg_sq"]), full[name], strict=False):
            if "word" in name:
                kept = min(vocab_rows, 8)
                assert torch.equal(value[:kept], expected[:kept])
                assert torch.equal(value[kept:], torch.zeros(vocab_rows - kept, 4))
            else:
                assert torch.equal(value, expected), name


def test_universal_checkpoint_loads_a_same_layout_checkpoint_through_resharding(
        tmp_path, tp1_parallel_state):
    """--universal-checkpoint on the layout the checkpoint was written with: the resharding path
    (not DeepSpeed's loader, which this stand-in engine lacks) restores weights and state."""
    from types import SimpleNamespace

    from megatron.checkpoint.engine import load_checkpoint
    from megatron.config.parser import get_parser

    assert get_parser().parse_args(["--universal-checkpoint"]).universal_checkpoint
    assert not get_parser().parse_args([]).universal_checkpoint
    full = {"decoder.layers.0.mlp.linear_fc1.weight": (*torch.randn(3, 8, 4), 0, 2)}
    directory = tmp_path / "iter_0000007"
    directory.mkdir()
    index = _write_tp2_checkpoint(directory, full, tp=1)
    (directory / "param_index.json").write_text(json.dumps(index))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7\n")
    module = _module({n: (tuple(v[0].shape), v[3], v[4]) for n, v in full.items()})
    engine = SimpleNamespace(module=module, optimizer=torch.optim.AdamW(module.parameters()),
                             zero_optimization_stage=lambda: 0)
    state = load_checkpoint(engine, str(tmp_path), universal=True, load_rng=False)
    assert (state.iteration, state.consumed_samples) == (7, 56)
    assert (engine.global_steps, engine.global_samples) == (7, 56)
    p = next(module.parameters())
    assert torch.equal(p.detach(), full["decoder.layers.0.mlp.linear_fc1.weight"][0])
    assert torch.equal(engine.optimizer.state[p]["exp_avg"],
                       full["decoder.layers.0.mlp.linear_fc1.weight"][1])


def test_weights_only_into_a_bf16_wrapper_refreshes_its_fp32_masters(tmp_path, tp1_parallel_state):
    """--no-load-optim into DeepSpeed's fp16/bf16 wrapper: the weights load and the wrapper's fp32
    master copies are refreshed from them (else its next step would restore the initial weights)."""
    from types import SimpleNamespace

    from megatron.checkpoint.reshard import load_resharded

    full = {"decoder.final_layernorm.weight": (*torch.randn(3, 4), None, 1)}
    index = _write_tp2_checkpoint(tmp_path, full)
    module = _module({"decoder.final_layernorm.weight": ((4,), None, 1)})
    engine = SimpleNamespace(module=module, optimizer=FP16_UnfusedOptimizer(),
                             zero_optimization_stage=lambda: 0)
    load_resharded(engine, CheckpointReader.at(str(tmp_path), index), str(tmp_path),
                   load_optimizer=False, log=lambda line: None)
    weight = full["decoder.final_layernorm.weight"][0]
    assert torch.equal(next(module.parameters()).detach(), weight)
    assert engine.optimizer.refreshed == 1
