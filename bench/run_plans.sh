#!/bin/sh
# run_plans.sh - every expert plan of GPT-S (configs/gpt-s.json) on 2 and 4 ranks: step time of
# `mpiexec -n N adtrain train --plan` and each rank's memory, measured next to the memory plan's
# prediction, in one invocation.
#
#   sh bench/run_plans.sh [rounds]
#
# Each plan is made once with `adtrain plan` (same model, global batch and optimizer as the run);
# every round then trains each plan for WARMUP + STEPS steps, the plans interleaved and their order
# reversed every other round, so that none always runs in another's wake. The same global batch on
# every plan: the step times compare plans, not batch sizes. The data is Tiny Shakespeare when
# ../shared/data has it, else synthetic:text (the step time does not depend on the text).
#
# Step time: rank 0's per-step "ms" from --log, the median over the timed steps (warmup steps left
# out); the summary gives the median over rounds and the min..max of the round medians.
# Memory: with ADT_MEM_REPORT set, every rank prints its peak resident set (getrusage maxrss)
# before its executor is made and at the end of training, and its executor's memory plan (arena,
# state = parameters + optimizer state + fed inputs, the largest scratch; a pipeline stage holds
# `slots` arenas). "measured" is the growth of the peak RSS across executor creation and training,
# "predicted" is slots x arena + state + scratch; both per rank, from round 1.
#
# Every JSON line goes to bench/results/plans-<UTC date-time>.jsonl (a "meta" line first, load
# averages before and after included); the summary to stdout, progress to stderr.
#
# Environment (all optional):
#   ROUNDS=3  STEPS=8  WARMUP=2  BATCH=16  MICRO=4 (microbatches of the pp plans)  THREADS=1
#   PLANS2="dp tp zero pp"   PLANS4="dp tp zero pp dp=2,tp=2 dp=2,pp=2 dp=2,tp=2,zero"
#   OPENBLAS_CORETYPE   as run_core.sh: unset, the kernel family adtrain corrects OpenBLAS to
set -eu

cd "$(dirname "$0")/.."

ROUNDS=${1:-${ROUNDS:-3}}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
BATCH=${BATCH:-16}
MICRO=${MICRO:-4}
THREADS=${THREADS:-1}
PLANS2=${PLANS2-dp tp zero pp}
PLANS4=${PLANS4-dp tp zero pp dp=2,tp=2 dp=2,pp=2 dp=2,tp=2,zero}
PYTHON=${PYTHON:-/usr/bin/python3}
MODEL=configs/gpt-s.json
ADT=build/adtrain
NCPU=$(nproc 2>/dev/null || echo '?')
if [ -f ../shared/data/tinyshakespeare/input.txt ]; then DATA=text:../shared/data/tinyshakespeare/input.txt
else DATA=synthetic:text; fi
if command -v mpiexec.mpich >/dev/null 2>&1; then MPIEXEC=${MPIEXEC:-mpiexec.mpich}; else MPIEXEC=${MPIEXEC:-mpiexec}; fi

OPENBLAS_NUM_THREADS=$THREADS
OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS OMP_NUM_THREADS

# shellcheck disable=SC2034  # bench_setup builds BIN and asks it for the OpenBLAS kernel family
BIN=build/bench/bench_core
# shellcheck disable=SC1091
. bench/bench_env.sh
bench_setup plans
${MAKE:-make} --no-print-directory "$ADT" >&2
WORK=$(mktemp -d)
trap 'rm -f "$TMP"; rm -rf "$WORK"' EXIT

LOAD=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)
printf '{"meta": {"date": "%s", "cpus": "%s", "loadavg_at_start": "%s", "model": "%s", "data": "%s", "batch": %s, "microbatches": %s, "rounds": %s, "steps": %s, "warmup": %s, "threads": %s, "openblas_coretype": "%s"}}\n' \
    "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$NCPU" "$LOAD" "$MODEL" "$DATA" "$BATCH" "$MICRO" "$ROUNDS" "$STEPS" \
    "$WARMUP" "$THREADS" "$OPENBLAS_CORETYPE" > "$OUT"

# The configurations "N:STRATEGY", and each one's plan file (a name without '=' and ',').
CONFIGS=""
for s in $PLANS2; do CONFIGS="$CONFIGS 2:$s"; done
for s in $PLANS4; do CONFIGS="$CONFIGS 4:$s"; done
planfile() { echo "$WORK/plan-$1-$(echo "$2" | tr '=,' '_-').json"; }

for c in $CONFIGS; do
    n=${c%%:*} s=${c#*:}
    case "$s" in *pp*) mb="--microbatches $MICRO" ;; *) mb="" ;; esac
    # shellcheck disable=SC2086
    "$ADT" plan --devices "$n" --strategy "$s" --model "$MODEL" --batch "$BATCH" $mb -o "$(planfile "$n" "$s")" \
        > "$WORK/plan.txt" 2>&1 || { cat "$WORK/plan.txt" >&2; exit 1; }
done

