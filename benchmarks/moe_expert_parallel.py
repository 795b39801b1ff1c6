"""Expert parallelism on CPU ranks: time per iteration of EP 2 (each of 2 ranks holds half of every
MoE layer's experts) against EP 1 on 1 rank and against DP 2 x EP 1 (2 ranks, every expert on both)
for the same Llama-style MoE model and global batch, through the deepspeed launcher (gloo), one
thread per rank.

With free communication EP 2 takes half of EP 1's time, as DP 2 does: both split the batch over 2
ranks. EP 2 adds the token dispatch of every MoE layer (megatron-core's allgather dispatcher: each
rank gathers both ranks' tokens, runs its experts on those routed to them, and reduce-scatters
the outputs) and reduces the experts' gradients over their expert-data-parallel group (1 rank)
instead of all-reducing them; in exchange each rank holds half of the expert weights and Adam
states. Printed per layout: median ms/iteration (warm-up dropped, from the loop's own metrics;
best of --repeats interleaved rounds), speed-up over EP 1, overhead = (t - t_EP1 / 2) / t, the
first iteration's LM loss and load-balancing loss and the tokens one expert received in it (fewest
and most, over the experts of every layer; from the loop's ``--metrics-jsonl``): all equal across
layouts, the same model on the same global batch; and the expert parameters per rank.

    DS_ACCELERATOR=cpu python benchmarks/moe_expert_parallel.py [--hidden-size 256 --num-layers 4
        --num-experts 8 --seq-length 256 --iters 8]

Needs one free CPU core per rank; run on an otherwise idle machine.
"""
import argparse
import os
import sys
import tempfile
from statistics import median

from launch import ROOT, launch_pretraining

FIRST = ("lm_loss", "load_balancing_loss", "tokens_per_expert_min", "tokens_per_expert_max")

LAYOUTS = {"EP 1 (1 rank)": (1, []),
           "DP 2 x EP 1 (2 ranks)": (2, []),
           "EP 2 (2 ranks)": (2, ["--expert-model-parallel-size", "2"])}


def model_flags(opts):
    """A Llama-style MoE (Mixtral's layers): RMSNorm, RoPE, SwiGLU experts, top-k router."""
    return ["--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
            "--num-attention-heads", "8", "--seq-length", str(opts.seq_length),
            "--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
            "--disable-bias-linear", "--untie-embeddings-and-output-weights",
            "--num-experts", str(opts.num_experts), "--moe-router-topk", str(opts.topk),
            "--moe-ffn-hidden-size", str(opts.expert_ffn), "--moe-aux-loss-coeff", "0.01",
            "--transformer-impl", "local"]


def run(opts, data_prefix: str, work: str, name: str):
    """(median ms per iteration after ``--warmup`` iterations, the first record) of one launch."""
    ranks, layout = LAYOUTS[name]
    metrics = os.path.join(work, f"metrics_{len(os.listdir(work))}.jsonl")
    global_batch = opts.micro_batch_size * 2
    flags = model_flags(opts) + [
        "--micro-batch-size", str(opts.micro_batch_size), "--global-batch-size", str(global_batch),
        "--train-iters", str(opts.iters), "--lr", "1e-4", "--lr-decay-style", "constant",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "5",
        "--data-path", data_prefix, "--split", "98,1,1", "--eval-iters", "0",
        "--data-cache-path", os.path.join(work, "cache"), "--log-interval", "1", *layout]
    records = launch_pretraining(flags, ranks, metrics, name)
    return median(r["ms_per_iteration"] for r in records[opts.warmup:]), records[0]


def expert_parameters_per_rank(opts, ep: int) -> int:
    """Expert weights one rank holds (SwiGLU: fc1 2 x ffn x hidden, fc2 hidden x ffn)."""
    per_expert = 3 * opts.expert_ffn * opts.hidden_size
    return opts.num_layers * opts.num_experts // ep * per_expert


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-experts", type=int, default=8)
    parser.add_argument("--topk", type=int, default=2)
    parser.add_argument("--expert-ffn", type=int, default=512)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=2)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="Interleaved rounds (best kept).")
    opts = parser.parse_args()
    sys.path.insert(0, ROOT)
    from megatron.runtime.cpu_comm import remove_stale_shm_buffers
    from tools.make_demo_data import make_demo_data

    with tempfile.TemporaryDirectory() as work:
        data = make_demo_data(os.path.join(work, "demo"), size_mb=1.0, verbose=False)
        runs = os.path.join(work, "runs")
        os.makedirs(runs)
        print(f"model: {opts.num_layers} MoE layers x {opts.hidden_size} hidden, {opts.num_experts} "
              f"experts (FFN {opts.expert_ffn}) top-{opts.topk}, seq {opts.seq_length}, global batch "
              f"{opts.micro_batch_size * 2} (micro batch {opts.micro_batch_size}), dropless, "
              "1 thread per rank")
        times, first = {}, {}
        try:
            for _ in range(opts.repeats):  # layouts interleaved; the fastest round of each is kept
                for name in LAYOUTS:
                    ms, record = run(opts, data["web"], runs, name)
                    times[name] = min(ms, times.get(name, ms))
                    first[name] = record
        finally:  # the ranks unlink their /dev/shm all-reduce buffers; one killed early may not
            remove_stale_shm_buffers()
    base = times["EP 1 (1 rank)"]
    for name, ms in times.items():
        ep = 2 if name.startswith("EP 2") else 1
        line = (f"{name:22s}: {ms:8.1f} ms/iteration, speed-up over EP 1 {base / ms:5.2f}x")
        if name != "EP 1 (1 rank)":
            line += f" (ideal 2.00x), overhead {(ms - base / 2) / ms:5.1%}"
        line += f" | expert parameters per rank {expert_parameters_per_rank(opts, ep) / 1e6:.2f}M"
        print(line)
    for name, record in first.items():
        got = {key: record.get(key) for key in FIRST}
        tokens = ("n/a" if got["tokens_per_expert_min"] is None else
                  f"{got['tokens_per_expert_min']:.0f}-{got['tokens_per_expert_max']:.0f}")
        balance = "n/a" if got["load_balancing_loss"] is None else f"{got['load_balancing_loss']:.6f}"
        print(f"{name:22s}: iteration 1 lm loss {got['lm_loss']:.6f}, load-balancing loss "
              f"{balance}, tokens per expert {tokens}")
    reference = first["EP 1 (1 rank)"]["lm_loss"]
    worst = max(abs(r["lm_loss"] - reference) / abs(reference) for r in first.values())
    print(f"first lm loss: largest relative difference from EP 1 {worst:.1e}")
    ep2, dp2 = times["EP 2 (2 ranks)"], times["DP 2 x EP 1 (2 ranks)"]
    print(f"EP 2 / EP 1 time ratio: {ep2 / base:.2f}; EP 2 / DP 2 time ratio: {ep2 / dp2:.2f} "
          f"(the same 2 ranks, half the expert weights per rank)")


if __name__ == "__main__":
    main()
