#!/bin/sh
# run_planner_accuracy.sh - the cost model against this machine. For each model (the MLP, the small
# VGG, DLRM small, GPT-S) `adtrain calibrate --ranks RANKS --model CFG:B` measures the machine
# right before the model's plans are (its own ops timed into the op factors; CLUSTER=FILE prices
# every model on FILE instead); then for 1..RANKS MPI ranks
# every plan of a fixed list (dp, zero, tp, dp=2,tp=2 [,zero], pp with 1/2/4 microbatches,
# dp=2,pp=2, and the auto plan) is priced by `adtrain plan ... --cluster --json` on the calibrated
# cluster file (the model's input timed once and passed to every plan as --input-s) and trained by
# `mpiexec -n N adtrain train --plan`. The summary gives per model the
# number of plans, the median absolute error of the predicted step time, Kendall's tau of the
# predicted against the measured ranking, the measured time of the predicted-best plan over the
# measured best, and the predicted peak memory per rank over the measured one (min and max).
#
#   sh bench/run_planner_accuracy.sh       (about 55 minutes on a 2-core machine)
#   RANKS=2 ROUNDS=3 sh bench/run_planner_accuracy.sh   the 1- and 2-rank plans only (one rank per
#       core on 2 cores: dp and pp=1 with 2 microbatches on 1 rank; dp, zero, tp, pp=2 with 1/2/4
#       microbatches and auto on 2), calibrated with --ranks 2; about 20 minutes
# RANKS=2 also limits `planner_accuracy.py --summary / --reprice` of a stored run to those plans.
#
# Measured step time: ROUNDS runs per plan (WARMUP steps, then max(STEPS, TIME_S / the predicted
# step) timed: about half a second of steps), interleaved across all plans of a model (round robin,
# order reversed every other round) so that load from others on a shared machine falls on every
# plan alike; per run the mean of rank 0's per-step ms after the warmup (--log), per plan the
# mean of the runs (the median beside it; planner_accuracy.py's plan_time says why). Measured
# memory: every rank's executor reports (ADT_MEM_REPORT) its memory plan: slots x arena + state + scratch bytes, the max over ranks (the
# growth of the peak RSS is recorded beside it). Plans that `adtrain plan` refuses for a shape
# (tp of 3, a batch that 3 does not divide) are left out.
#
# Writes bench/results/planner-accuracy-<UTC date-time>.jsonl (a "meta" line; per model a
# "calibration" line with the cluster file its plans were priced on, then one line per plan) and prints the summary table.
#
# Rounds: this VM's speed changes by up to 1.6x (a GEMM at 21-49 GFLOP/s in one minute) and holds
# a state for seconds (the autocorrelation of 0.17 s samples halves at about 3 s), so a run of a
# few seconds is one sample of it, whatever its steps; many short runs sample it better than a
# few long ones. With 8 rounds the measurement alone, resampled at its own spread, ranks GPT-S's
# plans at tau 0.78 against their true order; 16 at 0.83.
#
# Environment: RANKS=4 ROUNDS=16 STEPS=4 TIME_S=0.5 WARMUP=2 MODELS="mlp-mnist vgg-mnist dlrm-small gpt-s"
#              CLUSTER=FILE (skip calibration, use this cluster file)
#              CALIBRATE_AFTER=1 (calibrate once more after each model's rounds: a "calibration_after"
#              line, for `planner_accuracy.py --reprice` with REPRICE_CLUSTER=after or mean)
set -eu
cd "$(dirname "$0")/.."
RANKS=${RANKS:-4} ROUNDS=${ROUNDS:-16} STEPS=${STEPS:-4} TIME_S=${TIME_S:-0.5} WARMUP=${WARMUP:-2}
MODELS=${MODELS:-mlp-mnist vgg-mnist dlrm-small gpt-s}
PYTHON=${PYTHON:-/usr/bin/python3}
CALIBRATE_AFTER=${CALIBRATE_AFTER:-0}
export RANKS ROUNDS STEPS TIME_S WARMUP MODELS CALIBRATE_AFTER OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
make -j2 build/adtrain >/dev/null
mkdir -p bench/results
out=bench/results/planner-accuracy-$(date -u +%Y%m%dT%H%M%SZ).jsonl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# a copy of the binary: a rebuild while this runs changes neither predictions nor runs
cp build/adtrain "$tmp/adtrain"
ADT=$tmp/adtrain
export ADT
# the models' own ops are timed into the calibration's op factors, at the batches trained below
# (planner_accuracy.py's DATA), and at half and a quarter of them
if [ -n "${CLUSTER:-}" ]; then cp "$CLUSTER" "$tmp/here.json"; cluster=$tmp/here.json
else cluster=calibrate; fi
"$PYTHON" bench/planner_accuracy.py "$tmp" "$cluster" "$out"
echo "wrote $out" >&2
