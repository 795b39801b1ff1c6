"""Weights & Biases logging (megatron/metrics/wandb_writer.py) at an entry point: pretrain_gpt.py
with --wandb-project and no importable wandb stops before any work with one error line naming the
extra (the flags, the run id and a failing log in process: tests/unit/test_wandb_logging.py)."""
import pytest

from helpers.launch import run_single_process

pytestmark = pytest.mark.launch


def test_entry_point_without_wandb_stops_before_training(demo_data, tmp_path, monkeypatch):
    """pretrain_gpt.py in one process, with a ``wandb`` on PYTHONPATH that fails to import as an
    absent package does: exit status 2 and one error line, before any work."""
    blocker = tmp_path / "no_wandb"
    blocker.mkdir()
    (blocker / "wandb.py").write_text("raise ModuleNotFoundError(\"No module named 'wandb'\", "
                                      "name='wandb')\n")
    monkeypatch.setenv("PYTHONPATH", str(blocker))
    proc = run_single_process("pretrain_gpt.py", [
        "--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
        "--seq-length", "32", "--micro-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
        "--data-path", demo_data["web"], "--save", str(tmp_path / "ckpt"),
        "--wandb-project", "p", "--wandb-exp-name", "e"], cwd=tmp_path)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 2, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0].startswith(
        "error: --wandb-project p needs the wandb package, which cannot be imported "
        "(ModuleNotFoundError: No module named 'wandb'); install it: pip install '.[wandb]' (or "
        "pip install wandb)"), log[-3000:]
    assert not (tmp_path / "ckpt").exists()
