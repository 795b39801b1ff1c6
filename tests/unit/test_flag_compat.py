"""Flags of BigScience, Megatron-LM and Microsoft Megatron-DeepSpeed scripts (megatron/config/flag_compat.py):
aliases give the same args as their canonical flag, inert flags are accepted and listed in one
start-up line, refused flags fail in one line with everything else wrong on the command line;
flags and the --deepspeed_config JSON never silently disagree; --step-batch-size-schedule follows
Megatron-LM's step batch size calculator. All in-process (parse_args / validate_args)."""
import json
import math

import numpy as np
import pytest

from helpers.flags import TINY_RUN, one_error_line, parse
from megatron.config import flag_compat
from megatron.config.deepspeed_config import deepspeed_config
from megatron.config.parser import get_parser
from megatron.errors import ArgumentError

# attributes that record how the command line was written, not what it means
_BOOKKEEPING = ("given_flags", "run_config")


def meaning(args) -> dict:
    return {k: v for k, v in vars(args).items() if k not in _BOOKKEEPING}


# ============================================================================== aliases
ALIASES = {
    "num-key-value-heads": (["--num-key-value-heads", "2"], ["--num-query-groups", "2"]),
    "layernorm-epsilon": (["--layernorm-epsilon", "1e-6"], ["--norm-epsilon", "1e-6"]),
    "rotary-theta": (["--use-rotary-position-embeddings", "--rotary-position-embeddings-theta",
                      "500000"], ["--position-embedding-type", "rope", "--rotary-base", "500000"]),
    "rope-theta": (["--use-rotary-position-embeddings", "--rope-theta", "1000000"],
                   ["--position-embedding-type", "rope", "--rotary-base", "1000000"]),
    "bigscience-rotary": (["--position-embedding-type", "rotary"],
                          ["--position-embedding-type", "rope"]),
    "bigscience-absolute": (["--position-embedding-type", "absolute"],
                            ["--position-embedding-type", "learned_absolute"]),
    "rmsnorm-lower": (["--normalization", "rmsnorm"], ["--normalization", "RMSNorm"]),
    "rmsnorm-upper": (["--normalization", "RMSNORM"], ["--normalization", "RMSNorm"]),
    "layernorm-lower": (["--normalization", "layernorm"], ["--normalization", "LayerNorm"]),
    "glu-swiglu": (["--glu-activation", "swiglu"], ["--swiglu"]),
    "checkpoint-activations": (["--checkpoint-activations"],
                               ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                "--recompute-num-layers", "1"]),
}


@pytest.mark.parametrize("case", list(ALIASES))
def test_alias_gives_the_canonical_args(case):
    alias, canonical = ALIASES[case]
    got, want = meaning(parse(alias)), meaning(parse(canonical))
    # --checkpoint-activations is kept as given besides the three flags it stands for
    got.pop("checkpoint_activations"), want.pop("checkpoint_activations")
    assert got == want


def test_prefixlm_alias_where_prefix_lm_exists():
    from finetune_t0 import extra_args_provider

    got = parse(["--prefixlm"], extra_args_provider=extra_args_provider)
    want = parse(["--prefix-lm"], extra_args_provider=extra_args_provider)
    assert got.prefix_lm is True and meaning(got) == meaning(want)
    # pretrain_gpt.py has no --prefix-lm, so no --prefixlm either
    assert "--prefixlm" not in get_parser()._option_string_actions


def test_use_distributed_optimizer_is_zero_1_and_stated():
    args = parse(["--use-distributed-optimizer"], world_size=2)
    assert args.zero_stage == 1
    assert deepspeed_config(args.run_config.deepspeed, args.global_batch_size)["zero_optimization"] == \
        deepspeed_config(parse(["--zero-stage", "1"], world_size=2).run_config.deepspeed,
                         4)["zero_optimization"]
    assert ("--use-distributed-optimizer: optimizer states sharded over the 2 data-parallel "
            "rank(s) by DeepSpeed ZeRO stage 1") in args.run_config.notes
    assert parse(["--use-distributed-optimizer", "--zero-stage", "2"], world_size=2).zero_stage == 2
    with pytest.raises(ArgumentError, match=r"--use-distributed-optimizer .* contradicts "
                                            r"--zero-stage 0"):
        parse(["--use-distributed-optimizer", "--zero-stage", "0"])


