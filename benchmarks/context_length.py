"""Context extension's cost: time and peak memory per token of a training step at 1x, 2x and 4x a
base sequence length with the tokens per step held (the global batch shrinks as the length grows,
as an extension stage with ``--extend-context`` keeps it), each at Ulysses SP 1 (1 rank) and SP 2
(``--ds-sequence-parallel-size 2``, 2 ranks), ratios printed in the same run.

Each setting is one launch of this script through the real ``deepspeed`` launcher (gloo, CPU ranks,
a free port per launch: benchmarks/launch.py ``launch_workers``). Each rank builds the real model
path, as benchmarks/ulysses_memory.py does: ``megatron.config.parser`` parse/validate for its world
size with the stage's flags (1x: RoPE; kx: the extended model, ``--position-embedding-type yarn
--rotary-scaling-factor k --yarn-original-max-position-embeddings`` the base length),
``initialize_distributed``, ``build_gpt_model``; a step is one micro batch of all the step's
sequences (``--base-batch / k`` of ``k x --base-length`` tokens) through
``megatron.train.steps.gpt_forward_step``, backward, the gradients summed over the
sequence-parallel group (what DeepSpeed's reduction over the sequence-data-parallel group does) and
a plain ``torch.optim.AdamW`` step. Printed per setting (the largest over the ranks):

* saved-for-backward bytes per token: the distinct storages (weights excluded) autograd keeps
  between the forward and the backward of the step, over the tokens the rank holds;
* peak RSS growth per token: the rank's peak resident set from the model and optimizer being built
  to the end of the iterations, over the tokens it holds;
* ms per step and us per token of the step (the median of ``--iters`` after one warm-up, the
  slowest rank's, best of ``--repeats`` rounds, the settings interleaved within a round);
* the loss of the first step (SP 2 must give SP 1's at each length).

and the ratios: each length against 1x at the same SP, and SP 2 against SP 1 at each length. One
torch thread per rank (``--threads``): SP 2 uses two cores where SP 1 uses one, so a free split
would halve SP 1's time and memory per rank.

    DS_ACCELERATOR=cpu python benchmarks/context_length.py [--base-length 1024 --base-batch 4
        --num-layers 2 --hidden-size 256 --heads 8 --iters 3 --repeats 1]

Needs one free CPU core per rank; run on an otherwise idle machine.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from launch import ROOT, launch_workers  # noqa: E402
from sp_step import add_worker_args  # noqa: E402

FACTORS = (1, 2, 4)
SPS = (1, 2)


def encoding_flags(factor: int, base_length: int):
    """The position encoding of a stage at ``factor`` x the base length: RoPE at 1x, YaRN with
    scaling factor ``factor`` of the base length past it."""
    if factor == 1:
        return ["--position-embedding-type", "rope"]
    return ["--position-embedding-type", "yarn", "--rotary-scaling-factor", str(factor),
            "--yarn-original-max-position-embeddings", str(base_length)]


def worker(opts) -> None:
    """One rank of a launch: writes ``OUT/rank{R}.json``."""
    sys.path.insert(0, ROOT)
    import torch
    from sp_step import SequenceParallelStep

    length = opts.factor * opts.base_length
    sequences = opts.base_batch // opts.factor
    rank_step = SequenceParallelStep([
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(length),
        "--max-position-embeddings", str(length), "--micro-batch-size", str(sequences),
        "--global-batch-size", str(sequences), "--train-iters", "1", "--lr", "1e-4",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--transformer-impl", "local",
        *encoding_flags(opts.factor, opts.base_length)], opts.vocab, opts.threads)
    g = torch.Generator().manual_seed(0)  # the same tokens at every length, SP and rank
    tokens = torch.randint(0, opts.vocab, (opts.base_batch * opts.base_length + 1,), generator=g)
    text = tokens[:sequences * length + 1]
    batch = {"tokens": text[:-1].view(sequences, length), "labels": text[1:].view(sequences, length),
             "loss_mask": torch.ones(sequences, length),
             "position_ids": torch.arange(length).expand(sequences, length).contiguous()}
    measured = rank_step.measure(batch, opts.iters)
    rank = torch.distributed.get_rank()
    record = {"rank": rank, "tokens_per_rank": sequences * length // rank_step.sp,
              "encoding": rank_step.args.position_embedding_type, **measured}
    with open(os.path.join(opts.out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    torch.distributed.barrier()


def launch(opts, factor: int, sp: int, work: str) -> dict:
    """One setting: its per-rank records merged (the largest over the ranks)."""
    argv = [a for a in sys.argv[1:]] + ["--factor", str(factor)]
    records = launch_workers(__file__, argv, sp, work, f"{factor}x SP {sp}", threads=opts.threads,
                             timeout=opts.timeout)
    merged = {key: max(rec[key] for rec in records) for key in ("saved_bytes", "rss_growth", "ms")}
    merged.update(first_loss=records[0]["first_loss"], encoding=records[0]["encoding"],
                  tokens_per_rank=records[0]["tokens_per_rank"])
    return merged


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-length", type=int, default=1024, help="the 1x sequence length")
    parser.add_argument("--base-batch", type=int, default=4,
                        help="sequences per step at 1x (tokens per step: this x --base-length)")
    add_worker_args(parser, timeout=900)
    parser.add_argument("--factor", type=int, default=1, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.worker:
        worker(opts)
        return
    if opts.base_batch % max(FACTORS) or opts.base_length % 2 or opts.heads % 2:
        raise SystemExit(f"--base-batch {opts.base_batch} must be divisible by {max(FACTORS)} (the "
                         f"step's sequences at {max(FACTORS)}x), --base-length and --heads even (SP 2)")
    sys.path.insert(0, ROOT)
    tokens = opts.base_batch * opts.base_length
    print(f"model: {opts.num_layers} layers x {opts.hidden_size} hidden, {opts.heads} heads, vocab "
          f"{opts.vocab}, fp32, local layers, SDPA causal, no dropout; {tokens} tokens per step "
          f"({opts.base_batch} x {opts.base_length} at 1x, one micro batch); RoPE at 1x, YaRN "
          f"(factor k of {opts.base_length}) at kx; {opts.threads} torch thread(s) per rank, gloo, "
          "torch AdamW after the gradients are summed over the SP group")
    results = {}
    started = time.time()
    with tempfile.TemporaryDirectory() as work:
        for _ in range(opts.repeats):  # settings interleaved; the fastest round of each is kept
            for factor in FACTORS:
                for sp in SPS:
                    r = launch(opts, factor, sp, work)
                    key = (factor, sp)
                    if key not in results or r["ms"] < results[key]["ms"]:
                        results[key] = r
    print(f"{'setting':>12s} {'length':>7s} {'batch':>5s} {'encoding':>8s} {'tokens/rank':>11s} "
          f"{'saved B/token':>13s} {'RSS B/token':>11s} {'ms/step':>8s} {'us/token':>8s} "
          f"{'first loss':>10s}")
    for (factor, sp), r in sorted(results.items()):
        per_rank = r["tokens_per_rank"]
        print(f"{f'{factor}x SP {sp}':>12s} {factor * opts.base_length:7d} "
              f"{opts.base_batch // factor:5d} {r['encoding']:>8s} {per_rank:11d} "
              f"{r['saved_bytes'] / per_rank:13,.0f} {r['rss_growth'] / per_rank:11,.0f} "
              f"{r['ms']:8.1f} {1000 * r['ms'] / tokens:8.1f} {r['first_loss']:10.6f}")
    print("\nagainst 1x at the same SP (tokens per step held: 1.00x is a free longer context)")
    for sp in SPS:
        one = results[(1, sp)]
        for factor in FACTORS[1:]:
            r = results[(factor, sp)]
            print(f"  SP {sp}, {factor}x / 1x: time {r['ms'] / one['ms']:.2f}x, saved for backward "
                  f"{r['saved_bytes'] / one['saved_bytes']:.2f}x, peak RSS growth "
                  f"{r['rss_growth'] / max(one['rss_growth'], 1):.2f}x")
    print("\nSP 2 against SP 1 at each length (a free split: 0.50x time and memory per rank)")
    for factor in FACTORS:
        one, two = results[(factor, 1)], results[(factor, 2)]
        print(f"  {factor}x: time {two['ms'] / one['ms']:.2f}x (speed-up {one['ms'] / two['ms']:.2f}x, "
              f"overhead {(two['ms'] - one['ms'] / 2) / two['ms']:.1%} of the SP 2 step), saved "
              f"for backward {two['saved_bytes'] / one['saved_bytes']:.2f}x, peak RSS growth "
              f"{two['rss_growth'] / max(one['rss_growth'], 1):.2f}x; loss difference "
              f"{abs(two['first_loss'] - one['first_loss']):.1e}")
    print(f"\n{len(FACTORS) * len(SPS) * opts.repeats} launches in {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
