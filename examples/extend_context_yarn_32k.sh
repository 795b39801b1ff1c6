#!/usr/bin/env bash
# GPU recipe: context extension 8K -> 32K with YaRN as a mid-training stage, in the manner of
# DeepSeek-V3 (YaRN, tokens per step kept: 1920 x 32K, then 480 x 128K) and Llama 3 (a long-context
# stage after the short one): the Llama-style ~350M GPT of examples/pretrain_gpt_350m.sh on one node
# of 8 GPUs, bf16, ZeRO-1. Flags and what each stage may change: docs/context_extension.md.
#
#   stage 1  --seq-length 8192, RoPE, 64 sequences per step (512K tokens), iterations 1..EXTEND_AT:
#            linear warmup, cosine decay (the --lr-schedule-config file lr_8k.yaml)
#   stage 2  a resume of stage 1's checkpoint with --extend-context: --seq-length 32768,
#            --position-embedding-type yarn --rotary-scaling-factor 4
#            --yarn-original-max-position-embeddings 8192, 16 sequences per step (the same 512K
#            tokens), the LR re-warmed from 0 and decayed to 0 (stages appended at EXTEND_AT in
#            lr_32k.yaml, --override-opt_param-scheduler), DeepSpeed-Ulysses SP 4 (each GPU 8K
#            tokens of every sequence, attending over all 32K for 4 of the 16 heads) x DP 2, full
#            recompute; the training data continue token by token where stage 1 stopped; the
#            validation loss is logged per 8192 positions (--eval-position-buckets 8192: a working
#            extension brings the loss past 8192 down to the loss inside it)
#
# Prepare data as for examples/pretrain_gpt_350m.sh. Run the script again after an interruption:
# each stage resumes its own latest checkpoint in OUT/checkpoints with the same flags (stage 1 is
# skipped once the checkpoint is past it). To extend an 8K checkpoint trained elsewhere (with this
# model's flags), put it in OUT/checkpoints and set EXTEND_AT to its iteration. For a long-document
# mix in stage 2, give it a --data-blend-config with --override-data-mix (docs/curriculum.md).
# Usage: bash examples/extend_context_yarn_32k.sh [extra flags, both stages]
#        (NUM_GPUS, SP, DATA, VOCAB, MERGES, OUT, EXTEND_AT, LONG_ITERS, WARMUP_ITERS, REWARM_ITERS,
#        SHORT_SEQ (the long stage is 4x), SHORT_BATCH (the long stage's is a quarter) override)
set -euo pipefail
NUM_GPUS=${NUM_GPUS:-8}
SP=${SP:-4}
DATA=${DATA:-data/corpus_text_document}
VOCAB=${VOCAB:-gpt2-vocab.json}
MERGES=${MERGES:-gpt2-merges.txt}
OUT=${OUT:-runs/gpt_350m_yarn_32k}
EXTEND_AT=${EXTEND_AT:-20000}      # stage 1: 20000 x 64 x 8K = 10.5B tokens
LONG_ITERS=${LONG_ITERS:-2000}     # stage 2: 2000 x 16 x 32K = 1.05B tokens
WARMUP_ITERS=${WARMUP_ITERS:-2000}
REWARM_ITERS=${REWARM_ITERS:-100}
SHORT_SEQ=${SHORT_SEQ:-8192}
LONG_SEQ=$((4 * SHORT_SEQ))        # YaRN's --rotary-scaling-factor 4
SHORT_BATCH=${SHORT_BATCH:-64}
LONG_BATCH=$((SHORT_BATCH * SHORT_SEQ / LONG_SEQ))
CKPT="$OUT/checkpoints"
mkdir -p "$OUT"

cat > "$OUT/lr_8k.yaml" <<EOF
lr_schedule:
  - {start: 0, schedule: {type: linear, from: 0.0, to: 3.0e-4}}
  - {start: $WARMUP_ITERS, schedule: {type: cosine, from: 3.0e-4, to: 3.0e-5}}
EOF
# the same stages, then the extension's: re-warm to 3e-5 over REWARM_ITERS, cosine to 0
cat > "$OUT/lr_32k.yaml" <<EOF
lr_schedule:
  - {start: 0, schedule: {type: linear, from: 0.0, to: 3.0e-4}}
  - {start: $WARMUP_ITERS, schedule: {type: cosine, from: 3.0e-4, to: 3.0e-5}}
  - {start: $EXTEND_AT, schedule: {type: linear, from: 0.0, to: 3.0e-5}}
  - {start: $((EXTEND_AT + REWARM_ITERS)), schedule: {type: cosine, from: 3.0e-5, to: 0.0}}
EOF

MODEL=(--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --normalization RMSNorm --swiglu
       --untie-embeddings-and-output-weights --disable-bias-linear --init-method-std 0.02
       --hidden-dropout 0 --attention-dropout 0)
TRAINING=(--bf16 --zero-stage 1 --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8
          --weight-decay 0.1 --clip-grad 1.0 --lr 3e-4 --min-lr 3e-5
          --tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB" --merge-file "$MERGES"
          --data-path "$DATA" --split 969,30,1 --data-cache-path "$OUT/cache" --num-workers 2
          --log-interval 10 --eval-interval 500 --eval-iters 10
          --save "$CKPT" --load "$CKPT" --save-interval 500
          --tensorboard-dir "$OUT/tensorboard" --metrics-jsonl "$OUT/metrics.jsonl")
SHORT_STAGE=(--seq-length "$SHORT_SEQ" --max-position-embeddings "$SHORT_SEQ"
             --position-embedding-type rope
             --micro-batch-size 2 --global-batch-size "$SHORT_BATCH" --train-iters "$EXTEND_AT"
             --lr-schedule-config "$OUT/lr_8k.yaml")
LONG_STAGE=(--extend-context --seq-length "$LONG_SEQ" --max-position-embeddings "$LONG_SEQ"
            --position-embedding-type yarn --rotary-scaling-factor 4
            --yarn-original-max-position-embeddings "$SHORT_SEQ"
            --micro-batch-size 1 --global-batch-size "$LONG_BATCH"
            --train-iters "$((EXTEND_AT + LONG_ITERS))"
            --lr-schedule-config "$OUT/lr_32k.yaml" --override-opt_param-scheduler
            --ds-sequence-parallel-size "$SP"
            --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
            --eval-position-buckets "$SHORT_SEQ")

TRACKER="$CKPT/latest_checkpointed_iteration.txt"
if [ "$(cat "$TRACKER" 2>/dev/null || echo 0)" -lt "$EXTEND_AT" ]; then
  deepspeed --num_gpus "$NUM_GPUS" pretrain_gpt.py "${MODEL[@]}" "${TRAINING[@]}" "${SHORT_STAGE[@]}" "$@"
fi
deepspeed --num_gpus "$NUM_GPUS" pretrain_gpt.py "${MODEL[@]}" "${TRAINING[@]}" "${LONG_STAGE[@]}" "$@"
