"""The adaptive data mixer's overhead in the training loop (issue 46 item 6: "under 1% of the step
time"), against the same run without a mixer, in one invocation.

``pretrain_gpt.py`` (1 CPU rank, 1 thread, a plain process as the launcher starts a rank) trains
the same model on a blend of the demo corpus' three datasets (web 1, code 1, math 2, as in
docs/curriculum.md) in each arm: ``static`` (the blend file without a mixer) and one arm per
``--policies`` (the same blend plus ``mixer: {policy: P, interval: K, floor: 0.05}``), the arms
interleaved over ``--rounds`` rounds (drift on a shared machine hits every arm alike).

Two figures, from the same runs:

(a) **End to end**: ms per iteration of each arm, the mean of the loop's own ``--metrics-jsonl``
    records (one per iteration) after the first ``--warmup``, the update iterations included
    (the first batch of a fresh loader is in the record of the iteration after an update); the
    ratio to the static arm, best and median over the rounds. On a shared 2-core machine the
    round-to-round noise is about the size of the goal, so this is the cross-check;
(b) **the mixer's own time**: the benchmark's rank wraps, in its own process only (nothing in
    megatron/ changes), what the loop does for the mixer (megatron/train/loop.py ``train``):
    building it (``loop_mixer``), each micro batch's losses added to the mixer's sums on the
    device (``TeeStats``' second accumulator, megatron/train/mixer_sums.py),
    ``LoopMixer.end_iteration`` (within an interval: a check; at an update: the all-reduce of
    the interval's sums ``LoopMixer.fold``, the policy, the new ledger phase
    ``TrainMix.append_mixer_segment`` and the rest), the log record's weights
    (``TrainMix.mixer_weights``) and the loader restart (with loader workers the same workers
    follow the new phase: ``MixerLoader.segment``, megatron/train/mixer_loader.py; without, a
    fresh ``_loader``; then the first two iterations of batches beyond the run's steady median:
    the workers' build of the new phase and their unprefetched first batches), as a fraction of
    the time of ``train()``
    itself (the whole training loop of that run, its first iterations included). That fraction
    is the overhead the goal speaks of; the wrappers (a few microseconds per iteration) are in
    every arm, the static one included. What the wrappers cannot see (the fork's copy-on-write
    faults in the training step after the new workers start, say) the cross-check shows: the
    records of each update iteration and the next two beyond the run's median iteration (the
    median over the updates), against the static arm's same iterations.

A run of ``--iters`` has fewer updates per iteration than a long one (none at its last
iteration), so the report also gives a long run's share: the per-iteration cost plus one
update's cost / ``--interval``, over the median iteration, once with the timed parts of an
update and once with the records' excess in their place.

The phase a mixer update builds indexes the samples left in the run (``--planned-iters``, by
default ``--iters``: the run ends at its last iteration); ``--planned-iters P`` plans a longer run
and stops it after ``--iters`` with ``--exit-interval`` (no checkpoint), so an update's phase build
is timed at the size of a long run's index.

    DS_ACCELERATOR=cpu .venv/bin/python benchmarks/mixer_overhead.py [--iters 200 --interval 50
        --num-layers 2 --hidden-size 256 --seq-length 256 --micro-batch-size 4
        --global-batch-size 4 --num-workers 2 --policies odm loss_softmax --rounds 2 --warmup 5
        --planned-iters N --json F]
    .venv/bin/python benchmarks/mixer_overhead.py --tiny          # smoke run (~1 minute)

Run on an otherwise idle machine: the figures are wall-clock.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from statistics import median
from typing import Callable, Dict, List, Optional

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

STATIC = "static"
BLEND = """\
train:
  blend:
    - {{path: {web}, weight: 1}}
    - {{path: {code}, weight: 1}}
    - {{path: {math}, weight: 2}}
