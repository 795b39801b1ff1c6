#!/usr/bin/env python
"""Fingerprints of the project's behaviour, for refactorings that must change none of it: the
per-iteration losses and gradient norms of three short CPU runs, the per-tensor hashes of their
checkpoints (as full TP 1 / PP 1 tensors by canonical name), a Hugging Face export's tensors and a
zero-shot rank classification's scores.

    python tools/behaviour_fingerprint.py --output before.json [--work-dir DIR]
    python tools/behaviour_fingerprint.py --compare before.json after.json

The runs (the deepspeed launcher on CPU ranks, demo and toy T0 data made in ``--work-dir``):

* ``dp``: pretrain_gpt.py, a 2-layer GPT on the demo curriculum, data-parallel 2, ZeRO 1;
* ``tp2_pp2``: the same model on 4 ranks, tensor-parallel 2 x pipeline-parallel 2 with
  recompute;
* ``t0``: finetune_t0.py, packed prefix-LM T0 data with --norm-target-loss, data-parallel 2;

then the ``dp`` checkpoint exported with tools/checkpoint/convert_to_hf.py and the ``t0`` one
scored by tasks/zero_shot_rank_classification.py. ``--compare`` prints every difference and exits
1 when there is any (floats compared exactly: the runs are deterministic on CPU). Takes about two
minutes on 2 cores.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
from typing import Dict, List

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), os.path.pardir))
sys.path.insert(0, ROOT)

from megatron.runtime.ports import launch_with_port_retry  # noqa: E402

MODEL = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "64", "--transformer-impl", "local", "--hidden-dropout", "0",
         "--attention-dropout", "0", "--seed", "9"]
ITERS = 6


def launch(script: str, flags: List[str], ranks: int) -> None:
    """``script`` with ``flags`` on ``ranks`` CPU ranks through the deepspeed launcher; raises
    with the log's tail when it fails. The port: megatron/runtime/ports.py's, retried once on
    another should another process take it before the launcher binds it."""
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false",
               TORCHDYNAMO_DISABLE=os.environ.get("TORCHDYNAMO_DISABLE", "1"))
    deepspeed = os.path.join(os.path.dirname(sys.executable), "deepspeed")
    proc = launch_with_port_retry(lambda port: subprocess.run(
        [deepspeed, "--num_gpus", str(ranks), "--master_port", str(port),
         os.path.join(ROOT, script)] + flags, cwd=ROOT, env=env, capture_output=True, text=True))
    if proc.returncode != 0:
        raise RuntimeError(f"{script} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")


def records(path: str) -> Dict[str, list]:
    """Training losses and gradient norms, and evaluation losses, of a metrics file."""
    with open(path) as f:
        lines = [json.loads(line) for line in f if line.strip()]
    train = [r for r in lines if "split" not in r]
    return {"lm_loss": [r["lm_loss"] for r in train], "grad_norm": [r["grad_norm"] for r in train],
            "per_dataset_loss": [r["per_dataset_loss"] for r in train],
            "eval": [[r["iteration"], r["group"], r["lm_loss"]] for r in lines if "split" in r]}


def _digest(tensor) -> str:
    import torch

    data = tensor.detach().contiguous().cpu()
    if data.dtype == torch.bfloat16:
        data = data.view(torch.int16)
    return hashlib.sha256(data.numpy().tobytes()).hexdigest()[:16] + f":{list(tensor.shape)}"


def checkpoint_hashes(load_dir: str) -> Dict[str, str]:
    """sha256 (16 hex digits) and shape of every full tensor of the latest checkpoint."""
    from megatron.checkpoint.reader import CheckpointReader  # lazy: torch (~1 s); --help needs none

    with CheckpointReader(load_dir) as reader:
        return {name: _digest(tensor) for name, tensor in reader.items()}


def hf_hashes(directory: str) -> Dict[str, str]:
    """sha256 and shape of every tensor of a Hugging Face export's safetensors files."""
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(directory)):
        if name.endswith(".safetensors"):
            for key, tensor in load_file(os.path.join(directory, name)).items():
                out[key] = _digest(tensor)
    return out


