"""Checkpoint interop: full model state from any layout (megatron/checkpoint/reader.py),
Hugging Face export/import (tools/checkpoint/convert_to_hf.py, convert_from_hf.py), recorded model
flags and --use-checkpoint-args (megatron/checkpoint/model_args.py).

In-process, fp32 on the CPU: our GPTModel and the exported transformers model give the same logits
(1e-4) for GPT-2, Llama and BLOOM style models; a checkpoint sharded TP2 x PP2 exactly as
megatron-core shards exports the same files as TP1; random transformers models imported score as
transformers does and export back bit for bit. The launch (--finetune from an imported checkpoint
with --use-checkpoint-args and no model flags): tests/e2e/test_hf_conversion_e2e.py.
"""
import json
import os

import pytest
import torch

from helpers.hf import (
    BASE,
    FAMILIES,
    SHAPE,
    VOCAB,
    export,
    our_args,
    our_logits,
    our_model,
    read_safetensors,
    save_model,
    saved_perturbed,
    tokens,
)
from megatron.config.parser import get_parser, parse_args
from megatron.errors import ArgumentError, ConfigError


def hf_logits(hf_dir, tokens):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


# ---------------------------------------------------------------------------- export
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_exported_model_gives_our_logits(tp1, tmp_path, family):
    args = our_args(FAMILIES[family])
    model = our_model(args)
    save_model(model, args, tmp_path / "ckpt")
    summary = export(tmp_path / "ckpt", tmp_path / "hf")
    expected = {"gpt2": "GPT2LMHeadModel", "llama": "LlamaForCausalLM", "bloom": "BloomForCausalLM"}
    assert summary["family"] == expected[family]
    x = tokens()
    ours, theirs = our_logits(model, x), hf_logits(tmp_path / "hf", x)
    assert ours.shape == theirs.shape == (2, 16, VOCAB)
    assert (ours - theirs).abs().max().item() < 1e-4


def test_tp2_pp2_checkpoint_exports_the_tp1_files(tp1, tmp_path):
    """Shards cut as megatron-core cuts them (the parameters' partition_dim/stride, as the
    layout-independent initializer draws them) in DeepSpeed's pipe files merge back to the TP1
    tensors, and the export (sharded into several safetensors files) is identical."""
    from megatron.checkpoint.reader import CheckpointReader
    from megatron.checkpoint.shards import split_full
    from megatron.model.init import _shard
    from megatron.model.param_names import tensor_parallel_partition

    args = our_args(FAMILIES["llama"])  # GQA, SwiGLU (strided fc1), untied output layer
    model = our_model(args)
    for name, param in model.named_parameters():
        partition = tensor_parallel_partition(name, gated=True)
        mine = split_full(param.detach(), *partition, 2) if partition else [param.detach()] * 2
        local = torch.empty(0)  # a rank's parameter under TP 2: megatron-core's attributes
        if getattr(param, "tensor_model_parallel", False):
            shape = list(param.shape)
            shape[param.partition_dim] //= 2
            local = torch.empty(shape)
            for attr in ("tensor_model_parallel", "partition_dim", "partition_stride"):
                setattr(local, attr, getattr(param, attr))
        core = [_shard(param.detach(), local, rank, 2) for rank in range(2)]
        assert all(torch.equal(a, b) for a, b in zip(mine, core, strict=True)), name
    save_model(model, args, tmp_path / "tp1")
    save_model(model, args, tmp_path / "tp2pp2", tp=2, pp=2)
    assert any(f.startswith("layer_03-model_01") for f in os.listdir(tmp_path / "tp2pp2" / "iter_0000000"))
    with CheckpointReader(str(tmp_path / "tp2pp2")) as reader:
        assert (reader.layout.tp, reader.layout.pp) == (2, 2)
        assert reader.model_args["model"]["num_query_groups"] == 2
        for name, tensor in reader.items():
            assert torch.equal(tensor, dict(model.named_parameters())[name].detach()), name
    export(tmp_path / "tp1", tmp_path / "hf1", max_shard_size="40KB")
    export(tmp_path / "tp2pp2", tmp_path / "hf2", max_shard_size="40KB")
    files = sorted(os.listdir(tmp_path / "hf1"))
    assert "model.safetensors.index.json" in files and files == sorted(os.listdir(tmp_path / "hf2"))
    one, two = read_safetensors(tmp_path / "hf1"), read_safetensors(tmp_path / "hf2")
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)
    x = tokens()
    assert (hf_logits(tmp_path / "hf2", x) - our_logits(model, x)).abs().max().item() < 1e-4


