"""Tokens/s/GPU and model FLOPs utilisation (MFU) of a ~1.3B GPT for several parallel layouts, on
a GPU machine, through the deepspeed launcher and the real training loop (bf16).

Layouts (each skipped when the machine has fewer GPUs than it needs; the rest of the GPUs are
data parallel): TP 1; TP 1 + full recompute; TP 2; TP 2 + sequence parallel; PP 2 (DeepSpeed's
pipe engine); TP 2 x PP 2. Per layout: median tokens/s over the iterations after warm-up (from the
loop's own ``--metrics-jsonl``), tokens/s/GPU, and MFU = model FLOPs per token x tokens/s/GPU /
peak FLOP/s. Model FLOPs per token follow Megatron-LM (Narayanan et al. 2021, no recompute
counted): 72 L h^2 (1 + s / (6 h) + V / (12 L h)), V the padded vocabulary.

    python benchmarks/gpu/layouts_throughput.py [--gpus N] [--peak-tflops 989] [--iters 20]
        [--layouts tp1 tp2 tp2-sp pp2] [--micro-batch-size 4]

The data is the embedded byte-level demo corpus (tools/make_demo_data.py), so the vocabulary is
small (258 padded to 384 x TP); the throughput of the transformer layers, which dominate, does
not depend on it.
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from statistics import median

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
LAYOUTS = {  # name: (tensor-parallel, pipeline-parallel, extra flags)
    "tp1": (1, 1, []),
    "tp1-recompute": (1, 1, ["--recompute-granularity", "full", "--recompute-method", "uniform",
                             "--recompute-num-layers", "1"]),
    "tp2": (2, 1, []),
    "tp2-sp": (2, 1, ["--sequence-parallel"]),
    "pp2": (1, 2, []),
    "tp2-pp2": (2, 2, []),
}
PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "L40S": 362.1, "A10": 125.0}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def padded_vocab(raw: int, divisible_by: int, tp: int) -> int:
    multiple = divisible_by * tp
    return -(-raw // multiple) * multiple


def flops_per_token(layers: int, hidden: int, seq: int, vocab: int) -> float:
    """Megatron-LM's model FLOPs of one trained token (forward + backward, no recompute)."""
    return 72.0 * layers * hidden ** 2 * (1 + seq / (6.0 * hidden) + vocab / (12.0 * layers * hidden))


def run_layout(opts, name: str, data_prefix: str, work: str):
    """(tokens/s, world size) of one layout, or None when it does not fit the GPUs."""
    tp, pp, extra = LAYOUTS[name]
    if opts.gpus % (tp * pp):
        return None
    dp = opts.gpus // (tp * pp)
    metrics = os.path.join(work, f"{name}.jsonl")
    flags = [
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size),
        "--global-batch-size", str(opts.micro_batch_size * dp * opts.accumulation),
        "--train-iters", str(opts.iters), "--lr", "1e-4", "--lr-decay-style", "constant",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--bf16", "--zero-stage", "1",
        "--data-path", data_prefix, "--split", "98,1,1", "--eval-iters", "0",
        "--data-cache-path", os.path.join(work, "cache"), "--log-interval", "1",
        "--metrics-jsonl", metrics, "--tensor-model-parallel-size", str(tp),
        "--pipeline-model-parallel-size", str(pp), *extra]
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    cmd = [launcher, "--num_gpus", str(opts.gpus), "--master_port", str(free_port()),
           os.path.join(ROOT, "pretrain_gpt.py")] + flags
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        print(f"{name}: failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        return None
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip() and "split" not in line]
    return median(r["tokens_per_second"] for r in records[opts.warmup:]), tp


def main():
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--num-layers", type=int, default=24)
    parser.add_argument("--hidden-size", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="Peak dense bf16 TFLOP/s of one GPU (default from its name).")
    opts = parser.parse_args()
    if opts.gpus < 1:
        raise SystemExit("no GPU: this benchmark runs on a GPU machine")
    name = torch.cuda.get_device_name(0)
    peak = opts.peak_tflops or next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    if peak is None:
        raise SystemExit(f"unknown peak FLOP/s for {name}; pass --peak-tflops")
    sys.path.insert(0, ROOT)
    from tools.make_demo_data import make_demo_data

    params = 12 * opts.num_layers * opts.hidden_size ** 2
    print(f"{opts.gpus} x {name} (peak {peak:g} TFLOP/s bf16); model {opts.num_layers} layers x "
          f"{opts.hidden_size} hidden (~{params / 1e9:.2f}B in the layers), seq {opts.seq_length}, "
          f"micro batch {opts.micro_batch_size} x {opts.accumulation} accumulation")
    with tempfile.TemporaryDirectory() as work:
        data = make_demo_data(os.path.join(work, "demo"), size_mb=20.0, verbose=False)
        for layout in opts.layouts:
            result = run_layout(opts, layout, data["web"], work)
            if result is None:
                print(f"{layout:14s}: skipped (needs a multiple of "
                      f"{LAYOUTS[layout][0] * LAYOUTS[layout][1]} GPUs, or failed)")
                continue
            tokens_per_s, tp = result
            per_gpu = tokens_per_s / opts.gpus
            fpt = flops_per_token(opts.num_layers, opts.hidden_size, opts.seq_length,
                                  padded_vocab(258, 128, tp))
            print(f"{layout:14s}: {tokens_per_s:10.0f} tokens/s, {per_gpu:9.0f} tokens/s/GPU, "
                  f"MFU {fpt * per_gpu / (peak * 1e12):6.1%}")


if __name__ == "__main__":
    main()
