#!/usr/bin/env bash
# BigScience tr11 (BLOOM-176B pretraining, bigscience-workshop/bigscience
# train/tr11-176B-ml/tr11-176B-ml.slurm): the same flags, at a tiny size, on CPU with 2 ranks.
#
#   bash examples/compat/bigscience_tr11_bloom_pretrain.sh [OUTPUT_DIR] [extra flags]
#                                                        (default runs/compat/tr11; 3 iterations)
#
# Kept from the original: BLOOM's architecture (ALiBi, embedding layernorm, vocabulary padded to a
# fixed size, init std 0.0048), the Hugging Face tokenizer (PretrainedFromHF, here a local tiny
# one), data given as --*-weighted-split-paths-path files written in the form of BigScience's
# load_ratios_meg_ds_format.py, batch-size rampup in samples, sample-based LR schedule, bf16 with
# ZeRO stage 0 and a DeepSpeed JSON that agrees with the flags, pipeline partitioning over
# transformer and embedding layers, activation checkpointing, kill switch, TensorBoard extras.
# Changed: sizes (2 layers, hidden 64, seq 64, PP 2 instead of TP 4 x PP 12), the data
# (tools/make_compat_data.py), --distributed-backend gloo (CPU), the launcher (deepspeed, not
# srun + torch.distributed.run). Sizes: TP_SIZE, PP_SIZE, NUM_RANKS; data: COMPAT_DATA.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=${1:-runs/compat/tr11}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

CHECKPOINT_PATH=$OUT/checkpoints
TENSORBOARD_PATH=$OUT/tensorboard
KILL_SWITCH_PATH=$OUT/kill-switch-tr11-176B-exp1
TRAIN_DATA_PATH=$COMPAT_DATA/splits/tr11-train-splits.txt
VALID_DATA_PATH=$COMPAT_DATA/splits/tr11-valid-splits.txt
TOKENIZER_NAME_OR_PATH=$COMPAT_DATA/tokenizers/hf

TP_SIZE=${TP_SIZE:-1}
PP_SIZE=${PP_SIZE:-2}

MICRO_BATCH_SIZE=2
GLOBAL_BATCH_SIZE=4

NHIDDEN=64
NLAYERS=2
NHEADS=4
SEQ_LEN=64

SAVE_INTERVAL=3

TRAIN_SAMPLES=8       # rampup 2 -> 4: batches of 2, 2, 4 samples = 3 iterations
LR_DECAY_SAMPLES=6
LR_WARMUP_SAMPLES=2

OPTIMIZER_ARGS=(
    --optimizer adam
    --adam-beta1 0.9
    --adam-beta2 0.95
    --adam-eps 1e-8
    --lr 6e-5
    --min-lr 6e-6
    --lr-decay-style cosine
    --lr-decay-samples $LR_DECAY_SAMPLES
    --lr-warmup-samples $LR_WARMUP_SAMPLES
    --clip-grad 1.0
    --weight-decay 1e-1
)
EXIT_OPTS=(
    --exit-duration-in-mins 5990
)
GPT_ARGS=(
    --pp-partition-method 'type:transformer|embedding'
    --num-layers $NLAYERS
    --hidden-size $NHIDDEN
    --num-attention-heads $NHEADS
    --seq-length $SEQ_LEN
    --max-position-embeddings $SEQ_LEN
    --micro-batch-size $MICRO_BATCH_SIZE
    --rampup-batch-size 2 2 4
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-samples $TRAIN_SAMPLES
    --tokenizer-type PretrainedFromHF
    --tokenizer-name-or-path "$TOKENIZER_NAME_OR_PATH"
    --init-method-std 0.0048
    --embed-layernorm
    --bf16
    --seed 42
    --position-embedding-type alibi
    --checkpoint-activations
    --abort-on-unmet-fused-kernel-constraints
    --kill-switch-path "$KILL_SWITCH_PATH"
    --pad-vocab-size-to 512      # 250880 for BLOOM's 250680-token vocabulary
    "${OPTIMIZER_ARGS[@]}"
    "${EXIT_OPTS[@]}"
)
OUTPUT_ARGS=(
    --log-interval 1
    --save-interval $SAVE_INTERVAL
    --eval-interval 3
    --eval-iters 1
    --tensorboard-dir "$TENSORBOARD_PATH"
    --tensorboard-queue-size 5
    --log-timers-to-tensorboard
    --log-batch-size-to-tensorboard
    --log-validation-ppl-to-tensorboard
)

ZERO_STAGE=0  # BigScience: bf16 must use z0 (DeepSpeed's bf16 optimizer is its own stage-1 equivalent)
config_json=$OUT/ds_config.json
cat <<EOT > "$config_json"
{
  "train_micro_batch_size_per_gpu": $MICRO_BATCH_SIZE,
  "train_batch_size": $GLOBAL_BATCH_SIZE,
  "gradient_clipping": 1.0,
  "zero_optimization": {
    "stage": $ZERO_STAGE
  },
  "bf16": {
    "enabled": true
  },
  "steps_per_print": 2000,
  "wall_clock_breakdown": false
}
EOT
DEEPSPEED_ARGS=(
    --deepspeed
    --deepspeed_config "$config_json"
    --zero-stage $ZERO_STAGE
    --deepspeed-activation-checkpointing
)

compat_launch pretrain_gpt.py \
    --tensor-model-parallel-size $TP_SIZE \
    --pipeline-model-parallel-size $PP_SIZE \
    "${GPT_ARGS[@]}" \
    "${OUTPUT_ARGS[@]}" \
    --save "$CHECKPOINT_PATH" \
    --load "$CHECKPOINT_PATH" \
    --train-weighted-split-paths-path "$TRAIN_DATA_PATH" \
    --valid-weighted-split-paths-path "$VALID_DATA_PATH" \
    --num-workers 2 \
    --valid-num-workers 0 \
    --data-impl mmap \
    --distributed-backend gloo \
    "${DEEPSPEED_ARGS[@]}" \
    "$@"