# run ROUND N STRATEGY: one training run; its step times and every rank's memory lines appended.
run() {
    log=$WORK/log.jsonl
    rm -f "$log"
    ADT_MEM_REPORT=1 "$MPIEXEC" -n "$2" "$ADT" train --model "$MODEL" --data "$DATA" --batch "$BATCH" \
        --steps $((WARMUP + STEPS)) --plan "$(planfile "$2" "$3")" --log "$log" > "$TMP" 2>&1 ||
        { cat "$TMP" >&2; exit 1; }
    "$PYTHON" - "$1" "$2" "$3" "$WARMUP" "$log" "$TMP" >> "$OUT" <<'EOF'
import json, statistics, sys
rnd, n, strat, warmup, log, err = sys.argv[1:]
ms = [json.loads(l)["ms"] for l in open(log) if '"loss"' in l][int(warmup):]
mem = [json.loads(l) for l in open(err) if l.startswith('{"mem_report"')]
print(json.dumps({"round": int(rnd), "ranks": int(n), "strategy": strat, "step_ms": ms,
                  "step_ms_median": round(statistics.median(ms), 3), "mem": mem}))
EOF
    printf 'round %s/%s  %s ranks  %-16s median %s ms\n' "$1" "$ROUNDS" "$2" "$3" \
        "$(tail -n 1 "$OUT" | sed -n 's/.*"step_ms_median": *\([0-9.]*\).*/\1/p')" >&2
}

REVERSED=""
for c in $CONFIGS; do REVERSED="$c $REVERSED"; done
r=1
while [ "$r" -le "$ROUNDS" ]; do
    if [ $((r % 2)) -eq 1 ]; then order=$CONFIGS; else order=$REVERSED; fi
    for c in $order; do run "$r" "${c%%:*}" "${c#*:}"; done
    r=$((r + 1))
done

printf '{"meta_end": {"loadavg_at_end": "%s"}}\n' "$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)" >> "$OUT"
echo "raw results: $OUT" >&2

"$PYTHON" - "$OUT" <<'EOF'
"""Summary of one run_plans.sh results file."""
import json, statistics, sys

meta, meta_end, rows = {}, {}, []
for line in open(sys.argv[1]):
    d = json.loads(line)
    if "meta" in d: meta = d["meta"]
    elif "meta_end" in d: meta_end = d["meta_end"]
    else: rows.append(d)

print(f"date {meta['date']}  {meta['cpus']} cpus  model {meta['model']}  global batch {meta['batch']} "
      f"(pp: {meta['microbatches']} microbatches)  data {meta['data']}")
print(f"load average at start {meta['loadavg_at_start']}, at end {meta_end.get('loadavg_at_end')}; "
      f"OPENBLAS_CORETYPE={meta['openblas_coretype']}; threads per rank {meta['threads']}")
print(f"{meta['rounds']} rounds x ({meta['warmup']} warmup + {meta['steps']} timed steps) per run, plans interleaved")
print()
MiB = 1024.0 * 1024.0
configs = []
for r in rows:
    if (r["ranks"], r["strategy"]) not in configs: configs.append((r["ranks"], r["strategy"]))
base = {}
for n, s in configs:
    if s == "dp": base[n] = statistics.median(r["step_ms_median"] for r in rows if r["ranks"] == n and r["strategy"] == s)
print("| ranks | plan | step ms | (spread of rounds) | vs dp, same ranks | per round vs dp |")
print("|---|---|---|---|---|---|")
for n, s in configs:
    v = [r["step_ms_median"] for r in sorted(rows, key=lambda r: r["round"]) if r["ranks"] == n and r["strategy"] == s]
    dp = {r["round"]: r["step_ms_median"] for r in rows if r["ranks"] == n and r["strategy"] == "dp"}
    per = [r["step_ms_median"] / dp[r["round"]] for r in rows
           if r["ranks"] == n and r["strategy"] == s and r["round"] in dp]
    rel = f"{statistics.median(v) / base[n]:.2f}" if n in base else "-"
    pr = f"{min(per):.2f}..{max(per):.2f}" if per else "-"
    print(f"| {n} | {s} | {statistics.median(v):.1f} | {min(v):.1f}..{max(v):.1f} | {rel} | {pr} |")
print()
print("Memory per rank (round 1): predicted = slots x arena + state + scratch + gradient accumulators of the rank's memory plan;")
print("measured = growth of the peak RSS (getrusage) from before the executor to the end of training.")
print()
print("| ranks | plan | rank | stage | state MiB | arena MiB x slots | predicted MiB | measured MiB | measured / predicted | peak RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|")
for n, s in configs:
    r = min((r for r in rows if r["ranks"] == n and r["strategy"] == s), key=lambda r: r["round"])
    before = {m["rank"]: m["maxrss_kib"] for m in r["mem"] if m["mem_report"] == "before_executor"}
    for m in sorted((m for m in r["mem"] if m["mem_report"] == "end"), key=lambda m: m["rank"]):
        pred = (m["slots"] * m["arena_bytes"] + m["state_bytes"] + m["scratch_bytes"] + m.get("accum_bytes", 0)) / MiB
        meas = (m["maxrss_kib"] - before[m["rank"]]) / 1024.0
        print(f"| {n} | {s} | {m['rank']} | {m['stage']} | {m['state_bytes'] / MiB:.2f} | "
              f"{m['arena_bytes'] / MiB:.2f} x {m['slots']} | {pred:.2f} | {meas:.2f} | {meas / pred:.2f} | "
              f"{m['maxrss_kib'] / 1024.0:.1f} |")
EOF
