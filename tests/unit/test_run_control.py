"""Run-control flags in-process (megatron/config/run_control_flags.py, megatron/train/run_control.py): where ``--train-tokens`` stops training
(against Microsoft Megatron-DeepSpeed's loop, also under batch-size rampup) and what it does to the
LR schedule, the kill-switch check (ExitRequest and start-up), the ``--eval-only`` /
``--kill-switch-file`` / ``--reset-iteration`` spellings, ``--pad-vocab-size-to``, and the errors
for bad values. The launcher runs are in tests/e2e/test_run_control_e2e.py."""

import numpy as np
import pytest

from helpers.flags import tiny_run_flags
from megatron.config.arguments import validate_args
from megatron.config.parser import get_parser, parse_args
from megatron.errors import ArgumentError, ConfigError

BASE = tiny_run_flags(seq_length=64, global_batch_size=8, train_iters=None, data_path=None)


def _args(*extra, world_size=1):
    return validate_args(get_parser().parse_args(BASE + list(extra)), world_size, require_data=False)


def microsoft_stop_iteration(args_train_iters, train_samples, train_tokens, seq_length,
                             batch_size_at_samples):
    """Microsoft Megatron-DeepSpeed's loop, step by step: ``while iteration < train_iters and
    consumed_train_tokens < train_tokens`` (train_iters from --train-samples: the whole batches
    that fit, rampup aware)."""
    iteration, consumed = 0, 0
    while True:
        if args_train_iters is not None and iteration >= args_train_iters:
            break
        batch = batch_size_at_samples(consumed)
        if train_samples is not None and consumed + batch > train_samples:
            break
        if consumed * seq_length >= train_tokens:
            break
        consumed += batch
        iteration += 1
    return iteration, consumed


@pytest.mark.parametrize("length, extra", [
    (["--train-samples", "2000"], []),
    (["--train-iters", "1000"], []),
    (["--train-samples", "4000"], ["--rampup-batch-size", "2", "2", "60"]),
    (["--train-samples", "2000"], ["--global-batch-size", "6", "--micro-batch-size", "3"]),
], ids=["samples", "iters", "samples-rampup", "batch-6"])
@pytest.mark.parametrize("train_tokens", [1, 64 * 8, 64 * 8 + 1, 10_000, 40_000])
def test_train_tokens_stops_where_microsofts_loop_stops(length, extra, train_tokens):
    from megatron.config.batch_flags import batch_schedule_from_args, train_iterations_from_args

    args = _args(*length, *extra, "--train-tokens", str(train_tokens))
    bs = batch_schedule_from_args(args)
    given_iters = int(length[1]) if length[0] == "--train-iters" else None
    given_samples = int(length[1]) if length[0] == "--train-samples" else None
    want_iters, want_samples = microsoft_stop_iteration(given_iters, given_samples, train_tokens,
                                                        64, bs.batch_size_at_samples)
    assert train_iterations_from_args(args, bs) == want_iters
    assert bs.samples_at_iteration(want_iters) == want_samples
    unbudgeted = train_iterations_from_args(_args(*length, *extra), bs)
    if want_iters < unbudgeted:
        assert want_samples * 64 >= train_tokens  # stopped by the budget, which it reached
        assert f"training stops after iteration {want_iters} " in args.train_tokens_note
    else:
        assert "ends training first" in args.train_tokens_note


def test_train_tokens_after_the_run_length_changes_nothing():
    args = _args("--train-iters", "10", "--train-tokens", str(10**9))
    assert args.train_iters == 10
    assert args.train_tokens_note == ("--train-tokens 1000000000: --train-iters 10 ends training "
                                      "first (the budget would last 1953125 iterations)")


