#!/bin/sh
# run_ps.sh - the parameter-server mode's throughput: bench/bench_ps.c under mpiexec (2 servers +
# 2 workers) in sync, ssp:2 and async, with and without prefetch, dense parameters all-reduced
# among the workers or kept on the servers, beside PyTorch's one-process
# DLRM with sparse embeddings (bench/torch_ps_peer.py), on the same model and Zipf ids.
#
#   sh bench/run_ps.sh [rounds]
#
# Each round runs every configuration once, the order reversed every other round. JSON lines go
# to bench/results/ps-<UTC date-time>.jsonl (a "meta" line first, with the load average before
# and after); the summary (per configuration: median samples/s over rounds, min and max) to stdout.
#
# Environment: ROUNDS=3 STEPS=30 WARMUP=5 BATCH=512 TABLES=8 ROWS=1000000 ALPHA=1.05
#              TORCH_THREADS=2 PYTHON=/usr/bin/python3 MPIEXEC=mpiexec.mpich
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-${ROUNDS:-3}}
STEPS=${STEPS:-30}; WARMUP=${WARMUP:-5}; BATCH=${BATCH:-512}; TABLES=${TABLES:-8}; ROWS=${ROWS:-1000000}
ALPHA=${ALPHA:-1.05}; TORCH_THREADS=${TORCH_THREADS:-2}; PYTHON=${PYTHON:-/usr/bin/python3}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
make -s -j2 build/bench/bench_ps >&2
mkdir -p bench/results
out=bench/results/ps-$(date -u +%Y%m%dT%H%M%SZ).jsonl
common="--steps $STEPS --warmup $WARMUP --batch $BATCH --tables $TABLES --rows $ROWS --alpha $ALPHA"
printf '{"meta": {"host": "%s", "cores": %s, "load_before": "%s", "rounds": %s}}\n' "$(hostname)" "$(nproc)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "$ROUNDS" >"$out"
# sync mode, prefetch depth, where the dense parameters live
configs="sync,0,workers sync,2,workers ssp:2,2,workers async,0,workers async,2,workers sync,2,servers ssp:2,2,servers async,2,servers torch"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    list=$configs
    [ $((r % 2)) -eq 0 ] && list=$(echo "$configs" | tr ' ' '\n' | tac | tr '\n' ' ')
    for c in $list; do
        echo "round $r: $c" >&2
        if [ "$c" = torch ]; then
            line=$("$PYTHON" bench/torch_ps_peer.py $common --threads "$TORCH_THREADS")
        else
            sync=$(echo "$c" | cut -d, -f1); pf=$(echo "$c" | cut -d, -f2); dense=$(echo "$c" | cut -d, -f3)
            line=$($MPIEXEC -n 4 build/bench/bench_ps --servers 2 --sync "$sync" --prefetch "$pf" --dense "$dense" $common)
        fi
        echo "$line" | sed "s/^{/{\"round\": $r, /" >>"$out"
    done
    r=$((r + 1))
done
printf '{"meta_end": {"load_after": "%s"}}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
"$PYTHON" - "$out" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples_per_s"' in l]
by = {}
for r in rows:
    key = ("pytorch 1 process" if r["config"] == "pytorch-1proc"
           else f'adtrain ps {r["sync"]} prefetch {r["prefetch"]} dense on {r.get("dense", "workers")}')
    by.setdefault(key, []).append(r["samples_per_s"])
print(f"{'configuration':48s} {'samples/s median':>16s} {'min':>9s} {'max':>9s}  rounds")
for k, v in by.items():
    print(f"{k:48s} {statistics.median(v):16.1f} {min(v):9.1f} {max(v):9.1f}  {len(v)}")
print("results:", sys.argv[1])
PY
