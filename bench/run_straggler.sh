#!/bin/sh
# run_straggler.sh - straggler mitigation on 2 data-parallel ranks (mpiexec, one core each):
# steps per second with no policy (the static equal split), DD and ND, against the ideal (the sum
# of the ranks' measured capacities), side by side in one invocation.
#
#   sh bench/run_straggler.sh [rounds]
#
# Contention: rank 1 runs in a cgroup (v1 cpu controller) whose CPU quota is lowered; the quota
# is calibrated first so that rank 1 runs at about half rank 0's speed. (CPU hogs on rank 1's
# core, scripts/cpu_hog.sh, do not do it on a machine shared with other work: the kernel moves
# the other work to the other core, and both ranks end up equally slowed. CONTENTION=hog uses
# them anyway, their number calibrated the same way.)
# Scenarios, each run with --straggler-policy off, dd and nd in every round (the order reversed
# every other round, so that none always runs in another's wake):
#   contention     rank 1 limited for the whole run
#   heterogeneous  rank 1 at half speed from the start, deterministically (--inject-slowdown 1:2)
#   transient      rank 1 limited only from HOG_AT seconds into the run for HOG_FOR seconds; the
#                  time from the limit's start (end) to the first action after it is the
#                  mitigation latency
# Per run: steps/s over the whole run and over its second half (the steady state), from the
# JSONL log's per-step times; the ideal is sum_i capacity_i / batch, with capacity_i rank i's
# samples per second of compute (its passes, not the all-reduces nor the update) over the steps
# the controller judges (after the warmup), as the static run of the same round measured it
# ("own ideal": as the run itself measured it, which sees the same background load); and the
# milliseconds per step spent besides the slowest rank's compute (all-reduce not hidden, update,
# timings). Load average and the busiest other processes are recorded before and after, and
# sampled during the rounds: the machine is shared.
#
# Results: bench/results/straggler-<UTC date-time>.txt (every run's numbers) and the summary on
# stdout. Needs root for the cgroup (else CONTENTION=hog). Environment (optional): ROUNDS=3 STEPS=40 BATCH=512 MODEL=CFG.json (default:
# an MLP 256-1024-1024-10), HOG_AT=2 HOG_FOR=3 (transient), MAX_HOGS=4.
set -eu

cd "$(dirname "$0")/.."

ROUNDS=${1:-${ROUNDS:-3}}
STEPS=${STEPS:-40}
BATCH=${BATCH:-512}
HOG_AT=${HOG_AT:-2}
HOG_FOR=${HOG_FOR:-3}
MAX_HOGS=${MAX_HOGS:-4}
BIN=build/adtrain
if command -v mpiexec.mpich >/dev/null 2>&1; then MPIEXEC=${MPIEXEC:-mpiexec.mpich}; else MPIEXEC=${MPIEXEC:-mpiexec}; fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

${MAKE:-make} --no-print-directory "$BIN" >&2
mkdir -p bench/results
[ -f bench/results/.gitignore ] || printf '*\n!.gitignore\n' > bench/results/.gitignore
OUT=bench/results/straggler-$(date -u +%Y%m%d-%H%M%S).txt
WORK=$(mktemp -d)
HOGS=""
stop_hogs() {
    for p in $HOGS; do kill "$p" 2>/dev/null || true; done
    HOGS=""
}
CONTENTION=${CONTENTION:-cgroup}
CG=/sys/fs/cgroup/cpu/adt_straggler_$$
if [ "$CONTENTION" = cgroup ]; then
    mkdir "$CG" 2>/dev/null || { echo "run_straggler.sh: cannot create $CG (root and cgroup v1 cpu needed); set CONTENTION=hog" >&2; exit 2; }
    echo -1 > "$CG/cpu.cfs_quota_us"
    # a short period: the quota is spread over it, so rank 1 is slowed evenly rather than stopped
    # for most of each 100 ms (the default), which would stall the all-reduces it takes part in
    echo 10000 > "$CG/cpu.cfs_period_us"
fi
trap 'stop_hogs; [ -d "$CG" ] && rmdir "$CG" 2>/dev/null; rm -rf "$WORK"' EXIT
trap 'exit 130' INT TERM