"""
# the mixer's parts (b) adds up, in the order printed: (timer, what it is)
PER_ITERATION = (("accumulate", "losses into the mixer's sums (its micro batches)"),
                 ("add", "end_iteration within an interval"),
                 ("log_weights", "the log record's mixer weights"))
PER_UPDATE = (("reduce", "the all-reduce of the interval's sums (LoopMixer.fold)"),
              ("policy", "the policy (update_weights)"),
              ("phase_build", "the new ledger phase (append_mixer_segment)"),
              ("update_rest", "the rest of end_iteration at an update"),
              ("loader_create", "the loader's restart (MixerLoader.segment: the new phase "
                                "sent to the workers, the iteration restarted on them)"),
              ("first_batches", "the first batches after the restart beyond the steady median"))
AFTER_UPDATE = 2  # iterations after an update whose records the cross-check of (b) adds


# ------------------------------------------------------------------------------ the rank's side
class Timers:
    """Seconds spent in each wrapped call, by name, and one record per loader the loop made."""

    def __init__(self):
        self.seconds: Dict[str, List[float]] = {}
        self.loaders: List[dict] = []

    def add(self, name: str, seconds: float) -> None:
        """Record one call of ``name`` that took ``seconds``."""
        self.seconds.setdefault(name, []).append(seconds)

    def wrap(self, name: str, fn: Callable) -> Callable:
        """``fn``, each call's wall time (seconds) recorded under ``name``."""
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.add(name, time.perf_counter() - start)
        return timed


class TimedIterator:
    """The loop's loader iterator, each ``next`` timed (seconds, into ``record["nexts"]``)."""

    def __init__(self, inner, record: dict):
        self.inner, self.record = inner, record

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self.inner)
        finally:
            self.record["nexts"].append(time.perf_counter() - start)


def install_timers(timers: Timers) -> None:
    """Wrap, in this process, the calls the training loop makes for the adaptive mixer (and
    ``train`` itself, and the loop's loader) so that ``timers`` records their wall time."""
    import megatron.train.loop as loop_module
    import megatron.train.mixer as mixer_module
    from megatron.data.mix_resume import TrainMix

    loop_module.train = timers.wrap("train", loop_module.train)
    loop_module.loop_mixer = timers.wrap("setup", loop_module.loop_mixer)
    mixer_module.update_weights = timers.wrap("policy", mixer_module.update_weights)
    TrainMix.append_mixer_segment = timers.wrap("phase_build", TrainMix.append_mixer_segment)
    TrainMix.mixer_weights = timers.wrap("log_weights", TrainMix.mixer_weights)

    def tee_add_micro_batch(self, *args, **kwargs):
        self.stats[0].add_micro_batch(*args, **kwargs)  # the log interval's: every arm has it
        start = time.perf_counter()
        for stats in self.stats[1:]:  # the mixer's iteration accumulator
            stats.add_micro_batch(*args, **kwargs)
        timers.add("accumulate", time.perf_counter() - start)

    mixer_module.TeeStats.add_micro_batch = tee_add_micro_batch
    end_iteration = mixer_module.LoopMixer.end_iteration

    def timed_end_iteration(self, *args, **kwargs):
        start = time.perf_counter()
        changed = end_iteration(self, *args, **kwargs)
        timers.add("update" if changed else "add", time.perf_counter() - start)
        return changed

    mixer_module.LoopMixer.end_iteration = timed_end_iteration
    fold = mixer_module.LoopMixer.fold

    def timed_fold(self):  # at an update; once more at the loop's end ("fold_end": set-up's line)
        start = time.perf_counter()
        fold(self)
        timers.add("reduce" if updating[0] else "fold_end",
                   time.perf_counter() - start)

    updating = [False]

    def timed_end_iteration_flagged(self, *args, **kwargs):
        updating[0] = True
        try:
            return timed_end_iteration(self, *args, **kwargs)
        finally:
            updating[0] = False

    mixer_module.LoopMixer.fold = timed_fold
    mixer_module.LoopMixer.end_iteration = timed_end_iteration_flagged

    loader = loop_module._loader

    def timed_loader(*args, make=None, **kwargs):
        start = time.perf_counter()
        inner = (make or loader)(*args, **kwargs)
        record = {"create": time.perf_counter() - start, "nexts": []}
        timers.loaders.append(record)
        return TimedIterator(inner, record)

    loop_module._loader = timed_loader

    class TimedMixerLoader(loop_module.MixerLoader):
        """The sampling mixer's loader (workers kept across updates): each segment it starts
        (an update's restart on the same workers) recorded as a loader."""

        def segment(self, *args, **kwargs):
            return timed_loader(*args, make=super().segment, **kwargs)

    loop_module.MixerLoader = TimedMixerLoader


