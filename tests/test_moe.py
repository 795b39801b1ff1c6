"""Mixture of experts (megatron-core's MoE layer, megatron/model/moe.py, megatron/config/moe_flags.py,
megatron/parallel/experts.py): the router against a naive top-k, the load-balancing loss against
its formula, the flags (Megatron-LM's, Microsoft's translations, the refused ones), expert
gradients reduced over their expert-data-parallel group only (4 CPU ranks,
tests/moe_expert_groups_check.py), and EP 2 / TP 2 x EP 2 training through the launcher against
one rank, with the load-balancing loss and tokens per expert logged."""
import json
import shutil

import pytest
import torch

from e2e_helpers import run_deepspeed
from parallel_helpers import assert_losses_match, run_layout, train_records
from test_flag_compat import parse

MOE = ["--num-experts", "4"]
LLAMA_MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
             "--normalization", "RMSNorm", "--position-embedding-type", "rope",
             "--disable-bias-linear", "--untie-embeddings-and-output-weights"]
MOE_ITERS = 10


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
    from megatron.core.transformer.moe.moe_utils import (clear_aux_losses_tracker,
                                                         get_moe_layer_wise_logging_tracker)

    k, experts, coeff = 2, 6, 0.01
    router = router_factory(moe_router_topk=k, moe_aux_loss_coeff=coeff)
    router.train()
    clear_aux_losses_tracker()
    hidden = torch.randn(7, 3, 16, generator=torch.Generator().manual_seed(2), requires_grad=True)
    _, routing_map = router(hidden)
    logits = (hidden.view(-1, 16) @ router.weight.t()).detach()
    tokens = logits.shape[0]
    probs = torch.softmax(logits, dim=-1)
    chosen = torch.zeros_like(probs).scatter(1, logits.topk(k, dim=-1).indices, 1.0)
    f = chosen.sum(0) / (k * tokens)
    p = probs.mean(0)
    want = experts * (f * p).sum()
    got = get_moe_layer_wise_logging_tracker()["load_balancing_loss"]["values"][0]
    assert got.item() == pytest.approx(want.item(), rel=1e-5)
    assert want.item() >= 1.0 - 1e-6  # the loss is at least 1, equal at perfect balance
    counts, forwards = router.take_tokens_per_expert()
    assert counts.tolist() == routing_map.sum(0).double().tolist() and forwards == 1
    assert router.take_tokens_per_expert() == (None, 0)
    clear_aux_losses_tracker()


def test_biased_experts_train_at_expert_parallel_1_with_the_gated_bias(one_rank_model_parallel):
    """Default flags give the experts biases; megatron-core adds an expert's fc2 bias times the
    token's gate in place, which its own layer forbids at EP 1 (megatron/model/moe.py
    ExpertRowParallelLinear). The layer trains there, and d sum(output) / d bias of expert e is
    the sum of the gates of the tokens routed to e."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig
    from megatron.model.moe import ExpertRowParallelLinear, use_moe_router

    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2,
                               ffn_hidden_size=32, num_moe_experts=4, moe_router_topk=2,
                               use_cpu_initialization=True, add_bias_linear=True)
    spec = use_moe_router(get_gpt_layer_local_spec(num_experts=4))
    torch.manual_seed(0)
    layer = build_module(spec.submodules.mlp, config=config, layer_number=1)
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
    clear_aux_losses_tracker()


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
    assert any("--moe-min-capacity 4" in n for n in ms.startup_notes)
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
    assert any("Microsoft Megatron-DeepSpeed's spelling" in n for n in ms.startup_notes)
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
    from test_flag_compat import BASE, one_error_line

    err = one_error_line(BASE + MOE + ["--mlp-type", "residual"], capsys)
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


# ------------------------------------------------------------------ expert groups (4 ranks)
def test_experts_are_reduced_over_their_expert_data_parallel_group_only(tmp_path):
    """DP 4 x EP 2, ZeRO 1, every rank its own data: after three steps each expert is bitwise the
    same on the two ranks holding it and differs from every other expert; dense parameters are
    the same everywhere; each rank holds its expert-parallel rank's experts under global ids."""
    run_deepspeed("tests/moe_expert_groups_check.py", [str(tmp_path)], num_ranks=4)
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(4)]
    holders = {}
    for record in records:
        experts = sorted({int(n.split("local_experts.")[1].split(".")[0])
                          for n in record["params"] if "local_experts" in n})
        assert experts == [2 * record["ep_rank"], 2 * record["ep_rank"] + 1]
        assert record["expert_flags"], "expert parameters carry DeepSpeed's group_name"
        for name, value in record["params"].items():
            holders.setdefault(name, []).append(value["sha"])
    for name, shas in holders.items():
        assert len(set(shas)) == 1, f"{name} differs between the ranks that hold it"
        assert len(shas) == (2 if "local_experts" in name else 4), name
    fc1 = [holders[f"decoder.layers.0.mlp.experts.local_experts.{e}.linear_fc1.weight"][0]
           for e in range(4)]
    assert len(set(fc1)) == 4, "experts trained apart stay different"


