"""Weighted checkpoint merging (tools/checkpoint/merge_checkpoints.py, megatron/checkpoint/merge.py)
and the streaming checkpoint writer it uses (megatron/checkpoint/writer.py with ``shapes``).

Two launches: a 2-rank DP 2 ZeRO-1 run of a tiny Llama-style model saves at iterations 10, 20 and
30; the merge with weights 0.2, 0.3, 0.5 equals the hand-computed weighted average of the three
checkpoints' full weights (CheckpointReader) within 1e-6, also when one source is rewritten at
TP 2 x PP 2 and when the output is TP 2 x PP 2; the merged checkpoint scores through
tasks/zero_shot_rank_classification.py as the hand-merged weights do, exports to a transformers
Llama model holding them, and loads in process with --finetune and with --no-load-optim semantics.
The second launch resumes the merged checkpoint at TP 2 (``--load MERGED --no-load-optim``) and
saves iteration 40 into the run's directory, whose checkpoints then have two layouts; merging
20, 30, 40 is checked again. In process: the WSM mapping from a decay schedule against the paper's
formula, and every refused input.
"""
import json
import math
import os
import shutil
import zipfile

import pytest
import torch

from helpers.flags import TINY_MODEL
from megatron.errors import CheckpointError, ConfigError

WEIGHTS = (0.2, 0.3, 0.5)
MODEL = TINY_MODEL + [
    "--num-query-groups", "2", "--position-embedding-type", "rope", "--normalization", "RMSNorm",
    "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
    "--pad-vocab-size-to", "512"]  # one padded vocabulary under TP 1 and TP 2


def merge(*argv):
    from tools.checkpoint.merge_checkpoints import main

    return main([str(a) for a in argv])


def full_weights(load, iteration):
    from megatron.checkpoint.reader import CheckpointReader

    with CheckpointReader(str(load), iteration) as reader:
        return {n: t.clone() for n, t in reader.items()}


def weighted(load, iterations, weights):
    """Σ wᵢ·θᵢ of the checkpoints' full weights, by hand (fp32)."""
    states = [full_weights(load, it) for it in iterations]
    return {n: sum(w * s[n].float() for w, s in zip(weights, states, strict=True)) for n in states[0]}


def assert_close(load, expected, iteration=None, tol=1e-6):
    got = full_weights(load, iteration)
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].shape == tensor.shape, name
        assert (got[name].float() - tensor).abs().max().item() <= tol, name


# ---------------------------------------------------------------------------- synthetic checkpoints
FLAGS = {"num_layers": 2, "hidden_size": 32, "ffn_hidden_size": 48, "num_attention_heads": 4,
         "num_query_groups": 2, "kv_channels": 8, "max_position_embeddings": 64,
         "normalization": "RMSNorm", "norm_epsilon": 1e-5, "swiglu": True, "openai_gelu": False,
         "position_embedding_type": "rope", "rotary_percent": 1.0, "rotary_base": 10000,
         "untie_embeddings_and_output_weights": True, "disable_bias_linear": True,
         "make_vocab_size_divisible_by": 128, "pad_vocab_size_to": None, "embed_layernorm": False}


def record(rows=128, **flags):
    return {"format_version": 1, "model": dict(FLAGS, **flags), "tokenizer": {},
            "defaults": {"seq_length": 64}, "padded_vocab_size": rows, "vocab_size": 100}


def random_state(seed, rows=128, dtype=torch.float32, **flags):
    from megatron.checkpoint.hf.families import canonical_shapes

    g = torch.Generator().manual_seed(seed)
    return {n: torch.randn(s, generator=g).to(dtype)
            for n, s in canonical_shapes(dict(FLAGS, **flags), rows).items()}


def write(load, iteration, state=None, tp=1, pp=1, rows=128, **flags):
    from megatron.checkpoint.writer import write_checkpoint

    state = random_state(iteration, rows, **flags) if state is None else state
    training = {"checkpoint_version": 1, "iteration": iteration, "consumed_samples": 4 * iteration,
                "extra": {}}
    write_checkpoint(str(load), state, record(rows, **flags), tp=tp, pp=pp, iteration=iteration,
                     training_state=training)
    return state


@pytest.fixture
def synthetic(tmp_path):
    """Checkpoints 10, 20, 30 of one model at three layouts (TP 1, TP 2 x PP 2, TP 2)."""
    load = tmp_path / "run"
    states = {it: write(load, it, tp=tp, pp=pp)
              for it, (tp, pp) in zip((10, 20, 30), ((1, 1), (2, 2), (2, 1)), strict=True)}
    return load, states


