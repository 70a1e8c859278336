#!/bin/sh
# run_dp.sh - data parallelism on 2 ranks: adtrain (bench/bench_core.c under mpiexec) against
# PyTorch DistributedDataParallel over gloo (bench/torch_ddp.py), on the models of run_core.sh
# with the same per-rank batch and optimizer, in one invocation.
#
#   sh bench/run_dp.sh [rounds]
#
# Each round runs, per model, five configurations back to back, their order reversed every other
# round so that none always runs in another's wake:
#   adtrain   1 rank  (bench_core)                         the single-rank yardstick
#   adtrain   2 ranks (mpiexec -n 2 bench_core)             gradient all-reduces overlapped
#   adtrain   2 ranks (... --no-overlap)                    each all-reduce where it stands
#   pytorch   1 rank  (torch_ddp.py --world 1)              plain, no DDP
#   pytorch   2 ranks (torch_ddp.py --world 2)              DDP over gloo
# Every JSON line goes to bench/results/dp-<UTC date-time>.jsonl with a "round" and a "config"
# field, after one "meta" line describing the machine (load average before and after included);
# the summary goes to stdout, progress to stderr.
#
# Summary per model: median over rounds of each configuration's median step time, its spread,
# aggregate throughput (ranks x per-rank batch / step time), scaling efficiency (2-rank
# aggregate / (2 x 1-rank throughput)), adtrain's 2-rank aggregate over PyTorch's, and the
# fraction of gradient communication hidden behind the backward pass: per-collective in-flight
# time not spent blocked (comm_hidden), and 1 - (time blocked with overlap) / (time blocked
# without overlap).
#
# Environment (all optional):
#   ROUNDS=3  STEPS=20  WARMUP=3  THREADS=1  MODELS="gpt-s mlp"  PYTHON=/usr/bin/python3
#   BIND="-bind-to core"   mpiexec's binding of the adtrain ranks (set BIND= for none)
#   BLAS_CORE              the OpenBLAS kernel family for both frameworks; unset: the one
#                          adtrain picks for this CPU on its own (as run_core.sh)
#   PEER_MALLOC=default    glibc's malloc thresholds left as they are (bench/bench_env.sh)
set -eu

cd "$(dirname "$0")/.."

ROUNDS=${1:-${ROUNDS:-3}}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
THREADS=${THREADS:-1}
MODELS=${MODELS:-gpt-s mlp}
PYTHON=${PYTHON:-/usr/bin/python3}
BIND=${BIND--bind-to core}
BIN=build/bench/bench_core
NCPU=$(nproc 2>/dev/null || echo '?')

OPENBLAS_NUM_THREADS=$THREADS
OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS OMP_NUM_THREADS

if command -v mpiexec.mpich >/dev/null 2>&1; then MPIEXEC=${MPIEXEC:-mpiexec.mpich}; else MPIEXEC=${MPIEXEC:-mpiexec}; fi

. bench/bench_env.sh
bench_setup dp

CPU=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
MPIV=$("$MPIEXEC" --version 2>/dev/null | sed -n 's/^[[:space:]]*Version:[[:space:]]*//p' | head -n 1)
TORCHPKG=$(dpkg-query -W -f '${Version}' python3-torch 2>/dev/null || echo unknown)
LOAD=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)
"$PYTHON" - "$CPU" "$NCPU" "$MPIV" "$LOAD" "$TORCHPKG" "$OPENBLAS_CORETYPE" "$CORE_FROM" "$ROUNDS" "$STEPS" \
    "$WARMUP" "$THREADS" "$BIND" > "$OUT" <<'EOF'
import datetime, json, sys
a = sys.argv[1:]
print(json.dumps({"meta": {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "cpu": a[0], "cpus": a[1], "mpich": a[2], "loadavg_at_start": a[3], "torch_package": a[4],
    "openblas_coretype": a[5], "openblas_coretype_from": a[6], "rounds": int(a[7]), "steps": int(a[8]),
    "warmup": int(a[9]), "threads": int(a[10]), "bind": a[11]}}))
