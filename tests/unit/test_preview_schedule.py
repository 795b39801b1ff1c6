"""tools/preview_schedule.py: the JSON equals stepping the scheduler; a 1e6-iteration preview runs.
The tool run as a command: tests/e2e/test_preview_schedule_e2e.py."""
import json
import os
import sys
import time

import numpy as np
import pytest
import torch

from helpers.flags import TINY_SCHEDULE as BASE
from helpers.paths import ROOT
from megatron.config.batch_flags import batch_schedule_from_args, train_iterations_from_args
from megatron.config.parser import parse_args
from megatron.optim.learning_rates import build_opt_param_scheduler

sys.path.insert(0, os.path.join(ROOT, "tools"))
import preview_schedule  # noqa: E402


def stepped(flags):
    """(consumed_samples, lr, wd) per iteration from stepping the real scheduler."""
    args = parse_args(BASE + flags.split(), world_size=1, require_data=False)
    bs = batch_schedule_from_args(args)
    iters = train_iterations_from_args(args, bs)
    opt = torch.optim.SGD([{"params": [torch.nn.Parameter(torch.zeros(1))], "wd_mult": 1.0,
                            "lr_mult": 1.0}], lr=1.0)
    sched = build_opt_param_scheduler(args.run_config.schedule, opt)
    consumed, samples, lr, wd = 0, [], [], []
    for _i in range(iters + 1):
        samples.append(consumed)
        lr.append(opt.param_groups[0]["lr"])
        wd.append(opt.param_groups[0]["weight_decay"])
        batch = bs.batch_size_at_samples(consumed)
        consumed += batch
        sched.step(increment=batch)
    return samples, lr, wd


CASES = [
    "--global-batch-size 4 --train-iters 120 --lr 1e-3 --lr-decay-style cosine --lr-warmup-iters 10 "
    "--weight-decay-incr-style linear --start-weight-decay 0.01 --end-weight-decay 0.1",
    "--global-batch-size 16 --rampup-batch-size 4 4 200 --train-iters 100 --lr 0.02 --min-lr 1e-4 "
    "--lr-decay-style power --lr-warmup-iters 10 --power-scheduler-decay-iters 20 "
    "--power-scheduler-a 0.05",
    "--global-batch-size 8 --train-samples 900 --lr 1e-3 --lr-decay-style WSD "
    "--lr-wsd-decay-samples 200 --lr-wsd-decay-style cosine --lr-warmup-samples 64",
]


@pytest.mark.parametrize("flags", CASES)
def test_preview_json_equals_stepping_the_scheduler(tmp_path, flags):
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    plot = ["--output-png", str(png)] if flags == CASES[0] else []
    preview_schedule.main(BASE + flags.split() + ["--output-json", str(out)] + plot)
    data = json.loads(out.read_text())
    samples, lr, wd = stepped(flags)
    assert data["iteration"] == list(range(len(samples)))
    assert data["consumed_samples"] == samples
    assert data["lr"] == lr
    assert data["weight_decay"] == wd
    if plot:
        assert png.stat().st_size > 1000
    assert preview_schedule.preview(preview_schedule.parse_preview_args(BASE + flags.split())) == data


def test_preview_with_schedule_config(tmp_path):
    config = tmp_path / "s.yaml"
    config.write_text("lr_schedule:\n  - {start: 0, schedule: {type: linear, from: 0.0, to: 1.0e-3}}\n"
                      "  - {start: 30, schedule: {type: cosine, from: 1.0e-3, to: 1.0e-4, unit: iterations}}\n")
    flags = f"--global-batch-size 4 --train-iters 80 --lr 1e-3 --lr-schedule-config {config}"
    data = preview_schedule.preview(preview_schedule.parse_preview_args(BASE + flags.split()))
    assert data["lr"] == stepped(flags)[1]


