#!/usr/bin/env bash
# Microsoft Megatron-DeepSpeed's GPT-3 mixture-of-experts example (microsoft/Megatron-DeepSpeed
# examples_deepspeed/MoE/ds_pretrain_gpt_350M_MoE128.sh; its 125M/1.3B siblings share the flags):
# the same flags, at a tiny size, on CPU with 2 ranks.
#
#   bash examples/compat/microsoft_moe_pretrain.sh [OUTPUT_DIR] [extra flags]
#                                     (default runs/compat/ms-moe; 3 iterations)
#
# Kept: the MoE flags in Microsoft's spelling (--num-experts, --moe-expert-parallel-size,
# --moe-loss-coeff, --moe-train-capacity-factor 1.0 and --moe-eval-capacity-factor 1.0 with token
# dropping, --moe-min-capacity 4, --create-moe-param-group; MOE_DROP_TOKEN=false adds
# --disable-moe-token-dropping), which give Microsoft's defaults for what the script leaves out
# (top-1 gating by the softmax probability, an MoE layer every second layer: docs/moe.md); the
# token-based budget and LR schedule (--train-iters three times the budget, as the original),
# --hysteresis, no pipeline engine (--no-pipeline-parallel), activation checkpointing, the
# TensorBoard extras, the original's ds_config_gpt_TEMPLATE.json (its curriculum_learning section,
# off there, left out), --vocab-file and --merge-file without --tokenizer-type (GPT-2 BPE). Its
# --fp16 becomes --bf16 on CPU, and the template's fp16 section is turned off and its bf16 one on
# (the original turns fp16 on; PRECISION=fp16 restores that where the accelerator has fp16).
# Changed otherwise: sizes (2 layers, hidden 64, seq 64; 4 experts instead of 128, split over the 2
# ranks: --moe-expert-parallel-size 2 instead of min(128 experts, 64 GPUs) = 64), ZeRO stage 1
# instead of the template's 0 (expert-parallel checkpoints, --save/--load, keep their optimizer
# state in ZeRO's partitions here) and so prescale_gradients false instead of true (DeepSpeed's
# ZeRO 1 reduce-scatter does not pre-scale), the data (tools/make_compat_data.py), logging every
# iteration. The PR-MoE siblings (per-layer --num-experts counts, --mlp-type residual) and the
# Mixture-of-Students ones (--mos and its teacher flags) stop in one line naming the replacement
# (docs/compatibility.md).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=${1:-runs/compat/ms-moe}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

seq_len=64
num_layers=2
hidden_size=64
num_attn_heads=4
global_batch_size=4
lr=2.0e-4
min_lr=2e-06
init_std=0.014

train_tokens=$(( 3 * global_batch_size * seq_len ))     # 3 iterations
train_iters=$(( train_tokens * 3 / global_batch_size / seq_len ))  # large enough, as the original
exit_duration=30000000
warmup_tokens=$seq_len
lr_decay_tokens=$train_tokens

batch_size=2
mp_size=${TP_SIZE:-1}
pp_size=1
num_gpus=${NUM_RANKS:-2}

## MoE: the original has 128 experts (EP_SIZE) split over min(EP_SIZE, NUM_GPUS) ranks
ep_size=${EP_SIZE:-4}
if [[ $ep_size -gt $num_gpus ]]; then
    ep_parallel_size=$num_gpus
else
    ep_parallel_size=$ep_size
fi
mlc=0.01
moe_train_cap_factor=1.0
moe_eval_cap_factor=1.0
moe_min_cap=4
moe_drop_token=${MOE_DROP_TOKEN:-true}

log_interval=1
eval_iters=1
eval_interval=3
save_interval=3
activation_checkpoint="true"
precision=${PRECISION:-bf16}  # the original: --fp16 (see above)
checkpoint_path="$OUT/checkpoint"
tensorboard_dir="$OUT/tensorboard"

data_options=(
    --vocab-file "$COMPAT_DATA/tokenizers/gpt2/vocab.json"
    --merge-file "$COMPAT_DATA/tokenizers/gpt2/merges.txt"
    --data-path "$COMPAT_DATA/gpt2/web_text_document"
    --data-impl mmap
)
megatron_options=(
    --override-opt_param-scheduler
    --adam-beta1 0.9
    --adam-beta2 0.95
    --tensor-model-parallel-size $mp_size
    --moe-expert-parallel-size $ep_parallel_size
    --num-experts $ep_size
    --moe-loss-coeff $mlc
    --moe-train-capacity-factor $moe_train_cap_factor
    --moe-eval-capacity-factor $moe_eval_cap_factor
    --moe-min-capacity $moe_min_cap
    --init-method-std $init_std
    --lr-decay-tokens $lr_decay_tokens
    --lr-warmup-tokens $warmup_tokens
    --micro-batch-size $batch_size
    --exit-duration-in-mins $exit_duration
    --global-batch-size $global_batch_size
    --num-layers $num_layers
    --hidden-size $hidden_size
    --num-attention-heads $num_attn_heads
    --seq-length $seq_len
    --max-position-embeddings $seq_len
    --train-tokens $train_tokens
    --train-iters $train_iters
    --lr $lr
    --min-lr $min_lr
    --lr-decay-style cosine
    --split 98,2,0
    --log-interval $log_interval
    --eval-interval $eval_interval
    --eval-iters $eval_iters
    --save-interval $save_interval
    --weight-decay 0.1
    --clip-grad 1.0
    --hysteresis 2
    --num-workers 0
    --$precision
    --load "$checkpoint_path"
    --save "$checkpoint_path"
    --tensorboard-queue-size 1
    --log-timers-to-tensorboard
    --log-batch-size-to-tensorboard
    --log-validation-ppl-to-tensorboard
    --tensorboard-dir "$tensorboard_dir"
)
if [ "${activation_checkpoint}" = "true" ]; then
    megatron_options+=(--checkpoint-activations)
fi
if [[ $ep_size -gt 1 ]]; then
    megatron_options+=(--create-moe-param-group)
fi
if [ "${moe_drop_token}" = "false" ]; then
    megatron_options+=(--disable-moe-token-dropping)
fi

if [ "$precision" = fp16 ]; then
    fp16_enabled=true; bf16_enabled=false
else
    fp16_enabled=false; bf16_enabled=true  # the original: fp16 on, bf16 off (see above)
fi
# The original fills its ds_config_gpt_TEMPLATE.json by sed (batch sizes, log interval, ZeRO 0,
# prescale true, fp16 on, bf16 off); here ZeRO 1, prescale false, and the precision above
config_json="$OUT/ds_config_gpt_moe.json"
cat <<EOT > "$config_json"
{
  "train_batch_size": $global_batch_size,
  "train_micro_batch_size_per_gpu": $batch_size,
  "steps_per_print": $log_interval,

  "zero_optimization": {
    "stage": 1
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": false,

  "fp16": {
    "enabled": $fp16_enabled,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  },

  "bf16": {
    "enabled": $bf16_enabled
  },

  "wall_clock_breakdown" : false
}
EOT

deepspeed_options=(
    --deepspeed
    --deepspeed_config "$config_json"
    --pipeline-model-parallel-size $pp_size
    --no-pipeline-parallel
)
if [ "${activation_checkpoint}" = "true" ]; then
    deepspeed_options+=(--deepspeed-activation-checkpointing)
fi

compat_launch pretrain_gpt.py "${megatron_options[@]}" "${data_options[@]}" "${deepspeed_options[@]}" "$@"