@pytest.mark.parametrize("argv, fragment", [
    (["--glu-activation", "geglu"], "argument --glu-activation: invalid choice: 'geglu' "
                                    "(choose from 'swiglu')"),
    (["--normalization", "batchnorm"], "argument --normalization: invalid choice: 'batchnorm'"),
    (["--position-embedding-type", "sinusoidal"],
     "argument --position-embedding-type: invalid choice: 'sinusoidal'"),
], ids=["glu-not-swiglu", "normalization-unknown", "position-embedding-unknown"])
def test_bad_alias_values_name_flag_and_value(argv, fragment, capsys):
    assert fragment in one_error_line(TINY_RUN + argv, capsys)


def test_pipeline_and_recompute_flag_names_accepted():
    args = parse(["--deepspeed-activation-checkpointing", "--no-pipeline-parallel",
                  "--pp-partition-method", "type:transformer|embedding",
                  "--distributed-backend", "gloo"])
    assert (args.recompute_granularity, args.recompute_method, args.recompute_num_layers) == \
        ("full", "uniform", 1)
    assert args.pp_partition_method == "type:transformer|embedding"


# ===================================================================== rotary without RoPE
@pytest.mark.parametrize("argv, fragment", [
    (["--rotary-base", "500000"], "--rotary-base 500000 configure rotary position embeddings, "
                                  "but --position-embedding-type is learned_absolute"),
    (["--rotary-position-embeddings-theta", "500000", "--position-embedding-type", "alibi"],
     "--rotary-position-embeddings-theta 500000 configure rotary position embeddings, but "
     "--position-embedding-type is alibi"),
    (["--rotary-percent", "0.5"], "--rotary-percent 0.5 configure"),
], ids=["rotary-base", "theta-alias-with-alibi", "rotary-percent"])
def test_rotary_flags_without_rope_are_an_error(argv, fragment):
    with pytest.raises(ArgumentError) as info:
        parse(argv)
    assert fragment in str(info.value) and "--position-embedding-type rope" in str(info.value)


def test_rotary_flags_with_rope_names():
    assert parse(["--position-embedding-type", "rotary", "--rotary-percent", "0.5"]).rotary_percent == 0.5


# ==================================================================== inert and refused
INERT = [c for c in flag_compat.COMPAT_FLAGS if c.status == "inert"]
REFUSED = [c for c in flag_compat.COMPAT_FLAGS if c.status == "refused"]


def _argv(c, value="x"):
    return [c.flag, value] if c.takes_value else [c.flag]


def test_every_inert_flag_accepted_and_listed_in_one_startup_line():
    argv = [a for c in INERT for a in _argv(c)]
    args = parse(argv + ["--context-parallel-size", "1"])
    lines = [n for n in args.run_config.notes if n.startswith("accepted without effect here")]
    assert len(lines) == 1
    listed = lines[0].split(": ", 1)[1].split(", ")
    assert listed == [c.flag + (" x" if c.takes_value else "") for c in INERT] + \
        ["--context-parallel-size 1"]
    assert not any(n.startswith("accepted without effect") for n in parse([]).run_config.notes)


@pytest.mark.parametrize("flag", [c.flag for c in REFUSED])
def test_every_refused_flag_names_itself_and_what_to_use(flag, capsys):
    c = flag_compat.compat_flag(flag)
    line = one_error_line(TINY_RUN + _argv(c, "4"), capsys)
    given = flag + (" 4" if c.takes_value else "")
    assert f"error: {given} is not supported: {c.note}" in line
    assert (f"Use {c.use_instead} instead" if c.use_instead else "Drop the flag") in line


def test_refused_unknown_and_bad_values_reported_together(capsys):
    line = one_error_line(TINY_RUN + ["--context-parallel-size", "4", "--ds-sequence-parallel-fpdt",
                                  "--no-such-flag", "--lr", "abc"], capsys)
    assert line.startswith("error: unrecognized arguments: --no-such-flag; ")
    for fragment in ("argument --lr: invalid float value: 'abc'",
                     "--context-parallel-size 4 is not supported: Megatron-LM context parallelism",
                     "Use --ds-sequence-parallel-size N (DeepSpeed-Ulysses sequence parallelism)",
                     "--ds-sequence-parallel-fpdt is not supported: FPDT"):
        assert fragment in line, line


