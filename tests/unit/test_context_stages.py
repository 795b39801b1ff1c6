"""Context stages in one run (megatron/config/context_stages.py, megatron/train/context_stages.py;
docs/context_extension.md#in-one-run): the ``context_stages`` list of ``--lr-schedule-config``
parsed and refused in one line, each stage the command line with its values (its typed configs
those of the two-launch version's second launch), the resume check of ``--load`` against the
stage that trained the checkpoint, and the model's rotary embeddings switched in place. The
one-launch run against the two-launch version, bit for bit: tests/e2e/test_context_extension_e2e.py."""
import dataclasses
import json

import pytest
import torch

from helpers.flags import one_error_line, tiny_run_flags
from megatron.config.context_stages import STAGE_KEYS, parse_context_stages

LR = "lr_schedule:\n  - {start: 0, schedule: {type: constant, value: 1.0e-3}}\n"
STAGE = ("context_stages:\n  - {start: 6, seq_length: 256, max_position_embeddings: 256, "
         "rotary_base: 500000, global_batch_size: 4}\n")
STAGE1 = ["--position-embedding-type", "rope", "--seq-length", "64", "--max-position-embeddings",
          "64", "--global-batch-size", "16", "--micro-batch-size", "2"]
STAGE2 = ["--position-embedding-type", "rope", "--seq-length", "256", "--max-position-embeddings",
          "256", "--rotary-base", "500000", "--global-batch-size", "4", "--micro-batch-size", "2"]


