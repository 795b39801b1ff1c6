"""Mixtral in and out of the Hugging Face converters (megatron/checkpoint/hf/).

In-process, fp32 on the CPU, tiny models: a RoPE/RMSNorm/SwiGLU mixture-of-experts checkpoint
(every layer MoE, top-k softmax router) exports to ``MixtralForCausalLM``, which gives the same
per-token log-probabilities (2e-3 nats); a random transformers Mixtral imports as an MoE
checkpoint (flags from ``--use-checkpoint-args`` alone) that scores as transformers does, trains
(router and experts get gradients), and exports back bit for bit, also when its experts are stored
in transformers' fused form; routers and layers transformers cannot represent are refused naming
the flag.
"""
import json

import pytest
import torch

from helpers.hf import (
    SHAPE,
    VOCAB,
    export,
    hf_mixtral,
    our_args,
    our_logits,
    our_model,
    read_safetensors,
    save_model,
    saved_perturbed,
    tokens,
)
from megatron.errors import ConfigError

TOLERANCE = 2e-3  # nats, per token


def mixtral_flags(topk=2, tied=False, extra=()):
    """Flags of a tiny Mixtral-style model: Llama layers (GQA, no biases), 4 experts of FFN 48 in
    every layer, top-``topk`` softmax routing."""
    flags = SHAPE + ["--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                     "--num-query-groups", "2", "--disable-bias-linear", "--rotary-base", "5000",
                     "--norm-epsilon", "1e-6", "--num-experts", "4", "--moe-router-topk",
                     str(topk), "--moe-ffn-hidden-size", "48"]
    return flags + ([] if tied else ["--untie-embeddings-and-output-weights"]) + list(extra)


def next_token_logprobs(logits, x):
    """``[batch, length - 1]`` log-probability each position gives the next token of ``x``."""
    logprobs = torch.log_softmax(logits.double(), dim=-1)[:, :-1]
    return logprobs.gather(-1, x[:, 1:, None])[..., 0]


def hf_logits(model, x):
    with torch.no_grad():
        return model(x).logits


# ---------------------------------------------------------------------------- export
@pytest.mark.parametrize("topk,tied,extra", [(2, False, []), (4, True, ["--moe-router-pre-softmax"])],
                         ids=["top2-untied", "top4-of-4-pre-softmax-tied"])
def test_exported_moe_scores_as_transformers_mixtral(tp1, tmp_path, topk, tied, extra):
    """Top-k of all 4 experts with --moe-router-pre-softmax: the gates are the whole softmax,
    which sums to 1 as Mixtral's renormalised ones do."""
    args = our_args(mixtral_flags(topk, tied, extra))
    model = our_model(args)
    save_model(model, args, tmp_path / "ckpt")
    summary = export(tmp_path / "ckpt", tmp_path / "hf")
    assert summary["family"] == "MixtralForCausalLM"
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {k: config[k] for k in ("num_local_experts", "num_experts_per_tok", "intermediate_size",
                                   "num_key_value_heads", "rope_theta", "rms_norm_eps",
                                   "tie_word_embeddings", "sliding_window")} == {
        "num_local_experts": 4, "num_experts_per_tok": topk, "intermediate_size": 48,
        "num_key_value_heads": 2, "rope_theta": 5000.0, "rms_norm_eps": 1e-6,
        "tie_word_embeddings": tied, "sliding_window": None}
    weights = read_safetensors(tmp_path / "hf")
    ours = dict(model.named_parameters())
    fc1 = ours["decoder.layers.1.mlp.experts.local_experts.3.linear_fc1.weight"]
    prefix = "model.layers.1.block_sparse_moe."
    assert torch.equal(weights[prefix + "experts.3.w1.weight"], fc1[:48])  # gate half
    assert torch.equal(weights[prefix + "experts.3.w3.weight"], fc1[48:])  # up half
    assert torch.equal(weights[prefix + "gate.weight"], ours["decoder.layers.1.mlp.router.weight"])
    hf, missed = hf_mixtral(tmp_path / "hf")
    assert not missed
    x = tokens(length=32)
    diff = (next_token_logprobs(our_logits(model, x), x) -
            next_token_logprobs(hf_logits(hf, x), x)).abs().max().item()
    assert diff < TOLERANCE, diff


