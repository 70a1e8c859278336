# bench_env.sh - what the benchmark runners share; sourced by run_core.sh and run_dp.sh (from the
# repository root, with BIN set to build/bench/bench_core).
#
# bench_setup PREFIX
#   builds $BIN alone (it needs libadtrain.a and nothing else of `make bench`, so a half-edited
#   CLI elsewhere in the tree cannot stop a measurement); sets and exports OPENBLAS_CORETYPE
#   (CORE_FROM says who chose it, INHERITED_CORETYPE what the environment had); creates
#   bench/results (untracked) and sets OUT, the results file
#   bench/results/PREFIX-<UTC date-time>.jsonl, and TMP, a scratch file removed at exit; keeps
#   glibc's malloc from returning freed pages to the kernel (PEER_MALLOC, below).
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

    # glibc's malloc hands large freed blocks back to the kernel (mmap above a threshold, trim
    # of the heap's top), so a PyTorch step that frees and reallocates its activations faults
    # their pages in again: its GPT-S step moves between 175 and 500 ms from step to step. Raising
    # both thresholds keeps the pages, as jemalloc or tcmalloc would (PyTorch's CPU tuning
    # advice); the peer's step then stays at 175-220 ms. Both frameworks get it (adtrain
    # allocates its memory plan once, so it changes nothing there); PEER_MALLOC=default keeps
    # glibc's defaults for both.
    if [ "${PEER_MALLOC-}" != default ]; then
        MALLOC_MMAP_THRESHOLD_=${MALLOC_MMAP_THRESHOLD_-1099511627776}
        MALLOC_TRIM_THRESHOLD_=${MALLOC_TRIM_THRESHOLD_-1099511627776}
        export MALLOC_MMAP_THRESHOLD_ MALLOC_TRIM_THRESHOLD_
    fi

    mkdir -p bench/results
    [ -f bench/results/.gitignore ] || printf '*\n!.gitignore\n' > bench/results/.gitignore
    OUT=bench/results/$1-$(date -u +%Y%m%d-%H%M%S).jsonl
    TMP=$(mktemp)
    trap 'rm -f "$TMP"' EXIT
    trap 'exit 130' INT TERM
}
