"""End to end: pretrain_gpt.py through the deepspeed launcher with 2 CPU ranks, then --finetune from
its checkpoint. (Resuming is tested bitwise in tests/e2e/test_exact_resume_e2e.py, and unusable
checkpoints in tests/e2e/test_checkpoint_safety.py; a batch-size rampup through the engines against
megatron-core's rule in tests/e2e/test_pipeline_parallel.py.)"""
import pytest

from helpers.flags import TINY_MODEL
from helpers.launch import read_jsonl, run_deepspeed

pytestmark = pytest.mark.launch

TRAIN_ITERS = 24


def flags(demo_data, run_dir, extra=()):
    return TINY_MODEL + [
        "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", str(TRAIN_ITERS), "--lr", "3e-3", "--min-lr", "3e-4",
        "--lr-decay-style", "cosine", "--lr-warmup-iters", "4",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--zero-stage", "1",
        "--data-path", "0.5", demo_data["web"], "0.3", demo_data["code"], "0.2", demo_data["math"],
        "--split", "90,5,5", "--data-cache-path", str(run_dir / "cache"),
        "--log-interval", "1", "--eval-interval", "12", "--eval-iters", "2",
        "--save", str(run_dir / "ckpt"), "--save-interval", "12",
        "--metrics-jsonl", str(run_dir / "metrics.jsonl"), "--seed", "7", *extra]


@pytest.fixture(scope="module")
def full_run(demo_data, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("full")
    proc = run_deepspeed("pretrain_gpt.py", flags(demo_data, run_dir))
    return run_dir, proc, read_jsonl(run_dir / "metrics.jsonl")


def test_loss_falls_and_records_are_written(full_run):
    run_dir, proc, records = full_run
    train = [r for r in records if "split" not in r]
    assert [r["iteration"] for r in train] == list(range(1, TRAIN_ITERS + 1))
    for key in ("iteration", "consumed_samples", "consumed_tokens", "lr", "weight_decay", "lm_loss",
                "grad_norm", "per_dataset_loss"):
        assert key in train[0], key
    assert [r["consumed_samples"] for r in train] == [8 * i for i in range(1, TRAIN_ITERS + 1)]
    assert train[-1]["consumed_tokens"] == 8 * TRAIN_ITERS * 64
    assert set(train[-1]["per_dataset_loss"]) <= {"web", "code", "math"}
    first = sum(r["lm_loss"] for r in train[:3]) / 3
    last = sum(r["lm_loss"] for r in train[-3:]) / 3
    assert last < first - 0.5, (first, last)
    assert all(r["grad_norm"] is not None and r["grad_norm"] > 0 for r in train)
    evals = [r for r in records if r.get("split") == "valid"]
    assert [(r["iteration"], r["group"]) for r in evals] == [(12, "valid"), (24, "valid")]
    assert evals[1]["lm_loss"] < evals[0]["lm_loss"]
    assert any(r.get("split") == "test" for r in records)
    assert " iteration       24/      24 |" in proc.stdout
    assert "lm loss:" in proc.stdout and "grad norm:" in proc.stdout


def test_checkpoints_written_atomically(full_run):
    run_dir, _, _ = full_run
    ckpt = run_dir / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(TRAIN_ITERS)
    for it in (12, TRAIN_ITERS):
        directory = ckpt / f"iter_{it:07d}"
        assert (directory / "rng_state_rank0.pt").is_file()
        assert (directory / "rng_state_rank1.pt").is_file()
        assert any(p.name.endswith("model_states.pt") for p in directory.iterdir())
    assert not [p for p in ckpt.iterdir() if ".tmp." in p.name]


def test_finetune_says_what_it_loaded_and_what_starts_fresh(full_run, demo_data, tmp_path):
    """--finetune --load: the weights of the latest checkpoint (iteration 24), everything else
    fresh; the log says which checkpoint and that counters, optimizer and scheduler were reset."""
    run_dir, _, records = full_run
    ckpt = run_dir / "ckpt"
    finetune = flags(demo_data, tmp_path, ["--load", str(ckpt), "--finetune"])
    finetune[finetune.index("--train-iters") + 1] = "2"
    finetune[finetune.index("--lr-warmup-iters") + 1] = "0"
    finetune[finetune.index("--data-cache-path") + 1] = str(run_dir / "cache")
    proc = run_deepspeed("pretrain_gpt.py", finetune)
    assert (f"--finetune: loaded the model weights of {ckpt / 'iter_0000024'} (iteration 24 of "
            f"--load {ckpt})") in proc.stdout, proc.stdout[-3000:]
    assert ("iteration, consumed samples, optimizer state, learning-rate/weight-decay scheduler "
            "and RNG start fresh (iteration 0)") in proc.stdout
    assert "resumed from" not in proc.stdout
    train = [r for r in read_jsonl(tmp_path / "metrics.jsonl") if "split" not in r]
    assert [(r["iteration"], r["consumed_samples"]) for r in train] == [(1, 8), (2, 16)]
    first_pretrain_loss = [r for r in records if "split" not in r][0]["lm_loss"]
    assert train[0]["lm_loss"] < first_pretrain_loss - 0.5  # the trained weights, not fresh ones