def test_unknown_refused_and_validation_errors_reported_together(capsys):
    """With every value parsed, validation runs too and its problems join the same line."""
    line = one_error_line(TINY_RUN + ["--context-parallel-size", "4", "--hidden-size", "66",
                                  "--unknown-flag"], capsys)
    for fragment in ("unrecognized arguments: --unknown-flag",
                     "--context-parallel-size 4 is not supported",
                     "--hidden-size 66 is not divisible by --num-attention-heads 4"):
        assert fragment in line, line


def test_compat_table_is_consistent_with_the_parser():
    """Every alias names a flag the parser has; no compat flag shadows a parser flag."""
    parser = get_parser()
    flags = parser._option_string_actions
    for c in flag_compat.COMPAT_FLAGS:
        assert c.flag in flags or c.flag == "--prefixlm", c.flag
        if c.status == "alias":
            assert c.use_instead.split()[0] in flags or c.flag == "--prefixlm", c
    for alias in flag_compat.VALUE_ALIASES:
        assert alias.canonical in flags[alias.flag].choices


# ======================================================================== save interval
def test_save_interval_without_save_warns_as_megatron_lm():
    args = parse(["--save-interval", "5"])
    assert args.save_interval == 5 and args.save is None
    assert "warning: --save-interval 5 without --save: no checkpoints will be saved" in \
        args.run_config.notes


# ==================================================================== DeepSpeed JSON vs flags
@pytest.fixture
def ds_json(tmp_path):
    def write(config):
        path = tmp_path / "ds.json"
        path.write_text(json.dumps(config))
        return str(path)
    return write


@pytest.fixture
def fp16_device(monkeypatch):
    """An accelerator with float16 (a GPU), so --fp16 configs can be built on this CPU."""
    from deepspeed.accelerator import get_accelerator

    monkeypatch.setattr(type(get_accelerator()), "is_fp16_supported", lambda self: True)


def test_loss_scale_and_clip_flags_disagreeing_with_json_fail_naming_both(ds_json):
    """The issue's case: --loss-scale 4096 --clip-grad 0.5 with a JSON holding 0 and 1.0 used to
    train silently with the JSON's values."""
    path = ds_json({"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0,
                    "fp16": {"enabled": True, "loss_scale": 0}})
    with pytest.raises(ArgumentError) as info:
        parse(["--fp16", "--loss-scale", "4096", "--clip-grad", "0.5", "--deepspeed_config", path])
    message = str(info.value)
    assert f"--deepspeed_config {path}: " in message
    assert "gradient_clipping=1.0 disagrees with --clip-grad 0.5" in message
    assert "fp16.loss_scale=0 disagrees with --loss-scale 4096" in message


def test_flags_fill_the_keys_the_json_lacks(ds_json, fp16_device):
    path = ds_json({"train_micro_batch_size_per_gpu": 2, "fp16": {"enabled": True}})
    args = parse(["--fp16", "--loss-scale", "4096", "--clip-grad", "0.5", "--initial-loss-scale",
                  "65536", "--min-loss-scale", "2", "--loss-scale-window", "500", "--hysteresis",
                  "3", "--deepspeed_config", path])
    config = deepspeed_config(args.run_config.deepspeed, args.global_batch_size)
    assert config["gradient_clipping"] == 0.5
    assert config["fp16"] == {"enabled": True, "loss_scale": 4096.0, "initial_scale_power": 16,
                              "min_loss_scale": 2.0, "loss_scale_window": 500, "hysteresis": 3}
    # ... and DeepSpeed reads them as such
    from deepspeed.runtime.config import DeepSpeedConfig

    ds = DeepSpeedConfig(config)
    fp16 = ds.float16_config
    assert ds.gradient_clipping == 0.5 and fp16.enabled and fp16.loss_scale == 4096.0
    assert (fp16.initial_dynamic_scale(), fp16.min_loss_scale, fp16.loss_scale_window,
            fp16.hysteresis) == (2 ** 16, 2, 500, 3)


