#!/usr/bin/env bash
# CI's second lane: Python 3.12 with megatron-core 0.19.x (docs/megatron_core_versions.md). Creates
# .venv-py312/ on first use (torch==2.13.0 first: on Python 3.12 PyPI's torch is a CUDA build, a
# multi-GB download that runs on the CPU all the same and stays in pip's cache; then the project,
# whose pyproject picks megatron-core >=0.17,<0.20 for Python 3.12), and runs every test that
# starts no process plus one launch each of DP, TP 2 x PP 2, MoE EP 2 and T0, each against its
# single-rank reference. Extra arguments go to pytest.
#
# Python 3.12 comes from $PYTHON312, else pyenv's 3.12 (PYENV_VERSION=3.12.1 python3.12, as on
# these machines), else python3.12 on PATH; a machine without one gets one line saying so and
# exit status 0 (the default lane, tools/run_tests.sh, is the one that must run everywhere).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
find_python312() {
  local candidate
  for candidate in "${PYTHON312:-}" "env PYENV_VERSION=3.12.1 python3.12" "python3.12"; do
    [ -n "$candidate" ] || continue
    if $candidate -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      echo "$candidate"
      return 0
    fi
  done
  return 1
}
if ! PYTHON312="$(find_python312)"; then
  echo "[ci_lane_py312] skipped: no Python 3.12 here (set PYTHON312, or install it: pyenv install 3.12)"
  exit 0
fi
# the lane's own venv; tools/setup_env.sh creates it with $PYTHON (a command, word-split here)
export VENV="${VENV_PY312:-$ROOT/.venv-py312}"
PYTHON_BIN="$($PYTHON312 -c 'import sys; print(sys.executable)')"
export PYTHON="$PYTHON_BIN"
LAUNCHES=(
  "tests/e2e/test_pretrain_e2e.py::test_loss_falls_and_records_are_written"
  "tests/e2e/test_pipeline_parallel.py::test_tp2_pp2_with_recompute_equals_single_rank"
  "tests/e2e/test_moe_e2e.py::test_expert_parallel_2_equals_one_rank"
  "tests/e2e/test_pipeline_parallel.py::test_t0_prefix_lm_under_a_layout_equals_one_rank[dp2]"
)
start=$SECONDS
bash "$ROOT/tools/run_tests.sh" -m "not launch" "$@"   # creates or updates $VENV first
bash "$ROOT/tools/run_tests.sh" "${LAUNCHES[@]}" "$@"
"$VENV/bin/python" -c 'import megatron.core, sys; print(f"[ci_lane_py312] passed on Python {sys.version.split()[0]}, megatron-core {megatron.core.__version__}")'
echo "[ci_lane_py312] $((SECONDS - start)) s, the install included"
