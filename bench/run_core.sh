#!/bin/sh
# run_core.sh - the core engine's training-step benchmark: adtrain (bench/bench_core.c) and
# PyTorch (bench/torch_peer.py) side by side, in one invocation, on the same machine.
#
#   sh bench/run_core.sh [rounds]
#
# Builds bench_core, then runs ROUNDS rounds of: for each model, one adtrain run and one
# PyTorch run (each WARMUP + STEPS whole training steps, median reported; each its own process,
# whose peak resident set both programs report). PyTorch runs the formulation torch_peer.py
# found fastest for the model (its FASTEST table; bench/torch_formulations.py measures them). The runs are
# interleaved so that whatever else the machine is doing hits both frameworks alike, and the
# order within a pair alternates from round to round (adtrain first in odd rounds, PyTorch
# first in even ones) so that neither always runs in the other's wake. Every JSON line goes to
# bench/results/core-<UTC date-time>.jsonl with a "round" field added, after one "meta" line
# describing the machine; the summary table goes to stdout, progress to stderr.
#
# Environment (all optional):
#   ROUNDS=3  STEPS=20  WARMUP=3  THREADS=1  MODELS="gpt-s mlp vgg dlrm"  PYTHON=/usr/bin/python3
#   BLAS_CORE          the OpenBLAS kernel family for both frameworks (they load the same
#                      libopenblas); unset: the one adtrain picks for this CPU on its own, whatever
#                      OPENBLAS_CORETYPE the environment holds (bench/bench_env.sh)
#   PEER_MALLOC=default  glibc's malloc thresholds left as they are (bench/bench_env.sh)
set -eu

cd "$(dirname "$0")/.."

ROUNDS=${1:-${ROUNDS:-3}}
STEPS=${STEPS:-20}
WARMUP=${WARMUP:-3}
THREADS=${THREADS:-1}
MODELS=${MODELS:-gpt-s mlp vgg dlrm}
# Debian's torch is installed for the system interpreter, not for a virtual environment.
PYTHON=${PYTHON:-/usr/bin/python3}
BIN=build/bench/bench_core

# Counted before OMP_NUM_THREADS is set: nproc honours it.
NCPU=$(nproc 2>/dev/null || echo '?')

# Both frameworks' BLAS and OpenMP pools at the thread count under test. The programs also set
# it themselves; the environment makes sure no pool starts wider before they get to.
OPENBLAS_NUM_THREADS=$THREADS
OMP_NUM_THREADS=$THREADS
export OPENBLAS_NUM_THREADS OMP_NUM_THREADS

. bench/bench_env.sh
bench_setup core

# One line about the machine, for the record.
CPU=$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n 1)
OBLAS=$(dpkg-query -W -f '${Version}' libopenblas0-pthread 2>/dev/null || echo unknown)
TORCHPKG=$(dpkg-query -W -f '${Version}' python3-torch 2>/dev/null || echo unknown)
LOAD=$(cut -d ' ' -f 1-3 /proc/loadavg 2>/dev/null || echo unknown)
"$PYTHON" - "$CPU" "$NCPU" "$OBLAS" "$LOAD" "$TORCHPKG" "$OPENBLAS_CORETYPE" "$CORE_FROM" "$ROUNDS" "$STEPS" "$WARMUP" "$THREADS" \
    "${MALLOC_MMAP_THRESHOLD_-default}" > "$OUT" <<'EOF'
import datetime, json, sys
a = sys.argv[1:]
print(json.dumps({"meta": {
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    "cpu": a[0], "cpus": a[1], "openblas_package": a[2], "loadavg_at_start": a[3],
    "torch_package": a[4], "openblas_coretype": a[5], "openblas_coretype_from": a[6],
    "rounds": int(a[7]), "steps": int(a[8]), "warmup": int(a[9]), "threads": int(a[10]),
    "malloc_mmap_threshold": a[11]}}))
EOF

# run ROUND FRAMEWORK MODEL: one run, its JSON line tagged with the round and appended.
run() {
    if [ "$2" = adtrain ]; then
        "$BIN" --model "$3" --threads "$THREADS" --warmup "$WARMUP" --steps "$STEPS" > "$TMP"
    else
        "$PYTHON" bench/torch_peer.py --model "$3" --threads "$THREADS" --warmup "$WARMUP" \
            --steps "$STEPS" > "$TMP"
    fi
    sed -n "s/^{/{\"round\": $1, /p" "$TMP" >> "$OUT"
    printf 'round %s/%s  %-7s %-5s  median %s ms\n' "$1" "$ROUNDS" "$2" "$3" \
        "$(sed -n 's/.*"step_ms_median": *\([0-9.]*\).*/\1/p' "$TMP")" >&2
}

r=1
while [ "$r" -le "$ROUNDS" ]; do
    for m in $MODELS; do
        if [ $((r % 2)) -eq 1 ]; then
            run "$r" adtrain "$m"
            run "$r" pytorch "$m"
        else
            run "$r" pytorch "$m"
            run "$r" adtrain "$m"
        fi
    done
    r=$((r + 1))
done

echo "raw results: $OUT" >&2

"$PYTHON" - "$OUT" <<'EOF'
"""Summary of one run_core.sh results file: per model and framework, the median of the
per-round medians and their spread, the ratio adtrain/pytorch (of those medians, and per round),
the in-process GEMM rate, the GEMM-bound floor, and each process's peak resident set."""
import json, statistics, sys

path = sys.argv[1]
meta, rows = {}, []
with open(path) as f:
    for line in f:
        d = json.loads(line)
        if "meta" in d:
            meta = d["meta"]
        else:
            rows.append(d)

