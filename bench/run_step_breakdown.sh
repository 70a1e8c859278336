#!/bin/sh
# run_step_breakdown.sh - where a plan's step goes, the cost model's parts beside the executor's
# profile (bench/step_breakdown.py), one command:
#
#   sh bench/run_step_breakdown.sh          (about 8 minutes on a 2-core machine: 5 of calibration)
#
# The planner accuracy benchmark says how far a predicted step is off; this says in which part:
# compute, producing the input (against the step's time outside the executor), the communication
# left exposed (against the time blocked in waits and polling) and each collective kind.
# Lines go to bench/results/step-breakdown-<UTC date-time>.jsonl after a "meta" line (with the
# cluster the plans were priced on); the summary to stdout.
#
# Environment: MODEL=configs/dlrm-small.json DATA=synthetic:dlrm BATCH=256
#              PLANS="1:dp 2:dp 2:tp 2:zero 3:dp 3:tp 3:zero 4:dp 4:tp 4:zero" ROUNDS=3 STEPS=300
#              CLUSTER=FILE (default: `adtrain calibrate` for the largest rank count and the model first)
#              SUMMARY=FILE: only the summary of a stored results file; PYTHON=/usr/bin/python3
set -eu
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-/usr/bin/python3}
if [ -n "${SUMMARY:-}" ]; then exec "$PYTHON" bench/step_breakdown.py --summary "$SUMMARY"; fi
export MODEL=${MODEL:-configs/dlrm-small.json} DATA=${DATA:-synthetic:dlrm} BATCH=${BATCH:-256}
export PLANS=${PLANS:-1:dp 2:dp 2:tp 2:zero 3:dp 3:tp 3:zero 4:dp 4:tp 4:zero} ROUNDS=${ROUNDS:-3} STEPS=${STEPS:-300}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
${MAKE:-make} --no-print-directory build/adtrain >&2
mkdir -p bench/results
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/step-breakdown-$STAMP.jsonl
if [ -z "${CLUSTER:-}" ]; then
    MAXR=$(for p in $PLANS; do echo "${p%%:*}"; done | sort -n | tail -n 1)
    CLUSTER=$(mktemp /tmp/adt-cluster-XXXXXX.json)
    echo "calibrating this machine for $MAXR ranks and $MODEL:$BATCH (about 5 minutes)" >&2
    build/adtrain calibrate --ranks "$MAXR" --procs 9 --model "$MODEL:$BATCH" -o "$CLUSTER" >&2
fi
"$PYTHON" - "$CLUSTER" "$(cut -d ' ' -f 1-3 /proc/loadavg)" > "$OUT" <<'PY'
import datetime, json, os, sys
print(json.dumps({"meta": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "cpus": os.cpu_count(), "loadavg_at_start": sys.argv[2], "model": os.environ["MODEL"],
                           "data": os.environ["DATA"], "batch": int(os.environ["BATCH"]), "plans": os.environ["PLANS"],
                           "rounds": int(os.environ["ROUNDS"]), "steps": int(os.environ["STEPS"]),
                           "cluster": json.load(open(sys.argv[1]))}}))
PY
"$PYTHON" bench/step_breakdown.py "$CLUSTER" "$OUT"
echo "stored: $OUT" >&2
