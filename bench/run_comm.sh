#!/bin/sh
# run_comm.sh - adtrain's collectives against bare MPI (bench/bench_comm.c), one command.
#
#   sh bench/run_comm.sh
#
# Builds bench_comm, then launches it under mpiexec once per configuration: 2 ranks and 4 ranks
# with adtrain's default polling (auto: spin where every rank has a core, yield and sleep where
# ranks outnumber cores), and 4 ranks with ADT_COMM_POLL=busy (spin as MPI does) to show what
# the polling choice is worth when ranks share cores. Within a run the two paths alternate rep by
# rep (see bench_comm.c). Every JSON line goes to bench/results/comm-<UTC date-time>.jsonl with
# a "config" field, after one "meta" line about the machine; the summary table goes to stdout.
#
# Environment (all optional):
#   REPS=30  WARMUP=3  MIN_BYTES=65536  MAX_BYTES=67108864  OPS=allreduce,reduce_scatter,allgather
#   BUDGET_S=20   seconds per op and size before a run stops early (at least 5 reps)
#   CONFIGS="2:auto 4:auto 4:busy"   ranks:ADT_COMM_POLL per launch
#   MPIEXEC   the launcher (default: mpiexec.mpich if present, else mpiexec)
#   PYTHON=/usr/bin/python3
set -eu

cd "$(dirname "$0")/.."

REPS=${REPS:-30}
WARMUP=${WARMUP:-3}
BUDGET_S=${BUDGET_S:-20}
MIN_BYTES=${MIN_BYTES:-65536}
MAX_BYTES=${MAX_BYTES:-67108864}
OPS=${OPS:-allreduce,reduce_scatter,allgather}
CONFIGS=${CONFIGS:-2:auto 4:auto 4:busy}
PYTHON=${PYTHON:-/usr/bin/python3}
if [ -z "${MPIEXEC-}" ]; then
    if command -v mpiexec.mpich >/dev/null 2>&1; then MPIEXEC=mpiexec.mpich; else MPIEXEC=mpiexec; fi
fi
BIN=build/bench/bench_comm

${MAKE:-make} --no-print-directory "$BIN" >&2

# bench/results/ keeps only its .gitignore in git
OUT=bench/results/comm-$(date -u +%Y%m%d-%H%M%S).jsonl
RUN="$OUT.run"

CPU=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
NCPU=$(nproc 2>/dev/null || echo '?')
MPICH=$(dpkg-query -W -f '${Version}' libmpich12 2>/dev/null || echo unknown)
UCX=$(dpkg-query -W -f '${Version}' libucx0 2>/dev/null || echo unknown)
LOAD=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)
"$PYTHON" - "$CPU" "$NCPU" "$MPICH" "$UCX" "$LOAD" "$REPS" "$WARMUP" "$MPIEXEC" > "$OUT" <<'EOF'
import datetime, json, sys
a = sys.argv[1:]
print(json.dumps({"meta": {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "cpu": a[0], "cpus": a[1], "mpich_package": a[2], "ucx_package": a[3],
    "loadavg_at_start": a[4], "reps": int(a[5]), "warmup": int(a[6]), "mpiexec": a[7]}}))
EOF

for cfg in $CONFIGS; do
    n=${cfg%%:*}
    poll=${cfg#*:}
    echo "mpiexec -n $n, ADT_COMM_POLL=$poll ..." >&2
    ADT_COMM_POLL=$poll "$MPIEXEC" -n "$n" "$BIN" --ops "$OPS" --reps "$REPS" --warmup "$WARMUP" \
        --budget-s "$BUDGET_S" \
        --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" > "$RUN"
    sed -n "s/^{/{\"config\": \"$n:$poll\", /p" "$RUN" >> "$OUT"
done
rm -f "$RUN"
echo "LOAD at end: $(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null)" >&2
echo "raw results: $OUT" >&2

"$PYTHON" - "$OUT" <<'EOF'
"""Summary of one run_comm.sh results file: per configuration, op and size, the medians and
10th..90th percentile spreads of the paths, bus bandwidths and the bandwidth ratios."""
import json, sys

lines = [json.loads(line) for line in open(sys.argv[1])]
meta = next((d["meta"] for d in lines if "meta" in d), {})
rows = [d for d in lines if "meta" not in d]

def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"

print(f"date {meta.get('date')}  cpu {meta.get('cpu')} ({meta.get('cpus')} cpus)  "
      f"load at start {meta.get('loadavg_at_start')}")
print(f"MPICH {meta.get('mpich_package')}, UCX {meta.get('ucx_package')}, launcher {meta.get('mpiexec')}; "
      f"{meta.get('reps')} timed reps per path and size after {meta.get('warmup')} warmup")
print()
print("| ranks | polling | op | size | reps | adtrain us | (p10..p90) | MPI us | (p10..p90) | MPI nb us "
      "| adtrain busbw GB/s | MPI busbw GB/s | bw ratio | paired ratio | vs nb |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for r in rows:
    a, m, nb = r["adtrain_us"], r["mpi_us"], r["mpi_nb_us"]
    pr = r["ratio_paired"]
    print(f"| {r['ranks']} | {r['poll']} | {r['op']} | {size(r['bytes'])} | {r['reps']} | {a['median']:.1f} | "
          f"{a['p10']:.1f}..{a['p90']:.1f} | {m['median']:.1f} | {m['p10']:.1f}..{m['p90']:.1f} | "
          f"{nb['median']:.1f} | {r['adtrain_busbw_gbs']:.3f} | {r['mpi_busbw_gbs']:.3f} | "
          f"{r['ratio_of_medians']:.3f} | {pr['median']:.3f} ({pr['p10']:.2f}..{pr['p90']:.2f}) | "
          f"{r['nb_ratio_of_medians']:.3f} |")
print()
print("bw ratio: adtrain bandwidth / MPI bandwidth from the medians (MPI time / adtrain time);")
print("paired ratio: median (p10..p90) of the per-rep ratios of back-to-back calls;")
print("MPI nb: the bare non-blocking call polled by MPI_Test; vs nb: its time / adtrain's.")
ar = [r for r in rows if r["op"] == "allreduce" and r["poll"] == "auto"]
for n in sorted({r["ranks"] for r in ar}):
    sel = [r["ratio_of_medians"] for r in ar if r["ranks"] == n]
    worst = min(sel)
    print(f"allreduce, {n} ranks: lowest bw ratio {worst:.3f} over {len(sel)} sizes "
          f"(target >= 0.95: {'met' if worst >= 0.95 else 'not met'})")
EOF