def test_transformer_engine_names_read_as_the_local_specs(tp1, tmp_path):
    """A checkpoint of Transformer Engine's layer spec (norms fused into linear_qkv/linear_fc1 as
    ``layer_norm_weight``, extra state holding tensors) reads under the local spec's names."""
    from megatron.checkpoint.reader import load_full_state_dict

    args = our_args(FAMILIES["llama"])
    model = our_model(args)
    save_model(model, args, tmp_path / "ckpt")
    path = tmp_path / "ckpt" / "iter_0000000" / "mp_rank_00_model_states.pt"
    saved = torch.load(path, weights_only=False)
    te = {}
    for key, value in saved["module"].items():
        key = key.replace("input_layernorm.weight", "self_attention.linear_qkv.layer_norm_weight")
        key = key.replace("pre_mlp_layernorm.weight", "mlp.linear_fc1.layer_norm_weight")
        te[key] = torch.zeros(3) if key.endswith("_extra_state") else value  # TE's fp8 metadata
    assert "decoder.layers.1.mlp.linear_fc1.layer_norm_weight" in te
    saved["module"] = te
    torch.save(saved, path)
    state, _ = load_full_state_dict(str(tmp_path / "ckpt"))
    ours = dict(model.named_parameters())
    assert state.keys() == ours.keys()
    assert all(torch.equal(state[n], ours[n].detach()) for n in ours)


