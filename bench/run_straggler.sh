#!/bin/sh
# run_straggler.sh - straggler mitigation on 2 data-parallel ranks (mpiexec, one core each; RANKS=4:
# four ranks on the 2 cores, oversubscribed, the last one slowed):
# steps per second with no policy (the static equal split), DD and ND, against the ideal (the sum
# of the ranks' measured capacities), side by side in one invocation, at a global batch of 512
# (steps of ~40 ms on a quiet machine) and 2048 (~130 ms).
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
#   heterogeneous  rank 1 at half speed from the start, deterministically (--inject-slowdown "$SLOW:2")
#   transient      rank 1 limited only from HOG_AT seconds into the run for HOG_FOR seconds; the
#                  time from the limit's start (end) to the first action after it is the
#                  mitigation latency
# Per run: steps/s over the whole run and over its second half (the steady state), from the
# JSONL log's per-step times, and the milliseconds per step spent besides the slowest rank's
# compute (all-reduce not hidden, update, timings). Against two yardsticks, both from the ranks'
# capacities (samples per second of compute: their passes, not the all-reduces nor the update) as
# the round's three runs (off, DD, ND) measured them: the fitted ideal (each rank's time per step
# fitted as a + p b over the local batches b it ran at, and the split on which all ranks finish
# together), and the best-of-six bound (each rank's largest capacity, measured at whatever local
# batch). bench/straggler_summary.py computes both and says why; `python3
# bench/straggler_summary.py summary FILE` summarises a stored results file again. Load average
# and the busiest other processes are recorded before and after: the machine is shared.
#
# Results: bench/results/straggler-<UTC date-time>.txt (every run's numbers) and the summary on
# stdout. Needs root for the cgroup (else CONTENTION=hog). ELASTIC=1: every run is an elastic job
# (`adtrain launch --nproc-per-node RANKS --bind-to core --straggler-policy P -- adtrain train ...`):
# the master's controller decides the split (policy off: the trainer's fixed equal split), the
# ranks lease their local batches, commit every 10 steps; the slowed rank is moved into the cgroup
# once the agent has started it. Environment (optional): ROUNDS=3, RANKS=2,
# BATCHES="512 2048" with STEPS_512=150 and STEPS_2048=60 (STEPS_<batch> for others, else STEPS=60),
# MODEL=CFG.json (default: an MLP 256-1024-1024-10), STRAGGLER_CONFIG=K=V,... (the DD and ND runs'
# --straggler-config), HOG_AT=2 HOG_FOR=3 (transient: inside a run
# of 6-8 s on a quiet machine), MAX_HOGS=4. The defaults take about 10 minutes on a quiet machine.
set -eu

cd "$(dirname "$0")/.."

ROUNDS=${1:-${ROUNDS:-3}}
RANKS=${RANKS:-2}
SLOW=$((RANKS - 1)) # the slowed rank: the last
BATCHES=${BATCHES:-${BATCH:-512 2048}}
STRAGGLER_CONFIG=${STRAGGLER_CONFIG:-}
STEPS_512=${STEPS_512:-150}
STEPS_2048=${STEPS_2048:-60}
ELASTIC=${ELASTIC:-0}
HOG_AT=${HOG_AT:-2}
HOG_FOR=${HOG_FOR:-3}
MAX_HOGS=${MAX_HOGS:-4}
BIN=build/adtrain
if command -v mpiexec.mpich >/dev/null 2>&1; then MPIEXEC=${MPIEXEC:-mpiexec.mpich}; else MPIEXEC=${MPIEXEC:-mpiexec}; fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

${MAKE:-make} --no-print-directory "$BIN" >&2
mkdir -p bench/results
[ -f bench/results/.gitignore ] || printf '*\n!.gitignore\n' > bench/results/.gitignore
OUT=bench/results/straggler$([ "$ELASTIC" = 1 ] && echo -elastic)-$(date -u +%Y%m%d-%H%M%S).txt
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

# The slowed rank of the elastic job that `adtrain launch` (PID $1) runs, into the cgroup: the
# worker whose environment says RANK=$SLOW, once the agent has started it.
cgroup_slow_rank() {
    i=0
    while [ "$i" -lt 600 ] && kill -0 "$1" 2>/dev/null; do
        for c in $(ps -o pid= --ppid "$1"); do
            if tr '\0' '\n' < "/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$SLOW"; then
                echo "$c" > "$CG/cgroup.procs" && return 0
            fi
        done
        sleep 0.05
        i=$((i + 1))
    done
    echo "run_straggler.sh: rank $SLOW of launch $1 not found" >&2
}