def test_streamed_writer_writes_the_dicts_files(tmp_path):
    """write_checkpoint(shapes=..., an iterator in any order) writes the same tensors, records and
    training state as the dict form, at every layout, and valid zip files (CRC-32s set)."""
    from megatron.checkpoint.writer import write_checkpoint

    state = random_state(1)
    state = {n: (t.bfloat16() if i % 2 else t) for i, (n, t) in enumerate(state.items())}
    shapes = {n: (t.shape, t.dtype) for n, t in state.items()}
    training = {"checkpoint_version": 1, "iteration": 5, "consumed_samples": 20, "extra": {"a": 1}}

    def same(a, b):
        if torch.is_tensor(a):
            assert a.dtype == b.dtype and torch.equal(a, b)
        elif isinstance(a, dict):
            assert list(a) == list(b)
            for k in a:
                same(a[k], b[k])
        else:
            assert a == b

    for tp, pp in ((1, 1), (2, 1), (1, 2), (2, 3)):
        out = {}
        for form in ("dict", "stream"):
            root = tmp_path / f"{form}{tp}{pp}"
            if form == "dict":
                write_checkpoint(str(root), state, record(), tp, pp, 5, training_state=training)
            else:
                write_checkpoint(str(root), iter(list(state.items())[::-1]), record(), tp, pp, 5,
                                 shapes=shapes, training_state=training)
            directory = root / "iter_0000005"
            out[form] = {}
            for f in sorted(os.listdir(directory)):
                if f.endswith(".pt"):
                    with zipfile.ZipFile(directory / f) as archive:
                        assert archive.testzip() is None, f
                    out[form][f] = torch.load(directory / f, weights_only=False)
                else:
                    out[form][f] = (directory / f).read_text()
            assert (root / "latest_checkpointed_iteration.txt").read_text() == "5\n"
        same(out["dict"], out["stream"])
        assert out["stream"]["mp_rank_00_model_states.pt"]["megatron_training_state"] == training
    with pytest.raises(ValueError, match="were not given"):
        write_checkpoint(str(tmp_path / "short"), iter(list(state.items())[1:]), record(),
                         shapes=shapes)


def test_merge_of_mixed_layouts_equals_the_weighted_sum_at_any_output_layout(synthetic, tmp_path):
    load, states = synthetic
    summary = merge("--load", load, "--iterations", 30, 10, 20, "--weights", 5, 2, 3,
                    "--save", tmp_path / "m", "--target-tensor-parallel-size", 2,
                    "--target-pipeline-parallel-size", 2)
    expected = {n: 0.2 * states[10][n] + 0.3 * states[20][n] + 0.5 * states[30][n]
                for n in states[10]}
    assert_close(tmp_path / "m", expected)
    directory = tmp_path / "m" / "iter_0000030"
    assert summary["directory"] == str(directory) and summary["iteration"] == 30
    assert json.loads((directory / "parallel_layout.json").read_text())[
        "tensor_model_parallel_size"] == 2
    assert json.loads((directory / "model_args.json").read_text()) == record()
    merged = json.loads((directory / "merge.json").read_text())
    assert [(s["iteration"], s["weight"]) for s in merged["sources"]] == [
        (10, pytest.approx(0.2)), (20, pytest.approx(0.3)), (30, pytest.approx(0.5))]
    assert [s["layout"]["tensor_model_parallel_size"] for s in merged["sources"]] == [1, 2, 2]
    assert merged["weights_from"] == {"flag": "--weights", "values": [5.0, 2.0, 3.0]}
    from megatron.checkpoint.reader import CheckpointReader
    with CheckpointReader(str(tmp_path / "m")) as reader:
        assert reader.client_state("megatron_training_state")["iteration"] == 30


def test_bf16_sources_merge_in_fp32_and_are_written_in_bf16(tmp_path):
    load = tmp_path / "run"
    states = {it: write(load, it, random_state(it, dtype=torch.bfloat16)) for it in (1, 2)}
    merge("--load", load, "--iterations", 1, 2, "--weights", 1, 3, "--save", tmp_path / "m")
    got = full_weights(tmp_path / "m", None)
    for name, tensor in got.items():
        assert tensor.dtype == torch.bfloat16
        exact = 0.25 * states[1][name].float() + 0.75 * states[2][name].float()
        assert torch.equal(tensor, exact.bfloat16()), name


