"""Exact resume: a run killed with SIGKILL at a random iteration and resumed with ``--load`` logs
bitwise the same per-iteration lr, consumed samples, per-dataset losses and loss as one that was
never stopped (CPU, 2 ranks through the real ``deepspeed`` launcher); and a 2-rank checkpoint resumed
on 1 rank continues the same consumed-samples, lr and global-sample sequence.

Scenarios are entries of ``SCENARIOS`` (pretraining with a curriculum blend file and a staged LR
schedule; packed T0 finetuning); every test below picks each up.
"""
import json
import os
import random
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Callable, Dict, List

import psutil
import pytest
import torch

from conftest import ROOT, free_port
from e2e_helpers import deepspeed_launcher, read_jsonl, run_deepspeed, run_ranks

TRAIN_ITERS = 16
KILL_SEED = 20261202  # the kill points are random, but the same in every test run
COMPARED = ("consumed_samples", "consumed_tokens", "lr", "weight_decay", "lm_loss", "grad_norm",
            "per_dataset_loss", "samples_drawn")  # samples_drawn: the data ledger

STAGED_LR = """\
lr_schedule:
  - start: 0
    schedule: {type: linear, from: 0.0, to: 3.0e-3}
  - start: 3
    schedule: {type: constant, value: 3.0e-3}
  - start: 7
    schedule: {type: cosine, from: 3.0e-3, to: 3.0e-4}
"""


# ------------------------------------------------------------------ scenarios
CURRICULUM = """\
train:
  blend:
    - {{path: {web}, split: "0:0.95", weight: 1}}
    - path: {code}
      split: "0:0.95"
      weight: {{type: linear, unit: iterations, points: {{0: 0, 16: 2}}}}
    - path: {math}
      split: "0:0.95"
      weight: {{type: step, unit: samples, points: {{0: 1, 64: 0.2}}}}
valid:
  - {{name: web_heldout, path: {web}, split: "0.95:1"}}
"""


def pretrain_flags(data: Dict[str, str], run_dir, extra=()) -> List[str]:
    """Staged LR from --lr-schedule-config and a 3-dataset curriculum from --data-blend-config."""
    schedule = os.path.join(data["dir"], "staged_lr.yaml")
    return [
        "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", str(TRAIN_ITERS), "--lr", "3e-3", "--lr-schedule-config", schedule,
        "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7",
        "--data-blend-config", os.path.join(data["dir"], "curriculum.yaml"),
        "--data-cache-path", os.path.join(data["dir"], "cache"),
        "--eval-iters", "1", "--eval-interval", "5", "--log-interval", "1",
        "--save", str(run_dir / "ckpt"), "--save-interval", "1",
        "--metrics-jsonl", str(run_dir / "metrics.jsonl"), *extra]


def make_pretrain_data(out) -> Dict[str, str]:
    from tools.make_demo_data import make_demo_data
    data = dict(make_demo_data(str(out), size_mb=0.2, verbose=False), dir=str(out))
    with open(os.path.join(str(out), "staged_lr.yaml"), "w") as f:
        f.write(STAGED_LR)
    with open(os.path.join(str(out), "curriculum.yaml"), "w") as f:
        f.write(CURRICULUM.format(**data))
    return data


def t0_flags(data: Dict[str, str], run_dir, extra=()) -> List[str]:
    """Packed T0 finetuning with --prefix-lm; dropout on, so the restored RNG streams matter."""
    train = ", ".join(f"1 0:1 {data['train_' + t]}" for t in ("sentiment", "copy", "addition"))
    return [
        "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "128", "--transformer-impl", "local",
        "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", str(TRAIN_ITERS),
        "--lr", "2e-3", "--lr-decay-style", "cosine", "--lr-warmup-iters", "2",
        "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--seed", "3",
        "--train-weighted-split-paths", f"TRAIN: {train}",
        "--valid-weighted-split-paths", f"copy_valid: 1 0:1 {data['valid_copy']}",
        "--data-cache-path", os.path.join(data["dir"], "cache"),
        "--eval-iters", "1", "--eval-interval", "5", "--log-interval", "1",
        "--save", str(run_dir / "ckpt"), "--save-interval", "1",
        "--metrics-jsonl", str(run_dir / "metrics.jsonl"),
        "--prefix-lm", "--norm-target-loss", *extra]


def make_t0_data(out) -> Dict[str, str]:
    from tools.make_toy_multitask import make_toy_multitask
    data = make_toy_multitask(str(out), examples_per_task=100, preprocess=True,
                              rank_eval_per_task=5, pretrain_docs=10)
    return dict(data, dir=str(out))


@dataclass
class Scenario:
    script: str
    flags: Callable  # (data, run_dir, extra) -> flags
    make_data: Callable  # (directory) -> data dict (with "dir")


