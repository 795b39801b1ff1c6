#!/usr/bin/env bash
# Microsoft Megatron-DeepSpeed's sequence-length warmup example (microsoft/Megatron-DeepSpeed
# examples_deepspeed/curriculum_learning/ds_pretrain_gpt_1.3B_rope_slw.sh, with its
# ds_config_gpt_slw_TEMPLATE.json, shipped unchanged beside this script): the same flags, at a tiny
# size, on CPU with 2 ranks.
#
#   bash examples/compat/microsoft_curriculum_slw.sh [OUTPUT_DIR] [extra flags]
#                                     (default runs/compat/ms-curriculum-slw; 3 iterations)
#
# The curriculum is the template's legacy top-level "curriculum_learning" section (fixed_linear,
# CONFIG_CL_MIN to CONFIG_CL_MAX tokens over CONFIG_CL_DURATION steps, difficulty_step 8), filled
# in by the original's sed; it is trained here as the native sequence-length schedule (each sample
# keeps its first k tokens, as Microsoft's loop truncates it) and left out of the config DeepSpeed
# sees, which one start-up line says. Kept: the token-based budget (--train-tokens ends the run;
# --train-samples is twice it, as the original), token-based LR warmup/decay, --hysteresis, ZeRO
# stage 1, the pipeline engine (no_pp=false), rotary embeddings on a quarter of each head,
# activation checkpointing, the TensorBoard extras, --vocab-file and --merge-file without
# --tokenizer-type (GPT-2 BPE). Its --fp16 becomes --bf16 and the template's fp16 section is turned
# off and a bf16 one on by one more sed (as microsoft_moe_pretrain.sh does with its template):
# DeepSpeed's CPU accelerator has no fp16; PRECISION=fp16 restores both where the accelerator has
# fp16. Changed otherwise: sizes (2 layers, hidden 64, seq 64, a curriculum from 16 tokens over 3
# steps, so the length changes every iteration: 32, 48, 64), PP 2 instead of MP 4 x PP 8 (the pipe
# engine resizes its buffers at each new length), the token budget (the 3 iterations' trained
# tokens), the data (tools/make_compat_data.py, no downloads), logging every iteration; the
# multi-node checkpoint-pointer fix-up (ssh/ds_ssh) is left out.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=${1:-runs/compat/ms-curriculum-slw}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

## The original: GPT-3 XL 1.3B at seq 2048
seq_len=64
num_layers=2
hidden_size=64
num_attn_heads=4
global_batch_size=4
lr=2.0e-4
min_lr=1.0e-6
init_std=0.013

###############################################################################
### curriculum learning (sequence length warmup) configs
# The original: cl_step=$(( lr_warmup_tokens / 3 / global_batch_size / seq_len )) (a third of the
# LR warmup's steps), which is 0 at these sizes; here 3 steps, so every iteration trains a new
# length (DeepSpeed's fixed_linear: 32, 48, then 64 tokens).
cl_step=3
# Starting sequence length during sequence length warmup (the original: 64 of 2048, a multiple of
# the template's difficulty_step 8).
cl_min=16

## Training duration: the original's 300B-token budget is the termination condition; here the
## tokens of 3 iterations at the curriculum's lengths (global batch x 32, 48, 64).
train_tokens=$(( global_batch_size * (32 + 48 + 64) ))   # 3 iterations
train_samples=$(( train_tokens * 2 / seq_len ))          # large enough, as the original
exit_duration=30000000
lr_warmup_tokens=$seq_len
lr_decay_tokens=$train_tokens
lr_decay_style="cosine"

## The original: mp_size=4, pp_size=8, no_pp="false" (the pipeline engine). Here PP 2 on the 2
## ranks, still through the pipeline engine.
mp_size=${TP_SIZE:-1}
pp_size=${PP_SIZE:-2}
no_pp="false"
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
mkdir -p "$checkpoint_path" "$tensorboard_path"

data_options=(
    --vocab-file "$vocab_path"
    --merge-file "$merge_path"
    --data-path "$data_path"
    --data-impl mmap
)
## If CL is used, make sure to set "--split" the same as what you used during
## offline data analysis&indexing.
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
    --use-rotary-position-embeddings
    --rotary-percent 0.25
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

# The original's fp16 on CPU: the template's fp16 section off and a bf16 one on (see above)
if [ "$precision" = fp16 ]; then
    precision_sed=''
else
    precision_sed='/"fp16": {/,/}/ s/"enabled": true/"enabled": false/
s/^  "fp16": {/  "bf16": {\n    "enabled": true\n  },\n\n  "fp16": {/'
fi
config_json="$OUT/ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}_cl_step${cl_step}_cl_min${cl_min}.json"
template_json="$ROOT/examples/compat/ds_config_gpt_slw_TEMPLATE.json"
sed "s/GBSIZE/${global_batch_size}/" ${template_json} \
    | sed "s/MBSIZE/${batch_size}/" \
    | sed "s/LOG_INTERVAL/${log_interval}/" \
    | sed "s/ZERO_STAGE/${zero_stage}/" \
    | sed "s/PRESCALE_GRAD/${prescale_grad}/" \
    | sed "s/CONFIG_CL_MIN/${cl_min}/" \
    | sed "s/CONFIG_CL_MAX/${seq_len}/" \
    | sed "s/CONFIG_CL_DURATION/${cl_step}/" \
    | sed "$precision_sed" \
      > "${config_json}"

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
