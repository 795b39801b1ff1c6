#!/usr/bin/env bash
# Microsoft Megatron-DeepSpeed's data-efficiency GPT example with the sequence-length curriculum
# (microsoft/Megatron-DeepSpeed examples_deepspeed/data_efficiency/gpt/pretrain/
# ds_pretrain_gpt_1.3B_dense_run.sh's "CL seqlen truncation" setup, run through its
# ds_pretrain_gpt_1.3B_dense_base_script.sh with ds_config_gpt_1clmetric_TEMPLATE.json, shipped
# unchanged beside this script): the same flags, at a tiny size, on CPU with 2 ranks.
#
#   bash examples/compat/microsoft_data_efficiency_seqlen.sh [OUTPUT_DIR] [extra flags]
#                                     (default runs/compat/ms-data-efficiency; 3 iterations)
#
# --data-efficiency-curriculum-learning trains the template's data_efficiency.data_sampling.
# curriculum_learning metric seqlen_truncate (fixed_root, root 1: CL_1st_MIN to CL_1st_MAX tokens
# over CL_1st_TOTAL_STEP steps in multiples of CL_1st_DIFF_STEP, difficulty_type value,
# clustering_type single_cluster), filled in by the original's sed, as the native sequence-length
# schedule (each sample keeps its first k tokens); the data_efficiency section is left out of the
# config DeepSpeed sees, which one start-up line says. Random-LTD stays off as in that setup
# (ltd_enabled false: no --random-ltd, the template's data_routing section disabled); this project
# refuses --random-ltd (LTD_ENABLED=true adds it and the run stops in one line saying so).
# The three index-file flags the base script adds whenever CL is on (--train-doc-idx-path,
# --train-sample-idx-path, --train-shuffle-idx-path: the Pile index maps of DeepSpeed's offline
# data analysis, which only the analysis-based metrics such as "voc" read) are accepted without
# effect: the index maps here are built from --data-path and --seed. Left out: the two-metric branch
# (ds_config_gpt_2clmetrics_TEMPLATE.json: its vocabulary-rarity metric needs that offline
# analysis and is refused here). Kept otherwise: the token-based budget (--train-tokens ends the
# run; --train-samples is large enough, as the original), token-based LR warmup/decay,
# --hysteresis, ZeRO stage 1 data parallelism without the pipeline engine (--no-pipeline-parallel,
# micro batch = global batch / data-parallel size), activation checkpointing, the TensorBoard
# extras, --vocab-file and --merge-file without --tokenizer-type (GPT-2 BPE). Its --fp16 becomes
# --bf16 and the template's fp16 section is turned off and a bf16 one on by one more sed (as
# microsoft_moe_pretrain.sh does with its template): DeepSpeed's CPU accelerator has no fp16;
# PRECISION=fp16 restores both where the accelerator has fp16. Changed otherwise: sizes (2 layers,
# hidden 64, seq 64, the curriculum from 16 instead of 80 tokens over 4 steps instead of 110000,
# so the length changes every iteration: 24, 40, 48), the token budget (the 3 iterations' trained
# tokens), DP 2, the data (tools/make_compat_data.py, no downloads), logging every iteration; the
# template's disabled random-LTD section keeps the 1.3B model's 24 layers (it configures nothing
# here); the multi-node checkpoint-pointer fix-up (ssh/ds_ssh) is left out.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../tools/cpu_env.sh"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

