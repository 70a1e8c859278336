# bench_env.sh - what the benchmark runners share; sourced by run_core.sh and run_dp.sh (from the
# repository root, with BIN set to build/bench/bench_core).
#
# bench_setup PREFIX
#   builds $BIN alone (it needs libadtrain.a and nothing else of `make bench`, so a half-edited
#   CLI elsewhere in the tree cannot stop a measurement); sets and exports OPENBLAS_CORETYPE
#   (CORE_FROM says who chose it); creates bench/results (untracked) and sets OUT, the results
#   file bench/results/PREFIX-<UTC date-time>.jsonl, and TMP, a scratch file removed at exit.
bench_setup() {
    ${MAKE:-make} --no-print-directory "$BIN" >&2

    # OpenBLAS picks its kernels from the CPU model when it loads, and a release older than the
    # CPU falls back to its SSE3 ones. adtrain corrects that itself (adt_blas_fix_coretype);
    # PyTorch does not. So that both run the same GEMM kernels, the family adtrain ends up with
    # is set for both, unless the caller chose one (OPENBLAS_CORETYPE=Prescott reproduces the
    # uncorrected library).
    if [ -n "${OPENBLAS_CORETYPE-}" ]; then
        CORE_FROM=caller
    else
        OPENBLAS_CORETYPE=$("$BIN" --blas-core)
        CORE_FROM=bench_core
    fi
    export OPENBLAS_CORETYPE

    mkdir -p bench/results
    [ -f bench/results/.gitignore ] || printf '*\n!.gitignore\n' > bench/results/.gitignore
    OUT=bench/results/$1-$(date -u +%Y%m%d-%H%M%S).jsonl
    TMP=$(mktemp)
    trap 'rm -f "$TMP"' EXIT
    trap 'exit 130' INT TERM
}
