#!/usr/bin/env bash
# BigScience tr13's eval-only twin (train/tr13-mtf/tr13-176B-mtf-xp3capmixnewcodelonglossseq-val.slurm):
# the finetuning flags of bigscience_tr13_bloomz_finetune.sh plus --eval-only True: load the
# checkpoint, evaluate every validation group once, train nothing.
#
#   LOAD=CHECKPOINTS bash examples/compat/bigscience_tr13_bloomz_eval_only.sh [OUTPUT_DIR] [extra flags]
#       (default OUTPUT_DIR runs/compat/tr13-val; LOAD defaults to runs/compat/tr13/checkpoints)
#
# VALID_DATA_PATH picks the validation groups file (default: the xP3-form file of
# tools/make_compat_data.py; the original used xP3's "validation_pretr_only" file).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT=${1:-runs/compat/tr13-val}
shift $(( $# > 0 ? 1 : 0 ))
export LOAD=${LOAD:-runs/compat/tr13/checkpoints}
exec bash "$HERE/bigscience_tr13_bloomz_finetune.sh" "$OUT" --eval-only True "$@"
