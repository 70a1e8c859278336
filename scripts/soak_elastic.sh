#!/bin/sh
# soak_elastic.sh - a soak test of the elastic runtime: TRIALS randomized trials (default 24) of a
# 2-agent x 2-rank job, each with a kill -9 of a worker, an agent or the master at a random
# moment, each audited (the ledger, and the workers' own model: every sample trained exactly once
# per epoch).
#
#   sh scripts/soak_elastic.sh [TRIALS] [SEED]      BUILD=build/san for the sanitized build
#   ONLY=test_train_trials sh scripts/soak_elastic.sh   the same with the real trainer (adtrain train)
#   GPT_MODEL=configs/gpt-s.json ONLY=test_train_trials ...   its GPT runs on that model (GPT-S)
#
# Prints the summary; a failed trial's directory (logs, ledger, checkpoints) is kept and named.
set -eu
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
TRIALS=${1:-24}
SEED=${2:-$(date +%s)}
if [ "$BUILD" = build/san ]; then SAN=1; else SAN=0; fi
make -s SANITIZE=$SAN "$BUILD/tests/test_elastic" "$BUILD/tests/elastic_worker" "$BUILD/adtrain"
echo "soak_elastic: $TRIALS trials, seed $SEED"
log=$(mktemp)
rc=0
ADT_ELASTIC_GPT_MODEL=${GPT_MODEL:-} ADT_ELASTIC_ONLY=${ONLY:-test_random_trials} ADT_ELASTIC_TRIALS=$TRIALS ADT_ELASTIC_TRAIN_TRIALS=$TRIALS ADT_TEST_SEED=$SEED \
    "$BUILD/tests/test_elastic" >"$log" 2>&1 || rc=$?
grep -v '^adtrain: info' "$log" | tail -n 40
rm -f "$log"
exit $rc
