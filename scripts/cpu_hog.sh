#!/bin/sh
# cpu_hog.sh CPU [SECONDS] - real contention for straggler tests and benchmarks: a busy loop
# pinned to CPU (taskset), for SECONDS (default: until killed). Prints the hog's PID on stdout, so
# the caller can end it (kill PID) - it is a process group of its own.
# A rank pinned to the same CPU then gets about half of it (the kernel shares a CPU evenly between
# two busy processes); two hogs give it about a third.
set -e
[ $# -ge 1 ] || { echo "usage: cpu_hog.sh CPU [SECONDS]" >&2; exit 2; }
cpu=$1
secs=${2:-0}
case $cpu in *[!0-9]*|'') echo "cpu_hog.sh: CPU: expected a CPU number, got '$cpu'" >&2; exit 2;; esac
case $secs in *[!0-9.]*|'') echo "cpu_hog.sh: SECONDS: expected a number, got '$secs'" >&2; exit 2;; esac
command -v taskset >/dev/null || { echo "cpu_hog.sh: taskset (util-linux) not found" >&2; exit 2; }
if [ "$secs" = 0 ]; then
    setsid taskset -c "$cpu" sh -c 'while :; do :; done' >/dev/null 2>&1 &
else
    setsid taskset -c "$cpu" timeout "$secs" sh -c 'while :; do :; done' >/dev/null 2>&1 &
fi
echo $!
