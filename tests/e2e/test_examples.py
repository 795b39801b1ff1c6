"""The CPU example scripts as a new user runs them: from a fresh clone, no virtual environment
active, DeepSpeed's default port 29500 held by another process. Each must exit 0, leave none of
its shared-memory buffers in /dev/shm, say what it builds before a one-time op build, print no
optional-dependency or deprecation noise, and (demo) say "nothing to train" on a resume at the end.

The clone reuses this test session's venv (``VENV``) so nothing is installed; iterations are cut
with the scripts' own knobs (extra training flags for the demo, *_ITERS for the T0 pipeline).
"""
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from helpers.launch import own_shm_buffers
from helpers.paths import ROOT

pytestmark = pytest.mark.launch

VENV = sys.prefix
DEMO_ARGS = ["--train-iters", "6", "--lr-warmup-iters", "2", "--power-scheduler-decay-iters", "2",
             "--log-interval", "3", "--eval-interval", "3", "--eval-iters", "1", "--save-interval", "3"]
NOISE = ("Transformer Engine", "Apex", "all_gather_into_tensor", "valid valid", "test test")


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A fresh ``git clone`` of this repository (its committed state)."""
    path = tmp_path_factory.mktemp("clone") / "repo"
    subprocess.run(["git", "clone", "--quiet", ROOT, str(path)], check=True, timeout=120)
    stamp = subprocess.run(["sha1sum", str(path / "pyproject.toml")], capture_output=True, text=True,
                           check=True).stdout[:12]
    if not os.path.exists(os.path.join(VENV, f".installed-{stamp}")):
        pytest.skip(f"{VENV} was installed for another pyproject.toml; the scripts would reinstall it")
    return path


@pytest.fixture(scope="module")
def port_29500_busy():
    """Something else listens on DeepSpeed's default port for the whole module."""
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", 29500))
        s.listen()
    except OSError:  # held by another process already: just as good
        pass
    yield
    s.close()