def test_preview_a_million_iterations(tmp_path):
    args = preview_schedule.parse_preview_args(
        BASE + "--global-batch-size 1024 --rampup-batch-size 32 32 1000000 --train-iters 1000000 "
               "--lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 2000".split())
    start = time.perf_counter()
    arrays = preview_schedule.schedule_arrays(args)
    computed = time.perf_counter() - start
    preview_schedule._write_json(arrays, str(tmp_path / "big.json"))
    total = time.perf_counter() - start
    print(f"\npreview of 1e6 iterations: values {computed:.2f} s, values + JSON {total:.2f} s")
    assert len(arrays["lr"]) == 1_000_001 and np.all(np.isfinite(arrays["lr"]))


def test_preview_bad_flags_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        preview_schedule.parse_preview_args(
            BASE + "--global-batch-size 4 --train-iters 20 --lr 1e-3 --lr-warmup-iters 30".split())
    assert info.value.code == 2 and "warmup" in capsys.readouterr().err


def test_preview_mixture_is_the_training_index(tmp_path, demo_data, dist_group):
    """mixture[d][i] equals the fraction of step i's global batch that the dataset built for
    training draws from d (same seed, same cache), and the target follows the schedule."""
    from megatron.config.tokenizer_flags import tokenizer_setup_from_args
    from megatron.data.builder import build_pretraining_data

    blend = tmp_path / "blend.json"
    blend.write_text(json.dumps({"train": {"blend": [
        {"path": demo_data["web"], "weight": 1},
        {"path": demo_data["math"],
         "weight": {"type": "linear", "unit": "iterations", "points": {0: 3, 20: 0}}}]}}))
    flags = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
             "--seq-length", "32", "--micro-batch-size", "2", "--global-batch-size", "8",
             "--train-iters", "30", "--lr", "1e-3", "--eval-iters", "0",
             "--data-blend-config", str(blend), "--data-cache-path", str(tmp_path / "cache")]
    args = preview_schedule.parse_preview_args(flags + ["--output-json", str(tmp_path / "p.json")])
    preview_schedule.main(flags + ["--output-json", str(tmp_path / "p.json")])
    data = json.loads((tmp_path / "p.json").read_text())
    assert set(data["mixture"]) == {"web", "math"} and len(data["mixture"]["web"]) == 30

    train_args = parse_args(flags, world_size=1)
    train_args.tokenizer = tokenizer_setup_from_args(train_args).tokenizer
    train = build_pretraining_data(train_args.run_config.data, train_args.tokenizer).train
    ids = np.asarray(train.index.dataset_index[: 30 * 8]).reshape(30, 8)
    for d, name in enumerate(train.names):
        assert data["mixture"][name] == pytest.approx((ids == d).mean(axis=1).tolist())
    assert data["epochs"] == pytest.approx(train.epochs)
    math = np.asarray(data["target_mixture"]["math"])
    expected = np.interp(np.arange(30), [0, 20], [3, 0])
    assert math == pytest.approx(expected / (expected + 1))
    assert args.data_blend is not None


def _strict_json(text):
    """json.loads that refuses Infinity/NaN (which Python's json otherwise accepts)."""
    def refuse(constant):
        raise ValueError(f"non-JSON constant {constant}")
    return json.loads(text, parse_constant=refuse)


def test_preview_json_is_strict(tmp_path, demo_data):
    """Every preview is strict JSON: power laws (infinite at 0 tokens before the cap), staged
    power, and a --train-samples run off an iteration boundary with a blend file (mixture)."""
    schedule = tmp_path / "power.yaml"
    schedule.write_text("lr_schedule:\n  - {start: 0, schedule: {type: constant, value: 0.02}}\n"
                        "  - {start: 40, schedule: {type: power, max: 0.02, a: 0.05, to: 1.0e-4}}\n")
    blend = tmp_path / "blend.json"
    blend.write_text(json.dumps({"train": {"blend": [
        {"path": demo_data["web"], "weight": 1},
        {"path": demo_data["math"], "weight": {"type": "linear", "unit": "samples", "points": {0: 1, 50: 0}}}]}}))
    runs = CASES + [
        f"--global-batch-size 16 --rampup-batch-size 4 4 200 --train-iters 100 --lr 0.02 "
        f"--lr-schedule-config {schedule}",
        f"--global-batch-size 4 --train-samples 103 --lr 1e-3 --lr-decay-style cosine "
        f"--data-blend-config {blend} --data-cache-path {tmp_path / 'cache'} --eval-iters 0"]
    for k, flags in enumerate(runs):
        out = tmp_path / f"p{k}.json"
        preview_schedule.main(BASE + flags.split() + ["--output-json", str(out)])
        data = _strict_json(out.read_text())
        assert np.all(np.isfinite(data["lr"])) and len(data["lr"]) == len(data["iteration"])
    assert data["iteration"][-1] == 25                           # 103 samples: 25 whole batches
    assert len(data["mixture"]["web"]) == 25


