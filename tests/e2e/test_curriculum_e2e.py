"""End to end: a blend file's run through the deepspeed launcher with 2 CPU ranks that ends off a
batch boundary. (Weighted split paths with every validation group evaluated and logged on its own:
tests/e2e/test_small_corpus_splits.py.) (A blend file trained and resumed under an edited mix, with its groups evaluated
on their own and an offline Weights & Biases run holding the same records:
tests/e2e/test_mix_edit_e2e.py; a bad blend file stops the entry point with one error line:
tests/e2e/test_bad_inputs.py::test_entry_point_bad_blend_file.)"""
import json

import pytest

from helpers.launch import read_jsonl, run_ranks

pytestmark = pytest.mark.launch

ITERS = 8


def base_flags(run_dir):
    return ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
            "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", str(ITERS), "--lr", "1e-3", "--lr-decay-style", "cosine",
            "--log-interval", "1", "--eval-interval", "4", "--eval-iters", "1",
            "--data-cache-path", str(run_dir / "cache"), "--metrics-jsonl", str(run_dir / "m.jsonl"),
            "--hidden-dropout", "0", "--attention-dropout", "0"]


def blend_file(demo_data, path):
    config = {
        "train": {"blend": [
            {"path": demo_data["web"], "split": "0:0.9", "weight": 1},
            {"path": demo_data["code"], "split": "0:0.9",
             "weight": {"type": "linear", "unit": "iterations", "points": {0: 0, ITERS: 2}}},
            {"path": demo_data["math"], "split": "0:0.9",
             "weight": {"type": "step", "unit": "iterations", "points": {0: 1, ITERS // 2: 0}}}]},
        "valid": [{"name": "web_heldout", "path": demo_data["web"], "split": "0.9:1"},
                  {"name": "math_heldout", "path": demo_data["math"], "split": "0.9:1"}],
    }
    path.write_text(json.dumps(config))
    return path


def test_train_samples_off_a_batch_boundary_finishes_saves_and_evaluates(demo_data, tmp_path):
    """--train-samples 10 at global batch 4: 2 iterations (8 samples; the partial batch is dropped,
    as Megatron-LM does), and the blend file's training set holds exactly those samples, so the
    run ends with its final save and evaluation instead of a StopIteration."""
    config = blend_file(demo_data, tmp_path / "blend.json")
    flags = base_flags(tmp_path) + ["--data-blend-config", str(config), "--save", str(tmp_path / "ckpt")]
    i = flags.index("--train-iters")
    flags[i:i + 2] = ["--train-samples", "10"]
    proc = run_ranks("pretrain_gpt.py", flags, num_ranks=1)  # nothing here needs a second rank
    records = read_jsonl(tmp_path / "m.jsonl")
    train = [r for r in records if "split" not in r]
    assert [(r["iteration"], r["consumed_samples"]) for r in train] == [(1, 4), (2, 8)]
    assert "training: 2 iterations" in proc.stdout and "curriculum: 8 training samples" in proc.stdout
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    evals = [(r["iteration"], r["group"]) for r in records if r.get("split") == "valid"]
    assert evals == [(2, "web_heldout"), (2, "math_heldout")]
