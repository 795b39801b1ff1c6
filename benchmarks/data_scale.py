"""Production-scale mixes: the curriculum index and the data set-up at thousands of prefixes and a
billion samples, against megatron-core in the same run (run by hand; no timed asserts).

    .venv/bin/python benchmarks/data_scale.py            # D-scaling at N = 1e7, edit, lookups,
                                                          # set-up over sparse corpora, other paths
    .venv/bin/python benchmarks/data_scale.py --g1       # also G1: D = 1,024, N = 1e9, and the
                                                          # tools on it (~15 min)
    .venv/bin/python benchmarks/data_scale.py --parts d-scaling lookups   # only those
    .venv/bin/python benchmarks/data_scale.py --parts tools --g1 [--reuse-cache]

What it measures:
* **D-scaling**: the training index at N = 1e7 and D in {10, 100, 1,024, 4,096, 32,766} (skewed
  static weights), ours in the blocked order against megatron-core's ``build_blending_indices``
  (its C++ greedy loop, O(N x D)); megatron-core's time at D >= 4,096 is measured at a smaller N
  and scaled linearly in N (its loop is exactly linear in N), and says so.
* **G1** (``--g1``): D = 1,024 prefixes (1% hold half the mass, many below 1/2048), N = 1e9,
  8 sequential weight stages, one a linear ramp; the build in a child process (its peak RSS), the
  bytes per sample on disk, the warm load; megatron-core extrapolated from its N = 1e7 point.
* **Edit at 60%**: one weight changed and one prefix added, the continuation built from the ledger
  against the cold build, and the no-repeat/no-gap check on a sample of datasets.
* **Lookups**: p50/p99 of one index lookup (``CurriculumDataset.locate``) against megatron-core's
  two numpy reads, timed by batches of 64 lookups per timer reading and one per reading (the
  timer's own cost included, and printed); sample fetches against megatron-core's
  ``BlendedDataset`` over the same GPTDatasets (in the set-up part).
* **Set-up over sparse corpora**: D prefixes with real ``.idx`` files and sparse ``.bin`` files
  (truncated to size: terabytes of tokens cost no disk), ``build_curriculum_dataset`` cold and warm
  (constituents, index, each dataset's own indices) against megatron-core's
  ``BlendedMegatronDatasetBuilder`` over the same prefixes, with the cache files each leaves.
* **The other data paths** (``--parts other-paths``), each from parsed flags through the real
  builders (``build_pretraining_data``, ``build_mtf_data``), cold and warm to the first sample:
  ``--data-args-path`` with 1,024 ``W PREFIX`` pairs and ``--split 98,2,0`` (against megatron-core's
  ``BlendedMegatronDatasetBuilder`` on the same blend and split), ``--train-weighted-split-paths``
  with 1,024 items and two validation groups, and T0 packing over 1e7 examples in 1,000 prefixes
  (real ``.idx``, sparse ``.bin``), with its packing loop compiled against its Python twin.
* **Tools at G1** (``--parts tools --g1``): the G1 blend file over 1,024 sparse prefixes of 4e12
  tokens, set up through ``build_pretraining_data`` cold and warm, a checkpoint's data ledger at
  60% of the run; then ``tools/preview_schedule.py`` (with and without ``--load``) and
  ``tools/data_provenance.py`` (10 iterations across the checkpoint), each in a fresh process.
"""
import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

from megatron.data.blend_config import parse_blend_config  # noqa: E402
from megatron.data.curriculum.index import CurriculumIndex  # noqa: E402
from megatron.schedules.units import BatchSchedule  # noqa: E402

SEQ, GBS = 4096, 1024
PARTS = ("d-scaling", "edit", "lookups", "setup", "other-paths", "tools")


def skewed_weights(D: int, seed: int) -> np.ndarray:
    """Normalised weights where about 1% of the datasets hold half the mass (a Pareto tail)."""
    rng = np.random.default_rng(seed)
    w = np.sort(rng.pareto(0.7, D))[::-1] + 1e-4
    return w / w.sum()


def fake_constituents(blend, spe: int = 10 ** 7):
    from helpers.curriculum import fake_constituents as fake

    return fake(blend, spe, SEQ)


def static_blend(D: int, seed: int = 0):
    w = skewed_weights(D, seed)
    return parse_blend_config({"train": {"blend": [{"path": f"p{d:05d}", "weight": float(w[d])}
                                                   for d in range(D)]}},
                              "bench.yaml", check_files=False).train


