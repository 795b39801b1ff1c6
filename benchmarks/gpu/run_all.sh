#!/usr/bin/env bash
# Every GPU measurement of issue 19 on one H100/H200, in under 10 minutes (each step under
# `timeout`; the limits add up to 600 s on one GPU, the device tool's limit for one command), results in one folder:
#   env.log          torch / CUDA / Transformer Engine / flash-attn versions, nvidia-smi
#   attention*.json  fwd+bwd of each attention backend on packed and prefix-LM batches, first
#                    (compiling) call excluded; TE per kernel family when TE imports
#   throughput.json  tokens/s/GPU and MFU of a ~1.3B GPT (24 x 2048, seq 2048, bf16, ZeRO 1) in
#                    the real training loop, first iterations (compilation) excluded, dense (tp1)
#                    and with 8 experts top-2 in every layer (moe-ep1, alltoall dispatcher; MFU
#                    of the active experts)
#   throughput_sp.json  the same model at seq 8192, TP 1 against DeepSpeed-Ulysses SP 2
#                    (--ds-sequence-parallel-size 2) on 2 GPUs; only where 2 GPUs are visible
#                    (adds at most 200 s), skipped with a line on a 1-GPU machine
#   throughput_moe.json  the MoE model at expert-parallel 2 (moe-ep2: each of 2 GPUs half the
#                    experts, alltoall between them), per GPU against moe-ep1 in throughput.json;
#                    only where 2 GPUs are visible (adds at most 110 s more), else skipped
#   seqlen.json      the sequence-length curriculum (benchmarks/seqlen_curriculum.py): ms/iteration
#                    and tokens/s of training k = 256, 512, 1024 tokens per sample (truncate mode)
#                    against the full 2048, one run of 8 x 2048 (the ~1.3B's width, a third of its layers),
#                    bf16, per-length warm-up iterations excluded (at most 60 s)
#   sync_*.log       5 training steps under torch.cuda.set_sync_debug_mode("error")
#   summary.md       all of it as tables (benchmarks/gpu/summarize.py), also printed at the end
#
#   bash benchmarks/gpu/run_all.sh [OUT_DIR]              the GPU run (default OUT_DIR:
#                                                         benchmarks/gpu/results/<UTC time>)
#   bash benchmarks/gpu/run_all.sh --cpu-dry-run [OUT]    every step tiny on the CPU: checks the
#                                                         script, measures nothing
# Exit status: 0 when every step finished, 1 otherwise (the summary names the failed steps).
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY="$(command -v python3)"
DRY=0
if [ "${1:-}" = "--cpu-dry-run" ]; then DRY=1; shift; fi
OUT="${1:-$ROOT/benchmarks/gpu/results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$OUT" && OUT="$(cd "$OUT" && pwd)"
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
: > "$OUT/steps.tsv"
FAILED=0

step() {  # NAME SECONDS COMMAND...: run COMMAND under timeout, log to $OUT/NAME.log
  local name="$1" limit="$2"; shift 2
  local start=$SECONDS rc
  echo "[run_all] $name (at most ${limit} s): $*"
  timeout --kill-after=10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - start))" >> "$OUT/steps.tsv"
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    echo "[run_all] $name: exit $rc ($([ "$rc" -eq 124 ] && echo "timed out" || echo "failed")); last lines of $OUT/$name.log:"
    tail -n 15 "$OUT/$name.log"
  fi
}

if [ "$DRY" = 1 ]; then
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  DEVICE=(--device cpu)
  ATTENTION=(--device cpu --tiny)
  THROUGHPUT=(--device cpu --tiny --layouts tp1 moe-ep1 --iters 3 --warmup 1 --num-workers 1
              --timeout 120)
  THROUGHPUT_SP=(--device cpu --tiny --gpus 2 --layouts sp2 --iters 3 --warmup 1 --num-workers 1
                 --timeout 170)
  THROUGHPUT_MOE=(--device cpu --tiny --gpus 2 --layouts moe-ep2 --iters 3 --warmup 1
                  --num-workers 1 --timeout 100)
  SP_GPUS=2
  SEQLEN=(--device cpu --tiny --modes truncate --timeout 80)
  MODEL=(--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64
         --micro-batch-size 2 --global-batch-size 4)
  DATA_MB=0.5