# adtrain step time / PyTorch step time at 1 thread; and step / GEMM floor (vgg, dlrm: recorded)
TARGET = {"gpt-s": 0.70, "mlp": 0.75}
FLOOR_TARGET = 1.15


def pick(model, fw):
    return sorted((r for r in rows if r["model"] == model and r["framework"] == fw),
                  key=lambda r: r["round"])


def med(v):
    return statistics.median(v)


models = [m for m in ("gpt-s", "mlp", "vgg", "dlrm") if any(r["model"] == m for r in rows)]
torch_v = next((r.get("torch_version") for r in rows if r["framework"] == "pytorch"), "?")
blas_cfg = next((r.get("blas_config") for r in rows if r["framework"] == "adtrain"), "?")
print(f"date {meta.get('date')}  cpu {meta.get('cpu')} ({meta.get('cpus')} cpus)  "
      f"load at start {meta.get('loadavg_at_start')}")
print(f"OpenBLAS package {meta.get('openblas_package')}: {blas_cfg}  "
      f"OPENBLAS_CORETYPE={meta.get('openblas_coretype')} (from {meta.get('openblas_coretype_from')})  "
      f"MALLOC_MMAP_THRESHOLD_={meta.get('malloc_mmap_threshold', 'default')}")
print(f"PyTorch {torch_v} (package {meta.get('torch_package')}); threads {meta.get('threads')}; "
      f"{meta.get('rounds')} rounds x ({meta.get('warmup')} warmup + {meta.get('steps')} timed steps) per run")
for m in models:
    t = pick(m, "pytorch")
    if t:
        print(f"PyTorch {m}: formulation {t[0].get('formulation')}, optimizer update {t[0].get('optimizer_impl')}")
print()
print("| model | adtrain ms | (spread) | pytorch ms | (spread) | adtrain/pytorch | (per round) "
      "| target | GEMM GFLOP/s | floor ms | adtrain/floor | pytorch/floor | adtrain RSS MiB | pytorch RSS MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for m in models:
    a, t = pick(m, "adtrain"), pick(m, "pytorch")
    if not a or not t:
        continue
    am = [r["step_ms_median"] for r in a]
    tm = [r["step_ms_median"] for r in t]
    a_med, t_med = med(am), med(tm)
    ratio = a_med / t_med
    by_round = {r["round"]: r["step_ms_median"] for r in t}
    paired = [r["step_ms_median"] / by_round[r["round"]] for r in a if r["round"] in by_round]
    if m in TARGET:
        met = f"<= {TARGET[m]:.2f} {'met' if ratio <= TARGET[m] else 'not met'}"
    else:
        met = "recorded"
    if "sgemm_gflops" in a[0]:
        gflops = med([r["sgemm_gflops"] for r in a])
        floor = a[0]["matmul_flops_per_step"] / (gflops * 1e9) * 1e3
        fl = (f"{gflops:.1f} | {floor:.2f} | {a_med / floor:.2f} "
              f"({'met' if a_med / floor <= FLOOR_TARGET else 'not met'}) | {t_med / floor:.2f}")
    else:
        fl = "- | - | - | -"
    ar = max(r.get("max_rss_mib", float("nan")) for r in a)
    tr = max(r.get("max_rss_mib", float("nan")) for r in t)
    print(f"| {m} | {a_med:.2f} | {min(am):.2f}..{max(am):.2f} | {t_med:.2f} | "
          f"{min(tm):.2f}..{max(tm):.2f} | {ratio:.3f} | {min(paired):.3f}..{max(paired):.3f} | "
          f"{met} | {fl} | {ar:.1f} | {tr:.1f} |")
    if t[0]["matmul_flops_per_step"] and t[0]["matmul_flops_per_step"] != a[0]["matmul_flops_per_step"]:
        print(f"  note: {m}: matmul FLOPs per step differ: adtrain {a[0]['matmul_flops_per_step']}, "
              f"pytorch {t[0]['matmul_flops_per_step']}")
print()
print("ms: median over rounds of each run's median step time; spread: min..max of those round medians;")
print(f"GEMM: adtrain's in-process replay of the step's GEMM shapes (median over rounds); "
      f"floor = matmul FLOPs per step / that rate (target: step <= {FLOOR_TARGET} x floor);")
print("RSS: the largest peak resident set (ru_maxrss) of the model's processes over the rounds.")
print()
# Less exposed to bursts of load from other processes: the fastest single step of all rounds,
# and each process's CPU time per step (median over rounds of the runs' medians; wall / CPU above
# 1 is time the scheduler gave to others).
print("| model | adtrain best step ms | pytorch best step ms | adtrain/pytorch (best) "
      "| adtrain cpu ms | pytorch cpu ms | adtrain/pytorch (cpu) | adtrain/floor (cpu) | adtrain wall/cpu |")
print("|---|---|---|---|---|---|---|---|---|")
for m in models:
    a, t = pick(m, "adtrain"), pick(m, "pytorch")
    if not a or not t:
        continue
    ab = min(r["step_ms_min"] for r in a)
    tb = min(r["step_ms_min"] for r in t)
    cpu = med([r["cpu_ms_median"] for r in a])
    tcpu = med([r.get("cpu_ms_median", float("nan")) for r in t])
    wall = med([r["step_ms_median"] for r in a])
    fcpu = (f"{med([r['step_cpu_over_floor'] for r in a]):.2f}" if "step_cpu_over_floor" in a[0] else "-")
    print(f"| {m} | {ab:.2f} | {tb:.2f} | {ab / tb:.3f} | {cpu:.2f} | {tcpu:.2f} | {cpu / tcpu:.3f} | {fcpu} | "
          f"{wall / cpu:.2f} |")
EOF