def test_preview_refuses_non_finite_schedule_values(tmp_path, capsys):
    config = tmp_path / "inf.yaml"
    config.write_text("lr_schedule:\n  - {start: 0, schedule: {type: constant, value: .inf}}\n")
    out = tmp_path / "p.json"
    with pytest.raises(SystemExit) as info:
        preview_schedule.main(BASE + f"--global-batch-size 4 --train-iters 20 --lr 1e-3 "
                                     f"--lr-schedule-config {config} --output-json {out}".split())
    assert info.value.code == 2
    assert "stage 0 (start 0): constant: 'value': inf is not a finite number" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(ValueError, match=r"'lr'\[2\] is nan"):
        preview_schedule._write_json({"lr": np.asarray([0.1, 0.2, np.nan])}, str(out))
    assert not out.exists()


def test_preview_under_ulysses_counts_data_parallel_ranks_only(tmp_path):
    """--ds-sequence-parallel-size splits sequences, not batches: 4 ranks at SP 2 preview the same
    rampup and schedule as 2 data-parallel ranks, and a layout it cannot run is refused."""
    flags = BASE + ("--global-batch-size 16 --rampup-batch-size 4 4 64 --train-iters 20 --lr 1e-3 "
                    "--lr-decay-style cosine").split()
    sp = preview_schedule.preview(preview_schedule.parse_preview_args(
        flags + ["--world-size", "4", "--ds-sequence-parallel-size", "2"]))
    dp = preview_schedule.preview(preview_schedule.parse_preview_args(flags + ["--world-size", "2"]))
    assert sp == dp
    with pytest.raises(SystemExit):
        preview_schedule.parse_preview_args(flags + ["--world-size", "6",
                                                     "--ds-sequence-parallel-size", "3"])


# ------------------------------------------------------------ the sequence-length curriculum
SEQ = BASE + ["--seq-length", "64"]  # a later flag wins: 64 tokens per sample at full length
VOCAB = 384  # the default byte-level tokenizer's 258 tokens padded to a multiple of 128
N_PARAMS = 2 * 12 * 64 ** 2 + VOCAB * 64  # 2 layers of hidden 64 (ffn 4h) and the output layer


def _seq_preview(flags):
    return preview_schedule.preview(preview_schedule.parse_preview_args(SEQ + flags))


def _batches(data):
    return np.diff(data["consumed_samples"])


def _ds_config(tmp_path, section, name="ds.json"):
    path = tmp_path / name
    path.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2,
                                "curriculum_learning": {"enabled": True, **section}}))
    return str(path)


LEGACY = [
    {"curriculum_type": "seqlen", "min_difficulty": 8, "max_difficulty": 64,
     "schedule_type": "fixed_linear",
     "schedule_config": {"total_curriculum_step": 30, "difficulty_step": 8}},
    {"curriculum_type": "seqlen", "min_difficulty": 10, "max_difficulty": 64,
     "schedule_type": "fixed_root",
     "schedule_config": {"total_curriculum_step": 25, "difficulty_step": 16, "root_degree": 2}},
    {"curriculum_type": "seqlen", "min_difficulty": 16, "max_difficulty": 64,
     "schedule_type": "fixed_discrete",
     "schedule_config": {"difficulty": [16, 32, 64], "max_step": [5, 12]}},
]


