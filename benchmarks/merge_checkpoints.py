#!/usr/bin/env python
"""Time and peak memory of merging checkpoints of a ~1B-parameter model
(tools/checkpoint/merge_checkpoints.py), against the size of one checkpoint.

    .venv/bin/python benchmarks/merge_checkpoints.py [--checkpoints 4 --hidden-size 2048
        --num-layers 16 --ffn-hidden-size 5632 --vocab 32000 --dtype bf16
        --tensor-model-parallel-size 2 --target-tensor-parallel-size 1 --workdir DIR]

Writes ``--checkpoints`` Llama-style checkpoints (RoPE, RMSNorm, SwiGLU, untied; ~0.95B
parameters at the defaults) with random weights at the given tensor-parallel size, each by the
streaming writer (megatron/checkpoint/writer.py) in its own process, then merges them with equal
weights in a child process and reports its wall time and peak resident memory (``wait4`` rusage;
it includes the interpreter with torch and DeepSpeed imported, measured alone as the baseline),
the size of one checkpoint on disk and the ratio peak RSS / checkpoint size (the goal: well below
1, the merge holds about one full tensor, not a model). Disk: ``--checkpoints + 1`` checkpoints
(about 9.5 GB at the defaults in bf16, twice that in fp32); check ``df -h`` of ``--workdir``
first. The sources are usually still in the page cache when the merge reads them (a freshly
written run's are too).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, ROOT)

from benchmarks.checkpoint_conversion import dir_bytes, model_record  # noqa: E402


def run_with_rusage(cmd):
    """(wall seconds, peak RSS bytes, stdout) of ``cmd``; the child's own rusage via ``wait4``."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        err.seek(0)
        text, errors = out.read().decode(), err.read().decode()
    if status != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{text[-2000:]}\n{errors[-2000:]}")
    return wall, usage.ru_maxrss * 1024, text  # kilobytes on Linux


def write_source(directory: str, iteration: int, args) -> int:
    """Write the random-weight checkpoint of ``iteration`` (streamed, one tensor in memory at a
    time); returns its parameter count."""
    import torch

    from megatron.checkpoint.hf.families import canonical_shapes
    from megatron.checkpoint.writer import write_checkpoint

    record = model_record(args)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    shapes = canonical_shapes(record["model"], args.vocab)
    gen = torch.Generator().manual_seed(iteration)

    def tensors():
        for name, shape in shapes.items():
            yield name, (0.02 * torch.randn(shape, generator=gen)).to(dtype)

    training = {"checkpoint_version": 1, "iteration": iteration, "consumed_samples": iteration,
                "extra": {}}
    write_checkpoint(directory, tensors(), record, tp=args.tensor_model_parallel_size,
                     iteration=iteration, shapes={n: (s, dtype) for n, s in shapes.items()},
                     training_state=training)
    return sum(torch.Size(s).numel() for s in shapes.values())


def largest_tensor_bytes(args) -> int:
    from megatron.checkpoint.hf.families import canonical_shapes

    itemsize = {"bf16": 2, "fp32": 4}[args.dtype]
    shapes = canonical_shapes(model_record(args)["model"], args.vocab).values()
    return max(math.prod(s) for s in shapes) * itemsize


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoints", type=int, default=4)
    p.add_argument("--every", type=int, default=1000, help="Iterations between the checkpoints.")
    p.add_argument("--hidden-size", type=int, default=2048)
    p.add_argument("--num-layers", type=int, default=16)
    p.add_argument("--ffn-hidden-size", type=int, default=5632)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--tensor-model-parallel-size", type=int, default=2,
                   help="Tensor-parallel size of the sources' files.")
    p.add_argument("--target-tensor-parallel-size", type=int, default=1,
                   help="Tensor-parallel size of the merged checkpoint's files.")
    p.add_argument("--workdir", default=None, help="Scratch directory (default: a temporary one).")
    p.add_argument("--write-source", nargs=2, default=None, metavar=("DIR", "ITERATION"),
                   help="(internal) only write one source checkpoint, print its parameters.")
    args = p.parse_args(argv)
    if args.write_source:
        print(write_source(args.write_source[0], int(args.write_source[1]), args))
        return
    tmp = tempfile.TemporaryDirectory(dir=args.workdir)
    work = tmp.name
    load, out = os.path.join(work, "run"), os.path.join(work, "merged")
    own = list(argv if argv is not None else sys.argv[1:])
    iterations = [(i + 1) * args.every for i in range(args.checkpoints)]
    # Every step runs in a child process (this one never imports torch), so each child's peak RSS
    # is its own.
    made = time.perf_counter()
    params = 0
    for it in iterations:
        _, _, text = run_with_rusage([sys.executable, os.path.abspath(__file__), *own,
                                      "--write-source", load, str(it)])
        params = int(text.strip().splitlines()[-1])
    made = time.perf_counter() - made
    one = dir_bytes(os.path.join(load, f"iter_{iterations[0]:07d}"))
    py = sys.executable
    _, baseline, _ = run_with_rusage([
        py, "-c", "import sys; sys.path.insert(0, '.'); import megatron.checkpoint.merge, "
        "megatron.checkpoint.writer, megatron.checkpoint.reader, megatron.checkpoint.engine, "
        "deepspeed"])
    seconds, peak, text = run_with_rusage([
        py, os.path.join(ROOT, "tools", "checkpoint", "merge_checkpoints.py"), "--load", load,
        "--iterations", *map(str, iterations), "--weights", *["1"] * len(iterations),
        "--save", out, "--target-tensor-parallel-size", str(args.target_tensor_parallel_size)])
    merged_bytes = dir_bytes(out)
    largest = largest_tensor_bytes(args)
    gib = 1024 ** 3
    result = {"parameters": params, "dtype": args.dtype, "checkpoints": args.checkpoints,
              "source_tensor_model_parallel_size": args.tensor_model_parallel_size,
              "target_tensor_model_parallel_size": args.target_tensor_parallel_size,
              "checkpoint_gib": one / gib, "merged_gib": merged_bytes / gib,
              "largest_tensor_gib": largest / gib, "baseline_rss_gib": baseline / gib,
              "merge_s": seconds, "merge_peak_rss_gib": peak / gib,
              "peak_rss_over_checkpoint": peak / one,
              "rss_above_baseline_over_largest_tensor": (peak - baseline) / largest,
              "write_sources_s": made}
    print(text.strip().splitlines()[-1])
    print(f"sources: {args.checkpoints} checkpoints of {params / 1e9:.2f}B parameters, "
          f"{args.dtype}, TP {args.tensor_model_parallel_size}, {one / gib:.2f} GiB each on disk "
          f"(written in {made:.0f} s); largest tensor {largest / gib:.3f} GiB; interpreter "
          f"baseline RSS {baseline / gib:.2f} GiB")
    print(f"merge: {seconds:.1f} s, peak RSS {peak / gib:.2f} GiB = {peak / one:.3f}x one "
          f"checkpoint ({(peak - baseline) / largest:.1f}x the largest tensor above the "
          f"baseline); merged checkpoint TP {args.target_tensor_parallel_size}, "
          f"{merged_bytes / gib:.2f} GiB")
    print(json.dumps(result))
    tmp.cleanup()


if __name__ == "__main__":
    main()
