#!/bin/sh
# run_ps.sh - the parameter-server mode's throughput: bench/bench_ps.c under mpiexec (2 servers +
# 2 workers) in sync, ssp:2 and async, with and without prefetch, dense parameters all-reduced
# among the workers or kept on the servers, beside PyTorch's one-process
# DLRM with sparse embeddings (bench/torch_ps_peer.py: nn.EmbeddingBag(mode="sum") and plain
# nn.Embedding, 1 and 2 threads, all four run and the fastest reported) and collective plans of
# the same model and batch on the same 4 ranks (`adtrain train --plan`, SGD: the cheapest update a
# graph optimizer makes of whole tables): the expert plans COLL_STRATEGIES and, with a cluster file
# COLL_CLUSTER (adtrain calibrate's), the planner's choice among the collective plans (`adtrain plan
# --strategy auto --mode collective`; the cluster file is copied beside the results). The
# tables are declared at 8 x 8e6 rows x 16 floats (4.1 GB; a server creates a row when first
# touched, PyTorch and the collective plan hold them whole). Then the
# accuracy each consistency mode reaches: `adtrain train --mode ps` (2 servers + 2 workers) on the
# planted synthetic:criteo-zipf data for a fixed number of samples (ACC_STEPS x ACC_BATCH) in sync,
# ssp:2 and async, the dense parameters on the workers and on the servers, beside the one-process
# run of the same flags; the AUC of the final evaluation (the same ACC_EVAL validation batches
# for every run) per mode: median, min and max over rounds, and the median of each round's
# difference to sync.
#
#   sh bench/run_ps.sh [rounds]
#
# Each round runs every configuration once, the order reversed every other round. JSON lines go
# to bench/results/ps-<UTC date-time>.jsonl (a "meta" line first, with the load average before
# and after); the summary (per configuration: median samples/s over rounds, min and max) to stdout.
#
# Environment: ROUNDS=3 STEPS=30 WARMUP=5 BATCH=512 TABLES=8 ROWS=8000000 ALPHA=1.05
#              TORCH="bag,1 bag,2 emb,1 emb,2" COLL_STRATEGIES=tp COLL_CLUSTER=FILE COLL_STEPS=6 COLL_WARMUP=2
#              PYTHON=/usr/bin/python3 MPIEXEC=mpiexec.mpich PHASES="speed auc"
#              ACC_STEPS=400 ACC_BATCH=256 ACC_EVAL=32 ACC_LR=0.1 ACC_MODEL=configs/dlrm-small.json
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${1:-${ROUNDS:-3}}
STEPS=${STEPS:-30}; WARMUP=${WARMUP:-5}; BATCH=${BATCH:-512}; TABLES=${TABLES:-8}; ROWS=${ROWS:-8000000}
ALPHA=${ALPHA:-1.05}; TORCH=${TORCH:-bag,1 bag,2 emb,1 emb,2}; PYTHON=${PYTHON:-/usr/bin/python3}
COLL_STRATEGIES=${COLL_STRATEGIES:-tp}; COLL_STEPS=${COLL_STEPS:-6}; COLL_WARMUP=${COLL_WARMUP:-2}
MPIEXEC=${MPIEXEC:-mpiexec.mpich}
PHASES=${PHASES:-speed auc}
ACC_STEPS=${ACC_STEPS:-400}; ACC_BATCH=${ACC_BATCH:-256}; ACC_EVAL=${ACC_EVAL:-32}; ACC_LR=${ACC_LR:-0.1}
ACC_MODEL=${ACC_MODEL:-configs/dlrm-small.json}
make -s -j2 build/bench/bench_ps build/adtrain >&2
mkdir -p bench/results
out=bench/results/ps-$(date -u +%Y%m%dT%H%M%SZ).jsonl
common="--steps $STEPS --warmup $WARMUP --batch $BATCH --tables $TABLES --rows $ROWS --alpha $ALPHA"
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
tmp=$(mktemp -d /tmp/adt-ps.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
# the collective plan's model: bench_ps's DLRM (bottom 13-64-16, top 64-1) as a config
printf '{"type": "dlrm", "n_dense": 13, "n_tables": %s, "table_rows": %s, "emb_dim": 16, "bottom": [64, 16], "top": [64, 1]}\n' \
    "$TABLES" "$ROWS" >"$tmp/model.json"
# the collective plans: the planner's choice among them (--strategy auto --mode collective) on
# COLL_CLUSTER, and the expert plans of COLL_STRATEGIES
coll=""
for k in $COLL_STRATEGIES; do
    build/adtrain plan --model "$tmp/model.json" --strategy "$k" --devices 4 --batch "$BATCH" --optimizer sgd \
        -o "$tmp/coll-$k.json" >/dev/null && coll="$coll collective,$k"
done
if [ -n "${COLL_CLUSTER:-}" ]; then
    cp "$COLL_CLUSTER" "${out%.jsonl}-cluster.json"
    build/adtrain plan --model "$tmp/model.json" --strategy auto --mode collective --cluster "$COLL_CLUSTER" --devices 4 \
        --batch "$BATCH" --optimizer sgd --data "synthetic:criteo-zipf,alpha=$ALPHA" -o "$tmp/coll-auto.json" \
        >"$tmp/auto.txt" && coll="$coll collective,auto"
    grep -E "^(mesh|predicted)" "$tmp/auto.txt" >&2
fi
printf '{"meta": {"host": "%s", "cores": %s, "load_before": "%s", "rounds": %s}}\n' "$(hostname)" "$(getconf _NPROCESSORS_ONLN)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)" "$ROUNDS" >"$out"
# The first round of a phase ($1: its name in PHASES), or past the last when it is not asked for.
first_round() { case " $PHASES " in *" $1 "*) echo 1 ;; *) echo $((ROUNDS + 1)) ;; esac; }
# The configurations $2 in round $1's order: reversed every other round.
round_order() { if [ $(($1 % 2)) -eq 0 ]; then echo "$2" | tr ' ' '\n' | tac | tr '\n' ' '; else echo "$2"; fi; }
# sync mode, prefetch depth, where the dense parameters live
configs="sync,0,workers sync,2,workers ssp:2,2,workers async,0,workers async,2,workers sync,2,servers ssp:2,2,servers async,2,servers"
configs="$configs $(for t in $TORCH; do printf 'torch,%s ' "$t"; done)$coll"
r=$(first_round speed)
while [ "$r" -le "$ROUNDS" ]; do
    for c in $(round_order "$r" "$configs"); do
        echo "round $r: $c" >&2
        load=$(cut -d' ' -f1 /proc/loadavg)
        if [ "${c%%,*}" = torch ]; then
            kind=$(echo "$c" | cut -d, -f2); th=$(echo "$c" | cut -d, -f3)
            line=$("$PYTHON" bench/torch_ps_peer.py $common --kind "$kind" --threads "$th")
        elif [ "${c%%,*}" = collective ]; then
            k=${c#collective,}
            rm -f "$tmp/coll.jsonl"
            $MPIEXEC -n 4 build/adtrain train --model "$tmp/model.json" --plan "$tmp/coll-$k.json" --batch "$BATCH" \
                --data "synthetic:criteo-zipf,alpha=$ALPHA" --optimizer sgd --steps "$COLL_STEPS" --log "$tmp/coll.jsonl" \
                >/dev/null 2>"$tmp/coll.err" || { cat "$tmp/coll.err" >&2; exit 1; }
            line=$("$PYTHON" - "$tmp/coll.jsonl" "$COLL_WARMUP" "$BATCH" "$k" <<'PY'
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if l.startswith('{"step"')]
a, b = s[int(sys.argv[2]) - 1], s[-1]
print(json.dumps({"config": "collective", "strategy": sys.argv[4], "steps": b["step"] - a["step"],
                  "samples_per_s": round(int(sys.argv[3]) * (b["step"] - a["step"]) / (b["wall_s"] - a["wall_s"]), 1)}))
PY
)
        else
            sync=$(echo "$c" | cut -d, -f1); pf=$(echo "$c" | cut -d, -f2); dense=$(echo "$c" | cut -d, -f3)
            line=$($MPIEXEC -n 4 build/bench/bench_ps --servers 2 --sync "$sync" --prefetch "$pf" --dense "$dense" $common)
        fi
        echo "$line" | sed "s/^{/{\"round\": $r, \"load\": $load, /" >>"$out"
    done
    r=$((r + 1))
