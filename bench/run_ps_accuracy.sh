#!/bin/sh
# run_ps_accuracy.sh - the planner's parameter-server estimate (src/planner/ps.c) against
# `adtrain train --mode ps` on this machine. `adtrain calibrate --ranks 4` measures the machine
# with the model's own ops (CLUSTER=FILE: price on FILE instead); then every configuration
# (servers + workers, --ps-sync, --ps-prefetch) is priced by `adtrain plan --json --ps-servers S
# --ps-sync MODE --ps-prefetch D` ("ps" -> "predicted_step_s", the input price timed once and
# passed to every call as --input-s) and trained under mpiexec in interleaved rounds (order
# reversed every other round). Measured step: the worker's wall clock between the log lines of
# step WARMUP and the last step over the steps between (everything between steps counted), the
# median over rounds.
#
#   sh bench/run_ps_accuracy.sh            (about 10 minutes on a 2-core machine)
#
# Writes bench/results/ps-accuracy-<UTC date-time>.jsonl (a "meta" line with the load before and
# after, the cluster file's name, one line per run, one "predicted" line per configuration; the
# cluster file priced on beside it, ...-cluster.json) and
# prints per configuration the predicted and the median measured step, the error, and the median
# absolute error over the configurations.
#
# Environment: ROUNDS=3 STEPS=40 WARMUP=10 BATCH=512 MODEL=(8 Zipf tables of 10^6 rows x 16, as
#              bench_ps) DATA=synthetic:criteo-zipf CONFIGS="2+2,sync,0 ..." CLUSTER=FILE
#              MPIEXEC=mpiexec.mpich PYTHON=/usr/bin/python3
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}; STEPS=${STEPS:-40}; WARMUP=${WARMUP:-10}; BATCH=${BATCH:-512}
DATA=${DATA:-synthetic:criteo-zipf}; MPIEXEC=${MPIEXEC:-mpiexec.mpich}; PYTHON=${PYTHON:-/usr/bin/python3}
# servers+workers, --ps-sync, --ps-prefetch
CONFIGS=${CONFIGS:-"2+2,sync,0 2+2,sync,2 2+2,ssp:2,0 2+2,ssp:2,2 2+2,async,0 2+2,async,2 1+1,sync,0 1+1,sync,2 1+1,async,2"}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
make -s -j2 build/adtrain >&2
mkdir -p bench/results
out=bench/results/ps-accuracy-$(date -u +%Y%m%dT%H%M%SZ).jsonl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cp build/adtrain "$tmp/adtrain" # a rebuild while this runs changes neither predictions nor runs
ADT=$tmp/adtrain
if [ -n "${MODEL:-}" ]; then cp "$MODEL" "$tmp/model.json"
else
    printf '{"type": "dlrm", "n_dense": 13, "n_tables": 8, "table_rows": 1000000, "emb_dim": 16, "bottom": [64, 16], "top": [64, 1]}\n' \
        >"$tmp/model.json"
fi
M=$tmp/model.json
if [ -n "${CLUSTER:-}" ]; then cp "$CLUSTER" "$tmp/here.json"
else
    echo "calibrating (load $(cut -d' ' -f1-3 /proc/loadavg))" >&2
    "$ADT" calibrate --ranks 4 --model "$M:$BATCH" -o "$tmp/here.json" >/dev/null 2>"$tmp/cal.log" ||
        { cat "$tmp/cal.log" >&2; exit 1; }
fi
cp "$tmp/here.json" "${out%.jsonl}-cluster.json" # what the predictions were priced on (CLUSTER= to reprice)
printf '{"meta": {"host": "%s", "cores": %s, "load_before": "%s", "rounds": %s, "steps": %s, "warmup": %s, "batch": %s, "data": "%s", "cluster": "%s", "commit": "%s"}}\n' \
    "$(hostname)" "$(getconf _NPROCESSORS_ONLN)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ROUNDS" "$STEPS" "$WARMUP" "$BATCH" "$DATA" \
    "${CLUSTER:-calibrated}" "$(git rev-parse --short HEAD)" >"$out"
