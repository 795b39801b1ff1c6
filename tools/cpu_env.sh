# Sourced (never run) by the CPU example scripts, tools/run_tests.sh and docs/make_images.sh:
#
#   source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
#
# Sets up the project's virtual environment with tools/setup_env.sh (created on first use; $VENV
# picks another one) and defines
#   ROOT           the repository root (the caller's working directory becomes it)
#   PY, DEEPSPEED  the venv's python and its deepspeed launcher (no venv needs to be active)
#   master_port    a function printing the port for the next launch: $MASTER_PORT when set, else
#                  a free port drawn below the kernel's ephemeral range, where no outgoing
#                  connection (gloo's of other jobs) can take it before the launcher binds it, and
#                  never DeepSpeed's default 29500, which another job may hold
#                  (megatron/runtime/ports.py)
#   launch_with_port_retry LAUNCHER ARGS...
#                  a function running `LAUNCHER --master_port $(master_port) ARGS...`; when the
#                  launch fails before training because another process took that port first, it
#                  says so in one line and launches once more on another port (not when
#                  $MASTER_PORT is set: the run's error stands)
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
    (cd "$ROOT" && "$PY" -m megatron.runtime.ports)
  fi
}

launch_with_port_retry() {
  local launcher=$1 port retry err status
  shift
  if [ -n "${MASTER_PORT:-}" ]; then  # the user's port: launched as is, never changed
    "$launcher" --master_port "$MASTER_PORT" "$@"
    return
  fi
  port="$(master_port)"
  err="$(mktemp "${TMPDIR:-/tmp}/launch_stderr.XXXXXX")"
  # stderr reaches the user as it comes and is kept in $err (tee -i: Ctrl-C stops the launch, not
  # the copy); status: the launcher's, with or without the caller's pipefail
  if { "$launcher" --master_port "$port" "$@" 2>&1 1>&3 3>&- | tee -i "$err" >&2 3>&-; } 3>&1
  then status=${PIPESTATUS[0]}; else status=${PIPESTATUS[0]}; fi
  if [ "$status" != 0 ] \
      && retry="$(cd "$ROOT" && "$PY" -m megatron.runtime.ports --retry "$port" "$status" "$err")"; then
    status=0
    "$launcher" --master_port "$retry" "$@" || status=$?
  fi
  rm -f "$err"
  return "$status"
}
