#!/bin/sh
# run_planner.sh - the automatic planner at scale on the example clusters (bench/bench_planner.c):
# search time (wall and CPU) and the predicted step time and peak memory of the chosen plan next
# to the best expert plan's, for GPT ~1.3B (24 layers on 64 H100; 96 layers on 1024 H100; on the
# CPU cluster), VGG-16 and DLRM on 64 H100.
#
#   sh bench/run_planner.sh
#
# Builds bench_planner, runs every case once, writes the JSON lines to
# bench/results/planner-<UTC date-time>.jsonl after one "meta" line, and prints the table.
set -eu
cd "$(dirname "$0")/.."
# The planner runs no matrix product; OpenBLAS's worker threads, started when the library loads,
# would spin beside the first case's search (0.13 s of CPU on this 2-core machine).
export OPENBLAS_NUM_THREADS=1
make -j2 build/bench/bench_planner >/dev/null
mkdir -p bench/results
out=bench/results/planner-$(date -u +%Y%m%dT%H%M%SZ).jsonl
printf '{"meta":{"host":"%s","cpus":%s,"commit":"%s","load":"%s"}}\n' "$(uname -n)" "$(nproc)" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo none)" "$(cut -d' ' -f1-3 /proc/loadavg)" >"$out"
./build/bench/bench_planner >>"$out"
echo "wrote $out" >&2
