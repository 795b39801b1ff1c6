"""Packing efficiency and build time of T0 (MTF) sample packing on a P3-like length distribution.

    python benchmarks/mtf_packing.py [--pairs 200000] [--seq-length 2048] [--seed 0] [--json F]

Lengths: inputs lognormal (median ~ --input-median tokens, long tail, sigma --input-sigma), targets
lognormal with median ~ --target-median tokens capped at --target-max (P3 prompts are long-tailed,
answers short). Efficiency = non-pad tokens / all tokens. Baseline: one pair per sample (no
packing), the layout of an unpacked T0 dataset. The packed figure is the best-fit-decreasing
packing of ``megatron.data.mtf_dataset.pack_lengths``; the full per-epoch index build
(``MTFDataset.pack_epoch``: shuffle, pack, shuffle packs) is timed on real indexed files.
"""
import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir)))

import numpy as np  # noqa: E402

from megatron.data.mtf_dataset import pack_lengths, truncated_lengths  # noqa: E402


def p3_like_lengths(n: int, seed: int, input_median: float, input_sigma: float,
                    target_median: float, target_max: int):
    rng = np.random.default_rng(seed)
    inputs = np.clip(rng.lognormal(np.log(input_median), input_sigma, n), 1, None).astype(np.int64)
    targets = np.clip(rng.lognormal(np.log(target_median), 0.9, n), 1, target_max).astype(np.int64)
    return inputs, targets


def _write(prefix: str, lengths: np.ndarray) -> None:
    from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(50000))
    chunk = np.ones(int(lengths.max()), dtype=np.uint16)
    for n in lengths.tolist():
        builder.add_document(chunk[:n], [n])
    builder.finalize(prefix + ".idx")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pairs", type=int, default=200000)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--input-median", type=float, default=150.0)
    parser.add_argument("--input-sigma", type=float, default=0.9)
    parser.add_argument("--target-median", type=float, default=4.0)
    parser.add_argument("--target-max", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-dataset", action="store_true",
                        help="Time pack_lengths only (no indexed files, no MTFDataset epoch build).")
    parser.add_argument("--json", default=None, help="Also write the figures here.")
    args = parser.parse_args(argv)

    S = args.seq_length
    inputs, targets = p3_like_lengths(args.pairs, args.seed, args.input_median, args.input_sigma,
                                      args.target_median, args.target_max)
    keep_in, keep_tg = truncated_lengths(inputs, targets, S)
    lengths = keep_in + keep_tg
    tokens = int(lengths.sum())
    truncated = int((lengths < inputs + targets).sum())

    baseline = tokens / (len(lengths) * S)
    start = time.perf_counter()
    items, offsets = pack_lengths(lengths, S)
    pack_s = time.perf_counter() - start
    packs = len(offsets) - 1
    packed = tokens / (packs * S)
    lower_bound = -(-tokens // S)

    result = {
        "pairs": args.pairs, "seq_length": S, "mean_input": float(inputs.mean()),
        "mean_target": float(targets.mean()), "truncated_pairs": truncated,
        "baseline_one_pair_per_sample": {"samples": len(lengths), "efficiency": baseline},
        "packed_best_fit_decreasing": {"samples": packs, "efficiency": packed,
                                       "pack_seconds": pack_s,
                                       "pairs_per_second": args.pairs / max(pack_s, 1e-9)},
        "samples_lower_bound": lower_bound,
        "efficiency_ratio_vs_baseline": packed / baseline,
    }
    if not args.skip_dataset:
        from megatron.data.mtf_dataset import MTFDataset

        with tempfile.TemporaryDirectory() as tmp:
            prefix = os.path.join(tmp, "p3like")
            _write(prefix + "_inputs_document", inputs)
            _write(prefix + "_targets_document", targets)
            start = time.perf_counter()
            import warnings
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ds = MTFDataset("bench", prefix, S, num_samples=1, seed=args.seed,
                                cache_dir=os.path.join(tmp, "cache"))
            build_s = time.perf_counter() - start
            start = time.perf_counter()
            n_read = min(len(ds), 200)
            for i in range(n_read):
                ds[i]
            get_ms = 1000 * (time.perf_counter() - start) / n_read
            result["dataset_epoch_build"] = {"seconds": build_s, "samples": len(ds),
                                             "efficiency": ds.efficiency(),
                                             "getitem_ms": get_ms}

    print(f"P3-like pairs: {args.pairs}, seq-length {S}, mean input {inputs.mean():.1f} tokens, "
          f"mean target {targets.mean():.1f} tokens, truncated {truncated}")
    print(f"  one pair per sample : {len(lengths):8d} samples, efficiency {100 * baseline:6.2f}%")
    print(f"  packed (BFD)        : {packs:8d} samples, efficiency {100 * packed:6.2f}% "
          f"(lower bound {lower_bound} samples), packed in {pack_s:.2f} s "
          f"({args.pairs / max(pack_s, 1e-9):,.0f} pairs/s)")
    print(f"  ratio packed / baseline efficiency: {packed / baseline:.2f}x")
    if "dataset_epoch_build" in result:
        d = result["dataset_epoch_build"]
        print(f"  MTFDataset epoch index build: {d['seconds']:.2f} s for {d['samples']} samples "
              f"(efficiency {100 * d['efficiency']:.2f}%), __getitem__ {d['getitem_ms']:.1f} "
              f"ms/sample (compact segment_ids / is_prefix, no dense mask)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
