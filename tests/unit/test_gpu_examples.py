"""The GPU example scripts (examples/*.sh that launch ``deepspeed ... pretrain_gpt.py``) cannot rot:
their command lines, read from the script text with its default settings (no shell, no launch),
parse and validate for the script's GPU count (the CPU example scripts run from a fresh clone in
tests/e2e/test_examples.py). examples/extend_context_yarn_32k.sh's two stages go further: its
8K stage's recorded flags (a checkpoint's model_args.json) accept its 32K stage as a
context-extension resume (tokens per step kept, RoPE -> YaRN, Ulysses SP 4), and its LR schedule
files give the 8K stage's values up to the extension and a re-warm from 0 after it."""
import json
import re
import shlex
from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import pytest

from helpers.paths import ROOT

EXAMPLES = Path(ROOT) / "examples"

_VAR = re.compile(r"\$\(\((?P<arith>[^)]*)\)\)|\$\{(?P<name>\w+)(?:\[@\])?(?::-(?P<default>[^}]*))?\}"
                  r"|\$(?P<bare>\w+)")


def _expand(text: str, scalars: Dict[str, str], arrays: Dict[str, List[str]]) -> str:
    """``text`` with the shell's parameter expansions the scripts use: ``$V``, ``${V}``,
    ``${V:-default}``, ``"${A[@]}"`` (the array's words, each quoted), ``$((arithmetic))``."""

    def one(m):
        if m.group("arith") is not None:
            expr = _VAR.sub(one, m.group("arith"))
            expr = re.sub(r"\b([A-Za-z_]\w*)\b", lambda v: scalars[v.group(1)], expr)
            assert re.fullmatch(r"[\d\s+*/()-]+", expr), expr
            return str(eval(expr.replace("/", "//")))  # integers only, as bash
        name = m.group("name") or m.group("bare")
        if name in arrays:
            return " ".join(shlex.quote(w) for w in arrays[name])
        if name in scalars:
            return scalars[name]
        default = m.group("default")
        assert default is not None, f"${name} is not set"
        return _VAR.sub(one, default)

    # "${A[@]}": the array's words, each a word of its own (not one quoted word)
    text = re.sub(r'"\$\{(\w+)\[@\]\}"',
                  lambda m: " ".join(shlex.quote(w) for w in arrays[m.group(1)]), text)
    return _VAR.sub(one, text)


def script_commands(path, env: Dict[str, str]) -> Tuple[List[List[str]], Dict[str, str]]:
    """The ``pretrain_gpt.py`` argument lists of the ``deepspeed`` commands in the script at
    ``path`` (inside an ``if`` too) with ``env`` set and every other setting at its default, and
    ``NUM_GPUS``; the files its ``cat > FILE <<EOF`` here-documents write are written, their paths
    returned. Top-level assignments (``V=value``, ``V=(words ...)`` over several lines) are
    evaluated in order; ``if`` bodies are not."""
    lines = path.read_text().replace("\\\n", " ").replace('"$@"', "").splitlines()
    scalars, arrays, commands, files = dict(env), {}, [], {}
    depth, i = 0, 0
    while i < len(lines):
        line = lines[i].strip()
        i += 1
        if not line or line.startswith("#"):
            continue
        heredoc = re.fullmatch(r"cat > (\S+) <<EOF", line)
        if heredoc:
            body = []
            while lines[i] != "EOF":
                body.append(lines[i])
                i += 1
            i += 1
            target = shlex.split(_expand(heredoc.group(1), scalars, arrays))[0]
            text = _expand("\n".join(body) + "\n", scalars, arrays)
            with open(target, "w") as f:
                f.write(text)
            files[target] = text
            continue
        if line.startswith("if "):
            depth += 1
            continue
        if line == "fi":
            depth -= 1
            continue
        if line.startswith("deepspeed "):
            words = shlex.split(_expand(line, scalars, arrays))
            commands.append(words[words.index("pretrain_gpt.py") + 1:])
            scalars["NUM_GPUS"] = words[words.index("--num_gpus") + 1]
            continue
        array = re.fullmatch(r"(\w+)=\((.*)", line)
        if array and not depth:
            body = array.group(2)
            while not body.rstrip().endswith(")"):
                body += " " + lines[i].strip()
                i += 1
            arrays[array.group(1)] = shlex.split(_expand(body.rstrip()[:-1], scalars, arrays))
            continue
        scalar = re.fullmatch(r"(\w+)=(.+?)(\s+#.*)?", line)
        if scalar and not depth:
            value = shlex.split(_expand(scalar.group(2), scalars, arrays))
            scalars.setdefault(scalar.group(1), value[0] if value else "")
            if scalar.group(1) not in env:
                scalars[scalar.group(1)] = value[0] if value else ""
    return commands, files