def _lr_values(args, iterations):
    from megatron.optim import learning_rates as lrs
    from megatron.schedules.units import batch_schedule

    config = args.run_config.schedule
    bs = batch_schedule(config.batch)
    lr, _ = lrs.build_schedules(lrs.scheduler_params(config, bs), lrs.schedule_context(config, bs))
    iterations = np.asarray(iterations)
    return lr(lrs.progress_in(lr.unit, iterations, bs.samples_at_iterations(iterations), bs))


def test_train_tokens_is_the_end_of_training_for_the_lr_schedule():
    """Microsoft's scripts: --train-samples twice the budget, --train-tokens the budget. The
    default decay span (the end of training) is the budget: the LR reaches --min-lr there, as
    with an explicit --lr-decay-tokens of the budget (what those scripts give) and as a run of
    exactly that length. A later --lr-decay-tokens keeps its span."""
    budget = 100 * 8 * 64  # 100 iterations of 8 samples of 64 tokens
    schedule = ["--lr-decay-style", "cosine", "--min-lr", "1e-4", "--lr-warmup-samples", "80"]
    capped = _args("--train-samples", str(2 * 800), "--train-tokens", str(budget), *schedule)
    explicit = _args("--train-samples", str(2 * 800), "--train-tokens", str(budget),
                     "--lr-decay-tokens", str(budget), *schedule)
    exact = _args("--train-samples", "800", *schedule)
    steps = np.arange(101)
    lr = _lr_values(capped, steps)
    np.testing.assert_allclose(lr, _lr_values(explicit, steps), rtol=0, atol=0)
    np.testing.assert_allclose(lr, _lr_values(exact, steps), rtol=0, atol=0)
    assert lr[100] == pytest.approx(1e-4) and lr[50] > 1e-4
    # megatron-core's cosine over the decay span (100 - 10 warmup iterations)
    r = (50 - 10) / 90
    assert lr[50] == pytest.approx(1e-4 + 0.5 * (np.cos(np.pi * r) + 1) * (1e-3 - 1e-4))
    longer = _args("--train-samples", str(2 * 800), "--train-tokens", str(budget),
                   "--lr-decay-tokens", str(2 * budget), *schedule)
    r = (100 - 10) / (200 - 10)
    assert _lr_values(longer, [100])[0] == pytest.approx(
        1e-4 + 0.5 * (np.cos(np.pi * r) + 1) * (1e-3 - 1e-4))


@pytest.mark.parametrize("flags, skip_train", [
    ([], False), (["--eval-only"], True), (["--eval-only", "True"], True),
    (["--eval-only", "false"], False), (["--skip-train"], True)])
def test_eval_only_spellings(flags, skip_train):
    assert _args("--train-iters", "10", *flags).skip_train is skip_train


def test_microsoft_spellings_of_kill_switch_and_reset():
    args = _args("--train-iters", "10", "--kill-switch-file", "/tmp/k", "--reset-iteration",
                 "--load", "/tmp/ckpt")
    assert args.kill_switch_path == "/tmp/k" and args.reset_progress


