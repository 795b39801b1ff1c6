"""The pretraining scenario of the exact-resume tests (tests/e2e/test_exact_resume_e2e.py,
tests/e2e/test_schedule_resume_e2e.py, tests/unit/test_exact_resume.py): a staged LR schedule
(--lr-schedule-config) and a 3-dataset curriculum (--data-blend-config) over demo data."""
import os
from typing import Dict, List

TRAIN_ITERS = 16

STAGED_LR = """\
lr_schedule:
  - start: 0
    schedule: {type: linear, from: 0.0, to: 3.0e-3}
  - start: 3
    schedule: {type: constant, value: 3.0e-3}
  - start: 7
    schedule: {type: cosine, from: 3.0e-3, to: 3.0e-4}
"""


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