# ---------------------------------------------------------------------------- import
def random_hf_model(family, directory):
    """A transformers model of ``family`` from a random tiny config, saved in ``directory``."""
    import transformers

    torch.manual_seed(5)
    if family == "gpt2":
        config = transformers.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=48, n_layer=2,
                                         n_head=4, n_inner=80, activation_function="gelu_new")
        model = transformers.GPT2LMHeadModel(config)
    elif family == "llama":
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                                          num_hidden_layers=2, num_attention_heads=8,
                                          num_key_value_heads=2, max_position_embeddings=64,
                                          rope_theta=20000.0, rms_norm_eps=1e-5,
                                          tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config)
    else:
        config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=48, n_layer=2, n_head=4)
        model = transformers.BloomForCausalLM(config)
    return saved_perturbed(model, directory)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_imported_model_scores_as_transformers_and_exports_back(tp1, tmp_path, family):
    from megatron.checkpoint.reader import load_full_state_dict
    from tools.checkpoint.convert_from_hf import convert as import_hf

    hf = random_hf_model(family, tmp_path / "hf")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    # --use-checkpoint-args: no model flag on the command line
    args = our_args([], load=str(tmp_path / "ckpt"))
    model = our_model(args)
    state, _ = load_full_state_dict(str(tmp_path / "ckpt"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing)
    x = tokens()
    with torch.no_grad():
        theirs = hf(x).logits
    assert (our_logits(model, x) - theirs).abs().max().item() < 1e-4
    # the imported checkpoint loads strictly into GPTModel (extra-state entries included)
    module = torch.load(tmp_path / "ckpt" / "iter_0000000" / "mp_rank_00_model_states.pt",
                        weights_only=False)["module"]
    our_model(args).load_state_dict(module, strict=True)
    export(tmp_path / "ckpt", tmp_path / "out")
    original, back = read_safetensors(tmp_path / "hf"), read_safetensors(tmp_path / "out")
    assert original.keys() == back.keys()
    assert all(torch.equal(original[k], back[k]) for k in original)


def test_import_reads_hub_style_gpt2_weights_from_pytorch_model_bin(tp1, tmp_path):
    """GPT-2 checkpoints on the Hub name tensors without the ``transformer.`` prefix, carry the
    attention-mask buffers, and some only have ``pytorch_model.bin``: imported all the same."""
    from safetensors.torch import load_file

    from megatron.checkpoint.reader import load_full_state_dict
    from tools.checkpoint.convert_from_hf import convert as import_hf

    hf = random_hf_model("gpt2", tmp_path / "hf")
    state = load_file(str(tmp_path / "hf" / "model.safetensors"))
    hub = {k[len("transformer."):] if k.startswith("transformer.") else k: v for k, v in state.items()}
    hub["h.0.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32))  # the old causal-mask buffer
    os.remove(tmp_path / "hf" / "model.safetensors")
    torch.save(hub, tmp_path / "hf" / "pytorch_model.bin")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    args = our_args([], load=str(tmp_path / "ckpt"))
    model = our_model(args)
    model.load_state_dict(load_full_state_dict(str(tmp_path / "ckpt"))[0], strict=False)
    x = tokens()
    with torch.no_grad():
        assert (our_logits(model, x) - hf(x).logits).abs().max().item() < 1e-4


def test_hf_tokenizer_travels_with_export_and_import(tp1, tmp_path, hf_tokenizer_dir):
    """A run with --tokenizer-type PretrainedFromHF exports its tokenizer files (transformers'
    AutoTokenizer then encodes as ours does); importing that directory records the copied
    tokenizer, which --use-checkpoint-args resolves inside the checkpoint."""
    from transformers import AutoTokenizer

    from megatron.config.tokenizer_flags import apply_tokenizer_setup
    from tools.checkpoint.convert_from_hf import convert as import_hf

    args = our_args(FAMILIES["bloom"] + ["--tokenizer-type", "PretrainedFromHF",
                                         "--tokenizer-name-or-path", hf_tokenizer_dir])
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    ours = setup.tokenizer
    args.padded_vocab_size = VOCAB * 2  # 512 rows >= the tokenizer's 384
    save_model(our_model(args), args, tmp_path / "ckpt")
    summary = export(tmp_path / "ckpt", tmp_path / "hf")
    assert "tokenizer.json" in summary["tokenizer_files"]
    text = "def main():\n    return 42  # the answer"
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf"))(text)["input_ids"] == ours.tokenize(text)
    import_hf(str(tmp_path / "hf"), str(tmp_path / "imported"))
    got = our_args([], load=str(tmp_path / "imported"))
    assert got.tokenizer_type == "PretrainedFromHF"
    assert got.tokenizer_name_or_path == str(tmp_path / "imported" / "tokenizer")
    got.padded_vocab_size = None
    setup = apply_tokenizer_setup(got)  # got.tokenizer, .padded_vocab_size, .vocab_size
    assert setup.tokenizer.tokenize(text) == ours.tokenize(text)
    # the export kept the tokenizer's 384 real rows of the 512 (the padding takes no probability)
    assert got.pad_vocab_size_to == 384 and got.padded_vocab_size == 384
    # the imported checkpoint exports again with its tokenizer (kept relative to its root)
    again = export(tmp_path / "imported", tmp_path / "hf_again")
    assert "tokenizer.json" in again["tokenizer_files"]
    assert AutoTokenizer.from_pretrained(str(tmp_path / "hf_again"))(text)["input_ids"] == \
        ours.tokenize(text)


# ---------------------------------------------------------------------------- model flags
def test_checkpoint_args_fill_model_flags_and_refuse_disagreeing_ones(tp1, tmp_path):
    args = our_args(FAMILIES["llama"])
    save_model(our_model(args), args, tmp_path / "ckpt")
    load = ["--load", str(tmp_path / "ckpt"), "--use-checkpoint-args"]
    got = our_args([], load=load[1])
    for name in ("num_layers", "hidden_size", "num_query_groups", "swiglu", "normalization",
                 "position_embedding_type", "rotary_base", "norm_epsilon", "ffn_hidden_size",
                 "untie_embeddings_and_output_weights", "disable_bias_linear"):
        assert getattr(got, name) == getattr(args, name), name
    # the same value given explicitly is fine; --seq-length may differ (not a model shape)
    same = parse_args(BASE + ["--hidden-size", "64", "--seq-length", "8"] + load, world_size=1,
                      require_data=False)
    assert same.seq_length == 8 and same.hidden_size == 64
    parser = get_parser()
    from megatron.config.checkpoint_args import apply_checkpoint_args
    for flags, named in ((["--hidden-size", "128"], "--hidden-size 128 (command line) vs "
                          "--hidden-size 64 (checkpoint)"),
                         (["--normalization", "LayerNorm"], "--normalization LayerNorm"),
                         (["--num-query-groups", "4"], "--num-query-groups 2 (checkpoint)"),
                         # an alias (Microsoft's script name) counts as the flag it stands for
                         (["--num-key-value-heads", "4"], "--num-query-groups 4 (command line) vs "
                          "--num-query-groups 2 (checkpoint)")):
        ns = parser.parse_args(BASE + flags + load)
        with pytest.raises(ArgumentError, match=named.replace("(", r"\(").replace(")", r"\)")):
            apply_checkpoint_args(ns, parser, BASE + flags + load)


def test_finetune_t0_takes_the_checkpoint_model_flags(tp1, tmp_path):
    """finetune_t0.py parses through the same hook: no model flag needed with --use-checkpoint-args."""
    import finetune_t0

    args = our_args(FAMILIES["bloom"])
    save_model(our_model(args), args, tmp_path / "ckpt")
    t0 = finetune_t0.parse_t0_args(BASE + [
        "--load", str(tmp_path / "ckpt"), "--finetune", "--use-checkpoint-args", "--prefix-lm",
        "--train-weighted-split-paths", "TRAIN: 1 0:1 data/p3"])
    assert (t0.position_embedding_type, t0.embed_layernorm, t0.openai_gelu) == ("alibi", True, True)
    assert (t0.num_layers, t0.hidden_size, t0.ffn_hidden_size) == (2, 64, 256) and t0.prefix_lm


def test_use_checkpoint_args_bad_inputs(tmp_path):
    from megatron.config.checkpoint_args import apply_checkpoint_args

    parser = get_parser()
    cases = [([], "--use-checkpoint-args needs --load DIR"),
             (["--load", str(tmp_path)], f"--load {tmp_path} holds no checkpoint")]
    (tmp_path / "old" / "iter_0000003").mkdir(parents=True)
    (tmp_path / "old" / "latest_checkpointed_iteration.txt").write_text("3\n")
    cases.append((["--load", str(tmp_path / "old")], "has no model_args.json"))
    for flags, message in cases:
        argv = BASE + SHAPE + ["--use-checkpoint-args"] + flags
        with pytest.raises(ArgumentError, match=message):
            apply_checkpoint_args(parser.parse_args(argv), parser, argv)
    (tmp_path / "old" / "iter_0000003" / "model_args.json").write_text('{"model": 3}')
    argv = BASE + ["--use-checkpoint-args", "--load", str(tmp_path / "old")]
    with pytest.raises(ConfigError, match="not a model_args.json record"):
        apply_checkpoint_args(parser.parse_args(argv), parser, argv)


# ---------------------------------------------------------------------------- bad inputs
@pytest.mark.parametrize("flags, message", [
    pytest.param(SHAPE + ["--position-embedding-type", "rope", "--swiglu"],
                 "--normalization LayerNorm: LlamaForCausalLM", id="rope-with-layernorm"),
    pytest.param(SHAPE + ["--position-embedding-type", "rope", "--normalization", "RMSNorm"],
                 "no --swiglu", id="rope-without-swiglu"),
    pytest.param(SHAPE + ["--position-embedding-type", "rope", "--normalization", "RMSNorm",
                          "--swiglu", "--rotary-percent", "0.5"], "--rotary-percent 0.5",
                 id="partial-rotary"),
    pytest.param(SHAPE + ["--num-query-groups", "2"], "--num-query-groups 2: GPT2LMHeadModel",
                 id="gpt2-with-gqa"),
    pytest.param(SHAPE + ["--disable-bias-linear"], "--disable-bias-linear", id="gpt2-without-bias"),
    pytest.param(SHAPE + ["--position-embedding-type", "alibi", "--openai-gelu"],
                 "no --embed-layernorm", id="alibi-without-embed-layernorm"),
    pytest.param(SHAPE + ["--position-embedding-type", "alibi", "--embed-layernorm",
                          "--no-bias-gelu-fusion"],
                 r"--no-bias-gelu-fusion \(erf GeLU\)", id="alibi-with-erf-gelu"),
    pytest.param(SHAPE + ["--position-embedding-type", "none"], "--position-embedding-type none",
                 id="no-positions"),
])
def test_export_refuses_what_transformers_cannot_represent(tp1, tmp_path, flags, message):
    args = our_args(flags)
    save_model(our_model(args), args, tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=message):
        export(tmp_path / "ckpt", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_export_bad_inputs(tp1, tmp_path):
    args = our_args(FAMILIES["gpt2"])
    save_model(our_model(args), args, tmp_path / "ckpt")
    with pytest.raises(ConfigError, match="--iteration 7: .*iter_0000007 does not exist"):
        export(tmp_path / "ckpt", tmp_path / "hf", iteration=7)
    with pytest.raises(ConfigError, match="--load .*nowhere: no such directory"):
        export(tmp_path / "nowhere", tmp_path / "hf")
    with pytest.raises(ConfigError, match="--max-shard-size '2 parsecs'"):
        export(tmp_path / "ckpt", tmp_path / "hf", max_shard_size="2 parsecs")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    with pytest.raises(ConfigError, match="--output .*full exists and is not empty"):
        export(tmp_path / "ckpt", tmp_path / "full")
    record_path = tmp_path / "ckpt" / "iter_0000000" / "model_args.json"
    record = json.loads(record_path.read_text())
    record["model"]["ffn_hidden_size"] = 300
    record_path.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"linear_fc1.weight in .* is \[256, 64\], its model flags "
                                          r"give \[300, 64\]"):
        export(tmp_path / "ckpt", tmp_path / "hf2")
    os.remove(record_path)
    with pytest.raises(ConfigError, match="has no model_args.json"):
        export(tmp_path / "ckpt", tmp_path / "hf")
    states = tmp_path / "ckpt" / "iter_0000000" / "mp_rank_00_model_states.pt"
    saved = torch.load(states, weights_only=False)
    saved["ds_config"] = {"zero_optimization": {"stage": 3}}
    torch.save(saved, states)
    with pytest.raises(ConfigError, match="written with ZeRO stage 3, which keeps no module weights"):
        export(tmp_path / "ckpt", tmp_path / "hf")
    (tmp_path / "ckpt" / "iter_0000000" / "mp_rank_00_model_states.pt").write_bytes(b"junk")
    with pytest.raises(ConfigError, match="mp_rank_00_model_states.pt is corrupt"):
        export(tmp_path / "ckpt", tmp_path / "hf")


def test_import_bad_inputs(tmp_path):
    from tools.checkpoint.convert_from_hf import convert as import_hf

    hf = tmp_path / "hf"
    hf.mkdir()
    with pytest.raises(ConfigError, match="no config.json"):
        import_hf(str(hf), str(tmp_path / "a"))
    bad = [({"model_type": "t5"}, "model_type 't5' is not supported"),
           ({"model_type": "llama", "hidden_act": "gelu"}, "hidden_act='gelu'"),
           ({"model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}},
            "rope_type 'dynamic': supported are default, linear, llama3 and yarn"),
           ({"model_type": "gpt2", "activation_function": "relu"}, "activation_function='relu'")]
    for config, message in bad:
        (hf / "config.json").write_text(json.dumps(config))
        with pytest.raises(ConfigError, match=message):
            import_hf(str(hf), str(tmp_path / "a"))
    random_hf_model("gpt2", tmp_path / "gpt2")
    with pytest.raises(ConfigError, match="--tensor-model-parallel-size 3 does not divide"):
        import_hf(str(tmp_path / "gpt2"), str(tmp_path / "b"), tp=3)
    os.remove(tmp_path / "gpt2" / "model.safetensors")
    with pytest.raises(ConfigError, match="no model.safetensors"):
        import_hf(str(tmp_path / "gpt2"), str(tmp_path / "b"))


# ---------------------------------------------------------------------------- default flags
def default_flag_args(*extra, load=None):
    """Validated args of a GPT with default flags (byte-level tokenizer, learned positions,
    GeLU by Megatron-LM's rule) and the tokenizer built: 258 real rows, 384 embedding rows."""
    from megatron.config.tokenizer_flags import apply_tokenizer_setup

    args = parse_args(BASE + SHAPE + list(extra) + (
        ["--load", load, "--use-checkpoint-args"] if load else []), world_size=1,
        require_data=False)
    apply_tokenizer_setup(args)
    return args


def test_default_flag_model_round_trip_scores_as_transformers(tp1, tmp_path):
    """A default-flag GPT (258 byte-level tokens in 384 rows, tanh GeLU) exported to transformers:
    config.json keeps the 258 real rows, gelu_new and the tokenizer's bos/eos; the choices of
    rank classification score the same in transformers (summed target log-probabilities, nats)
    within 2e-3, and the export imports back to the same scores."""
    import numpy as np
    from transformers import AutoModelForCausalLM

    from tasks.zero_shot_rank_classification import score_pairs
    from tools.checkpoint.convert_from_hf import convert as import_hf

    args = default_flag_args()
    assert (args.vocab_size, args.padded_vocab_size) == (258, 384)
    model = our_model(args)
    save_model(model, args, tmp_path / "ckpt")
    export(tmp_path / "ckpt", tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    eod = args.tokenizer.eod
    assert (config["vocab_size"], config["activation_function"]) == (258, "gelu_new")
    assert (config["bos_token_id"], config["eos_token_id"]) == (eod, eod)
    tok = args.tokenizer
    pairs = [(tok.tokenize(q), tok.tokenize(c)) for q in ("The sky is", "2 + 2 =")
             for c in (" blue", " green", " 4", " five")]  # each pair fits --seq-length 16
    ours = score_pairs(model, pairs, seq_length=16, pad_id=tok.pad)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.float32).eval()
    theirs = []
    for inp, tgt in pairs:
        ids = torch.tensor([inp + tgt])
        assert ids.shape[1] <= 16
        with torch.no_grad():
            logprobs = torch.log_softmax(hf(ids[:, :-1]).logits.float(), dim=-1)[0]
        positions = torch.arange(len(inp) - 1, ids.shape[1] - 1)  # predicting the target
        theirs.append(logprobs[positions, ids[0, positions + 1]].sum().item())
    assert np.abs(ours - np.array(theirs)).max() < 2e-3, (ours, theirs)
    import_hf(str(tmp_path / "hf"), str(tmp_path / "back"))
    back_args = our_args([], load=str(tmp_path / "back"))
    assert back_args.openai_gelu and back_args.checkpoint_model_args["vocab_size"] == 258
    from megatron.checkpoint.reader import load_full_state_dict

    back_args.vocab_size = 258
    back = our_model(back_args)
    back.load_state_dict(load_full_state_dict(str(tmp_path / "back"))[0], strict=False)
    np.testing.assert_allclose(score_pairs(back, pairs, seq_length=16, pad_id=tok.pad), theirs,
                               atol=2e-3)


@pytest.mark.parametrize("flags,form,hf_act", [
    ([], "tanh", "gelu_new"),                          # Megatron-LM's default: bias-GeLU fusion
    (["--no-bias-gelu-fusion"], "erf", "gelu"),
    (["--openai-gelu"], "tanh", "gelu_new"),
    (["--openai-gelu", "--no-bias-gelu-fusion"], "tanh", "gelu_new"),
])
def test_gelu_follows_megatron_lms_bias_gelu_rule(tp1, tmp_path, flags, form, hf_act):
    """GeLU is the tanh approximation by default (megatron-core's bias_gelu_impl, which
    Megatron-LM runs unless --no-bias-gelu-fusion), erf with --no-bias-gelu-fusion; the MLP
    computes it, the checkpoint records it and the export names it."""
    import torch.nn.functional as F

    from megatron.checkpoint.format import read_model_args
    from megatron.model.activations import mlp_activation
    from megatron.model.gelu import gelu_form

    args = default_flag_args(*flags)
    x = torch.linspace(-4, 4, 101)
    expected = F.gelu(x, approximate="tanh" if form == "tanh" else "none")
    torch.testing.assert_close(mlp_activation(args.swiglu, gelu_form(vars(args)))(x), expected,
                               rtol=0, atol=0)
    directory = save_model(our_model(args), args, tmp_path / "ckpt")
    assert gelu_form(read_model_args(directory)["model"]) == form
    export(tmp_path / "ckpt", tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["activation_function"] == hf_act


def test_gelu_without_biases_is_erf_and_old_checkpoints_keep_erf(tp1, tmp_path):
    """--disable-bias-linear turns the bias-GeLU fusion off (Megatron-LM's validate_args), so GeLU
    is erf; a checkpoint recorded before bias_gelu_fusion existed computed erf and
    --use-checkpoint-args keeps it."""
    from megatron.checkpoint.format import MODEL_ARGS_FILENAME
    from megatron.model.gelu import ERF, gelu_form

    assert gelu_form(vars(default_flag_args("--disable-bias-linear"))) == ERF
    args = default_flag_args()
    directory = save_model(our_model(args), args, tmp_path / "ckpt")
    path = os.path.join(directory, MODEL_ARGS_FILENAME)
    record = json.loads(open(path).read())
    del record["model"]["bias_gelu_fusion"], record["vocab_size"]
    with open(path, "w") as f:
        json.dump(record, f)
    old = our_args([], load=str(tmp_path / "ckpt"))
    assert old.bias_gelu_fusion is False and gelu_form(vars(old)) == ERF


def test_checkpoint_args_take_the_command_lines_tokenizer(tp1, tmp_path, hf_tokenizer_dir):
    """--use-checkpoint-args with tokenizer flags: the command line's win (Megatron-LM); the
    BigScience and Megatron-LM spellings of one Hugging Face tokenizer are the same tokenizer (no
    note), another tokenizer is noted, and one with more tokens than the checkpoint's embedding
    rows is one error naming both sizes. Model-shape flags stay strict."""
    from megatron.config.tokenizer_flags import apply_tokenizer_setup, tokenizer_setup_from_args
    from tools.checkpoint.convert_from_hf import convert as import_hf

    args = our_args(FAMILIES["gpt2"] + ["--tokenizer-type", "PretrainedFromHF",
                                        "--tokenizer-name-or-path", hf_tokenizer_dir])
    apply_tokenizer_setup(args)
    args.padded_vocab_size = 384  # the tokenizer's 384 tokens, no padding
    save_model(our_model(args), args, tmp_path / "ckpt")
    export(tmp_path / "ckpt", tmp_path / "hf")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "imported"))
    load = str(tmp_path / "imported")
    same = default_flag_args("--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                             os.path.join(load, "tokenizer"), load=load)
    assert same.tokenizer_type == "HuggingFaceTokenizer" and same.checkpoint_tokenizer_note is None
    assert not any("instead of the checkpoint's" in n for n in tokenizer_setup_from_args(same).notes)
    assert (same.padded_vocab_size, same.vocab_size) == (384, 384)
    # another tokenizer that fits (258 byte-level tokens in 384 rows): taken, and said so
    other = default_flag_args("--tokenizer-type", "ByteLevelTokenizer", load=load)
    assert other.tokenizer_type == "ByteLevelTokenizer"
    assert any(n.startswith("--use-checkpoint-args: tokenizer from the command line instead of "
                            "the checkpoint's (--tokenizer-type PretrainedFromHF")
               for n in tokenizer_setup_from_args(other).notes)
    assert other.vocab_size == 384  # the imported model's rows all take probability
    # a tokenizer larger than the checkpoint's rows: one error naming both sizes
    small = tmp_path / "small"
    save_model(our_model(our_args(FAMILIES["gpt2"])), our_args(FAMILIES["gpt2"]), small)
    with pytest.raises(ConfigError, match=r"the tokenizer has 258 tokens but the checkpoint in "
                                          r"--load .*small embeds 256 rows"):
        default_flag_args("--tokenizer-type", "ByteLevelTokenizer", load=str(small))
    with pytest.raises(SystemExit):  # model flags stay strict
        default_flag_args("--hidden-size", "128", load=load)
