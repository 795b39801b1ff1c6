"""Tokens/s/GPU and model FLOPs utilisation (MFU) of a ~1.3B GPT for several parallel layouts, on
a GPU machine, through the deepspeed launcher and the real training loop (bf16, ZeRO 1).

Layouts (each skipped when the machine has fewer GPUs than it needs; the rest of the GPUs are
data parallel): TP 1; TP 1 + full recompute; TP 2; TP 2 + sequence parallel; PP 2 (DeepSpeed's
pipe engine); TP 2 x PP 2; DeepSpeed-Ulysses SP 2 (``--ds-sequence-parallel-size 2``, the
all-to-all around core attention; for long sequences, e.g. ``--seq-length 8192
--micro-batch-size 1``); a mixture of experts in every layer (``moe-ep1``: ``--num-experts 8``
top-2, expert FFN = hidden, megatron-core's alltoall dispatcher and, where the kernels import,
``--moe-grouped-gemm``; ``moe-ep2``: its experts split over 2 GPUs,
``--expert-model-parallel-size 2``, the rest data parallel as for the others;
megatron/config/moe_flags.py refuses the alltoall dispatcher and grouped GEMM only without CUDA, so
the CPU dry run uses the allgather dispatcher and one GEMM per expert). Per layout: median
tokens/s over the iterations after ``--warmup``
(from the loop's own ``--metrics-jsonl``, one record per iteration, so the first iterations,
which compile the fused kernels and FlexAttention, are not timed), tokens/s/GPU, and MFU = model
FLOPs per token x tokens/s/GPU / peak FLOP/s of the GPU (:data:`PEAK_TFLOPS`, dense bf16).
Model FLOPs per token are Megatron-LM's ``num_floating_point_operations`` (training/training.py)
for this dense GPT: each GEMM counted 3 times (forward, weight and data gradient), 2 FLOPs per
multiply-add, causal attention as half the square, recompute not counted; for MoE layers the
MLP term is the active experts' only, ``moe_router_topk x moe_ffn_hidden_size`` in place of the
dense FFN, as Megatron-LM counts its routed experts (``num_experts_routed_to``; the router's GEMM
is not counted), so MoE and dense MFU compare the work each token needs.

    python benchmarks/gpu/layouts_throughput.py [--gpus N] [--peak-tflops 989] [--iters 20]
        [--warmup 5] [--layouts tp1 tp2 tp2-sp pp2 sp2 moe-ep1 moe-ep2] [--micro-batch-size 4]
        [--num-experts 8 --moe-topk 2 --moe-grouped-gemm auto] [--json F]
    python benchmarks/gpu/layouts_throughput.py --device cpu --tiny   # dry run of the script

The data is the embedded byte-level demo corpus (tools/make_demo_data.py), so the vocabulary is
small (258 padded to 384 x TP); the transformer layers, which dominate, do not depend on it.
"""
import argparse
import importlib
import json
import os
import subprocess
import sys
import tempfile
from statistics import median

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
LAYOUTS = {  # name: (tensor-parallel, pipeline-parallel, Ulysses sequence-parallel, extra flags)
    "tp1": (1, 1, 1, []),
    "tp1-recompute": (1, 1, 1, ["--recompute-granularity", "full", "--recompute-method",
                                "uniform", "--recompute-num-layers", "1"]),
    "tp2": (2, 1, 1, []),
    "tp2-sp": (2, 1, 1, ["--sequence-parallel"]),
    "pp2": (1, 2, 1, []),
    "tp2-pp2": (2, 2, 1, []),
    "sp2": (1, 1, 2, []),
    "moe-ep1": (1, 1, 1, []),  # MoE flags: moe_flags()
    "moe-ep2": (1, 1, 1, ["--expert-model-parallel-size", "2"]),
}
EXPERT_PARALLEL = {"moe-ep2": 2}  # expert-parallel ranks are data-parallel ranks: EP divides DP


