# Sourced (never run) by the CPU example scripts, tools/run_tests.sh and docs/make_images.sh:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
#
# Sets up the project's virtual environment with tools/setup_env.sh (created on first use; $VENV
# picks another one) and defines
#   ROOT           the repository root (the caller's working directory becomes it)
#   PY, DEEPSPEED  the venv's python and its deepspeed launcher (no venv needs to be active)
#   master_port    a function printing the port for the next launch: $MASTER_PORT when set, else
#                  a port nothing listens on now (another job may hold DeepSpeed's default 29500)
# and exports the CPU run settings: DS_ACCELERATOR=cpu, one OpenMP thread per rank (unless
# OMP_NUM_THREADS is set), unbuffered output, TORCH_EXTENSIONS_DIR beside the venv, so the
# CPU communication op DeepSpeed builds on first use is built once per venv and never picked up
# from (or left locked by) another environment, and TORCHDYNAMO_DISABLE=1 (unless set). Nothing is
# compiled on a CPU run (the torch.compile'd fused kernels are GPU-only: megatron/model/fusions.py),
# but megatron-core wraps 38 functions in torch.compile at import, which loads torch's compiler
# stack: about 1 s of every rank's start-up. With it set, torch.compile returns the function as is.
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/tools/setup_env.sh" | tail -n 1)"
DEEPSPEED="$(dirname "$PY")/deepspeed"
cd "$ROOT"
export DS_ACCELERATOR=cpu TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
export TORCHDYNAMO_DISABLE="${TORCHDYNAMO_DISABLE:-1}"
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$(dirname "$(dirname "$PY")")/torch_extensions}"

master_port() {
  if [ -n "${MASTER_PORT:-}" ]; then
    echo "$MASTER_PORT"
  else
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
  fi
}