# ---------------------------------------------------------------------------- weights
def test_wsm_coefficients_invert_the_decay():
    """c_0 = 1 - w_1, c_j = w_j - w_{j+1}, c_k = w_k, i.e. w_i = sum_{j >= i} c_j (the paper)."""
    from megatron.checkpoint.merge import wsm_coefficients

    w = [0.9, 0.7, 0.4, 0.1]
    c = wsm_coefficients(w)
    assert c == pytest.approx([0.1, 0.2, 0.3, 0.3, 0.1])
    assert [sum(c[i:]) for i in range(1, len(c))] == pytest.approx(w)
    assert math.fsum(c) == pytest.approx(1.0)
    assert wsm_coefficients([]) == [1.0]


@pytest.mark.parametrize("k,every", [(1, 1), (2, 10), (3, 10), (4, 25)])
def test_linear_decay_weights_follow_the_papers_formula(k, every):
    """A linear decay from 1 to 0 over k intervals of K iterations: the step-mean multipliers
    w_i = 1 - ((i-1)K + (K-1)/2)/(kK), so c_0 = (K-1)/(2kK), c_j = 1/k, c_k = (K+1)/(2kK)."""
    from megatron.checkpoint.merge import weights_from_schedule

    iterations = [100 + j * every for j in range(k + 1)]
    c, w, config = weights_from_schedule("linear", iterations)
    K = every
    assert w == pytest.approx([1 - ((i - 1) * K + (K - 1) / 2) / (k * K) for i in range(1, k + 1)])
    expected = [(K - 1) / (2 * k * K)] + [1 / k] * (k - 1) + [(K + 1) / (2 * k * K)]
    assert c == pytest.approx(expected)
    assert [sum(c[i:]) for i in range(1, k + 1)] == pytest.approx(w)
    assert config == {"type": "linear", "from": 1.0, "to": 0.0}


def test_schedule_files_and_kinds_give_non_negative_weights(tmp_path):
    """Any decay of the schedule language (a kind, a file, a staged list, uneven checkpoints):
    weights are the WSM mapping of the schedule's step means, non-negative, summing to 1."""
    import numpy as np

    from megatron.checkpoint.merge import weights_from_schedule, wsm_coefficients
    from megatron.schedules.registry import ScheduleContext, build_schedule

    iterations = [0, 10, 30, 60]
    for kind in ("cosine", "wsd", "inverse-square-root"):
        c, w, _ = weights_from_schedule(kind, iterations)
        assert min(c) >= 0 and math.fsum(c) == pytest.approx(1) and c == wsm_coefficients(w)
    path = tmp_path / "decay.yaml"
    path.write_text("merge_schedule:\n  - {start: 0, schedule: {type: constant, value: 3.0e-4}}\n"
                    "  - {start: 30, schedule: {type: cosine, from: 3.0e-4, to: 0.0}}\n")
    c, w, config = weights_from_schedule(str(path), iterations)
    schedule = build_schedule(config, ScheduleContext(total={"iterations": 60.0}))
    lr = schedule(np.arange(60)) / 3e-4
    assert w == pytest.approx([lr[0:10].mean(), lr[10:30].mean(), lr[30:60].mean()])
    assert w[:2] == pytest.approx([1, 1]) and c[:2] == pytest.approx([0, 0])
    (tmp_path / "d.json").write_text(json.dumps({"type": "wsd", "from": 2, "decay": 30,
                                                 "decay_style": "cosine"}))
    assert weights_from_schedule(str(tmp_path / "d.json"), iterations)[0] == pytest.approx(c)


@pytest.mark.parametrize("spec,message", [
    ("step", "has no 'from'/'to' keys"),
    ("sawtooth", "neither a schedule file nor a schedule kind"),
    ("missing.yaml", "no such file"),
])
def test_bad_schedules_are_refused(spec, message):
    from megatron.checkpoint.merge import weights_from_schedule

    with pytest.raises(ConfigError, match=message):
        weights_from_schedule(spec, [0, 10, 20])


