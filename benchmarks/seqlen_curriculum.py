"""Time per iteration and tokens/s of training at k tokens per sample (the sequence-length
curriculum, megatron/schedules/seqlen.py) against training at the full length S, in the real loop.

``pretrain_gpt.py`` trains the same model and data at k = S/8, S/4, S/2 and S (``--lengths``) in
each mode (``--modes``): ``truncate`` (Microsoft's: each sample keeps its first k tokens, so an
iteration trains global batch x k tokens) and ``split`` (OLMo-core's: each sample is cut into S/k
samples of k tokens, so an iteration trains the same global batch x S tokens in shorter rows).
Per length: the median ms/iteration and tokens/s of the loop's own ``--metrics-jsonl`` records
(one per iteration), the first ``--warmup`` iterations at each length dropped, and their ratio
to the full length S measured in the same run. Two ways to launch (``--launch``):

* ``one-run`` (default): one launch per mode with a ``step`` schedule that visits S and then
  every shorter length for ``--warmup + --iters`` iterations each, ``--rounds`` times over, so S
  is measured in the same process, interleaved with the others (drift on a shared machine hits
  every length alike), and a mode pays one start-up (on a GPU, where every launch compiles,
  benchmarks/gpu/run_all.sh needs that);
* ``per-length``: one launch per (mode, k) with ``--seq-length-schedule '{type: constant, value:
  k, mode: M}'`` and the baseline one launch without a schedule; k = S runs once through the
  constant schedule (the curriculum's wrapper passing full batches through: its row is that
  launch against the baseline); ``--rounds`` > 1 interleaves the launches and pools their timed
  iterations.

Also printed (an estimate, not a measurement): the tokens and time a sequence-length warmup saves
against training at S throughout: Microsoft's ``fixed_linear`` from S/8 to S in steps of 8 over the
first ``--curriculum-iters`` of ``--run-iters`` iterations, its lengths from the project's own
planner (``seq_length_plan``), each iteration's time interpolated (piecewise linear in k) from the
measured ones. It counts the cost of the iterations only: what a short-sequence token is worth to
the loss (the point of the curriculum) is not measured here.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/seqlen_curriculum.py [--seq-length 1024
        --num-layers 4 --hidden-size 256 --micro-batch-size 4 --iters 4 --warmup 1
        --modes truncate split --launch one-run --rounds 2 --json F]
    python benchmarks/seqlen_curriculum.py --device cuda --bf16 ...   # on a GPU
    python benchmarks/seqlen_curriculum.py --tiny                      # smoke run

CPU: 1 rank, 1 thread, through the deepspeed launcher (benchmarks/launch.py); run on an otherwise
idle machine.
"""
import argparse
import json
import os
import signal
import sys
import tempfile
from statistics import median
from typing import Dict, List, Tuple

from launch import ROOT, launch_pretraining

sys.path.insert(0, os.path.join(ROOT, "benchmarks", "gpu"))
from layouts_throughput import RAW_VOCAB, flops_per_token, padded_vocab  # noqa: E402


def model_flags(opts, data_prefix: str, work: str, iterations: int) -> List[str]:
    return [
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size),
        "--global-batch-size", str(opts.micro_batch_size * opts.accumulation),
        "--train-iters", str(iterations), "--lr", "1e-4", "--lr-decay-style", "constant",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--zero-stage", "1",
        *(["--num-workers", str(opts.num_workers)] if opts.num_workers is not None else []),
        "--data-path", data_prefix, "--split", "98,1,1",
        "--eval-iters", "0", "--data-cache-path", os.path.join(work, "cache"),
        "--log-interval", "1", *(["--bf16"] if opts.bf16 else [])]


def timed_records(records: List[dict], warmup: int) -> Dict[int, List[dict]]:
    """Training records by trained length (their ``seq_length``), the first ``warmup`` of each
    stretch of iterations at one length dropped (a new length's first iterations build kernels,
    caches and allocator blocks)."""
    out: Dict[int, List[dict]] = {}
    stretch, previous = 0, None
    for record in records:
        k = int(record["seq_length"])
        stretch = stretch + 1 if k == previous else 1
        previous = k
        if stretch > warmup:
            out.setdefault(k, []).append(record)
    return out


def launch(opts, data_prefix: str, work: str, iterations: int, schedule, name: str) -> List[dict]:
    metrics = os.path.join(work, f"metrics_{len(os.listdir(work))}.jsonl")
    flags = model_flags(opts, data_prefix, work, iterations)
    if schedule is not None:
        flags += ["--seq-length-schedule", schedule]
    return launch_pretraining(flags, 1, metrics, name, device=opts.device, timeout=opts.timeout)