def fingerprint(work: str) -> dict:
    from tools.make_demo_data import make_demo_data  # lazy: numpy + the data package; not --help
    from tools.make_toy_multitask import make_toy_multitask  # lazy: its import calls quiet_known_warnings()

    demo = make_demo_data(os.path.join(work, "demo"), size_mb=0.2, verbose=False)
    toy = make_toy_multitask(os.path.join(work, "toy"), examples_per_task=60, preprocess=True,
                             rank_eval_per_task=8, pretrain_docs=5)
    blend = os.path.join(work, "blend.yaml")
    with open(blend, "w") as f:
        f.write("train:\n  blend:\n"
                f"    - {{path: {demo['web']}, split: '0:0.9', weight: 1}}\n"
                f"    - path: {demo['code']}\n      split: '0:0.9'\n"
                "      weight: {type: linear, points: {0: 0, 6: 2}}\n"
                f"valid:\n  - {{name: web, path: {demo['web']}, split: '0.9:1'}}\n")
    common = MODEL + ["--micro-batch-size", "2", "--global-batch-size", "8", "--train-iters",
                      str(ITERS), "--lr", "2e-3", "--lr-decay-style", "cosine",
                      "--lr-warmup-iters", "2", "--log-interval", "1", "--eval-interval", "3",
                      "--eval-iters", "1", "--data-cache-path", os.path.join(work, "cache")]
    out: dict = {}
    runs = {"dp": (["--zero-stage", "1"], 2),
            "tp2_pp2": (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--checkpoint-activations"], 4)}
    for name, (extra, ranks) in runs.items():
        run = os.path.join(work, name)
        launch("pretrain_gpt.py", common + extra + [
            "--data-blend-config", blend, "--save", os.path.join(run, "ckpt"),
            "--metrics-jsonl", os.path.join(run, "metrics.jsonl")], ranks)
        out[name] = {"records": records(os.path.join(run, "metrics.jsonl")),
                     "checkpoint": checkpoint_hashes(os.path.join(run, "ckpt"))}
        print(f"fingerprint: {name} done", file=sys.stderr)
    train = ", ".join(f"1 0:1 {toy['train_' + t]}" for t in ("sentiment", "copy", "addition"))
    t0 = os.path.join(work, "t0")
    launch("finetune_t0.py", common + [
        "--train-weighted-split-paths", f"TRAIN: {train}", "--valid-weighted-split-paths",
        f"copy_valid: 1 0:1 {toy['valid_copy']}", "--prefix-lm", "--norm-target-loss",
        "--save", os.path.join(t0, "ckpt"), "--metrics-jsonl", os.path.join(t0, "metrics.jsonl")], 2)
    out["t0"] = {"records": records(os.path.join(t0, "metrics.jsonl")),
                 "checkpoint": checkpoint_hashes(os.path.join(t0, "ckpt"))}
    hf = os.path.join(work, "hf")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "checkpoint", "convert_to_hf.py"),
                    "--load", os.path.join(work, "dp", "ckpt"), "--output", hf], check=True,
                   cwd=ROOT, capture_output=True)
    out["hf_export"] = hf_hashes(hf)
    scores = os.path.join(work, "rank.json")
    subprocess.run([sys.executable, os.path.join(ROOT, "tasks", "zero_shot_rank_classification.py")]
                   + MODEL + ["--load", os.path.join(t0, "ckpt"), "--task-data", toy["rank_eval"],
                              "--prefix-lm", "--append-eod", "--output-json", scores],
                   check=True, cwd=ROOT, capture_output=True,
                   env=dict(os.environ, DS_ACCELERATOR="cpu"))
    with open(scores) as f:
        result = json.load(f)
    out["rank_classification"] = {"tasks": result["tasks"], "choice_scores": result["choice_scores"],
                                  "predictions": result["predictions"]}
    return out


def differences(a, b, path: str = "") -> List[str]:
    """Every place where the JSON values ``a`` and ``b`` differ (floats compared exactly)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in the first" for k in a if k not in b]
        out += [f"{path}/{k}: only in the second" for k in b if k not in a]
        for k in a:
            if k in b:
                out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} entries vs {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", help="Write the fingerprints here (JSON).")
    parser.add_argument("--work-dir", default=os.path.join("runs", "fingerprint"),
                        help="Where the runs write their data and checkpoints.")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="Compare two fingerprint files instead.")
    args = parser.parse_args(argv)
    if args.compare:
        with open(args.compare[0]) as f, open(args.compare[1]) as g:
            found = differences(json.load(f), json.load(g))
        for line in found:
            print(line)
        counts = json.load(open(args.compare[0]))
        n = sum(len(counts[k]["checkpoint"]) for k in ("dp", "tp2_pp2", "t0"))
        print(f"{len(found)} differences ({n} checkpoint tensors, {len(counts['hf_export'])} HF "
              f"tensors, {sum(len(counts[k]['records']['lm_loss']) for k in ('dp', 'tp2_pp2', 't0'))} "
              "training losses compared)")
        return 1 if found else 0
    if not args.output:
        parser.error("give --output FILE (or --compare A B)")
    import shutil

    shutil.rmtree(args.work_dir, ignore_errors=True)
    os.makedirs(args.work_dir)
    result = fingerprint(os.path.abspath(args.work_dir))
    with open(args.output, "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    print(f"wrote {args.output}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