def g1_blend_spec(names, N: int, extra: int = 0, change: float = 1.0) -> dict:
    """G1's blend file (as a dict) over the datasets ``names``: 8 sequential stages of skewed
    weights, stage 3 a linear ramp between two of them; ``extra`` prefixes added to the last
    stages and the first weight times ``change`` there (the edit)."""
    D = len(names)
    stages = []
    for k in range(8):
        w = skewed_weights(D, k)
        if k == 3:
            w2 = skewed_weights(D, 100)
            entries = [{"path": n, "weight": {"type": "linear", "unit": "samples",
                                              "points": {int(N * 3 / 8): float(a), int(N * 4 / 8): float(b)}}}
                       for n, a, b in zip(names, w, w2, strict=True)]
        else:
            entries = [{"path": n, "weight": float(x)} for n, x in zip(names, w, strict=True)]
            if k >= 5:
                entries[0]["weight"] *= change
                entries += [{"path": f"new{e:03d}", "weight": 1e-3} for e in range(extra)]
        stage = {"blend": entries}
        if k < 7:
            stage["until"] = {"samples": int(N * (k + 1) / 8)}
        stages.append(stage)
    return {"train": {"sequential": stages}}


def g1_blend(D: int, N: int, extra: int = 0, change: float = 1.0):
    """G1's parsed training blend over the fake datasets ``p00000``... (no files)."""
    return parse_blend_config(g1_blend_spec([f"p{d:05d}" for d in range(D)], N, extra, change),
                              "g1.yaml", check_files=False).train


def megatron_blend_seconds(weights: np.ndarray, N: int) -> float:
    """megatron-core's ``build_blending_indices`` (C++) for ``N`` samples: seconds."""
    from megatron.core.datasets import helpers

    ids = np.zeros(N, dtype=np.int16)
    samples = np.zeros(N, dtype=np.int64)
    t0 = time.perf_counter()
    helpers.build_blending_indices(ids, samples, weights.tolist(), len(weights), N, False)
    return time.perf_counter() - t0


def ours_seconds(blend, N: int, order: str = "blocked", cache_dir=None, **kwargs):
    cons = fake_constituents(blend)
    t0 = time.perf_counter()
    idx = CurriculumIndex(blend, cons, N, BatchSchedule(GBS, None, SEQ), cache_dir=cache_dir,
                          order=order, **kwargs)
    return time.perf_counter() - t0, idx


