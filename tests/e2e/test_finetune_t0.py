"""finetune_t0.py: flags, weighted-split groups, and an end-to-end finetune through the deepspeed
launcher (2 CPU ranks) followed by zero-shot rank classification of the saved checkpoint."""
import argparse
import json

import pytest

import finetune_t0
from helpers.flags import TINY_MODEL
from helpers.launch import read_jsonl, run_deepspeed, run_ranks

TRAIN_ITERS = 160
EVAL_INTERVAL = 20
MODEL = TINY_MODEL + ["--seq-length", "256", "--transformer-impl", "local"]


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    from tools.make_toy_multitask import make_toy_multitask
    out = tmp_path_factory.mktemp("toy_mtf")
    return make_toy_multitask(str(out), examples_per_task=600, preprocess=True,
                              rank_eval_per_task=100)


def t0_flags(toy, run_dir, extra=()):
    train = ", ".join(f"1 0:1 {toy['train_' + t]}" for t in
                      ("sentiment", "topic", "copy", "addition", "contains"))
    return MODEL + [
        "--micro-batch-size", "4", "--global-batch-size", "8", "--train-iters", str(TRAIN_ITERS),
        "--lr", "2e-3", "--lr-decay-style", "constant", "--weight-decay", "0",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "3",
        "--train-weighted-split-paths", f"TRAIN: {train}",
        "--valid-weighted-split-paths",
        f"animal_or_object: 1 0:1 {toy['heldout_animal_or_object']}",
        f"first_word: 1 0:1 {toy['heldout_first_word']}",
        f"copy_valid: 1 0:1 {toy['valid_copy']}",
        "--data-cache-path", str(run_dir / "cache"), "--log-interval", "10",
        "--eval-interval", str(EVAL_INTERVAL), "--eval-iters", "2",
        "--save", str(run_dir / "ckpt"), "--metrics-jsonl", str(run_dir / "metrics.jsonl"),
        "--prefix-lm", "--norm-target-loss", *extra]


# ------------------------------------------------------------------ unit tests
def _parser():
    return finetune_t0.extra_args_provider(argparse.ArgumentParser())


def test_extra_flags_defaults():
    args = _parser().parse_args([])
    assert args.loss_on_targets_only is True and not args.prefix_lm and not args.norm_target_loss
    args = _parser().parse_args(["--no-loss-on-targets-only", "--prefix-lm", "--norm-target-loss"])
    assert args.loss_on_targets_only is False and args.prefix_lm and args.norm_target_loss


def test_weighted_split_groups(tmp_path):
    from helpers.flags import parsed
    from megatron.config.data_flags import weighted_split_groups_from_args
    from megatron.data import mtf_builder

    args = parsed(["--train-weighted-split-paths", "TRAIN: 0.3 0:0.95 data/a, 0.7 0:0.95 data/b",
                   "--valid-weighted-split-paths", "VA: 1 0.95:1 data/a", "VB: 1 0.95:1 data/b"],
                  extra_args_provider=finetune_t0.extra_args_provider)
    groups = weighted_split_groups_from_args(args, check_files=False)
    assert mtf_builder.weighted_split_groups(groups, "train") == [
        ("TRAIN", [(0.3, 0.0, 0.95, "data/a"), (0.7, 0.0, 0.95, "data/b")])]
    assert [g[0] for g in mtf_builder.weighted_split_groups(groups, "valid")] == ["VA", "VB"]


def test_bad_group_is_named(toy, tmp_path):
    from megatron.errors import ConfigError
    flags = t0_flags(toy, tmp_path)
    i = flags.index("--valid-weighted-split-paths")
    flags[i + 1] = "VA: 1 0.95-1 data/a"
    with pytest.raises(ConfigError, match="VA"):
        finetune_t0.parse_t0_args(flags)


def test_prefix_lm_with_input_loss_is_refused(toy, tmp_path):
    from megatron.errors import ConfigError
    with pytest.raises(ConfigError, match="--prefix-lm needs --loss-on-targets-only"):
        finetune_t0.parse_t0_args(t0_flags(toy, tmp_path, ["--no-loss-on-targets-only"]))


