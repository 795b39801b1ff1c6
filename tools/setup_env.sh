#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install everything into it:
# torch==2.13.0 first (the CPU wheel on these machines; GPU users install their CUDA torch before),
# then the project with its test extras. Prints the venv's python path on the last line.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.installed-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing torch==2.13.0 and the project (first run takes a few minutes)" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip >&2
  "$VENV/bin/python" -m pip install -q "torch==2.13.0" >&2
  "$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >&2
  rm -f "$VENV"/.installed-*
  touch "$STAMP"
fi
echo "$VENV/bin/python"