def test_a_rising_or_sample_unit_schedule_is_refused(tmp_path):
    from megatron.checkpoint.merge import weights_from_schedule

    rising = tmp_path / "rising.yaml"
    rising.write_text("{type: linear, points: {0: 0.5, 10: 0.5, 20: 1}}\n")
    with pytest.raises(ConfigError, match=r"never rises.*rises from 1 to 1\.45 around iteration "
                                          r"10 \(weight c_1 = -0\.45\)"):
        weights_from_schedule(str(rising), [0, 10, 20])
    samples = tmp_path / "samples.yaml"
    samples.write_text("{type: linear, from: 1, span: 20, unit: samples}\n")
    with pytest.raises(ConfigError, match="unit 'samples'"):
        weights_from_schedule(str(samples), [0, 10, 20])


def test_window_selection(synthetic, tmp_path):
    from megatron.checkpoint.merge import select_iterations

    load, _ = synthetic
    assert select_iterations(str(load), window=3, every=10) == [10, 20, 30]
    assert select_iterations(str(load), window=2, every=10, window_end=20) == [10, 20]
    assert select_iterations(str(load), iterations=[30, 10]) == [30, 10]
    summary = merge("--load", load, "--window", 3, "--every", 10, "--weights-from-schedule",
                    "linear", "--save", tmp_path / "m")
    weights = [s["weight"] for s in summary["sources"]]
    assert weights == pytest.approx([9 / 40, 1 / 2, 11 / 40])
    merged = json.loads((tmp_path / "m" / "iter_0000030" / "merge.json").read_text())
    assert merged["weights_from"]["decay_multipliers"] == pytest.approx([0.775, 0.275])


# ---------------------------------------------------------------------------- refusals
@pytest.mark.parametrize("argv,message", [
    (["--iterations", 10, 20, "--weights", 1, -1], r"--weights -1\.0 \(iteration 20\): weights "
                                                   "must be non-negative"),
    (["--iterations", 10, 20, "--weights", 0, 0], r"--weights 0 0: all zero"),
    (["--iterations", 10, 20, "--weights", 1, 1, 1], "--weights has 3 values for 2 checkpoints"),
    (["--iterations", 10, 20, "--weights", 1, "nan"], "must be finite"),
    (["--iterations", 10, 40, "--weights", 1, 1], r"--iterations 40: .*iter_0000040 does not "
                                                  "exist .*has iter_0000010, iter_0000020, "
                                                  "iter_0000030"),
    (["--iterations", 10, 10, "--weights", 1, 1], "--iterations: 10 is given twice"),
    (["--window", 5, "--every", 10, "--weights", 1, 1, 1, 1, 1], "starts before iteration 0"),
    (["--window", 2, "--weights", 1, 1], "--window 2 needs --every K"),
    (["--iterations", 10, "--window", 2, "--every", 10, "--weights", 1], "not both"),
    (["--iterations", 10, 20], "--weights W1 W2 ... or with --weights-from-schedule"),
    (["--iterations", 10, 20, "--weights", 1, 1, "--weights-from-schedule", "linear"],
     "one of the two"),
    (["--iterations", 10, 20, "--weights", 1, 1, "--target-tensor-parallel-size", 3],
     "--target-tensor-parallel-size 3 does not divide --num-attention-heads 4"),
    (["--iterations", 10, 20, "--weights", 1, 1, "--target-pipeline-parallel-size", 3],
     "--target-pipeline-parallel-size 3 exceeds the 2 layers"),
])
def test_bad_inputs_are_refused(synthetic, tmp_path, argv, message):
    load, _ = synthetic
    with pytest.raises(ConfigError, match=message):
        merge("--load", load, *argv, "--save", tmp_path / "m")
    assert not (tmp_path / "m").exists()


def test_an_unfinished_checkpoint_and_a_used_save_directory_are_refused(synthetic, tmp_path):
    load, _ = synthetic
    os.makedirs(load / "iter_0000040")
    with pytest.raises(CheckpointError, match="iteration 40 is newer than the latest complete "
                                              r"checkpoint .* \(30, .*may be incomplete"):
        merge("--load", load, "--iterations", 30, 40, "--weights", 1, 1, "--save", tmp_path / "m")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        merge("--load", load, "--iterations", 10, 30, "--weights", 1, 1,
              "--save", tmp_path / "used")
    with pytest.raises(ConfigError, match="is --load"):
        merge("--load", load, "--iterations", 10, 30, "--weights", 1, 1, "--save", load)


