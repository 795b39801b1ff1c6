"""Attention backends in runs: an explicit FlexAttention on CPU stops the entry point with one line,
ALiBi under tensor parallelism trains as on one rank (through the deepspeed launcher), and the GPU
benchmark script's CPU smoke run (the backends in process:
tests/unit/test_attention_backends.py)."""
import os
import re
import subprocess
import sys

import pytest

from helpers.launch import run_single_process
from helpers.parallel import assert_losses_match, run_layout
from helpers.paths import ROOT

pytestmark = pytest.mark.launch


def pretrain_flags(demo_data, run_dir, extra=()):
    return ["--num-layers", "2", "--hidden-size", "48", "--num-attention-heads", "6",
            "--seq-length", "64", "--micro-batch-size", "2", "--global-batch-size", "4",
            "--train-iters", "8", "--lr", "3e-3", "--lr-decay-style", "constant",
            "--hidden-dropout", "0", "--attention-dropout", "0",
            "--data-path", demo_data["web"], "--split", "98,2,0",
            "--data-cache-path", str(run_dir / "cache"), "--log-interval", "1",
            "--eval-interval", "100", "--eval-iters", "0",
            "--metrics-jsonl", str(run_dir / "metrics.jsonl"), "--seed", "5", *extra]


def test_explicit_flex_on_cpu_stops_the_run_with_one_line(demo_data, tmp_path):
    """One process, no launcher (the launcher's one-line errors:
    tests/e2e/test_error_reporting_e2e.py)."""
    proc = run_single_process("pretrain_gpt.py", pretrain_flags(demo_data, tmp_path, [
        "--attention-backend", "flex"]))
    assert proc.returncode != 0
    assert ("error: --attention-backend flex: torch's FlexAttention has no backward pass on CPU"
            in proc.stderr + proc.stdout)
    assert "Traceback" not in proc.stderr


def test_alibi_with_tensor_parallelism_matches_one_rank(demo_data, tmp_path):
    """Pretraining through the deepspeed launcher with ALiBi and --reset-attention-mask (document
    segments from EODs): the backend is named in the start-up log, the loss falls, and TP 2 (each
    rank its 2 heads' slopes) gives the losses of the one-rank run; a rank using the wrong heads'
    slopes would not."""
    alibi = ["--position-embedding-type", "alibi"]  # in place of the layout model's YaRN
    extra = ["--reset-attention-mask", "--reset-position-ids"]
    reference, proc = run_layout(demo_data, tmp_path / "tp1", num_ranks=1, extra=extra, iters=6,
                                 encoding=alibi)
    assert ("attention backend: sdpa [--attention-backend auto: CPU: SDPA (FlexAttention has no "
            "CPU backward)]") in proc.stdout
    assert reference[-1] < reference[0] - 0.3
    losses, _ = run_layout(demo_data, tmp_path / "tp2", num_ranks=2, iters=6, encoding=alibi,
                           extra=extra + ["--tensor-model-parallel-size", "2"])
    assert_losses_match(losses, reference)


def test_gpu_benchmark_script_smoke_run_on_cpu():
    """benchmarks/gpu/attention_backends.py stays runnable: its --device cpu smoke run agrees with
    SDPA-dense (the GPU figures come from a GPU machine)."""
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "gpu", "attention_backends.py"),
                           "--device", "cpu", "--seq-length", "64", "--batch", "2", "--heads", "4",
                           "--head-dim", "8", "--dtype", "fp32", "--alibi", "--iters", "1",
                           "--documents", "4"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    diff = re.search(r"sdpa-segments .* max\|diff\| (\S+)", proc.stdout)
    assert diff and float(diff.group(1)) < 1e-5, proc.stdout
