#!/usr/bin/env bash
# BigScience tr13 (BLOOMZ multitask finetuning of BLOOM on xP3, bigscience-workshop/bigscience
# train/tr13-mtf/tr13-176B-mtf-xp3capmixnewcodelonglossseq.slurm): the same flags, at a tiny size,
# on CPU with 2 ranks. finetune_t0.py packs (inputs, targets) pairs into each sample.
#
#   [LOAD=PRETRAINED_CHECKPOINTS] bash examples/compat/bigscience_tr13_bloomz_finetune.sh \
#       [OUTPUT_DIR] [extra flags]                    (default runs/compat/tr13; 3 iterations)
#
# As tr13 does, the run saves to and loads from OUTPUT_DIR/checkpoints; its first step starts from
# the pretrained model (BigScience copied tr11's converted checkpoint there): LOAD=DIR loads that
# instead, e.g. the checkpoints of examples/compat/bigscience_tr11_bloom_pretrain.sh (same model
# flags). --no-load-optim --reset-progress: weights only, counters from 0 (tr13's "first step").
# Data: --*-weighted-split-paths-path files in the xP3 form (the whole argument on one line, each
# group quoted; one validation group per held-out task), tokenized with the Hugging Face tokenizer.
# Changed from the original: sizes (2 layers, hidden 64, seq 64, PP 2 instead of PP 72), the data
# (tools/make_compat_data.py), --distributed-backend gloo (CPU), the launcher.
# bigscience_tr13_bloomz_eval_only.sh runs these flags with --eval-only True.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=${1:-runs/compat/tr13}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

CHECKPOINT_PATH=$OUT/checkpoints
LOAD=${LOAD:-$CHECKPOINT_PATH}
TENSORBOARD_PATH=$OUT/tensorboard
KILL_SWITCH_PATH=$OUT/kill-switch-tr13-176B-mtf
TRAIN_DATA_PATH=${TRAIN_DATA_PATH:-$COMPAT_DATA/splits/xp3-train.txt}
VALID_DATA_PATH=${VALID_DATA_PATH:-$COMPAT_DATA/splits/xp3-validation.txt}
TOKENIZER_NAME_OR_PATH=$COMPAT_DATA/tokenizers/hf

PP_SIZE=${PP_SIZE:-2}
TP_SIZE=${TP_SIZE:-1}

MICRO_BATCH_SIZE=2
GLOBAL_BATCH_SIZE=4

NHIDDEN=64
NLAYERS=2
NHEADS=4
SEQ_LEN=64

SAVE_INTERVAL=3

TRAIN_SAMPLES=12      # 3 iterations of 4 samples

OPTIMIZER_ARGS=(
    --optimizer adam
    --adam-beta1 0.9
    --adam-beta2 0.95
    --adam-eps 1e-8
    --lr 2e-5
    --lr-decay-style constant
    --lr-warmup-samples 0
    --clip-grad 1.0
    --weight-decay 1e-4
    --no-load-optim
    --norm-target-loss
    --reset-progress
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
    --global-batch-size $GLOBAL_BATCH_SIZE
    --train-samples $TRAIN_SAMPLES
    --tokenizer-type PretrainedFromHF
    --tokenizer-name-or-path "$TOKENIZER_NAME_OR_PATH"
    --init-method-std 0.0048
    --embed-layernorm
    --sync-tp-duplicated-parameters
    --bf16
    --seed 42
    --position-embedding-type alibi
    --checkpoint-activations
    --abort-on-unmet-fused-kernel-constraints
    --kill-switch-path "$KILL_SWITCH_PATH"
    --pad-vocab-size-to 512      # 250880 for BLOOM
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

ZERO_STAGE=0
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

compat_launch finetune_t0.py \
    --universal-checkpoint \
    --tensor-model-parallel-size $TP_SIZE \
    --pipeline-model-parallel-size $PP_SIZE \
    "${GPT_ARGS[@]}" \
    "${OUTPUT_ARGS[@]}" \
    --save "$CHECKPOINT_PATH" \
    --load "$LOAD" \
    --train-weighted-split-paths-path "$TRAIN_DATA_PATH" \
    --valid-weighted-split-paths-path "$VALID_DATA_PATH" \
    --dataloader-type single \
    --data-impl mmap \
    --distributed-backend gloo \
    "${DEEPSPEED_ARGS[@]}" \
    "$@"