# run NAME POLICY EXTRA...: one training run; its log in $WORK/NAME.jsonl, stderr in NAME.err
run() {
    name=$1 pol=$2
    shift 2
    if [ "$ELASTIC" = 1 ]; then
        # the policy is said once, on the master; off: the trainer's own fixed equal split
        lpol=""
        tpol="--straggler-policy off"
        if [ "$pol" != off ]; then
            lpol="--straggler-policy $pol"
            [ -n "$STRAGGLER_CONFIG" ] && lpol="$lpol --straggler-config $STRAGGLER_CONFIG"
            tpol=""
        fi
        # shellcheck disable=SC2086 # the flags split on purpose
        "$BIN" launch --nproc-per-node "$RANKS" --bind-to core --job "$WORK/job-$name" $lpol -- \
            "$BIN" train --model "$MODEL" --data synthetic:mlp --steps "$STEPS" --batch "$BATCH" --optimizer sgd \
            --lr 0.05 $tpol --commit-every 10 --log "$WORK/$name.jsonl" "$@" > /dev/null 2> "$WORK/$name.err" &
        lp=$!
        [ "$CONTENTION" = cgroup ] && cgroup_slow_rank "$lp"
        wait "$lp" || echo "run_straggler.sh: $name failed: $(tail -n 3 "$WORK/$name.err")" >&2
        echo "$name $pol $(date +%s.%N)" >> "$WORK/runs"
        return 0
    fi
    set -- "$BIN" train --model "$MODEL" --data synthetic:mlp --steps "$STEPS" --batch "$BATCH" --optimizer sgd \
        --lr 0.05 --straggler-policy "$pol" --log "$WORK/$name.jsonl" "$@"
    if [ -n "$STRAGGLER_CONFIG" ] && [ "$pol" != off ]; then set -- "$@" --straggler-config "$STRAGGLER_CONFIG"; fi
    if [ "$CONTENTION" = cgroup ]; then # rank 1 joins the cgroup, then becomes the trainer
        "$MPIEXEC" -bind-to core -n "$SLOW" "$@" : -n 1 sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$CG" "$@" \
            > /dev/null 2> "$WORK/$name.err"
    else
        "$MPIEXEC" -bind-to core -n "$RANKS" "$@" > /dev/null 2> "$WORK/$name.err"
    fi
    echo "$name $pol $(date +%s.%N)" >> "$WORK/runs"
}

# The capacities of rank 0 and of the slowed rank in a run (samples/s of compute), from its last
# lines (under adtrain launch prefixed "[rank 0] ").
capacities() {
    sed -n 's/^\(\[rank 0\] \)\{0,1\}straggler: capacity (samples\/s of compute) r0 \([0-9.]*\) .* r[0-9]* \([0-9.]*\);.*/\2 \3/p;
            s/^\(\[rank 0\] \)\{0,1\}straggler: capacity (samples\/s of compute) r0 \([0-9.]*\) r[0-9]* \([0-9.]*\);.*/\2 \3/p' "$WORK/$1.err"
}

{
    echo "# run_straggler.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): $(getconf _NPROCESSORS_ONLN) CPUs ($(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1))"
    echo "# rounds $ROUNDS, batches $BATCHES, $RANKS ranks (rank $SLOW slowed), model $(cat "$MODEL")"
    echo "# before:"
    machine | sed 's/^/# /'
} > "$OUT"

# ---- calibration: rank 1's contention until it runs at about half rank 0's speed ----------------
if [ "$CONTENTION" = cgroup ]; then LEVELS="60 45 35 25 18 12"; UNIT="% of a CPU"; else LEVELS="1 2 3 4"; UNIT=" hog(s)"; fi
steps_of() { # BATCH: the steps of a run at that global batch
    eval "echo \${STEPS_$1:-\${STEPS:-60}}"
}
set -- $BATCHES
BATCH=$1 # the calibration's: a CPU quota slows any batch alike
ratio=1
for H in $LEVELS; do
    slow_on "$H"
    STEPS=15
    run calib$H off
    slow_off
    set -- $(capacities calib$H)
    ratio=$(python3 -c "print('%.2f' % ($2 / $1))")
    echo "calibration: rank $SLOW at $H$UNIT: $ratio of rank 0's speed" >&2
    echo "# calibration: rank $SLOW at $H$UNIT: capacity ratio $ratio" >> "$OUT"
    if python3 -c "import sys; sys.exit(0 if $ratio <= 0.6 else 1)"; then break; fi
done

# ---- the rounds: per batch, every scenario and policy ------------------------------------------
for BATCH in $BATCHES; do
STEPS=$(steps_of "$BATCH")
r=1
while [ "$r" -le "$ROUNDS" ]; do
    echo "# batch $BATCH ($STEPS steps), round $r: load average $(cut -d " " -f 1-3 /proc/loadavg)" >> "$OUT"
    if [ $((r % 2)) = 1 ]; then order="off dd nd"; else order="nd dd off"; fi
    for pol in $order; do
        n=$BATCH-$r-$pol
        echo "batch $BATCH, round $r: contention, $pol" >&2
        slow_on "$H"
        run "contention-$n" "$pol"
        slow_off
        echo "batch $BATCH, round $r: heterogeneous, $pol" >&2
        run "hetero-$n" "$pol" --inject-slowdown "$SLOW:2"
        echo "batch $BATCH, round $r: transient, $pol" >&2
        ( sleep "$HOG_AT"; slow_on "$H"; echo "$HOGS" > "$WORK/transient-hogs"; date +%s.%N > "$WORK/transient-$n.on";
          sleep "$HOG_FOR"; slow_off; date +%s.%N > "$WORK/transient-$n.off" ) &
        timer=$!
        run "transient-$n" "$pol"
        wait "$timer" || true
        for p in $(cat "$WORK/transient-hogs" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
        slow_off
    done
    r=$((r + 1))
done
done

{
    echo "# after:"
    machine | sed 's/^/# /'
} >> "$OUT"

python3 bench/straggler_summary.py runs "$WORK" "$ROUNDS" "$BATCHES" >> "$OUT"
python3 bench/straggler_summary.py summary "$OUT" >> "$OUT"
sed -n '/^## summary/,$p' "$OUT"
echo "results: $OUT" >&2
