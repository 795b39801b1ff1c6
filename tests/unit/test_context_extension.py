"""``--extend-context`` (megatron/config/context_extension.py): the resume check built from a
checkpoint's recorded flags (``model_args.json``) and the new flags, through ``parse_args`` as
the entry points run it (``--use-checkpoint-args`` included), and the LR schedule's run shape
taken at an extension stage."""
import json

import numpy as np
import pytest

from helpers.flags import one_error_line, tiny_run_flags
from megatron.config.context_extension import check_context_extension, recorded_context

ROPE = {"seq_length": 64, "max_position_embeddings": 64, "position_embedding_type": "rope",
        "rotary_base": 10000, "rotary_percent": 1.0, "rotary_seq_len_interpolation_factor": None,
        "use_rope_scaling": False, "rope_scaling_factor": 8.0, "global_batch_size": 16}


def check(old, directive=None, **new):
    return check_context_extension(old, {**old, **new}, directive, "ckpt/iter_0000006")


def test_without_the_directive_any_change_of_length_or_encoding_is_one_line():
    assert check(ROPE) == [] and check(ROPE, global_batch_size=4) == []  # nothing of the context
    with pytest.raises(Exception) as info:
        check(ROPE, seq_length=256, max_position_embeddings=256, rotary_base=500000)
    msg = str(info.value)
    assert "\n" not in msg
    for part in ("--load ckpt/iter_0000006", "--seq-length 64 -> 256",
                 "--max-position-embeddings 64 -> 256", "--rotary-base 10000 -> 500000",
                 "give --extend-context"):
        assert part in msg, (part, msg)
    for flags, shown in (({"use_rope_scaling": True}, "--use-rope-scaling off -> on"),
                         ({"rotary_seq_len_interpolation_factor": 4.0},
                          "--rotary-seq-len-interpolation-factor None -> 4"),
                         ({"position_embedding_type": "yarn"}, "--position-embedding-type rope -> yarn")):
        with pytest.raises(Exception, match="--extend-context") as info:
            check(ROPE, **flags)
        assert shown in str(info.value)


def test_learned_positions_cannot_grow_and_the_message_names_rope():
    learned = {**ROPE, "position_embedding_type": "learned_absolute"}
    for directive in (None, "keep-tokens"):
        with pytest.raises(Exception) as info:
            check(learned, directive, seq_length=256, max_position_embeddings=256)
        msg = str(info.value)
        assert "learned absolute position embeddings for 64 positions" in msg
        assert "--seq-length 256" in msg and "RoPE" in msg
    with pytest.raises(Exception, match="RoPE"):
        check(learned, "keep-tokens", position_embedding_type="rope")
    # within the checkpoint's positions: the ordinary rule
    shorter = {**learned, "max_position_embeddings": 256}
    with pytest.raises(Exception, match="--seq-length 64 -> 128; give --extend-context"):
        check(shorter, seq_length=128)
    assert check(shorter, "free-batch", seq_length=128)[0].startswith("--extend-context:")


def test_the_directive_allows_the_stage_and_keeps_tokens_per_step():
    notes = check(ROPE, "keep-tokens", seq_length=256, max_position_embeddings=256,
                  rotary_base=500000, global_batch_size=4)
    assert notes == ["--extend-context: a context-extension stage from ckpt/iter_0000006: "
                     "--seq-length 64 -> 256, --max-position-embeddings 64 -> 256, "
                     "--rotary-base 10000 -> 500000, --global-batch-size 16 -> 4"]
    with pytest.raises(Exception) as info:
        check(ROPE, "keep-tokens", seq_length=256, max_position_embeddings=256, global_batch_size=8)
    msg = str(info.value)
    assert ("--global-batch-size 16 -> 8 at --seq-length 64 -> 256 makes 1024 -> 2048 tokens per "
            "step; give --global-batch-size 4, or --extend-context free-batch") in msg
    assert check(ROPE, "free-batch", seq_length=256, max_position_embeddings=256, global_batch_size=8)
    # rope <-> yarn only
    assert check(ROPE, "keep-tokens", position_embedding_type="yarn")
    with pytest.raises(Exception, match="only between rope and yarn"):
        check(ROPE, "keep-tokens", position_embedding_type="alibi")


# ---- through parse_args, from a checkpoint directory's model_args.json ----

def _checkpoint(tmp_path, flags):
    """A --load directory whose latest checkpoint records the model flags of ``flags``."""
    from helpers.flags import parse
    from megatron.config.checkpoint_args import model_args_from_args

    args = parse(flags)
    directory = tmp_path / "ckpt" / "iter_0000006"
    directory.mkdir(parents=True)
    (directory / "model_args.json").write_text(json.dumps(model_args_from_args(args)))
    (tmp_path / "ckpt" / "latest_checkpointed_iteration.txt").write_text("6")
    return str(tmp_path / "ckpt")


STAGE1 = ["--position-embedding-type", "rope", "--seq-length", "64", "--global-batch-size", "16",
          "--micro-batch-size", "2"]
STAGE2 = ["--position-embedding-type", "rope", "--seq-length", "256", "--max-position-embeddings",
          "256", "--rotary-base", "500000", "--global-batch-size", "4", "--micro-batch-size", "2"]


