# bench_env.sh - what the benchmark runners share; sourced by run_core.sh and run_dp.sh (from the
# repository root, with BIN set to build/bench/bench_core).
#
# bench_setup PREFIX
#   builds $BIN alone (it needs libadtrain.a and nothing else of `make bench`, so a half-edited
#   CLI elsewhere in the tree cannot stop a measurement); sets and exports OPENBLAS_CORETYPE
#   (CORE_FROM says who chose it, INHERITED_CORETYPE what the environment had); creates
#   bench/results (untracked) and sets OUT, the results file
#   bench/results/PREFIX-<UTC date-time>.jsonl, and TMP, a scratch file removed at exit.
bench_setup() {
    ${MAKE:-make} --no-print-directory "$BIN" >&2

    # OpenBLAS picks its kernels from the CPU model when it loads, and a release older than the
    # CPU falls back to slower ones. adtrain corrects that itself (adt_blas_fix_coretype, which
    # honours a value the user set); PyTorch does not. Both frameworks run the family adtrain
    # chooses for this CPU on its own (on AVX-512 CPUs SkylakeX, 1.5-1.9x the GEMM rate of the
    # Haswell family here), so that the peer runs at its fastest and both run the same kernels:
    # an OPENBLAS_CORETYPE inherited from the environment is set aside (recorded as
    # INHERITED_CORETYPE), and BLAS_CORE=<family> chooses another for both.
    INHERITED_CORETYPE=${OPENBLAS_CORETYPE-}
    if [ -n "${BLAS_CORE-}" ]; then
        OPENBLAS_CORETYPE=$BLAS_CORE
        CORE_FROM=BLAS_CORE
    else
        OPENBLAS_CORETYPE=$(env -u OPENBLAS_CORETYPE "$BIN" --blas-core)
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