if [ -z "${MODEL-}" ]; then
    MODEL=$WORK/model.json
    echo '{"type":"mlp","sizes":[256,1024,1024,10],"activation":"relu"}' > "$MODEL"
fi

# slow_on LEVEL / slow_off: rank 1's contention. LEVEL: a CPU quota in percent of one CPU
# (cgroup), or a number of hogs.
slow_on() {
    if [ "$CONTENTION" = cgroup ]; then echo $(($1 * 100)) > "$CG/cpu.cfs_quota_us"; else start_hogs "$1"; fi
}
slow_off() {
    if [ "$CONTENTION" = cgroup ]; then echo -1 > "$CG/cpu.cfs_quota_us"; else stop_hogs; fi
}

start_hogs() { # N
    i=0
    while [ "$i" -lt "$1" ]; do
        HOGS="$HOGS $(sh scripts/cpu_hog.sh 1)"
        i=$((i + 1))
    done
}

machine() {
    echo "load average $(cut -d ' ' -f 1-3 /proc/loadavg); busiest processes (%cpu, name):"
    ps -eo pcpu=,comm= --sort=-pcpu | head -n 6 | sed 's/^/    /'
}

# run NAME POLICY EXTRA...: one training run; its log in $WORK/NAME.jsonl, stderr in NAME.err
run() {
    name=$1 pol=$2
    shift 2
    set -- "$BIN" train --model "$MODEL" --data synthetic:mlp --steps "$STEPS" --batch "$BATCH" --optimizer sgd \
        --lr 0.05 --straggler-policy "$pol" --log "$WORK/$name.jsonl" "$@"
    if [ "$CONTENTION" = cgroup ]; then # rank 1 joins the cgroup, then becomes the trainer
        "$MPIEXEC" -bind-to core -n 1 "$@" : -n 1 sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@" \
            > /dev/null 2> "$WORK/$name.err"
    else
        "$MPIEXEC" -bind-to core -n 2 "$@" > /dev/null 2> "$WORK/$name.err"
    fi
    echo "$name $pol $(date +%s.%N)" >> "$WORK/runs"
}

# The capacities r0 r1 of a run (samples/s of compute), from its last line.
capacities() {
    sed -n 's/^straggler: capacity (samples\/s of compute) r0 \([0-9.]*\) r1 \([0-9.]*\);.*/\1 \2/p' "$WORK/$1.err"
}

{
    echo "# run_straggler.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): $(getconf _NPROCESSORS_ONLN) CPUs ($(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1))"
    echo "# rounds $ROUNDS, $STEPS steps of batch $BATCH, model $(cat "$MODEL")"
    echo "# before:"
    machine | sed 's/^/# /'
} > "$OUT"

# ---- calibration: rank 1's contention until it runs at about half rank 0's speed ----------------
if [ "$CONTENTION" = cgroup ]; then LEVELS="60 45 35 25 18 12"; UNIT="% of a CPU"; else LEVELS="1 2 3 4"; UNIT=" hog(s)"; fi
ratio=1
for H in $LEVELS; do
    slow_on "$H"
    STEPS_SAVE=$STEPS
    STEPS=15
    run calib$H off
    STEPS=$STEPS_SAVE
    slow_off
    set -- $(capacities calib$H)
    ratio=$(python3 -c "print('%.2f' % ($2 / $1))")
    echo "calibration: rank 1 at $H$UNIT: $ratio of rank 0's speed" >&2
    echo "# calibration: rank 1 at $H$UNIT: capacity ratio $ratio" >> "$OUT"
    if python3 -c "import sys; sys.exit(0 if $ratio <= 0.6 else 1)"; then break; fi
done

