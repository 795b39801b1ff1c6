"""Mixture of experts (megatron-core's MoE layer, megatron/model/moe.py, megatron/config/moe_flags.py,
megatron/parallel/experts.py), in process: the router against a naive top-k, the load-balancing
loss against its formula, the flags (Megatron-LM's, Microsoft's translations, the refused ones).
Expert gradients reduced over their expert-data-parallel group only (4 CPU ranks), and EP 2 /
TP 2 x EP 2 training through the launcher against one rank: tests/e2e/test_moe_e2e.py."""
import pytest
import torch

from helpers.flags import TINY_RUN, one_error_line, parse

MOE = ["--num-experts", "4"]
# ------------------------------------------------------------------ router and aux loss
@pytest.fixture
def router_factory(one_rank_model_parallel):
    """``make(**config fields) -> MoERouter`` of 6 experts over hidden 16, weights drawn from seed 0."""
    from megatron.core.transformer.moe.moe_utils import get_default_pg_collection
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.model.moe import MoERouter

    def make(**fields):
        config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                                   num_moe_experts=6, use_cpu_initialization=True,
                                   add_bias_linear=False, **fields)
        torch.manual_seed(0)
        router = MoERouter(config=config, pg_collection=get_default_pg_collection())
        router.set_layer_number(1)
        return router
    return make


def _naive_topk(logits, k, pre_softmax):
    """Reference routing: softmax over every expert then the top k (``pre_softmax``, the gate is
    the probability), or the top k logits then a softmax over them (Mixtral's renormalised
    top-k); returns dense probabilities [tokens, experts] and the boolean routing map."""
    if pre_softmax:
        probs = torch.softmax(logits, dim=-1)
        values, index = probs.topk(k, dim=-1)
    else:
        values, index = logits.topk(k, dim=-1)
        values = torch.softmax(values, dim=-1)
    dense = torch.zeros_like(logits).scatter(1, index, values)
    return dense, torch.zeros_like(logits, dtype=torch.bool).scatter(1, index, True)


@pytest.mark.parametrize("k, pre_softmax", [(1, True), (2, False), (2, True), (3, False)])
def test_router_equals_a_naive_top_k(router_factory, k, pre_softmax):
    router = router_factory(moe_router_topk=k, moe_router_pre_softmax=pre_softmax)
    hidden = torch.randn(5, 2, 16, generator=torch.Generator().manual_seed(1))
    router.eval()
    with torch.no_grad():
        probs, routing_map = router(hidden)
    logits = hidden.view(-1, 16) @ router.weight.t()
    want_probs, want_map = _naive_topk(logits, k, pre_softmax)
    assert torch.equal(routing_map, want_map)
    torch.testing.assert_close(probs, want_probs, rtol=1e-6, atol=1e-7)


def test_input_jitter_perturbs_training_routing_only(router_factory):
    """--moe-input-jitter-eps multiplies the router input by U(1 - eps, 1 + eps) noise in training
    (a new draw each forward); in eval mode the input, hence the routing, is unchanged."""
    router = router_factory(moe_router_topk=2, moe_input_jitter_eps=0.5)
    hidden = torch.randn(5, 2, 16, generator=torch.Generator().manual_seed(3))
    router.train()
    first, second = (router.apply_input_jitter(hidden) / hidden for _ in range(2))
    for ratio in (first, second):
        assert 0.5 <= ratio.min() < 0.6 and 1.4 < ratio.max() <= 1.5
    assert not torch.equal(first, second)
    router.eval()
    assert torch.equal(router.apply_input_jitter(hidden), hidden)
    with torch.no_grad():
        probs, routing_map = router(hidden)
    want_probs, want_map = _naive_topk(hidden.view(-1, 16) @ router.weight.t(), 2, False)
    assert torch.equal(routing_map, want_map)
    torch.testing.assert_close(probs, want_probs, rtol=1e-6, atol=1e-7)


