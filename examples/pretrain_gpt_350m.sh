#!/usr/bin/env bash
# GPU recipe: a ~350M-parameter GPT on one node of 8 GPUs with bf16 and ZeRO-1.
# Prepare data first:  python tools/preprocess_data.py --input corpus.jsonl --output-prefix data/corpus \
#     --json-keys text --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json \
#     --merge-file gpt2-merges.txt --append-eod --workers 16
# Usage: bash examples/pretrain_gpt_350m.sh [extra flags]   (NUM_GPUS, DATA, VOCAB, MERGES, OUT override)
set -euo pipefail
NUM_GPUS=${NUM_GPUS:-8}
DATA=${DATA:-data/corpus_text_document}
VOCAB=${VOCAB:-gpt2-vocab.json}
MERGES=${MERGES:-gpt2-merges.txt}
OUT=${OUT:-runs/gpt_350m}
deepspeed --num_gpus "$NUM_GPUS" pretrain_gpt.py \
  --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \
  --max-position-embeddings 2048 --position-embedding-type rope --normalization RMSNorm --swiglu \
  --untie-embeddings-and-output-weights --disable-bias-linear \
  --micro-batch-size 8 --global-batch-size 256 --rampup-batch-size 64 64 2000000 \
  --train-samples 146484375 --bf16 --zero-stage 1 \
  --optimizer adam --adam-beta1 0.9 --adam-beta2 0.95 --adam-eps 1e-8 --weight-decay 0.1 --clip-grad 1.0 \
  --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-samples 1000000 \
  --hidden-dropout 0 --attention-dropout 0 --init-method-std 0.02 \
  --tokenizer-type GPT2BPETokenizer --vocab-file "$VOCAB" --merge-file "$MERGES" \
  --data-path "$DATA" --split 969,30,1 --data-cache-path "$OUT/cache" --num-workers 2 \
  --log-interval 10 --eval-interval 1000 --eval-iters 10 \
  --save "$OUT/checkpoints" --load "$OUT/checkpoints" --save-interval 1000 \
  --tensorboard-dir "$OUT/tensorboard" --metrics-jsonl "$OUT/metrics.jsonl" \
  "$@"
