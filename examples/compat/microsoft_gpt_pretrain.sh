#!/usr/bin/env bash
# Microsoft Megatron-DeepSpeed's GPT-3 pretraining example (microsoft/Megatron-DeepSpeed
# examples_deepspeed/rebase/ds_pretrain_gpt_125M.sh; its siblings for other sizes share the flags):
# the same flags, at a tiny size, on CPU with 2 ranks.
#
#   bash examples/compat/microsoft_gpt_pretrain.sh [OUTPUT_DIR] [extra flags]
#                                     (default runs/compat/ms-gpt; 3 iterations)
#
# Kept: the token-based budget (--train-tokens is the termination condition; --train-samples is set
# to twice it on purpose, as the original does), token-based LR warmup/decay, --hysteresis, ZeRO
# stage 1 data parallelism without the pipeline engine (--no-pipeline-parallel), activation
# checkpointing, the TensorBoard extras, the original DeepSpeed JSON template, --vocab-file and
# --merge-file without --tokenizer-type (GPT-2 BPE, the default of Microsoft's and this project's
# pretrain_gpt.py). Its --fp16 (and the template's fp16 loss-scaling
# section) becomes --bf16: DeepSpeed's CPU accelerator has no fp16 and --fp16 stops the run with one
# line saying so; PRECISION=fp16 restores both where the accelerator has fp16. Changed otherwise:
# sizes (2 layers, hidden 64, seq 64, data parallel 2 instead of MP 2 x PP 2), the data
# (tools/make_compat_data.py, no downloads), logging every iteration.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=${1:-runs/compat/ms-gpt}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

seq_len=64
num_layers=2
hidden_size=64
num_attn_heads=4
global_batch_size=4
lr=6.0e-4
min_lr=1.0e-6
init_std=0.02

train_tokens=$(( 3 * global_batch_size * seq_len ))     # 3 iterations
train_samples=$(( train_tokens * 2 / seq_len ))         # twice the budget, as the original
exit_duration=30000000
lr_warmup_tokens=$seq_len
lr_decay_tokens=$train_tokens
lr_decay_style="cosine"

mp_size=${TP_SIZE:-1}
pp_size=${PP_SIZE:-1}
no_pp="true"
zero_stage=1
batch_size=2

log_interval=1
eval_iters=1
eval_interval=3
save_interval=3
activation_checkpoint="true"
log_optimizer_state="true"

seed=1234
precision=${PRECISION:-bf16}  # the original: fp16 (see above)
num_workers=0
data_path="$COMPAT_DATA/gpt2/web_text_document"
vocab_path="$COMPAT_DATA/tokenizers/gpt2/vocab.json"
merge_path="$COMPAT_DATA/tokenizers/gpt2/merges.txt"
prescale_grad="true"
if [[ $zero_stage -gt 0 ]]; then
    prescale_grad="false"
fi
checkpoint_path="$OUT/checkpoint"
tensorboard_path="$OUT/tensorboard"

data_options=(
    --vocab-file "$vocab_path"
    --merge-file "$merge_path"
    --data-path "$data_path"
    --data-impl mmap
)
megatron_options=(
    --override-opt_param-scheduler
    --adam-beta1 0.9
    --adam-beta2 0.95
    --tensor-model-parallel-size $mp_size
    --init-method-std $init_std
    --lr-decay-tokens $lr_decay_tokens
    --lr-warmup-tokens $lr_warmup_tokens
    --micro-batch-size $batch_size
    --exit-duration-in-mins $exit_duration
    --global-batch-size $global_batch_size
    --num-layers $num_layers
    --hidden-size $hidden_size
    --num-attention-heads $num_attn_heads
    --seq-length $seq_len
    --max-position-embeddings $seq_len
    --train-tokens $train_tokens
    --train-samples $train_samples
    --lr $lr
    --min-lr $min_lr
    --lr-decay-style $lr_decay_style
    --split 949,50,1
    --log-interval $log_interval
    --eval-interval $eval_interval
    --eval-iters $eval_iters
    --save-interval $save_interval
    --weight-decay 0.1
    --clip-grad 1.0
    --hysteresis 2
    --num-workers $num_workers
    --$precision
    --seed $seed
    --load "$checkpoint_path"
    --save "$checkpoint_path"
    --no-async-tensor-model-parallel-allreduce
    --tensorboard-queue-size 1
    --log-timers-to-tensorboard
    --log-batch-size-to-tensorboard
    --log-validation-ppl-to-tensorboard
    --tensorboard-dir "$tensorboard_path"
)
if [ "${activation_checkpoint}" = "true" ]; then
    megatron_options+=(--checkpoint-activations)
fi
if [ "${log_optimizer_state}" = "true" ]; then
    megatron_options+=(--log-optimizer-states-to-tensorboard)
fi

if [ "$precision" = fp16 ]; then  # the original template's section
precision_json='"fp16": {
    "enabled": true,
    "loss_scale": 0,
    "loss_scale_window": 500,
    "hysteresis": 2,
    "min_loss_scale": 1,
    "initial_scale_power": 11
  }'
else
precision_json='"bf16": {
    "enabled": true
  }'
fi
# The original's ds_config_gpt_TEMPLATE.json with its placeholders filled in
config_json="$OUT/ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}.json"
cat <<EOT > "$config_json"
{
  "train_batch_size": $global_batch_size,
  "train_micro_batch_size_per_gpu": $batch_size,
  "steps_per_print": $log_interval,

  "zero_optimization": {
    "stage": $zero_stage
  },

  "gradient_clipping": 1.0,
  "prescale_gradients": $prescale_grad,

  $precision_json,

  "wall_clock_breakdown" : false
}
EOT

deepspeed_options=(
    --deepspeed
    --deepspeed_config "$config_json"
    --zero-stage $zero_stage
    --pipeline-model-parallel-size $pp_size
)
if [[ "${no_pp}" = "true" ]]; then
    deepspeed_options+=(--no-pipeline-parallel)
fi
if [ "${activation_checkpoint}" = "true" ]; then
    deepspeed_options+=(--deepspeed-activation-checkpointing)
fi

compat_launch pretrain_gpt.py "${megatron_options[@]}" "${data_options[@]}" "${deepspeed_options[@]}" "$@"
