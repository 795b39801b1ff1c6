"""GPU: attention backends on packed and on packed prefix-LM (T0) batches: tokens/s and peak memory
of forward + backward, each backend's first call (compilation) timed apart and never counted.

    python benchmarks/gpu/attention_backends.py [--seq-length 4096] [--batch 4] [--documents 10]
        [--heads 16] [--head-dim 128] [--dtype bf16] [--alibi] [--iters 20] [--warmup 3]
        [--batch-kinds packed prefix] [--backends sdpa-dense sdpa-segments flex te]
        [--te-kernel flash|fused|unfused] [--json F]
    python benchmarks/gpu/attention_backends.py --device cpu --tiny   # smoke run of the script

Batch kinds: ``packed`` (``--documents`` documents per sample, causal within each: pretraining
with ``--reset-attention-mask``, T0 without ``--prefix-lm``) and ``prefix`` (the same with each
document's first 60-95% an input prefix: ``finetune_t0.py --prefix-lm``). Backends (each where it
can run; a skipped or failed one says why):

- ``sdpa-dense``: SDPA over the whole sequence with the dense ``[b, 1, s, s]`` mask (the layout of
  this repository's data loader before the compact contract; memory-efficient kernel);
- ``sdpa-segments``: the SDPA backend as the model runs it (per segment);
- ``flex``: FlexAttention, ``torch.compile``d, block mask from ``segment_ids`` / ``is_prefix``
  (built once per batch: its build time is printed, after a first build that compiles);
- ``te``: Transformer Engine ``DotProductAttention`` with the arguments the TE backend passes
  (packed: the ``thd`` format; prefix: the ``arbitrary`` mask; ALiBi as TE's bias); with
  ``--te-kernel`` TE restricted to that kernel family as ``--attention-backend flash|fused|
  unfused`` does (its environment switches are read when TE first selects a kernel, so each family
  runs in a process of its own: benchmarks/gpu/run_all.sh).

Every backend's output is first checked against ``sdpa-dense`` (max abs difference printed), so a
run is also a correctness check of the GPU kernels. Ratios are printed against ``sdpa-dense``.
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir, os.path.pardir)))

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402

quiet_known_warnings()

import numpy as np  # noqa: E402
import torch  # noqa: E402

BACKENDS = ("sdpa-dense", "sdpa-segments", "flex", "te")
BATCH_KINDS = ("packed", "prefix")


def packed_batch(batch: int, seq_length: int, documents: int, prefix: bool, seed: int = 0):
    """``segment_ids`` [b, s] int32 and ``is_prefix`` [b, s] bool (None unless ``prefix``):
    ``documents`` random-length segments per sample, each (with ``prefix``) an input prefix
    (60-95% of it) then its target."""
    rng = np.random.default_rng(seed)
    seg = np.zeros((batch, seq_length), np.int32)
    pre = np.zeros((batch, seq_length), bool)
    for n in range(batch):
        cuts = np.sort(rng.choice(np.arange(1, seq_length), documents - 1, replace=False))
        bounds = [0, *cuts.tolist(), seq_length]
        for k in range(documents):
            lo, hi = bounds[k], bounds[k + 1]
            seg[n, lo:hi] = k + 1
            pre[n, lo:lo + int(rng.uniform(0.6, 0.95) * (hi - lo))] = True
    return torch.from_numpy(seg), (torch.from_numpy(pre) if prefix else None)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, iters: int, warmup: int, device: torch.device):
    """(ms of the first call, ms per call after ``warmup`` calls, peak bytes above the start or 0
    off GPU) of ``fn``: the first call, which compiles, is one of the warm-up calls and is
    reported apart, never in the timing."""
    start = time.perf_counter()
    fn()
    _sync(device)
    first_ms = 1e3 * (time.perf_counter() - start)
    for _ in range(warmup - 1):
        fn()
    _sync(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    _sync(device)
    ms = 1e3 * (time.perf_counter() - start) / iters
    return first_ms, ms, (torch.cuda.max_memory_allocated() - base) if cuda else 0


def te_backend(n: int, d: int, scale: float, kernel):
    """A callable ``(q, k, v, structure, slopes, dtype) -> out`` on [b, n, s, d] tensors through
    TE's DotProductAttention with the TE backend's arguments, or raises ImportError."""
    from megatron.model.te_attention import te_forward_kwargs, te_kernel_environment

    os.environ.update(te_kernel_environment(kernel))  # before TE selects a kernel
    import transformer_engine.pytorch as te

    attention = te.DotProductAttention(n, d, attention_dropout=0.0, qkv_format="sbhd",
                                       attn_mask_type="causal", softmax_scale=scale)

    def call(q, k, v, structure, slopes, dtype):
        b, _, s, _ = q.shape
        kwargs = te_forward_kwargs(structure, s, q.device, slopes, dtype)
        if kwargs.get("qkv_format") == "thd":  # [b, n, s, d] -> [b * s, n, d], sample-major
            thd = [t.transpose(1, 2).reshape(b * s, n, d) for t in (q, k, v)]
            return attention(*thd, **kwargs).view(b, s, n, d).transpose(1, 2)
        sbhd = [t.permute(2, 0, 1, 3).contiguous() for t in (q, k, v)]
        return attention(*sbhd, **kwargs).view(s, b, n, d).permute(1, 2, 0, 3)

    return call


def run_kind(kind: str, args, dev, dtype, te_call):
    """The rows of one batch kind: {backend: measurements}; prints them."""
    from megatron.model.alibi import alibi_slopes
    from megatron.model.flex_attention import flex_attend
    from megatron.model.masks import attention_structure, block_mask
    from megatron.model.sdpa_attention import sdpa_dense, sdpa_segmentwise

    b, s, n, d = args.batch, args.seq_length, args.heads, args.head_dim
    seg, pre = packed_batch(b, s, args.documents, prefix=kind == "prefix")

    def structure():  # as the loader and model build it: host layout, then to the device
        return attention_structure(seg, pre).to(dev)

    slopes = alibi_slopes(n).to(dev) if args.alibi else None
    scale = d ** -0.5
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, s, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, n, s, d, device=dev, dtype=dtype)
    shared = structure()
    block_mask_ms = None
    if "flex" in args.backends:
        try:
            block_mask(structure(), s, dev)  # the first build compiles
            _sync(dev)
            start = time.perf_counter()
            bmask = block_mask(structure(), s, dev)
            _sync(dev)
            block_mask_ms = 1e3 * (time.perf_counter() - start)
        except Exception as e:
            print(f"flex: block mask failed ({type(e).__name__}: {str(e)[:200]})")
            args.backends = [x for x in args.backends if x != "flex"]
    candidates = {
        "sdpa-dense": lambda: sdpa_dense(q, k, v, shared, scale, slopes=slopes),
        # a new structure per call: the model builds its forms once per micro batch
        "sdpa-segments": lambda: sdpa_segmentwise(q, k, v, structure(), scale, slopes=slopes),
        "flex": lambda: flex_attend(q, k, v, shared, scale, slopes, bmask),
        "te": lambda: te_call(q, k, v, structure(), slopes, dtype),
    }
    backends = {name: fn for name, fn in candidates.items()
                if name in args.backends and (name != "te" or te_call is not None)}
    with torch.no_grad():
        reference = sdpa_dense(q, k, v, shared, scale, slopes=slopes).float()

    def step(attend):
        def run():
            out = attend()
            out.backward(grad)
            q.grad = k.grad = v.grad = None
        return run

    rows = {}
    for name, attend in backends.items():
        label = f"te-{args.te_kernel}" if name == "te" and args.te_kernel else name
        try:
            with torch.no_grad():
                diff = (attend().float() - reference).abs().max().item()
            first_ms, ms, peak = timed(step(attend), args.iters, args.warmup, dev)
        except Exception as e:  # report and go on: a GPU run should show every backend it can
            print(f"{kind} {label}: failed ({type(e).__name__}: {str(e)[:300]})")
            continue
        rows[label] = {"ms": ms, "first_call_ms": first_ms, "tokens_per_s": b * s / ms * 1e3,
                       "peak_gib": peak / 2 ** 30, "max_abs_diff_vs_sdpa_dense": diff}
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU (smoke run)"
    mask_note = "" if block_mask_ms is None else f", block mask build {block_mask_ms:.1f} ms/batch"
    print(f"{name}: {kind} batches, b={b} s={s} heads={n} head_dim={d} {args.dtype}, "
          f"{args.documents} documents/sample, ALiBi {'on' if args.alibi else 'off'}, fwd+bwd, "
          f"{args.iters} timed iterations after {args.warmup} warm-up{mask_note}")
    ref = rows.get("sdpa-dense")
    for label, r in rows.items():
        ratio = (f"  {ref['ms'] / r['ms']:5.2f}x speed, "
                 f"{ref['peak_gib'] / max(r['peak_gib'], 1e-9):5.2f}x less memory") if ref else ""
        print(f"  {label:14s} {r['ms']:9.2f} ms  {r['tokens_per_s']:12,.0f} tokens/s  peak "
              f"{r['peak_gib']:7.3f} GiB  max|diff| {r['max_abs_diff_vs_sdpa_dense']:.2e}  "
              f"(first call {r['first_call_ms']:.0f} ms, not timed){ratio}")
    return {"rows": rows, "block_mask_ms": block_mask_ms, "tokens": int((seg > 0).sum())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--documents", type=int, default=10)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    parser.add_argument("--alibi", action="store_true")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls first (>= 1: compiles)")
    parser.add_argument("--batch-kinds", nargs="+", choices=BATCH_KINDS, default=list(BATCH_KINDS))
    parser.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS))
    parser.add_argument("--te-kernel", choices=["flash", "fused", "unfused"], default=None,
                        help="restrict TE to this kernel family (as --attention-backend does)")
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke run)")
    parser.add_argument("--tiny", action="store_true", help="s=64, b=2, 4 heads x 8, 4 documents")
    args = parser.parse_args(argv)
    if args.tiny:
        args.seq_length, args.batch, args.heads, args.head_dim, args.documents = 64, 2, 4, 8, 4
        args.iters, args.dtype = min(args.iters, 2), "fp32"
    if args.iters < 1 or args.warmup < 1:
        parser.error(f"--iters {args.iters} and --warmup {args.warmup} must be at least 1 (the "
                     "first warm-up call compiles and is never timed)")
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks/gpu/attention_backends.py needs a CUDA device (--device cpu: smoke run)")
    if args.device == "cpu":  # FlexAttention has no CPU backward
        args.backends = [b for b in args.backends if b != "flex"]
    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    te_call = None
    if "te" in args.backends:
        try:
            te_call = te_backend(args.heads, args.head_dim, args.head_dim ** -0.5, args.te_kernel)
        except Exception as e:  # absent, or installed and failing to import
            print(f"te: skipped ({type(e).__name__}: {str(e)[:200]})")
    results = {kind: run_kind(kind, args, dev, dtype, te_call) for kind in args.batch_kinds}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "device": str(dev), "kinds": results}, f, indent=1)


if __name__ == "__main__":
    main()
