#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="$(bash "$ROOT/tools/setup_env.sh" | tail -n 1)"
cd "$ROOT"
export DS_ACCELERATOR=cpu TOKENIZERS_PARALLELISM=false
exec "$PY" -m pytest -q "$@"