BAD = {
    "train-tokens-zero": (["--train-iters", "10", "--train-tokens", "0"], 1,
                          ["--train-tokens 0 must be positive"]),
    "reset-progress-without-load": (["--train-iters", "10", "--reset-progress"], 1,
                                    ["--reset-progress needs --load DIR"]),
    "reset-progress-with-finetune": (["--train-iters", "10", "--reset-progress", "--finetune",
                                      "--load", "x"], 1,
                                     ["--reset-progress and --finetune are mutually exclusive"]),
    "reset-progress-with-checkpoint-schedule": (
        ["--train-iters", "10", "--reset-progress", "--load", "x",
         "--use-checkpoint-opt_param-scheduler"], 1,
        ["--reset-progress restarts the LR/WD schedule", "--use-checkpoint-opt_param-scheduler"]),
    "pad-vocab-not-divisible-by-tp": (["--train-iters", "10", "--pad-vocab-size-to", "301",
                                       "--tensor-model-parallel-size", "2"], 2,
                                      ["--pad-vocab-size-to 301 is not divisible by "
                                       "--tensor-model-parallel-size 2"]),
    "eval-only-without-eval-iters": (["--train-iters", "10", "--eval-only", "--eval-iters", "0"], 1,
                                     ["--eval-only/--skip-train with --eval-iters 0 evaluates "
                                      "nothing"]),
    "pad-vocab-not-positive": (["--train-iters", "10", "--pad-vocab-size-to", "0"], 1,
                               ["--pad-vocab-size-to 0 must be positive"]),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_values(case):
    argv, world_size, fragments = BAD[case]
    with pytest.raises(ArgumentError) as info:
        _args(*argv, world_size=world_size)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_eval_only_bad_value_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(BASE + ["--train-iters", "10", "--eval-only", "maybe"], world_size=1,
                   require_data=False)
    assert info.value.code == 2
    assert ("argument --eval-only: 'maybe' is not a boolean (true/false, yes/no, 1/0)"
            in capsys.readouterr().err)


@pytest.mark.parametrize("pad_to, tp, want", [(None, 1, 384), (None, 2, 512), (300, 1, 300),
                                              (302, 2, 302), (250880, 4, 250880)])
def test_pad_vocab_size_to_sets_the_embedding_rows(pad_to, tp, want):
    """Megatron-LM's rounding to --make-vocab-size-divisible-by x TP without the flag; exactly N
    rows with it (BLOOM: 250680 tokens padded to 250880)."""
    from megatron.config.tokenizer_flags import apply_tokenizer_setup

    extra = ["--tensor-model-parallel-size", str(tp)]
    if pad_to is not None:
        extra += ["--pad-vocab-size-to", str(pad_to)]
    args = _args("--train-iters", "1", *extra, world_size=tp)
    setup = apply_tokenizer_setup(args)  # args.tokenizer, .padded_vocab_size, .vocab_size
    tokenizer = setup.tokenizer
    assert tokenizer.vocab_size <= 300
    assert args.padded_vocab_size == want


def test_pad_vocab_size_smaller_than_the_vocabulary_is_refused():
    from megatron.config.tokenizer_flags import tokenizer_setup_from_args

    args = _args("--train-iters", "1", "--pad-vocab-size-to", "200")
    with pytest.raises(ConfigError) as info:
        tokenizer_setup_from_args(args)
    assert "--pad-vocab-size-to 200 is smaller than the tokenizer's vocabulary" in str(info.value)


def test_kill_switch_stops_every_rank_after_the_same_iteration(dist_group, tmp_path):
    """ExitRequest all-reduces the kill-switch check (MAX over ranks, here one rank of a gloo
    group); the start-up check does the same."""
    from megatron.train.exit_request import ExitRequest
    from megatron.train.loop import _kill_switch_at_start

    path = tmp_path / "kill"
    args = _args("--train-iters", "10", "--kill-switch-path", str(path))
    request = ExitRequest(args)
    assert request.enabled and not request.should_exit()
    assert not _kill_switch_at_start(args)
    path.touch()
    assert request.should_exit()
    assert request.reason == f"kill switch {path} found (--kill-switch-path)"
    assert _kill_switch_at_start(args)
    assert not ExitRequest(_args("--train-iters", "10")).enabled


def test_preview_schedule_shows_the_run_ending_at_the_token_budget():
    """tools/preview_schedule.py parses the same flags: the preview ends at the budget and its LR
    reaches --min-lr there."""
    from tools import preview_schedule

    args = preview_schedule.parse_preview_args(
        BASE + ["--train-samples", "1600", "--train-tokens", str(100 * 8 * 64),
                "--lr-decay-style", "linear", "--min-lr", "1e-4"])
    arrays = preview_schedule.schedule_arrays(args)
    assert list(arrays["iteration"]) == list(range(101))
    assert arrays["lr"][100] == pytest.approx(1e-4)
