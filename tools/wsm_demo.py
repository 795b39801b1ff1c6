#!/usr/bin/env python
"""WSM recipe on the embedded demo data: a WSD run on CPU, checkpoints of its stable phase merged
(tools/checkpoint/merge_checkpoints.py), and merged against unmerged held-out loss.

    python tools/wsm_demo.py [--output-dir runs/wsm] [--train-iters 600] [--decay-iters 100]
        [--save-interval 25] [--window 4] [--lr 5e-3] [--global-batch-size 8]
        [--plot docs/img/wsm_merge.png] [--lm-eval]

1. makes the demo corpus (tools/make_demo_data.py) and trains the demo's tiny GPT on 2 CPU ranks
   through the deepspeed launcher with a WSD learning rate: warmup 20 iterations, stable at
   ``--lr``, then a linear decay to 0 over the last ``--decay-iters``; a checkpoint every
   ``--save-interval``. A high learning rate and a small batch (the defaults) put the stable phase
   where the iterates are noisy, which is what merging averages out;
2. merges, at every stable-phase checkpoint t, the ``--window`` checkpoints ending at t with the
   weights of a linear decay over them (``--weights-from-schedule linear``, the WSM mapping);
3. scores every checkpoint and every merge on held-out text (the last 2% of each domain's
   documents, which ``--split 98,1,1`` keeps out of training) with the lm-eval adapter
   (tasks/eval_harness/lm.py, rolling log-likelihood: nats per token), and plots both curves
   against the iteration with the WSD decay shaded (``--plot``) and writes ``results.json``;
4. writes an lm-eval task file for the held-out text and prints the lm-eval command for the last
   merged checkpoint (``--lm-eval`` runs it, and the same for the unmerged checkpoint).

About 2-4 minutes on 2 CPU cores. Output in ``--output-dir``: ``data/``, ``run/`` (the training
run: ``checkpoints/``, ``metrics.jsonl``), ``merged/iter_T/`` (one merged checkpoint per t),
``heldout.jsonl``, ``heldout.yaml``, ``results.json``.
"""
import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir))
sys.path.insert(0, ROOT)

from megatron.runtime.known_warnings import quiet_known_warnings  # noqa: E402
from megatron.runtime.ports import launch_with_port_retry  # noqa: E402

quiet_known_warnings()

MODEL = ["--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4",
         "--seq-length", "128"]
HELDOUT_FRACTION = 0.02