def test_load_balancing_loss_equals_its_formula(router_factory):
    """Switch/GShard: E * sum_i f_i * P_i with f_i the fraction of the k * T assignments that go to
    expert i and P_i its mean probability over the T tokens; the tracker keeps it without the
    coefficient, and the tokens per expert the router counts are the routing map's."""
    from megatron.runtime.mcore_compat import clear_moe_metrics, moe_metric_entries

    k, experts, coeff = 2, 6, 0.01
    router = router_factory(moe_router_topk=k, moe_aux_loss_coeff=coeff)
    router.train()
    clear_moe_metrics()
    hidden = torch.randn(7, 3, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    _, routing_map = router(hidden)
    logits = (hidden.view(-1, 16) @ router.weight.t()).detach()
    tokens = logits.shape[0]
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.zeros_like(probs).scatter(1, logits.topk(k, dim=-1).indices, 1.0)
    f = chosen.sum(0) / (k * tokens)
    p = probs.mean(0)
    want = experts * (f * p).sum()
    got = moe_metric_entries()["load_balancing_loss"].values[0]
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert want.item() >= 1.0 - 1e-6  # the loss is at least 1, equal at perfect balance
    counts, forwards = router.take_tokens_per_expert()
    assert counts.tolist() == routing_map.sum(0).double().tolist() and forwards == 1
    assert router.take_tokens_per_expert() == (None, 0)
    clear_moe_metrics()


def test_biased_experts_train_at_expert_parallel_1_with_the_gated_bias(one_rank_model_parallel):
    """Default flags give the experts biases; megatron-core adds an expert's fc2 bias times the
    token's gate in place, which its own layer forbids at EP 1 (megatron/model/moe.py
    ExpertRowParallelLinear). The layer trains there, and d sum(output) / d bias of expert e is
    the sum of the gates of the tokens routed to e."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_config import TransformerConfig

    from megatron.model.moe import ExpertRowParallelLinear, use_moe_router
    from megatron.runtime.mcore_compat import build_submodule, clear_moe_metrics

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               ffn_hidden_size=32, num_moe_experts=4, moe_router_topk=2,
                               use_cpu_initialization=True, add_bias_linear=True)
    spec = use_moe_router(get_gpt_layer_local_spec(num_experts=4))
    torch.manual_seed(0)
    layer = build_submodule(spec.submodules.mlp, config, layer_number=1)
    layer.train()
    hidden = torch.randn(5, 2, 16, generator=torch.Generator().manual_seed(3), requires_grad=True)
    output, _ = layer(hidden)
    output.sum().backward()
    with torch.no_grad():
        probs, routing_map = layer.router(hidden)
    gates = (probs * routing_map).sum(0)  # [experts]: each expert's summed gate
    for e, expert in enumerate(layer.experts.local_experts):
        torch.testing.assert_close(expert.linear_fc2.bias.grad,
                                   torch.full((16,), gates[e].item()), rtol=1e-5, atol=1e-6)
    assert hidden.grad is not None and hidden.grad.abs().sum() > 0
    assert all(isinstance(e.linear_fc2, ExpertRowParallelLinear)
               for e in layer.experts.local_experts)
    clear_moe_metrics()


# ------------------------------------------------------------------ flags
def test_megatron_lm_flags_reach_the_transformer_config():
    args = parse(MOE + ["--moe-router-topk", "1", "--moe-aux-loss-coeff", "0.02",
                        "--moe-ffn-hidden-size", "96", "--moe-layer-freq", "([1]+[0])*2",
                        "--num-layers", "4", "--moe-z-loss-coeff", "1e-3",
                        "--moe-expert-capacity-factor", "1.5", "--moe-token-drop-policy",
                        "position", "--moe-router-pre-softmax",
                        "--moe-shared-expert-intermediate-size", "64"])
    c = args.transformer_config
    assert (c.num_moe_experts, c.moe_router_topk, c.moe_aux_loss_coeff, c.moe_ffn_hidden_size) == \
        (4, 1, 0.02, 96)
    assert c.moe_layer_freq == [1, 0, 1, 0] and c.moe_z_loss_coeff == 1e-3
    assert (c.moe_expert_capacity_factor, c.moe_token_drop_policy) == (1.5, "position")
    assert c.moe_router_pre_softmax and c.moe_shared_expert_intermediate_size == 64
    dense = parse([]).transformer_config
    assert dense.num_moe_experts is None


def test_microsoft_spellings_mean_megatron_lms():
    ms = parse(["--num-experts", "4", "4", "--num-layers", "4", "--expert-interval", "2",
                "--topk", "1", "--moe-loss-coeff", "0.1", "--moe-expert-parallel-size", "2",
                "--moe-train-capacity-factor", "1.25", "--moe-min-capacity", "4",
                "--disable-moe-token-dropping", "--create-moe-param-group",
                "--mlp-type", "standard"], world_size=2)
    # Microsoft's MoE layers are the 1-based layers divisible by the interval: 2 and 4
    assert ms.moe_layer_freq == [0, 1, 0, 1]
    assert (ms.num_experts, ms.moe_router_topk, ms.moe_aux_loss_coeff) == (4, 1, 0.1)
    assert ms.moe_router_pre_softmax  # DeepSpeed's top-1 gate is the softmax probability
    assert ms.expert_model_parallel_size == 2
    assert ms.moe_expert_capacity_factor is None  # dropping disabled: the factor is unused
    assert any("--moe-min-capacity 4" in n for n in ms.run_config.notes)
    dropping = parse(MOE + ["--moe-token-dropping"])
    assert dropping.moe_expert_capacity_factor == 1.0  # Microsoft's default factor


def test_a_microsoft_moe_script_gets_microsofts_defaults():
    """Microsoft's examples_deepspeed/MoE scripts give --num-experts, --moe-expert-parallel-size,
    --moe-train-capacity-factor, --moe-min-capacity ... and rely on its defaults for the rest:
    top-1 gating, MoE in every second layer, loss coefficient 0.1, token dropping."""
    ms = parse(["--num-experts", "4", "--num-layers", "4", "--moe-expert-parallel-size", "1",
                "--moe-min-capacity", "4", "--create-moe-param-group"])
    assert (ms.moe_router_topk, ms.moe_router_pre_softmax, ms.moe_aux_loss_coeff) == (1, True, 0.1)
    assert ms.moe_layer_freq == [0, 1, 0, 1]
    assert ms.moe_expert_capacity_factor == 1.0
    assert any("Microsoft Megatron-DeepSpeed's spelling" in n for n in ms.run_config.notes)
    mlm = parse(["--num-experts", "4", "--num-layers", "4"])  # Megatron-LM's defaults
    assert (mlm.moe_router_topk, mlm.moe_aux_loss_coeff, mlm.moe_layer_freq) == (2, 0.0, 1)
    assert mlm.moe_expert_capacity_factor is None


@pytest.mark.parametrize("extra, world, fragments", [
    (["--num-experts", "4", "8"], 1, ["PR-MoE", "--moe-layer-freq"]),
    (MOE + ["--tensor-model-parallel-size", "2"], 2, ["needs --sequence-parallel"]),
    (MOE + ["--expert-model-parallel-size", "3"], 3, ["--num-experts 4 is not divisible by"]),
    (MOE + ["--expert-model-parallel-size", "2"], 1, ["does not divide the data-parallel size 1"]),
    (MOE + ["--expert-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 2,
     ["does not divide the data-parallel size 1", "(world 2 / (TP 1 x PP 2))"]),
    (MOE + ["--expert-model-parallel-size", "2", "--save", "ckpt", "--zero-stage", "0"], 2,
     ["--save with --expert-model-parallel-size 2 and ZeRO stage 0", "--zero-stage 1 or 2"]),
    (MOE + ["--expert-model-parallel-size", "2", "--zero-stage", "3"], 2, ["ZeRO stage 3"]),
    (MOE + ["--moe-token-dispatcher-type", "alltoall"], 1, ["needs a GPU", "use allgather"]),
    (MOE + ["--moe-grouped-gemm"], 1, ["--moe-grouped-gemm needs a GPU"]),
    # Microsoft spellings, so its top-1 default: 2 x 32 tokens / 4 experts x factor 1 = 16
    (MOE + ["--moe-train-capacity-factor", "1", "--moe-min-capacity", "40"], 1,
     ["--moe-min-capacity 40 exceeds the capacity", "(16 tokens", "no minimum capacity"]),
    (MOE + ["--moe-expert-capacity-factor", "1", "--moe-eval-capacity-factor", "2"], 1,
     ["--moe-eval-capacity-factor 2.0 differs"]),
    (MOE + ["--moe-layer-freq", "[1,0,1]"], 1, ["one 0 or 1 per layer"]),
    (MOE + ["--moe-router-topk", "5"], 1, ["--moe-router-topk 5 must be between 1 and"]),
    (MOE + ["--moe-router-topk", "1"], 1, ["needs --moe-router-pre-softmax"]),
    (MOE + ["--ds-sequence-parallel-size", "2"], 2, ["--ds-sequence-parallel-size 2"]),
    (["--expert-model-parallel-size", "2"], 2, ["needs --num-experts"]),
])
def test_impossible_moe_flags_are_refused_naming_them(extra, world, fragments):
    from megatron.errors import ArgumentError

    with pytest.raises(ArgumentError) as info:
        parse(extra, world_size=world)
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)


def test_residual_moe_is_refused_naming_the_shared_expert(capsys):
    err = one_error_line(TINY_RUN + MOE + ["--mlp-type", "residual"], capsys)
    assert "--mlp-type residual is not supported" in err
    assert "--moe-shared-expert-intermediate-size" in err


class _StagedModel(torch.nn.Module):
    """A pipeline's layer partition as GPTModelPipe reports it (transformer layers per stage)."""

    def __init__(self, counts):
        super().__init__()
        self.counts = counts

    def transformer_layers_per_stage(self):
        return self.counts


def test_a_pipeline_stage_without_experts_is_refused_at_expert_parallel_2():
    """At EP > 1 under the pipe engine a stage without an MoE layer would deadlock ZeRO's
    per-group gradient norm (measured: T0 at PP 2 x EP 2 with --moe-layer-freq [0,1] hung, stage 0
    in the loss broadcast, stage 1 in the experts' norm all-reduce): one ConfigError naming the
    flags and the stage. Every stage with experts, EP 1, or one stage pass."""
    from megatron.errors import ConfigError
    from megatron.parallel.experts import check_stages_hold_experts

    with pytest.raises(ConfigError, match=r"--moe-layer-freq \[0,1\] with "
                       r"--pipeline-model-parallel-size 2 and --expert-model-parallel-size 2: "
                       r"pipeline stage 0 \(layers 1-1\) holds no MoE layer"):
        check_stages_hold_experts(_StagedModel([1, 1]), [0, 1], 2, "--moe-layer-freq [0,1]")
    with pytest.raises(ConfigError, match=r"stage 1 \(layers 3-4\)"):
        check_stages_hold_experts(_StagedModel([2, 2]), [1, 1, 0, 0], 2, "--moe-layer-freq x")
    with pytest.raises(ConfigError, match=r"stage 2 \(no transformer layer\)"):
        check_stages_hold_experts(_StagedModel([1, 1, 0]), [1, 1], 2, "--moe-layer-freq x")
    check_stages_hold_experts(_StagedModel([2, 2]), [0, 1, 0, 1], 2, "--moe-layer-freq x")
    check_stages_hold_experts(_StagedModel([1, 1]), [0, 1], 1, "--moe-layer-freq x")
    check_stages_hold_experts(_StagedModel([2]), [0, 1], 2, "--moe-layer-freq x")
    check_stages_hold_experts(torch.nn.Linear(1, 1), [0, 1], 2, "--moe-layer-freq x")


def test_grouped_gemm_without_transformer_engine_is_refused_where_megatron_core_dropped_it():
    """--moe-grouped-gemm --transformer-impl local: megatron-core 0.16's legacy GroupedMLP groups
    the experts' GEMMs; 0.17+ removed it and would run one GEMM per expert, silently, so the
    flags are refused there with a message naming both (docs/megatron_core_versions.md). The
    check asks megatron-core, not its version."""
    from megatron.config.moe_flags import grouped_gemm_without_te_problem
    from megatron.runtime.mcore_compat import legacy_grouped_gemm_available

    assert grouped_gemm_without_te_problem(True) is None
    problem = grouped_gemm_without_te_problem(False)
    assert problem.startswith("--moe-grouped-gemm with --transformer-impl local: ")
    assert "--transformer-impl transformer_engine" in problem
    from megatron.core.transformer.moe import experts

    assert legacy_grouped_gemm_available() == hasattr(experts, "GroupedMLP")