def _file(tmp_path, text, name="lr.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _parse(argv):
    from megatron.config.parser import parse_args

    return parse_args(argv, world_size=1)


def _base(tmp_path, stages=STAGE, extra=()):
    return tiny_run_flags(train_iters=12) + STAGE1 + ["--lr-schedule-config",
                                                      _file(tmp_path, LR + stages), *extra]


def test_the_list_is_parsed_and_each_bad_entry_is_one_line():
    where = "--lr-schedule-config f.yaml"
    stages = parse_context_stages([{"start": 6, "seq_length": 256, "rotary_base": 5.0e5,
                                    "rotary_percent": "0.5", "use_rope_scaling": True,
                                    "rotary_seq_len_interpolation_factor": None},
                                   {"start": 9, "global_batch_size": 2,
                                    "extend_context": "free-batch"}], where)
    assert stages == [{"start": 6, "seq_length": 256, "rotary_base": 500000, "rotary_percent": 0.5,
                       "use_rope_scaling": True, "rotary_seq_len_interpolation_factor": None,
                       "extend_context": "keep-tokens"},
                      {"start": 9, "global_batch_size": 2, "extend_context": "free-batch"}]
    for entries, parts in (
            ([{"start": 6, "seq_len": 256}], ["context_stages[0]: unknown key 'seq_len' (allowed: "
                                              + ", ".join(STAGE_KEYS) + ")"]),
            ([{"seq_length": 256}], ["context_stages[0]: missing key 'start'"]),
            ([{"start": 0, "seq_length": 256}], ["start 0 must be > 0"]),
            ([{"start": 6, "seq_length": 256}, {"start": 6, "rotary_base": 2}],
             ["context_stages[1]: start 6 must be > the stage before it (6)"]),
            ([{"start": 6, "seq_length": 256.5}], ["seq_length 256.5: expected an integer"]),
            ([{"start": 6, "rotary_base": "big"}], ["rotary_base 'big': expected an integer"]),
            ([{"start": 6, "use_rope_scaling": 1}], ["use_rope_scaling 1: expected true or false"]),
            ([{"start": 6, "position_embedding_type": "alibi"}],
             ["position_embedding_type 'alibi': a stage changes the encoding only between rope "
              "and yarn"]),
            ([{"start": 6, "seq_length": 256, "extend_context": "free"}],
             ["extend_context 'free': expected keep-tokens (the default: tokens per step kept) or "
              "free-batch"]),
            ([{"start": 6}], ["context_stages[0]: the stage changes nothing"]),
            ({"start": 6}, ["context_stages must be a non-empty list"])):
        with pytest.raises(Exception) as info:
            parse_context_stages(entries, where)
        msg = str(info.value)
        assert "\n" not in msg and msg.startswith(where), msg
        for part in parts:
            assert part in msg, (part, msg)


def test_each_stage_is_the_command_line_with_its_values(tmp_path):
    """Stage 0 is the flags (the same typed configs as without the stage); stage 1 those of the
    two-launch version's second launch (the flags with the stage's values given)."""
    args = _parse(_base(tmp_path))
    stages = args.context_stages
    assert [s.start for s in stages.stages] == [0, 6] and stages.stages[0].args is args
    assert stages.stages[1].change == ("--seq-length 64 -> 256", "--max-position-embeddings 64 -> 256",
                                       "--rotary-base 10000 -> 500000",
                                       "--global-batch-size 16 -> 4")
    assert any(n.startswith("context stages in one run (--lr-schedule-config ") and
               "after iteration 6: --seq-length 64 -> 256" in n for n in args.run_config.notes)
    plain = _parse(tiny_run_flags(train_iters=12) + STAGE1 + [
        "--lr-schedule-config", _file(tmp_path, LR, "plain.yaml")])
    second = _parse(tiny_run_flags(train_iters=12) + STAGE2 + [
        "--lr-schedule-config", _file(tmp_path, LR, "plain.yaml")])
    for ours, theirs in ((args, plain), (stages.stages[1].args, second)):
        a, b = ours.run_config, theirs.run_config
        for name in ("batch", "data", "loop", "model", "engine", "deepspeed", "optimizer"):
            assert getattr(a, name) == getattr(b, name), name
        assert a.transformer == b.transformer
        ignore = {"lr_schedule_config": None, "lr_schedule_config_dict": None}
        assert dataclasses.replace(a.schedule, **ignore) == dataclasses.replace(b.schedule, **ignore)
        assert ours.gradient_accumulation_steps == theirs.gradient_accumulation_steps
    # iterations and the tokens each stage's samples count
    assert [stages.at(i).index for i in (0, 5, 6, 11)] == [0, 0, 1, 1]
    assert [stages.recorded_at(i).index for i in (0, 6, 7)] == [0, 0, 1]
    assert stages.end(stages.stages[0], 12) == 6 and stages.end(stages.stages[1], 12) == 12
    assert stages.samples_before(stages.stages[1]) == 96
    assert [stages.tokens(n) for n in (16, 96, 100)] == [16 * 64, 96 * 64, 96 * 64 + 4 * 256]


def test_what_a_stage_cannot_do_is_refused_in_one_line(tmp_path, capsys):
    for stage, extra, parts in (
            # the tokens per step are kept unless the stage says free-batch
            ("{start: 6, seq_length: 256, max_position_embeddings: 256, global_batch_size: 8}", (),
             ["context_stages[0] (from iteration 6): the stage keeps the tokens per step",
              "global_batch_size 16 -> 8 at seq_length 64 -> 256 makes 1024 -> 2048 tokens per "
              "step; give global_batch_size: 4, or extend_context: free-batch"]),
            # the stage's flags are validated as a command line
            ("{start: 6, rotary_base: 0}", (),
             ["context_stages[0] (from iteration 6): --rotary-base 0: must be a positive integer"]),
            ("{start: 6, global_batch_size: 3, extend_context: free-batch}", (),
             ["context_stages[0] (from iteration 6): --global-batch-size 3 is not divisible by "
              "--micro-batch-size 2"]),
            ("{start: 12, rotary_base: 500000}", (),
             ["context_stages start 12 is not before the end of training (--train-iters 12)"]),
            ("{start: 6, rotary_base: 500000}", ("--position-embedding-type", "learned_absolute"),
             ["--rotary-base 500000 configure rotary position embeddings"]),
            ("{start: 6, seq_length: 32, global_batch_size: 32}",
             ("--position-embedding-type", "learned_absolute", "--max-position-embeddings", "64"),
             []),  # shorter, within the learned positions: allowed
            ("{start: 6, max_position_embeddings: 128}",
             ("--position-embedding-type", "learned_absolute"),
             ["learned absolute position embeddings for 64 positions", "RoPE"]),
            ("{start: 6, rotary_base: 500000}", ("--rampup-batch-size", "4", "4", "64"),
             ["context_stages set the global batch by iteration and --rampup-batch-size 4 4 64 by "
              "samples; give one"]),
            ("{start: 6, rotary_base: 500000}", ("--seq-length-schedule", "{type: constant, value: 32}"),
             ["context_stages and a sequence-length curriculum"])):
        argv = _base(tmp_path, "context_stages:\n  - " + stage + "\n", extra)
        if not parts:
            assert _parse(argv).context_stages.stages[1].args.seq_length == 32
            continue
        else:
            err = one_error_line(argv, capsys)
        for part in parts:
            assert part in err, (part, err)
    base = [a for a in _base(tmp_path) if a not in ("--train-iters", "12")]
    err = one_error_line(base + ["--train-samples", "192"], capsys)
    assert "context_stages need --train-iters" in err and "--train-samples 192" in err


def _checkpoint(tmp_path, flags, iteration):
    """A --load directory whose latest checkpoint (of ``iteration``) records the model flags of
    ``flags``."""
    from megatron.config.checkpoint_args import model_args_from_args

    args = _parse(tiny_run_flags(train_iters=12) + flags)
    root = tmp_path / f"ckpt_{iteration}_{len(list(tmp_path.iterdir()))}"
    directory = root / f"iter_{iteration:07d}"
    directory.mkdir(parents=True)
    (directory / "model_args.json").write_text(json.dumps(model_args_from_args(args)))
    (root / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return str(root)


def test_a_resume_of_a_one_launch_run_checks_the_stage_that_trained_the_checkpoint(tmp_path, capsys):
    """At or after the stage's start no --extend-context is needed: the checkpoint of iteration
    6 is stage 1's (the stage trains from iteration 7), later ones stage 2's; a checkpoint whose
    context is not its stage's is refused as any resume is."""
    for iteration, flags in ((4, STAGE1), (6, STAGE1), (7, STAGE2), (10, STAGE2)):
        args = _parse(_base(tmp_path, extra=["--load", _checkpoint(tmp_path, flags, iteration)]))
        assert args.context_stages is not None and args.extend_context is None
    for iteration, flags, shown in ((6, STAGE2, "--seq-length 256 -> 64"),
                                    (7, STAGE1, "--seq-length 64 -> 256")):
        err = one_error_line(_base(tmp_path, extra=["--load", _checkpoint(tmp_path, flags, iteration)]),
                             capsys)
        assert "this resume changes the context of the checkpoint's model" in err, err
        assert shown in err and f"iter_{iteration:07d}" in err, err
    err = one_error_line(_base(tmp_path, extra=["--load", _checkpoint(tmp_path, STAGE1, 6),
                                                "--use-checkpoint-args"]), capsys)
    assert "context_stages with --use-checkpoint-args" in err, err
    # --extend-context still makes such a resume a stage (against the stage it resumes into)
    args = _parse(_base(tmp_path, extra=["--load", _checkpoint(tmp_path, STAGE1, 7),
                                         "--extend-context"]))
    assert any("a context-extension stage from" in n for n in args.run_config.notes)


def test_the_rotary_embeddings_switch_in_place_as_a_model_built_at_the_stage(
        one_rank_model_parallel):
    """A RoPE model switched to the stage's base, to YaRN and to Llama 3.1's scaling computes
    what a model built with those flags computes (the same weights: they are drawn from the seed
    and names); so does the pipe model (one stage here; two ranks of PP 2 switch in one run as
    their two-launch version: docs/context_extension.md#in-one-run)."""
    from helpers.models import gpt_model, gpt_model_pipe
    from megatron.model.pipe_io import pipe_batch
    from megatron.model.rotary import YarnRotaryEmbedding, set_rotary_embeddings

    common = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
              "--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-3",
              "--hidden-dropout", "0", "--attention-dropout", "0"]

    def build(*flags):
        from megatron.config.arguments import validate_args
        from megatron.config.parser import get_parser

        args = validate_args(get_parser().parse_args(common + list(flags)), 1, require_data=False)
        args.padded_vocab_size = 128
        return args, gpt_model(args), gpt_model_pipe(args)

    tokens = torch.randint(0, 100, (2, 48))
    positions = torch.arange(48).expand(2, 48)
    inputs, _ = pipe_batch({"tokens": tokens, "labels": tokens, "position_ids": positions,
                            "loss_mask": torch.ones(2, 48), "dataset_id": torch.tensor([0, 0])})
    _, model, pipe = build("--position-embedding-type", "rope", "--seq-length", "16")
    for target in (["--position-embedding-type", "rope", "--seq-length", "48",
                    "--rotary-base", "500000"],
                   ["--position-embedding-type", "yarn", "--seq-length", "48",
                    "--rotary-scaling-factor", "4", "--yarn-original-max-position-embeddings", "16",
                    "--mscale", "0.7"],
                   ["--position-embedding-type", "rope", "--seq-length", "48",
                    "--use-rope-scaling", "--rope-scaling-factor", "2"]):
        args, fresh, fresh_pipe = build(*target)
        m = args.run_config.model
        switch = (args.run_config.transformer, m.position_embedding_type, m.rotary_percent,
                  m.rotary_base, m.rope_scaling, m.max_position_embeddings)
        assert set_rotary_embeddings(model, *switch) == 1
        assert set_rotary_embeddings(pipe, *switch) == 1  # one per transformer layer
        assert model.position_embedding_type == fresh.position_embedding_type
        assert isinstance(model.rotary_pos_emb, YarnRotaryEmbedding) == (
            m.position_embedding_type == "yarn")
        assert hasattr(model.decoder.config, "yarn_mscale") == (m.position_embedding_type == "yarn")
        with torch.no_grad():
            torch.testing.assert_close(model(tokens, positions, None),
                                       fresh(tokens, positions, None), rtol=0, atol=0)
            torch.testing.assert_close(pipe(inputs), fresh_pipe(inputs), rtol=0, atol=0)