def grouped_gemm_kernels():
    """Where ``--moe-grouped-gemm`` has kernels in this environment, what provides them, else None:
    megatron-core builds Transformer Engine's grouped linear (TEGroupedMLP, TE >= 1.9) when TE is
    the transformer implementation (the default where it imports), else (megatron-core 0.16
    only: 0.17 removed it) its legacy GroupedMLP, which needs the ``grouped_gemm`` package."""
    try:
        from megatron.core.extensions.transformer_engine import TEColumnParallelGroupedLinear
    except Exception:  # a TE that is installed but does not import: the run falls back to local
        TEColumnParallelGroupedLinear = None
    if TEColumnParallelGroupedLinear is not None:
        return "Transformer Engine's grouped linear"
    from megatron.runtime.mcore_compat import legacy_grouped_gemm_available

    if not legacy_grouped_gemm_available():  # megatron-core 0.17+: no grouped GEMM without TE
        return None
    try:
        importlib.import_module("grouped_gemm")
    except Exception:
        return None
    return "the grouped_gemm package (legacy GroupedMLP)"


def moe_settings(opts) -> dict:
    """What the moe-* layouts run with here: the dispatcher and grouped GEMM (both need CUDA,
    megatron/config/moe_flags.py; ``--moe-grouped-gemm auto``: on where its kernels import)."""
    if opts.device == "cpu":
        return {"dispatcher": "allgather", "grouped_gemm": False,
                "experts_gemm": "one GEMM per expert (CPU: alltoall and grouped GEMM need CUDA)"}
    kernels = grouped_gemm_kernels() if opts.moe_grouped_gemm != "off" else None
    if opts.moe_grouped_gemm == "on" and kernels is None:
        raise SystemExit("--moe-grouped-gemm on: neither Transformer Engine's grouped linear nor the "
                         "grouped_gemm package imports here; use auto or off")
    return {"dispatcher": opts.moe_dispatcher, "grouped_gemm": kernels is not None,
            "experts_gemm": f"grouped GEMM ({kernels})" if kernels else "one GEMM per expert"}


def moe_flags(opts, name: str):
    """The MoE flags of layout ``name`` (none for the dense layouts)."""
    if not name.startswith("moe"):
        return []
    moe = opts.moe
    return ["--num-experts", str(opts.num_experts), "--moe-router-topk", str(opts.moe_topk),
            "--moe-ffn-hidden-size", str(opts.moe_ffn_hidden_size or opts.hidden_size),
            "--moe-aux-loss-coeff", "0.01", "--moe-router-dtype", "fp32",
            "--moe-token-dispatcher-type", moe["dispatcher"],
            *(["--moe-grouped-gemm"] if moe["grouped_gemm"] else [])]


def gpus_per_replica(name: str) -> int:
    """GPUs one model replica of layout ``name`` spans: TP x PP x Ulysses SP."""
    tp, pp, sp, _ = LAYOUTS[name]
    return tp * pp * sp
# Dense bf16 tensor-core peak per GPU (TFLOP/s, NVIDIA data sheets, no sparsity); the first name
# contained in torch.cuda.get_device_name() wins, so the specific ones come first.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4),
               ("GH200", 989.4), ("H800", 989.4), ("B200", 2250.0), ("A100", 312.0),
               ("L40S", 362.1), ("A10", 125.0))
RAW_VOCAB = 258  # the byte-level tokenizer


def peak_tflops(device_name: str):
    """Dense bf16 peak TFLOP/s of ``device_name`` (:data:`PEAK_TFLOPS`), or None."""
    return next((value for key, value in PEAK_TFLOPS if key in device_name), None)


