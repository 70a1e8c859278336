#!/bin/sh
# run_lockstep.sh - what holding ranks in step costs against the compute between two lockstep
# points (bench/bench_lockstep.c), one command:
#
#   sh bench/run_lockstep.sh            (about 6 minutes on a 2-core machine)
#
# For each rank count in RANKS, LAUNCHES launches of bench_lockstep (the rank counts in turn, so
# that a burst of load from other processes spoils one launch, not a rank count): every default
# segment (MLPs whose training step takes 0.03-30 ms when the ranks share the cores) with the
# patterns in PATTERNS after each. Lines go to bench/results/lockstep-<UTC date-time>.jsonl after
# a "meta" line; the summary (medians over launches, min..max beside) to stdout. With CLUSTER=FILE
# (a calibrated cluster, `adtrain calibrate --ranks 4`) the summary puts beside each measured loss
# what the cost model charges a blocked wait after that much compute: the cluster's sync_s for
# the rank count, ramped over the first millisecond (src/planner/cost.c, SYNC_RAMP_S).
#
# Environment: RANKS="2 3 4" LAUNCHES=2 ROUNDS=11 PATTERNS=1x256,34x10000,1m2048 CLUSTER= PYTHON=/usr/bin/python3
#              SUMMARY=FILE: only the summary of a stored results file
set -eu
cd "$(dirname "$0")/.."
RANKS=${RANKS:-2 3 4} LAUNCHES=${LAUNCHES:-2} ROUNDS=${ROUNDS:-11} PATTERNS=${PATTERNS:-1x256,34x10000,1m2048}
PYTHON=${PYTHON:-/usr/bin/python3}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
BIN=build/bench/bench_lockstep
if [ -n "${SUMMARY:-}" ]; then OUT=$SUMMARY; LAUNCHES=0; else
${MAKE:-make} --no-print-directory "$BIN" >&2
mkdir -p bench/results
OUT=bench/results/lockstep-$(date -u +%Y%m%dT%H%M%SZ).jsonl
"$PYTHON" - "$(getconf _NPROCESSORS_ONLN)" "$(cut -d ' ' -f 1-3 /proc/loadavg)" "$ROUNDS" "$PATTERNS" > "$OUT" <<'PY'
import datetime, json, sys
print(json.dumps({"meta": {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                           "cpus": sys.argv[1], "loadavg_at_start": sys.argv[2], "rounds": int(sys.argv[3]),
                           "patterns": sys.argv[4]}}))
PY
fi
l=1
while [ "$l" -le "$LAUNCHES" ]; do
    for k in $RANKS; do
        echo "launch $l/$LAUNCHES: $k ranks (load $(cut -d ' ' -f 1 /proc/loadavg))" >&2
        mpiexec -n "$k" "$BIN" --patterns "$PATTERNS" --rounds "$ROUNDS" | sed "s/^{/{\"launch\": $l, /" >> "$OUT"
    done
    l=$((l + 1))
done
[ -n "${SUMMARY:-}" ] || echo "raw results: $OUT" >&2
"$PYTHON" - "$OUT" "${CLUSTER:-}" <<'PY'
"""Summary of one run_lockstep.sh file: per rank count, segment and pattern, the medians over
launches (min..max beside) of the free-running segment, the pattern's back-to-back time and the
loss beyond it; with a cluster file, the cost model's charge for a blocked wait after that
segment (sync_s x min(1, segment / 1 ms))."""
import json, statistics, sys

lines = [json.loads(l) for l in open(sys.argv[1])]
meta = lines[0]["meta"]
sync = {}
if sys.argv[2]:
    for e in json.load(open(sys.argv[2]))["device"].get("slowdown", []):
        sync[e["ranks"]] = e.get("sync_s", 0)


def charge(ranks, seg_s):
    """The cost model's charge (src/planner/cost.c, SYNC_RAMP_S): sync_s of the entry of the
    largest count <= ranks, ramped over the first millisecond of compute."""
    k = max((r for r in sync if r <= ranks), default=None)
    return 0.0 if k is None else sync[k] * min(1.0, seg_s / 1e-3)


groups = {}
for r in lines[1:]:
    groups.setdefault((r["ranks"], r["pattern"], tuple(r["mlp"]), r["batch"]), []).append(r)
print(f"date {meta['date']}, {meta['cpus']} cpus, load at start {meta['loadavg_at_start']}, {meta['rounds']} rounds per launch")
print()
head = "| ranks | after each segment | MLP, batch | segment ms | back to back ms | loss ms (min..max) | loss / segment |"
print(head + (" model charges ms |" if sync else ""))
print("|---" * (7 + bool(sync)) + "|")
for key in sorted(groups, key=lambda k: (k[0], k[1], statistics.median(x["segment_ms"] for x in groups[k]))):
    g = groups[key]
    seg = statistics.median(x["segment_ms"] for x in g)
    loss = [x["loss_ms"] for x in g]
    n, kind, elems = key[1].partition("x") if "x" in key[1] else key[1].partition("m")
    what = f"{n} {'MPI ' if kind == 'm' else ''}all-reduce{'s' if n != '1' else ''} of {elems} floats"
    row = (f"| {key[0]} | {what} | {list(key[2])}, {key[3]} | {seg:.3f} | "
           f"{statistics.median(x['back_to_back_ms'] for x in g):.3f} | {statistics.median(loss):.3f} "
           f"({min(loss):.3f}..{max(loss):.3f}) | {statistics.median(loss) / seg:.2f} |")
    if sync:
        row += f" {charge(key[0], seg * 1e-3) * 1e3:.3f} |"
    print(row)
print()
print("segment: one training step of the MLP on every rank at once (free-running, the cores shared);")
print("loss: (with the all-reduces - without) - their back-to-back time, per segment.")
PY
