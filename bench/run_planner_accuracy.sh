#!/bin/sh
# run_planner_accuracy.sh - the cost model against this machine: for each model, every expert plan
# (and the auto plan) on 1..RANKS MPI ranks is trained for STEPS steps and its measured ms/step set
# beside the step time `adtrain plan --strategy auto --json` predicts for it on this machine's
# calibrated cluster file; the summary gives per model the median absolute error, Kendall's tau of
# the two rankings and the measured time of the predicted-best plan against the measured best.
#
#   sh bench/run_planner_accuracy.sh            (RANKS=2 STEPS=20 MODELS="mlp-mnist gpt-s vgg-mnist dlrm-small")
#
# Writes bench/results/planner-accuracy-<UTC date-time>.jsonl (one line per plan) and prints the
# summary. Needs mpiexec; takes minutes per model.
set -eu
cd "$(dirname "$0")/.."
RANKS=${RANKS:-2}
STEPS=${STEPS:-20}
MODELS=${MODELS:-mlp-mnist gpt-s vgg-mnist dlrm-small}
BIN=./build/adtrain
make -j2 build/adtrain >/dev/null
mkdir -p bench/results
stamp=$(date -u +%Y%m%dT%H%M%SZ)
out=bench/results/planner-accuracy-$stamp.jsonl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
$BIN calibrate --ranks "$RANKS" -o "$tmp/here.json" 2>"$tmp/calibrate.log"
: >"$out"
for model in $MODELS; do
    cfg=configs/$model.json
    case $model in
        mlp*) data=synthetic:mlp; batch=64 ;;
        gpt*) data=synthetic:text; batch=16 ;;
        vgg*) data=synthetic:vgg; batch=32 ;;
        dlrm*) data=synthetic:dlrm; batch=256 ;;
        *) echo "unknown model $model" >&2; exit 2 ;;
    esac
    n=1
    while [ "$n" -le "$RANKS" ]; do
        # the predictions: the auto plan and every expert plan on n devices of this machine
        $BIN plan --strategy auto --model "$cfg" --cluster "$tmp/here.json" --devices "$n" --batch "$batch" \
            --max-pp 1 --json -o "$tmp/auto.json" >"$tmp/pred.json"
        strategies="auto $(/usr/bin/python3 -c 'import json,sys
print(" ".join(e["strategy"] for e in json.load(open(sys.argv[1]))["experts"] if e.get("applies") and e.get("feasible")))' "$tmp/pred.json")"
        for s in $strategies; do
            case $s in pp=*) continue ;; esac # the runtime runs one-stage plans
            if [ "$s" = auto ]; then plan=$tmp/auto.json
            else plan=$tmp/plan.json; $BIN plan --strategy "$s" --devices "$n" --model "$cfg" --batch "$batch" -o "$plan" >/dev/null; fi
            ms=$(mpiexec -n "$n" $BIN train --model "$cfg" --data "$data" --batch "$batch" --steps "$STEPS" --plan "$plan" 2>&1 |
                 sed -n 's/^done: .*(\([0-9.e+-]*\) ms\/step).*/\1/p')
            /usr/bin/python3 - "$tmp/pred.json" "$s" "$ms" "$model" "$n" >>"$out" <<'PY'
import json, sys
pred, s, ms, model, n = json.load(open(sys.argv[1])), sys.argv[2], float(sys.argv[3]), sys.argv[4], int(sys.argv[5])
p = pred["predicted_step_s"] if s == "auto" else next(e["predicted_step_s"] for e in pred["experts"] if e["strategy"] == s)
print(json.dumps({"model": model, "ranks": n, "plan": s, "predicted_ms": p * 1e3, "measured_ms": ms}))
PY
        done
        n=$((n + 1))
    done
done
/usr/bin/python3 - "$out" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1])]
for model in sorted({r["model"] for r in rows}):
    rs = [r for r in rows if r["model"] == model]
    err = statistics.median(abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] for r in rs)
    conc = disc = 0
    for i in range(len(rs)):
        for j in range(i + 1, len(rs)):
            a = (rs[i]["predicted_ms"] - rs[j]["predicted_ms"]) * (rs[i]["measured_ms"] - rs[j]["measured_ms"])
            conc += a > 0; disc += a < 0
    tau = (conc - disc) / max(1, conc + disc)
    best = min(rs, key=lambda r: r["measured_ms"]); pick = min(rs, key=lambda r: r["predicted_ms"])
    print(f"{model:12s} {len(rs):3d} plans  median |error| {100*err:5.1f}%  Kendall tau {tau:5.2f}  "
          f"predicted-best measured {pick['measured_ms']:.2f} ms vs best {best['measured_ms']:.2f} ms "
          f"({100*(pick['measured_ms']/best['measured_ms']-1):.1f}% regret)")
PY
echo "wrote $out" >&2
