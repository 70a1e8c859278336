/*
 * blas.c - makes sure OpenBLAS runs the matrix kernels this CPU can run.
 *
 * OpenBLAS built with DYNAMIC_ARCH picks its kernels once, when the library loads, from the CPU
 * model number. A release older than the CPU (Debian 12's 0.3.21 on Sapphire/Emerald Rapids)
 * does not know the model and falls back to "Prescott", its SSE3 kernels: about a quarter of the
 * AVX-512 rate. The only supported override is the OPENBLAS_CORETYPE environment variable, read
 * at load time, so a program that finds the fallback re-executes itself with the variable set.
 */
#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/exec.h"

const char *adt_blas_core_name(void) { return openblas_get_corename(); }

/* The best kernel family this CPU supports that OpenBLAS 0.3.21 ships, or NULL. */
static const char *best_core(void) {
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

void adt_blas_fix_coretype(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") || getenv("ADT_NO_BLAS_REEXEC")) return;
    const char *cur = openblas_get_corename();
    const char *want = best_core();
    if (!want || !cur) return;
    if (strcasecmp(cur, "prescott") && strcasecmp(cur, "core2") && strcasecmp(cur, "nehalem") &&
        strcasecmp(cur, "katmai") && strcasecmp(cur, "unknown"))
        return; /* OpenBLAS knew this CPU */
    setenv("OPENBLAS_CORETYPE", want, 1);
    setenv("ADT_NO_BLAS_REEXEC", "1", 1); /* never loop */
    adt_log(ADT_LOG_DEBUG, "OpenBLAS chose %s kernels on a CPU that runs %s: restarting with OPENBLAS_CORETYPE=%s",
            cur, want, want);
    execv("/proc/self/exe", argv);
    /* exec failed: carry on with the slow kernels */
    adt_log(ADT_LOG_WARN, "OpenBLAS runs %s kernels on a %s-capable CPU; set OPENBLAS_CORETYPE=%s for speed", cur, want,
            want);
}
