#!/usr/bin/env bash
# Megatron-LM's GPT-3 175B example (NVIDIA/Megatron-LM examples/gpt3/train_gpt3_175b_distributed.sh):
# the same flags, at a tiny size, on CPU with 2 ranks, in either of its two published flag sets:
#
#   FLAG_SET=2024  the 2024 script: --rampup-batch-size START INCR SAMPLES
#   FLAG_SET=2026  the 2026 script (default): --attention-backend auto and
#                  --step-batch-size-schedule "TOKENS:BATCH ..." instead of the rampup
#
#   [FLAG_SET=2024] bash examples/compat/megatron_lm_gpt3_175b.sh [OUTPUT_DIR] [extra flags]
#                                          (default runs/compat/gpt3-FLAG_SET; 3 iterations)
#
# The original passes --vocab-file/--merge-file without --tokenizer-type, which means GPT-2 BPE
# (Megatron-LM's pretrain_gpt.py defaults the type to GPT2BPETokenizer, and so does this project).
# The original's --fp16 becomes --bf16: DeepSpeed's
# CPU accelerator has no fp16, and --fp16 stops the run with one line saying so (PRECISION=fp16
# restores it where the accelerator has fp16). Changed otherwise: sizes (2 layers, hidden 64,
# seq 64, TP 2 instead of TP 8 x PP 16), the data (the GPT-2 BPE files and demo text of
# tools/make_compat_data.py), the launcher (deepspeed, not torchrun).
# Sizes: TP_SIZE, PP_SIZE, NUM_RANKS; data: COMPAT_DATA.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

FLAG_SET=${FLAG_SET:-2026}
PRECISION=${PRECISION:-bf16}  # the original: fp16
case "$FLAG_SET" in
    2024|2026) ;;
    *) echo "FLAG_SET=$FLAG_SET: expected 2024 or 2026" >&2; exit 2 ;;
esac
OUT=${1:-runs/compat/gpt3-$FLAG_SET}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

CHECKPOINT_PATH=$OUT/checkpoints
TENSORBOARD_LOGS_PATH=$OUT/tensorboard
VOCAB_FILE=$COMPAT_DATA/tokenizers/gpt2/vocab.json
MERGE_FILE=$COMPAT_DATA/tokenizers/gpt2/merges.txt
DATA_PATH=$COMPAT_DATA/gpt2/web_text_document

GPT_MODEL_ARGS=(
    --num-layers 2
    --hidden-size 64
    --num-attention-heads 4
    --seq-length 64
    --max-position-embeddings 64
)
if [ "$FLAG_SET" = 2026 ]; then
    GPT_MODEL_ARGS+=(--attention-backend auto)  # Can use (flash/fused/unfused/local)
    # 2026: batch 2 until 256 tokens (4 samples) were consumed, then 4: batches of 2, 2, 4
    BATCH_SCHEDULE=(--step-batch-size-schedule "0:2 256:4")
else
    # 2024: from 2 samples, +2 after 4 consumed samples: batches of 2, 2, 4
    BATCH_SCHEDULE=(--rampup-batch-size 2 2 4)
fi

TRAINING_ARGS=(
    --micro-batch-size 1
    --global-batch-size 4
    "${BATCH_SCHEDULE[@]}"
    --train-iters 3
    --weight-decay 0.1
    --adam-beta1 0.9
    --adam-beta2 0.95
    --init-method-std 0.006
    --clip-grad 1.0
    --$PRECISION
    --lr 6.0e-5
    --lr-decay-style cosine
    --min-lr 6.0e-6
    --lr-warmup-fraction .001
    --lr-decay-iters 3
)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size ${TP_SIZE:-2}
    --pipeline-model-parallel-size ${PP_SIZE:-1}
)
DATA_ARGS=(
    --data-path "$DATA_PATH"
    --vocab-file "$VOCAB_FILE"
    --merge-file "$MERGE_FILE"
    --split 949,50,1
)
EVAL_AND_LOGGING_ARGS=(
    --log-interval 1
    --save-interval 3
    --eval-interval 3
    --save "$CHECKPOINT_PATH"
    --load "$CHECKPOINT_PATH"
    --eval-iters 1
    --tensorboard-dir "$TENSORBOARD_LOGS_PATH"
)

compat_launch pretrain_gpt.py \
    "${GPT_MODEL_ARGS[@]}" \
    "${TRAINING_ARGS[@]}" \
    "${MODEL_PARALLEL_ARGS[@]}" \
    "${DATA_ARGS[@]}" \
    "${EVAL_AND_LOGGING_ARGS[@]}" \
    "$@"