SCENARIOS = {
    "pretrain_staged_lr_curriculum": Scenario("pretrain_gpt.py", pretrain_flags, make_pretrain_data),
    "t0_packed_prefix_lm": Scenario("finetune_t0.py", t0_flags, make_t0_data),
}


# ------------------------------------------------------------------ helpers
def train_records(path) -> List[dict]:
    """Training records of a metrics file that may still be written (a partial last line is
    skipped)."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path) as f:
        for line in f:
            if not line.endswith("\n"):
                break
            record = json.loads(line)
            if "split" not in record:
                records.append(record)
    return records


def eval_records(path) -> List[dict]:
    return [r for r in read_jsonl(path) if "split" in r]


def run_and_sigkill(script: str, flags: List[str], metrics, after_iteration: int,
                    log_path, num_ranks: int = 2, timeout: float = 300) -> None:
    """Launch through ``deepspeed``; once ``metrics`` shows ``after_iteration``, SIGKILL every rank
    and the launcher at once (no clean exit, no signal handler)."""
    cmd = [deepspeed_launcher(), "--num_gpus", str(num_ranks), "--master_port", str(free_port()),
           os.path.join(ROOT, script)] + flags
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.time() + timeout
            while not any(r["iteration"] >= after_iteration for r in train_records(metrics)):
                assert proc.poll() is None, open(log_path).read()[-4000:]
                assert time.time() < deadline, "run did not reach the kill point in time"
                time.sleep(0.02)
            victims = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
            assert sum(any(a.startswith("--local_rank=") for a in p.cmdline()) for p in victims) \
                == num_ranks
            for p in victims:
                try:
                    p.send_signal(signal.SIGKILL)
                except psutil.NoSuchProcess:
                    pass
            proc.wait(timeout=30)
            _, alive = psutil.wait_procs(victims[1:], timeout=30)
            assert not alive, alive
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.returncode


def assert_same_records(got: List[dict], want: List[dict]) -> None:
    """Bitwise equality (exact float ==) of every compared key, iteration by iteration."""
    assert [r["iteration"] for r in got] == [r["iteration"] for r in want]
    for g, w in zip(got, want):
        for key in COMPARED:
            assert g[key] == w[key], (g["iteration"], key, g[key], w[key])


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One uninterrupted run per scenario (built on first use): (data, run_dir, training records,
    evaluation records)."""
    cache = {}

    def get(name: str):
        if name not in cache:
            scenario = SCENARIOS[name]
            data = scenario.make_data(tmp_path_factory.mktemp(f"{name}_data"))
            run_dir = tmp_path_factory.mktemp(f"{name}_reference")
            run_deepspeed(scenario.script, scenario.flags(data, run_dir))
            records = train_records(run_dir / "metrics.jsonl")
            assert [r["iteration"] for r in records] == list(range(1, TRAIN_ITERS + 1))
            cache[name] = (data, run_dir, records, eval_records(run_dir / "metrics.jsonl"))
        return cache[name]

    return get