@pytest.mark.parametrize("section", LEGACY, ids=[s["schedule_type"] for s in LEGACY])
def test_preview_seq_length_is_deepspeeds_curriculum_scheduler(tmp_path, section):
    """A --deepspeed_config with a legacy curriculum_learning section (the preview reads it
    without DeepSpeed): seq_length[i] is what DeepSpeed's CurriculumScheduler gives step i when
    asked update_difficulty(i + 1) before every step, as Microsoft's loop asks it; the entry after
    the last step repeats the last trained length."""
    from deepspeed.runtime.data_pipeline.curriculum_scheduler import CurriculumScheduler

    iters = 40
    data = _seq_preview(f"--train-iters {iters} --lr 1e-3 --deepspeed --deepspeed_config "
                        f"{_ds_config(tmp_path, section)}".split())
    scheduler = CurriculumScheduler(dict(section))
    expected = [scheduler.update_difficulty(i + 1) for i in range(iters)]
    assert len(set(expected)) > 2                                # the curriculum moves in the run
    assert data["seq_length"][:iters] == expected
    assert len(data["seq_length"]) == len(data["lr"]) == iters + 1
    assert data["seq_length"][iters] == expected[-1]


def test_preview_consumed_tokens_by_hand(tmp_path):
    """Batch 4 at --seq-length 64, 16 tokens for steps 1-2, 32 for steps 3-4, 64 after: tokens
    trained before each step, the total, and the savings fraction written out."""
    section = {"curriculum_type": "seqlen", "min_difficulty": 16, "max_difficulty": 64,
               "schedule_type": "fixed_discrete",
               "schedule_config": {"difficulty": [16, 32, 64], "max_step": [2, 4]}}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
                                "curriculum_learning": {"enabled": True, **section}}))
    data = _seq_preview(f"--train-iters 6 --lr 1e-3 --deepspeed_config {path}".split())
    assert data["seq_length"] == [16, 16, 32, 32, 64, 64, 64]
    assert data["consumed_tokens"] == [0, 64, 128, 256, 384, 640, 896]
    savings = data["seq_length_savings"]
    assert savings["tokens"] == 896 and savings["full_length_tokens"] == 6 * 4 * 64
    assert savings["tokens_saved_fraction"] == pytest.approx(1 - 896 / 1536)


RAMPED = ("--global-batch-size 16 --rampup-batch-size 4 4 96 --train-iters 30 --lr 1e-3".split()
          + ["--seq-length-schedule", "{type: linear, from: 8, span: 20, multiple_of: 8}"])


def test_preview_consumed_tokens_are_batch_times_length(tmp_path):
    """Under a batch-size rampup and a native truncating schedule, consumed_tokens is the
    cumulative sum of global batch x k (the batches from stepping the batch schedule), and the
    savings are 1 - sum(batch x k) / sum(batch x S) in tokens and, under the documented cost
    model (6 N FLOPs per token + 12 x layers x hidden x k for attention), in time."""
    data = _seq_preview(RAMPED)
    samples, _, _ = stepped("--seq-length 64 --global-batch-size 16 --rampup-batch-size 4 4 96 "
                            "--train-iters 30 --lr 1e-3")
    assert data["consumed_samples"] == samples
    batches = np.diff(samples)
    assert sorted(set(batches.tolist())) == [4, 8, 12, 16]
    k = np.asarray(data["seq_length"][:-1])
    assert k[0] == 8 and k[-1] == 64 and np.all(k % 8 == 0)
    assert data["consumed_tokens"] == [0] + np.cumsum(batches * k).tolist()
    savings = data["seq_length_savings"]
    assert savings["tokens"] == int(np.sum(batches * k))
    assert savings["full_length_tokens"] == int(np.sum(batches * 64))
    assert savings["tokens_saved_fraction"] == pytest.approx(
        1 - np.sum(batches * k) / np.sum(batches * 64))
    assert savings["model_params"] == N_PARAMS and savings["vocab_size"] == VOCAB
    flops = batches * k * (6 * N_PARAMS + 12 * 2 * 64 * k)
    full = batches * 64 * (6 * N_PARAMS + 12 * 2 * 64 * 64)
    assert savings["estimated_time_saved_fraction"] == pytest.approx(1 - flops.sum() / full.sum())
    assert savings["attention_constant"] == pytest.approx(N_PARAMS / (2 * 2 * 64))