def measure_one_run(opts, data_prefix: str, work: str) -> Dict[Tuple[str, int], List[dict]]:
    """``--launch one-run``: the timed records of every (mode, k), S's under ("baseline-MODE", S)."""
    full, per_phase = opts.seq_length, opts.warmup + opts.iters
    order = [full] + [k for k in opts.lengths if k != full]  # S first, --rounds times over
    points = ", ".join(f"{i * per_phase}: {k}" for i, k in enumerate(order * opts.rounds))
    timed: Dict[Tuple[str, int], List[dict]] = {}
    for mode in opts.modes:
        schedule = f"{{type: step, points: {{{points}}}, mode: {mode}}}"
        records = launch(opts, data_prefix, work, per_phase * len(order) * opts.rounds, schedule,
                         f"{mode}, one run")
        for k, kept in timed_records(records, opts.warmup).items():
            timed[(mode, k) if k != full else (f"baseline-{mode}", full)] = kept
    return timed


def measure_per_length(opts, data_prefix: str, work: str) -> Dict[Tuple[str, int], List[dict]]:
    """``--launch per-length``: the timed records of every (mode, k) (k = S: under the first mode
    only), the launch without a schedule under ("baseline", S); --rounds interleaved rounds."""
    full, per_run = opts.seq_length, opts.warmup + opts.iters
    timed: Dict[Tuple[str, int], List[dict]] = {}
    for _ in range(opts.rounds):
        records = launch(opts, data_prefix, work, per_run, None, "baseline (no schedule)")
        timed.setdefault(("baseline", full), []).extend(timed_records(records, opts.warmup)[full])
        for k in opts.lengths:
            for mode in opts.modes if k != full else opts.modes[:1]:  # k = S: the mode is moot
                schedule = f"{{type: constant, value: {k}, mode: {mode}}}"
                by_length = timed_records(launch(opts, data_prefix, work, per_run, schedule,
                                                 f"{mode}, k = {k}"), opts.warmup)
                if list(by_length) != [k]:
                    raise SystemExit(f"{mode}, k = {k}: the records trained {sorted(by_length)} "
                                     "tokens per sample")
                timed.setdefault((mode, k), []).extend(by_length[k])
    return timed


def summary(records: List[dict], tokens_per_iteration: int) -> dict:
    return {"ms_per_iteration": median(r["ms_per_iteration"] for r in records),
            "tokens_per_second": median(r["tokens_per_second"] for r in records),
            "tokens_per_iteration": tokens_per_iteration, "timed_iterations": len(records)}


def tokens_per_iteration(opts, mode: str, k: int) -> int:
    batch = opts.micro_batch_size * opts.accumulation
    return batch * (k if mode == "truncate" else opts.seq_length)


def model_flops(opts, mode: str, k: int) -> float:
    """Megatron-LM's model FLOPs of one iteration at k tokens per sample (causal attention over k)."""
    vocab = padded_vocab(RAW_VOCAB, 128, 1)
    return flops_per_token(opts.num_layers, opts.hidden_size, k, vocab) * tokens_per_iteration(opts, mode, k)


def results_table(opts, timed) -> Dict[str, Dict[int, dict]]:
    """Per mode, per k: the medians and their ratios to the full length of the same run."""
    full = opts.seq_length
    table: Dict[str, Dict[int, dict]] = {}
    for mode in opts.modes:
        base_key = ("baseline", full) if opts.launch == "per-length" else (f"baseline-{mode}", full)
        base = summary(timed[base_key], tokens_per_iteration(opts, mode, full))
        rows = {}
        for k in opts.lengths:
            key = (mode, k)
            if k == full:  # one run: S's phases; per length: the constant schedule's k = S launch
                key = base_key if opts.launch == "one-run" else (opts.modes[0], full)
            row = summary(timed[key], tokens_per_iteration(opts, mode, k))
            row.update(time_vs_full=row["ms_per_iteration"] / base["ms_per_iteration"],
                       tokens_per_s_vs_full=row["tokens_per_second"] / base["tokens_per_second"],
                       tokens_vs_full=row["tokens_per_iteration"] / base["tokens_per_iteration"],
                       flops_vs_full=model_flops(opts, mode, k) / model_flops(opts, mode, full))
            rows[k] = row
        table[mode] = {"baseline": base, "rows": rows}
    return table


