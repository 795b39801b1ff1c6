"""Pipeline efficiency of PP=2 (DeepSpeed's pipe engine, GPTModelPipe) against the theoretical
bubble, for several micro-batch counts m per iteration.

A p-stage pipeline running m micro batches takes (m + p - 1) stage-steps where one rank would take
m * p, so its ideal speed-up over one rank is p * m / (m + p - 1) and the idle ("bubble") fraction
is (p - 1) / (m + p - 1). For each m the same model trains on 1 rank (PP 1) and on p ranks (PP p)
through the deepspeed launcher (CPU ranks, gloo); per-iteration times come from the training
loop's own metrics (warm-up iterations dropped). Printed per m: ms/iteration of each, measured
speed-up, theoretical bubble, ideal speed-up, and efficiency = measured / ideal (1.0 = only the
theoretical bubble is lost; the rest is p2p transfer, stage imbalance and the engine's overhead).

    DS_ACCELERATOR=cpu python benchmarks/pipeline_efficiency.py [--micro-batches 1 2 4 8] [--iters 12]

Needs one CPU core per rank (2 for PP 2); run on an otherwise idle machine.
"""
import argparse
import os
import sys
import tempfile
from statistics import median

from launch import ROOT, launch_pretraining


def theoretical_bubble(stages: int, micro_batches: int) -> float:
    """Idle fraction (p - 1) / (m + p - 1) of a p-stage pipeline over m micro batches."""
    return (stages - 1) / (micro_batches + stages - 1)

def ideal_speedup(stages: int, micro_batches: int) -> float:
    """p * m / (m + p - 1): p ranks, each idle for the bubble fraction."""
    return stages * (1.0 - theoretical_bubble(stages, micro_batches))

def run(opts, data_prefix: str, work: str, ranks: int, micro_batches: int) -> float:
    """Median ms per iteration (after ``--warmup`` iterations) of one launch."""
    metrics = os.path.join(work, f"metrics_{ranks}_{micro_batches}.jsonl")
    flags = [
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", "8", "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size),
        "--global-batch-size", str(opts.micro_batch_size * micro_batches),
        "--train-iters", str(opts.iters), "--lr", "1e-4", "--lr-decay-style", "constant",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local",
        "--data-path", data_prefix, "--split", "98,1,1", "--eval-iters", "0",
        "--data-cache-path", os.path.join(work, "cache"), "--log-interval", "1",
        "--pipeline-model-parallel-size", str(ranks)]
    records = launch_pretraining(flags, ranks, metrics, f"PP {ranks}, {micro_batches} micro-batches")
    return median(r["ms_per_iteration"] for r in records[opts.warmup:])

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--micro-batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    opts = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from tools.make_demo_data import make_demo_data

    with tempfile.TemporaryDirectory() as work:
        data = make_demo_data(os.path.join(work, "data"), size_mb=1.0, verbose=False)["web"]
        p = opts.stages
        print(f"model: {opts.num_layers} layers, hidden {opts.hidden_size}, seq {opts.seq_length}, "
              f"micro batch {opts.micro_batch_size}; PP {p} on {p} CPU ranks vs PP 1 on 1 rank")
        print(f"{'m':>3} {'PP1 ms/it':>10} {f'PP{p} ms/it':>10} {'speed-up':>9} {'bubble':>7} "
              f"{'ideal':>6} {'efficiency (measured/ideal)':>28}")
        for m in opts.micro_batches:
            one = run(opts, data, work, 1, m)
            pipe = run(opts, data, work, p, m)
            speedup = one / pipe
            print(f"{m:>3} {one:>10.1f} {pipe:>10.1f} {speedup:>9.2f} {theoretical_bubble(p, m):>7.3f} "
                  f"{ideal_speedup(p, m):>6.2f} {speedup / ideal_speedup(p, m):>28.2f}")

if __name__ == "__main__":
    main()
