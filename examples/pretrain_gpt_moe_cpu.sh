#!/usr/bin/env bash
# A tiny Llama-style mixture-of-experts GPT (Mixtral's architecture: RMSNorm, RoPE, SwiGLU experts,
# top-2 router) trained on CPU with the deepspeed launcher and 2 ranks, expert-parallel 2 (each rank
# holds 2 of the 4 experts of every layer), on the embedded demo corpus with the README demo's
# curriculum and Power schedule, every validation group evaluated. Output goes to runs/moe_demo/
# (metrics.jsonl with load_balancing_loss and tokens_per_expert_min/max, TensorBoard, checkpoints).
# Flags and their costs: docs/moe.md.
#
#   bash examples/pretrain_gpt_moe_cpu.sh [extra training flags]
#
# Extra arguments are appended to the training flags (a later flag wins). MOE_PREVIEW_ONLY=1 only
# validates the flags and writes the schedule preview (tools/preview_schedule.py). MASTER_PORT=PORT
# picks the launcher's port (default: a free one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
RUN=${RUN:-runs/moe_demo}
mkdir -p "$RUN"
"$PY" tools/make_demo_data.py --output-dir data/demo

FLAGS=(
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
  --untie-embeddings-and-output-weights
  # 4 experts per layer, each token to 2 of them, dropless; the load-balancing loss at Mixtral's
  # weight; the experts split over the 2 ranks (the dense layers stay data-parallel)
  --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 0.02 --moe-router-dtype fp32
  --expert-model-parallel-size 2
  --micro-batch-size 4 --global-batch-size 16 --train-iters 200
  --lr 2e-3 --min-lr 1e-4 --lr-decay-style power --power-scheduler-a 0.03 --power-scheduler-b -0.51
  --lr-warmup-iters 20 --power-scheduler-decay-iters 20
  --weight-decay 0.01 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0
  --data-blend-config examples/demo_curriculum.yaml --data-cache-path "$RUN/cache"
  --log-interval 10 --eval-interval 50 --eval-iters 4
  --save "$RUN/checkpoints" --save-interval 100
  --metrics-jsonl "$RUN/metrics.jsonl" --tensorboard-dir "$RUN/tensorboard"
)
"$PY" tools/preview_schedule.py --world-size 2 "${FLAGS[@]}" "$@" --output-json "$RUN/schedule_preview.json"
if [ "${MOE_PREVIEW_ONLY:-0}" = 1 ]; then exit 0; fi
launch_with_port_retry "$DEEPSPEED" --num_gpus 2 pretrain_gpt.py "${FLAGS[@]}" "$@"