# ---------------------------------------------------------------------------- import
def random_mixtral(directory, seed=5):
    """A random transformers ``MixtralForCausalLM`` of a tiny config (every weight perturbed, so
    norms are not ones), saved in ``directory`` (the Hub's per-expert tensors)."""
    import transformers

    torch.manual_seed(seed)
    config = transformers.MixtralConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=8, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=64, rope_parameters={"rope_type": "default", "rope_theta": 20000.0},
        rms_norm_eps=1e-5, tie_word_embeddings=False)
    model = transformers.MixtralForCausalLM(config)
    return saved_perturbed(model, directory)


def imported_model(load):
    """Our model of an imported checkpoint, flags from ``--use-checkpoint-args`` alone, loaded
    strictly from its model-states file."""
    args = our_args([], load=str(load))
    model = our_model(args)
    module = torch.load(load / "iter_0000000" / "mp_rank_00_model_states.pt",
                        weights_only=False)["module"]
    model.load_state_dict(module, strict=True)
    return args, model.eval()


def test_imported_mixtral_scores_trains_and_exports_back(tp1, tmp_path):
    from tools.checkpoint.convert_from_hf import convert as import_hf

    hf = random_mixtral(tmp_path / "hf")
    import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"))
    args, model = imported_model(tmp_path / "ckpt")
    assert (args.num_experts, args.moe_router_topk, args.moe_ffn_hidden_size) == (4, 2, 40)
    assert (args.moe_layer_freq, args.moe_router_pre_softmax, args.moe_router_score_function,
            args.moe_expert_capacity_factor, args.moe_shared_expert_intermediate_size) == \
        (1, False, "softmax", None, None)
    assert (args.num_query_groups, args.rotary_base, args.norm_epsilon) == (2, 20000, 1e-5)
    x = tokens(length=32)
    diff = (next_token_logprobs(our_logits(model, x), x) -
            next_token_logprobs(hf_logits(hf, x), x)).abs().max().item()
    assert diff < TOLERANCE, diff
    # it trains: a loss whose gradient reaches the router and the experts
    model.train()
    positions = torch.arange(x.shape[1]).expand_as(x)
    model(x, positions, None, labels=x).float().mean().backward()
    grads = {n: p.grad for n, p in model.named_parameters()}
    for name in ("decoder.layers.0.mlp.router.weight",
                 "decoder.layers.1.mlp.experts.local_experts.2.linear_fc1.weight"):
        assert grads[name] is not None and grads[name].abs().sum() > 0, name
    export(tmp_path / "ckpt", tmp_path / "out")
    original, back = read_safetensors(tmp_path / "hf"), read_safetensors(tmp_path / "out")
    assert original.keys() == back.keys()
    assert all(torch.equal(original[k], back[k]) for k in original)


def test_import_reads_transformers_fused_experts(tp1, tmp_path):
    """Weights saved as transformers >= 5 holds them in memory (``mlp.gate.weight``,
    ``mlp.experts.gate_up_proj`` [E, 2 x ffn, hidden], ``mlp.experts.down_proj``) import to the
    same checkpoint as the Hub's per-expert files."""
    from safetensors.torch import save_file

    from megatron.checkpoint.reader import load_full_state_dict
    from tools.checkpoint.convert_from_hf import convert as import_hf

    hf = random_mixtral(tmp_path / "hf")
    state = hf.state_dict()
    assert state["model.layers.0.mlp.experts.gate_up_proj"].shape == (4, 80, 64)
    (tmp_path / "fused").mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "fused" / "model.safetensors"))
    (tmp_path / "fused" / "config.json").write_text((tmp_path / "hf" / "config.json").read_text())
    import_hf(str(tmp_path / "hf"), str(tmp_path / "hub_ckpt"))
    import_hf(str(tmp_path / "fused"), str(tmp_path / "fused_ckpt"))
    hub, fused = (load_full_state_dict(str(tmp_path / d))[0] for d in ("hub_ckpt", "fused_ckpt"))
    assert hub.keys() == fused.keys()
    assert all(torch.equal(hub[k], fused[k]) for k in hub)