def test_parse_args_refuses_a_silent_extension_and_takes_the_directive(tmp_path, capsys):
    from megatron.config.parser import parse_args

    load = _checkpoint(tmp_path, STAGE1)
    record = json.loads((tmp_path / "ckpt" / "iter_0000006" / "model_args.json").read_text())
    assert recorded_context(record)["global_batch_size"] == 16
    base = tiny_run_flags() + ["--load", load]
    err = one_error_line(base + STAGE2, capsys)
    assert "--seq-length 64 -> 256" in err and "--rotary-base 10000 -> 500000" in err
    assert "--extend-context" in err
    # with the directive, the data continuing (megatron/data/length_change.py) or restarted
    for extra in ([], ["--reset-progress"]):
        args = parse_args(base + STAGE2 + ["--extend-context"] + extra, world_size=1)
        assert args.extend_context == "keep-tokens" and args.rotary_base == 500000
        assert any("context-extension stage" in n for n in args.run_config.notes)
    # the directive needs a resume
    err = one_error_line(tiny_run_flags() + STAGE2 + ["--extend-context"], capsys)
    assert "--extend-context keep-tokens: needs a resume" in err


def test_use_checkpoint_args_never_takes_the_checkpoints_rope_over_the_command_line(tmp_path, capsys):
    from megatron.config.parser import parse_args

    load = _checkpoint(tmp_path, STAGE1 + ["--rotary-base", "20000"])
    base = tiny_run_flags(seq_length=64) + ["--load", load, "--use-checkpoint-args"]
    # not given: the checkpoint's (the same model)
    args = parse_args(base + ["--global-batch-size", "16"], world_size=1)
    assert args.rotary_base == 20000 and args.position_embedding_type == "rope"
    # given: refused naming both values and the directive, not replaced by the checkpoint's
    err = one_error_line(base + ["--global-batch-size", "16", "--rotary-base", "500000"], capsys)
    assert "--rotary-base 20000 -> 500000" in err and "--extend-context" in err
    args = parse_args(base + ["--global-batch-size", "16", "--rotary-base", "500000",
                              "--extend-context"], world_size=1)
    assert args.rotary_base == 500000
    # Microsoft's and the Llama scripts' spellings are the same flag
    for alias in ("--rope-theta", "--rotary-position-embeddings-theta"):
        err = one_error_line(base + ["--global-batch-size", "16", alias, "500000"], capsys)
        assert "--rotary-base 20000 -> 500000" in err, err
        assert parse_args(base + ["--global-batch-size", "16", alias, "500000", "--extend-context"],
                          world_size=1).rotary_base == 500000


STAGED = {"lr_schedule": [
    {"start": 0, "schedule": {"type": "linear", "from": 0.0, "to": 3.0e-4}},
    {"start": 10, "schedule": {"type": "constant", "value": 3.0e-4}},
    {"start": 40, "schedule": {"type": "cosine", "from": 3.0e-4, "to": 3.0e-5}}],
    "weight_decay_schedule": {"type": "linear", "from": 0.0, "to": 0.1}}


def _scheduler(tmp_path, flags, extend_context=None):
    """The LR scheduler of the tiny schedule run with ``flags`` and STAGED's schedule file, with
    ``--extend-context`` as validation would set it in its ScheduleConfig (the flag itself needs
    a checkpoint to resume)."""
    from dataclasses import replace

    import torch

    from helpers.flags import TINY_SCHEDULE
    from megatron.config.parser import parse_args
    from megatron.optim.learning_rates import build_opt_param_scheduler

    path = tmp_path / "lr.json"
    path.write_text(json.dumps(STAGED))
    args = parse_args(TINY_SCHEDULE + flags.split() + ["--lr", "3e-4", "--lr-schedule-config",
                                                       str(path)], world_size=1, require_data=False)
    config = replace(args.run_config.schedule, extend_context=extend_context)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    return build_opt_param_scheduler(config, optimizer)


def test_an_extension_stage_takes_the_schedules_run_shape_and_continues_its_decay(tmp_path):
    """An iterations schedule saved after 30 iterations of 16 x 16 tokens, resumed at 4 x 64:
    refused as today without the directive; with it the LR continues where it stood (the same
    iteration, the same values to the end)."""
    old = _scheduler(tmp_path, "--global-batch-size 16 --train-iters 100")
    for _ in range(30):
        old.step(16)
    sd = old.state_dict()
    its = np.arange(0, 101)
    want = old.values_at(its, its * 16)[0]
    flags = "--global-batch-size 4 --seq-length 64 --train-iters 100"
    with pytest.raises(ValueError, match="--seq-length \\(seq_length\\): checkpoint 16, now 64"):
        _scheduler(tmp_path, flags).load_state_dict(sd)
    new = _scheduler(tmp_path, flags, "keep-tokens")
    new.load_state_dict(sd)
    assert new.num_iters == 30 and new.params["seq_length"] == 64
    np.testing.assert_array_equal(new.values_at(its, its * 4)[0], want)
    np.testing.assert_array_equal(new.values_at(its, its * 4)[1], old.values_at(its, its * 16)[1])
    assert new.get_lr() == want[30] and new.optimizer.param_groups[0]["lr"] == want[30]