EOF

# run ROUND CONFIG MODEL: one run, its JSON line tagged and appended.
run() {
    case "$2" in
    adtrain-1) "$BIN" --model "$3" --threads "$THREADS" --warmup "$WARMUP" --steps "$STEPS" --gemm-reps 0 > "$TMP" ;;
    # shellcheck disable=SC2086
    adtrain-2) "$MPIEXEC" -n 2 $BIND "$BIN" --model "$3" --threads "$THREADS" --warmup "$WARMUP" --steps "$STEPS" > "$TMP" ;;
    # shellcheck disable=SC2086
    adtrain-2-sync) "$MPIEXEC" -n 2 $BIND "$BIN" --model "$3" --threads "$THREADS" --warmup "$WARMUP" \
        --steps "$STEPS" --no-overlap > "$TMP" ;;
    pytorch-1) "$PYTHON" bench/torch_ddp.py --model "$3" --world 1 --warmup "$WARMUP" --steps "$STEPS" > "$TMP" ;;
    pytorch-2) "$PYTHON" bench/torch_ddp.py --model "$3" --world 2 --warmup "$WARMUP" --steps "$STEPS" > "$TMP" ;;
    esac
    sed -n "s/^{/{\"round\": $1, \"config\": \"$2\", /p" "$TMP" >> "$OUT"
    printf 'round %s/%s  %-15s %-5s  median %s ms\n' "$1" "$ROUNDS" "$2" "$3" \
        "$(sed -n 's/.*"step_ms_median": *\([0-9.]*\).*/\1/p' "$TMP")" >&2
}

CONFIGS="adtrain-1 adtrain-2 adtrain-2-sync pytorch-1 pytorch-2"
REVERSED="pytorch-2 pytorch-1 adtrain-2-sync adtrain-2 adtrain-1"
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for m in $MODELS; do
        if [ $((r % 2)) -eq 1 ]; then order=$CONFIGS; else order=$REVERSED; fi
        for c in $order; do run "$r" "$c" "$m"; done
    done
    r=$((r + 1))
done

LOAD_END=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)
printf '{"meta_end": {"loadavg_at_end": "%s"}}\n' "$LOAD_END" >> "$OUT"
echo "raw results: $OUT" >&2

"$PYTHON" - "$OUT" <<'EOF'
"""Summary of one run_dp.sh results file."""
import json, statistics, sys

meta, meta_end, rows = {}, {}, []
with open(sys.argv[1]) as f:
    for line in f:
        d = json.loads(line)
        if "meta" in d:
            meta = d["meta"]
        elif "meta_end" in d:
            meta_end = d["meta_end"]
        else:
            rows.append(d)

print(f"date {meta.get('date')}  cpu {meta.get('cpu')} ({meta.get('cpus')} cpus)  MPICH {meta.get('mpich')}  "
      f"PyTorch package {meta.get('torch_package')}")
print(f"load average at start {meta.get('loadavg_at_start')}, at end {meta_end.get('loadavg_at_end')}; "
      f"OPENBLAS_CORETYPE={meta.get('openblas_coretype')}; threads per rank {meta.get('threads')}; "
      f"mpiexec binding '{meta.get('bind')}'")
print(f"{meta.get('rounds')} rounds x ({meta.get('warmup')} warmup + {meta.get('steps')} timed steps) per run")
print()


def pick(model, config, key):
    return [r.get(key) for r in sorted(rows, key=lambda r: r["round"]) if r["model"] == model and r["config"] == config]


def med(v):
    return statistics.median(v) if v else float("nan")


def spread(v):
    return f"{min(v):.2f}..{max(v):.2f}" if v else "-"