# ------------------------------------------------------------------ end to end
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_sigkill_then_resume_is_bitwise_identical(name, reference, tmp_path):
    scenario = SCENARIOS[name]
    data, _, want, want_evals = reference(name)
    # in the first half, so a fast machine cannot finish the run before the kill lands
    kill_after = random.Random(f"{KILL_SEED}:{name}").randint(2, TRAIN_ITERS // 2)
    killed_dir = tmp_path / "killed"
    killed_dir.mkdir()
    run_and_sigkill(scenario.script, scenario.flags(data, killed_dir), killed_dir / "metrics.jsonl",
                    kill_after, tmp_path / "killed.log")
    before = train_records(killed_dir / "metrics.jsonl")
    assert_same_records(before, want[:len(before)])
    tracker = int((killed_dir / "ckpt" / "latest_checkpointed_iteration.txt").read_text())
    assert kill_after - 1 <= tracker <= before[-1]["iteration"] < TRAIN_ITERS, (kill_after, tracker)

    resumed_flags = scenario.flags(data, killed_dir, ["--load", str(killed_dir / "ckpt")])
    resumed_flags[resumed_flags.index("--metrics-jsonl") + 1] = str(tmp_path / "resumed.jsonl")
    proc = run_deepspeed(scenario.script, resumed_flags)
    assert f"resumed from --load {killed_dir / 'ckpt'} at iteration {tracker}," in proc.stdout
    after = train_records(tmp_path / "resumed.jsonl")
    assert_same_records(after, want[tracker:])
    # evaluations after the resume point (periodic and final) read the same windows of the same
    # model: equal losses
    evals = [(r["iteration"], r["group"], r["lm_loss"]) for r in eval_records(tmp_path / "resumed.jsonl")]
    assert evals and evals == [(r["iteration"], r["group"], r["lm_loss"]) for r in want_evals
                               if r["iteration"] > tracker]
    assert (killed_dir / "ckpt" / "latest_checkpointed_iteration.txt").read_text().strip() \
        == str(TRAIN_ITERS)


def test_resume_on_fewer_data_parallel_ranks(reference, tmp_path):
    """A 2-rank (ZeRO-1) checkpoint resumed on 1 rank. DeepSpeed cannot re-partition ZeRO-1
    optimizer states to another data-parallel size (its universal-checkpoint conversion does not
    handle megatron-core's ``_extra_state`` entries), so the optimizer state is not loaded
    (--no-load-optim): the model, scheduler, consumed samples and data order carry over."""
    data, run_dir, want, _ = reference("pretrain_staged_lr_curriculum")
    start = 5
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    shutil.copytree(run_dir / "ckpt" / f"iter_{start:07d}", ckpt / f"iter_{start:07d}")
    (ckpt / "latest_checkpointed_iteration.txt").write_text(f"{start}\n")
    flags = pretrain_flags(data, tmp_path, ["--load", str(ckpt), "--no-load-optim"])
    proc = run_ranks("pretrain_gpt.py", flags, num_ranks=1)
    assert "data-parallel 1," in proc.stdout
    got = train_records(tmp_path / "metrics.jsonl")
    ref = want[start:]
    assert [r["iteration"] for r in got] == [r["iteration"] for r in ref]
    for key in ("consumed_samples", "consumed_tokens", "lr", "weight_decay"):
        assert [r[key] for r in got] == [r[key] for r in ref], key
    assert [sorted(r["per_dataset_loss"]) for r in got] == [sorted(r["per_dataset_loss"]) for r in ref]
    # The first resumed iteration runs the same weights on the same micro batches (the same pairs
    # of global samples, see the sampler test below), and the logged losses are float64 sums of the
    # same float32 micro-batch values, so they are equal exactly; later iterations differ only
    # because the Adam moments were not loaded.
    assert got[0]["lm_loss"] == ref[0]["lm_loss"]
    assert got[0]["per_dataset_loss"] == ref[0]["per_dataset_loss"]


# ------------------------------------------------------------------ unit level
def _global_order(dp: int, micro_batch_size: int, consumed: int, total: int, steps: int):
    """Global sample indices each optimizer step would read, as sets of micro batches."""
    from megatron.data.samplers import PretrainingBatchSampler
    iters = [iter(PretrainingBatchSampler(total, consumed, micro_batch_size, r, dp)) for r in range(dp)]
    order = []
    for _ in range(steps):
        for it in iters:  # rank order within a step
            order.append(tuple(next(it)))
    return order


@pytest.mark.parametrize("consumed", [0, 40])
def test_global_sample_order_is_independent_of_data_parallel_size(consumed):
    # 2 ranks x 2 steps (gradient accumulation 2) and 1 rank x 4 steps read the same micro batches
    # of the global batch of 8 samples, in the same order, from any resume point.
    two = _global_order(2, 2, consumed, 1000, steps=8)
    one = _global_order(1, 2, consumed, 1000, steps=16)
    assert two == one
    assert [i for mb in one for i in mb] == list(range(consumed, consumed + 32))


def test_blended_dataset_index_is_independent_of_world(tmp_path, dist_group):
    """The curriculum dataset (global sample -> dataset, sample) is rebuilt identically from the
    same flags, so a resumed run with any data-parallel size reads the same global samples."""
    from megatron.config.arguments import parse_args
    from megatron.data.builder import build_pretraining_data
    from megatron.tokenizer import build_tokenizer
    data = make_pretrain_data(tmp_path / "data")
    datasets = []
    for run in ("a", "b"):
        args = parse_args(pretrain_flags(data, tmp_path / run))
        args.data_cache_path = str(tmp_path / f"cache_{run}")  # built from scratch each time
        args.tokenizer = build_tokenizer(args)
        datasets.append(build_pretraining_data(args, args.tokenizer).train)
    a, b = datasets
    assert len(a) == len(b)
    for i in range(0, 8 * TRAIN_ITERS):
        sa, sb = a[i], b[i]
        assert int(sa["dataset_id"]) == int(sb["dataset_id"])
        assert torch.equal(torch.as_tensor(sa["tokens"]), torch.as_tensor(sb["tokens"]))


def test_dataloader_does_not_draw_from_the_global_rng(dist_group):
    """Creating the training iterator must not advance torch's global generator: a resumed run
    creates it right after restoring the RNG state, the uninterrupted one did not, so a draw here
    shifted every later dropout mask (found by the kill/resume test with dropout on)."""
    import argparse
    from megatron.core import parallel_state
    from megatron.train.loader import _loader
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel()
    dataset = [{"x": torch.tensor([i])} for i in range(16)]
    args = argparse.Namespace(micro_batch_size=2, num_workers=0, seed=1)
    before = torch.get_rng_state()
    next(_loader(dataset, 4, args))
    assert torch.equal(torch.get_rng_state(), before)