def test_json_values_without_flags_are_taken_and_stated(ds_json, fp16_device):
    path = ds_json({"train_batch_size": 8, "gradient_clipping": 0.3, "zero_optimization":
                    {"stage": 1}, "fp16": {"enabled": True, "initial_scale_power": 12,
                                           "hysteresis": 4, "loss_scale_window": "auto"}})
    args = parse(["--deepspeed_config", path])
    assert (args.global_batch_size, args.gradient_accumulation_steps) == (8, 4)
    assert (args.clip_grad, args.zero_stage, args.fp16, args.initial_loss_scale, args.hysteresis,
            args.loss_scale_window) == (0.3, 1, True, 4096.0, 4, None)
    notes = "\n".join(args.run_config.notes)
    assert f"--global-batch-size 8 from --deepspeed_config {path}" in notes
    for taken in ("gradient_clipping=0.3 (--clip-grad)", "zero_optimization.stage=1 (--zero-stage)",
                  "fp16.initial_scale_power=12 (--initial-loss-scale)",
                  "fp16.enabled=true (--fp16)"):
        assert taken in notes
    config = deepspeed_config(args.run_config.deepspeed, 8)
    assert config["fp16"]["initial_scale_power"] == 12 and config["gradient_clipping"] == 0.3


@pytest.mark.parametrize("config, argv, fragments", [
    ({"zero_optimization": {"stage": 2}}, ["--zero-stage", "1"],
     ["zero_optimization.stage=2 disagrees with --zero-stage 1"]),
    ({"bf16": {"enabled": False}}, ["--bf16"], ["bf16.enabled=false disagrees with --bf16"]),
    ({"bfloat16": {"enabled": True}, "fp16": {"enabled": True}}, [],
     ["--fp16 and --bf16 are mutually exclusive"]),
    ({"gradient_accumulation_steps": 3}, ["--global-batch-size", "4"],
     ["gradient_accumulation_steps=3 disagrees with the flags", "--global-batch-size 4"]),
    ({"fp16": {"enabled": True, "initial_scale_power": 16}},
     ["--fp16", "--initial-loss-scale", "4096"],
     ["fp16.initial_scale_power=16 disagrees with --initial-loss-scale 4096"]),
    ({"fp16": {"hysteresis": 2, "min_loss_scale": 1}}, ["--hysteresis", "4", "--min-loss-scale", "1"],
     ["fp16.hysteresis=2 disagrees with --hysteresis 4"]),
    ({"gradient_clipping": "high", "bf16": {"enabled": "yes"}}, [],
     ['gradient_clipping="high" is not a valid value (that of --clip-grad)',
      'bf16.enabled="yes" is not a valid value (that of --bf16)']),
], ids=["zero-stage", "bf16-disabled", "both-precisions", "accumulation", "initial-scale",
        "hysteresis", "not-a-value"])
def test_flag_and_json_disagreements(ds_json, config, argv, fragments):
    with pytest.raises(ArgumentError) as info:
        parse(argv + ["--deepspeed_config", ds_json(config)])
    for fragment in fragments:
        assert fragment in str(info.value), str(info.value)
    assert "min_loss_scale" not in str(info.value)  # agreeing keys are not named


def test_json_batch_under_a_rampup_is_the_final_batch(ds_json):
    """BigScience's configs hold the final global batch with --rampup-batch-size."""
    rampup = ["--rampup-batch-size", "2", "2", "40", "--global-batch-size", "8"]
    args = parse(rampup + ["--deepspeed_config", ds_json({"train_batch_size": 8,
                                                           "gradient_accumulation_steps": 4})])
    assert deepspeed_config(args.run_config.deepspeed, 2)["train_batch_size"] == 2  # the engine's first batch
    with pytest.raises(ArgumentError, match="train_batch_size=2 disagrees with the flags"):
        parse(rampup + ["--deepspeed_config", ds_json({"train_batch_size": 2})])


@pytest.mark.parametrize("argv, fragment", [
    (["--initial-loss-scale", "1000"], "--initial-loss-scale 1000 must be a power of 2"),
    (["--initial-loss-scale", "inf"], "--initial-loss-scale inf must be a power of 2"),
    (["--loss-scale", "-1"], "--loss-scale -1 must be non-negative (0: dynamic)"),
    (["--min-loss-scale", "0"], "--min-loss-scale 0 must be a positive whole number"),
    (["--min-loss-scale", "0.5"], "--min-loss-scale 0.5 must be a positive whole number"),
    (["--loss-scale-window", "0"], "--loss-scale-window 0 must be at least 1"),
    (["--hysteresis", "0"], "--hysteresis 0 must be at least 1"),
], ids=["initial-not-power-of-2", "initial-inf", "negative-loss-scale", "min-zero", "min-fraction", "window-zero",
        "hysteresis-zero"])