@pytest.mark.parametrize("flags,rows,message", [
    ({"num_layers": 3}, 128, r"different models: decoder\.layers\.2\.input_layernorm\.weight is "
                             r"in .*iter_0000020 .* but not in .*iter_0000010"),
    ({"ffn_hidden_size": 64}, 128, r"different models: decoder\.layers\.0\.mlp\.linear_fc1\.weight"
                                   r" is \[96, 32\] in .*iter_0000010.* and \[128, 32\] in "
                                   r".*iter_0000020"),
    ({}, 256, r"the padded vocabulary differs, embedding\.word_embeddings\.weight has 128 rows in "
              r".*iter_0000010 .* and 256 in .*iter_0000020"),
    ({"rotary_base": 500000}, 128, r"different models: --rotary-base is 10000 in .*iter_0000010"
                                   r".* and 500000 in .*iter_0000020"),
])
def test_checkpoints_of_different_models_are_refused_naming_the_tensor(tmp_path, flags, rows,
                                                                      message):
    load = tmp_path / "run"
    write(load, 10)
    write(load, 20, tp=2, rows=rows, **flags)
    with pytest.raises(CheckpointError, match=message):
        merge("--load", load, "--iterations", 10, 20, "--weights", 1, 1, "--save", tmp_path / "m")


# ---------------------------------------------------------------------------- launches
def run_flags(demo_data, run_dir, extra):
    return ["--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--lr", "3e-3", "--lr-decay-style", "constant", "--lr-warmup-iters", "2",
            "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local",
            "--data-path", demo_data["web"], "--split", "98,1,1",
            "--data-cache-path", str(run_dir / "cache"), "--eval-iters", "0",
            "--log-interval", "10", "--seed", "5", "--save", str(run_dir / "ckpt"),
            "--save-interval", "10", *extra]


@pytest.fixture(scope="module")
def trained(demo_data, tmp_path_factory):
    """A 2-rank DP 2 ZeRO-1 run saving at 10, 20, 30, and the merge of the three (0.2, 0.3, 0.5)."""
    from helpers.launch import run_deepspeed

    run_dir = tmp_path_factory.mktemp("merge_run")
    proc = run_deepspeed("pretrain_gpt.py", run_flags(demo_data, run_dir, MODEL + [
        "--train-iters", "30"]))
    assert "data-parallel 2, ZeRO stage 1" in proc.stdout
    merged = run_dir / "merged"
    merge("--load", run_dir / "ckpt", "--iterations", 10, 20, 30,
          "--weights", *WEIGHTS, "--save", merged)
    return run_dir, merged


@pytest.mark.launch
def test_merge_of_a_run_equals_the_weighted_average_under_any_source_layout(trained, tmp_path):
    run_dir, merged = trained
    load = run_dir / "ckpt"
    expected = weighted(load, (10, 20, 30), WEIGHTS)
    assert_close(merged, expected)
    assert json.loads((merged / "iter_0000030" / "model_args.json").read_text()) == json.loads(
        (load / "iter_0000030" / "model_args.json").read_text())
    # the same checkpoints, iteration 20 rewritten at TP 2 x PP 2 (another layout of the sources)
    from megatron.checkpoint.reader import CheckpointReader
    from megatron.checkpoint.writer import write_checkpoint

    mixed = tmp_path / "mixed"
    for it in (10, 30):
        shutil.copytree(load / f"iter_{it:07d}", mixed / f"iter_{it:07d}")
    with CheckpointReader(str(load), 20) as reader:
        write_checkpoint(str(mixed), dict(reader.items()), reader.model_args, tp=2, pp=2,
                         iteration=20)
    (mixed / "latest_checkpointed_iteration.txt").write_text("30\n")
    merge("--load", mixed, "--iterations", 10, 20, 30, "--weights", *WEIGHTS,
          "--save", tmp_path / "m", "--target-tensor-parallel-size", 2)
    assert_close(tmp_path / "m", expected)


