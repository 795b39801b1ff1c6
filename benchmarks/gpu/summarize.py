"""The summary of one benchmarks/gpu/run_all.sh run: reads the results folder (``throughput.json``,
``throughput_sp.json`` and ``throughput_moe.json`` where the 2-GPU steps ran, ``seqlen.json``,
``attention*.json``, the ``sync_*.log`` files, ``steps.tsv``) and prints, and writes as
``summary.md``, tokens/s/GPU and MFU (for the MoE layouts, of the active experts, with their
settings), ms/iteration and tokens/s of the sequence-length curriculum's lengths against the full
length, each attention backend against SDPA-dense per batch kind, and whether the sync-debug
runs found a host synchronisation.

    python benchmarks/gpu/summarize.py RESULTS_DIR
"""
import glob
import json
import os
import sys
from typing import List


def _throughput(out: str, name: str = "throughput") -> List[str]:
    path = os.path.join(out, f"{name}.json")
    if not os.path.exists(path):
        return [f"{name}: no result (see {name}.log)"]
    data = json.load(open(path))
    peak = data.get("peak_tflops")
    seq = data.get("config", {}).get("seq_length")
    lines = [f"### Training throughput, seq {seq}: {data['gpus']} x {data['device']} (peak "
             f"{peak if peak else 'n/a'} TFLOP/s dense bf16)", "",
             "| layout | tokens/s | tokens/s/GPU | model TFLOP/s/GPU | MFU |", "| --- | --- | --- | --- | --- |"]
    for name, r in data["layouts"].items():
        mfu = "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}"
        lines.append(f"| {name} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s_per_gpu']:,.0f} | "
                     f"{r['model_tflops_per_gpu']:.1f} | {mfu} |")
    moe = [(name, r) for name, r in data["layouts"].items() if "num_experts" in r]
    if moe:
        lines.append("")
    for name, r in moe:
        lines.append(f"- {name}: {r['num_experts']} experts top-{r['moe_topk']} in every layer, "
                     f"expert-parallel {r['expert_parallel']}, {r['dispatcher']} dispatcher, "
                     f"{r['experts_gemm']}; model FLOPs and MFU count the top-{r['moe_topk']} "
                     "experts only (Megatron-LM's num_floating_point_operations)")
    return lines


def _seqlen(out: str) -> List[str]:
    """benchmarks/seqlen_curriculum.py's ``seqlen.json``: per mode, each k against S."""
    path = os.path.join(out, "seqlen.json")
    if not os.path.exists(path):
        return ["seqlen: no result (see seqlen.log)"]
    data = json.load(open(path))
    c = data["config"]
    lines = [f"### Sequence-length curriculum: k tokens per sample against S = {c['seq_length']}: "
             f"{data['device']}, {c['num_layers']} x {c['hidden_size']}, micro batch "
             f"{c['micro_batch_size']} x {c['accumulation']}{', bf16' if c.get('bf16') else ''} "
             f"(launch {c['launch']}, median of {c['iters']} iterations per length and round after "
             f"{c['warmup']} dropped)", "",
             "| mode | k | tokens/iteration | ms/iteration | time vs S | tokens/s | tokens/s vs S | "
             "model FLOPs vs S |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for mode, entry in data["modes"].items():
        for k, r in sorted(entry["rows"].items(), key=lambda item: int(item[0])):
            lines.append(f"| {mode} | {k} | {r['tokens_per_iteration']:,} | {r['ms_per_iteration']:.1f} | "
                         f"{r['time_vs_full']:.2f}x | {r['tokens_per_second']:,.0f} | "
                         f"{r['tokens_per_s_vs_full']:.2f}x | {r['flops_vs_full']:.3f}x |")
    estimates = data.get("warmup_estimate", {})
    if estimates:
        lines.append("")
    for mode, e in estimates.items():
        spec = e["spec"]
        line = (f"- estimate, {mode}: a fixed_linear warmup from {spec['min_difficulty']} over the "
                f"first {spec['total_curriculum_step']} of {e['run_iterations']} iterations trains "
                f"{e['tokens'] / e['tokens_full']:.3f}x the tokens of S throughout in "
                f"{e['seconds_same_iterations'] / e['seconds_full']:.3f}x the time")
        if mode == "truncate":
            line += f"; the same tokens in {e['seconds_same_tokens'] / e['seconds_full']:.3f}x the time"
        lines.append(line + " (from the measured per-length times)")
    return lines


def _attention(out: str) -> List[str]:
    kinds = {}
    for path in sorted(glob.glob(os.path.join(out, "attention*.json"))):
        data = json.load(open(path))
        config = data["config"]
        for kind, result in data["kinds"].items():
            kinds.setdefault(kind, {"config": config, "rows": {}})["rows"].update(result["rows"])
    if not kinds:
        return ["attention: no result (see attention*.log)"]
    lines = []
    for kind, entry in kinds.items():
        c, rows = entry["config"], entry["rows"]
        ref = rows.get("sdpa-dense")
        lines += ["", f"### Attention fwd+bwd, {kind} batches: b={c['batch']} s={c['seq_length']} "
                      f"heads={c['heads']} head_dim={c['head_dim']} {c['dtype']}, {c['documents']} "
                      "documents/sample (first call, which compiles, not timed)", "",
                  "| backend | ms | tokens/s | peak GiB | speed vs sdpa-dense | max abs diff |",
                  "| --- | --- | --- | --- | --- | --- |"]
        for name, r in rows.items():
            ratio = f"{ref['ms'] / r['ms']:.2f}x" if ref else "n/a"
            lines.append(f"| {name} | {r['ms']:.2f} | {r['tokens_per_s']:,.0f} | "
                         f"{r['peak_gib']:.3f} | {ratio} | {r['max_abs_diff_vs_sdpa_dense']:.1e} |")
    return lines


def _sync(out: str) -> List[str]:
    lines = ["", "### Host synchronisations in training steps (sync debug mode 'error')", ""]
    logs = sorted(glob.glob(os.path.join(out, "sync_*.log")))
    for path in logs:
        text = open(path, errors="replace").read().splitlines()
        verdict = next((line for line in reversed(text)
                        if line.startswith(("no host sync", "HOST SYNC", "no step was checked"))),
                       "no verdict (failed or timed out: see the log)")
        lines.append(f"- {os.path.basename(path)[:-4]}: {verdict}")
    return lines if logs else lines + ["- no sync-debug run"]


def _steps(out: str) -> List[str]:
    path = os.path.join(out, "steps.tsv")
    if not os.path.exists(path):
        return []
    lines = ["", "### Steps", "", "| step | exit status | seconds |", "| --- | --- | --- |"]
    for row in open(path):
        name, rc, seconds = row.rstrip("\n").split("\t")
        status = {"0": "ok", "124": "timed out (124)", "137": "killed (137)"}.get(rc, rc)
        lines.append(f"| {name} | {status} | {seconds} |")
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not os.path.isdir(argv[0]):
        raise SystemExit("usage: python benchmarks/gpu/summarize.py RESULTS_DIR")
    out = argv[0]
    two_gpu = []  # the steps that run only where 2 GPUs are visible
    for name in ("throughput_sp", "throughput_moe"):
        if os.path.exists(os.path.join(out, f"{name}.json")):
            two_gpu += _throughput(out, name) + [""]
    text = "\n".join(["## GPU benchmarks", ""] + _throughput(out) + [""] + two_gpu
                     + _seqlen(out) + [""] + _attention(out) + _sync(out) + _steps(out)) + "\n"
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