def rank_main(spec_path: str) -> int:
    """The benchmark's rank: train with ``pretrain_gpt.py``'s flags from the spec file, the
    mixer's calls timed (:func:`install_timers`), and write the timers to the spec's ``out``."""
    with open(spec_path) as f:
        spec = json.load(f)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import pretrain_gpt
    from megatron.runtime.process_exit import run_entry_point

    timers = Timers()
    install_timers(timers)
    run_entry_point(lambda: pretrain_gpt.main(spec["argv"]))
    with open(spec["out"], "w") as f:
        json.dump({"seconds": timers.seconds, "loaders": timers.loaders}, f)
    return 0


# ---------------------------------------------------------------------------- the parent's side
def blend_file(data: Dict[str, str], policy: Optional[str], opts, folder: str) -> str:
    """Write the blend file of one arm (``policy`` None: no mixer) and return its path."""
    text = BLEND.format(**data)
    if policy is not None:
        text += f"  mixer: {{policy: {policy}, interval: {opts.interval}, floor: 0.05}}\n"
    path = os.path.join(folder, f"blend_{policy or STATIC}.yaml")
    with open(path, "w") as f:
        f.write(text)
    return path


def pretrain_argv(opts, blend: str, work: str, metrics: str) -> List[str]:
    """``pretrain_gpt.py``'s flags for one arm."""
    planned = max(opts.planned_iters or opts.iters, opts.iters)
    return [
        "--num-layers", str(opts.num_layers), "--hidden-size", str(opts.hidden_size),
        "--num-attention-heads", str(opts.heads), "--seq-length", str(opts.seq_length),
        "--micro-batch-size", str(opts.micro_batch_size),
        "--global-batch-size", str(opts.global_batch_size),
        "--train-iters", str(planned), "--lr", "1e-4", "--lr-decay-style", "constant",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--zero-stage", "1",
        "--num-workers", str(opts.num_workers), "--data-blend-config", blend,
        "--data-cache-path", os.path.join(work, "cache"), "--eval-iters", "0",
        "--log-interval", "1", "--metrics-jsonl", metrics,
        *(["--exit-interval", str(opts.iters)] if planned > opts.iters else [])]


