#!/usr/bin/env bash
# Set up .venv (if needed), lint the tree (ruff, configured in pyproject.toml [tool.ruff]: a lint
# error fails the run before any test) and run the whole test suite (tests/unit/ and tests/e2e/;
# the layout, the markers and the rules: tests/README.md). Extra arguments go to pytest (after the
# defaults, so they win: -n 0 runs in one process; -m "not launch" runs the fast set, no test that
# starts a process).
#
# TEST_WORKERS (default 2) pytest-xdist workers take whole test files (--dist loadfile: a file's
# module fixtures, such as one training run several tests read, run once), the slowest files first
# (tests/conftest.py orders them; --no-loadscope-reorder keeps that order). Half of a launch's wall
# time is the deepspeed launcher starting and stopping on one core, so two workers fill a 2-core
# machine.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/cpu_env.sh"  # .venv, DS_ACCELERATOR=cpu, TORCH_EXTENSIONS_DIR
"$PY" -m ruff check .  # from the repository root (cpu_env.sh changes to it)
exec "$PY" -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
