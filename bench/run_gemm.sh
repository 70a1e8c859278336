#!/bin/sh
# run_gemm.sh - the GEMM layer's backends on the GPT-S and MLP training steps' own products, and
# each step's GEMM floor, one command:
#
#   sh bench/run_gemm.sh            (under a minute at 9 rounds)
#
# Builds bench_gemm and runs it (bench/bench_gemm.c: interleaved rounds, the backends' order
# alternating, medians with the range over rounds; every figure also in thread CPU time). The JSON
# lines go to bench/results/gemm-<UTC date-time>.jsonl after a "meta" line (date, CPUs, load);
# the table to stdout.
#
# Environment: ROUNDS=9 THREADS=1 MODEL=all (gpt-s|mlp|all)
#              ADT_GEMM (openblas|onednn|auto): which backend's floor is "the layer's choice"
#              OPENBLAS_CORETYPE: as the CLI, unset means the family adtrain corrects OpenBLAS to
set -eu
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-9}
THREADS=${THREADS:-1}
MODEL=${MODEL:-all}
# counted before OMP_NUM_THREADS is set: nproc honours it
NCPU=$(nproc 2>/dev/null || echo '?')
# both libraries' pools at the thread count under test before either starts one
export OPENBLAS_NUM_THREADS=$THREADS OMP_NUM_THREADS=$THREADS
# Above one thread the two pools take turns in one process: libgomp's workers spin after each
# oneDNN product (OMP_WAIT_POLICY=active, its default) and starve OpenBLAS's next calls, and the
# reverse, which a training run (one backend) never sees. MLP at 2 threads on 2 loaded cores:
# 18 / 14 GFLOP/s (OpenBLAS / oneDNN) spinning, 83 / 94 passive. So passive, unless set.
if [ "$THREADS" -gt 1 ]; then export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}; fi
${MAKE:-make} --no-print-directory build/bench/bench_gemm >&2
mkdir -p bench/results
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
OUT=bench/results/gemm-$STAMP.jsonl
printf '{"meta": {"date": "%s", "cpus": "%s", "cpu_model": "%s", "loadavg_at_start": "%s", "rounds": %s, "threads": %s, "omp_wait_policy": "%s"}}\n' \
    "$STAMP" "$NCPU" "$(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -n 1)" "$(cut -d ' ' -f 1-3 /proc/loadavg)" \
    "$ROUNDS" "$THREADS" "${OMP_WAIT_POLICY:-}" > "$OUT"
build/bench/bench_gemm --model "$MODEL" --threads "$THREADS" --rounds "$ROUNDS" >> "$OUT" 2> "$OUT.table"
cat "$OUT.table"
rm -f "$OUT.table"
echo "results: $OUT (load average at the end: $(cut -d ' ' -f 1-3 /proc/loadavg))"
