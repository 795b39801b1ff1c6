"""Compact attention structure vs dense masks, on CPU: T0 sample fetch and attention fwd+bwd.

    python benchmarks/attention_masks.py [--seq-length 2048] [--samples 200] [--documents 10]

1. ``MTFDataset.__getitem__`` time per sample (P3-like pairs packed into --seq-length samples,
   --prefix-lm) against the dense-mask version this repository used before: the same sample plus
   the ``[1, s, s]`` mask its loader built (:func:`dense_mask_baseline`, a copy of the old
   ``build_attention_mask``). Goal: >= 10x faster.
2. Peak memory and time of one attention forward+backward at --seq-length with --documents packed
   documents (T0 layout: each a prefix then a target; ALiBi off and on): the compact path (what the
   model runs: the SDPA backend, per segment, from ``segment_ids`` / ``is_prefix``) against the dense
   path (SDPA over the whole sequence with the loader's ``[b, 1, s, s]`` mask). Peak memory is the
   growth of the process's peak RSS over the set-up, each variant in its own subprocess.
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def dense_mask_baseline(segment_ids: np.ndarray, is_input: np.ndarray, prefix_lm: bool) -> np.ndarray:
    """The data loader's dense mask before the compact contract (copy of the removed
    ``megatron.data.mtf_dataset.build_attention_mask``): [s, s] bool, True = masked."""
    seg = np.asarray(segment_ids)
    same = (seg[:, None] == seg[None, :]) & (seg[:, None] > 0)
    n = seg.shape[0]
    allowed = same & np.tri(n, dtype=bool)
    if prefix_lm:
        inp = np.asarray(is_input, dtype=bool)
        allowed |= same & inp[:, None] & inp[None, :]
    return ~allowed


def _write_pairs(directory: str, n: int, seq_length: int) -> str:
    from benchmarks.mtf_packing import _write, p3_like_lengths

    inputs, targets = p3_like_lengths(n, 0, 150.0, 0.9, 4.0, 64)
    inputs = np.minimum(inputs, seq_length - 64)
    prefix = os.path.join(directory, "p3")
    _write(prefix + "_inputs_document", inputs)
    _write(prefix + "_targets_document", targets)
    return prefix


def bench_getitem(seq_length: int, samples: int) -> dict:
    """Seconds per ``__getitem__``, compact vs compact + the old dense mask (best of 3 passes)."""
    from megatron.data.mtf_dataset import MTFDataset

    with tempfile.TemporaryDirectory() as tmp:
        prefix = _write_pairs(tmp, 20 * samples, seq_length)
        ds = MTFDataset("p3", prefix, seq_length, num_samples=samples, seed=0, prefix_lm=True)
        n = min(samples, len(ds))
        for i in range(n):  # warm the page cache
            ds[i]

        def compact():
            for i in range(n):
                ds[i]

        def dense():
            for i in range(n):
                sample = ds[i]
                torch.from_numpy(dense_mask_baseline(sample["segment_ids"].numpy(),
                                                     sample["is_prefix"].numpy(), True)[None])

        times = {}
        for name, fn in (("dense", dense), ("compact", compact)):
            best = float("inf")
            for _ in range(3):
                start = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - start)
            times[name] = best / n
        segments = float(np.mean([int(ds[i]["segment_ids"].max()) for i in range(n)]))
    return {"seq_length": seq_length, "samples": n, "segments_per_sample": segments,
            "dense_s": times["dense"], "compact_s": times["compact"],
            "speedup": times["dense"] / times["compact"]}


def _packed_batch(seq_length: int, documents: int, seed: int = 0):
    """One sample of ``documents`` equal-ish T0 segments (prefix 80% of each) filling the sequence."""
    rng = np.random.default_rng(seed)
    cuts = np.sort(rng.choice(np.arange(1, seq_length), documents - 1, replace=False))
    bounds = [0, *cuts.tolist(), seq_length]
    seg = np.zeros(seq_length, np.int32)
    pre = np.zeros(seq_length, bool)
    for k in range(documents):
        lo, hi = bounds[k], bounds[k + 1]
        seg[lo:hi] = k + 1
        pre[lo:lo + int(0.8 * (hi - lo))] = True
    return torch.from_numpy(seg)[None], torch.from_numpy(pre)[None]


def _attention_variant(variant: str, seq_length: int, documents: int, heads: int, head_dim: int,
                       alibi: bool, repeats: int) -> dict:
    """Run in a subprocess: set up, then time fwd+bwd; report peak RSS growth over the set-up."""
    from megatron.model.alibi import alibi_slopes
    from megatron.model.masks import attention_structure
    from megatron.model.sdpa_attention import sdpa_segmentwise

    torch.manual_seed(0)
    seg, pre = _packed_batch(seq_length, documents)
    slopes = alibi_slopes(heads) if alibi else None
    scale = head_dim ** -0.5
    shape = (1, heads, seq_length, head_dim)
    q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
    if variant == "dense":  # the loader's mask, shipped with the batch
        masked = torch.from_numpy(dense_mask_baseline(seg[0].numpy(), pre[0].numpy(), True))[None, None]
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        if variant == "dense":
            allowed = ~masked
            if slopes is not None:
                i = torch.arange(seq_length, dtype=torch.float32)
                attn_mask = (slopes[:, None, None] * (i[None, :] - i[:, None]))[None]
                attn_mask = attn_mask.masked_fill(~allowed, float("-inf"))
            else:
                attn_mask = allowed
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, scale=scale)
        else:
            out = sdpa_segmentwise(q, k, v, attention_structure(seg, pre), scale, slopes=slopes)
        out.sum().backward()
        times.append(time.perf_counter() - start)
        q.grad = k.grad = v.grad = None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"variant": variant, "alibi": alibi, "time_s": min(times), "peak_mib": (peak - base) / 1024.0}


def bench_attention(seq_length: int, documents: int, heads: int, head_dim: int, repeats: int) -> list:
    """Compact vs dense attention fwd+bwd, each variant in a fresh interpreter."""
    rows = []
    for alibi in (False, True):
        for variant in ("dense", "compact"):
            cmd = [sys.executable, __file__, "--_variant", variant, "--seq-length", str(seq_length),
                   "--documents", str(documents), "--heads", str(heads), "--head-dim", str(head_dim),
                   "--repeats", str(repeats), "--threads", str(torch.get_num_threads())] + (
                       ["--alibi"] if alibi else [])
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--samples", type=int, default=200, help="T0 samples fetched per pass")
    parser.add_argument("--documents", type=int, default=10, help="packed documents per sample")
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: stable figures on a shared machine)")
    parser.add_argument("--alibi", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_variant", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args._variant:
        print(json.dumps(_attention_variant(args._variant, args.seq_length, args.documents, args.heads,
                                            args.head_dim, args.alibi, args.repeats)))
        return None
    fetch = bench_getitem(args.seq_length, args.samples)
    print(f"T0 __getitem__ at seq {fetch['seq_length']} (--prefix-lm, {fetch['segments_per_sample']:.1f} "
          f"segments/sample, best of 3 passes over {fetch['samples']} samples):")
    print(f"  dense [1,s,s] mask (before) : {1e3 * fetch['dense_s']:8.3f} ms/sample")
    print(f"  compact segment_ids/is_prefix: {1e3 * fetch['compact_s']:8.3f} ms/sample")
    print(f"  speedup                      : {fetch['speedup']:8.1f}x   [goal: >= 10x]")
    rows = bench_attention(args.seq_length, args.documents, args.heads, args.head_dim, args.repeats)
    print(f"attention fwd+bwd at seq {args.seq_length}, {args.documents} packed T0 documents "
          f"(prefix 80%), {args.heads} heads x {args.head_dim}, fp32 CPU, {args.threads} thread(s), "
          f"best of {args.repeats}:")
    for alibi in (False, True):
        d, c = [r for r in rows if r["alibi"] == alibi]
        tag = "ALiBi" if alibi else "no ALiBi"
        print(f"  {tag:8s} dense mask                : {1e3 * d['time_s']:8.1f} ms, peak +{d['peak_mib']:7.1f} MiB")
        print(f"  {tag:8s} compact (SDPA per segment): {1e3 * c['time_s']:8.1f} ms, peak +{c['peak_mib']:7.1f} MiB"
              f"  -> {d['time_s'] / c['time_s']:.1f}x faster, {d['peak_mib'] / max(c['peak_mib'], 0.1):.1f}x less memory")
    result = {"getitem": fetch, "attention": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
