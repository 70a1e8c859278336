#!/bin/sh
# run_ps_straggler.sh - straggler mitigation in the parameter-server mode: 2 servers + 2 workers
# (mpiexec -n 4), --ps-sync async, dense parameters on the servers, one worker (rank 3) under
# real contention, with the fixed split (static: each worker its block of every global batch) and
# with dynamic sharding (--straggler-policy dd: server 0 hands chunks of a worker's batch to
# whichever worker asks). Throughput (samples/s over the run) against the ideal: the sum of the
# workers' capacities (samples per second of busy time: a worker's time after its first step less
# its waits for rows, pushes, chunks and the other workers), each worker's best over the round's
# runs (the runs' {"ps_workers": ...} log records; under dynamic sharding a heavily slowed worker
# may train no chunk after its first, and so has no capacity of its own in that run).
#
#   sh bench/run_ps_straggler.sh [rounds]
#
# Contention: rank 3 runs in a cgroup (v1 cpu controller) with a CPU quota of QUOTA percent of a
# CPU (root needed; CONTENTION=hog runs HOGS scripts/cpu_hog.sh busy loops on CPU 1, with rank 3
# pinned there, instead). Each round runs static then dynamic, the order reversed every other
# round. JSON lines to bench/results/ps-straggler-<UTC date-time>.jsonl (the load average beside
# each run); the summary (median, min and max over rounds of samples/s, of the ideal, and of their
# ratio; the slowed worker's share of the samples) on stdout.
#
# Environment: ROUNDS=3 STEPS=300 BATCH=4096 MODEL=configs/dlrm-small.json QUOTA=25 PREFETCH=2
#              CONTENTION=cgroup HOGS=2 MPIEXEC=mpiexec.mpich PYTHON=/usr/bin/python3
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-${ROUNDS:-3}}
STEPS=${STEPS:-300}; BATCH=${BATCH:-4096}; MODEL=${MODEL:-configs/dlrm-small.json}; QUOTA=${QUOTA:-25}
PREFETCH=${PREFETCH:-2}; CONTENTION=${CONTENTION:-cgroup}; HOGS=${HOGS:-2}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}; PYTHON=${PYTHON:-/usr/bin/python3}
make -s -j2 build/adtrain >&2
mkdir -p bench/results
out=bench/results/ps-straggler-$(date -u +%Y%m%dT%H%M%SZ).jsonl
log=$(mktemp /tmp/adt-ps-straggler.XXXXXX)
CG=/sys/fs/cgroup/cpu/adt_ps_straggler_$$
hogs=
cleanup() {
    for h in $hogs; do kill -- "-$h" 2>/dev/null || true; done
    [ -d "$CG" ] && rmdir "$CG" 2>/dev/null || true
    rm -f "$log"
}
trap cleanup EXIT INT TERM
if [ "$CONTENTION" = cgroup ]; then
    mkdir "$CG" 2>/dev/null || { echo "run_ps_straggler.sh: cannot create $CG (root and cgroup v1 cpu needed); set CONTENTION=hog" >&2; exit 2; }
    echo 10000 > "$CG/cpu.cfs_period_us" # a short period: rank 3 slowed evenly rather than stopped
    echo $((QUOTA * 100)) > "$CG/cpu.cfs_quota_us"
else
    i=0
    while [ "$i" -lt "$HOGS" ]; do hogs="$hogs $(sh scripts/cpu_hog.sh 1)"; i=$((i + 1)); done
fi
printf '{"meta": {"host": "%s", "cores": %s, "load_before": "%s", "rounds": %s, "steps": %s, "batch": %s, "model": "%s", "contention": "%s", "quota_pct": %s, "hogs": %s}}\n' \
    "$(hostname)" "$(nproc)" "$(cut -d' ' -f1-3 /proc/loadavg)" "$ROUNDS" "$STEPS" "$BATCH" "$MODEL" "$CONTENTION" \
    "$QUOTA" "$([ "$CONTENTION" = cgroup ] && echo 0 || echo "$HOGS")" >"$out"
