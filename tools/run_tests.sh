#!/usr/bin/env bash
# Set up .venv (if needed) and run the whole test suite. Extra arguments go to pytest.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cpu_env.sh"  # .venv, DS_ACCELERATOR=cpu, TORCH_EXTENSIONS_DIR
exec "$PY" -m pytest -q "$@"