# ------------------------------------------------------------------ training through the launcher
@pytest.fixture(scope="module")
def moe_one_rank(demo_data, tmp_path_factory):
    """The one-rank reference: (losses, training records, run dir); it saves at iterations 5 and
    10 into run_dir/"ckpt" (DeepSpeed's one file, every expert in it)."""
    run_dir = tmp_path_factory.mktemp("moe_one")
    losses, _ = run_layout(demo_data, run_dir, num_ranks=1, iters=MOE_ITERS, extra=LLAMA_MOE + [
        "--save", str(run_dir / "ckpt"), "--save-interval", "5"])
    return losses, train_records(run_dir), run_dir


EP2 = ["--expert-model-parallel-size", "2"]
SAVE_AT = 5


def _assert_moe_records_match(records, reference):
    """LM loss, load-balancing loss and gradient norm (each expert shard once) within 1e-4
    relative of the reference's, tokens per expert equal."""
    assert_losses_match([r["lm_loss"] for r in records], [r["lm_loss"] for r in reference])
    for key in ("load_balancing_loss", "grad_norm"):
        assert_losses_match([r[key] for r in records], [r[key] for r in reference], rel=1e-4)
    for key in ("tokens_per_expert_min", "tokens_per_expert_max"):
        assert [r[key] for r in records] == [r[key] for r in reference]


@pytest.fixture(scope="module")
def moe_ep2_run(demo_data, tmp_path_factory):
    """EP 2 on 2 ranks, saving at iteration 5 and 10: (run dir, launcher's CompletedProcess)."""
    run_dir = tmp_path_factory.mktemp("moe_ep2")
    _, proc = run_layout(demo_data, run_dir, num_ranks=2, iters=MOE_ITERS, extra=LLAMA_MOE + EP2 + [
        "--save", str(run_dir / "ckpt"), "--save-interval", str(SAVE_AT)])
    return run_dir, proc


def test_expert_parallel_2_equals_one_rank(moe_ep2_run, moe_one_rank):
    """Dropless top-2 routing with a load-balancing loss, dropout 0: every iteration's LM loss,
    load-balancing loss, gradient norm and tokens per expert equal the one-rank run's (ZeRO 1
    reduces the experts over their expert-data-parallel group)."""
    run_dir, proc = moe_ep2_run
    assert ("tensor-parallel 1, pipeline-parallel 1, data-parallel 2, expert-parallel 2, "
            "ZeRO stage 1") in proc.stdout
    assert "MoE: 4 experts (FFN 128) in 4 of 4 layers, top-2 softmax router" in proc.stdout
    _, reference, _ = moe_one_rank
    _assert_moe_records_match(train_records(run_dir), reference)
    # the Llama-style model (RoPE, RMSNorm, SwiGLU experts) learns: 5.5 -> 4.4 over 10 iterations
    losses = [r["lm_loss"] for r in reference]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    first = reference[0]
    # 8 samples x 32 tokens, each sent to 2 of the 4 experts: 512 assignments per iteration
    assert first["tokens_per_expert_min"] <= 128 <= first["tokens_per_expert_max"] <= 256
    assert first["load_balancing_loss"] >= 1.0
    assert "load_balancing_loss" not in first["per_dataset_loss"]
    # the experts of expert-parallel rank 1 have their own file; the index says where
    checkpoint = run_dir / "ckpt" / f"iter_{SAVE_AT:07d}"
    assert (checkpoint / "expert_states_ep_01_mp_rank_00.pt").is_file()


