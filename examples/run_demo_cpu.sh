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
RUN=runs/demo
mkdir -p "$RUN"
"$PY" tools/make_demo_data.py --output-dir data/demo

FLAGS=(
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 128
  --micro-batch-size 4 --global-batch-size 16 --train-iters 200
  --lr 2e-3 --min-lr 2e-4 --lr-decay-style cosine --lr-warmup-iters 20
  --weight-decay 0.01 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0
  --data-path 0.5 data/demo/web_text_document 0.3 data/demo/code_text_document 0.2 data/demo/math_text_document
  --split 949,50,1 --data-cache-path "$RUN/cache"
  --log-interval 10 --eval-interval 50 --eval-iters 4
  --save "$RUN/checkpoints" --save-interval 100
  --metrics-jsonl "$RUN/metrics.jsonl" --tensorboard-dir "$RUN/tensorboard"
)
"$(dirname "$PY")/deepspeed" --num_gpus 2 pretrain_gpt.py "${FLAGS[@]}" "$@"
