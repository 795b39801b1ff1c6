"""Communication overhead of tensor parallelism: TP 2 (and TP 2 + sequence parallelism) against
TP 1 on the same model, through the deepspeed launcher on CPU ranks (gloo), one thread per rank.

TP 2 splits every layer's matrix work over 2 ranks, so with free communication an iteration takes
half of TP 1's time; what it takes beyond that is the price of the tensor-parallel all-reduces (or,
with --sequence-parallel, all-gathers and reduce-scatters) plus the work TP does not split (norms,
embeddings, the optimizer on replicated parameters). Printed per layout: median ms/iteration
(warm-up dropped, from the loop's own metrics; best of --repeats interleaved rounds), speed-up
over TP 1, and overhead =
(t_TP2 - t_TP1 / 2) / t_TP2, the fraction of a TP 2 iteration not explained by the split work.

    DS_ACCELERATOR=cpu python benchmarks/tensor_parallel_overhead.py [--hidden-size 512
        --num-layers 4 --seq-length 512 --iters 8]

Needs one free CPU core per rank; run on an otherwise idle machine.
"""
import argparse
import os
import sys
import tempfile
from statistics import median

from launch import ROOT, launch_pretraining

LAYOUTS = {"TP 1 (1 rank)": (1, []),
           "TP 2 (2 ranks)": (2, ["--tensor-model-parallel-size", "2"]),
           "TP 2 + sequence parallel": (2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"])}

def run(opts, data_prefix: str, work: str, name: str) -> float:
    """Median ms per iteration (after ``--warmup`` iterations) of one launch."""
    ranks, layout = LAYOUTS[name]
    metrics = os.path.join(work, f"metrics_{len(os.listdir(work))}.jsonl")
    flags = [
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", "8", "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size), "--global-batch-size",
        str(opts.micro_batch_size * 2), "--train-iters", str(opts.iters), "--lr", "1e-4",
        "--lr-decay-style", "constant", "--hidden-dropout", "0", "--attention-dropout", "0",
        "--transformer-impl", "local", "--data-path", data_prefix, "--split", "98,1,1",
        "--eval-iters", "0", "--data-cache-path", os.path.join(work, "cache"), "--log-interval", "1",
        "--zero-stage", "0", *layout]
    records = launch_pretraining(flags, ranks, metrics, name)
    return median(r["ms_per_iteration"] for r in records[opts.warmup:])

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--seq-length", type=int, default=512)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="Interleaved rounds (best kept).")
    opts = parser.parse_args()
    sys.path.insert(0, ROOT)
    from tools.make_demo_data import make_demo_data

    with tempfile.TemporaryDirectory() as work:
        data = make_demo_data(os.path.join(work, "demo"), size_mb=1.0, verbose=False)
        runs = os.path.join(work, "runs")
        os.makedirs(runs)
        print(f"model: {opts.num_layers} layers x {opts.hidden_size} hidden, seq {opts.seq_length}, "
              f"micro batch {opts.micro_batch_size} x 2 accumulation, 1 thread per rank")
        times = {}
        for _ in range(opts.repeats):  # layouts interleaved; the fastest round of each is kept
            for name in LAYOUTS:
                ms = run(opts, data["web"], runs, name)
                times[name] = min(ms, times.get(name, ms))
    base = times["TP 1 (1 rank)"]
    for name, ms in times.items():
        line = f"{name:26s}: {ms:8.1f} ms/iteration, speed-up over TP 1 {base / ms:5.2f}x"
        if name != "TP 1 (1 rank)":
            line += f" (ideal 2.00x), overhead {(ms - base / 2) / ms:5.1%} of the iteration"
        print(line)

if __name__ == "__main__":
    main()
