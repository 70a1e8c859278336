#!/bin/sh
# Throughput of `adtrain train` under the elastic master (leases, per-step reports, flash
# checkpoints) against plain training (mpiexec, or one process) on the same flags and sample
# order, in short alternating pairs so that the load on the machine hits both sides alike.
#
#   bench/elastic_overhead.sh [REPS]                   the matrix: GPT-S (configs/gpt-s.json) and
#                                                      an MLP, 1 and 2 ranks, REPS pairs each (6)
#   bench/elastic_overhead.sh RANKS REPS -- FLAGS...   one case
#
# A run's time per step is the same on both sides: the --log's `wall_s` (the clock since the
# first step began) from the end of step 2 (warm-up) to the end of the step before the last (an
# elastic run ends waiting for its last commit), over the steps between: everything a step
# costs, whatever it is (its lease, gather, report and control all-reduce, logging, the
# control plane's processes taking the CPU, checkpoints). Per case it prints the median of
# each side with its range, the median of the paired ratios elastic/plain with their quartiles
# and range, and the elastic run's own accounting (--log `elastic_ms`: waiting for a lease, the
# gather of the leased ranges, queueing the report, the control all-reduce, draining reports
# before a commit, the flash copy) as ms/step and as a fraction of its step; then the paired
# ratios' geometric mean and a 95% bootstrap interval of their median (how many pairs it takes
# to tell 2% from the machine's noise). The load average is printed before and after.
set -e
ADT=${ADT:-build/adtrain}
MPIEXEC=${ADT_MPIEXEC:-$(command -v mpiexec.mpich || command -v mpiexec)}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT INT TERM

# mean of a --log field over the steps after the first two and before the last (the run's end
# waits for its last commit, a cost per run, not per step) of the lines that have it
log_mean() {
    awk -v k="\"$2\":" 'index($0, k) { s = $0; sub(/.*"step":/, "", s); st[++n] = s + 0
        v[n] = substr($0, index($0, k) + length(k)) + 0; if (st[n] > last) last = st[n] }
        END { for (i = 1; i <= n; i++) if (st[i] > 2 && st[i] < last) { sum += v[i]; m++ }
              if (m) printf "%.4f\n", sum / m }' "$1"
}
# seconds per step by the --log's wall_s: from the end of step 2 to the end of the step before
# the last, in ms
wall_per_step() {
    awk 'index($0, "\"wall_s\":") { s = $0; sub(/.*"step":/, "", s); st = s + 0
        w = $0; sub(/.*"wall_s":/, "", w); wall[st] = w + 0; if (st > last) last = st }
        END { if (last > 4 && (2 in wall) && ((last - 1) in wall))
                  printf "%.4f\n", 1e3 * (wall[last - 1] - wall[2]) / (last - 3) }' "$1"
}
# median, quartiles and range of the numbers in a file: "median [q1, q3] (min-max)"
stats() {
    sort -g "$1" | awk '{ v[NR] = $1 } END { if (!NR) { print "-"; exit }
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        q1 = v[int((NR + 3) / 4)]; q3 = v[int((3 * NR + 3) / 4)]
        printf "%.4g [%.4g, %.4g] (%.4g-%.4g)", m, q1, q3, v[1], v[NR] }'
}

# geometric mean of the numbers in a file
geomean() {
    awk '{ s += log($1); n++ } END { if (n) printf "%.4g\n", exp(s / n); else print "-" }' "$1"
}
# 95% interval of the median of the numbers in a file, by 2000 resamples with replacement
boot_median() {
    awk 'BEGIN { srand(1) } { v[NR] = $1 } END {
        if (NR < 2) { print "-"; exit }
        for (b = 1; b <= 2000; b++) {
            for (i = 1; i <= NR; i++) w[i] = v[int(rand() * NR) + 1]
            for (i = 2; i <= NR; i++) { x = w[i]; for (j = i - 1; j >= 1 && w[j] > x; j--) w[j + 1] = w[j]; w[j + 1] = x }
            m[b] = NR % 2 ? w[(NR + 1) / 2] : (w[NR / 2] + w[NR / 2 + 1]) / 2
        }
        for (i = 2; i <= 2000; i++) { x = m[i]; for (j = i - 1; j >= 1 && m[j] > x; j--) m[j + 1] = m[j]; m[j + 1] = x }
        printf "[%.4g, %.4g]\n", m[50], m[1950] }' "$1"
}

