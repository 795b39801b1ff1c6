"""DeepSpeed-Ulysses sequence parallelism: activation memory per rank and time per iteration of SP 2
(``--ds-sequence-parallel-size 2``, 2 CPU ranks) against SP 1 (1 rank) on the same model and batch.

Each setting is one launch of this script through the real ``deepspeed`` launcher (gloo, CPU
ranks, a free port per launch). Each rank builds the real model path: ``megatron.config.parser``
parse/validate for its world size, ``megatron.parallel.initialize.initialize_distributed`` (megatron-core's
groups, the context-parallel one being the Ulysses group), ``build_gpt_model``; every iteration
runs ``megatron.train.steps.gpt_forward_step`` (each SP rank keeps its half of the sequence, the
all-to-all around core attention gives it the whole sequence for half the heads), backward, sums
the gradients over the sequence-parallel group (one ``all_reduce`` per parameter, what DeepSpeed's
reduction over the sequence-data-parallel group does) and steps a plain ``torch.optim.AdamW`` (no
DeepSpeed engine: only the model's forward/backward and that reduction differ between settings).
Printed per setting, per rank (the largest over the ranks):

* saved-for-backward bytes: the distinct storages (weights excluded) autograd keeps between
  forward and backward for one micro batch (``torch.autograd.graph.saved_tensors_hooks``);
* peak RSS growth of the rank from the model and optimizer being built (after the distributed
  start-up) to the end of the iterations;
* ms per iteration (forward + backward + gradient all-reduce + optimizer step): the median of
  ``--iters`` after one warm-up, the slowest rank's, best of ``--repeats`` interleaved rounds;
* the loss of the first iteration (the whole sequence's: it must agree between settings).

and the ratios SP 2 / SP 1. Threads: one torch thread per rank in both settings (``--threads``),
so SP 2 uses both cores and SP 1 one; with free communication SP 2 would take half of SP 1's time
per iteration, and overhead = (t_SP2 - t_SP1 / 2) / t_SP2 is the share of an SP 2 iteration not
explained by the split work (the all-to-alls, the gradient all-reduce and the optimizer step on
replicated parameters, which SP does not split). Memory does not depend on the threads.

    DS_ACCELERATOR=cpu python benchmarks/ulysses_memory.py [--num-layers 2 --hidden-size 256
        --seq-length 4096 --iters 3]

Needs one free CPU core per rank; run on an otherwise idle machine.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import ROOT, launch_workers  # noqa: E402
from sp_step import add_worker_args  # noqa: E402

SETTINGS = {"SP 1 (1 rank)": 1, "SP 2 (2 ranks)": 2}



def worker(opts) -> None:
    """One rank of a launch: writes ``OUT/rank{R}.json``."""
    sys.path.insert(0, ROOT)
    import torch
    from sp_step import SequenceParallelStep

    rank_step = SequenceParallelStep([
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
        "--max-position-embeddings", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size), "--train-iters", "1", "--lr", "1e-4",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local"],
        opts.vocab, opts.threads)
    g = torch.Generator().manual_seed(0)  # the same whole batch on every rank and setting
    tokens = torch.randint(0, opts.vocab, (opts.micro_batch_size, opts.seq_length), generator=g)
    batch = {"tokens": tokens, "labels": torch.roll(tokens, -1, 1),
             "loss_mask": torch.ones(opts.micro_batch_size, opts.seq_length),
             "position_ids": torch.arange(opts.seq_length).expand_as(tokens).contiguous()}
    measured = rank_step.measure(batch, opts.iters)
    rank = torch.distributed.get_rank()
    record = {"rank": rank, "sequence_parallel_size": rank_step.sp,
              "tokens_per_rank": opts.seq_length // rank_step.sp, **measured}
    with open(os.path.join(opts.out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    torch.distributed.barrier()


def launch(opts, ranks: int, work: str) -> dict:
    """Launch one setting; the per-rank records merged (largest over the ranks)."""
    records = launch_workers(__file__, sys.argv[1:], ranks, work, f"SP {ranks}",
                             threads=opts.threads, timeout=opts.timeout)
    merged = {key: max(rec[key] for rec in records)
              for key in ("saved_bytes", "rss_growth", "ms", "reduce_ms", "optimizer_ms")}
    merged["saved_per_rank"] = [rec["saved_bytes"] for rec in records]
    merged["first_loss"] = records[0]["first_loss"]
    merged["tokens_per_rank"] = records[0]["tokens_per_rank"]
    return merged


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_worker_args(parser, timeout=600)
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--micro-batch-size", type=int, default=1)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts)
        return
    if opts.seq_length % 2 or opts.heads % 2:
        raise SystemExit(f"--seq-length {opts.seq_length} and --heads {opts.heads} must be even "
                         "(SP 2 splits the sequence and the heads in two)")
    sys.path.insert(0, ROOT)
    print(f"model: {opts.num_layers} layers x {opts.hidden_size} hidden, {opts.heads} heads, seq "
          f"{opts.seq_length}, micro batch {opts.micro_batch_size}, vocab {opts.vocab}, fp32, SDPA "
          f"causal, no dropout; {opts.threads} torch thread(s) per rank, gloo, torch AdamW after "
          "the gradients are summed over the SP group")
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for _ in range(opts.repeats):  # settings interleaved; the fastest round of each is kept
            for name, ranks in SETTINGS.items():
                r = launch(opts, ranks, work)
                if name not in results or r["ms"] < results[name]["ms"]:
                    results[name] = r
    one, two = results["SP 1 (1 rank)"], results["SP 2 (2 ranks)"]
    for name, r in results.items():
        per_rank = " + ".join(f"{b / 2**20:.1f}" for b in r["saved_per_rank"])
        print(f"{name:15s}: {r['tokens_per_rank']:5d} tokens/rank | saved for backward "
              f"{r['saved_bytes'] / 2**20:7.1f} MiB/rank ({per_rank}) | peak RSS growth "
              f"{r['rss_growth'] / 2**20:7.1f} MiB/rank | {r['ms']:7.1f} ms/iteration (gradient "
              f"all-reduce {r['reduce_ms']:.1f}, AdamW {r['optimizer_ms']:.1f}) | loss "
              f"{r['first_loss']:.6f}")
    print(f"ratio SP 2 / SP 1: saved for backward {two['saved_bytes'] / one['saved_bytes']:.2f}x "
          f"(ideal 0.50x), peak RSS growth {two['rss_growth'] / one['rss_growth']:.2f}x")
    print(f"ratio SP 2 / SP 1: time {two['ms'] / one['ms']:.2f}x (ideal 0.50x; speed-up "
          f"{one['ms'] / two['ms']:.2f}x), overhead {(two['ms'] - one['ms'] / 2) / two['ms']:.1%} "
          f"of the SP 2 iteration; loss difference {abs(two['first_loss'] - one['first_loss']):.1e}")

if __name__ == "__main__":
    main()