def test_preview_split_mode_saves_attention_not_tokens():
    """mode split cuts each sample into --seq-length / k samples of k tokens: every step trains
    batch x S tokens (none saved), lengths divide S, and only the attention term is saved."""
    data = _seq_preview("--global-batch-size 8 --train-iters 40 --lr 1e-3".split() + [
        "--seq-length-schedule", "{type: linear, from: 16, span: 30, mode: split, multiple_of: 8}"])
    k = np.asarray(data["seq_length"][:-1])
    assert set(k.tolist()) == {16, 32, 64} and np.all(64 % k == 0)
    assert data["consumed_tokens"] == [s * 64 for s in data["consumed_samples"]]
    savings = data["seq_length_savings"]
    assert savings["tokens"] == savings["full_length_tokens"] == 40 * 8 * 64
    assert savings["tokens_saved_fraction"] == 0.0
    b = _batches(data)
    flops = b * 64 * (6 * N_PARAMS + 12 * 2 * 64 * k)
    full = b * 64 * (6 * N_PARAMS + 12 * 2 * 64 * 64)
    assert savings["estimated_time_saved_fraction"] == pytest.approx(1 - flops.sum() / full.sum())
    assert savings["estimated_time_saved_fraction"] > 0


def test_preview_seq_length_spellings_agree(tmp_path):
    """The same curriculum as --seq-length-schedule, as the seq_length_schedule key of
    --lr-schedule-config and as DeepSpeed's legacy section gives the same preview keys."""
    section = LEGACY[0]
    native = {"type": "fixed_linear", "min_difficulty": 8, "max_difficulty": 64,
              "total_curriculum_step": 30, "difficulty_step": 8}
    config = tmp_path / "s.yaml"
    config.write_text("lr_schedule:\n  - {start: 0, schedule: {type: constant, value: 1.0e-3}}\n"
                      f"seq_length_schedule: {json.dumps(native)}\n")
    common = "--global-batch-size 8 --train-iters 50 --lr 1e-3".split()
    runs = [_seq_preview(common + ["--seq-length-schedule", json.dumps(native)]),
            _seq_preview(common + ["--lr-schedule-config", str(config)]),
            _seq_preview(common + ["--deepspeed_config", _ds_config(tmp_path, section)])]
    keys = ("seq_length", "consumed_tokens", "seq_length_savings")
    for data in runs[1:]:
        assert {k: data[k] for k in keys} == {k: runs[0][k] for k in keys}
    assert runs[0]["seq_length_savings"]["tokens_saved_fraction"] > 0.2


def test_preview_seq_length_output_files(tmp_path, capsys):
    """main: the JSON holds the keys, the summary line is printed, and the plot gains a panel
    (3 panels of 2.6 in at 100 dpi: 780 px high); without a curriculum none of it appears."""
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    preview_schedule.main(SEQ + RAMPED + ["--output-json", str(out), "--output-png", str(png)])
    data = _strict_json(out.read_text())
    assert len(data["seq_length"]) == len(data["consumed_tokens"]) == len(data["iteration"]) == 31
    saved = data["seq_length_savings"]["tokens_saved_fraction"]
    err = capsys.readouterr().err
    assert f"({100 * saved:.1f}% saved)" in err and "estimated time saved" in err
    assert int.from_bytes(png.read_bytes()[20:24], "big") == 780
    plain = preview_schedule.main(SEQ + "--global-batch-size 8 --train-iters 30 --lr 1e-3 "
                                        "--output-png".split() + [str(png)])
    assert set(plain) == {"iteration", "consumed_samples", "lr", "weight_decay"}
    assert "sequence-length curriculum" not in capsys.readouterr().err
    assert int.from_bytes(png.read_bytes()[20:24], "big") == 520