def d_scaling(N: int, sizes, rounds: int = 3):
    """ns per sample of the training index at ``N`` samples per D in ``sizes``: ours (the
    blocked order, best of ``rounds``, the sizes interleaved, without a cache so without its key)
    and its cache key apart (what a cached build adds: ms, and ns per sample of N), against
    megatron-core's ``build_blending_indices`` (best of ``rounds`` at D <= 100, else once)."""
    print(f"\n## D-scaling: the training index at N = {N:.0e}, skewed static weights")
    ours_seconds(static_blend(10), 10 ** 5)  # the kernels loaded before timing
    blends = {D: static_blend(D) for D in sizes}
    ours, key = {D: float("inf") for D in sizes}, {D: float("inf") for D in sizes}
    for _ in range(rounds):
        for D in sizes:
            t, idx = ours_seconds(blends[D], N)
            ours[D] = min(ours[D], t)
            t0 = time.perf_counter()
            idx.cache_key()
            key[D] = min(key[D], time.perf_counter() - t0)
            del idx
    print("| D | ours (blocked) ns/sample | its cache key, ms (ns/sample) | megatron-core ns/sample "
          "| megatron-core / ours |")
    print("|---|---|---|---|---|")
    ours_ns = {}
    for D in sizes:
        w = skewed_weights(D, 0)
        n_peer = N if D <= 1024 else max(N * 1024 // D, 10 ** 5)
        # best of the rounds where it is cheap (D <= 100: under a second each), else once
        t_peer = min(megatron_blend_seconds(w, n_peer) for _ in range(rounds if D <= 100 else 1))
        t_peer *= N / n_peer
        note = "" if n_peer == N else f" (measured at N = {n_peer:.0e}, x{N // n_peer})"
        ours_ns[D] = ours[D] / N * 1e9
        print(f"| {D:,} | {ours_ns[D]:.1f} | {key[D] * 1e3:.1f} ({key[D] / N * 1e9:.1f}) | "
              f"{t_peer / N * 1e9:.1f}{note} | {t_peer / ours[D]:.1f}x |")
    lo, hi = min(ours_ns), max(d for d in ours_ns if d <= 4096)
    with_key = (ours[hi] + key[hi]) / (ours[lo] + key[lo])
    print(f"ours per sample, D = {hi:,} over D = {lo}: {ours_ns[hi] / ours_ns[lo]:.2f}x "
          f"({with_key:.2f}x with the cache key; megatron-core's grows linearly in D)")


def _child_build(D: int, N: int, cache: str) -> dict:
    """The G1 index built in a fresh process: seconds, peak RSS, cache hit."""
    code = ("import sys, json, time, resource; sys.path[:0] = [%r, %r]\n"
            "import benchmarks.data_scale as b\n"
            "from megatron.data.curriculum.index import CurriculumIndex\n"
            "from megatron.schedules.units import BatchSchedule\n"
            "blend = b.g1_blend(%d, %d)\n"
            "cons = b.fake_constituents(blend)\n"
            "t0 = time.perf_counter()\n"
            "idx = CurriculumIndex(blend, cons, %d, BatchSchedule(b.GBS, None, b.SEQ), cache_dir=%r)\n"
            "t = time.perf_counter() - t0\n"
            "print(json.dumps({'seconds': t, 'rss_gb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,"
            " 'hit': idx.cache_hit, 'order': idx.order, 'path': idx.cache_path}))\n"
            % (ROOT, os.path.join(ROOT, "tests"), D, N, N, cache))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def g1(D: int, N: int, work: str):
    print(f"\n## G1: D = {D:,} prefixes, N = {N:.0e} samples, 8 stages (one a linear ramp)")
    cache = os.path.join(work, "g1-cache")
    cold = _child_build(D, N, cache)
    size = sum(os.path.getsize(os.path.join(cold["path"], f)) for f in os.listdir(cold["path"]))
    warm = _child_build(D, N, cache)
    # megatron-core at N = 1e7 over the same D (static weights: its loop's cost does not depend
    # on them), scaled linearly to N
    n_peer = 10 ** 7
    peer = megatron_blend_seconds(skewed_weights(D, 0), n_peer) * (N / n_peer)
    print(f"- cold build ({cold['order']} order): {cold['seconds']:.1f} s, peak RSS "
          f"{cold['rss_gb']:.2f} GB, {size / N:.2f} bytes/sample on disk")
    print(f"- warm load: {warm['seconds']:.2f} s (cache hit: {warm['hit']})")
    print(f"- megatron-core build_blending_indices: {peer:.0f} s, extrapolated from N = 1e7 "
          f"(x{N // n_peer}); ratio {peer / cold['seconds']:.1f}x")
    return cold


def edit_at_60(D: int, N: int):
    """An edit at 60% of the run: one weight changed, one prefix added; the continuation from
    the ledger against the cold build (the same process, fake constituents)."""
    print(f"\n## Edit at 60% (D = {D:,}, N = {N:.0e}): one weight changed, one prefix added")
    cold_t, cold = ours_seconds(g1_blend(D, N), N)
    begin = int(N * 0.6)
    ledger = dict(zip([c.ledger_key for c in cold.constituents], cold.drawn_before(begin), strict=True))
    edited_blend = g1_blend(D, N, extra=1, change=2.0)
    cons = fake_constituents(edited_blend)
    base = [int(ledger.get(c.ledger_key, 0)) for c in cons]
    t0 = time.perf_counter()
    edited = CurriculumIndex(edited_blend, cons, N, BatchSchedule(GBS, None, SEQ), begin=begin,
                             base=base, order=cold.order)
    edit_t = time.perf_counter() - t0
    # no repeat, no gap: a sample of datasets' numbers run on across the edit
    names = [c.ledger_key for c in cons]
    ids = np.concatenate([np.asarray(cold.dataset_index[:begin]),
                          np.asarray(edited.dataset_index)])
    old_to_new = {k: names.index(k) for k in [c.ledger_key for c in cold.constituents]}
    remap = np.array([old_to_new[c.ledger_key] for c in cold.constituents])
    ids[:begin] = remap[ids[:begin]]
    samples = np.concatenate([np.asarray(cold.dataset_sample_index[:begin]),
                              np.asarray(edited.dataset_sample_index)])
    checked = 0
    for d in list(range(0, D, max(1, D // 16))) + [len(cons) - 1]:
        own = samples[ids == d]
        assert np.array_equal(own, np.arange(len(own))), f"dataset {d}: a repeat or a gap"
        checked += 1
    print(f"- cold {cold_t:.1f} s ({cold.order}), edit {edit_t:.1f} s: {edit_t / cold_t:.2f}x the "
          f"cold time; no repeat and no gap in {checked} datasets checked (the new one included)")


BATCH = 64  # lookups per timer reading in the batched figure


def lookups(D: int, N: int, rounds: int = 3):
    """One index lookup, ours (``CurriculumDataset.locate``) against megatron-core's (what
    ``BlendedDataset.__getitem__`` does before the fetch: two numpy reads), at random global
    samples, alternating rounds; per lookup in µs, two ways:

    * batched: p50/p99 over timer readings that each time :data:`BATCH` consecutive lookups,
      divided by :data:`BATCH` (the timer's own cost, ~0.1 µs a reading, spread over the batch);
    * single: p50/p99 of one lookup per timer reading (the timer's cost included)."""
    print(f"\n## Lookups (D = {D:,}, N = {N:.0e}; random global samples, µs per lookup)")
    from megatron.data.curriculum.dataset import CurriculumDataset

    _, idx = ours_seconds(static_blend(D), N)
    ds = CurriculumDataset(idx, [None] * D)
    rng = np.random.default_rng(0)
    probes = rng.integers(0, N, 64 * 4096).tolist()
    ids, samples = np.asarray(idx.dataset_index), np.asarray(idx.dataset_sample_index)

    def peer(i):  # what megatron-core's BlendedDataset.__getitem__ does before the fetch
        return ids[i], samples[i]

    clock = time.perf_counter_ns
    empty = np.empty(20_000)  # the timer alone: one reading after another
    for k in range(len(empty)):
        t0 = clock()
        empty[k] = clock() - t0
    batched = {"ours": [], "peer": []}
    single = {"ours": [], "peer": []}
    for _ in range(rounds):
        for name, lookup in (("ours", ds.locate), ("peer", peer)):
            times = np.empty(len(probes) // BATCH)
            for k in range(len(times)):
                batch = probes[k * BATCH:(k + 1) * BATCH]
                t0 = clock()
                for i in batch:
                    lookup(i)
                times[k] = (clock() - t0) / BATCH
            batched[name].append(times)
            times = np.empty(50_000)
            for k, i in enumerate(probes[:len(times)]):
                t0 = clock()
                lookup(i)
                times[k] = clock() - t0
            single[name].append(times)
    label = {"ours": "ours (CurriculumDataset.locate)",
             "peer": "megatron-core (BlendedDataset's two numpy reads)"}
    for how, data in ((f"batched ({BATCH} lookups per timer reading)", batched),
                      ("single (one lookup per timer reading, the timer included)", single)):
        print(f"- {how}:")
        for name in ("ours", "peer"):
            t = np.concatenate(data[name]) / 1e3
            print(f"  - {label[name]}: p50 {np.percentile(t, 50):.2f} µs, "
                  f"p99 {np.percentile(t, 99):.2f} µs")
        ratio = np.percentile(np.concatenate(data["ours"]), 99) / np.percentile(
            np.concatenate(data["peer"]), 99)
        print(f"  - p99 ours / megatron-core: {ratio:.2f}x")
    print(f"- the timer alone (two readings back to back): p50 {np.percentile(empty, 50) / 1e3:.2f} µs")


def peer_gpt_config(prefixes, weights, split: str, cache: str, seed: int):
    """megatron-core's ``GPTDatasetConfig`` of a ``--data-path`` blend (``prefixes``, ``weights``)
    cut by ``split``, cached in ``cache``: the peer builder's configuration."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    from megatron.tokenizer import ByteLevelTokenizer

    return GPTDatasetConfig(random_seed=seed, sequence_length=SEQ, blend=(prefixes, weights),
                            split=split, path_to_cache=cache, tokenizer=ByteLevelTokenizer(),
                            reset_position_ids=False, reset_attention_mask=False,
                            eod_mask_loss=False)


def one_process_group(work: str) -> None:
    """A 1-process gloo group (megatron-core's builder asks for the rank), once per process."""
    import torch

    if not torch.distributed.is_initialized():
        torch.distributed.init_process_group("gloo", init_method=f"file://{work}/pg-store",
                                             rank=0, world_size=1)


def sparse_corpus(prefix: str, documents: int, doc_tokens: int) -> None:
    """A real ``.idx`` of ``documents`` documents of ``doc_tokens`` tokens and a sparse ``.bin``
    of the matching size (uint16 tokens; reads give zeros)."""
    sparse_corpus_of_lengths(prefix, np.full(documents, doc_tokens, dtype=np.int32))


def sparse_corpus_of_lengths(prefix: str, lengths: np.ndarray) -> None:
    """A real ``.idx`` of one document per entry of ``lengths`` (tokens) and a sparse ``.bin`` of
    the matching size (uint16 tokens; reads give zeros)."""
    from megatron.core.datasets.indexed_dataset import _IndexWriter

    lengths = np.asarray(lengths, dtype=np.int32)
    with _IndexWriter(prefix + ".idx", np.uint16) as writer:
        writer.write(lengths, None, list(range(len(lengths) + 1)))
    with open(prefix + ".bin", "wb") as f:
        f.truncate(int(lengths.sum(dtype=np.int64)) * 2)


def setup_over_sparse_corpora(D: int, N: int, work: str, documents: int = 64, peer: bool = True):
    print(f"\n## Data set-up over {D:,} sparse prefixes (real .idx, sparse .bin), N = {N:.0e}, "
          f"seq {SEQ}")
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    from megatron.data.curriculum.dataset import build_curriculum_dataset
    from megatron.tokenizer import ByteLevelTokenizer

    data = os.path.join(work, f"corpus-{documents}")
    os.makedirs(data, exist_ok=True)
    w = skewed_weights(D, 0)
    prefixes = [os.path.join(data, f"ds{d:05d}_text_document") for d in range(D)]
    for p in prefixes:
        if not os.path.exists(p + ".idx"):
            sparse_corpus(p, documents, 1 << 17)
    apparent = sum(os.path.getsize(p + ".bin") for p in prefixes)
    print(f"- corpus: {apparent / 2 / 1e12:.2f}e12 tokens in sparse .bin files "
          f"({apparent / 1e9:.0f} GB apparent, no disk)")
    blend = parse_blend_config({"train": {"blend": [{"path": p, "weight": float(x)}
                                                    for p, x in zip(prefixes, w, strict=True)]}},
                               "setup.yaml").train

    def config(cache):
        return GPTDatasetConfig(random_seed=1, sequence_length=SEQ, blend=None, split=None,
                                path_to_cache=cache, tokenizer=ByteLevelTokenizer(),
                                reset_position_ids=False, reset_attention_mask=False,
                                eod_mask_loss=False)

    ours_cache = os.path.join(work, f"ours-cache-{documents}")
    shutil.rmtree(ours_cache, ignore_errors=True)
    times = []
    for _ in range(2):  # cold, warm
        t0 = time.perf_counter()
        ds = build_curriculum_dataset(blend, N, config(ours_cache), BatchSchedule(GBS, None, SEQ),
                                      cache_dir=ours_cache)
        ds[0]
        times.append(time.perf_counter() - t0)
    files = sum(len(fs) for _, _, fs in os.walk(ours_cache))
    print(f"- ours ({ds.index.order} order): cold {times[0]:.1f} s, warm {times[1]:.1f} s to the "
          f"first sample; {files} cache files")
    if not peer:
        return
    peer_cache = os.path.join(work, "peer-cache")
    shutil.rmtree(peer_cache, ignore_errors=True)
    peer_config = peer_gpt_config(prefixes, w.tolist(), "100,0,0", peer_cache, seed=1)
    one_process_group(work)
    t0 = time.perf_counter()
    try:
        peer = BlendedMegatronDatasetBuilder(GPTDataset, [N, 0, 0], lambda: True,
                                             peer_config).build()[0]
        peer[0]
        peer_t = time.perf_counter() - t0
        files = sum(len(fs) for _, _, fs in os.walk(peer_cache))
        print(f"- megatron-core BlendedMegatronDatasetBuilder: cold {peer_t:.1f} s; {files} cache "
              f"files; ratio {peer_t / times[0]:.2f}x")
        fetch(ds, peer, N)
    except OSError as exc:
        print(f"- megatron-core BlendedMegatronDatasetBuilder: fails: {exc}")


MODEL_FLAGS = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2",
               "--micro-batch-size", "1", "--lr", "1e-3"]


def _timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _sparse_prefixes(work: str, D: int, documents: int = 64):
    """``D`` sparse GPT prefixes (``documents`` documents of 131,072 tokens each) under ``work``."""
    data = os.path.join(work, f"corpus-{documents}")
    os.makedirs(data, exist_ok=True)
    prefixes = [os.path.join(data, f"ds{d:05d}_text_document") for d in range(D)]
    for p in prefixes:
        if not os.path.exists(p + ".idx"):
            sparse_corpus(p, documents, 1 << 17)
    return prefixes


def sparse_t0_corpus(prefix: str, examples: int, seed: int) -> None:
    """A T0 prefix of ``examples`` (input, target) pairs: real ``PREFIX_inputs_document.idx`` and
    ``PREFIX_targets_document.idx`` (P3-like lengths: inputs lognormal around 150 tokens, at most
    1,984, targets around 4, at most 64: no pair is truncated at 2,048) and sparse ``.bin`` files of the matching size."""
    from megatron.core.datasets.indexed_dataset import _IndexWriter

    rng = np.random.default_rng(seed)
    inputs = np.clip(rng.lognormal(np.log(150), 0.9, examples), 1, 1984).astype(np.int32)
    targets = np.clip(rng.lognormal(np.log(4), 0.9, examples), 1, 64).astype(np.int32)
    for key, lengths in (("inputs", inputs), ("targets", targets)):
        path = f"{prefix}_{key}_document"
        with _IndexWriter(path + ".idx", np.uint16) as writer:
            writer.write(lengths, None, list(range(examples + 1)))
        with open(path + ".bin", "wb") as f:
            f.truncate(int(lengths.sum()) * 2)


def _peer_data_path_seconds(prefixes, weights, N: int, split: str, work: str) -> float:
    """megatron-core's ``BlendedMegatronDatasetBuilder`` over the same ``--data-path`` blend and
    ``--split`` (cold cache, to the first sample): seconds."""
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    cache = os.path.join(work, "peer-data-path-cache")
    shutil.rmtree(cache, ignore_errors=True)
    config = peer_gpt_config(list(prefixes), list(weights), split, cache, seed=1234)
    one_process_group(work)
    t0 = time.perf_counter()
    built = BlendedMegatronDatasetBuilder(GPTDataset, [N, 0, 0], lambda: True, config).build()
    built[0][0]
    return time.perf_counter() - t0


def _build_twice(label: str, parse, build, cache: str):
    """Parse the flags (validation) and build the data cold (``cache`` emptied) and warm, each to
    the first training sample; prints and returns (parse s, cold s, warm s)."""
    shutil.rmtree(cache, ignore_errors=True)
    parse_t, args = _timed(parse)
    times = []
    for _ in range(2):
        t, data = _timed(lambda: build(args))
        t0 = time.perf_counter()
        data.train[0]
        times.append(t + time.perf_counter() - t0)
    files = sum(len(fs) for _, _, fs in os.walk(cache))
    print(f"- {label}: flags parsed and checked in {parse_t:.1f} s; set-up cold {times[0]:.1f} s, "
          f"warm {times[1]:.2f} s (to the first sample); {files} cache files")
    return parse_t, times[0], times[1]


def other_paths(D: int, N: int, work: str, t0_prefixes: int = 1000, t0_examples: int = 10 ** 7,
                peer: bool = True):
    """The other data paths at scale, through the real builders (megatron/data/builder.py
    ``build_pretraining_data``, megatron/data/mtf_builder.py ``build_mtf_data``) from parsed flags:
    ``--data-args-path`` (``D`` ``W PREFIX`` pairs) with ``--split``, ``--train-weighted-split-paths``
    (one group of ``D`` items and two validation groups), and T0 packing over ``t0_examples``
    examples in ``t0_prefixes`` prefixes; each cold and warm."""
    from megatron.config.parser import parse_args
    from megatron.data.builder import build_pretraining_data
    from megatron.tokenizer import ByteLevelTokenizer

    print(f"\n## The other data paths at D = {D:,} sparse prefixes, N = {N:.0e}, seq {SEQ}, "
          f"global batch {GBS}")
    prefixes = _sparse_prefixes(work, D)
    w = skewed_weights(D, 0).tolist()
    tokenizer = ByteLevelTokenizer()
    common = MODEL_FLAGS + ["--seq-length", str(SEQ), "--global-batch-size", str(GBS),
                            "--train-samples", str(N), "--eval-iters", "1",
                            "--eval-interval", str(10 ** 6)]

    args_file = os.path.join(work, "data-args.txt")
    with open(args_file, "w") as f:
        f.write("\n".join(f"{x!r} {p}" for x, p in zip(w, prefixes, strict=True)))
    cache = os.path.join(work, "data-path-cache")
    _, cold, _ = _build_twice(
        f"--data-args-path ({D:,} W PREFIX pairs), --split 98,2,0",
        lambda: parse_args(common + ["--data-args-path", args_file, "--split", "98,2,0",
                                     "--data-cache-path", cache]).run_config.data,
        lambda config: build_pretraining_data(config, tokenizer), cache)
    if peer:
        peer_t = _peer_data_path_seconds(prefixes, w, N, "98,2,0", work)
        print(f"  megatron-core BlendedMegatronDatasetBuilder, same blend and split: cold "
              f"{peer_t:.1f} s ({peer_t / cold:.1f}x ours)")

    train = "TRAIN: " + ", ".join(f"{x!r} 0:0.95 {p}" for x, p in zip(w, prefixes, strict=True))
    valid = [f"V{g}: " + ", ".join(f"1 0.95:1 {p}" for p in prefixes[g::64]) for g in range(2)]
    cache = os.path.join(work, "weighted-split-cache")
    _build_twice(
        f"--train-weighted-split-paths ({D:,} items) and 2 validation groups of {D // 64} items",
        lambda: parse_args(common + ["--train-weighted-split-paths", train,
                                     "--valid-weighted-split-paths", *valid,
                                     "--data-cache-path", cache]).run_config.data,
        lambda config: build_pretraining_data(config, tokenizer), cache)

    t0_dir = os.path.join(work, f"t0-{t0_prefixes}-{t0_examples}")
    os.makedirs(t0_dir, exist_ok=True)
    per = t0_examples // t0_prefixes
    t0_paths = [os.path.join(t0_dir, f"task{k:04d}") for k in range(t0_prefixes)]
    for k, p in enumerate(t0_paths):
        if not os.path.exists(p + "_targets_document.idx"):
            sparse_t0_corpus(p, per, k)
    t0_seq = 2048
    # equal weights (equal tasks); one pass over 10 examples packs about 1.1 samples of 2,048
    # tokens, so every task's first epoch (all its examples) is packed and no second one
    t0_samples = t0_examples // 10
    t0_train = "T0: " + ", ".join(f"1 0:0.99 {p}" for p in t0_paths)
    t0_valid = "V: " + ", ".join(f"1 0.99:1 {p}" for p in t0_paths[::100])
    cache = os.path.join(work, "t0-cache")

    def t0_build(config):
        from megatron.data.mtf_builder import build_mtf_data

        return build_mtf_data(config, tokenizer)

    def t0_parse():
        from finetune_t0 import parse_t0_args

        return parse_t0_args(MODEL_FLAGS + [
            "--seq-length", str(t0_seq), "--global-batch-size", str(GBS), "--train-samples",
            str(t0_samples), "--eval-iters", "1", "--eval-interval", str(10 ** 6),
            "--train-weighted-split-paths", t0_train, "--valid-weighted-split-paths", t0_valid,
            "--data-cache-path", cache]).run_config.data

    _build_twice(f"T0 packing: {t0_examples:.0e} examples in {t0_prefixes:,} prefixes, "
                 f"{t0_samples:.0e} packed samples of {t0_seq} tokens", t0_parse, t0_build, cache)
    t0_pack_loops(t0_paths, t0_seq)


def t0_pack_loops(paths, seq_length: int) -> None:
    """One epoch's best-fit-decreasing packing of every T0 prefix's examples (``pack_lengths``:
    compiled from 2,048 items) against the same packing by its Python twin, in this run: seconds,
    and whether the packs are identical."""
    from megatron.data import mtf_dataset

    lengths = []
    for p in paths:
        pair = mtf_dataset.MTFDocumentPair(p)
        keep_in, keep_tg = mtf_dataset.truncated_lengths(pair.input_lengths, pair.target_lengths,
                                                         seq_length)
        lengths.append((keep_in + keep_tg).astype(np.int64))
    t0 = time.perf_counter()
    packs = [mtf_dataset.pack_lengths(x, seq_length) for x in lengths]
    compiled = time.perf_counter() - t0
    t0 = time.perf_counter()
    same = all(np.array_equal(a, b) for x, got in zip(lengths, packs, strict=True)
               for a, b in zip(got, mtf_dataset._pack_in_python(x, np.argsort(-x, kind="stable"),
                                                                 seq_length), strict=True))
    python = time.perf_counter() - t0
    items = sum(len(x) for x in lengths)
    print(f"  the packing loop alone, {items:.2e} examples in {len(paths):,} prefixes: compiled "
          f"{compiled:.2f} s, its Python twin {python:.1f} s ({python / compiled:.0f}x); identical "
          f"packs: {same}")


def _tool_seconds(script: str, flags) -> float:
    """Wall seconds of ``tools/SCRIPT`` with ``flags`` in a fresh process (imports included)."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", script), *flags], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return time.perf_counter() - t0


def tools_at_scale(D: int, N: int, work: str, documents: int = 30518, cold: bool = True):
    """``tools/preview_schedule.py`` and ``tools/data_provenance.py`` on G1 over sparse corpora
    (``D`` prefixes of ``documents`` documents of 131,072 tokens): the data set-up through
    ``build_pretraining_data`` cold and warm, a checkpoint's data ledger written at 60% of the
    run, then each tool timed in a fresh process against the cache (seconds). ``cold=False``
    keeps a cache left by an earlier run (the set-up is then warm twice)."""
    from megatron.checkpoint.format import checkpoint_tag, write_data_mix, write_tracker
    from megatron.config.parser import parse_args
    from megatron.data.builder import build_pretraining_data
    from megatron.tokenizer import ByteLevelTokenizer

    print(f"\n## Tools at G1 (D = {D:,}, N = {N:.0e}, 8 stages) over sparse corpora, from the cache")
    prefixes = _sparse_prefixes(work, D, documents)
    blend_file = os.path.join(work, f"g1-blend-{D}.json")
    with open(blend_file, "w") as f:
        json.dump(g1_blend_spec(prefixes, N), f)
    cache = os.path.join(work, "g1-tools-cache")
    flags = MODEL_FLAGS + ["--seq-length", str(SEQ), "--global-batch-size", str(GBS),
                           "--train-samples", str(N), "--eval-iters", "0",
                           "--data-blend-config", blend_file, "--data-cache-path", cache]
    tokenizer = ByteLevelTokenizer()
    config = parse_args(flags).run_config.data
    if cold:
        shutil.rmtree(cache, ignore_errors=True)
    times = []
    for _ in range(2):  # cold (an empty cache), warm
        t, data = _timed(lambda: build_pretraining_data(config, tokenizer))
        data.train[0]
        times.append(t)
    print(f"- data set-up through build_pretraining_data (--data-blend-config): cold "
          f"{times[0]:.1f} s, warm {times[1]:.2f} s")
    iters = N // GBS
    at = int(iters * 0.6)
    load = os.path.join(work, "g1-load")
    shutil.rmtree(load, ignore_errors=True)
    directory = os.path.join(load, checkpoint_tag(at))
    os.makedirs(directory)
    write_data_mix(directory, data.mix.record(at, at * GBS).to_json())
    write_tracker(load, at)
    out = os.path.join(work, "tool-out")
    preview = _tool_seconds("preview_schedule.py", flags + ["--output-json", out + ".json"])
    resumed = _tool_seconds("preview_schedule.py", flags + ["--output-json", out + "-load.json",
                                                            "--load", load])
    provenance = _tool_seconds("data_provenance.py", flags + [
        "--load", load, "--iterations", f"{at - 4}:{at + 5}", "--output", out + ".jsonl"])
    with open(out + ".jsonl") as f:
        lines = sum(1 for _ in f)
    print(f"- preview_schedule.py (mixture of {iters:,} iterations): {preview:.1f} s; with --load "
          f"(the ledger at iteration {at:,}): {resumed:.1f} s")
    print(f"- data_provenance.py --iterations {at - 4}:{at + 5} (across the checkpoint, "
          f"{lines:,} samples): {provenance:.1f} s")


def fetch(ours, peer, N: int, count: int = 3000):
    rng = np.random.default_rng(1)
    probes = rng.integers(0, N, count).tolist()
    for _name, ds in (("ours", ours), ("megatron-core", peer)):
        for i in probes[:200]:
            ds[i]
    results = {}
    for name, ds in (("ours", ours), ("megatron-core", peer)):
        t0 = time.perf_counter()
        for i in probes:
            ds[i]
        results[name] = count / (time.perf_counter() - t0)
    print(f"- fetch: ours {results['ours']:.0f} samples/s, megatron-core BlendedDataset "
          f"{results['megatron-core']:.0f} samples/s: {results['ours'] / results['megatron-core']:.2f}x")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--g1", action="store_true", help="also G1 (N = 1e9; minutes)")
    parser.add_argument("--work", default=None, help="where corpora and caches go")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1024, 4096, 32766])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS[:-1]),
                        help="which measurements to run (all but tools by default; with --g1, "
                             "G1 too, and tools at G1)")
    parser.add_argument("--reuse-cache", action="store_true",
                        help="tools: keep the index cache an earlier run left in --work")
    args = parser.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # no buffered lines copied into forked children
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # megatron-core opens every prefix
    work = args.work or tempfile.mkdtemp(prefix="data_scale-")
    print(f"# benchmarks/data_scale.py on {os.cpu_count()} CPU cores (work dir {work})")
    if "d-scaling" in args.parts:
        d_scaling(10 ** 7, args.sizes)
    if "edit" in args.parts:
        edit_at_60(1024, 10 ** 7)
    if "lookups" in args.parts:
        lookups(1024, 10 ** 7)
    if "setup" in args.parts:
        setup_over_sparse_corpora(1024, 10 ** 7, work)
    if "other-paths" in args.parts:
        other_paths(1024, 10 ** 7, work)
    if "tools" in args.parts and not args.g1:
        tools_at_scale(1024, 10 ** 7, work, documents=64, cold=not args.reuse_cache)
    if args.g1 and args.parts != ["tools"]:
        g1(1024, 10 ** 9, work)
        # G1's corpus: 1e9 samples of 4,096 tokens over 1,024 prefixes (4e12 tokens, sparse)
        setup_over_sparse_corpora(1024, 10 ** 9, work, documents=30518, peer=False)
    if args.g1 and ("tools" in args.parts or args.parts == list(PARTS[:-1])):
        tools_at_scale(1024, 10 ** 9, work, cold=not args.reuse_cache)
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


if __name__ == "__main__":
    main()