@pytest.fixture(scope="module")
def moe_pp2_ep2_run(demo_data, tmp_path_factory):
    """PP 2 x EP 2 on 4 ranks (DeepSpeed's pipe engine, 2 data-parallel ranks per stage splitting
    the experts), saving at iteration 5: (run dir, launcher's CompletedProcess)."""
    run_dir = tmp_path_factory.mktemp("moe_pp2_ep2")
    _, proc = run_layout(demo_data, run_dir, num_ranks=4, iters=MOE_ITERS, extra=LLAMA_MOE + EP2 + [
        "--pipeline-model-parallel-size", "2", "--save", str(run_dir / "ckpt"),
        "--save-interval", str(SAVE_AT)])
    return run_dir, proc


def test_pipeline_and_expert_parallel_training_equals_one_rank(moe_pp2_ep2_run, moe_one_rank):
    """PP 2 x EP 2 gives the one-rank run's numbers; its checkpoint holds the pipe's layer files
    (expert-parallel rank 0's experts) and one expert file per stage for expert-parallel rank 1."""
    run_dir, proc = moe_pp2_ep2_run
    assert ("tensor-parallel 1, pipeline-parallel 2, data-parallel 2, expert-parallel 2, "
            "ZeRO stage 1") in proc.stdout
    _assert_moe_records_match(train_records(run_dir), moe_one_rank[1])
    checkpoint = run_dir / "ckpt" / f"iter_{SAVE_AT:07d}"
    assert sorted(p.name for p in checkpoint.glob("expert_states_*")) == [
        "expert_states_ep_01_pp_00_mp_rank_00.pt", "expert_states_ep_01_pp_01_mp_rank_00.pt"]
    assert (checkpoint / "layer_01-model_00-model_states.pt").is_file()


def test_expert_parallel_checkpoint_resumes_at_another_layout(moe_pp2_ep2_run, demo_data,
                                                               tmp_path):
    """The PP 2 x EP 2 checkpoint of iteration 5 (4 ranks) resumes at TP 2 x PP 1 x EP 1 (2 ranks:
    every expert on both, each split over the 2 tensor-parallel ranks) with the uninterrupted run's
    losses for iterations 6-10 (weights, Adam states and progress resharded by canonical name)."""
    run_dir, _ = moe_pp2_ep2_run
    load = tmp_path / "load"
    load.mkdir()
    shutil.copytree(run_dir / "ckpt" / f"iter_{SAVE_AT:07d}", load / f"iter_{SAVE_AT:07d}")
    (load / "latest_checkpointed_iteration.txt").write_text(str(SAVE_AT))
    _, proc = run_layout(demo_data, tmp_path / "resumed", num_ranks=2, iters=MOE_ITERS,
                         extra=LLAMA_MOE + ["--tensor-model-parallel-size", "2",
                                            "--sequence-parallel", "--load", str(load)],
                         first_iteration=SAVE_AT + 1)
    assert ("resharded " + str(load / f"iter_{SAVE_AT:07d}") + " (tensor-parallel 1, "
            "pipeline-parallel 2, data-parallel 2, expert-parallel 2, ZeRO stage 1)") in proc.stdout
    resumed = train_records(tmp_path / "resumed")
    _assert_moe_records_match(resumed, train_records(run_dir)[SAVE_AT:])