def test_preview_savings_without_the_tokenizer_files(tmp_path, capsys):
    """A tokenizer whose files are not on this machine: the preview still runs, the output layer
    is left out of N (vocab_size None) and a warning says so."""
    data = _seq_preview("--global-batch-size 8 --train-iters 20 --lr 1e-3".split() + [
        "--seq-length-schedule", "{type: linear, from: 16, span: 10}",
        "--vocab-file", str(tmp_path / "vocab.json"), "--merge-file", str(tmp_path / "merges.txt")])
    savings = data["seq_length_savings"]
    assert savings["vocab_size"] is None and savings["model_params"] == 2 * 12 * 64 ** 2
    assert "the output layer's V x h is left out" in capsys.readouterr().err


def test_a_long_run_over_many_datasets_gets_one_mixture_point_per_k_iterations():
    from helpers.curriculum import fake_index

    assert preview_schedule.mixture_iterations_per_point(10 ** 6, 1024) == 245
    assert preview_schedule.mixture_iterations_per_point(1000, 3) == 1
    idx = fake_index({"blend": [{"path": f"p{d}", "weight": 1 + d % 5} for d in range(50)]},
                     4000, gbs=8, seq=16)
    every = idx.iteration_mixture(500)          # [50, 500]: 8 samples per iteration
    thinned = idx.iteration_mixture(500, per_point=7)
    assert thinned.shape == (50, 72)            # ceil(500 / 7)
    for k in range(72):                         # each point: the samples of its 7 iterations
        window = every[:, 7 * k:7 * k + 7]
        np.testing.assert_allclose(thinned[:, k], window.sum(axis=1) / window.shape[1])
    np.testing.assert_array_equal(idx.target_iteration_mixture(500, per_point=7),
                                  idx.target_iteration_mixture(500)[:, ::7])


@pytest.mark.parametrize("long_point", [1, 1 << 30])
def test_iteration_mixture_counts_each_samples_iteration(monkeypatch, long_point):
    """iteration_mixture (one bincount per point, or per chunk of points labelled by repetition:
    both branches) equals counting every sample's iteration (BatchSchedule.iterations_at_samples)
    under a batch-size ramp, for whole and thinned points, fewer iterations than the run's, and a
    continuation index that starts mid-run (earlier samples count nowhere)."""
    from helpers.curriculum import fake_constituents
    from megatron.data.blend_config import parse_blend_config
    from megatron.data.curriculum import index as index_module
    from megatron.data.curriculum.index import CurriculumIndex
    from megatron.schedules.units import BatchSchedule

    monkeypatch.setattr(index_module, "MIXTURE_LONG_POINT", long_point)
    blend = parse_blend_config({"train": {"blend": [{"path": f"p{d}", "weight": 1 + d % 4}
                                                    for d in range(6)]}},
                               "t.yaml", check_files=False).train
    schedule = BatchSchedule(12, (2, 2, 300), 16)
    for begin in (0, 517):
        base = [0] * 6 if begin == 0 else [100] * 6
        idx = CurriculumIndex(blend, fake_constituents(blend, 10 ** 6, 16), 3000, schedule,
                              begin=begin, base=base)
        ids = np.asarray(idx.dataset_index)
        its = schedule.iterations_at_samples(np.arange(begin, 3000))
        for n_it, per_point in ((None, 1), (None, 5), (40, 3), (10 ** 4, 7)):
            n = idx.progress.num_iterations if n_it is None else n_it
            points = -(-n // per_point)
            keep = its < n
            ref = np.bincount(its[keep] // per_point * 6 + ids[keep], minlength=points * 6)
            ref = ref.reshape(points, 6).T.astype(np.float64)
            tot = ref.sum(axis=0, keepdims=True)
            ref = np.divide(ref, tot, out=np.zeros_like(ref), where=tot > 0)
            np.testing.assert_array_equal(idx.iteration_mixture(n_it, per_point), ref)
