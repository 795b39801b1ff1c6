#!/usr/bin/env bash
# A context-extension stage on CPU (docs/context_extension.md), with the deepspeed launcher and 2
# ranks: a tiny RoPE GPT pretrained at 64 tokens per sample on the demo corpus (16 sequences per
# step), then extended by a resume with --extend-context to 256 tokens per sample, the RoPE base
# raised from 10,000 to 500,000, 4 sequences per step (the same 1,024 tokens per step), a
# long-document mix (34% long documents; 66% the pretraining mix, half continuing where it stopped,
# half a declared replay of what stage 1 drew), an
# LR re-warmed and decayed to 0 (examples/extend_context/lr.yaml), and the validation loss per
# position range (0-64: the old context; 64-128, 128-192, 192-256: past it) per validation group.
# Finally tools/data_provenance.py --coverage shows what each dataset's token stream gave.
# Output goes to runs/extend_context/ (metrics.jsonl, checkpoints, provenance, coverage.json).
#
#   bash examples/extend_context_cpu.sh
#
# STAGE1_ITERS (default 60) and STAGE2_ITERS (default 40) set the stages' iterations (the LR file's
# stages start at 0, 10, 60 and 70: with other lengths, edit it too). MASTER_PORT=PORT picks the
# launcher's port (default: a free one). EXTEND_FLAGS_ONLY=1 prints each stage's training flags, one
# per line after a "stage1"/"stage2" line, and exits (tests/e2e/test_examples.py validates them).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
RUN=${RUN:-runs/extend_context}
STAGE1_ITERS=${STAGE1_ITERS:-60}
STAGE2_ITERS=${STAGE2_ITERS:-40}
TOTAL=$((STAGE1_ITERS + STAGE2_ITERS))

COMMON=(
  --num-layers 2 --hidden-size 128 --num-attention-heads 4 --position-embedding-type rope
  --micro-batch-size 2 --train-iters "$TOTAL" --lr 2e-3
  --lr-schedule-config examples/extend_context/lr.yaml
  --weight-decay 0.01 --clip-grad 1.0 --hidden-dropout 0 --attention-dropout 0
  --data-cache-path "$RUN/cache" --log-interval 10 --eval-interval 20 --eval-iters 2
  --save "$RUN/checkpoints" --metrics-jsonl "$RUN/metrics.jsonl"
)
STAGE1=(--seq-length 64 --max-position-embeddings 64 --global-batch-size 16
        --data-blend-config examples/extend_context/stage1_mix.yaml --exit-interval "$STAGE1_ITERS")
STAGE2=(--seq-length 256 --max-position-embeddings 256 --rotary-base 500000 --global-batch-size 4
        --data-blend-config examples/extend_context/stage2_mix.yaml --load "$RUN/checkpoints"
        --extend-context --override-data-mix --override-opt_param-scheduler
        --eval-position-buckets 64)
if [ "${EXTEND_FLAGS_ONLY:-0}" = 1 ]; then
  echo stage1; printf '%s\n' "${COMMON[@]}" "${STAGE1[@]}"
  echo stage2; printf '%s\n' "${COMMON[@]}" "${STAGE2[@]}"
  exit 0
fi
mkdir -p "$RUN"
"$PY" tools/make_demo_data.py --output-dir data/demo
"$PY" tools/make_long_documents.py --output-dir data/demo_long

echo "== stage 1: $STAGE1_ITERS iterations at 64 tokens per sample"
launch_with_port_retry "$DEEPSPEED" --num_gpus 2 pretrain_gpt.py "${COMMON[@]}" "${STAGE1[@]}"
echo "== stage 2: the extension to 256 tokens per sample, iterations $((STAGE1_ITERS + 1)) to $TOTAL"
launch_with_port_retry "$DEEPSPEED" --num_gpus 2 pretrain_gpt.py "${COMMON[@]}" "${STAGE2[@]}"
echo "== what each dataset's token stream gave (runs/extend_context/coverage.json)"
"$PY" tools/data_provenance.py --world-size 2 "${COMMON[@]}" "${STAGE2[@]}" \
  --iterations "1:$TOTAL" --output "$RUN/provenance.jsonl" --coverage "$RUN/coverage.json"
