"""Best-fit document packing (``--pack-documents best-fit``) against megatron-core's windows
(``concat``: documents concatenated and cut into ``seq_length`` windows), at several sequence
lengths over one synthetic long-tailed corpus.

    python benchmarks/packing.py [--documents 200000] [--seq-lengths 512 2048 8192 32768]
                                 [--median 512 --sigma 1.4] [--fetch-tokens 16777216] [--json F]

The corpus: ``--documents`` documents of lognormal lengths (median ``--median`` tokens, sigma
``--sigma``: half the documents shorter than the median, 2 % longer than 16x it), a real ``.idx``
and a sparse ``.bin`` (no disk; reads give zeros). Per sequence length, for each mode, the
production path (megatron/data/curriculum/constituents.py ``resolve_constituents`` and
megatron/data/curriculum/dataset.py ``gpt_epoch_source`` into a fresh index pack) builds one
epoch; reported:

- samples per epoch (windows or bins);
- padding fraction: pad tokens / all tokens of the epoch's samples (windows pad none);
- dropped-token fraction: document tokens in no sample (windows: the epoch's last partial
  window; bins: none);
- truncated-document fraction: documents split across samples (windows: a window boundary falls
  inside the document; bins: the documents longer than ``seq_length + 1``, cut into chunks);
- build: documents per second of the epoch's indices (resolve + build + the pack written);
- fetch: samples and tokens per second of ``__getitem__`` at random positions (about
  ``--fetch-tokens`` tokens read).

and best-fit's figures as ratios of concat's, in the same run.
"""
import argparse
import json
import math
import os
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402
from data_scale import sparse_corpus_of_lengths  # noqa: E402

from megatron.data import document_packing  # noqa: E402


def long_tailed_lengths(n: int, median: float, sigma: float, seed: int) -> np.ndarray:
    """``n`` lognormal document lengths (tokens, 1 to 2**20)."""
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(math.log(median), sigma, n), 1, 2 ** 20).astype(np.int64)


def _gpt_config(seq_length: int, cache: str, mode: str):
    from megatron.data.best_fit_dataset import PackingGPTDatasetConfig
    from megatron.tokenizer import ByteLevelTokenizer

    return PackingGPTDatasetConfig(
        random_seed=1234, sequence_length=seq_length, tokenizer=ByteLevelTokenizer(),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        path_to_cache=cache, blend=None, blend_per_split=None, split="1,0,0",
        create_attention_mask=False, pack_documents=mode)


def build_epoch(prefix: str, seq_length: int, mode: str, work: str):
    """(seconds, the constituent, its one-epoch source) of ``mode`` at ``seq_length``: resolve
    (best-fit: the bin count) and build into a fresh index pack, as a training run's first start."""
    from megatron.data.blend_config import parse_blend_config
    from megatron.data.curriculum.constituents import resolve_constituents
    from megatron.data.curriculum.dataset import gpt_epoch_source
    from megatron.data.index_pack import IndexPack

    cache = tempfile.mkdtemp(dir=work, prefix=f"cache-{mode}-{seq_length}-")
    blend = parse_blend_config({"train": {"blend": [{"path": prefix, "weight": 1}]}}, "b.yaml",
                               check_files=False).train
    config = _gpt_config(seq_length, cache, mode)
    document_packing._BIN_COUNTS.clear()  # count the bins inside the timing
    pack = IndexPack()
    start = time.perf_counter()
    (c,) = resolve_constituents(blend, seq_length, packing=mode)
    with pack.writing():
        source = gpt_epoch_source(c, int(c.samples_per_epoch), config, "train", pack)
    return time.perf_counter() - start, c, source


