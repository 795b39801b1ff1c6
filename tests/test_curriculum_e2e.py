"""End to end: pretrain_gpt.py with a curriculum blend file and with weighted split paths, through
the deepspeed launcher with 2 CPU ranks; every validation group is evaluated and logged on its own,
in metrics.jsonl and in an offline Weights & Biases run that holds the same records. (A bad blend
file stops the entry point with one error line:
tests/test_bad_inputs.py::test_entry_point_bad_blend_file.)"""
import json

from e2e_helpers import read_jsonl, run_deepspeed, run_ranks
from wandb_helpers import offline_runs, read_run, wandb_env

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


def test_curriculum_blend_file_end_to_end(demo_data, tmp_path):
    config = blend_file(demo_data, tmp_path / "blend.json")
    flags = base_flags(tmp_path) + ["--data-blend-config", str(config)]
    flags += ["--wandb-project", "curriculum", "--wandb-exp-name", "blend",
              "--wandb-save-dir", str(tmp_path / "wandb_runs")]  # an offline W&B run as well
    proc = run_deepspeed("pretrain_gpt.py", flags, env=wandb_env(tmp_path))
    records = read_jsonl(tmp_path / "m.jsonl")
    train = [r for r in records if "split" not in r]
    assert [r["iteration"] for r in train] == list(range(1, ITERS + 1))
    # math's weight steps to 0 at iteration 4: no math samples afterwards; code fades in
    assert "math" in train[0]["per_dataset_loss"]
    assert all("math" not in r["per_dataset_loss"] for r in train[ITERS // 2 + 1:])
    assert any("code" in r["per_dataset_loss"] for r in train[ITERS // 2:])
    evals = [(r["iteration"], r["group"]) for r in records if r.get("split") == "valid"]
    assert evals == [(4, "web_heldout"), (4, "math_heldout"), (8, "web_heldout"), (8, "math_heldout")]
    assert "valid web_heldout | iteration 8" in proc.stdout
    assert "curriculum:" in proc.stdout
    _assert_wandb_run_holds_the_records(tmp_path / "wandb_runs", records, str(config))


def _assert_wandb_run_holds_the_records(save_dir, records, config_path):
    """One offline run (rank 0's), config = the validated args, and at each iteration as the
    step exactly the values metrics.jsonl holds: every training scalar and per-dataset loss,
    and each validation group's loss and perplexity under the group's name."""
    runs = offline_runs(save_dir)
    assert len(runs) == 1, runs
    run = read_run(runs[0])
    assert (run["project"], run["name"]) == ("curriculum", "blend")
    assert run["config"]["data_blend_config"] == config_path
    assert (run["config"]["train_iters"], run["config"]["data_parallel_size"]) == (ITERS, 2)
    history = run["history"]
    assert sorted(history) == list(range(1, ITERS + 1))
    for r in (r for r in records if "split" not in r):
        row = history[r["iteration"]]
        for key in ("lm_loss", "lr", "weight_decay", "global_batch_size", "consumed_samples",
                    "consumed_tokens", "tokens_per_second", "grad_norm"):
            assert row.get(f"train/{key}") == r[key], (r["iteration"], key)
        per_dataset = {k.rsplit("/", 1)[1]: v for k, v in row.items()
                       if k.startswith("train/per_dataset_loss/")}
        assert per_dataset == r["per_dataset_loss"] and per_dataset
    evals = [r for r in records if r.get("split") == "valid"]
    assert evals
    for r in evals:
        row = history[r["iteration"]]
        assert row[f"valid/{r['group']}/lm_loss"] == r["lm_loss"]
        assert row[f"valid/{r['group']}/ppl"] == r["ppl"]


def test_weighted_split_paths_end_to_end(demo_data, tmp_path):
    groups = tmp_path / "valid_groups.txt"
    groups.write_text(f'"VALID_WEB: 1 0.95:1 {demo_data["web"]}" "VALID_CODE: 1 0.95:1 {demo_data["code"]}"\n')
    flags = base_flags(tmp_path) + [
        "--train-weighted-split-paths",
        f"TRAIN: 0.6 0:0.95 {demo_data['web']}, 0.4 0:0.95 {demo_data['code']}",
        "--valid-weighted-split-paths-path", str(groups)]
    run_deepspeed("pretrain_gpt.py", flags)
    records = read_jsonl(tmp_path / "m.jsonl")
    evals = [(r["iteration"], r["group"]) for r in records if r.get("split") == "valid"]
    assert evals == [(4, "VALID_WEB"), (4, "VALID_CODE"), (8, "VALID_WEB"), (8, "VALID_CODE")]
    assert all(r["lm_loss"] > 0 for r in records if r.get("split") == "valid")
    assert set(records[0]["per_dataset_loss"]) <= {"web", "code"}


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
