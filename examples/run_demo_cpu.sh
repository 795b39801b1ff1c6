#!/usr/bin/env bash
# The README's main job: set up .venv, make the embedded demo corpus (web / code / math), and train a
# tiny GPT on CPU with the deepspeed launcher and 2 ranks, with a data curriculum and a power LR
# schedule, evaluating every validation group. Output goes to runs/demo/ (metrics.jsonl, checkpoints,
# schedule preview, cache/ of built dataset indices).
#
#   bash examples/run_demo_cpu.sh [extra training flags]
#
# Extra arguments are appended to the training flags (a later flag wins) and given to the schedule
# preview too, so schedule_preview.* always shows the run that trains. To train on from the last
# checkpoint to iteration 300:
#   bash examples/run_demo_cpu.sh --load runs/demo/checkpoints --train-iters 300 --override-opt_param-scheduler
# MASTER_PORT=PORT picks the launcher's port (default: a free one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
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
"$PY" tools/preview_schedule.py --world-size 2 "${FLAGS[@]}" "$@" --output-json "$RUN/schedule_preview.json" \
  --output-png "$RUN/schedule_preview.png"
if [ "${DEMO_PREVIEW_ONLY:-0}" = 1 ]; then exit 0; fi  # docs/make_images.sh wants the preview only
launch_with_port_retry "$DEEPSPEED" --num_gpus 2 pretrain_gpt.py "${FLAGS[@]}" "$@"