def window_figures(source, lengths: np.ndarray, seq_length: int):
    """(truncated documents, dropped tokens) of megatron-core's windows: the documents in the
    epoch's order, window ``i`` reading tokens ``[i * L, (i + 1) * L]`` of their concatenation."""
    dataset = source.epoch_dataset
    order = np.asarray(dataset.document_index, dtype=np.int64)
    ends = np.cumsum(lengths[order])
    starts = ends - lengths[order]
    windows = len(dataset)
    covered = windows * seq_length + 1  # tokens in some window (the last one's label included)
    # a boundary m * L (0 < m <= windows) strictly inside a document splits it
    first_boundary = (starts // seq_length + 1) * seq_length
    truncated = int(np.count_nonzero((first_boundary < ends) & (starts < covered)))
    dropped = int(ends[-1] - covered)
    return truncated, max(dropped, 0)


def fetch_rate(source, seq_length: int, fetch_tokens: int, seed: int):
    """(samples/s, tokens/s) of ``source[k]`` at random positions of its first epoch, read once
    before (the pages of the file cached, as in a run's steady state)."""
    n = max(64, fetch_tokens // seq_length)
    positions = np.random.default_rng(seed).integers(0, source.samples_per_epoch, n)
    for k in positions.tolist():
        source[k]
    start = time.perf_counter()
    for k in positions.tolist():
        source[k]
    elapsed = time.perf_counter() - start
    return n / elapsed, n * seq_length / elapsed


def measure(prefix: str, lengths: np.ndarray, seq_length: int, work: str, fetch_tokens: int) -> dict:
    out = {}
    tokens = int(lengths.sum())
    for mode in (document_packing.CONCAT, document_packing.BEST_FIT):
        seconds, c, source = build_epoch(prefix, seq_length, mode, work)
        samples = int(c.samples_per_epoch)
        capacity = document_packing.bin_capacity(seq_length)
        if mode == document_packing.CONCAT:
            (truncated, dropped), pad = window_figures(source, lengths, seq_length), 0
        else:
            truncated, dropped = int(np.count_nonzero(lengths > capacity)), 0
            pad = samples * capacity - tokens
        per_s, tokens_per_s = fetch_rate(source, seq_length, fetch_tokens, seq_length)
        out[mode] = {"samples_per_epoch": samples, "padding_fraction": pad / (samples * capacity),
                     "dropped_token_fraction": dropped / tokens,
                     "truncated_document_fraction": truncated / len(lengths),
                     "build_seconds": seconds, "build_documents_per_second": len(lengths) / seconds,
                     "fetch_samples_per_second": per_s, "fetch_tokens_per_second": tokens_per_s}
    cat, bf = out[document_packing.CONCAT], out[document_packing.BEST_FIT]
    out["best_fit_over_concat"] = {
        key: (bf[key] / cat[key] if cat[key] else None)
        for key in ("samples_per_epoch", "truncated_document_fraction",
                    "build_documents_per_second", "fetch_samples_per_second")}
    return out


def _row(seq_length: int, r: dict) -> str:
    cat, bf, ratio = r["concat"], r["best-fit"], r["best_fit_over_concat"]
    pct = (lambda x: f"{100 * x:.3f}%")
    return (f"| {seq_length:,} | {cat['samples_per_epoch']:,} / {bf['samples_per_epoch']:,} "
            f"({ratio['samples_per_epoch']:.3f}x) | {pct(cat['padding_fraction'])} / "
            f"{pct(bf['padding_fraction'])} | {pct(cat['dropped_token_fraction'])} / "
            f"{pct(bf['dropped_token_fraction'])} | {pct(cat['truncated_document_fraction'])} / "
            f"{pct(bf['truncated_document_fraction'])} ({ratio['truncated_document_fraction']:.3f}x) | "
            f"{cat['build_documents_per_second'] / 1e6:.2f}M / {bf['build_documents_per_second'] / 1e6:.2f}M "
            f"({ratio['build_documents_per_second']:.2f}x) | {cat['fetch_samples_per_second']:,.0f} / "
            f"{bf['fetch_samples_per_second']:,.0f} ({ratio['fetch_samples_per_second']:.2f}x) |")


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--documents", type=int, default=200000)
    parser.add_argument("--median", type=float, default=512.0, help="Median document length (tokens).")
    parser.add_argument("--sigma", type=float, default=1.4, help="Lognormal sigma of the lengths.")
    parser.add_argument("--seq-lengths", type=int, nargs="+", default=[512, 2048, 8192, 32768])
    parser.add_argument("--fetch-tokens", type=int, default=1 << 24,
                        help="Tokens read by the fetch timing, per mode and length.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="Also write the figures here.")
    args = parser.parse_args(argv)

    from megatron.data.mtf_dataset import pack_lengths

    pack_lengths(np.ones(4096, dtype=np.int64), 8)  # the packing kernel built (or loaded) first
    lengths = long_tailed_lengths(args.documents, args.median, args.sigma, args.seed)
    result = {"documents": args.documents, "tokens": int(lengths.sum()),
              "mean_length": float(lengths.mean()), "median": args.median, "sigma": args.sigma,
              "max_length": int(lengths.max()), "seq_lengths": {}}
    print(f"corpus: {args.documents:,} documents, {lengths.sum() / 1e6:.1f}M tokens, lognormal "
          f"median {args.median:g} sigma {args.sigma:g} (mean {lengths.mean():.0f}, max "
          f"{lengths.max():,})")
    print("\n| seq length | samples per epoch: concat / best-fit | padding | dropped tokens | "
          "truncated documents | build (documents/s) | fetch (samples/s) |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as work:
        prefix = os.path.join(work, "corpus_text_document")
        sparse_corpus_of_lengths(prefix, lengths)
        for seq_length in args.seq_lengths:
            r = measure(prefix, lengths, seq_length, work, args.fetch_tokens)
            result["seq_lengths"][str(seq_length)] = r
            print(_row(seq_length, r), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