run() { # $1: static or dynamic
    pol=; [ "$1" = dynamic ] && pol="--straggler-policy dd"
    # shellcheck disable=SC2086 # the flags split on purpose
    set -- build/adtrain train --model "$MODEL" --data synthetic:criteo-zipf --steps "$STEPS" --batch "$BATCH" \
        --optimizer sgd --lr 0.05 --schedule constant --mode ps --ps-servers 2 --ps-sync async --ps-dense servers \
        --ps-prefetch "$PREFETCH" $pol --log "$log"
    if [ "$CONTENTION" = cgroup ]; then # rank 3 joins the cgroup, then becomes the worker
        "$MPIEXEC" -n 3 "$@" : -n 1 sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@" >/dev/null 2>&1
    else
        "$MPIEXEC" -n 3 "$@" : -n 1 taskset -c 1 "$@" >/dev/null 2>&1
    fi
}
r=1
while [ "$r" -le "$ROUNDS" ]; do
    order="static dynamic"; [ $((r % 2)) -eq 0 ] && order="dynamic static"
    for m in $order; do
        echo "round $r: $m" >&2
        load=$(cut -d' ' -f1 /proc/loadavg)
        : >"$log"
        run "$m" || echo "run_ps_straggler.sh: round $r $m failed" >&2
        rec=$(grep '"ps_workers"' "$log" | tail -1 | sed 's/,"taken":.*}}$/}}/')
        printf '{"round": %s, "mode": "%s", "load": %s, "record": %s}\n' "$r" "$m" "$load" "${rec:-null}" >>"$out"
    done
    r=$((r + 1))
done
printf '{"meta_after": {"load_after": "%s"}}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
echo "results: $out" >&2
"$PYTHON" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
meta = rows[0]["meta"]
print("ps straggler: 2 servers + 2 workers async, dense on the servers, rank 3 under " +
      (f"a cgroup ({meta['quota_pct']}% of a CPU)" if meta["contention"] == "cgroup" else f"{meta['hogs']} hogs"))
runs = [r for r in rows if r.get("mode") and r.get("record")]
# the ideal of a round: each worker's capacity (samples/s of busy time) at its best over the
# round's runs (a worker that trained no chunk after its first has none in that run), summed
def caps(r):
    p = r["record"]["ps_workers"]
    return [s / (t - w) if t - w > 0 and s > 0 else 0 for s, t, w in zip(p["steady_samples"], p["steady_s"], p["wait_s"])]
ideal = {}
for r in runs:
    c = caps(r)
    best = ideal.setdefault(r["round"], [0] * len(c))
    ideal[r["round"]] = [max(a, b) for a, b in zip(best, c)]
print(f"{'mode':8} {'samples/s':>24} {'ideal (sum of best capacities)':>32} {'ratio':>22} {'slow worker share':>20} {'load':>18}")
def fmt(v, f="%.0f"):
    return f"{f % statistics.median(v)} [{f % min(v)}, {f % max(v)}]" if v else "-"
for mode in ("static", "dynamic"):
    rs = [r for r in runs if r["mode"] == mode]
    sps = [r["record"]["ps_workers"]["samples_per_s"] for r in rs]
    idl = [sum(ideal[r["round"]]) for r in rs]
    ratio = [a / b for a, b in zip(sps, idl)]
    share = [r["record"]["ps_workers"]["samples"][1] / sum(r["record"]["ps_workers"]["samples"]) for r in rs]
    load = [r["load"] for r in rs]
    print(f"{mode:8} {fmt(sps):>24} {fmt(idl):>32} {fmt(ratio, '%.3f'):>22} {fmt(share, '%.3f'):>20} {fmt(load, '%.2f'):>18}")
print("median [min, max] over rounds; capacities per round (worker 0, worker 1): " +
      "; ".join(f"{k}: {c[0]:.0f}, {c[1]:.0f}" for k, c in sorted(ideal.items())))
PY