@pytest.mark.launch
def test_merged_checkpoint_scores_through_tasks_and_exports_to_hf(trained, tmp_path):
    from megatron.checkpoint.hf.families import to_hf
    from megatron.checkpoint.reader import CheckpointReader
    from megatron.checkpoint.writer import write_checkpoint
    from tasks import zero_shot_rank_classification as rank
    from tools.checkpoint.convert_to_hf import convert

    run_dir, merged = trained
    expected = weighted(run_dir / "ckpt", (10, 20, 30), WEIGHTS)
    with CheckpointReader(str(merged)) as reader:
        model_args = reader.model_args
    write_checkpoint(str(tmp_path / "by_hand"), expected, model_args, iteration=30)
    data = tmp_path / "rank.jsonl"
    data.write_text("".join(json.dumps({"task": "t", "inputs": q, "choices": c, "label": 0}) + "\n"
                            for q, c in (("def main", [":", " x"]), ("The cat", [" sat", " 42"]),
                                         ("1 + 1 =", [" 2", " blue", " ("]))))
    scores = {}
    for name, load in (("merged", merged), ("by_hand", tmp_path / "by_hand")):
        out = tmp_path / f"{name}.json"
        rank.main(["--load", str(load), "--use-checkpoint-args", "--task-data", str(data),
                   "--output-json", str(out), "--transformer-impl", "local"])
        scores[name] = json.loads(out.read_text())["choice_scores"]
    assert all(math.isfinite(s) for row in scores["merged"] for s in row)
    for a, b in zip(scores["merged"], scores["by_hand"], strict=True):
        assert a == pytest.approx(b, abs=1e-4)
    summary = convert(str(merged), str(tmp_path / "hf"))
    assert summary["family"] == "LlamaForCausalLM" and summary["iteration"] == 30
    from safetensors.torch import load_file
    exported = load_file(str(tmp_path / "hf" / "model.safetensors"))
    rows = model_args["vocab_size"]
    for name, tensor in expected.items():
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            tensor = tensor[:rows]
        for hf_name, hf_tensor in to_hf(name, tensor, model_args["model"]):
            assert (exported[hf_name] - hf_tensor).abs().max().item() <= 1e-6, hf_name


@pytest.mark.launch
def test_merged_checkpoint_loads_with_finetune_and_without_the_optimizer(trained, dist_group):
    """What --finetune and --load --no-load-optim do with the merged checkpoint, in process
    (megatron/checkpoint/engine.py through the resharding path, a stand-in engine): the merged
    weights, and the newest source's training state unless --finetune."""
    from types import SimpleNamespace

    from megatron.core import parallel_state

    from megatron.checkpoint.engine import load_checkpoint

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    _, merged = trained
    weights = full_weights(merged, None)
    for finetune in (True, False):
        root = torch.nn.Module()
        for name, tensor in weights.items():
            *path, leaf = name.split(".")
            node = root
            for part in path:
                if not hasattr(node, part):
                    node.add_module(part, torch.nn.Module())
                node = getattr(node, part)
            node.register_parameter(leaf, torch.nn.Parameter(torch.zeros_like(tensor)))
        engine = SimpleNamespace(module=root, optimizer=torch.optim.AdamW(root.parameters()),
                                 zero_optimization_stage=lambda: 0)
        state = load_checkpoint(engine, str(merged), finetune=finetune, load_optimizer=False,
                                load_rng=False, universal=True)
        for name, p in root.named_parameters():
            assert torch.equal(p.detach(), weights[name]), name
        if finetune:
            assert state.iteration == 0
        else:
            assert (state.iteration, state.consumed_samples) == (30, 120)
            assert "opt_param_scheduler" in state.extra


@pytest.mark.launch
def test_resumed_at_another_layout_and_merged_across_layouts(trained, demo_data):
    """--load MERGED --no-load-optim at TP 2 continues the run at iteration 30 from the merged
    weights and saves iteration 40 beside the DP 2 ZeRO-1 checkpoints; 20, 30, 40 merge exactly."""
    from helpers.launch import run_deepspeed

    run_dir, merged = trained
    proc = run_deepspeed("pretrain_gpt.py", run_flags(demo_data, run_dir, [
        "--load", str(merged), "--no-load-optim", "--use-checkpoint-args",
        "--tensor-model-parallel-size", "2", "--train-iters", "40",
        "--override-opt_param-scheduler"]))
    assert f"resumed from --load {merged} at iteration 30, consumed samples 120" in proc.stdout
    load = run_dir / "ckpt"
    layout = json.loads((load / "iter_0000040" / "parallel_layout.json").read_text())
    assert layout["tensor_model_parallel_size"] == 2
    out = run_dir / "merged_across"
    merge("--load", load, "--window", 3, "--every", 10, "--weights", 1, 1, 2, "--save", out)
    assert_close(out, weighted(load, (20, 30, 40), (0.25, 0.25, 0.5)), iteration=40)
