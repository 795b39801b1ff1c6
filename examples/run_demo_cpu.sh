#!/usr/bin/env bash
# The README's main job: set up .venv, make the embedded demo corpus (web / code / math), and train a
# tiny GPT on CPU with the deepspeed launcher and 2 ranks, with a data curriculum and a power LR
# schedule, evaluating every validation group. Output goes to runs/demo/ (metrics.jsonl, checkpoints,
# schedule preview). Extra arguments are appended to the training flags.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/tools/setup_env.sh" | tail -n 1)"
cd "$ROOT"
export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# DeepSpeed JIT-builds a CPU communication op on first use; keep the build beside this venv so
# another environment's build (or a stale lock it left) is never picked up.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$(dirname "$(dirname "$PY")")/torch_extensions}"
RUN=runs/demo
mkdir -p "$RUN"
"$PY" tools/make_demo_data.py --output-dir data/demo

FLAGS=(
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --micro-batch-size 4 --global-batch-size 16 --train-iters 200
  # Power Scheduler (arXiv 2408.13359): lr = min(--lr, batch * a * tokens^b) after a linear
  # warmup, exponential decay to --min-lr over the last 20 iterations. a is scaled down from the
  # paper's 4.6 so that the power law, not the --lr cap, shapes this tiny run.
  --lr 2e-3 --min-lr 1e-4 --lr-decay-style power --power-scheduler-a 0.03 --power-scheduler-b -0.51
  --lr-warmup-iters 20 --power-scheduler-decay-iters 20
  --weight-decay 0.01 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0
  --data-blend-config examples/demo_curriculum.yaml --data-cache-path "$RUN/cache"
  --log-interval 10 --eval-interval 50 --eval-iters 4
  --save "$RUN/checkpoints" --save-interval 100
  --metrics-jsonl "$RUN/metrics.jsonl" --tensorboard-dir "$RUN/tensorboard"
)
"$PY" tools/preview_schedule.py "${FLAGS[@]}" --output-json "$RUN/schedule_preview.json" \
  --output-png "$RUN/schedule_preview.png"
if [ "${DEMO_PREVIEW_ONLY:-0}" = 1 ]; then exit 0; fi  # docs/make_images.sh wants the preview only
"$(dirname "$PY")/deepspeed" --num_gpus 2 pretrain_gpt.py "${FLAGS[@]}" "$@"