# the input price, timed once: every prediction takes the same
input_s=$("$ADT" plan --model "$M" --strategy dp --devices 2 --batch "$BATCH" --data "$DATA" --cluster "$tmp/here.json" --json |
    "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["input_per_sample_s"])')
for c in $CONFIGS; do
    sw=$(echo "$c" | cut -d, -f1); sync=$(echo "$c" | cut -d, -f2); pf=$(echo "$c" | cut -d, -f3)
    S=${sw%+*}; W=${sw#*+}
    "$ADT" plan --model "$M" --strategy dp --devices $((S + W)) --batch "$BATCH" --data "$DATA" --input-s "$input_s" \
        --cluster "$tmp/here.json" --json --ps-servers "$S" --ps-sync "$sync" --ps-prefetch "$pf" |
        "$PYTHON" -c 'import json,sys; j=json.load(sys.stdin)["ps"]; print(json.dumps({"predicted": sys.argv[1], **j}))' "$c" >>"$out"
done
r=1
while [ "$r" -le "$ROUNDS" ]; do
    if [ $((r % 2)) -eq 0 ]; then order=$(echo "$CONFIGS" | tr ' ' '\n' | tac | tr '\n' ' '); else order=$CONFIGS; fi
    for c in $order; do
        sw=$(echo "$c" | cut -d, -f1); sync=$(echo "$c" | cut -d, -f2); pf=$(echo "$c" | cut -d, -f3)
        S=${sw%+*}; W=${sw#*+}
        load=$(cut -d' ' -f1 /proc/loadavg)
        rm -f "$tmp/log.jsonl"
        $MPIEXEC -n $((S + W)) "$ADT" train --model "$M" --data "$DATA" --batch "$BATCH" --steps "$STEPS" --mode ps \
            --ps-servers "$S" --ps-sync "$sync" --ps-prefetch "$pf" --log "$tmp/log.jsonl" >/dev/null 2>"$tmp/err" ||
            { echo "round $r $c failed:" >&2; cat "$tmp/err" >&2; exit 1; }
        "$PYTHON" - "$tmp/log.jsonl" "$c" "$r" "$load" "$WARMUP" >>"$out" <<'PY'
import json, sys
steps = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
w = int(sys.argv[5])
a, b = steps[w - 1], steps[-1]
print(json.dumps({"config": sys.argv[2], "round": int(sys.argv[3]), "load": float(sys.argv[4]),
                  "step_s": (b["wall_s"] - a["wall_s"]) / (b["step"] - a["step"])}))
PY
        echo "round $r: $c $(tail -1 "$out")" >&2
    done
    r=$((r + 1))
done
printf '{"meta_end": {"load_after": "%s"}}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
"$PYTHON" - "$out" <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
pred = {l["predicted"]: l for l in lines if "predicted" in l}
runs = {}
for l in lines:
    if "step_s" in l: runs.setdefault(l["config"], []).append(l["step_s"])
errs = []
print(f"{'servers+workers,sync,prefetch':30s} {'predicted ms':>12s} {'measured ms':>12s} {'min':>8s} {'max':>8s} {'error':>8s}  waited/round trip ms")
for c, p in pred.items():
    m = runs.get(c)
    if not m: continue
    med = statistics.median(m)
    e = p["predicted_step_s"] / med - 1
    errs.append(abs(e))
    print(f"{c:30s} {1e3 * p['predicted_step_s']:12.3f} {1e3 * med:12.3f} {1e3 * min(m):8.3f} {1e3 * max(m):8.3f} {100 * e:+7.1f}%"
          f"  {1e3 * p['wait_s']:.3f}/{1e3 * p['round_s']:.3f}")
if errs: print(f"median absolute error {100 * statistics.median(errs):.1f}% over {len(errs)} configurations")
print("results:", sys.argv[1])
PY
