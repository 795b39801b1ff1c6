#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/tools/setup_env.sh" | tail -n 1)"
cd "$ROOT"
export DS_ACCELERATOR=cpu TOKENIZERS_PARALLELISM=false
# DeepSpeed JIT-builds a CPU communication op on first use; keep the build beside this venv so
# another environment's build (or a stale lock it left) is never picked up.
export TORCH_EXTENSIONS_DIR="${TORCH_EXTENSIONS_DIR:-$(dirname "$(dirname "$PY")")/torch_extensions}"
exec "$PY" -m pytest -q "$@"