def test_tensor_and_expert_parallel_training_equals_one_rank(moe_one_rank, demo_data, tmp_path):
    """TP 2 x EP 2 (4 ranks, --sequence-parallel: each tensor-parallel rank routes its slice of
    the tokens) with full recompute (a recomputed layer's routing counted once) gives the
    one-rank run's numbers."""
    _, proc = run_layout(demo_data, tmp_path, num_ranks=4, iters=MOE_ITERS,
                         extra=LLAMA_MOE + EP2 + ["--tensor-model-parallel-size", "2",
                                                  "--sequence-parallel",
                                                  "--recompute-granularity", "full",
                                                  "--recompute-method", "uniform",
                                                  "--recompute-num-layers", "1"])
    assert ("tensor-parallel 2, pipeline-parallel 1, data-parallel 2, expert-parallel 2, "
            "ZeRO stage 1, micro-batches per iteration 2, sequence-parallel, recompute full "
            "(uniform, 1 layer)") in proc.stdout
    _assert_moe_records_match(train_records(tmp_path), moe_one_rank[1])


# ------------------------------------------------------------------ evaluation of MoE checkpoints
RANK_DOCS = [{"task": "t", "inputs": "The cat sat on the", "choices": [" mat", " moon", " sofa"],
              "label": 0},
             {"task": "t", "inputs": "def f(x): return", "choices": [" x", " 42"], "label": 0}]


def _scores_of(load, tmp_path, name):
    """(zero-shot rank-classification choice scores, lm-eval log-likelihoods, the model) of
    checkpoint ``load`` with the flags it recorded."""
    from tasks import zero_shot_rank_classification as rank
    from tasks.eval_harness import evaluate
    from lm_eval.api.instance import Instance

    data = tmp_path / "rank.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in RANK_DOCS))
    out = tmp_path / f"{name}.json"
    rank.main(["--use-checkpoint-args", "--load", str(load), "--task-data", str(data),
               "--output-json", str(out)])
    args = evaluate.parse_eval_args(["--use-checkpoint-args", "--load", str(load),
                                     "--tasks", "unused"])
    model = evaluate.load_model(args)
    lm = evaluate.build_lm(args, model)
    requests = [Instance("loglikelihood", {}, (d["inputs"], c), i)
                for i, d in enumerate(RANK_DOCS) for c in d["choices"]]
    return json.loads(out.read_text())["choice_scores"], [s for s, _ in lm.loglikelihood(requests)], model


def test_evaluation_tasks_score_an_expert_parallel_checkpoint_as_the_one_rank_one(
        moe_pp2_ep2_run, moe_one_rank, tmp_path):
    """Zero-shot rank classification and lm-eval (tasks/) build the MoE model from the flags a
    checkpoint recorded and read every expert: the PP 2 x EP 2 checkpoint of iteration 10 (experts
    of expert-parallel rank 1 in their own files, layer files per stage) scores as the one-rank
    run's checkpoint of the same iteration, whose experts DeepSpeed wrote in one file; the
    experts of a layer all differ, and evaluation counts no routed tokens."""
    from megatron.model.moe import moe_routers

    ours = _scores_of(moe_pp2_ep2_run[0] / "ckpt", tmp_path, "pp2_ep2")
    reference = _scores_of(moe_one_rank[2] / "ckpt", tmp_path, "one")
    for got, want in zip(ours[0], reference[0]):
        assert got == pytest.approx(want, abs=1e-5)
    assert ours[1] == pytest.approx(reference[1], abs=1e-5)
    assert len({round(s, 3) for s in ours[1]}) > 1  # the choices score differently
    weights = dict(ours[2].named_parameters())
    for layer in range(4):
        fc1 = [weights[f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc1.weight"]
               for e in range(4)]
        assert all(not torch.equal(fc1[a], fc1[b]) for a in range(4) for b in range(a + 1, 4))
    assert all(r.take_tokens_per_expert() == (None, 0) for r in moe_routers(ours[2]))


# ------------------------------------------------------------------ evaluation against transformers
# tasks/zero_shot_rank_classification.py and tasks/eval_harness (lm-eval) on the EP 2 checkpoint of
# iteration 10 (moe_ep2_run), in one process at expert-parallel 1, against the checkpoint exported
# to transformers' MixtralForCausalLM (tools/checkpoint/convert_to_hf.py; the run is Llama-style:
# --swiglu, RMSNorm, rope, no biases, untied, top-2 softmax routing).
EVAL_MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
              "--seq-length", "32", "--swiglu", "--transformer-impl", "local"] + LLAMA_MOE