def training_flags(args, data, run) -> list:
    blend = []
    for domain in ("web", "code", "math"):
        blend += ["1", data[domain]]
    return MODEL + [
        "--micro-batch-size", str(args.global_batch_size // 2), "--global-batch-size",
        str(args.global_batch_size), "--train-iters", str(args.train_iters), "--lr", str(args.lr),
        "--min-lr", "0", "--lr-decay-style", "WSD",
        "--lr-wsd-decay-style", "linear", "--lr-wsd-decay-iters", str(args.decay_iters),
        "--lr-warmup-iters", "20", "--weight-decay", "0.01", "--clip-grad", "1.0",
        "--hidden-dropout", "0", "--attention-dropout", "0", "--data-path", *blend,
        "--split", "98,1,1", "--data-cache-path", os.path.join(run, "cache"),
        "--log-interval", "20", "--eval-interval", str(args.train_iters), "--eval-iters", "2",
        "--save", os.path.join(run, "checkpoints"), "--save-interval", str(args.save_interval),
        "--metrics-jsonl", os.path.join(run, "metrics.jsonl"), "--seed", "1234"]


def train(args, data, run) -> None:
    env = dict(os.environ, DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(os.path.dirname(os.path.dirname(
        sys.executable)), "torch_extensions"))
    launcher = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    flags = ["pretrain_gpt.py", *training_flags(args, data, run)]
    print("training:", " ".join(flags), flush=True)
    log_path = os.path.join(run, "train.log")

    def launch(port: int) -> subprocess.CompletedProcess:
        # a port below the ephemeral range, retried once if taken first (megatron/runtime/ports.py)
        cmd = [launcher, "--num_gpus", "2", "--master_port", str(port), *flags]
        with open(log_path, "w") as log:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
        with open(log_path, errors="replace") as log:
            return subprocess.CompletedProcess(cmd, proc.returncode, stdout=log.read())

    proc = launch_with_port_retry(launch)
    proc.check_returncode()


def heldout_texts(data_dir: str) -> list:
    """The last 2% of each domain's documents (``--split 98,1,1`` leaves them out of training)."""
    texts = []
    for domain in ("web", "code", "math"):
        with open(os.path.join(data_dir, f"{domain}.jsonl"), encoding="utf-8") as f:
            docs = [json.loads(line)["text"] for line in f if line.strip()]
        texts += docs[int(len(docs) * (1 - HELDOUT_FRACTION)):]
    return texts


def heldout_loss(load: str, texts: list, iteration=None) -> float:
    """Nats per token of ``texts`` under the checkpoint (rolling log-likelihood, lm-eval's
    perplexity request, through tasks/eval_harness/lm.py)."""
    from lm_eval.api.instance import Instance

    from tasks.eval_harness.evaluate import build_lm, load_model, parse_eval_args  # lazy: its import sets HF_*_OFFLINE

    argv = ["--load", load, "--use-checkpoint-args", "--tasks", "unused", "--eval-batch-size", "32"]
    if iteration is not None:
        argv += ["--load-iteration", str(iteration)]
    args = parse_eval_args(argv)
    lm = build_lm(args, load_model(args))
    requests = [Instance(request_type="loglikelihood_rolling", doc={}, arguments=(t,), idx=0)
                for t in texts]
    total = sum(lm.loglikelihood_rolling(requests, disable_tqdm=True))
    tokens = sum(len(args.tokenizer.tokenize(t)) for t in texts)
    return -total / tokens


def write_lm_eval_task(out: str, texts: list) -> str:
    data = os.path.join(out, "heldout.jsonl")
    with open(data, "w", encoding="utf-8") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")
    task = os.path.join(out, "heldout.yaml")
    with open(task, "w") as f:
        f.write(f"task: demo_heldout\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
                f"    test: {data}\ntest_split: test\noutput_type: loglikelihood_rolling\n"
                "doc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n"
                "  - metric: word_perplexity\n  - metric: byte_perplexity\n"
                "  - metric: bits_per_byte\n")
    return task


def plot(path: str, results: dict, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    stable_end = args.train_iters - args.decay_iters
    ax.axvspan(stable_end, args.train_iters, color="0.9", label="WSD decay (linear)")
    unmerged = results["unmerged"]
    ax.plot([int(k) for k in unmerged], list(unmerged.values()), "o-", color="tab:blue",
            label="checkpoint (unmerged)")
    merged = results["merged"]
    ax.plot([int(k) for k in merged], list(merged.values()), "s-", color="tab:orange",
            label=f"merge of the last {args.window} checkpoints (WSM, linear decay weights)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("held-out loss (nats/token)")
    ax.set_title("WSM on the demo data: merged vs unmerged over the stable phase")
    low = min(min(unmerged.values()), min(merged.values()))
    ax.set_ylim(low - 0.05, low + 1.2)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", default=os.path.join("runs", "wsm"))
    p.add_argument("--train-iters", type=int, default=600)
    p.add_argument("--decay-iters", type=int, default=100)
    p.add_argument("--save-interval", type=int, default=25)
    p.add_argument("--window", type=int, default=4)
    p.add_argument("--lr", type=float, default=5e-3, help="The stable phase's learning rate.")
    p.add_argument("--global-batch-size", type=int, default=8)
    p.add_argument("--data-size-mb", type=float, default=1.25)
    p.add_argument("--plot", default=None, help="PNG to write (e.g. docs/img/wsm_merge.png).")
    p.add_argument("--lm-eval", action="store_true",
                   help="Also run tasks/eval_harness/evaluate.py on the last merge and checkpoint.")
    args = p.parse_args(argv)
    from megatron.checkpoint.merge import merge_checkpoints, weights_from_schedule  # lazy: torch (~1 s); not --help
    from tools.make_demo_data import make_demo_data  # lazy: numpy + the data package; not --help

    out = os.path.abspath(args.output_dir)
    run, merged_root = os.path.join(out, "run"), os.path.join(out, "merged")
    os.makedirs(run, exist_ok=True)
    data_dir = os.path.join(out, "data")
    data = make_demo_data(data_dir, size_mb=args.data_size_mb, verbose=False)
    checkpoints = os.path.join(run, "checkpoints")
    if not os.path.isfile(os.path.join(checkpoints, "latest_checkpointed_iteration.txt")):
        train(args, data, run)
    saved = list(range(args.save_interval, args.train_iters + 1, args.save_interval))
    stable_end = args.train_iters - args.decay_iters
    ends = [t for t in saved if t <= stable_end and t - (args.window - 1) * args.save_interval > 0]
    texts = heldout_texts(data_dir)
    results = {"unmerged": {}, "merged": {}, "weights": None}
    for t in saved:
        results["unmerged"][t] = heldout_loss(checkpoints, texts, iteration=t)
        print(f"iteration {t}: checkpoint {results['unmerged'][t]:.4f}", flush=True)
    last = None
    for t in ends:
        iterations = [t - (args.window - 1 - i) * args.save_interval for i in range(args.window)]
        weights, multipliers, config = weights_from_schedule("linear", iterations)
        target = os.path.join(merged_root, f"iter_{t}")
        if not os.path.isfile(os.path.join(target, "latest_checkpointed_iteration.txt")):
            merge_checkpoints(checkpoints, iterations, weights, target, log=lambda line: None,
                              weights_from={"flag": "--weights-from-schedule", "value": "linear",
                                            "schedule": config, "decay_multipliers": multipliers})
        results["merged"][t] = heldout_loss(target, texts)
        results["weights"] = weights
        last = target
        print(f"iteration {t}: merge of {iterations} x {[round(w, 4) for w in weights]}: "
              f"{results['merged'][t]:.4f} (checkpoint {results['unmerged'][t]:.4f})", flush=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    if args.plot:
        plot(args.plot, results, args)
        print(f"wrote {args.plot}")
    task = write_lm_eval_task(out, texts)
    commands = []
    for load in (last, checkpoints):
        extra = [] if load == last else ["--load-iteration", str(ends[-1])]
        commands.append([sys.executable, os.path.join(ROOT, "tasks", "eval_harness", "evaluate.py"),
                         "--load", load, *extra, "--use-checkpoint-args", "--tasks", task,
                         "--results-path",
                         os.path.join(out, f"lm_eval_{os.path.basename(load)}.json")])
    print("lm-eval on the last merged checkpoint:\n  " + " ".join(commands[0][1:]))
    if args.lm_eval:  # each in a fresh process (with its own rendezvous port)
        env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
        for cmd in commands:
            subprocess.run(cmd, cwd=ROOT, env=env, check=True)


if __name__ == "__main__":
    main()
