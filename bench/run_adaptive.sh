#!/bin/sh
# run_adaptive.sh - one adaptive job from start to end, and its goodput: `adtrain master` planning
# every world with the straggler policy on, 2 agents x 2 ranks of `adtrain train` bound to cores
# (4 ranks on this machine's 2 cores), and during the one run:
#   (a) real contention: a CPU hog on core 1 from HOG_AT s after the first step, to the end
#   (b) a worker killed with SIGKILL at KILL_AT s
#   (c) agent 2 leaving (SIGTERM: a planned scale in) at LEAVE_AT s
#   (d) agent 2 coming back (scale out) at BACK_AT s
# Then the ledger's audit (exit 1 when a sample is missing or duplicated), every world's plan and
# split from the master's events, and the goodput: the samples of the committed model per second
# of the whole run (first step to end), against the ideal - the ranks' measured capacities
# (samples/s of compute, the last world's "straggler: capacity" line) over the time not spent
# restarting (each new world's "first_step ... reported X s after" event).
#
#   sh bench/run_adaptive.sh            # POLICY=dd STEPS=1500 BATCH=256 MODEL=(MLP 256-1024-1024-10)
#
# Results: bench/results/adaptive-<UTC date-time>.txt (events, audit, figures) and the summary
# on stdout.
set -eu
cd "$(dirname "$0")/.."

POLICY=${POLICY:-dd}
STEPS=${STEPS:-1500}
BATCH=${BATCH:-256}
HOG_AT=${HOG_AT:-5}
KILL_AT=${KILL_AT:-20}
LEAVE_AT=${LEAVE_AT:-35}
BACK_AT=${BACK_AT:-50}
BIN=$(pwd)/build/adtrain
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
${MAKE:-make} --no-print-directory build/adtrain >&2
mkdir -p bench/results
[ -f bench/results/.gitignore ] || printf '*\n!.gitignore\n' > bench/results/.gitignore
OUT=bench/results/adaptive-$(date -u +%Y%m%d-%H%M%S).txt
WORK=$(mktemp -d)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

MODEL=${MODEL:-$WORK/model.json}
[ -f "$MODEL" ] || echo '{"type":"mlp","sizes":[256,1024,1024,10],"activation":"relu"}' > "$MODEL"
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
ADDR=127.0.0.1:$PORT
"$BIN" master --job "$WORK/job" --listen "$ADDR" --linger 30 --join-wait 0.5 --straggler-policy "$POLICY" \
    --model "$MODEL" --batch "$BATCH" --optimizer sgd --lr 0.05 --steps "$STEPS" --data synthetic:mlp \
    --strategy dp --cluster configs/clusters/cpu-epyc-32x2.json 2> "$WORK/master.log" &
MASTER=$!
PIDS="$MASTER"
agent() { # N: agent N (1 or 2), in the background ($! is its PID)
    "$BIN" agent --master "$ADDR" --nproc-per-node 2 --bind-to core --node-id "n$1" -- \
        "$BIN" train --log "$WORK/run.jsonl" 2>> "$WORK/agent$1.log" &
}
agent 1
A1=$!
agent 2
A2=$!
PIDS="$PIDS $A1 $A2"
status() { "$BIN" status --master "$ADDR" --json 2>/dev/null || true; }
# the first step
i=0
until grep -q '"loss"' "$WORK/run.jsonl" 2>/dev/null; do
    sleep 0.2; i=$((i + 1))
    [ "$i" -lt 600 ] || { echo "run_adaptive.sh: no first step in 120 s" >&2; tail "$WORK"/*.log >&2; exit 1; }
done
T0=$(date +%s.%N)
at() { # S: sleep until S s after the first step
    python3 -c "import time,sys; d=$T0+$1-time.time(); time.sleep(max(0,d))"
}
at "$HOG_AT"
HOG=$(sh scripts/cpu_hog.sh 1)
PIDS="$PIDS $HOG"
echo "$(date +%s.%N) hog on core 1" >> "$WORK/timeline"
at "$KILL_AT"
W=$(status | python3 -c 'import json,sys; w=json.load(sys.stdin)["workers"]; print([x["pid"] for x in w if x.get("rank")==1][0])' 2>/dev/null || true)
[ -n "$W" ] && kill -9 "$W" && echo "$(date +%s.%N) SIGKILL rank 1 (pid $W)" >> "$WORK/timeline"
at "$LEAVE_AT"
kill -TERM "$A2" && echo "$(date +%s.%N) SIGTERM agent 2" >> "$WORK/timeline"
wait "$A2" 2>/dev/null || true
at "$BACK_AT"
agent 2
A2=$!
PIDS="$PIDS $A2"
echo "$(date +%s.%N) agent 2 back" >> "$WORK/timeline"
wait "$A1" 2>/dev/null || true
T1=$(date +%s.%N)
kill "$HOG" 2>/dev/null || true
"$BIN" audit --job "$WORK/job" > "$WORK/audit.txt" 2>&1 && AUDIT=clean || AUDIT=FAILED
python3 -c "import urllib.request,sys; sys.stdout.write(urllib.request.urlopen('http://$ADDR/v1/events').read().decode())" \
    > "$WORK/events.jsonl" || true
kill "$MASTER" 2>/dev/null || true
{
    echo "# run_adaptive.sh $(date -u +%Y-%m-%dT%H:%M:%SZ): $(getconf _NPROCESSORS_ONLN) CPUs; commit $(git rev-parse --short HEAD)"
    echo "# policy $POLICY, $STEPS steps x batch $BATCH, model $(cat "$MODEL"); load average $(cut -d ' ' -f 1-3 /proc/loadavg)"
    cat "$WORK/timeline"
    echo "## audit: $AUDIT"
    cat "$WORK/audit.txt"
    python3 - "$WORK" "$T0" "$T1" "$STEPS" "$BATCH" <<'EOF'
import json, re, sys
work, t0, t1, steps, batch = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
events = [json.loads(l) for l in open(work + "/events.jsonl") if l.strip()]
mine = [e for e in events if e.get("source", "master") == "master"]
print("## worlds, plans and splits (the master's events)")
for e in mine:
    if e["kind"] in ("generation", "replan", "straggler_action", "death", "leave", "join", "first_step"):
        print("  %-16s %s" % (e["kind"], e.get("detail", "")))
restart = sum(float(m.group(1)) for e in mine if e["kind"] == "first_step"
              for m in [re.search(r"reported ([0-9.]+) s after", e.get("detail", ""))] if m)
cap = 0.0
for name in ("agent1.log", "agent2.log"):
    for line in open(work + "/" + name, errors="replace"):
        m = re.search(r"straggler: capacity \(samples/s of compute\)((?: r\d+ [0-9.]+)+);", line)
        if m: cap = sum(float(x) for x in m.group(1).split()[1::2])
wall = t1 - t0
good = steps * batch / wall
ideal = cap * (wall - restart) / wall if cap > 0 else float("nan")
print("## goodput: %.1f samples/s over %.1f s (first step to end); ideal %.1f samples/s (capacities %.1f, "
      "%.1f s restarting); ratio %.3f" % (good, wall, ideal, cap, restart, good / ideal if ideal == ideal else float("nan")))
EOF
} > "$OUT"
sed -n '/^## /,$p' "$OUT" | grep -v "^ epoch\|^     " 
echo "results: $OUT" >&2
[ "$AUDIT" = clean ]