EVAL_TOLERANCE = 1e-5  # nats, per scored continuation (fp32 on both sides; measured < 1e-6)


@pytest.fixture(scope="module")
def moe_mixtral_export(moe_ep2_run, tmp_path_factory):
    """The EP 2 checkpoint's latest iteration exported to a transformers Mixtral directory:
    (checkpoint dir, MixtralForCausalLM in fp32 eval mode)."""
    from test_hf_mixtral import hf_mixtral
    from tools.checkpoint.convert_to_hf import convert

    run_dir, _ = moe_ep2_run
    out = tmp_path_factory.mktemp("moe_mixtral")
    assert convert(str(run_dir / "ckpt"), str(out / "hf"))["family"] == "MixtralForCausalLM"
    hf, missed = hf_mixtral(out / "hf")
    assert not missed
    return run_dir / "ckpt", hf


def _mixtral_score(hf, ctx, cont):
    """Sum of log p(cont[j] | ctx, cont[:j]) under the transformers model (float64 softmax)."""
    whole = list(ctx) + list(cont)
    with torch.no_grad():
        lp = torch.log_softmax(hf(torch.tensor([whole[:-1]])).logits[0].double(), dim=-1)
    return float(sum(lp[len(ctx) - 1 + j, t] for j, t in enumerate(cont)))


def _eval_args(load, *extra):
    from tasks.eval_harness import evaluate

    return evaluate.parse_eval_args(["--use-checkpoint-args", "--load", str(load),
                                     "--tasks", "unused", *extra])


def test_eval_tasks_score_the_expert_parallel_checkpoint_as_its_mixtral_export(
        moe_mixtral_export, tmp_path, capsys):
    """Rank classification and lm-eval's multiple choice through simple_evaluate
    (--use-checkpoint-args; the training command line's --expert-model-parallel-size 2 runs at 1)
    give every choice the log-likelihood the exported Mixtral computes, within 1e-5; no
    evaluation forward records a load-balancing loss."""
    from megatron.core.transformer.moe.moe_utils import (clear_aux_losses_tracker,
                                                         get_moe_layer_wise_logging_tracker)
    from tasks import zero_shot_rank_classification as rank
    from tasks.eval_harness import evaluate
    from test_eval_harness import MC_DOCS, _task_files

    load, hf = moe_mixtral_export
    clear_aux_losses_tracker()  # zeroes what earlier in-process tests recorded
    tok = _eval_args(load).tokenizer
    want = [[_mixtral_score(hf, tok.tokenize(d["question"]), tok.tokenize(" " + c))
             for c in d["choices"]] for d in MC_DOCS]
    flags = ["--use-checkpoint-args", "--load", str(load), "--expert-model-parallel-size", "2"]
    data = tmp_path / "rank.jsonl"
    data.write_text("".join(json.dumps({"task": "t", "inputs": d["question"], "label": d["label"],
                                        "choices": [" " + c for c in d["choices"]]}) + "\n"
                            for d in MC_DOCS))
    ranked = rank.main(flags + ["--task-data", str(data), "--eval-batch-size", "4"])
    mc, include = _task_files(tmp_path)
    out = tmp_path / "results" / "lm_eval.json"
    evaluate.main(flags + ["--tasks", mc, "--include-path", include, "--results-path", str(out),
                           "--bootstrap-iters", "0", "--eval-batch-size", "4", "--log-samples"])
    stdout = capsys.readouterr().out
    assert "--expert-model-parallel-size 2: evaluation runs one process holding every expert" \
        in stdout
    assert "4 experts (FFN 128) in 4 of 4 layers, top-2 softmax router" in stdout
    assert "dropless, allgather dispatcher, expert-parallel 1" in stdout
    samples = [json.loads(line) for line in
               (tmp_path / "results" / "lm_eval_samples_tiny_mc.jsonl").read_text().splitlines()]
    lm_eval_scores = {s["doc_id"]: [float(r[0]) for r in s["filtered_resps"]] for s in samples}
    assert sorted(lm_eval_scores) == list(range(len(MC_DOCS)))
    diffs = [abs(g - w) for i, choices in enumerate(want)
             for got in (ranked["choice_scores"][i], lm_eval_scores[i])
             for g, w in zip(got, choices)]
    assert len(diffs) == 2 * sum(len(d["choices"]) for d in MC_DOCS)
    assert max(diffs) < EVAL_TOLERANCE, max(diffs)
    recorded = {k: float(v["values"].abs().sum())
                for k, v in get_moe_layer_wise_logging_tracker().items()}
    assert not any(recorded.values()), f"evaluation recorded MoE losses: {recorded}"


