#!/usr/bin/env bash
# GPU recipe: the 350M GPT of examples/pretrain_gpt_350m.sh with a mixture of experts in every
# layer (Mixtral-style: 8 SwiGLU experts of FFN 2688, top-2 softmax router, dropless), 1.8B parameters of
# which 0.6B are active per token, on one node of 8 GPUs with bf16 and ZeRO-1. The experts are
# split over the 8 GPUs (expert-parallel 8: one expert of every layer per GPU, reduced over its
# expert-data-parallel group of 1), the dense layers are data-parallel 8; tokens reach their experts
# by all-to-all. Flags and what each costs: docs/moe.md.
# Prepare data first:  python tools/preprocess_data.py --input corpus.jsonl --output-prefix data/corpus \
#     --json-keys text --tokenizer-type GPT2BPETokenizer --vocab-file gpt2-vocab.json \
#     --merge-file gpt2-merges.txt --append-eod --workers 16
# Usage: bash examples/pretrain_gpt_350m_moe.sh [extra flags]   (NUM_GPUS, EP, DATA, VOCAB, MERGES, OUT override)
# Add --moe-grouped-gemm where Transformer Engine's grouped GEMM is installed (--transformer-impl
# transformer_engine), --expert-model-parallel-size 4 with --tensor-model-parallel-size 2
# --sequence-parallel for a TP 2 x EP 4 layout.
set -euo pipefail
NUM_GPUS=${NUM_GPUS:-8}
EP=${EP:-8}
DATA=${DATA:-data/corpus_text_document}
VOCAB=${VOCAB:-gpt2-vocab.json}
MERGES=${MERGES:-gpt2-merges.txt}
OUT=${OUT:-runs/gpt_350m_moe}
deepspeed --num_gpus "$NUM_GPUS" pretrain_gpt.py \
  --num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 \
  --max-position-embeddings 2048 --position-embedding-type rope --normalization RMSNorm --swiglu \
  --untie-embeddings-and-output-weights --disable-bias-linear \
  --num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 \
  --moe-router-dtype fp32 --moe-token-dispatcher-type alltoall \
  --expert-model-parallel-size "$EP" \
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
