#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install everything into it:
# torch==2.13.0 first (the CPU wheel on these machines; GPU users install their CUDA torch before),
# then the project's dependencies with the test extras. Prints the venv's python path on the last
# line. pip's output goes to .venv/install.log (shown if an install step fails).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VENV:-$ROOT/.venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.installed-$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
pip_install() {
  if ! "$VENV/bin/python" -m pip install "$@" >>"$VENV/install.log" 2>&1; then
    echo "[setup] pip install $* failed; last lines of $VENV/install.log:" >&2
    tail -n 40 "$VENV/install.log" >&2
    exit 1
  fi
}
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing torch==2.13.0 and the project's dependencies (first run: a few minutes)" >&2
  pip_install --upgrade pip
  pip_install "torch==2.13.0"
  pip_install "$ROOT[test]"
  rm -f "$VENV"/.installed-*
  touch "$STAMP"
  echo "[setup] done" >&2
fi
echo "$VENV/bin/python"
