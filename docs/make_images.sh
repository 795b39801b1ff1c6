#!/usr/bin/env bash
# Regenerate the pictures under docs/img: one plot per built-in schedule kind
# (tools/plot_schedules.py) and the README demo's schedule + curriculum preview
# (tools/preview_schedule.py with the demo's flags, via examples/run_demo_cpu.sh); with
# WSM_DEMO=1 also the WSM recipe's merged-vs-unmerged plot (tools/wsm_demo.py: trains, 2-4 minutes);
# with MIX_EDIT_DEMO=1 the preview of the demo resumed at iteration 150 on an edited mix
# (docs/curriculum.md, "Changing the mix mid-run": trains 150 iterations first, about a minute).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../tools/cpu_env.sh"
"$PY" tools/plot_schedules.py --output-dir docs/img
DEMO_PREVIEW_ONLY=1 bash examples/run_demo_cpu.sh
cp runs/demo/schedule_preview.png docs/img/demo_schedule_preview.png
if [ "${WSM_DEMO:-0}" = 1 ]; then "$PY" tools/wsm_demo.py --plot docs/img/wsm_merge.png; fi
if [ "${MIX_EDIT_DEMO:-0}" = 1 ]; then
  rm -rf runs/demo/checkpoints
  bash examples/run_demo_cpu.sh --phase-transition-iterations 150
  DEMO_PREVIEW_ONLY=1 bash examples/run_demo_cpu.sh --load runs/demo/checkpoints \
    --data-blend-config examples/demo_anneal.yaml --override-data-mix
  cp runs/demo/schedule_preview.png docs/img/demo_mix_edit_preview.png
fi
echo "wrote docs/img/*.png"
