#!/usr/bin/env bash
# Microsoft Megatron-DeepSpeed's Llama-2 pretraining example (microsoft/Megatron-DeepSpeed
# examples_deepspeed/pretrain_llama2_distributed.sh): the same flags, at a tiny size, on CPU with
# 2 ranks.
#
#   [activation_checkpoint=true] bash examples/compat/microsoft_llama2_pretrain.sh [OUTPUT_DIR] [extra flags]
#                                     (default runs/compat/llama2; 3 iterations)
#
# Kept: the Llama architecture flags (rotary embeddings, SwiGLU, RMSNorm, untied embeddings, no
# linear biases, grouped-query attention via --num-key-value-heads), the sentencepiece tokenizer
# (GPTSentencePieceTokenizer, here a tiny local model), a weighted --data-path, bf16 with ZeRO 0,
# the --flag=value spelling of the DeepSpeed flags, and both activation checkpointing spellings
# behind activation_checkpoint=true. Changed: sizes (2 layers, hidden 64, 4 heads with 2 key/value
# groups, seq 64, TP 2 instead of TP 2 x PP 2), the data (tools/make_compat_data.py),
# --distributed-backend gloo (CPU), the launcher (deepspeed, not torchrun).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=${1:-runs/compat/llama2}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

BASE_PATH=$OUT
DS_CONFIG=${BASE_PATH}/deepspeed.json
DATASET_1="$COMPAT_DATA/spm/web_text_document"
DATASET="1 ${DATASET_1}"
CHECKPOINT_PATH=$OUT/checkpoints
TOKENIZER_PATH=$COMPAT_DATA/tokenizers/spm/tokenizer.model

TP=${TP_SIZE:-2}
PP=${PP_SIZE:-1}
ZERO_STAGE=0

HIDDEN_SIZE=64
FFN_HIDDEN_SIZE=176
NUM_LAYERS=2
NUM_HEADS=4
SEQ_LENGTH=64
NUM_KV_HEADS=2 # llama2 70B uses GQA

MICRO_BATCH_SIZE=2
GLOBAL_BATCH_SIZE=4
TRAIN_STEPS=3
LR=3e-4
MIN_LR=3e-5
LR_WARMUP_STEPS=1
WEIGHT_DECAY=0.1
GRAD_CLIP=1

activation_checkpoint=${activation_checkpoint:-false}

cat <<EOT > "$DS_CONFIG"
{
  "train_batch_size" : $GLOBAL_BATCH_SIZE,
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "steps_per_print": 1,
  "zero_optimization": {
    "stage": $ZERO_STAGE
  },
  "bf16": {
    "enabled": true
  }
}
EOT

ds_args=(--zero-stage=$ZERO_STAGE --deepspeed_config="$DS_CONFIG" --deepspeed)
if [ "${activation_checkpoint}" = "true" ]; then
  ds_args=(--deepspeed-activation-checkpointing "${ds_args[@]}")
  ## old argument for recomputing the transformer layer
  # ds_args=(--checkpoint-activations "${ds_args[@]}")
  ## new argument for recomputing the transformer layer
  ds_args=(--recompute-granularity full --recompute-method uniform "${ds_args[@]}")
fi

compat_launch pretrain_gpt.py \
       --tensor-model-parallel-size $TP \
       --pipeline-model-parallel-size $PP \
       --num-layers $NUM_LAYERS \
       --hidden-size $HIDDEN_SIZE \
       --ffn-hidden-size $FFN_HIDDEN_SIZE \
       --num-attention-heads $NUM_HEADS \
       --micro-batch-size $MICRO_BATCH_SIZE \
       --global-batch-size $GLOBAL_BATCH_SIZE \
       --seq-length $SEQ_LENGTH \
       --max-position-embeddings $SEQ_LENGTH \
       --train-iters $TRAIN_STEPS \
       --save "$CHECKPOINT_PATH" \
       --load "$CHECKPOINT_PATH" \
       --data-path $DATASET \
       --data-impl mmap \
       --tokenizer-type GPTSentencePieceTokenizer \
       --tokenizer-model "$TOKENIZER_PATH" \
       --split 949,50,1 \
       --distributed-backend gloo \
       --lr $LR \
       --lr-decay-style cosine \
       --min-lr $MIN_LR \
       --weight-decay $WEIGHT_DECAY \
       --clip-grad $GRAD_CLIP \
       --lr-warmup-iters $LR_WARMUP_STEPS \
       --optimizer adam \
       --adam-beta1 0.9 \
       --adam-beta2 0.95 \
       --log-interval 1 \
       --save-interval 3 \
       --eval-interval 3 \
       --eval-iters 1 \
       --bf16 \
       --no-query-key-layer-scaling \
       --attention-dropout 0 \
       --hidden-dropout 0 \
       --use-rotary-position-embeddings \
       --untie-embeddings-and-output-weights \
       --swiglu \
       --normalization rmsnorm \
       --disable-bias-linear \
       --num-key-value-heads $NUM_KV_HEADS \
       "${ds_args[@]}" \
       "$@"