OUT=${1:-runs/compat/ms-data-efficiency}
shift $(( $# > 0 ? 1 : 0 ))
compat_data
mkdir -p "$OUT"

###############################################################################
### The run script's "CL seqlen truncation 300B tokens (100%)" block, at tiny sizes
lr=2.0e-4
ltd_enabled=${LTD_ENABLED:-false}
ltd_start=64        # the original: 2048 (= seq_len)
ltd_step=1
cl_enabled="true"
cl_num_metric=1
cl_1st_metric="seqlen_truncate"
cl_1st_index_to_sample_path="dummy"
cl_1st_index_to_metric_path="dummy"
cl_1st_difficulty_type="value"
cl_1st_clustering_type="single_cluster"
cl_1st_min=16       # the original: 80
cl_1st_max=64       # the original: 2048 (= seq_len)
cl_1st_total_step=4 # the original: 110000
cl_1st_difficulty_step=8
cl_1st_root=1

###############################################################################
### The base script
## The original: GPT-3 XL 1.3B at seq 2048
seq_len=64
num_layers=2
hidden_size=64
num_attn_heads=4
global_batch_size=4
min_lr=1.0e-6
init_std=0.013

## Training duration: the original's train_tokens_in_billion (300) is the termination condition;
## here the tokens of 3 iterations at the curriculum's lengths (global batch x 24, 40, 48).
train_tokens=$(( global_batch_size * (24 + 40 + 48) ))   # 3 iterations
train_samples=$(( 3 * global_batch_size * seq_len * 2 / seq_len ))  # large enough, as the original
exit_duration=30000000
lr_warmup_tokens=$seq_len
lr_decay_tokens=$train_tokens
lr_decay_style="cosine"

## Model parallelism, 1 is no MP
mp_size=${TP_SIZE:-1}
## Pipeline parallelism. To disable PP, set pp_size to 1 and no_pp to true.
pp_size=1
no_pp="true"
## ZeRO-based data parallelism, stage=0 will disable ZeRO
zero_stage=1
## The original counts the GPUs with ds_ssh/nvidia-smi; here the launcher's CPU ranks
num_gpus=$NUM_RANKS
dp_size=$(( num_gpus / pp_size / mp_size ))
batch_size=$(( global_batch_size / dp_size ))

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
doc_idx_path="${data_path}_train_indexmap_exact1ep_64sl_1234s_doc_idx.npy"
sample_idx_path="${data_path}_train_indexmap_exact1ep_64sl_1234s_sample_idx.npy"
shuffle_idx_path="${data_path}_train_indexmap_exact1ep_64sl_1234s_shuffle_idx.npy"
vocab_path="$COMPAT_DATA/tokenizers/gpt2/vocab.json"
merge_path="$COMPAT_DATA/tokenizers/gpt2/merges.txt"
prescale_grad="true"
if [[ $zero_stage -gt 0 ]]; then
    prescale_grad="false"
fi
checkpoint_path="$OUT/checkpoint"
tensorboard_path="$OUT/tensorboard"
mkdir -p "$checkpoint_path" "$tensorboard_path"
if [ "${cl_enabled}" = "true" ]; then
    data_cluster_path="$OUT/data_cluster"
    mkdir -p "$data_cluster_path"
fi

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
if [ "${ltd_enabled}" = "true" ]; then
    megatron_options+=(--random-ltd)  # refused here (see above)
fi
if [ "${cl_enabled}" = "true" ]; then
    megatron_options+=(
        --train-doc-idx-path "${doc_idx_path}"
        --train-sample-idx-path "${sample_idx_path}"
        --train-shuffle-idx-path "${shuffle_idx_path}"
        --data-efficiency-curriculum-learning)
fi

# The original's fp16 on CPU: the template's fp16 section off and a bf16 one on (see above)
if [ "$precision" = fp16 ]; then
    precision_sed=''
else
    precision_sed='/"fp16": {/,/}/ s/"enabled": true/"enabled": false/
s/^  "fp16": {/  "bf16": {\n    "enabled": true\n  },\n\n  "fp16": {/'
fi
config_json="$OUT/ds_config_gbs${global_batch_size}_mbs${batch_size}_log${log_interval}_zero${zero_stage}_seed${seed}"
if [ "${ltd_enabled}" = "true" ]; then
    config_json="${config_json}_ltd_${ltd_start}_${ltd_step}"
fi
if [ "${cl_enabled}" = "true" ]; then
    config_json="${config_json}_cl_${cl_1st_metric}_${cl_1st_min}_${cl_1st_max}_${cl_1st_total_step}_${cl_1st_root}"
fi
config_json="${config_json}.json"
template_json="$ROOT/examples/compat/ds_config_gpt_1clmetric_TEMPLATE.json"
sed "s/GBSIZE/${global_batch_size}/" ${template_json} \
    | sed "s/MBSIZE/${batch_size}/" \
    | sed "s/LOG_INTERVAL/${log_interval}/" \
    | sed "s/ZERO_STAGE/${zero_stage}/" \
    | sed "s/PRESCALE_GRAD/${prescale_grad}/" \
    | sed "s/DATA_EFFICIENCY_SEED/${seed}/" \
    | sed "s/LTD_ENABLED/${ltd_enabled}/" \
    | sed "s/LTD_MIN/${ltd_start}/" \
    | sed "s/LTD_MAX/${seq_len}/" \
    | sed "s/LTD_STEP/${ltd_step}/" \
    | sed "s/CL_ENABLED/${cl_enabled}/" \
    | sed "s/DATA_SAMPLING_NUM_WORKERS/${num_workers}/" \
    | sed "s#CL_CLUSTER_PATH#${data_cluster_path}#" \
    | sed "s#CL_1st_METRIC_NAME#${cl_1st_metric}#" \
    | sed "s#CL_1st_SAMPLE_PATH#${cl_1st_index_to_sample_path}#" \
    | sed "s#CL_1st_METRIC_PATH#${cl_1st_index_to_metric_path}#" \
    | sed "s#CL_1st_DIFF_TYPE#${cl_1st_difficulty_type}#" \
    | sed "s#CL_1st_CLUSTER_TYPE#${cl_1st_clustering_type}#" \
    | sed "s/CL_1st_MIN/${cl_1st_min}/" \
    | sed "s/CL_1st_MAX/${cl_1st_max}/" \
    | sed "s/CL_1st_TOTAL_STEP/${cl_1st_total_step}/" \
    | sed "s/CL_1st_DIFF_STEP/${cl_1st_difficulty_step}/" \
    | sed "s/CL_1st_ROOT/${cl_1st_root}/" \
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