def test_bad_loss_scale_values(argv, fragment):
    with pytest.raises(ArgumentError, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        parse(argv)


def test_loss_scale_flags_without_fp16_are_noted():
    assert "--loss-scale, --hysteresis: no effect without --fp16 (loss scaling is for float16 " \
           "only)" in parse(["--loss-scale", "8", "--hysteresis", "3"]).run_config.notes


def test_fp16_on_a_device_without_it_fails_in_one_line(capsys):
    from deepspeed.accelerator import get_accelerator

    if get_accelerator().is_fp16_supported():
        pytest.skip("this machine's accelerator supports float16")
    line = one_error_line(TINY_RUN + ["--fp16"], capsys)
    assert f"--fp16: DeepSpeed's {get_accelerator().device_name()} accelerator has no fp16 " \
           "support on this machine; use --bf16" in line


# ================================================================ step batch size schedule
def megatron_lm_step_batch(schedule, consumed_samples):
    """megatron-core StepBatchsizeNumMicroBatchesCalculator._get_batch_size_for_samples."""
    batch = schedule[0][1]
    for threshold, size in schedule:
        if consumed_samples >= threshold:
            batch = size
        else:
            break
    return batch


def test_step_schedule_parsed_as_megatron_lm():
    from megatron.schedules.units import parse_step_batch_size_schedule

    # thresholds are tokens (Megatron-LM's training passes --seq-length), K/M/B/T suffixes
    assert parse_step_batch_size_schedule("0:4 2.4B:8 4.8B:16", 2048) == \
        [(0, 4), (2_400_000_000 // 2048, 8), (4_800_000_000 // 2048, 16)]
    assert parse_step_batch_size_schedule("4.8b:16,0:4 2400m:8", 2048) == \
        [(0, 4), (1_171_875, 8), (2_343_750, 16)]
    assert parse_step_batch_size_schedule("0:1K", 1) == [(0, 1000)]


def test_step_schedule_drives_the_batch_of_every_iteration():
    """The batch of each iteration, and the samples consumed, equal a loop over Megatron-LM's
    calculator (update_num_microbatches(consumed) before each step)."""
    from megatron.config.batch_flags import batch_schedule_from_args, train_iterations_from_args

    base = [a for a in TINY_RUN if a not in ("--train-iters", "10")]
    args = parse(["--step-batch-size-schedule", "0:4 1.2K:8 2.4K:16", "--train-samples", "400"],
                 world_size=2, base=base)
    steps = [(0, 4), (1200 // 32, 8), (2400 // 32, 16)]
    assert args.global_batch_size == 16 and args.batch_size_steps == [list(s) for s in steps]
    bs = batch_schedule_from_args(args)
    consumed, want_batches, want_samples = 0, [], [0]
    while consumed + megatron_lm_step_batch(steps, consumed) <= 400:
        want_batches.append(megatron_lm_step_batch(steps, consumed))
        consumed += want_batches[-1]
        want_samples.append(consumed)
    n = len(want_batches)
    assert train_iterations_from_args(args, bs) == n
    assert bs.batch_sizes_at_iterations(np.arange(n)).tolist() == want_batches
    assert bs.samples_at_iterations(np.arange(n + 1)).tolist() == want_samples
    assert bs.iterations_at_samples(want_samples).tolist() == list(range(n + 1))


@pytest.mark.parametrize("argv, fragment", [
    (["--step-batch-size-schedule", "0:4 x:8"], "--step-batch-size-schedule '0:4 x:8': entry "
                                                "'x:8' is not TOKENS:BATCH"),
    (["--step-batch-size-schedule", "1K:4 2K:8"], "the first threshold must be 0 (got '1K:4')"),
    (["--step-batch-size-schedule", "0:4 10:8"], "thresholds '0:4' and '10:8' fall on the same "
                                                 "sample (0 at --seq-length 32)"),
    (["--step-batch-size-schedule", "0:4 1K:6"], "batch sizes 6 are not multiples of "
                                                 "--micro-batch-size 2 x data-parallel size 2"),
    (["--step-batch-size-schedule", "0:4 1K:8", "--global-batch-size", "4"],
     "--global-batch-size 4 disagrees with --step-batch-size-schedule '0:4 1K:8', whose last "
     "batch is 8"),
    (["--step-batch-size-schedule", "0:4 1K:8", "--rampup-batch-size", "4", "4", "100",
      "--global-batch-size", "8"], "are mutually exclusive"),
    (["--step-batch-size-schedule", "0:0"], "entry '0:0': the batch must be positive"),
], ids=["not-a-number", "first-not-zero", "same-sample", "not-divisible", "global-batch-differs",
        "with-rampup", "zero-batch"])
def test_bad_step_schedules(argv, fragment):
    with pytest.raises(ArgumentError) as info:
        parse(argv, world_size=2)
    assert fragment in str(info.value), str(info.value)


def test_step_schedule_shapes_the_lr_schedule_in_samples():
    """Sample-based LR spans under a step schedule: the decay ends at the samples of the last
    iteration (the schedule's iterations, not a constant batch's)."""
    from megatron.optim.learning_rates import run_shape, schedule_context_from_run_shape

    args = parse(["--step-batch-size-schedule", "0:2 640:4", "--global-batch-size", "4"])
    shape = run_shape(args.run_config.schedule)
    assert shape["batch_size_steps"] == [[0, 2], [20, 4]]
    context = schedule_context_from_run_shape(shape)
    assert context.batch_schedule.samples_at_iteration(10) == 2 * 10
    assert context.batch_schedule.batch_size_at_samples(20) == 4
    assert math.isclose(context.total["samples"], 20)


def test_flag_values_reach_the_deepspeed_engine(ds_json, dist_group, monkeypatch):
    """The built config drives a real DeepSpeed engine (one CPU rank): clipping from the flag the
    JSON lacks, bf16 (which works on CPU), ZeRO stage 1 from --use-distributed-optimizer; a
    training step runs."""
    import deepspeed
    import torch

    monkeypatch.setenv("LOCAL_RANK", "0")
    path = ds_json({"train_micro_batch_size_per_gpu": 2, "steps_per_print": 10 ** 9})
    args = parse(["--bf16", "--clip-grad", "0.5", "--use-distributed-optimizer",
                  "--deepspeed_config", path])
    model = torch.nn.Linear(8, 8)
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters()),
                                      config=deepspeed_config(args.run_config.deepspeed, 2),
                                      dist_init_required=False)
    assert engine.gradient_clipping() == 0.5 and engine.bfloat16_enabled()
    assert engine.zero_optimization_stage() == 1 and engine.train_batch_size() == 2
    before = engine.module.weight.detach().float().clone()
    loss = engine(torch.randn(2, 8, dtype=torch.bfloat16)).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    assert not torch.equal(before, engine.module.weight.detach().float())


def test_tensorboard_extras_follow_their_flags(tmp_path):
    """--log-batch-size-to-tensorboard and --log-timers-to-tensorboard add the train/
    global_batch_size and train/ms_per_iteration scalars; without them they are not written."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from megatron.metrics.writers import TensorBoardWriter, tensorboard_extras

    record = {"iteration": 1, "lm_loss": 2.0, "global_batch_size": 8, "ms_per_iteration": 12.5}
    for name, flags in (("with", ["--log-batch-size-to-tensorboard", "--log-timers-to-tensorboard"]),
                        ("without", [])):
        writer = TensorBoardWriter(str(tmp_path / name), tensorboard_extras(parse(flags).run_config.metrics))
        writer.train_record(record)
        writer.close()
    tags = {}
    for name in ("with", "without"):
        events = EventAccumulator(str(tmp_path / name))
        events.Reload()
        tags[name] = set(events.Tags()["scalars"])
        if name == "with":
            assert [e.value for e in events.Scalars("train/global_batch_size")] == [8.0]
            assert [e.value for e in events.Scalars("train/ms_per_iteration")] == [12.5]
    assert tags["with"] - tags["without"] == {"train/global_batch_size", "train/ms_per_iteration"}
