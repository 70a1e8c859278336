#!/bin/sh
# run_comm.sh - adtrain's collectives against bare MPI (bench/bench_comm.c), one command.
#
#   sh bench/run_comm.sh
#
# Builds bench_comm, then runs ROUNDS rounds; a round launches it under mpiexec once per
# configuration: 2 ranks and 4 ranks with adtrain's default polling (auto: spin where every rank
# has a core, yield and nap where ranks outnumber cores), and 4 ranks with ADT_COMM_POLL=busy
# (spin as MPI does) to show what the polling choice is worth when ranks share cores. Within a
# launch the three paths (adtrain, MPI's blocking call, MPI's non-blocking call polled by
# MPI_Test) take turns rep by rep (see bench_comm.c); rounds repeat the launches so that a burst
# of load from other processes spoils one round, not the result. Every JSON line goes to
# bench/results/comm-<UTC date-time>.jsonl with "round" and "config" fields, after one "meta"
# line about the machine; the summary table goes to stdout, progress to stderr.
#
# Environment (all optional):
#   ROUNDS=3  REPS=30  WARMUP=3  MIN_BYTES=65536  MAX_BYTES=67108864
#   OPS=allreduce,reduce_scatter,allgather
#   BUDGET_S=20   seconds per op and size before a launch stops early (at least 5 reps)
#   CONFIGS="2:auto 4:auto 4:busy"   ranks:ADT_COMM_POLL per launch
#   MPIEXEC   the launcher (default: mpiexec.mpich if present, else mpiexec)
#   PYTHON=/usr/bin/python3
set -eu

cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
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
"$PYTHON" - "$CPU" "$NCPU" "$MPICH" "$UCX" "$LOAD" "$ROUNDS" "$REPS" "$WARMUP" "$MPIEXEC" > "$OUT" <<'EOF'
import datetime, json, sys
a = sys.argv[1:]
print(json.dumps({"meta": {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "cpu": a[0], "cpus": a[1], "mpich_package": a[2], "ucx_package": a[3],
    "loadavg_at_start": a[4], "rounds": int(a[5]), "reps": int(a[6]), "warmup": int(a[7]),
    "mpiexec": a[8]}}))
EOF

r=1
while [ "$r" -le "$ROUNDS" ]; do
    for cfg in $CONFIGS; do
        n=${cfg%%:*}
        poll=${cfg#*:}
        echo "round $r/$ROUNDS: mpiexec -n $n, ADT_COMM_POLL=$poll (load $(cut -d ' ' -f 1 /proc/loadavg))" >&2
        ADT_COMM_POLL=$poll "$MPIEXEC" -n "$n" "$BIN" --ops "$OPS" --reps "$REPS" --warmup "$WARMUP" \
            --budget-s "$BUDGET_S" --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" > "$RUN"
        sed -n "s/^{/{\"round\": $r, \"config\": \"$n:$poll\", /p" "$RUN" >> "$OUT"
    done
    r=$((r + 1))
done
rm -f "$RUN"
echo "load at end: $(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null)" >&2
echo "raw results: $OUT" >&2

"$PYTHON" - "$OUT" <<'EOF'
"""Summary of one run_comm.sh results file. Per configuration, op and size: each path's median
over rounds of the launches' medians (spread: min..max of those), bus bandwidths from them, the
ratio of adtrain's bandwidth to MPI's blocking call's from those medians, the median over rounds
of the launches' paired ratios, and the ratio against MPI's non-blocking call."""
import json, statistics, sys

lines = [json.loads(line) for line in open(sys.argv[1])]
meta = next((d["meta"] for d in lines if "meta" in d), {})
rows = [d for d in lines if "meta" not in d]


def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


groups = {}
for r in rows:
    groups.setdefault((r["ranks"], r["poll"], r["op"], r["bytes"]), []).append(r)

print(f"date {meta.get('date')}  cpu {meta.get('cpu')} ({meta.get('cpus')} cpus)  "
      f"load at start {meta.get('loadavg_at_start')}")
print(f"MPICH {meta.get('mpich_package')}, UCX {meta.get('ucx_package')}, launcher {meta.get('mpiexec')}; "
      f"{meta.get('rounds')} rounds x up to {meta.get('reps')} reps per path and size "
      f"(after {meta.get('warmup')} warmup)")
print()
print("| ranks | polling | op | size | adtrain us | (spread) | MPI us | (spread) | MPI nb us "
      "| adtrain busbw GB/s | MPI busbw GB/s | bw ratio | paired ratio | vs nb |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
worst = {}
for key in sorted(groups, key=lambda k: (k[0], k[1] != "auto", k[1], k[2], k[3])):
    g = groups[key]
    ranks, poll, op, nbytes = key
    med = {p: [x[p + "_us"]["median"] for x in g] for p in ("adtrain", "mpi", "mpi_nb")}
    a, m, nb = (statistics.median(med[p]) for p in ("adtrain", "mpi", "mpi_nb"))
    factor = (2.0 if op == "allreduce" else 1.0) * (ranks - 1) / ranks
    ratio, paired = m / a, statistics.median(x["ratio_paired"]["median"] for x in g)
    print(f"| {ranks} | {poll} | {op} | {size(nbytes)} | {a:.1f} | {min(med['adtrain']):.1f}..{max(med['adtrain']):.1f} | "
          f"{m:.1f} | {min(med['mpi']):.1f}..{max(med['mpi']):.1f} | {nb:.1f} | "
          f"{factor * nbytes / a / 1e3:.3f} | {factor * nbytes / m / 1e3:.3f} | {ratio:.3f} | {paired:.3f} | "
          f"{nb / a:.3f} |")
    if op == "allreduce":
        w = worst.setdefault((ranks, poll), [9, 9])
        w[0], w[1] = min(w[0], ratio), min(w[1], paired)
print()
print("us: median over rounds of each launch's median time (slowest rank per call); spread: min..max")
print("of those launch medians; bw ratio: adtrain bandwidth / MPI bandwidth (MPI time / adtrain time);")
print("paired ratio: median over rounds of each launch's median per-rep ratio of back-to-back calls;")
print("MPI nb: the bare non-blocking call polled by MPI_Test; vs nb: its time / adtrain's.")
for (ranks, poll), (ratio, paired) in sorted(worst.items()):
    print(f"allreduce, {ranks} ranks, polling {poll}: lowest bw ratio {ratio:.3f}, lowest paired ratio "
          f"{paired:.3f} (target >= 0.95: {'met' if min(ratio, paired) >= 0.95 else 'not met'})")
EOF
