#!/bin/sh
# Throughput of `adtrain train` under the elastic master (leases, per-step reports, flash
# checkpoints) against plain mpiexec on the same flags and sample order; prints ms/step of each,
# alternating runs (REPS pairs) so that load on the machine hits both alike.
#   bench/elastic_overhead.sh [RANKS] [REPS] -- TRAIN FLAGS...
set -e
ADT=${ADT:-build/adtrain}
RANKS=${1:-2}; REPS=${2:-3}; shift 2 || true; [ "$1" = "--" ] && shift
FLAGS=${*:-"--data synthetic:text --batch 64 --optimizer sgd --lr 0.05 --steps 60"}
MPIEXEC=${ADT_MPIEXEC:-$(command -v mpiexec.mpich || command -v mpiexec)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
ms() { sed -n 's/.*done: .* (\([0-9.]*\) ms\/step).*/\1/p' "$1" | tail -n 1; }
for i in $(seq "$REPS"); do
    if [ "$RANKS" = 1 ]; then $ADT train $FLAGS >"$dir/plain.log" 2>&1
    else $MPIEXEC -n "$RANKS" $ADT train $FLAGS >"$dir/plain.log" 2>&1; fi
    rm -rf "$dir/job" "$dir/ckpt"
    $ADT launch --nproc-per-node "$RANKS" --job "$dir/job" -- $ADT train $FLAGS --elastic-dir "$dir/ckpt" \
        >"$dir/elastic.log" 2>&1
    echo "pair $i: plain $(ms "$dir/plain.log") ms/step, elastic $(ms "$dir/elastic.log") ms/step;" \
         "$(sed -n 's/.*elastic: \([0-9]* checkpoints blocked.*\)/\1/p' "$dir/elastic.log" | tail -n 1)"
done
