#!/bin/sh
# fuzz.sh - runs every libFuzzer target in fuzz/ for longer than CI does.
#
#   sh scripts/fuzz.sh [SECONDS_PER_TARGET]     (default 300)
#
# Builds the targets (clang, ASan+UBSan+libFuzzer), then runs each on its corpus (fuzz/corpus/NAME,
# new inputs kept in build/fuzz/work/NAME) with its dictionary when there is one. Stops at the
# first crash or sanitizer report and leaves the reproducer (crash-*) in the current directory.
set -eu
cd "$(dirname "$0")/.."
exec make fuzz-smoke FUZZ_SECONDS="${1:-300}"
