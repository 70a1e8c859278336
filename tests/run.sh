#!/bin/sh
# Runs every test program given, prints one line per program, and closes with the totals in the
# form CI reads: "N passed, N failed". Exits non-zero if any case failed or any program crashed.
# An argument NAME=VALUE (e.g. ADT_GEMM=onednn) is exported for the programs after it, and their
# lines and logs carry the latest such setting: one run can test the same programs under several
# settings (of one variable; a value should be a plain word).
passed=0; failed=0; crashed=0
logdir=${BUILD:-build}/test-logs
mkdir -p "$logdir"
tag=
for t in "$@"; do
    case "$t" in
    *=*) export "$t"; tag=".$t"; continue ;;
    esac
    name=$(echo "$t" | tr / _)$tag
    start=$(date +%s)
    "$t" >"$logdir/$name.out" 2>"$logdir/$name.err"
    rc=$?
    secs=$(( $(date +%s) - start ))
    line=$(grep '^RESULT ' "$logdir/$name.out" | tail -n 1)
    p=$(echo "$line" | sed -n 's/.*passed=\([0-9]*\).*/\1/p')
    f=$(echo "$line" | sed -n 's/.*failed=\([0-9]*\).*/\1/p')
    if [ -z "$p" ]; then
        echo "CRASH $name (exit $rc, no RESULT line) after ${secs}s; stderr tail:"
        tail -n 20 "$logdir/$name.err" | sed 's/^/    /'
        crashed=$((crashed + 1)); failed=$((failed + 1)); continue
    fi
    passed=$((passed + p)); failed=$((failed + f))
    if [ "$f" != 0 ] || [ "$rc" != 0 ]; then
        echo "FAIL  $name: $p passed, $f failed (exit $rc) ${secs}s"
        grep -E 'FAIL|FAILED' "$logdir/$name.err" | head -n 40 | sed 's/^/    /'
        [ "$f" = 0 ] && failed=$((failed + 1))
    else
        echo "ok    $name: $p passed ${secs}s"
    fi
done
echo "$passed passed, $failed failed"
[ "$failed" = 0 ] && [ "$crashed" = 0 ]
