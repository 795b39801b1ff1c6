"""The one checkpoint package (megatron/checkpoint/): a Transformer Engine checkpoint reads, reshards,
exports and evaluates under the local spec's names through the one reader, and the offline writer
records ``param_index.json`` at every pipeline-parallel size, so an import at PP > 1 reshards."""
import json
import os
import shutil

import torch

from helpers.hf import FAMILIES, export, our_args, our_logits, our_model, read_safetensors, save_model, tokens

TE_NAMES = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
            "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias"}


def _te_name(name: str) -> str:
    for local, te in TE_NAMES.items():
        if name.endswith("." + local):
            return name[:-len(local)] + te
    return name


def _as_transformer_engine_checkpoint(src, dst):
    """A copy of the TP 2 checkpoint ``src`` as a Transformer Engine run writes it: the norm
    weights and biases under TE's fused names in the model files, and in ``param_index.json`` as
    both the local and the canonical name (the index records the live module's names)."""
    shutil.copytree(src, dst)
    directory = dst / "iter_0000000"
    for rank in range(2):
        path = directory / f"mp_rank_{rank:02d}_model_states.pt"
        saved = torch.load(path, weights_only=False)
        saved["module"] = {_te_name(k): v for k, v in saved["module"].items()}
        torch.save(saved, path)
    index = json.loads((directory / "param_index.json").read_text())
    for rank in index["ranks"]:
        params = {}
        for local, entry in rank["params"].items():
            te = _te_name(local)
            entry["canonical"] = te
            entry["weight"] = [entry["weight"][0], entry["weight"][1], te]
            params[te] = entry
        rank["params"] = params
        rank["groups"] = [[_te_name(n) for n in group] for group in rank["groups"]]
    (directory / "param_index.json").write_text(json.dumps(index))
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_bias" in index["ranks"][0]["params"]
    return dst


def test_a_transformer_engine_checkpoint_reads_reshards_exports_and_evaluates_as_local(
        tp1, tmp_path):
    from megatron.checkpoint.reader import CheckpointReader, CheckpointWeights
    from megatron.checkpoint.reshard import check_same_model

    args = our_args(FAMILIES["gpt2"])  # LayerNorm: TE fuses weight and bias
    model = our_model(args)
    save_model(model, args, tmp_path / "local", tp=2)
    te = _as_transformer_engine_checkpoint(tmp_path / "local", tmp_path / "te")
    ours = {n: p.detach() for n, p in model.named_parameters()}
    # the weights as stored, by the one reader (the export and the evaluation tasks read these)
    with CheckpointReader(str(te)) as reader:
        assert reader.names == list(ours)
        assert all(torch.equal(t, ours[n]) for n, t in reader.items())
    # what a resume on another layout reads (through the index), and the model check it passes
    saved = CheckpointReader.at(str(te / "iter_0000000"))
    assert set(saved.sources) == set(ours)
    for name, tensor in ours.items():
        assert torch.equal(saved.full(name), tensor.float()), name
    check_same_model(saved, list(model.named_parameters()), 1, str(te), set(ours))
    # the Hugging Face export: the same files as the local spec's checkpoint
    export(tmp_path / "local", tmp_path / "hf_local")
    export(te, tmp_path / "hf_te")
    local_files, te_files = read_safetensors(tmp_path / "hf_local"), read_safetensors(tmp_path / "hf_te")
    assert local_files.keys() == te_files.keys()
    assert all(torch.equal(local_files[k], te_files[k]) for k in local_files)
    # evaluation: the task's model filled from it scores as the original
    fresh = our_model(args, seed=1)
    with CheckpointWeights(str(te)) as weights:
        weights.copy_into(fresh)
    x = tokens()
    assert torch.equal(our_logits(fresh, x), our_logits(model, x))


def test_an_offline_write_at_pipeline_parallel_2_carries_the_index_resharding_reads(
        tp1, tmp_path):
    """write_checkpoint (the Hugging Face import's writer) at TP 2 x PP 2: ``param_index.json``
    names every parameter once, in the pipe layer files, with megatron-core's split, and a
    resume through it reads the full tensors."""
    from megatron.checkpoint.format import read_param_index
    from megatron.checkpoint.reader import CheckpointReader

    args = our_args(FAMILIES["llama"])  # SwiGLU (stride-2 fc1), untied output layer, GQA
    model = our_model(args)
    directory = save_model(model, args, tmp_path / "ckpt", tp=2, pp=2)
    index = read_param_index(directory)
    assert (index["tensor_model_parallel_size"], index["pipeline_model_parallel_size"]) == (2, 2)
    assert sorted((r["pp"], r["tp"]) for r in index["ranks"]) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for rank in index["ranks"]:
        for entry in rank["params"].values():
            assert os.path.isfile(os.path.join(directory, entry["weight"][0]))
            assert entry["weight"][0].startswith("layer_")
    stages = {r["pp"]: {e["canonical"] for e in r["params"].values()} for r in index["ranks"]
              if r["tp"] == 0}
    assert stages[0].isdisjoint(stages[1]) and stages[0] | stages[1] == set(dict(model.named_parameters()))
    assert "embedding.word_embeddings.weight" in stages[0] and "output_layer.weight" in stages[1]
    fc1 = next(e for r in index["ranks"] for e in r["params"].values()
               if e["canonical"] == "decoder.layers.0.mlp.linear_fc1.weight")
    assert (fc1["tp_dim"], fc1["tp_stride"]) == (0, 2)
    saved = CheckpointReader.at(directory)
    assert saved.optimizer_keys() == ([], None)  # weights only
    for name, param in model.named_parameters():
        assert torch.equal(saved.full(name), param.detach().float()), name
