#!/usr/bin/env python
"""Time and peak memory of the Hugging Face conversions on a ~1B-parameter checkpoint.

    .venv/bin/python benchmarks/checkpoint_conversion.py [--hidden-size 2048 --num-layers 16
        --ffn-hidden-size 5632 --vocab 32000 --tensor-model-parallel-size 2 --dtype bf16]

Writes a Llama-style checkpoint (RoPE, RMSNorm, SwiGLU, untied; ~0.95B parameters at the defaults)
in the training checkpoint format at the given tensor-parallel size, with random weights
(megatron/checkpoint/writer.py, which cuts shards as megatron-core does), then
runs, each in its own process, ``tools/checkpoint/convert_to_hf.py`` (checkpoint -> transformers
directory) and ``tools/checkpoint/convert_from_hf.py`` (back), and reports for each the wall time
and the process's peak resident memory (``wait4`` rusage), against the size of what it reads on
disk. Goal: peak memory below 1.5x the checkpoint. The peak includes the interpreter with torch
imported, measured by a process that only imports the converter (reported as the baseline).
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, ROOT)


def dir_bytes(path: str) -> int:
    """Bytes of all files under ``path``."""
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def run_measured(cmd):
    """(wall seconds, peak RSS bytes) of ``cmd`` run to completion in a child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    out, err = proc.stdout.read().decode(), proc.stderr.read().decode()
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{out[-2000:]}\n{err[-2000:]}")
    return wall, usage.ru_maxrss * 1024  # kilobytes on Linux


def model_record(args) -> dict:
    """The model_args.json record of the benchmark's Llama-style model (``args``: hidden size,
    layers, ffn size, vocabulary)."""
    from megatron.checkpoint.format import MODEL_ARGS_FORMAT_VERSION

    heads = args.hidden_size // 128
    flags = {"num_layers": args.num_layers, "hidden_size": args.hidden_size,
             "ffn_hidden_size": args.ffn_hidden_size, "num_attention_heads": heads,
             "num_query_groups": heads, "kv_channels": 128, "max_position_embeddings": 2048,
             "normalization": "RMSNorm", "norm_epsilon": 1e-5, "swiglu": True, "openai_gelu": False,
             "position_embedding_type": "rope", "rotary_percent": 1.0, "rotary_base": 10000,
             "untie_embeddings_and_output_weights": True, "disable_bias_linear": True,
             "make_vocab_size_divisible_by": 128, "pad_vocab_size_to": None,
             "embed_layernorm": False}
    return {"format_version": MODEL_ARGS_FORMAT_VERSION, "model": flags, "tokenizer": {},
            "defaults": {"seq_length": 2048}, "padded_vocab_size": args.vocab,
            "vocab_size": args.vocab}


def make_checkpoint(directory: str, args) -> int:
    """Write the random-weight checkpoint; returns its parameter count."""
    import torch

    from megatron.checkpoint.hf.families import canonical_shapes
    from megatron.checkpoint.writer import write_checkpoint

    record = model_record(args)
    flags = record["model"]
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    gen = torch.Generator().manual_seed(0)
    tensors = {name: (0.02 * torch.randn(shape, generator=gen)).to(dtype)
               for name, shape in canonical_shapes(flags, args.vocab).items()}
    write_checkpoint(directory, tensors, record, tp=args.tensor_model_parallel_size)
    return sum(t.numel() for t in tensors.values())


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--num-layers", type=int, default=16)
    p.add_argument("--ffn-hidden-size", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--tensor-model-parallel-size", type=int, default=2)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--max-shard-size", default="2GB")
    p.add_argument("--workdir", default=None, help="Scratch directory (default: a temporary one).")
    p.add_argument("--write-checkpoint", default=None, metavar="DIR",
                   help="(internal) only write the checkpoint to DIR and print its parameter count.")
    args = p.parse_args(argv)
    if args.write_checkpoint:
        print(make_checkpoint(args.write_checkpoint, args))
        return
    tmp = tempfile.TemporaryDirectory(dir=args.workdir)
    work = tmp.name
    ckpt, hf, back = (os.path.join(work, d) for d in ("ckpt", "hf", "back"))
    # Every step runs in a child process: this one never imports torch, so the children's peak
    # RSS (which Linux starts from the parent's RSS at fork) is their own.
    t0 = time.perf_counter()
    written = subprocess.run([sys.executable, os.path.abspath(__file__), "--write-checkpoint", ckpt,
                              *[a for a in (argv if argv is not None else sys.argv[1:])]],
                             cwd=ROOT, capture_output=True, text=True, check=True)
    params = int(written.stdout.strip().splitlines()[-1])
    made = time.perf_counter() - t0
    ckpt_bytes = dir_bytes(ckpt)
    py = sys.executable
    tools = os.path.join(ROOT, "tools", "checkpoint")
    _, baseline = run_measured([py, "-c", "import sys; sys.argv=['x']; sys.path.insert(0, 'tools/checkpoint'); "
                                "import convert_to_hf, convert_from_hf; import megatron.checkpoint.reader"])
    export_s, export_rss = run_measured([py, os.path.join(tools, "convert_to_hf.py"), "--load", ckpt,
                                         "--output", hf, "--max-shard-size", args.max_shard_size])
    hf_bytes = dir_bytes(hf)
    import_s, import_rss = run_measured([py, os.path.join(tools, "convert_from_hf.py"), "--hf", hf,
                                         "--save", back])
    gib = 1024 ** 3
    result = {
        "parameters": params, "dtype": args.dtype, "tensor_model_parallel_size":
            args.tensor_model_parallel_size, "checkpoint_gib": ckpt_bytes / gib,
        "hf_gib": hf_bytes / gib, "baseline_rss_gib": baseline / gib,
        "export_s": export_s, "export_peak_rss_gib": export_rss / gib,
        "export_rss_over_checkpoint": export_rss / ckpt_bytes,
        "import_s": import_s, "import_peak_rss_gib": import_rss / gib,
        "import_rss_over_hf": import_rss / hf_bytes, "make_checkpoint_s": made}
    print(f"checkpoint: {params / 1e9:.2f}B parameters, {args.dtype}, TP {args.tensor_model_parallel_size}, "
          f"{ckpt_bytes / gib:.2f} GiB on disk (model weights only); baseline RSS of the interpreter "
          f"with the converters imported {baseline / gib:.2f} GiB")
    print(f"export  convert_to_hf.py  : {export_s:7.1f} s, peak RSS {export_rss / gib:.2f} GiB = "
          f"{export_rss / ckpt_bytes:.2f}x the checkpoint (goal < 1.5x)")
    print(f"import  convert_from_hf.py: {import_s:7.1f} s, peak RSS {import_rss / gib:.2f} GiB = "
          f"{import_rss / hf_bytes:.2f}x the transformers weights ({hf_bytes / gib:.2f} GiB)")
    print(json.dumps(result))
    tmp.cleanup()


if __name__ == "__main__":
    main()