plain_run() { # RANKS FLAGS...
    r=$1; shift
    if [ "$r" = 1 ]; then $ADT train "$@" --log "$dir/plain.jsonl" >"$dir/plain.out" 2>&1
    else $MPIEXEC -n "$r" $ADT train "$@" --log "$dir/plain.jsonl" >"$dir/plain.out" 2>&1; fi
    wall_per_step "$dir/plain.jsonl"
}
elastic_run() { # RANKS FLAGS...
    r=$1; shift
    rm -rf "$dir/job" "$dir/ckpt" "$dir/elastic.jsonl"
    $ADT launch --nproc-per-node "$r" --job "$dir/job" -- $ADT train "$@" --elastic-dir "$dir/ckpt" \
        --log "$dir/elastic.jsonl" >"$dir/elastic.out" 2>&1
    wall_per_step "$dir/elastic.jsonl"
    log_mean "$dir/elastic.jsonl" elastic_ms >"$dir/el_ms"
}

run_case() { # NAME RANKS REPS FLAGS...
    name=$1 r=$2 reps=$3; shift 3
    : >"$dir/p" ; : >"$dir/e" ; : >"$dir/ratio" ; : >"$dir/elms" ; : >"$dir/frac"
    for i in $(seq "$reps"); do
        if [ $((i % 2)) = 1 ]; then p=$(plain_run "$r" "$@"); e=$(elastic_run "$r" "$@")
        else e=$(elastic_run "$r" "$@"); p=$(plain_run "$r" "$@"); fi
        el=$(cat "$dir/el_ms")
        if [ -z "$p" ] || [ -z "$e" ] || [ -z "$el" ]; then
            echo "$name, $r rank(s), pair $i: a run failed; its output:" >&2
            tail -n 5 "$dir/plain.out" "$dir/elastic.out" >&2
            exit 1
        fi
        echo "$p" >>"$dir/p"; echo "$e" >>"$dir/e"
        awk -v a="$e" -v b="$p" 'BEGIN { printf "%.5f\n", a / b }' >>"$dir/ratio"
        echo "$el" >>"$dir/elms"
        awk -v a="$el" -v b="$e" 'BEGIN { printf "%.5f\n", 100 * a / b }' >>"$dir/frac"
        [ -n "$VERBOSE" ] && echo "  pair $i: plain $p ms/step, elastic $e ms/step (elastic work $el ms/step)"
    done
    echo "$name, $r rank(s), $reps pairs: plain $(stats "$dir/p") ms/step; elastic $(stats "$dir/e") ms/step"
    echo "    ratio elastic/plain $(stats "$dir/ratio"); in-run elastic work $(stats "$dir/elms") ms/step" \
         "= $(stats "$dir/frac") % of the step"
    echo "    ratio elastic/plain: geometric mean $(geomean "$dir/ratio"), median's 95% bootstrap interval $(boot_median "$dir/ratio")"
}

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ "$2" = "--" ] || [ "$3" = "--" ]; then
    RANKS=$1; REPS=$2; shift 2; [ "$1" = "--" ] && shift
    run_case "$*" "$RANKS" "$REPS" "$@"
else
    REPS=${1:-6}
    echo '{"type": "mlp", "sizes": [32, 64, 10], "activation": "relu"}' >"$dir/mlp.json"
    GPT="--model configs/gpt-s.json --data synthetic:text --batch 4 --optimizer sgd --lr 0.05 --steps 20"
    MLP="--model $dir/mlp.json --data synthetic:mlp --batch 12 --optimizer sgd --lr 0.05 --steps 300"
    for r in 1 2; do
        run_case "GPT-S batch 4" "$r" "$REPS" $GPT
        run_case "MLP 32-64-10 batch 12" "$r" "$REPS" $MLP
    done
fi
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