models = [m for m in ("gpt-s", "mlp") if any(r["model"] == m for r in rows)]
print("| model | config | ranks | batch/rank | step ms | (spread) | samples/s | (spread) | peak RSS MiB per rank |")
print("|---|---|---|---|---|---|---|---|---|")
for m in models:
    for c in ("adtrain-1", "adtrain-2", "adtrain-2-sync", "pytorch-1", "pytorch-2"):
        ms, sps = pick(m, c, "step_ms_median"), pick(m, c, "samples_per_s")
        if not ms:
            continue
        world = 2 if c.startswith(("adtrain-2", "pytorch-2")) else 1
        b = pick(m, c, "batch_per_rank")[0]
        rss = [x for x in pick(m, c, "max_rss_mib") if x is not None]
        print(f"| {m} | {c} | {world} | {b} | {med(ms):.2f} | {spread(ms)} | {med(sps):.1f} | {spread(sps)} | "
              f"{max(rss) if rss else float('nan'):.1f} |")
print()
print("| model | adtrain efficiency | (per round) | PyTorch efficiency | (per round) | adtrain/PyTorch aggregate "
      "| (per round) | hidden (in flight) | hidden (vs blocking) | blocked ms overlap / blocking "
      "| adtrain CPU ms 1 rank / 2 ranks |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
paired = {}
for m in models:
    a1, a2, a2s = pick(m, "adtrain-1", "samples_per_s"), pick(m, "adtrain-2", "samples_per_s"), \
        pick(m, "adtrain-2-sync", "samples_per_s")
    t1, t2 = pick(m, "pytorch-1", "samples_per_s"), pick(m, "pytorch-2", "samples_per_s")
    if not (a1 and a2 and t1 and t2):
        continue
    ea = [x / (2 * y) for x, y in zip(a2, a1)]
    et = [x / (2 * y) for x, y in zip(t2, t1)]
    ratio = [x / y for x, y in zip(a2, t2)]
    hid = pick(m, "adtrain-2", "comm_hidden")
    w_ov, w_sy = pick(m, "adtrain-2", "comm_wait_ms"), pick(m, "adtrain-2-sync", "comm_wait_ms")
    hid_sync = 1 - med(w_ov) / med(w_sy) if w_sy and med(w_sy) > 0 else float("nan")
    c1, c2 = pick(m, "adtrain-1", "cpu_ms_median"), pick(m, "adtrain-2", "cpu_ms_median")
    print(f"| {m} | {med(a2) / (2 * med(a1)):.3f} | {min(ea):.3f}..{max(ea):.3f} | {med(t2) / (2 * med(t1)):.3f} | "
          f"{min(et):.3f}..{max(et):.3f} | {med(a2) / med(t2):.2f} | {min(ratio):.2f}..{max(ratio):.2f} | "
          f"{med(hid):.3f} | {hid_sync:.3f} | {med(w_ov):.2f} / {med(w_sy):.2f} | {med(c1):.1f} / {med(c2):.1f} |")
    paired[m] = (med(ea), med(et), med(ratio))
print()
# The runs of one round are minutes apart at most, those of different rounds may see another load:
# the ratio within each round, then its median, compares like with like.
print("| model | adtrain efficiency, median of rounds | PyTorch efficiency, median of rounds "
      "| adtrain/PyTorch aggregate, median of rounds |")
print("|---|---|---|---|")
for m, (e_a, e_t, r) in paired.items():
    print(f"| {m} | {e_a:.3f} | {e_t:.3f} | {r:.2f} |")
print()
print("efficiency: 2-rank aggregate samples/s / (2 x 1-rank samples/s), of the medians over rounds (per round: "
      "min..max of the same ratio within each round);")
print("hidden (in flight): 1 - time blocked in waits / time collectives were in flight, adtrain-2 median; "
      "hidden (vs blocking): 1 - blocked time with overlap / blocked time without (medians).")
print("CPU ms: the process CPU time of a step on rank 0 (2 ranks: its own run, before the closing barrier); wall "
      "time far above it is time the scheduler gave to other processes.")
print("RSS: the largest peak resident set (ru_maxrss) of any rank of the configuration over the rounds.")
print("targets: adtrain aggregate >= 2.0 x PyTorch's, adtrain efficiency >= 0.9")
EOF