def _user_env(**extra) -> dict:
    """The environment of a user's shell: no venv on PATH or active, no project settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "DS_ACCELERATOR", "TORCH_EXTENSIONS_DIR",
                        "MASTER_PORT", "MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                        "OMP_NUM_THREADS")}
    env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(VENV))
    env.update(VENV=VENV, **extra)
    return env


def _run(clone, script, args=(), **env) -> str:
    proc = subprocess.run(["bash", script, *args], cwd=str(clone), env=_user_env(**env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return proc.stdout


def _check_launches(log: str, expected: int) -> None:
    """Launches on a free port other than the busy 29500 (one more for each launch that lost its
    port to another process and was retried: tools/cpu_env.sh), no buffers of theirs left, no
    noise."""
    ports = re.findall(r"--master_port=(\d+)", log)
    assert len(ports) == expected + log.count("[launch] MASTER_PORT "), log[-3000:]
    assert "29500" not in ports
    for port in ports:
        assert own_shm_buffers(port) == []
    for noise in NOISE:
        assert noise not in log, (noise, log[-3000:])


def _fresh_extensions_dir(tmp_path) -> str:
    """A TORCH_EXTENSIONS_DIR where no op is built yet. The object files of this venv's finished
    builds are copied (their libraries are not), so torch only relinks: the notice and the build
    order are those of a first build, at a fraction of its cost. An op still being built (by a
    test running meanwhile) is not copied; the script then builds it from scratch."""
    built = os.path.join(VENV, "torch_extensions")
    fresh = tmp_path / "torch_extensions"
    fresh.mkdir()
    for op_dir in glob.glob(os.path.join(built, "**", "*.so"), recursive=True):
        source = os.path.dirname(op_dir)
        if os.path.exists(os.path.join(source, "lock")):
            continue  # a build in progress
        shutil.copytree(source, fresh / os.path.relpath(source, built),
                        ignore=shutil.ignore_patterns("*.so", "lock"))
    return str(fresh)


def test_demo_from_a_fresh_clone(clone, port_29500_busy, tmp_path):
    log = _run(clone, "examples/run_demo_cpu.sh", DEMO_ARGS,
               TORCH_EXTENSIONS_DIR=_fresh_extensions_dir(tmp_path))
    _check_launches(log, 1)
    shm_notice = log.find("building DeepSpeed's CPU communication op (deepspeed_shm_comm)")
    assert 0 <= shm_notice < log.find("deepspeed_shm_comm_op built successfully"), log[-3000:]
    assert "building the curriculum index kernel" in log, log[-3000:]
    assert " iteration        6/       6 |" in log and " valid web | iteration 6 |" in log
    with open(clone / "runs/demo/schedule_preview.json") as f:
        assert len(json.load(f)["lr"]) == 7  # the extra flags reached the preview
    metrics = (clone / "runs/demo/metrics.jsonl").read_text()

    again = _run(clone, "examples/run_demo_cpu.sh",
                 DEMO_ARGS + ["--load", "runs/demo/checkpoints"])
    _check_launches(again, 1)
    assert "nothing to train: the checkpoint in --load runs/demo/checkpoints is at iteration 6" in again
    assert "building DeepSpeed's" not in again and "building the curriculum" not in again  # once
    assert (clone / "runs/demo/metrics.jsonl").read_text() == metrics


def test_toy_t0_pipeline_from_a_fresh_clone(clone, port_29500_busy):
    log = _run(clone, "examples/finetune_t0/run_toy_cpu.sh", ["runs/toy"], EXAMPLES_PER_TASK="40",
               PRETRAIN_ITERS="4", FINETUNE_ITERS="4")
    _check_launches(log, 2)
    assert " valid | iteration 4 |" in log and " valid first_word | iteration 4 |" in log
    assert os.path.exists(clone / "runs/toy/rank_classification.json")


def test_moe_example_flags_validate_for_its_two_ranks(clone, tmp_path):
    """examples/pretrain_gpt_moe_cpu.sh with MOE_PREVIEW_ONLY=1 (validate_args for its 2 ranks, as
    expert-parallel 2 needs, and the schedule preview; no launch: the run itself is by hand,
    docs/moe.md)."""
    log = _run(clone, "examples/pretrain_gpt_moe_cpu.sh", MOE_PREVIEW_ONLY="1",
               RUN=str(tmp_path / "moe"))
    assert "schedule preview: 200 iterations" in log
    preview = json.loads((tmp_path / "moe" / "schedule_preview.json").read_text())
    assert preview["iteration"][-1] == 200 and len(preview["lr"]) == 201


def test_extend_context_example_stages_validate(demo_data, tmp_path, monkeypatch):
    """examples/extend_context_cpu.sh's two stages (EXTEND_FLAGS_ONLY=1: its flags, no launch),
    on the test's demo corpus and a small long-document one: stage 1 validates for its 2 ranks;
    stage 2 validates as the resume of a checkpoint that records stage 1's flags (the extension
    64 -> 256 tokens, RoPE base 500000, 16 -> 4 sequences per step: tokens per step kept), with
    its blend file (a declared replay among its entries) and the LR file."""
    from megatron.config.checkpoint_args import model_args_from_args
    from megatron.config.parser import parse_args
    from tools.make_long_documents import make_long_documents

    out = subprocess.run(["bash", "examples/extend_context_cpu.sh"], cwd=ROOT, check=True,
                         env=dict(os.environ, EXTEND_FLAGS_ONLY="1", RUN=str(tmp_path / "run")),
                         capture_output=True, text=True).stdout.splitlines()
    split = out.index("stage2")
    long = make_long_documents(str(tmp_path / "long"), documents=40, verbose=False)
    monkeypatch.chdir(tmp_path)  # the blend files' paths are relative to the repository root
    for name in ("demo", "demo_long"):
        os.makedirs(tmp_path / "data" / name)
    for prefix in list(demo_data.values()) + [long]:
        where = "demo_long" if prefix == long else "demo"
        for ext in (".bin", ".idx"):
            os.symlink(prefix + ext, tmp_path / "data" / where / (os.path.basename(prefix) + ext))
    flags = [[os.path.join(ROOT, a) if a.startswith("examples/") else a for a in stage]
             for stage in (out[1:split], out[split + 1:])]
    first = parse_args(flags[0], world_size=2)
    assert (first.seq_length, first.global_batch_size, first.rotary_base) == (64, 16, 10000)
    iteration = first.exit_interval
    directory = tmp_path / "run" / "checkpoints" / f"iter_{iteration:07d}"
    directory.mkdir(parents=True)
    (directory / "model_args.json").write_text(json.dumps(model_args_from_args(first)))
    (directory.parent / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    second = parse_args(flags[1], world_size=2)
    assert (second.seq_length, second.global_batch_size, second.rotary_base) == (256, 4, 500000)
    assert any("--extend-context: a context-extension stage" in n and "--seq-length 64 -> 256" in n
               for n in second.run_config.notes), second.run_config.notes
