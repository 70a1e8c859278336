/*
 * adtrain/gemm.h - the one entry point for single-precision matrix products, and the backends
 * behind it (OpenBLAS's cblas_sgemm, oneDNN's dnnl_sgemm and its matmul primitive).
 *
 * Every kernel that multiplies matrices calls adt_gemm (row-major, BLAS semantics). At the first
 * call (or adt_gemm_init) the layer decides: the backend ADT_GEMM names
 * (openblas|onednn|onednn-matmul) runs every product; under auto (the default) each backend is
 * checked against a naive product on a few shapes (transposes, beta != 0, odd sizes, padded
 * leading dimensions), a short speed probe on training shapes names the default one, and each
 * product shape is run by the backend that was fastest on its first call (see gemm.c). The check
 * and probe are cached per machine in $XDG_CACHE_HOME/adtrain/gemm-<key>.json (or ~/.cache/...),
 * the key naming the CPU model, both libraries' versions and OPENBLAS_CORETYPE; an unreadable or
 * corrupt file is ignored and rewritten.
 */
#ifndef ADTRAIN_GEMM_H
#define ADTRAIN_GEMM_H

#include <stddef.h>
#include <stdint.h>

typedef enum adt_gemm_backend {
    ADT_GEMM_OPENBLAS = 0, /* cblas_sgemm (Debian's pthread build; OPENBLAS_CORETYPE applies) */
    ADT_GEMM_ONEDNN = 1,   /* dnnl_sgemm (Debian's libdnnl, OpenMP-threaded) */
    ADT_GEMM_ONEDNN_MATMUL = 2, /* oneDNN's matmul primitive (brgemm kernels), one kept per shape */
    ADT_GEMM_N_BACKENDS
} adt_gemm_backend;

/* The probe's shapes: C[M,N] = op(A) op(B) with A [M,K] (or [K,M] if ta) and B [K,N] (or [N,K]
 * if tb), dense leading dimensions. */
typedef struct adt_gemm_shape {
    int64_t M, N, K;
    int ta, tb;
} adt_gemm_shape;

#define ADT_GEMM_PROBE_SHAPES 4

/* The layer's decision and the evidence behind it (what a banner or a benchmark prints).
 * rate[b][s] is backend b's median GFLOP/s on probe shape s at one thread; 0 where it was not
 * measured (a forced choice measures nothing, a backend that failed its check is not timed). */
typedef struct adt_gemm_info {
    adt_gemm_backend backend;              /* forced: the one adt_gemm runs; auto: the probe's default */
    int forced;                            /* 1: ADT_GEMM named it */
    int per_shape;                         /* 1: ADT_GEMM=tune: each shape's first product times
                                            * every backend and the shape keeps the fastest, so
                                            * two processes may round differently (as
                                            * cudnn.benchmark); 0: `backend` runs every shape */
    int from_cache;                        /* 1: the check and probe came from the cache file */
    int check_ok[ADT_GEMM_N_BACKENDS];     /* 1: passed the correctness check */
    double rate[ADT_GEMM_N_BACKENDS][ADT_GEMM_PROBE_SHAPES];
    double probe_s;                        /* seconds the check and probe took (0 if cached) */
    char key[512];                         /* CPU model, library versions, OPENBLAS_CORETYPE */
    char cache_path[1024];                 /* "" when no cache directory could be named */
} adt_gemm_info;

/* C = alpha op(A) op(B) + beta C, row-major: op(A) is [M,K], op(B) [K,N], C [M,N]; lda, ldb, ldc
 * are the row strides of A, B, C as stored. With beta = 0, C is only written (it may hold
 * anything, NaN included). M, N or K of 0 is allowed (K = 0: C = beta C). Runs the chosen
 * backend; safe to call from several threads at once. */
void adt_gemm(int transA, int transB, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
              int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc);
/* The same product through backend b, whatever was chosen (tests, benchmarks). 0, or -1 if the
 * backend refused the arguments. */
int adt_gemm_with(adt_gemm_backend b, int transA, int transB, int64_t M, int64_t N, int64_t K,
                  float alpha, const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                  float *C, int64_t ldc);

/* Whether the running backend's C = op(A) op(B) + 1 * C for this shape is bitwise C + (the same
 * product with beta = 0), for every C: what lets the executor fold a gradient product into an
 * SGD momentum buffer (src/exec/README.md). The rule per backend is in gemm.c. */
int adt_gemm_acc_exact(int64_t M, int64_t N, int64_t K);
/* The same rule for backend b alone. */
int adt_gemm_acc_exact_with(adt_gemm_backend b, int64_t M, int64_t N, int64_t K);

/* The backend adt_gemm runs for this shape at the layer's thread count: the chosen one, or under
 * ADT_GEMM=tune the one its first product chose (-1 for a shape not yet run); tests, benchmarks. */
int adt_gemm_route(int transA, int transB, int64_t M, int64_t N, int64_t K);
/* Chooses the backend once (idempotent, thread-safe). ADT_ERR_ARG naming ADT_GEMM and the
 * accepted values when the variable holds anything else, or when the backend it names fails the
 * correctness check; the layer then runs OpenBLAS. adt_gemm calls it on first use and logs such
 * an error, so programs that can report errors (the CLI, adt_exec_create) call it first. */
int adt_gemm_init(void);
/* Reads ADT_GEMM only (cheap: no check, no probe): *forced = the backend it names, or -1 for
 * auto, tune or unset; *per_shape = 1 for tune. ADT_ERR_ARG naming ADT_GEMM and the accepted
 * values otherwise. */
int adt_gemm_env(int *forced, int *per_shape);
/* The decision without touching the layer's state: reads ADT_GEMM and the cache (unless
 * use_cache is 0), checks and probes what it must, rewrites the cache file. Same errors. */
int adt_gemm_select(adt_gemm_info *out, int use_cache);
/* The file the cache lives in for this machine: 0, or ADT_ERR_IO if no directory can be named
 * ($XDG_CACHE_HOME and $HOME both unset or relative). */
int adt_gemm_cache_path(char *buf, size_t n, const char *key);
/* Reads a cache file written for `key` into *out (check_ok, rate, backend of the automatic
 * choice): 0, or a negative status when it is missing, unreadable, corrupt or for another key. */
int adt_gemm_cache_read(const char *path, const char *key, adt_gemm_info *out);
int adt_gemm_cache_write(const char *path, const adt_gemm_info *info);

/* The correctness check of one backend: 1 if every case matched the naive product. */
int adt_gemm_self_check(adt_gemm_backend b);
/* The probe's shapes (GPT-S and MLP training products), ADT_GEMM_PROBE_SHAPES of them. */
const adt_gemm_shape *adt_gemm_probe_shapes(void);

const adt_gemm_info *adt_gemm_get_info(void);      /* the layer's decision (inits) */
const char *adt_gemm_backend_name(void);           /* "openblas", "onednn" or "onednn-matmul" (inits) */
const char *adt_gemm_backend_str(adt_gemm_backend b);
/* "OpenBLAS 0.3.21 (Haswell)", "oneDNN 2.6.3 (OpenMP)": what a banner prints for b. */
const char *adt_gemm_backend_version(adt_gemm_backend b);

/* Threads for every backend: OpenBLAS's pool and the OpenMP team oneDNN runs on (applied to each
 * calling thread before its next oneDNN product). n <= 0 keeps the libraries' own settings. */
void adt_gemm_set_threads(int n);

#endif