def test_datasets_provider_builds_named_groups(toy, tmp_path, dist_group):
    from megatron.config.tokenizer_flags import tokenizer_setup_from_args
    args = finetune_t0.parse_t0_args(t0_flags(toy, tmp_path))
    args.tokenizer = tokenizer_setup_from_args(args).tokenizer
    data = finetune_t0.datasets_provider(args)
    assert [g.name for g in data.eval_groups] == ["animal_or_object", "first_word", "copy_valid"]
    assert data.dataset_names == ["train_sentiment", "train_topic", "train_copy", "train_addition",
                                  "train_contains"]
    assert len(data.train) >= TRAIN_ITERS * 8
    sample = data.train[0]
    # compact attention structure (--prefix-lm), no dense [1, s, s] mask
    assert "attention_mask" not in sample and "dataset_id" in sample
    assert sample["segment_ids"].shape == sample["is_prefix"].shape == (256,)
    weights = sample["loss_mask"]
    assert abs(float(weights.sum()) - int(sample["segment_ids"].max())) < 1e-4  # norm-target-loss


# ------------------------------------------------------------------ end to end
@pytest.fixture(scope="module")
def finetune_run(toy, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("t0_run")
    proc = run_deepspeed("finetune_t0.py", t0_flags(toy, run_dir))
    return run_dir, proc, read_jsonl(run_dir / "metrics.jsonl")


@pytest.mark.launch
def test_e2e_heldout_validation_loss_falls(finetune_run):
    run_dir, proc, records = finetune_run
    train = [r for r in records if "split" not in r]
    assert train[-1]["iteration"] == TRAIN_ITERS
    assert set(train[-1]["per_dataset_loss"]) <= {"train_sentiment", "train_topic", "train_copy",
                                                  "train_addition", "train_contains"}
    assert train[-1]["lm_loss"] < train[0]["lm_loss"] - 1.0
    valid = [r for r in records if r.get("split") == "valid"]
    groups = {"animal_or_object", "first_word", "copy_valid"}
    assert {r["group"] for r in valid} == groups
    by_group = {g: [r for r in valid if r["group"] == g] for g in groups}
    for g, recs in by_group.items():
        assert [r["iteration"] for r in recs] == list(range(EVAL_INTERVAL, TRAIN_ITERS + 1,
                                                            EVAL_INTERVAL)), g
        assert all("lm_loss" in r and "ppl" in r for r in recs)
    heldout_first = sum(by_group[g][0]["lm_loss"] for g in ("animal_or_object", "first_word"))
    heldout_best = min(sum(by_group[g][k]["lm_loss"] for g in ("animal_or_object", "first_word"))
                       for k in range(1, len(by_group["first_word"])))
    assert heldout_best < heldout_first - 0.5, (heldout_first, heldout_best)
    assert by_group["copy_valid"][-1]["lm_loss"] < by_group["copy_valid"][0]["lm_loss"] - 1.0
    assert "valid first_word | iteration" in proc.stdout


@pytest.mark.launch
def test_rank_classification_above_chance_after_finetuning(finetune_run, toy, dist_group):
    from tasks import zero_shot_rank_classification as rank
    run_dir, _, _ = finetune_run
    out = run_dir / "rank.json"
    results = rank.main(MODEL + ["--load", str(run_dir / "ckpt"), "--task-data", toy["rank_eval"],
                                 "--prefix-lm", "--append-eod", "--output-json", str(out)])
    tasks = results["tasks"]
    assert set(tasks) == {"sentiment", "copy", "contains", "animal_or_object", "first_word"}
    assert tasks["copy"]["total"] == 100 and tasks["copy"]["chance"] == 0.5
    # 100 two-way questions: >= 75 correct is far beyond chance (p < 1e-6)
    assert tasks["copy"]["accuracy"] >= 0.75, tasks
    assert json.loads(out.read_text())["tasks"]["copy"]["accuracy"] == tasks["copy"]["accuracy"]


@pytest.mark.launch
def test_train_samples_off_a_batch_boundary_finishes_saves_and_evaluates(toy, tmp_path):
    """--train-samples 10 at global batch 4: 2 iterations (8 samples, the partial batch dropped);
    the packed T0 training set is sized for them, so the run saves and evaluates at the end."""
    flags = t0_flags(toy, tmp_path)
    for flag, value in (("--train-iters", None), ("--micro-batch-size", "2"),
                        ("--global-batch-size", "4"), ("--log-interval", "1")):
        i = flags.index(flag)
        flags[i:i + 2] = ["--train-samples", "10"] if value is None else [flag, value]
    proc = run_ranks("finetune_t0.py", flags, num_ranks=1)  # nothing here needs a second rank
    records = read_jsonl(tmp_path / "metrics.jsonl")
    train = [r for r in records if "split" not in r]
    assert [(r["iteration"], r["consumed_samples"]) for r in train] == [(1, 4), (2, 8)]
    assert "training: 2 iterations" in proc.stdout
    assert (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() == "2"
    valid = [(r["iteration"], r["group"]) for r in records if r.get("split") == "valid"]
    assert valid == [(2, "animal_or_object"), (2, "first_word"), (2, "copy_valid")]
