"""The adaptive data mixer's policies against the static and the stratified mix (issue 46 item 5):
the final per-dataset validation loss of the same tiny GPT trained for the same iterations (the
same training tokens) on the demo corpus (web, code, math) under each data mix, over several seeds.

Methods (``--methods``), each a ``--data-blend-config`` over the corpus's training splits
(``"0:0.95"`` of each dataset):

* ``static``: the blend's weights throughout (``--weights``, web 1, code 1, math 2 by default);
* ``stratified``: equal weights (uniform over the datasets) throughout;
* ``odm``, ``ado``, ``loss_softmax``: the adaptive mixer (docs/curriculum.md, "A mixture that
  learns") starting from the static weights, an update every ``--interval`` iterations, floor
  ``--floor``, every other key at the policy's default.

Every run (one per method and seed, ``--seeds``; the seed sets the initialisation and the data
order) trains ``pretrain_gpt.py`` as one plain process on 1 CPU thread for ``--iters`` iterations
and evaluates at the end only: ``--eval-iters`` global batches of each held-out split
(``"0.95:1"`` of web, code and math, one validation group each; the same samples for every
run). Printed: per method the final validation loss of each group and their unweighted average,
mean ± sample standard deviation over the seeds, the compute (training tokens, model FLOPs,
wall seconds of the process and of the training loop; an untimed 2-iteration run goes first) and, for the mixer runs, the last weights
the mixer set and the share of training samples each dataset gave. The runs go seed by seed,
each seed through every method, so a drift in the machine's load touches every method alike.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/mixer_comparison.py [--iters 500 --seeds 1 2 3
        --methods static stratified odm ado loss_softmax --weights 1 1 2 --interval 10
        --floor 0.05 --size-mb 2 --work runs/mixer_comparison --json F]
    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/mixer_comparison.py --tiny   # smoke run

The corpus (``tools/make_demo_data.py --size-mb``) is made in ``--work``/data, or reused when it
is there with the same size. Run on an otherwise idle machine for the times; the losses do not
depend on it.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time
from statistics import mean, stdev
from typing import Dict, List, Sequence

from launch import ROOT

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
from layouts_throughput import RAW_VOCAB, flops_per_token, padded_vocab  # noqa: E402

from megatron.runtime.ports import launch_with_port_retry  # noqa: E402

DATASETS = ("web", "code", "math")
POLICIES = ("odm", "ado", "loss_softmax")
METHODS = ("static", "stratified") + POLICIES


def blend_yaml(data: Dict[str, str], method: str, weights: Sequence[float], interval: int,
               floor: float) -> str:
    """The ``--data-blend-config`` text of ``method``: the training blend over each dataset's
    ``0:0.95`` split (``weights`` in the order of :data:`DATASETS`; equal weights for
    ``stratified``), a ``mixer`` for a policy, and one validation group per dataset (its
    ``0.95:1`` split, named after it)."""
    if method not in METHODS:
        raise SystemExit(f"unknown method {method!r}: one of {', '.join(METHODS)}")
    used = [1.0] * len(DATASETS) if method == "stratified" else list(weights)
    lines = ["train:", "  blend:"]
    lines += [f'    - {{path: {data[name]}, split: "0:0.95", weight: {w}}}'
              for name, w in zip(DATASETS, used, strict=True)]
    if method in POLICIES:
        lines.append(f"  mixer: {{policy: {method}, interval: {interval}, floor: {floor}}}")
    lines.append("valid:")
    lines += [f'  - {{name: {name}, path: {data[name]}, split: "0.95:1"}}' for name in DATASETS]
    return "\n".join(lines) + "\n"


def training_flags(opts, blend: str, seed: int, run_dir: str, cache: str) -> List[str]:
    """``pretrain_gpt.py`` flags of one run: the tiny GPT, ``opts.iters`` iterations with a
    cosine LR after a warmup, one evaluation of every group at the end (``--eval-interval`` =
    ``--train-iters``: evaluation window 0 of each group, the same samples in every run)."""
    return [
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size),
        "--global-batch-size", str(opts.global_batch_size), "--train-iters", str(opts.iters),
        "--lr", str(opts.lr), "--min-lr", str(opts.lr / 10), "--lr-decay-style", "cosine",
        "--lr-warmup-iters", str(max(opts.iters // 10, 1)),
        "--weight-decay", "0.01", "--clip-grad", "1.0",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", str(seed),
        "--data-blend-config", blend, "--data-cache-path", cache,
        "--eval-iters", str(opts.eval_iters), "--eval-interval", str(opts.iters),
        "--log-interval", "1", "--metrics-jsonl", os.path.join(run_dir, "metrics.jsonl")]


def run_single_process(flags: List[str], log_path: str, timeout: float) -> float:
    """Run ``pretrain_gpt.py FLAGS`` as one plain process (rank 0 of 1, gloo on a free port,
    retried once on another if a launch loses it; 1 OpenMP thread, CPU), its output in
    ``log_path``; returns the wall seconds of the launch that trained. Exits with the log's tail
    when it fails."""
    env_base = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", DS_ACCELERATOR="cpu",
                    MASTER_ADDR="127.0.0.1", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
                    PYTHONUNBUFFERED="1", TORCHDYNAMO_DISABLE="1")
    cmd = [sys.executable, os.path.join(ROOT, "pretrain_gpt.py")] + flags
    seconds = []

    def launch(port: int) -> subprocess.CompletedProcess:
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=dict(env_base, MASTER_PORT=str(port)),
                              capture_output=True, text=True, timeout=timeout)
        seconds.append(time.perf_counter() - start)
        return proc

    proc = launch_with_port_retry(launch)
    with open(log_path, "w") as f:
        f.write(proc.stdout + proc.stderr)
    if proc.returncode:
        raise SystemExit(f"run failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{(proc.stdout + proc.stderr)[-4000:]}")
    return seconds[-1]


def read_run(metrics_path: str, iters: int) -> Dict:
    """What one run's ``--metrics-jsonl`` gives: ``valid`` (each group's final validation loss,
    nats per token), ``train_seconds`` (the training loop's wall seconds: the sum over the
    iterations of their ``ms_per_iteration``), ``samples_drawn`` (each dataset's training samples
    at the end) and ``mixer_weights`` (the weights the last record carries: the last update's,
    or the file's)."""
    with open(metrics_path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    train = [r for r in records if "split" not in r]
    valid = {r["group"]: r["lm_loss"] for r in records
             if r.get("split") == "valid" and r["iteration"] == iters}
    if len(train) != iters or set(valid) != set(DATASETS):
        raise SystemExit(f"{metrics_path}: {len(train)} training records (want {iters}), "
                         f"validation groups {sorted(valid)}")
    last = train[-1]
    return {"valid": valid, "train_seconds": sum(r["ms_per_iteration"] for r in train) / 1000.0,
            "samples_drawn": last.get("samples_drawn", {}),
            "mixer_weights": last.get("mixer_weights", {})}


def mean_sd(values: Sequence[float]) -> str:
    """``mean ± sd`` of ``values`` (the sample standard deviation; 0 for a single value)."""
    sd = stdev(values) if len(values) > 1 else 0.0
    return f"{mean(values):.4f} ± {sd:.4f}"


def summarise(results: Dict[str, List[Dict]], tokens: int, flops: float) -> str:
    """The printed table: per method the final validation loss of each group and their average
    (mean ± sd over the seeds), the compute and, per method, the mean of the last mixer weights
    and of each dataset's share of the training samples."""
    seeds = len(next(iter(results.values())))
    header = ["method"] + [f"valid {d}" for d in DATASETS] + ["average", "wall s", "train s"]
    rows = []
    for method, runs in results.items():
        per = [[r["valid"][d] for r in runs] for d in DATASETS]
        avg = [mean(r["valid"][d] for d in DATASETS) for r in runs]
        rows.append([method] + [mean_sd(v) for v in per] + [mean_sd(avg),
                    f"{mean(r['wall_seconds'] for r in runs):.1f}",
                    f"{mean(r['train_seconds'] for r in runs):.1f}"])
    out = [f"final validation loss (nats/token), mean ± sd over {seeds} seeds; wall s: the "
           f"process, train s: the training loop, means per run",
           "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    out.append("")
    out.append(f"compute per run (every method alike): {tokens:,} training tokens, "
               f"{flops:.3g} model FLOPs")
    out.append("")
    out.append("| method | last weights " + " ".join(DATASETS) + " | training samples "
               + " ".join(DATASETS) + " |")
    out.append("|---|---|---|")
    for method, runs in results.items():
        weights = " ".join(
            f"{mean(r['mixer_weights'][d] for r in runs):.3f}" for d in DATASETS
        ) if all(r["mixer_weights"] for r in runs) else "(no mixer)"
        total = [sum(r["samples_drawn"].values()) or math.nan for r in runs]
        shares = " ".join(
            f"{mean(r['samples_drawn'].get(d, math.nan) / t for r, t in zip(runs, total, strict=True)):.3f}"
            for d in DATASETS)
        out.append(f"| {method} | {weights} | {shares} |")
    return "\n".join(out)


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    p.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    p.add_argument("--weights", nargs=3, type=float, default=[1.0, 1.0, 2.0],
                   help="the static blend's weights of web, code, math (the mixers' start)")
    p.add_argument("--interval", type=int, default=10, help="iterations between mixer updates")
    p.add_argument("--floor", type=float, default=0.05)
    p.add_argument("--iters", type=int, default=500)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-length", type=int, default=128)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--global-batch-size", type=int, default=16)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-iters", type=int, default=50,
                   help="global batches per validation group in the final evaluation")
    p.add_argument("--size-mb", type=float, default=2.0, help="demo corpus MiB per dataset")
    p.add_argument("--work", default=os.path.join(ROOT, "runs", "mixer_comparison"))
    p.add_argument("--timeout", type=float, default=900, help="seconds per run")
    p.add_argument("--json", help="also write every run's figures here")
    p.add_argument("--tiny", action="store_true", help="smoke run: 1 seed, 20 iterations")
    opts = p.parse_args(argv)
    if opts.tiny:
        opts.seeds, opts.iters, opts.eval_iters, opts.interval = opts.seeds[:1], 20, 2, 5
    return opts


def main(argv=None) -> None:
    opts = parse(argv)
    sys.path.insert(0, ROOT)
    from tools.make_demo_data import make_demo_data

    data = make_demo_data(os.path.join(opts.work, "data"), size_mb=opts.size_mb, verbose=False)
    cache = os.path.join(opts.work, "cache")
    tokens = opts.iters * opts.global_batch_size * opts.seq_length
    flops = tokens * flops_per_token(opts.num_layers, opts.hidden_size, opts.seq_length,
                                     padded_vocab(RAW_VOCAB, 128, 1))
    weights = dict(zip(DATASETS, opts.weights, strict=True))
    print(f"CPU, 1 process, 1 thread: {opts.num_layers} layers x {opts.hidden_size} hidden, "
          f"{opts.heads} heads, seq {opts.seq_length}, global batch {opts.global_batch_size} "
          f"(micro {opts.micro_batch_size}), {opts.iters} iterations, lr {opts.lr} cosine; demo "
          f"corpus {opts.size_mb} MiB per dataset; static weights {weights}; mixers every "
          f"{opts.interval} iterations, floor {opts.floor}; final evaluation {opts.eval_iters} "
          f"global batches per group; seeds {opts.seeds}", flush=True)
    # untimed: the first process of a checkout compiles its .pyc files and DeepSpeed's CPU op
    warm = argparse.Namespace(**dict(vars(opts), iters=2, eval_iters=1))
    warm_dir = os.path.join(opts.work, "runs", "warmup")
    os.makedirs(warm_dir, exist_ok=True)
    warm_blend = os.path.join(warm_dir, "blend.yaml")
    with open(warm_blend, "w") as f:
        f.write(blend_yaml(data, "static", opts.weights, opts.interval, opts.floor))
    run_single_process(training_flags(warm, warm_blend, 0, warm_dir, cache),
                       os.path.join(warm_dir, "log.txt"), opts.timeout)
    results: Dict[str, List[Dict]] = {m: [] for m in opts.methods}
    start = time.perf_counter()
    for seed in opts.seeds:
        for method in opts.methods:
            run_dir = os.path.join(opts.work, "runs", f"{method}_seed{seed}")
            os.makedirs(run_dir, exist_ok=True)
            metrics = os.path.join(run_dir, "metrics.jsonl")
            if os.path.exists(metrics):
                os.remove(metrics)
            blend = os.path.join(run_dir, "blend.yaml")
            with open(blend, "w") as f:
                f.write(blend_yaml(data, method, opts.weights, opts.interval, opts.floor))
            wall = run_single_process(training_flags(opts, blend, seed, run_dir, cache),
                                      os.path.join(run_dir, "log.txt"), opts.timeout)
            run = dict(read_run(metrics, opts.iters), wall_seconds=wall, seed=seed)
            results[method].append(run)
            losses = " ".join(f"{d} {run['valid'][d]:.4f}" for d in DATASETS)
            print(f"seed {seed} {method:>12}: {losses}, {wall:.1f} s "
                  f"({time.perf_counter() - start:.0f} s so far)", flush=True)
    print()
    print(summarise(results, tokens, flops))
    print(f"\n{sum(len(r) for r in results.values())} runs in {time.perf_counter() - start:.0f} s")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"options": vars(opts), "tokens": tokens, "flops": flops,
                       "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