done
# accuracy after a fixed number of samples: mode,dense (one: the one-process run)
acc_configs="sync,workers ssp:2,workers async,workers sync,servers ssp:2,servers async,servers one"
acc_log=$(mktemp /tmp/adt-ps-auc.XXXXXX)
r=$(first_round auc)
while [ "$r" -le "$ROUNDS" ]; do
    for c in $(round_order "$r" "$acc_configs"); do
        echo "round $r: auc $c" >&2
        flags="--model $ACC_MODEL --data synthetic:criteo-zipf --optimizer sgd --lr $ACC_LR --schedule constant \
            --steps $ACC_STEPS --batch $ACC_BATCH --eval-every $ACC_STEPS --eval-batches $ACC_EVAL --seed $r --log $acc_log"
        load=$(cut -d' ' -f1 /proc/loadavg)
        if [ "$c" = one ]; then
            build/adtrain train $flags 2>/dev/null
        else
            sync=$(echo "$c" | cut -d, -f1); dense=$(echo "$c" | cut -d, -f2)
            $MPIEXEC -n 4 build/adtrain train $flags --mode ps --ps-servers 2 --ps-sync "$sync" --ps-prefetch 2 \
                --ps-dense "$dense" 2>/dev/null
        fi
        auc=$(grep '"val_auc"' "$acc_log" | tail -1 | sed 's/.*"val_auc":\([0-9.]*\).*/\1/')
        printf '{"round": %s, "config": "auc", "mode": "%s", "samples": %s, "val_auc": %s, "load": %s}\n' "$r" "$c" \
            $((ACC_STEPS * ACC_BATCH)) "${auc:-null}" "$load" >>"$out"
    done
    r=$((r + 1))
