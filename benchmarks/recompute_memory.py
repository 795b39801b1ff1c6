"""Activation recompute on vs off: activation memory and time per iteration of the same model.

Each setting runs in its own process (one rank, no launcher: megatron-core's GPTModel with a plain
torch AdamW step, so only the model's forward/backward differs). Printed per setting:

* saved-for-backward bytes: the distinct storages (weights excluded) autograd keeps between
  forward and backward for one micro batch (``torch.autograd.graph.saved_tensors_hooks``), the
  memory recompute saves;
* peak RSS growth of the process from the model and optimizer being built to the end of the
  iterations, the same measured by the OS (it includes Adam's moments, equal in every setting);
* ms per iteration (forward + backward + optimizer step): the median of ``--iters``, best of
  ``--repeats`` interleaved rounds.

and the ratios against no recompute. Full recompute keeps only each layer's input and runs every
layer's forward twice (~1.33x compute for fwd+bwd); selective recompute re-runs the core attention
only.

    DS_ACCELERATOR=cpu python benchmarks/recompute_memory.py [--num-layers 8 --hidden-size 512
        --seq-length 1024 --micro-batch-size 4 --iters 5]
"""
import argparse
import json
import os
import subprocess
import sys
import time
from statistics import median

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from memory import peak_rss_bytes, saved_for_backward  # noqa: E402

SETTINGS = {
    "off": [],
    "selective": ["--recompute-granularity", "selective"],
    "full (uniform, 1 layer)": ["--recompute-granularity", "full", "--recompute-method", "uniform",
                                "--recompute-num-layers", "1"],
}


def measure(opts, recompute_flags) -> dict:
    """Run in a fresh process: saved bytes, peak RSS growth and median ms/iteration."""
    sys.path.insert(0, ROOT)
    import torch

    torch.set_num_threads(opts.threads)
    from megatron.runtime.ports import launch_port  # ROOT is on the path from here on

    # this process binds the port at once (a 1-rank group): no retry needed
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(opts.port or launch_port()))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    from megatron.config.arguments import validate_args
    from megatron.config.parser import get_parser
    from megatron.model.gpt_model import build_gpt_model
    from megatron.parallel.cpu_rng import model_parallel_manual_seed

    parallel_state.initialize_model_parallel(1, 1)
    args = validate_args(get_parser().parse_args([
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size), "--train-iters", "1", "--lr", "1e-4",
        "--transformer-impl", "local", *recompute_flags]), 1, require_data=False)
    args.padded_vocab_size = opts.vocab
    model_parallel_manual_seed(1)
    model = build_gpt_model(args.run_config.transformer, args.run_config.model, opts.vocab)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, opts.vocab, (opts.micro_batch_size, opts.seq_length), generator=g)
    position_ids = torch.arange(opts.seq_length).expand_as(tokens)

    def step():
        optimizer.zero_grad(set_to_none=True)
        loss = model(tokens, position_ids, None, labels=tokens).float().mean()
        loss.backward()
        optimizer.step()

    baseline = peak_rss_bytes()  # model and optimizer built, no activations yet
    step()  # warm-up
    optimizer.zero_grad(set_to_none=True)
    with saved_for_backward(model) as saved:
        loss = model(tokens, position_ids, None, labels=tokens).float().mean()
    loss.backward()
    times = []
    for _ in range(opts.iters):
        start = time.perf_counter()
        step()
        times.append(1000.0 * (time.perf_counter() - start))
    return {"saved_bytes": sum(saved.values()), "rss_growth": peak_rss_bytes() - baseline,
            "ms": median(times)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-layers", type=int, default=8)
    parser.add_argument("--hidden-size", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=1024)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=2, help="Interleaved rounds (best kept).")
    parser.add_argument("--port", type=int, default=None,
                        help="the 1-rank groups' port (default: megatron.runtime.ports.launch_port)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.child is not None:
        print(json.dumps(measure(opts, SETTINGS[opts.child])))
        return
    print(f"model: {opts.num_layers} layers x {opts.hidden_size} hidden, seq {opts.seq_length}, "
          f"micro batch {opts.micro_batch_size}, vocab {opts.vocab}, torch threads {opts.threads}")
    results = {}
    for _ in range(opts.repeats):  # settings interleaved; the fastest round of each is kept
        for name in SETTINGS:
            cmd = [sys.executable, os.path.abspath(__file__), *sys.argv[1:], "--child", name]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True,
                                 env=dict(os.environ, DS_ACCELERATOR="cpu")).stdout
            r = json.loads(out.strip().splitlines()[-1])
            if name not in results or r["ms"] < results[name]["ms"]:
                results[name] = r
    off = results["off"]
    for name, r in results.items():
        print(f"recompute {name:24s}: saved for backward {r['saved_bytes'] / 2**20:8.1f} MiB "
              f"({r['saved_bytes'] / off['saved_bytes']:.2f}x), peak RSS growth "
              f"{r['rss_growth'] / 2**20:8.1f} MiB, {r['ms']:8.1f} ms/iteration "
              f"({r['ms'] / off['ms']:.2f}x)")


if __name__ == "__main__":
    main()