def test_eval_router_is_deterministic_and_token_dropping_is_refused(moe_ep2_run, tmp_path):
    """--moe-input-jitter-eps jitters training forwards only (megatron-core 0.16 jitters in eval
    mode too): a jittered checkpoint's scores are the plain model's, forward after forward. A
    Microsoft spelling with --use-checkpoint-args keeps the checkpoint's top-2, layers and
    dropless routing instead of Microsoft's defaults. Token dropping (given, Microsoft's default,
    or recorded by the checkpoint) is one ConfigError naming the flag and the dropless way."""
    from megatron.errors import ConfigError
    from tasks.checkpoint_model import build_model
    from tasks.eval_harness import evaluate
    from tasks.zero_shot_rank_classification import score_pairs

    load = moe_ep2_run[0] / "ckpt"
    pairs = [([5, 6, 7, 8, 9, 10], [11, 12]), ([20, 21], [22, 23, 24, 25, 26]), ([30] * 10, [31])]
    plain = score_pairs(build_model(_eval_args(load)), pairs, 32, 0, batch_size=3)
    jittered = build_model(_eval_args(load, "--moe-input-jitter-eps", "0.5"))
    for _ in range(2):
        assert score_pairs(jittered, pairs, 32, 0, batch_size=3).tolist() == plain.tolist()
    microsoft = _eval_args(load, "--moe-expert-parallel-size", "2")
    assert (microsoft.moe_router_topk, microsoft.moe_layer_freq, microsoft.expert_interval,
            microsoft.moe_expert_capacity_factor) == (2, 1, None, None)
    assert score_pairs(build_model(microsoft), pairs, 32, 0, batch_size=3).tolist() \
        == plain.tolist()
    for argv, fragments in [
        (EVAL_MODEL + ["--moe-expert-capacity-factor", "1"],
         ["--moe-expert-capacity-factor 1: token dropping cannot be evaluated",
          "drop --moe-expert-capacity-factor"]),
        (EVAL_MODEL + ["--moe-expert-parallel-size", "2"],  # Microsoft's: its token dropping
         ["token dropping at capacity factor 1 (Microsoft Megatron-DeepSpeed's default",
          "add --disable-moe-token-dropping"]),
    ]:
        with pytest.raises(ConfigError) as info:
            build_model(evaluate.parse_eval_args(argv + ["--load", str(load), "--tasks", "x"]))
        for fragment in fragments:
            assert fragment in str(info.value), str(info.value)
    # a checkpoint that recorded token dropping (its model_args.json edited: no new training run)
    dropping = tmp_path / "dropping"
    shutil.copytree(load / f"iter_{MOE_ITERS:07d}", dropping / f"iter_{MOE_ITERS:07d}")
    (dropping / "latest_checkpointed_iteration.txt").write_text(str(MOE_ITERS))
    record_file = dropping / f"iter_{MOE_ITERS:07d}" / "model_args.json"
    record = json.loads(record_file.read_text())
    record["model"]["moe_expert_capacity_factor"] = 1.25
    record_file.write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"--moe-expert-capacity-factor 1\.25 \(the "
                       r"checkpoint's model_args\.json, --use-checkpoint-args\): token dropping "
                       r"cannot be evaluated.*add --disable-moe-token-dropping"):
        build_model(_eval_args(dropping))
    dropless = _eval_args(dropping, "--disable-moe-token-dropping")
    assert (dropless.moe_router_topk, dropless.moe_expert_capacity_factor) == (2, None)
    assert score_pairs(build_model(dropless), pairs, 32, 0, batch_size=3).tolist() \
        == plain.tolist()