def launch(opts, arm: str, blend: str, work: str, run: int) -> dict:
    """Train one arm in a fresh process; its training records and the rank's timers."""
    from megatron.runtime.ports import launch_with_port_retry

    metrics = os.path.join(work, f"metrics_{run}.jsonl")
    spec = {"argv": pretrain_argv(opts, blend, work, metrics),
            "out": os.path.join(work, f"timers_{run}.json")}
    spec_path = os.path.join(work, f"spec_{run}.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    cmd = [sys.executable, os.path.abspath(__file__), "--rank-spec", spec_path]

    def start(port: int) -> subprocess.CompletedProcess:
        env = dict(os.environ, WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", DS_ACCELERATOR="cpu",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS=str(opts.threads), TOKENIZERS_PARALLELISM="false",
                   PYTHONWARNINGS="ignore")
        return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=opts.timeout)

    began = time.perf_counter()
    try:
        proc = launch_with_port_retry(start)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"{arm}: timed out after {opts.timeout} s: {' '.join(cmd)}") from None
    if proc.returncode:
        raise SystemExit(f"{arm} failed ({proc.returncode}): {' '.join(cmd)}\n"
                         f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(metrics) as f:
        records = [r for r in map(json.loads, filter(str.strip, f)) if "split" not in r]
    with open(spec["out"]) as f:
        timers = json.load(f)
    return {"arm": arm, "records": records, "timers": timers,
            "launch_s": time.perf_counter() - began}


def mixer_seconds(timers: dict, micro_batches: int) -> Dict[str, float]:
    """The mixer's parts of one run (seconds, summed over the run), by the names of
    ``PER_ITERATION`` and ``PER_UPDATE`` plus ``setup`` and ``updates`` (their count)."""
    s = {name: sum(v) for name, v in timers["seconds"].items()}
    loaders = timers["loaders"]
    head = 2 * micro_batches  # a fresh loader's first two iterations of batches
    steady = [t for r in loaders for t in r["nexts"][head:]]
    typical = median(steady) if steady else 0.0
    restarted = loaders[1:]  # the loop's first loader is every run's
    out = {name: s.get(name, 0.0) for name, _ in PER_ITERATION}
    out.update(setup=s.get("setup", 0.0) + s.get("fold_end", 0.0), reduce=s.get("reduce", 0.0),
               policy=s.get("policy", 0.0),
               phase_build=s.get("phase_build", 0.0),
               update_rest=(s.get("update", 0.0) - s.get("reduce", 0.0) - s.get("policy", 0.0)
                            - s.get("phase_build", 0.0)),
               loader_create=sum(r["create"] for r in restarted),
               first_batches=sum(sum(r["nexts"][:head]) - len(r["nexts"][:head]) * typical
                                 for r in restarted),
               updates=len(timers["seconds"].get("update", [])))
    return out


def summarize(run: dict, opts) -> dict:
    """One run's figures: mean ms/iteration after the warmup (updates included), the time of
    ``train()`` (s) and the mixer's parts (s) and their sum as a % of it."""
    timed = [r for r in run["records"] if r["iteration"] > opts.warmup]
    if len(timed) < 1:
        raise SystemExit(f"{run['arm']}: no iteration after the first {opts.warmup}")
    parts = mixer_seconds(run["timers"], opts.global_batch_size // opts.micro_batch_size)
    total = sum(v for k, v in parts.items() if k != "updates")
    train_s = sum(run["timers"]["seconds"]["train"])
    typical = median(r["ms_per_iteration"] for r in timed)
    ms = {r["iteration"]: r["ms_per_iteration"] for r in run["records"]}
    # the update iterations (those the mixer updates at, in every arm: the static one's is the
    # control) and the next AFTER_UPDATE ones, beyond the run's median iteration
    at = [u for u in range(opts.interval, opts.iters, opts.interval) if u > opts.warmup]
    excess = [sum(ms[u + j] - typical for j in range(AFTER_UPDATE + 1)) for u in at
              if all(u + j in ms for j in range(AFTER_UPDATE + 1))]
    return {"ms_per_iteration": sum(r["ms_per_iteration"] for r in timed) / len(timed),
            "median_ms_per_iteration": typical,
            "update_excess_ms": excess,
            "ms_by_iteration": [ms[i] for i in sorted(ms)],
            "iterations": len(run["records"]), "train_s": train_s, "launch_s": run["launch_s"],
            "mixer_s": total, "mixer_percent": 100.0 * total / train_s, "parts": parts}


def pooled_median(lists: List[List[float]]) -> float:
    """The median of every value of ``lists`` together (NaN when there is none)."""
    values = [x for values in lists for x in values]
    return median(values) if values else float("nan")


def print_report(opts, runs: Dict[str, List[dict]]) -> dict:
    """Print (a), (b) and the final lines; return the figures."""
    base = runs[STATIC]
    report = {}
    print(f"\n(a) end to end: mean ms/iteration of iterations {opts.warmup + 1}..{opts.iters} "
          f"(the updates included), over {opts.rounds} round(s)")
    print(f"{'arm':>14} {'best':>8} {'median':>8} {'vs static: best':>16} {'median':>7}"
          f"  per round (ms/iteration)")
    for arm, rows in runs.items():
        ms = [r["ms_per_iteration"] for r in rows]
        ratios = [r["ms_per_iteration"] / b["ms_per_iteration"] for r, b in zip(rows, base, strict=True)]
        entry = {"best_ms": min(ms), "median_ms": median(ms),
                 "ratio_best": min(ms) / min(b["ms_per_iteration"] for b in base),
                 "ratio_median": median(ratios), "rounds": rows}
        report[arm] = entry
        print(f"{arm:>14} {entry['best_ms']:>8.1f} {entry['median_ms']:>8.1f} "
              f"{entry['ratio_best']:>15.4f}x {entry['ratio_median']:>6.4f}x  "
              + ", ".join(f"{x:.1f}" for x in ms))
    print(f"\n(b) the mixer's own time in the same runs, as a share of train() ({opts.iters} "
          f"iterations): the median over the rounds; its parts pooled over the rounds")
    floor = median(r["mixer_percent"] for r in base)
    print(f"  static: {floor:.3f}% (the same wrappers with no mixer: loop_mixer and "
          "mixer_weights returning None)")
    for arm, rows in runs.items():
        if arm == STATIC:
            continue
        percent = median(r["mixer_percent"] for r in rows)
        parts = {name: sum(r["parts"][name] for r in rows) for name in rows[0]["parts"]}
        iters, updates = sum(r["iterations"] for r in rows), max(parts["updates"], 1)
        print(f"  {arm}: {percent:.3f}% (rounds: " + ", ".join(
            f"{r['mixer_s'] * 1000:.0f} ms of {r['train_s']:.1f} s = {r['mixer_percent']:.3f}%"
            for r in rows) + f"); {parts['updates'] // len(rows)} updates a run")
        print(f"    set-up (loop_mixer) and the loop's last fold, once: "
              f"{parts['setup'] / len(rows) * 1000:.2f} ms")
        for name, what in PER_ITERATION:
            print(f"    per iteration, {what}: {parts[name] / iters * 1e6:.1f} us")
        for name, what in PER_UPDATE:
            print(f"    per update, {what}: {parts[name] / updates * 1000:.2f} ms")
        seen_ms = pooled_median([r["update_excess_ms"] for r in rows])
        print(f"    cross-check from the loop's records: the update iteration and the next "
              f"{AFTER_UPDATE} took {seen_ms:.1f} ms beyond the run's median iteration, per update "
              f"(median over the updates of the rounds; static, the same iterations: "
              f"{pooled_median([r['update_excess_ms'] for r in base]):.1f} ms)")
        typical = median(r["median_ms_per_iteration"] for r in rows)
        per_iteration_ms = sum(parts[name] for name, _ in PER_ITERATION) / iters * 1000
        per_update_ms = sum(parts[name] for name, _ in PER_UPDATE) / updates * 1000
        steady = 100.0 * (per_iteration_ms + per_update_ms / opts.interval) / typical
        steady_seen = 100.0 * (per_iteration_ms + seen_ms / opts.interval) / typical
        print(f"    a long run (an update every {opts.interval} iterations): {per_iteration_ms:.2f} ms "
              f"+ {per_update_ms:.1f} ms / {opts.interval} per iteration = {steady:.3f}% of the "
              f"median iteration ({typical:.1f} ms); with the records' {seen_ms:.1f} ms per update "
              f"in place of the timed parts: {steady_seen:.3f}%")
        report[arm].update(median_mixer_percent=percent, steady_percent=steady,
                           steady_records_percent=steady_seen, per_iteration_ms=per_iteration_ms,
                           per_update_ms=per_update_ms, update_records_ms=seen_ms)
    worst = max((arm for arm in runs if arm != STATIC), key=lambda a: report[a]["median_mixer_percent"])
    print("\nA/B end to end (mean ms/iteration with the updates, against the static blend's): "
          + "; ".join(f"{arm} {report[arm]['ratio_best']:.4f}x best, {report[arm]['ratio_median']:.4f}x "
                      "median" for arm in runs if arm != STATIC))
    print(f"mixer overhead: {report[worst]['median_mixer_percent']:.2f}% of the step time (goal < 1%)"
          f"  [the mixer's own time over train()'s, {worst}, the worst policy, median of "
          f"{opts.rounds} round(s); a long run with an update every {opts.interval} iterations: "
          f"{max(report[a]['steady_percent'] for a in runs if a != STATIC):.2f}% timed, "
          f"{max(report[a]['steady_records_percent'] for a in runs if a != STATIC):.2f}% by the "
          "records]")
    return report


def main(argv=None) -> int:
    """Parse the options, run the arms interleaved and print the report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rank-spec", default=None, help=argparse.SUPPRESS)  # the rank's side
    parser.add_argument("--tiny", action="store_true",
                        help="smoke run: 1 layer x 64 hidden, seq 64, 40 iterations, interval 10")
    parser.add_argument("--policies", nargs="+", default=["odm", "loss_softmax"],
                        choices=["odm", "ado", "loss_softmax"])
    parser.add_argument("--interval", type=int, default=50, help="the mixer's interval (iterations)")
    parser.add_argument("--iters", type=int, default=200, help="iterations trained per run")
    parser.add_argument("--planned-iters", type=int, default=None,
                        help="the run's --train-iters (default --iters); larger: stopped after "
                             "--iters by --exit-interval, each update's phase indexes the rest")
    parser.add_argument("--warmup", type=int, default=5, help="first iterations left out of (a)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--global-batch-size", type=int, default=4)
    parser.add_argument("--num-workers", type=int, default=2, help="DataLoader workers")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of the rank")
    parser.add_argument("--data-mb", type=float, default=0.5, help="demo corpus MB per dataset")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per run")
    parser.add_argument("--json", default=None, help="write the figures here")
    opts = parser.parse_args(argv)
    if opts.rank_spec:
        return rank_main(opts.rank_spec)
    if opts.tiny:
        opts.num_layers, opts.hidden_size, opts.heads, opts.seq_length = 1, 64, 4, 64
        opts.iters, opts.interval, opts.warmup, opts.rounds = 40, 10, 2, 1
        opts.data_mb = min(opts.data_mb, 0.2)
    if opts.interval < 1 or opts.iters <= opts.warmup or opts.rounds < 1:
        raise SystemExit("--interval >= 1, --iters > --warmup, --rounds >= 1")
    if opts.global_batch_size % opts.micro_batch_size:
        raise SystemExit("--global-batch-size is a multiple of --micro-batch-size (1 rank)")
    from tools.make_demo_data import make_demo_data

    arms = [STATIC] + list(opts.policies)
    print(f"CPU, 1 rank, {opts.threads} thread(s), {opts.num_workers} loader workers: "
          f"{opts.num_layers} layers x {opts.hidden_size} hidden, seq {opts.seq_length}, micro batch "
          f"{opts.micro_batch_size}, global batch {opts.global_batch_size}; {opts.iters} iterations"
          f"{f' of a run planned for {opts.planned_iters}' if (opts.planned_iters or 0) > opts.iters else ''}"
          f", mixer interval {opts.interval}, floor 0.05; arms {', '.join(arms)}; {opts.rounds} "
          f"interleaved round(s)", flush=True)
    runs: Dict[str, List[dict]] = {arm: [] for arm in arms}
    with tempfile.TemporaryDirectory() as work:
        data = make_demo_data(os.path.join(work, "demo"), size_mb=opts.data_mb, verbose=False)
        blends = {arm: blend_file(data, None if arm == STATIC else arm, opts, work) for arm in arms}
        count = 0
        for round_ in range(opts.rounds):
            order = arms if round_ % 2 == 0 else arms[::-1]  # alternate who goes first
            for arm in order:
                result = launch(opts, arm, blends[arm], work, count)
                count += 1
                row = summarize(result, opts)
                runs[arm].append(row)
                print(f"  round {round_ + 1}/{opts.rounds} {arm:>12}: {row['ms_per_iteration']:7.1f} "
                      f"ms/iteration, train() {row['train_s']:.1f} s, mixer {row['mixer_s'] * 1000:.1f} "
                      f"ms ({row['mixer_percent']:.3f}%), launch {row['launch_s']:.0f} s", flush=True)
    report = print_report(opts, runs)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"config": vars(opts), "arms": report}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
