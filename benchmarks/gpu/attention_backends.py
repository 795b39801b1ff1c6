"""GPU: attention backends on packed prefix-LM (T0) batches: tokens/s and peak memory, fwd+bwd.

    python benchmarks/gpu/attention_backends.py [--seq-length 4096] [--batch 4] [--documents 10]
        [--heads 16] [--head-dim 128] [--dtype bf16] [--alibi] [--iters 20] [--json F]

Backends (each where it can run; a skipped one says why):

- ``sdpa-dense``: SDPA over the whole sequence with the dense ``[b, 1, s, s]`` mask (the layout of
  this repository's data loader before the compact contract; memory-efficient kernel);
- ``sdpa-segments``: the SDPA backend as the model runs it (one call per segment);
- ``flex``: FlexAttention, ``torch.compile``d, block mask from ``segment_ids`` / ``is_prefix``
  (built once per batch and timed separately), ALiBi as ``score_mod``;
- ``te``: Transformer Engine ``DotProductAttention`` with the arguments the TE backend passes
  (``arbitrary`` mask; ALiBi as a bias).

Every backend's output is first checked against ``sdpa-dense`` (max abs difference printed), so a
run is also a correctness check of the GPU kernels. Ratios are printed against ``sdpa-dense``.
``--device cpu`` is a smoke run of the script itself (tiny sizes; no memory figures; FlexAttention
has no CPU backward and is reported as failed).
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir, os.path.pardir)))

import numpy as np  # noqa: E402
import torch  # noqa: E402


def packed_prefix_lm_batch(batch: int, seq_length: int, documents: int, seed: int = 0):
    """``segment_ids`` [b, s] int32 and ``is_prefix`` [b, s] bool: ``documents`` random-length T0
    segments per sample, each an input prefix (60-95% of it) then its target."""
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
    return torch.from_numpy(seg), torch.from_numpy(pre)


def timed(fn, iters: int, device: torch.device):
    """(seconds per call, peak bytes or 0 off GPU) of ``fn`` (fwd+bwd) after 3 warm-up calls."""
    cuda = device.type == "cuda"
    for _ in range(3):
        fn()
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    if cuda:
        torch.cuda.synchronize()
    seconds = (time.perf_counter() - start) / iters
    return seconds, (torch.cuda.max_memory_allocated() - base) if cuda else 0


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
    parser.add_argument("--json", default=None)
    parser.add_argument("--device", default="cuda", help="cuda (the benchmark) or cpu (a smoke run)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("benchmarks/gpu/attention_backends.py needs a CUDA device (--device cpu: smoke run)")
    from megatron.model.alibi import alibi_slopes
    from megatron.model.flex_attention import flex_attend
    from megatron.model.masks import attention_structure, block_mask
    from megatron.model.sdpa_attention import sdpa_dense, sdpa_segmentwise
    from megatron.model.te_attention import te_forward_kwargs

    dev = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    b, s, n, d = args.batch, args.seq_length, args.heads, args.head_dim
    seg, pre = (t.to(dev) for t in packed_prefix_lm_batch(b, s, args.documents))
    slopes = alibi_slopes(n).to(dev) if args.alibi else None
    scale = d ** -0.5
    torch.manual_seed(0)
    q, k, v = (torch.randn(b, n, s, d, device=dev, dtype=dtype, requires_grad=True) for _ in range(3))
    grad = torch.randn(b, n, s, d, device=dev, dtype=dtype)

    def step(attend):
        def run():
            out = attend()
            out.backward(grad)
            q.grad = k.grad = v.grad = None
            return out
        return run

    structure = attention_structure(seg, pre)
    start = time.perf_counter()
    bmask = block_mask(structure, s, dev)
    if dev.type == "cuda":
        torch.cuda.synchronize()
    block_mask_ms = 1e3 * (time.perf_counter() - start)
    backends = {
        "sdpa-dense": lambda: sdpa_dense(q, k, v, structure, scale, slopes=slopes),
        "sdpa-segments": lambda: sdpa_segmentwise(q, k, v, attention_structure(seg, pre), scale, slopes=slopes),
        "flex": lambda: flex_attend(q, k, v, structure, scale, slopes, bmask),
    }
    try:
        import transformer_engine.pytorch as te

        te_attn = te.DotProductAttention(n, d, attention_dropout=0.0, qkv_format="sbhd",
                                         attn_mask_type="arbitrary", softmax_scale=scale)
        te_kwargs = te_forward_kwargs(structure, s, dev, slopes, dtype)

        def te_call():
            sbhd = [t.permute(2, 0, 1, 3).contiguous() for t in (q, k, v)]
            out = te_attn(*sbhd, **te_kwargs)  # [s, b, n*d]
            return out.view(s, b, n, d).permute(1, 2, 0, 3)

        backends["te"] = te_call
    except ImportError as e:
        print(f"te: skipped ({e})")
    with torch.no_grad():
        reference = backends["sdpa-dense"]().float()
    rows = {}
    for name, attend in backends.items():
        try:
            with torch.no_grad():
                diff = (attend().float() - reference).abs().max().item()
            seconds, peak = timed(step(attend), args.iters, dev)
        except Exception as e:  # report and go on: a GPU run should show every backend it can
            print(f"{name}: failed ({type(e).__name__}: {str(e)[:200]})")
            continue
        rows[name] = {"ms": 1e3 * seconds, "tokens_per_s": b * s / seconds,
                      "peak_gib": peak / 2 ** 30, "max_abs_diff_vs_sdpa_dense": diff}
    real = (seg > 0).sum().item()
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "CPU (smoke run)"
    print(f"{name}: b={b} s={s} heads={n} head_dim={d} {args.dtype}, "
          f"{args.documents} packed prefix-LM documents/sample, ALiBi {'on' if args.alibi else 'off'}, "
          f"fwd+bwd, {args.iters} iterations (block mask build: {block_mask_ms:.1f} ms/batch)")
    ref = rows.get("sdpa-dense")
    for name, r in rows.items():
        ratio = f"  {ref['ms'] / r['ms']:5.2f}x speed, {ref['peak_gib'] / max(r['peak_gib'], 1e-9):5.2f}x less memory" if ref else ""
        print(f"  {name:14s} {r['ms']:9.2f} ms  {r['tokens_per_s']:12,.0f} tokens/s  peak {r['peak_gib']:7.3f} GiB  "
              f"max|diff| {r['max_abs_diff_vs_sdpa_dense']:.2e}{ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "tokens": real, "block_mask_ms": block_mask_ms, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
