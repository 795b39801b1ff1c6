#!/bin/bash
# The whole T0 pipeline on a toy multitask set, on CPU with 2 DeepSpeed ranks (gloo):
#   1. make the toy data (tools/make_toy_multitask.py: 5 prompted training tasks, 2 held-out tasks)
#      and preprocess it (--json-keys inputs targets, byte-level tokenizer, --append-eod);
#   2. pretrain a tiny GPT briefly on the toy plain text (pretrain_gpt.py);
#   3. finetune it on the packed multitask mixture (finetune_t0.py --finetune --load), validating
#      on the held-out tasks (one named group each);
#   4. zero-shot rank classification of the finetuned checkpoint (tasks/zero_shot_rank_classification.py).
#
#   bash examples/finetune_t0/run_toy_cpu.sh [OUTPUT_DIR]      (default: runs/toy_t0; a few minutes)
# It sets up .venv like the demo (tools/cpu_env.sh). PREFIX_LM=1 finetunes and scores a non-causal
# decoder (--prefix-lm) instead. Smaller runs: EXAMPLES_PER_TASK (800), PRETRAIN_ITERS (150),
# FINETUNE_ITERS (200). MASTER_PORT=PORT picks the launcher's port (default: a free one).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"

OUT=${1:-runs/toy_t0}
EXAMPLES_PER_TASK=${EXAMPLES_PER_TASK:-800}
PRETRAIN_ITERS=${PRETRAIN_ITERS:-150}
FINETUNE_ITERS=${FINETUNE_ITERS:-200}
WARMUP_ITERS=$(( PRETRAIN_ITERS >= 20 ? 10 : PRETRAIN_ITERS / 2 ))  # 10, or less for tiny runs
DATA="$OUT/data"
MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 256
       --transformer-impl local --hidden-dropout 0 --attention-dropout 0)
PREFIX_LM_ARGS=()
if [ "${PREFIX_LM:-0}" = "1" ]; then PREFIX_LM_ARGS=(--prefix-lm); fi

echo "== 1. toy multitask data in $DATA"
"$PY" tools/make_toy_multitask.py --output-dir "$DATA" --examples-per-task "$EXAMPLES_PER_TASK" --preprocess

echo "== 2. pretrain on the toy text"
launch_with_port_retry "$DEEPSPEED" --num_gpus 2 pretrain_gpt.py "${MODEL[@]}" \
    --micro-batch-size 4 --global-batch-size 16 --train-iters "$PRETRAIN_ITERS" \
    --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters "$WARMUP_ITERS" \
    --data-path "$DATA/pretrain_text_document" --split 90,5,5 \
    --data-cache-path "$OUT/cache" --log-interval 25 --eval-interval "$PRETRAIN_ITERS" --eval-iters 2 \
    --save "$OUT/pretrained" --metrics-jsonl "$OUT/pretrain_metrics.jsonl"

echo "== 3. multitask finetuning (--finetune --load: weights only)"
TRAIN="TRAIN: 1 0:1 $DATA/train_sentiment, 1 0:1 $DATA/train_topic, 1 0:1 $DATA/train_copy, 1 0:1 $DATA/train_addition, 1 0:1 $DATA/train_contains"
launch_with_port_retry "$DEEPSPEED" --num_gpus 2 finetune_t0.py "${MODEL[@]}" \
    --micro-batch-size 4 --global-batch-size 8 --train-iters "$FINETUNE_ITERS" \
    --optimizer adam --lr 1e-3 --lr-decay-style constant --weight-decay 0 \
    --train-weighted-split-paths "$TRAIN" \
    --valid-weighted-split-paths "animal_or_object: 1 0:1 $DATA/heldout_animal_or_object" \
                                 "first_word: 1 0:1 $DATA/heldout_first_word" \
                                 "copy_valid: 1 0:1 $DATA/valid_copy" \
    --norm-target-loss "${PREFIX_LM_ARGS[@]}" \
    --finetune --load "$OUT/pretrained" --save "$OUT/finetuned" \
    --data-cache-path "$OUT/cache" --log-interval 20 --eval-interval 50 --eval-iters 2 \
    --metrics-jsonl "$OUT/finetune_metrics.jsonl"

echo "== 4. zero-shot rank classification"
"$PY" tasks/zero_shot_rank_classification.py "${MODEL[@]}" --load "$OUT/finetuned" \
    --task-data "$DATA/rank_eval.jsonl" --append-eod "${PREFIX_LM_ARGS[@]}" \
    --output-json "$OUT/rank_classification.json"
echo "results: $OUT/rank_classification.json, metrics: $OUT/finetune_metrics.jsonl"