done
rm -f "$acc_log"
printf '{"meta_end": {"load_after": "%s"}}\n' "$(cut -d' ' -f1-3 /proc/loadavg)" >>"$out"
"$PYTHON" - "$out" <<'PY'
import json, sys, statistics
rows = [json.loads(l) for l in open(sys.argv[1]) if '"samples_per_s"' in l]
by, loads = {}, {}
for r in rows:
    key = (f'pytorch 1 process, {r.get("kind", "bag")}, {r["threads"]} thread(s)' if r["config"] == "pytorch-1proc"
           else f'adtrain collective plan {r["strategy"]}, sgd' if r["config"] == "collective"
           else f'adtrain ps {r["sync"]} prefetch {r["prefetch"]} dense on {r.get("dense", "workers")}')
    by.setdefault(key, []).append(r["samples_per_s"])
    loads.setdefault(key, []).append(r.get("load", 0))
print(f"{'configuration':48s} {'samples/s median':>16s} {'min':>9s} {'max':>9s}  rounds  load")
for k, v in by.items():
    print(f"{k:48s} {statistics.median(v):16.1f} {min(v):9.1f} {max(v):9.1f}  {len(v):6d}  "
          f"{min(loads[k]):.1f}-{max(loads[k]):.1f}")
torch = {k: statistics.median(v) for k, v in by.items() if k.startswith("pytorch")}
if torch:
    best = max(torch, key=torch.get)
    print(f"fastest PyTorch setting: {best} ({torch[best]:.1f} samples/s median)")
acc = [json.loads(l) for l in open(sys.argv[1]) if '"config": "auc"' in l]
if acc:
    by, per_round = {}, {}
    for r in acc:
        by.setdefault(r["mode"], []).append(r["val_auc"])
        per_round.setdefault(r["round"], {})[r["mode"]] = r["val_auc"]
    print(f"\nAUC after {acc[0]['samples']} samples (mode,dense)   median      min      max  "
          f"median diff to sync (same dense)  rounds  load median")
    for k, v in by.items():
        v = [x for x in v if x is not None]
        dense = k.split(",")[1] if "," in k else None
        d = [pr[k] - pr["sync," + dense] for pr in per_round.values()
             if dense and pr.get(k) is not None and pr.get("sync," + dense) is not None]
        loads = [r["load"] for r in acc if r["mode"] == k]
        diff = f"{statistics.median(d):+.4f} [{min(d):+.4f}, {max(d):+.4f}]" if d else "-"
        print(f"{k:34s} {statistics.median(v):8.4f} {min(v):8.4f} {max(v):8.4f}  {diff:32s} {len(v):6d}  "
              f"{statistics.median(loads):.2f}")
print("results:", sys.argv[1])
PY