def test_import_refuses_what_this_model_cannot_build(tmp_path):
    from tools.checkpoint.convert_from_hf import convert as import_hf

    (tmp_path / "hf").mkdir()
    base = {"model_type": "mixtral", "max_position_embeddings": 64, "num_local_experts": 4}
    for config, message in (({"sliding_window": 16}, "sliding_window=16: attention here is over "
                             "the whole sequence"),
                            ({"num_experts_per_tok": 5}, "num_experts_per_tok=5"),
                            ({"num_experts_per_tok": 1}, "num_experts_per_tok=1: .*always 1"),
                            ({"attention_bias": True}, "attention_bias=True: Mixtral has no biases")):
        (tmp_path / "hf" / "config.json").write_text(json.dumps({**base, **config}))
        with pytest.raises(ConfigError, match=message):
            import_hf(str(tmp_path / "hf"), str(tmp_path / "ckpt"))


# ---------------------------------------------------------------------------- refusals
ROPE_MOE = ["--position-embedding-type", "rope", "--swiglu", "--num-experts", "4"]


@pytest.mark.parametrize("flags, message", [
    pytest.param(mixtral_flags(extra=["--moe-router-pre-softmax"]),
                 "--moe-router-pre-softmax: MixtralForCausalLM", id="pre-softmax"),
    pytest.param(mixtral_flags(topk=1, extra=["--moe-router-pre-softmax"]),
                 "--moe-router-pre-softmax: MixtralForCausalLM", id="pre-softmax-top1"),
    pytest.param(mixtral_flags(extra=["--moe-router-score-function", "sigmoid"]),
                 "--moe-router-score-function sigmoid: MixtralForCausalLM", id="sigmoid"),
    pytest.param(mixtral_flags(extra=["--moe-shared-expert-intermediate-size", "32"]),
                 "--moe-shared-expert-intermediate-size 32: .* it has no shared expert",
                 id="shared-expert"),
    pytest.param(mixtral_flags(extra=["--moe-layer-freq", "2"]), "--moe-layer-freq 2: ",
                 id="layer-freq-2"),
    pytest.param(mixtral_flags(extra=["--moe-layer-freq", "[0,1]"]),
                 r"--moe-layer-freq \[0, 1\]: ", id="layer-freq-list"),
    pytest.param(mixtral_flags(extra=["--moe-expert-capacity-factor", "1.0"]),
                 "--moe-expert-capacity-factor 1.0: .*dropless", id="token-dropping"),
    pytest.param(SHAPE + ["--num-experts", "4"], "--num-experts 4: GPT2LMHeadModel",
                 id="gpt2-style-moe"),
    pytest.param(SHAPE + ROPE_MOE + ["--disable-bias-linear"],
                 r"--normalization LayerNorm: MixtralForCausalLM \(Mixtral style, chosen by "
                 "--position-embedding-type rope with --num-experts\\)", id="layernorm-moe"),
    pytest.param(SHAPE + ROPE_MOE + ["--normalization", "RMSNorm"],
                 "no --disable-bias-linear: MixtralForCausalLM", id="biases"),
])
def test_export_refuses_routers_mixtral_cannot_represent(tp1, tmp_path, flags, message):
    args = our_args(flags)
    save_model(our_model(args), args, tmp_path / "ckpt")
    with pytest.raises(ConfigError, match=message):
        export(tmp_path / "ckpt", tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


@pytest.mark.parametrize("flags", [
    pytest.param(mixtral_flags(extra=["--moe-shared-expert-intermediate-size", "32",
                                      "--moe-layer-freq", "[0,1]"]), id="shared-expert-dense-first"),
    pytest.param(mixtral_flags(extra=["--moe-layer-freq", "[1,0]"]), id="dense-second"),
    pytest.param(SHAPE + ["--num-experts", "4", "--moe-ffn-hidden-size", "48"], id="biases"),
])
def test_canonical_moe_names_and_shapes_are_gpt_models(tp1, flags):
    """megatron/checkpoint/hf/families.py's canonical names and shapes of MoE models (routers,
    experts by global id, shared experts, dense layers between, router and expert biases) are the
    GPTModel's."""
    from megatron.checkpoint.hf.families import canonical_names, canonical_shapes
    from megatron.config.checkpoint_args import model_args_from_args

    args = our_args(flags)
    record = model_args_from_args(args)["model"]
    ours = {n: tuple(p.shape) for n, p in our_model(args).named_parameters()}
    assert sorted(canonical_names(record)) == sorted(ours)
    assert canonical_shapes(record, VOCAB) == ours
