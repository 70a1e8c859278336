#!/bin/sh
# run_ps_chaos.sh - a chaos soak of the parameter-server mode under the elastic agents: TRIALS
# (default 20) jobs of `adtrain train --mode ps --ps-servers 2` on one agent of 4 slots (ranks 0
# and 1 serve a DLRM's rows, ranks 2 and 3 work; sync, 100 steps of 32, a commit every 10), each
# with a kill -9 of a random rank - server or worker - at a random moment (0-50 ms after a random
# step of the run was reported, steps 1-98 alike). Every job must finish; its ledger
# audit must find every sample trained exactly once, every step committed; and every step's last
# logged loss must be `mpiexec -n 4`'s (the world keeps its size, so a restored run repeats the
# uninterrupted one bit for bit). The trials are tests/test_elastic.c's test_train_ps_trials.
#
#   sh bench/run_ps_chaos.sh [TRIALS] [SEED]        BUILD=build/san for the sanitized build
#
# Prints the MEASURE line (trials, server and worker kills, recoveries - a later generation
# finished the run - clean audits, runs at mpiexec's losses) with the load average before and
# after; a failed trial's directory (logs, ledger, checkpoints) is kept and named.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TRIALS=${1:-20}
SEED=${2:-$(date +%s)}
if [ "$BUILD" = build/san ]; then SAN=1; else SAN=0; fi
make -s -j2 SANITIZE=$SAN "$BUILD/tests/test_elastic" "$BUILD/tests/elastic_worker" "$BUILD/adtrain"
echo "run_ps_chaos: $TRIALS trials, seed $SEED, commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)"
log=$(mktemp /tmp/adt-ps-chaos.XXXXXX)
rc=0
t0=$(date +%s)
ADT_ELASTIC_ONLY=test_train_ps_trials ADT_ELASTIC_PS_TRIALS=$TRIALS ADT_TEST_SEED=$SEED \
    "$BUILD/tests/test_elastic" >"$log" 2>&1 || rc=$?
grep -E '^(MEASURE|RESULT|case|  )' "$log" | tail -n 40
echo "run_ps_chaos: $(($(date +%s) - t0)) s, load after $(cut -d' ' -f1-3 /proc/loadavg), exit $rc"
rm -f "$log"
exit $rc
