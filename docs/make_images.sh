#!/usr/bin/env bash
# Regenerate the pictures under docs/img: one plot per built-in schedule kind
# (tools/plot_schedules.py) and the README demo's schedule + curriculum preview
# (tools/preview_schedule.py with the demo's flags, via examples/run_demo_cpu.sh); with
# WSM_DEMO=1 also the WSM recipe's merged-vs-unmerged plot (tools/wsm_demo.py: trains, 2-4 minutes).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
"$PY" tools/plot_schedules.py --output-dir docs/img
DEMO_PREVIEW_ONLY=1 bash examples/run_demo_cpu.sh
cp runs/demo/schedule_preview.png docs/img/demo_schedule_preview.png
if [ "${WSM_DEMO:-0}" = 1 ]; then "$PY" tools/wsm_demo.py --plot docs/img/wsm_merge.png; fi
echo "wrote docs/img/*.png"