@pytest.fixture(autouse=True)
def on_gpus(monkeypatch):
    """Validation as on the scripts' GPU machine: the checks of GPU-only settings (MoE's alltoall
    dispatcher) pass; the fused kernels and GPU initialisation are only recorded in the
    TransformerConfig (no model is built here)."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


def _parse(argv: List[str], world_size: int):
    from megatron.config.parser import parse_args

    return parse_args(argv, world_size=world_size)


@pytest.mark.parametrize("script, world, layout", [
    ("pretrain_gpt_350m.sh", 8, (1, 1, 8, 1)),
    ("pretrain_gpt_350m_moe.sh", 8, (1, 1, 8, 1)),
])
def test_gpu_pretraining_example_flags_validate(script, world, layout, tmp_path):
    """The single-stage GPU recipes parse and validate for their 8 GPUs (TP, PP, DP, Ulysses SP)."""
    commands, _ = script_commands(EXAMPLES / script, {"OUT": str(tmp_path)})
    assert len(commands) == 1
    args = _parse(commands[0], world)
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
            args.data_parallel_size, args.ds_sequence_parallel_size) == layout


@pytest.fixture
def extension_stages(tmp_path):
    """examples/extend_context_yarn_32k.sh's two stages: (8K argv, 32K argv, files written)."""
    commands, files = script_commands(EXAMPLES / "extend_context_yarn_32k.sh",
                                      {"OUT": str(tmp_path)})
    assert len(commands) == 2
    return commands[0], commands[1], files


def _stage1_checkpoint(args, iteration: int) -> None:
    """What the 8K stage leaves in its --save directory after ``iteration`` iterations, as the
    resume check reads it: the tracker and the checkpoint's model_args.json."""
    from megatron.config.checkpoint_args import model_args_from_args

    directory = Path(args.save) / f"iter_{iteration:07d}"
    directory.mkdir(parents=True)
    (directory / "model_args.json").write_text(json.dumps(model_args_from_args(args)))
    (Path(args.save) / "latest_checkpointed_iteration.txt").write_text(str(iteration))


def test_context_extension_example_stages_validate_as_an_extension(extension_stages):
    """The 8K stage: RoPE, 64 x 8192 tokens per step, DP 8. The 32K stage, a resume of the 8K
    stage's checkpoint: YaRN 4x of 8192, 16 x 32768 (the same tokens per step), Ulysses SP 4 x
    DP 2, full recompute; the resume check names each change and accepts it."""
    short, long, _ = extension_stages
    stage1 = _parse(short, 8)
    assert (stage1.seq_length, stage1.global_batch_size, stage1.position_embedding_type) == (
        8192, 64, "rope")
    assert (stage1.data_parallel_size, stage1.ds_sequence_parallel_size) == (8, 1)
    extend_at = stage1.train_iters
    _stage1_checkpoint(stage1, extend_at)
    stage2 = _parse(long, 8)
    assert (stage2.seq_length, stage2.global_batch_size) == (32768, 16)
    assert stage1.seq_length * stage1.global_batch_size == stage2.seq_length * stage2.global_batch_size
    assert (stage2.position_embedding_type, stage2.rotary_scaling_factor,
            stage2.yarn_original_max_position_embeddings) == ("yarn", 4.0, 8192)
    assert (stage2.ds_sequence_parallel_size, stage2.data_parallel_size) == (4, 2)
    assert stage2.recompute_granularity == "full" and stage2.extend_context == "keep-tokens"
    assert stage2.load == stage1.save and stage2.train_iters > extend_at
    assert stage2.eval_position_bounds == (0, 8192, 16384, 24576, 32768)
    notes = [n for n in stage2.run_config.notes if n.startswith("--extend-context:")]
    assert len(notes) == 1, stage2.run_config.notes
    for change in ("--seq-length 8192 -> 32768", "--max-position-embeddings 8192 -> 32768",
                   "--position-embedding-type rope -> yarn", "--rotary-scaling-factor 1 -> 4",
                   "--yarn-original-max-position-embeddings 4096 -> 8192",
                   "--global-batch-size 64 -> 16"):
        assert change in notes[0], (change, notes[0])


def test_context_extension_example_lr_rewarms_at_the_extension(extension_stages):
    """The 32K stage's schedule file is the 8K stage's with two stages appended at the extension:
    the same LR for the 8K stage's iterations; the checkpoint's scheduler state (after the 8K stage) loads into the 32K
    stage's scheduler (--extend-context takes the new batch and length,
    --override-opt_param-scheduler the appended stages); the LR then climbs from 0 to 3e-5 over
    the re-warm and decays to 0 at the end."""
    import torch

    from megatron.optim.learning_rates import build_opt_param_scheduler

    short, long, files = extension_stages
    assert sum(name.endswith("lr_8k.yaml") or name.endswith("lr_32k.yaml") for name in files) == 2
    stage1 = _parse(short, 8)
    extend_at = stage1.train_iters
    _stage1_checkpoint(stage1, extend_at)
    stage2 = _parse(long, 8)

    def scheduler(args):
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
        return build_opt_param_scheduler(args.run_config.schedule, optimizer)

    old, new = scheduler(stage1), scheduler(stage2)
    its = np.arange(0, extend_at)  # the LR after k iterations is iteration k + 1's
    np.testing.assert_array_equal(new.values_at(its, its * 64)[0], old.values_at(its, its * 64)[0])
    old.step(64 * extend_at, iterations=extend_at)
    assert old.get_lr() == pytest.approx(3e-5)
    new.load_state_dict(old.state_dict())
    assert new.num_iters == extend_at and new.get_lr() == 0.0
    end = stage2.train_iters
    rewarm = 100
    after = np.arange(extend_at, end + 1)
    lr = new.values_at(after, 64 * extend_at + (after - extend_at) * 16)[0]
    assert lr[0] == 0.0 and lr[rewarm] == pytest.approx(3e-5) and lr.max() == pytest.approx(3e-5)
    assert np.all(np.diff(lr[:rewarm + 1]) > 0) and np.all(np.diff(lr[rewarm:]) <= 0)
    assert lr[-1] == pytest.approx(0.0, abs=1e-12)
