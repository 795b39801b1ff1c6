"""Mixture of experts through the launcher (megatron/parallel/experts.py): expert gradients reduced
over their expert-data-parallel group only (4 CPU ranks, tests/scripts/moe_expert_groups_check.py),
EP 2 / PP 2 x EP 2 / TP 2 x EP 2 training against one rank (with the load-balancing loss and tokens
per expert logged), a resume at another layout, and the evaluation tasks on the expert-parallel
checkpoint against the one-rank one and its Mixtral export. The model is the layout comparison's
extended one (YaRN at 4x its original length, tests/helpers/parallel.py) with experts. The router, the loss and the flags in
process: tests/unit/test_moe.py."""
import json
import shutil

import pytest
import torch

from helpers.launch import run_deepspeed
from helpers.parallel import EXTENDED_CONTEXT, assert_losses_match, run_layout, train_records

pytestmark = pytest.mark.launch

LLAMA_MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01",
             "--normalization", "RMSNorm",
             "--disable-bias-linear", "--untie-embeddings-and-output-weights"]
MOE_ITERS = 10


# ------------------------------------------------------------------ expert groups (4 ranks)
def test_experts_are_reduced_over_their_expert_data_parallel_group_only(tmp_path):
    """DP 4 x EP 2, ZeRO 1, every rank its own data: after three steps each expert is bitwise the
    same on the two ranks holding it and differs from every other expert; dense parameters are
    the same everywhere; each rank holds its expert-parallel rank's experts under global ids."""
    run_deepspeed("tests/scripts/moe_expert_groups_check.py", [str(tmp_path)], num_ranks=4)
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
    # the Llama-style model (YaRN, RMSNorm, SwiGLU experts) learns: 5.5 -> 4.4 over 10 iterations
    losses = [r["lm_loss"] for r in reference]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.3, losses
    first = reference[0]
    # 8 samples x k tokens (16 in the layouts' sequence-length warmup), each sent to 2 of the 4
    # experts: 16 k assignments per iteration, 4 k per expert on average
    k = first["seq_length"]
    assert k == 16
    assert first["tokens_per_expert_min"] <= 4 * k <= first["tokens_per_expert_max"] <= 8 * k
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
    one-rank run's numbers. On two nodes x 2 ranks (tests/helpers/cluster.py): each TP group
    inside a node, data (and expert) parallelism across the nodes."""
    _, proc = run_layout(demo_data, tmp_path, num_ranks=4, iters=MOE_ITERS, two_nodes=True,
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
    from lm_eval.api.instance import Instance

    from tasks import zero_shot_rank_classification as rank
    from tasks.eval_harness import evaluate

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
    for got, want in zip(ours[0], reference[0], strict=True):
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
# --swiglu, RMSNorm, YaRN (rope_type yarn), no biases, untied, top-2 softmax routing).
EVAL_MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
              "--seq-length", "32", "--swiglu", "--transformer-impl", "local"] + EXTENDED_CONTEXT + LLAMA_MOE
EVAL_TOLERANCE = 1e-5  # nats, per scored continuation (fp32 on both sides; measured < 1e-6)


@pytest.fixture(scope="module")
def moe_mixtral_export(moe_ep2_run, tmp_path_factory):
    """The EP 2 checkpoint's latest iteration exported to a transformers Mixtral directory:
    (checkpoint dir, MixtralForCausalLM in fp32 eval mode)."""
    from helpers.hf import hf_mixtral
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
    from helpers.eval_tasks import MC_DOCS, task_files
    from megatron.runtime.mcore_compat import clear_moe_metrics, moe_metric_entries
    from tasks import zero_shot_rank_classification as rank
    from tasks.eval_harness import evaluate

    load, hf = moe_mixtral_export
    clear_moe_metrics()  # zeroes what earlier in-process tests recorded
    tok = _eval_args(load).tokenizer
    want = [[_mixtral_score(hf, tok.tokenize(d["question"]), tok.tokenize(" " + c))
             for c in d["choices"]] for d in MC_DOCS]
    flags = ["--use-checkpoint-args", "--load", str(load), "--expert-model-parallel-size", "2"]
    data = tmp_path / "rank.jsonl"
    data.write_text("".join(json.dumps({"task": "t", "inputs": d["question"], "label": d["label"],
                                        "choices": [" " + c for c in d["choices"]]}) + "\n"
                            for d in MC_DOCS))
    ranked = rank.main(flags + ["--task-data", str(data), "--eval-batch-size", "4"])
    mc, include = task_files(tmp_path)
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
             for g, w in zip(got, choices, strict=True)]
    assert len(diffs) == 2 * sum(len(d["choices"]) for d in MC_DOCS)
    assert max(diffs) < EVAL_TOLERANCE, max(diffs)
    recorded = {k: float(v.values.abs().sum()) for k, v in moe_metric_entries().items()}
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