# ---- the rounds --------------------------------------------------------------------------------
r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "# round $r: load average $(cut -d " " -f 1-3 /proc/loadavg)" >> "$OUT"
    if [ $((r % 2)) = 1 ]; then order="off dd nd"; else order="nd dd off"; fi
    for pol in $order; do
        echo "round $r: contention, $pol" >&2
        slow_on "$H"
        run "contention-$r-$pol" "$pol"
        slow_off
        echo "round $r: heterogeneous, $pol" >&2
        run "hetero-$r-$pol" "$pol" --inject-slowdown 1:2
        echo "round $r: transient, $pol" >&2
        ( sleep "$HOG_AT"; slow_on "$H"; echo "$HOGS" > "$WORK/transient-hogs"; date +%s.%N > "$WORK/transient-$r-$pol.on";
          sleep "$HOG_FOR"; slow_off; date +%s.%N > "$WORK/transient-$r-$pol.off" ) &
        timer=$!
        run "transient-$r-$pol" "$pol"
        wait "$timer" || true
        for p in $(cat "$WORK/transient-hogs" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
        slow_off
    done
    r=$((r + 1))
done

{
    echo "# after:"
    machine | sed 's/^/# /'
} >> "$OUT"

python3 - "$WORK" "$ROUNDS" "$BATCH" "$H$UNIT" "$ratio" >> "$OUT" <<'EOF'
import json, os, re, statistics, sys
work, rounds, batch, level, ratio = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]

def log(name):
    steps, acts = [], []
    for line in open(os.path.join(work, name + ".jsonl")):
        o = json.loads(line)
        if "straggler_action" in o: acts.append(o)
        elif "ms" in o: steps.append(o)
    return steps, acts

def caps(name):
    for line in open(os.path.join(work, name + ".err")):
        m = re.match(r"straggler: capacity \(samples/s of compute\) r0 ([0-9.]+) r1 ([0-9.]+);", line)
        if m: return float(m.group(1)), float(m.group(2))
    return None

def overhead(name):
    for line in open(os.path.join(work, name + ".err")):
        m = re.search(r"; ([0-9.]+) ms per step besides the slowest rank's compute", line)
        if m: return float(m.group(1))
    return float("nan")

def rate(steps):
    return len(steps) / (sum(s["ms"] for s in steps) / 1e3)

print("# every run: scenario round policy | steps/s whole, second half | capacities r0 r1 (samples/s) | ms per step "
      "besides the slowest rank's compute | actions")
rows = {}
for sc in ("contention", "hetero", "transient"):
    for r in range(1, rounds + 1):
        ideal = None
        c = caps("%s-%d-off" % (sc, r))
        if c: ideal = (c[0] + c[1]) / batch
        for pol in ("off", "dd", "nd"):
            name = "%s-%d-%s" % (sc, r, pol)
            steps, acts = log(name)
            whole, half = rate(steps), rate(steps[len(steps) // 2:])
            cp = caps(name)
            lat = ""
            if sc == "transient":
                on = float(open(os.path.join(work, name + ".on")).read())
                off = float(open(os.path.join(work, name + ".off")).read())
                after_on = [a for a in acts if a["wall"] >= on]
                after_off = [a for a in acts if a["wall"] >= off]
                if after_on: lat += " first action %.2f s after the slowdown started" % (after_on[0]["wall"] - on)
                if after_off: lat += "; first action %.2f s after they stopped" % (after_off[0]["wall"] - off)
            print("%s %d %s | %.2f %.2f | %.0f %.0f | %.1f | %d%s" % (sc, r, pol, whole, half, cp[0], cp[1], overhead(name),
                                                             len(acts), lat))
            own = (cp[0] + cp[1]) / batch
            rows.setdefault((sc, pol), []).append((whole, half, ideal, own, overhead(name)))

print()
print("## summary (medians over %d rounds; rank 1 at %s ran at %s of rank 0's speed in the calibration)" % (rounds, level, ratio))
print("| scenario | policy | steps/s (whole run) | steps/s (second half) | ideal (static run's capacities) | second half / ideal | whole run / own ideal | ms/step besides the slowest compute |")
print("|---|---|---|---|---|---|---|---|")
for sc in ("contention", "hetero", "transient"):
    for pol in ("off", "dd", "nd"):
        v = rows[(sc, pol)]
        w = statistics.median(x[0] for x in v); h = statistics.median(x[1] for x in v)
        ideals = [x[2] for x in v if x[2]]
        i = statistics.median(ideals) if ideals else float("nan")
        o = statistics.median(x[0] / x[3] for x in v)
        ov = statistics.median(x[4] for x in v)
        print("| %s | %s | %.2f | %.2f | %.2f | %.0f%% | %.0f%% | %.1f |" % (sc, pol, w, h, i, 100 * h / i, 100 * o, ov))
EOF
sed -n '/^## summary/,$p' "$OUT"
grep '^transient' "$OUT" | sed -n '/first action/p'
echo "results: $OUT" >&2