def padded_vocab(raw: int, divisible_by: int, tp: int) -> int:
    multiple = divisible_by * tp
    return -(-raw // multiple) * multiple


def flops_per_token(layers: int, hidden: int, seq: int, vocab: int, ffn: int = None) -> float:
    """Megatron-LM's model FLOPs of one trained token of a dense GPT with GeLU MLP (``ffn``,
    default 4 x hidden) and full multi-head attention: 3 x 2 x (MLP 2 h ffn + QKV and output
    projections 4 h^2 + causal core attention h s / 2 x 2) per layer + 3 x 2 x h V for the logits."""
    ffn = 4 * hidden if ffn is None else ffn
    per_layer = 2 * hidden * ffn + 4 * hidden * hidden + hidden * seq
    return 6.0 * (layers * per_layer + hidden * vocab)


def validate(opts) -> None:
    """Refuse options that cannot give a measurement."""
    if opts.iters <= opts.warmup:
        raise SystemExit(f"--iters {opts.iters} must exceed --warmup {opts.warmup}: the first "
                         f"{opts.warmup} iterations (kernel compilation) are not timed")
    if opts.warmup < 1:
        raise SystemExit(f"--warmup {opts.warmup}: at least 1, the iteration that compiles the "
                         "fused kernels")
    if opts.num_workers < 0:
        raise SystemExit(f"--num-workers {opts.num_workers} must be non-negative")


def run_layout(opts, name: str, data_prefix: str, work: str):
    """(median tokens/s, tp) of one layout, or None when it does not fit the GPUs or fails."""
    tp, pp, sp, extra = LAYOUTS[name]
    if opts.gpus % gpus_per_replica(name):
        return None
    dp = opts.gpus // gpus_per_replica(name)
    if dp % EXPERT_PARALLEL.get(name, 1):
        return None
    metrics = os.path.join(work, f"{name}.jsonl")
    cpu = opts.device == "cpu"
    flags = [
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size),
        "--global-batch-size", str(opts.micro_batch_size * dp * opts.accumulation),
        "--train-iters", str(opts.iters), "--lr", "1e-4", "--lr-decay-style", "constant",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--zero-stage", "1",
        "--num-workers", str(opts.num_workers),
        "--data-path", data_prefix, "--split", "98,1,1", "--eval-iters", "0",
        "--data-cache-path", os.path.join(work, "cache"), "--log-interval", "1",
        "--metrics-jsonl", metrics, "--tensor-model-parallel-size", str(tp),
        "--pipeline-model-parallel-size", str(pp), "--ds-sequence-parallel-size", str(sp),
        *([] if cpu else ["--bf16"]), *moe_flags(opts, name), *extra]
    from megatron.runtime.ports import launch_with_port_retry  # main() put ROOT on the path

    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    if cpu:
        env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    try:  # a port below the ephemeral range; a launch whose port was taken first runs once more
        proc = launch_with_port_retry(lambda port: subprocess.run(
            [launcher, "--num_gpus", str(opts.gpus), "--master_port", str(port),
             os.path.join(ROOT, "pretrain_gpt.py")] + flags, cwd=ROOT, env=env,
            capture_output=True, text=True, timeout=opts.timeout))
    except subprocess.TimeoutExpired:
        print(f"{name}: timed out after {opts.timeout} s")
        return None
    if proc.returncode:
        print(f"{name}: failed (exit {proc.returncode})\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
        return None
    with open(metrics) as f:
        records = [json.loads(line) for line in f if line.strip() and "split" not in line]
    timed = [r["tokens_per_second"] for r in records if r["iteration"] > opts.warmup]
    return median(timed), tp


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                        help="cuda (the benchmark) or cpu (a dry run of the script, with --tiny)")
    parser.add_argument("--tiny", action="store_true", help="2 layers x 64 hidden, seq 64")
    parser.add_argument("--gpus", type=int, default=None, help="default: every visible GPU (cpu: 1)")
    parser.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--num-layers", type=int, default=24)
    parser.add_argument("--hidden-size", type=int, default=2048)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq-length", type=int, default=2048)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=2,
                        help="DataLoader workers of the training loop (Megatron-LM's default 2)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5, help="first iterations not timed")
    parser.add_argument("--timeout", type=int, default=600, help="seconds per layout run")
    parser.add_argument("--data-mb", type=float, default=5.0, help="demo corpus size (MB)")
    parser.add_argument("--peak-tflops", type=float, default=None,
                        help="Peak dense bf16 TFLOP/s of one GPU (default from its name).")
    parser.add_argument("--num-experts", type=int, default=8, help="moe-* layouts: experts per layer")
    parser.add_argument("--moe-topk", type=int, default=2, help="moe-* layouts: experts per token")
    parser.add_argument("--moe-ffn-hidden-size", type=int, default=None,
                        help="moe-* layouts: each expert's FFN (default --hidden-size)")
    parser.add_argument("--moe-dispatcher", default="alltoall", choices=["alltoall", "allgather"],
                        help="moe-* layouts on GPUs (the CPU dry run uses allgather)")
    parser.add_argument("--moe-grouped-gemm", default="auto", choices=["auto", "on", "off"],
                        help="moe-* layouts on GPUs: the local experts in one grouped GEMM (auto: "
                             "where Transformer Engine's grouped linear or grouped_gemm imports)")
    parser.add_argument("--json", default=None, help="write the results here")
    opts = parser.parse_args(argv)
    if opts.tiny:
        opts.num_layers, opts.hidden_size, opts.heads, opts.seq_length = 2, 64, 4, 64
        opts.micro_batch_size, opts.accumulation = 2, 1
    validate(opts)
    import torch

    if opts.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("no GPU: this benchmark runs on a GPU machine (--device cpu --tiny: dry run)")
        opts.gpus = opts.gpus or torch.cuda.device_count()
        name = torch.cuda.get_device_name(0)
        peak = opts.peak_tflops or peak_tflops(name)
        if peak is None:
            raise SystemExit(f"unknown peak FLOP/s for {name}; pass --peak-tflops")
    else:
        opts.gpus, name, peak = opts.gpus or 1, "CPU (dry run)", opts.peak_tflops
    sys.path.insert(0, ROOT)
    from tools.make_demo_data import make_demo_data

    params = 12 * opts.num_layers * opts.hidden_size ** 2
    print(f"{opts.gpus} x {name} (peak {peak or float('nan'):g} TFLOP/s bf16); model "
          f"{opts.num_layers} layers x {opts.hidden_size} hidden (~{params / 1e9:.2f}B in the "
          f"layers), seq {opts.seq_length}, micro batch {opts.micro_batch_size} x "
          f"{opts.accumulation} accumulation, {opts.num_workers} loader workers, median of "
          f"iterations {opts.warmup + 1}-{opts.iters}")
    opts.moe = None
    if any(layout.startswith("moe") for layout in opts.layouts):
        opts.moe = moe_settings(opts)
        ffn = opts.moe_ffn_hidden_size or opts.hidden_size
        experts = 2 * opts.num_layers * opts.num_experts * opts.hidden_size * ffn
        active = 2 * opts.num_layers * opts.moe_topk * opts.hidden_size * ffn
        attention = 4 * opts.num_layers * opts.hidden_size ** 2
        print(f"moe-*: {opts.num_experts} experts (FFN {ffn}) top-{opts.moe_topk} in every layer, "
              f"{opts.moe['dispatcher']} dispatcher, {opts.moe['experts_gemm']}; "
              f"~{(attention + experts) / 1e9:.2f}B in the layers, "
              f"~{(attention + active) / 1e9:.2f}B active per token (MFU counts these)")
    results = {}
    with tempfile.TemporaryDirectory() as work:
        size_mb = min(opts.data_mb, 0.5) if opts.tiny else opts.data_mb
        data = make_demo_data(os.path.join(work, "demo"), size_mb=size_mb, verbose=False)
        for layout in opts.layouts:
            result = run_layout(opts, layout, data["web"], work)
            if result is None:
                print(f"{layout:14s}: skipped (needs a multiple of "
                      f"{gpus_per_replica(layout) * EXPERT_PARALLEL.get(layout, 1)} GPUs, or failed)")
                continue
            tokens_per_s, tp = result
            per_gpu = tokens_per_s / opts.gpus
            active_ffn = None  # dense: 4 x hidden
            if layout.startswith("moe"):
                active_ffn = opts.moe_topk * (opts.moe_ffn_hidden_size or opts.hidden_size)
            fpt = flops_per_token(opts.num_layers, opts.hidden_size, opts.seq_length,
                                  padded_vocab(RAW_VOCAB, 128, tp), ffn=active_ffn)
            mfu = fpt * per_gpu / (peak * 1e12) if peak else None
            results[layout] = {"tokens_per_s": tokens_per_s, "tokens_per_s_per_gpu": per_gpu,
                               "model_tflops_per_gpu": fpt * per_gpu / 1e12, "mfu": mfu}
            if layout.startswith("moe"):
                results[layout].update(
                    num_experts=opts.num_experts, moe_topk=opts.moe_topk,
                    expert_parallel=EXPERT_PARALLEL.get(layout, 1), **opts.moe)
            print(f"{layout:14s}: {tokens_per_s:10.0f} tokens/s, {per_gpu:9.0f} tokens/s/GPU, "
                  f"{fpt * per_gpu / 1e12:7.1f} model TFLOP/s/GPU, "
                  f"MFU {'n/a' if mfu is None else f'{mfu:6.1%}'}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"device": name, "gpus": opts.gpus, "peak_tflops": peak,
                       "config": vars(opts), "layouts": results}, f, indent=1)
    return 0 if results else 1


if __name__ == "__main__":
    sys.exit(main())
