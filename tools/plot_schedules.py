#!/usr/bin/env python
"""Draw every built-in schedule kind to ``docs/img/schedule_<kind>.png`` (used by docs/schedules.md).

    python tools/plot_schedules.py [--output-dir docs/img]
"""
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir))
sys.path.insert(0, ROOT)

import argparse  # noqa: E402

import numpy as np  # noqa: E402

from megatron.schedules.registry import ScheduleContext, build_schedule  # noqa: E402
from megatron.schedules.units import BatchSchedule  # noqa: E402

TRAIN_ITERS = 1000
# a run of 1000 iterations, global batch 64 reached by rampup from 16 over 20000 samples
CONTEXT = ScheduleContext.for_training(BatchSchedule(64, (16, 16, 20000), seq_length=2048), TRAIN_ITERS)

EXAMPLES = {
    "constant": [{"type": "constant", "value": 3e-4, "warmup": 100}],
    "linear": [{"type": "linear", "from": 3e-4, "to": 3e-5, "warmup": 100},
               {"type": "linear", "points": {0: 3e-4, 200: 1e-4, 600: 2e-4, 1000: 0.0}}],
    "cosine": [{"type": "cosine", "from": 3e-4, "to": 3e-5, "warmup": 100}],
    "inverse-square-root": [{"type": "inverse-square-root", "from": 3e-4, "to": 3e-5, "warmup": 100}],
    "wsd": [{"type": "wsd", "from": 3e-4, "to": 3e-5, "warmup": 100, "decay": 200, "decay_style": s}
            for s in ("exponential", "linear", "cosine", "minus_sqrt")],
    "power": [{"type": "power", "max": 0.02, "a": 4.6, "b": -0.51, "unit": "iterations",
               "warmup": 100, "decay": 100, "decay_style": s} for s in ("exponential", "linear")]
    + [{"type": "power", "max": 0.02, "a": 1.0, "b": -0.51, "unit": "iterations", "warmup": 100,
        "decay": 100}],
    "step": [{"type": "step", "points": {0: 3e-4, 500: 1e-4, 800: 3e-5}}],
    "piecewise-linear": [{"type": "piecewise-linear", "points": {0: 0.0, 100: 3e-4, 700: 3e-4,
                                                                  1000: 3e-5}}],
    "staged": [[{"start": 0, "schedule": {"type": "linear", "from": 0.0, "to": 3e-4}},
                {"start": 100, "schedule": {"type": "constant", "value": 3e-4}},
                {"start": 800, "schedule": {"type": "cosine", "from": 3e-4, "to": 3e-5}}]],
}


def _label(config) -> str:
    if isinstance(config, list):
        return "staged: linear | constant | cosine"
    keys = {k: v for k, v in config.items() if k not in ("type",)}
    return ", ".join(f"{k}={v}" for k, v in keys.items())[:90]


def plot_all(output_dir: str) -> list:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    os.makedirs(output_dir, exist_ok=True)
    iterations = np.arange(TRAIN_ITERS + 1)
    samples = CONTEXT.batch_schedule.samples_at_iterations(iterations)
    written = []
    for kind, configs in EXAMPLES.items():
        fig, ax = plt.subplots(figsize=(7, 3.2))
        for config in configs:
            schedule = build_schedule(config, CONTEXT)
            progress = {"iterations": iterations, "samples": samples,
                        "tokens": samples * CONTEXT.batch_schedule.seq_length}[schedule.unit]
            ax.plot(iterations, schedule(progress), label=_label(config))
        ax.set_title(f"type: {kind}")
        ax.set_xlabel("iteration (1000 total)")
        ax.set_ylabel("value")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="best")
        fig.tight_layout()
        path = os.path.join(output_dir, f"schedule_{kind}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "docs", "img"))
    args = parser.parse_args(argv)
    for path in plot_all(args.output_dir):
        print(path)


if __name__ == "__main__":
    main()