else
  DEVICE=(--device cuda)
  ATTENTION=(--device cuda --seq-length 4096 --batch 4 --heads 16 --head-dim 128 --documents 10
             --dtype bf16 --iters 20 --warmup 3)
  THROUGHPUT=(--device cuda --gpus 1 --layouts tp1 moe-ep1 --iters 12 --warmup 4 --num-workers 2
              --timeout 100)
  THROUGHPUT_SP=(--device cuda --gpus 2 --layouts tp1 sp2 --seq-length 8192 --micro-batch-size 1
                 --iters 10 --warmup 3 --num-workers 2 --timeout 95)
  THROUGHPUT_MOE=(--device cuda --gpus 2 --layouts moe-ep2 --iters 12 --warmup 4 --num-workers 2
                  --timeout 100)
  SEQLEN=(--device cuda --bf16 --num-layers 8 --hidden-size 2048 --heads 16 --seq-length 2048
          --lengths 256 512 1024 2048 --modes truncate --micro-batch-size 4 --iters 4 --warmup 2
          --rounds 1 --num-workers 2 --timeout 50)
  SP_GPUS="$("$PY" -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)"
  MODEL=(--num-layers 8 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024
         --micro-batch-size 4 --global-batch-size 8 --bf16)
  DATA_MB=5
fi

step env 15 "$PY" - <<'EOF'
import importlib.metadata as md, subprocess, torch
print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for dist in ("transformer-engine", "transformer_engine", "flash-attn", "flash-attn-3", "deepspeed", "megatron-core"):
    try:
        print(dist, md.version(dist))
    except md.PackageNotFoundError:
        print(dist, "not installed")
if torch.cuda.is_available():
    print(subprocess.run(["nvidia-smi"], capture_output=True, text=True).stdout)
EOF

step attention 120 "$PY" benchmarks/gpu/attention_backends.py "${ATTENTION[@]}" \
  --json "$OUT/attention.json"
if "$PY" -c "import transformer_engine.pytorch" > /dev/null 2>&1; then
  for kernel in flash fused unfused; do  # one process each: TE reads its switches once
    step "attention_te_$kernel" 35 "$PY" benchmarks/gpu/attention_backends.py "${ATTENTION[@]}" \
      --backends te --te-kernel "$kernel" --json "$OUT/attention_te_$kernel.json"
  done
else
  echo "[run_all] Transformer Engine does not import: no per-kernel TE runs"
fi

step throughput 185 "$PY" benchmarks/gpu/layouts_throughput.py "${THROUGHPUT[@]}" \
  --json "$OUT/throughput.json"

if [ "$SP_GPUS" -ge 2 ]; then
  step throughput_sp 200 "$PY" benchmarks/gpu/layouts_throughput.py "${THROUGHPUT_SP[@]}" \
    --json "$OUT/throughput_sp.json"
  step throughput_moe 110 "$PY" benchmarks/gpu/layouts_throughput.py "${THROUGHPUT_MOE[@]}" \
    --json "$OUT/throughput_moe.json"
else
  echo "[run_all] $SP_GPUS GPU(s) visible: the Ulysses SP 2 and MoE EP 2 throughput steps need 2, skipped"
fi

step seqlen 60 "$PY" benchmarks/seqlen_curriculum.py "${SEQLEN[@]}" --json "$OUT/seqlen.json"

step data 15 "$PY" -c "import sys; sys.path.insert(0, '.'); from tools.make_demo_data import make_demo_data; make_demo_data('$OUT/data', size_mb=$DATA_MB, verbose=False)"
TRAIN=("${MODEL[@]}" --train-iters 5 --lr 1e-4 --data-path "$OUT/data/web_text_document"
       --split 98,1,1 --eval-iters 0 --log-interval 1000 --data-cache-path "$OUT/cache")
step sync_causal 50 "$PY" benchmarks/gpu/sync_debug_steps.py "${DEVICE[@]}" -- "${TRAIN[@]}"
step sync_packed 50 "$PY" benchmarks/gpu/sync_debug_steps.py "${DEVICE[@]}" -- "${TRAIN[@]}" \
  --reset-attention-mask --reset-position-ids

"$PY" benchmarks/gpu/summarize.py "$OUT"
echo "[run_all] results in $OUT"
exit "$FAILED"
