#!/usr/bin/env bash
# Train and test task=pcc with each attention (softmax, local, lavo, gsa) at the default
# sizes, all four at once on one GPU (bf16-mixed), then print their test metrics and the
# partial-cloud baseline's. Each run writes OUT/<attention>/metrics.json.
#
#   DATA=/path/to/primitives STEPS=2000 OUT=pcc_runs bash benchmarks/pcc_runs.sh [KEY=VALUE ...]
#
# DATA: a folder in the PCN layout (empty: the default shapes, built once per machine into
# the default-data cache, $LAVO_TASKS_CACHE or ~/.cache/lavo-tasks, which needs open3d).
# STEPS: training steps (default 2000; validation every STEPS/4). MAX_TIME: the training
# time limit of each run (default 00:00:06:00; the test runs after it). PRECISION:
# bf16-mixed. Extra KEY=VALUE arguments go to every run. `local` has no cross-attention
# pattern and keeps softmax there (as bench_e2e does).
set -euo pipefail
STEPS=${STEPS:-2000}
OUT=${OUT:-pcc_runs}
DATA=${DATA:-}
MAX_TIME=${MAX_TIME:-00:00:06:00}
PRECISION=${PRECISION:-bf16-mixed}
PYTHON=${PYTHON:-python}
mkdir -p "$OUT"
declare -A EXTRA=([softmax]="" [local]="model.cross_attention=softmax" [lavo]="" [gsa]="")
pids=()
for attention in softmax local lavo gsa; do
  # shellcheck disable=SC2086  # EXTRA holds whole KEY=VALUE words
  $PYTHON -m lavo_tasks.train task=pcc attention=$attention ${EXTRA[$attention]} \
    "data.path=$DATA" "run.dir=$OUT/$attention" "trainer.max_steps=$STEPS" \
    "trainer.val_check_interval=$(( STEPS >= 4 ? STEPS / 4 : 1 ))" "trainer.max_time=$MAX_TIME" \
    "trainer.precision=$PRECISION" trainer.enable_progress_bar=false "$@" > "$OUT/$attention.log" 2>&1 &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
$PYTHON - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| run | CD-l1 | CD-l2 | F-score@1% | tested step | wall s |\n|---|---|---|---|---|---|")
for attention in ("softmax", "local", "lavo", "gsa"):
    try:
        m = json.loads((out / attention / "metrics.json").read_text())
        meta = json.loads((out / attention / "metrics.meta.json").read_text())
    except FileNotFoundError:
        print(f"| {attention} | failed: see {out / attention}.log | | | | |")
        continue
    print(f"| {attention} | {m['test_cd_l1']:.2f} | {m['test_cd_l2']:.3f} | {m['test_fscore']:.3f} | "
          f"{meta['checkpoint']['step']} | {meta['resources']['wall_s']:.0f} |")
print(f"| partial cloud | {m['test_partial_cd_l1']:.2f} | {m['test_partial_cd_l2']:.3f} | {m['test_partial_fscore']:.3f} | | |")
PY
exit $status