def warmup_estimate(opts, mode: str, ms_per_iteration: Dict[int, float]) -> dict:
    """Tokens and (estimated) time of ``--run-iters`` iterations with Microsoft's linear warmup
    from S/8 over the first ``--curriculum-iters``, against ``--run-iters`` at S, from the
    measured ``ms_per_iteration`` of each k (S's: the baseline's)."""
    import numpy as np

    sys.path.insert(0, ROOT)
    from megatron.schedules.seqlen import seq_length_plan, seq_length_spec
    from megatron.schedules.units import BatchSchedule

    full, batch = opts.seq_length, opts.micro_batch_size * opts.accumulation
    spec = seq_length_spec({"type": "fixed_linear", "min_difficulty": max(full // 8, 1),
                            "max_difficulty": full, "total_curriculum_step": opts.curriculum_iters,
                            "difficulty_step": min(8, max(full // 8, 1)), "mode": mode},
                           "warmup estimate")
    plan = seq_length_plan(spec, BatchSchedule(batch, seq_length=full), opts.run_iters, full)
    lengths = plan.lengths_at(np.arange(opts.run_iters))
    ks = sorted(ms_per_iteration)
    ms = np.interp(lengths, ks, [ms_per_iteration[k] for k in ks])
    ms_full = ms_per_iteration[full]
    trained = int((batch * (lengths if mode == "truncate" else np.full_like(lengths, full))).sum())
    tokens_full = batch * full * opts.run_iters
    same_iterations_s = float(ms.sum()) / 1000
    full_s = ms_full * opts.run_iters / 1000
    # the same tokens as at S: the tokens the warmup did not train, at S's time per token
    same_tokens_s = same_iterations_s + (tokens_full - trained) / (batch * full) * ms_full / 1000
    warm = int(np.flatnonzero(lengths >= full)[0]) if (lengths >= full).any() else opts.run_iters
    return {"spec": spec.to_dict(), "run_iterations": opts.run_iters, "warmup_iterations": warm,
            "tokens": trained, "tokens_full": tokens_full, "seconds_same_iterations": same_iterations_s,
            "seconds_same_tokens": same_tokens_s, "seconds_full": full_s,
            "warmup_seconds": float(ms[:warm].sum()) / 1000, "warmup_seconds_full": ms_full * warm / 1000,
            "warmup_tokens": int((batch * (lengths[:warm] if mode == "truncate"
                                           else np.full(warm, full))).sum()),
            "warmup_tokens_full": batch * full * warm}


def print_results(opts, table, estimates) -> None:
    full = opts.seq_length
    for mode, entry in table.items():
        base = entry["baseline"]
        what = ("k tokens of each sample: fewer tokens per iteration" if mode == "truncate"
                else "each sample cut into S/k rows of k: the same tokens per iteration")
        print(f"\n{mode} ({what}); S = {full}: {base['ms_per_iteration']:.1f} ms/iteration, "
              f"{base['tokens_per_second']:,.0f} tokens/s")
        print(f"{'k':>6} {'tokens/it':>9} {'ms/it':>8} {'time vs S':>9} {'tokens/s':>9} "
              f"{'tokens/s vs S':>13} {'tokens vs S':>11} {'model FLOPs vs S':>16}")
        for k, r in entry["rows"].items():
            label = f"{k}*" if k == full and opts.launch == "per-length" else f"{k}"
            print(f"{label:>6} {r['tokens_per_iteration']:>9,} {r['ms_per_iteration']:>8.1f} "
                  f"{r['time_vs_full']:>8.2f}x {r['tokens_per_second']:>9,.0f} "
                  f"{r['tokens_per_s_vs_full']:>12.2f}x {r['tokens_vs_full']:>10.3f}x "
                  f"{r['flops_vs_full']:>15.3f}x")
    if opts.launch == "per-length":
        print("\n* k = S through the constant schedule (the curriculum's wrapper) against the launch "
              "without a schedule")
    for mode, e in estimates.items():
        print(f"\nestimate, {mode}: {e['run_iterations']} iterations with DeepSpeed's fixed_linear "
              f"from {e['spec']['min_difficulty']} to {full} (difficulty_step "
              f"{e['spec']['difficulty_step']}) over the first {e['spec']['total_curriculum_step']} "
              f"(S from iteration {e['warmup_iterations'] + 1}), times from the measured lengths:")
        print(f"  warmup iterations: {e['warmup_tokens']:,} tokens ({e['warmup_tokens'] / e['warmup_tokens_full']:.2f}x "
              f"S's {e['warmup_tokens_full']:,}) in {e['warmup_seconds']:.1f} s "
              f"({e['warmup_seconds'] / e['warmup_seconds_full']:.2f}x S's {e['warmup_seconds_full']:.1f} s)")
        print(f"  whole run, same iterations: {e['tokens'] / e['tokens_full']:.3f}x the tokens in "
              f"{e['seconds_same_iterations'] / e['seconds_full']:.3f}x the time "
              f"({e['seconds_same_iterations']:.0f} s against {e['seconds_full']:.0f} s)")
        if mode == "truncate":
            print(f"  whole run, same tokens (the missing tokens trained at S): "
                  f"{e['seconds_same_tokens'] / e['seconds_full']:.3f}x the time "
                  f"({e['seconds_same_tokens']:.0f} s)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--tiny", action="store_true",
                        help="smoke run: 2 layers x 64 hidden, seq 64, 2 timed iterations")
    parser.add_argument("--num-layers", type=int, default=4)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=1024, help="S")
    parser.add_argument("--lengths", type=int, nargs="+", default=None,
                        help="k to measure (default S/8 S/4 S/2 S; S is always measured)")
    parser.add_argument("--modes", nargs="+", default=["truncate", "split"], choices=["truncate", "split"])
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--accumulation", type=int, default=1)
    parser.add_argument("--bf16", action="store_true")
    parser.add_argument("--num-workers", type=int, default=None,
                        help="DataLoader workers (default: pretrain_gpt.py's)")
    parser.add_argument("--iters", type=int, default=4, help="timed iterations per length and round")
    parser.add_argument("--warmup", type=int, default=1,
                        help="iterations dropped at the start of each stretch at one length")
    parser.add_argument("--launch", default="one-run", choices=["one-run", "per-length"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=None, help="seconds per launch")
    parser.add_argument("--curriculum-iters", type=int, default=2000,
                        help="estimate: the linear warmup's total_curriculum_step")
    parser.add_argument("--run-iters", type=int, default=10000, help="estimate: the run's iterations")
    parser.add_argument("--data-mb", type=float, default=1.0, help="demo corpus size (MB)")
    parser.add_argument("--json", default=None, help="write the results here")
    opts = parser.parse_args(argv)
    # a SIGTERM (benchmarks/gpu/run_all.sh's `timeout`) unwinds: the launch in flight ends its ranks
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if opts.tiny:
        opts.num_layers, opts.hidden_size, opts.heads, opts.seq_length = 2, 64, 4, 64
        opts.micro_batch_size, opts.accumulation, opts.iters, opts.warmup = 2, 1, 2, 1
        opts.lengths, opts.data_mb = None, min(opts.data_mb, 0.5)
    full = opts.seq_length
    opts.lengths = sorted(set(opts.lengths or [full // 8, full // 4, full // 2]) | {full})
    bad = [k for k in opts.lengths if k < 1 or k > full or ("split" in opts.modes and full % k)]
    if bad:
        raise SystemExit(f"--lengths {bad}: each k is in 1..S and, in split mode, divides S = {full}")
    if opts.iters < 1 or opts.warmup < 0:
        raise SystemExit("--iters >= 1 and --warmup >= 0")
    if opts.device == "cpu" and opts.bf16:
        raise SystemExit("--bf16 is for --device cuda")
    device = "CPU, 1 rank, 1 thread" if opts.device == "cpu" else "GPU"
    if opts.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: no GPU here (--device cpu measures on the CPU)")
        device = f"1 x {torch.cuda.get_device_name(0)}"
    sys.path.insert(0, ROOT)
    from tools.make_demo_data import make_demo_data

    params = 12 * opts.num_layers * opts.hidden_size ** 2
    print(f"{device}: {opts.num_layers} layers x {opts.hidden_size} hidden (~{params / 1e6:.1f}M in the "
          f"layers), {opts.heads} heads, S = {full}, micro batch {opts.micro_batch_size} x "
          f"{opts.accumulation} accumulation{', bf16' if opts.bf16 else ''}; k = "
          f"{', '.join(map(str, opts.lengths))}; launch {opts.launch}, {opts.rounds} round(s); "
          f"median of {opts.iters} iterations per length and round after {opts.warmup} dropped")
    with tempfile.TemporaryDirectory() as work:
        data = make_demo_data(os.path.join(work, "demo"), size_mb=opts.data_mb, verbose=False)["web"]
        runs = os.path.join(work, "runs")
        os.makedirs(runs)
        timed = (measure_one_run if opts.launch == "one-run" else measure_per_length)(opts, data, runs)
    table = results_table(opts, timed)
    estimates = {}
    for mode, entry in table.items():
        ms = {k: r["ms_per_iteration"] for k, r in entry["rows"].items()}
        ms[full] = entry["baseline"]["ms_per_iteration"]
        estimates[mode] = warmup_estimate(opts, mode, ms)
    print_results(opts, table, estimates)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"device": device, "config": vars(opts), "modes": table,
                       "warmup_estimate": estimates}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
