#!/usr/bin/env bash
# A blend of thousands of prefixes trained under a low open-file limit, as a user launches it: the
# deepspeed launcher, 2 CPU ranks with 2 DataLoader workers each, `ulimit -n 1024` (a common
# default soft limit; megatron-core's builders stop at a few hundred prefixes there with "Too many
# open files"). Prints the time from launch to the end of training and the open files of each
# rank's worker at the end (run by hand; see benchmarks/README.md).
#
#   bash benchmarks/many_prefixes_cpu.sh [PREFIXES (default 4096)] [ULIMIT (default 1024)]
#
# RANKS, WORKERS, GBS, ITERS and EXIT_INTERVAL (environment) change the launch: the issue's cold
# start is RANKS=1 WORKERS=0 GBS=256 ITERS=39063 EXIT_INTERVAL=1 (1e7 samples planned, one
# iteration trained: launch to the first iteration).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
D="${1:-4096}"
LIMIT="${2:-1024}"
WORK="${WORK:-/tmp/many_prefixes_$D}"
mkdir -p "$WORK"
"$PY" - "$WORK" "$D" <<'EOF'
import os, sys
import numpy as np
sys.path.insert(0, os.path.join(os.getcwd(), "tests"))
from helpers.curriculum import write_corpus
work, D = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
w = np.sort(rng.pareto(0.7, D))[::-1] + 1e-4
lines = ["train:", "  blend:"]
for d in range(D):
    prefix = os.path.join(work, f"ds{d:05d}_text_document")
    if not os.path.exists(prefix + ".idx"):
        write_corpus(prefix, [300, 170, 420], seed=d)
    lines.append(f"    - {{path: {prefix}, weight: {w[d]:.6g}}}")
lines += ["valid:", "  - name: held_out", "    blend:",
          f"      - {{path: {os.path.join(work, 'ds00000_text_document')}, weight: 1}}"]
with open(os.path.join(work, "blend.yaml"), "w") as f:
    f.write("\n".join(lines) + "\n")
EOF
rm -rf "$WORK/cache" "$WORK/metrics.jsonl"
start=$SECONDS
(
  ulimit -n "$LIMIT"
  echo "ulimit -n: $(ulimit -n); $D prefixes"
  EXTRA=()
  if [ -n "${EXIT_INTERVAL:-}" ]; then EXTRA+=(--exit-interval "$EXIT_INTERVAL"); fi
  launch_with_port_retry "$DEEPSPEED" --num_gpus "${RANKS:-2}" pretrain_gpt.py \
    --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
    --micro-batch-size 8 --global-batch-size "${GBS:-32}" --train-iters "${ITERS:-6}" --lr 1e-3 \
    --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 2 --hidden-dropout 0 \
    --attention-dropout 0 --num-workers "${WORKERS:-2}" "${EXTRA[@]}" \
    --data-blend-config "$WORK/blend.yaml" --data-cache-path "$WORK/cache" \
    --log-interval 1 --eval-interval 3 --eval-iters 1 --metrics-jsonl "$WORK/metrics.jsonl"
)
echo "launch to the end of training: $((SECONDS - start)) s; cache files: $(find "$WORK/cache" -type f | wc -l)"
