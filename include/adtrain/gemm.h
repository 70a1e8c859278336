/*
 * adtrain/gemm.h - the one entry point for single-precision matrix products, and the backends
 * behind it (OpenBLAS's cblas_sgemm, oneDNN's dnnl_sgemm and its matmul primitive).
 *
 * Every kernel that multiplies matrices calls adt_gemm (row-major, BLAS semantics). At the first
 * call (or adt_gemm_init) the layer decides: the backend ADT_GEMM names
 * (openblas|onednn|onednn-matmul) runs every product; under auto (the default) each backend is
 * checked against a naive product on a few shapes (transposes, beta != 0, odd sizes, padded
 * leading dimensions) and a short speed probe on training shapes, each timed plain (beta = 0)
 * and accumulating (beta = 1) and weighted as the steps run them, names a default; then each
 * product shape runs the backend that was fastest on its first product on the machine (see
 * gemm.c), the default where a shape is too small or too large to time. The check and probe are
 * cached per machine in $XDG_CACHE_HOME/adtrain/gemm-<key>.json (or ~/.cache/...), the key naming
 * the CPU model, both libraries' versions and OPENBLAS_CORETYPE; an unreadable or corrupt file is
 * ignored and rewritten. The shapes' choices are kept beside it, in gemm-<key>.routes, one line
 * each, read and appended under a file lock, so that every process of the machine runs a shape
 * on the same backend.
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

/* A probe shape: C[M,N] = op(A) op(B) with A [M,K] (or [K,M] if ta) and B [K,N] (or [N,K] if
 * tb), dense leading dimensions, and what it stands for in its training step: the share of the
 * step's multiply-adds run in this shape with beta = 0 (plain) and with beta = 1 (accumulating:
 * a linear layer's product onto its bias rows, a gradient folded into its momentum). The
 * shares of one step's shapes sum to 1. */
typedef struct adt_gemm_shape {
    int64_t M, N, K;
    int ta, tb;
    const char *step;               /* "gpt-s", "mlp" */
    double share_plain, share_acc;
} adt_gemm_shape;

#define ADT_GEMM_PROBE_SHAPES 11
/* The cache file's format; a file of another (or none: the layers before it timed no
 * accumulating product) is measured again and rewritten. */
#define ADT_GEMM_CACHE_VERSION 2
/* The routes file's format (its first line: "adtrain-gemm-routes <version> <key>"); a file of
 * another version or key is begun anew. */
#define ADT_GEMM_ROUTES_VERSION 1

/* One line of the routes file, "M N K ta tb threads backend": products C[M,N] = op(A) op(B) of
 * inner size K, transposes ta, tb, at the layer's thread count `threads` (0: the libraries' own)
 * run `backend`. */
typedef struct adt_gemm_route_entry {
    int64_t M, N, K;
    int ta, tb, threads;
    adt_gemm_backend backend;
} adt_gemm_route_entry;

/* The layer's decision and the evidence behind it (what a banner or a benchmark prints).
 * rate[b][s] is backend b's median GFLOP/s on probe shape s at one thread with beta = 0,
 * rate_acc[b][s] the same with beta = 1; 0 where it was not measured (a forced choice measures
 * nothing, a backend that failed its check is not timed). score[b]: adt_gemm_choose's estimate. */
typedef struct adt_gemm_info {
    adt_gemm_backend backend;              /* forced: the one adt_gemm runs; auto: the probe's default */
    int forced;                            /* 1: ADT_GEMM named it */
    int per_shape;                         /* 1 (auto): each shape runs the backend its first
                                            * product on the machine timed fastest (the routes
                                            * file); 0 (forced): `backend` runs every shape */
    int from_cache;                        /* 1: the check and probe came from the cache file */
    int check_ok[ADT_GEMM_N_BACKENDS];     /* 1: passed the correctness check */
    double rate[ADT_GEMM_N_BACKENDS][ADT_GEMM_PROBE_SHAPES];
    double rate_acc[ADT_GEMM_N_BACKENDS][ADT_GEMM_PROBE_SHAPES];
    double score[ADT_GEMM_N_BACKENDS];     /* seconds per GFLOP of each step, summed; INFINITY:
                                            * not a candidate; 0 when nothing was measured */
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

/* The backend adt_gemm runs for this shape at the layer's thread count: the forced one, the
 * default for a shape too small or large to time, or the one the shape's routes entry names (-1
 * for a shape this process has not run yet); tests, benchmarks. */
int adt_gemm_route(int transA, int transB, int64_t M, int64_t N, int64_t K);
/* One line of a routes file (no newline) into *out: 0, or ADT_ERR_FORMAT with a message that
 * begins with `where` and says what was expected. */
int adt_gemm_route_parse(const char *line, const char *where, adt_gemm_route_entry *out);
/* The routes file beside the cache file cache_path (gemm-<hash>.json -> gemm-<hash>.routes). */
int adt_gemm_routes_path(char *buf, size_t n, const char *cache_path);
/* Chooses the backend once (idempotent, thread-safe). ADT_ERR_ARG naming ADT_GEMM and the
 * accepted values when the variable holds anything else, or when the backend it names fails the
 * correctness check; the layer then runs OpenBLAS. adt_gemm calls it on first use and logs such
 * an error, so programs that can report errors (the CLI, adt_exec_create) call it first. */
int adt_gemm_init(void);
/* Reads ADT_GEMM only (cheap: no check, no probe): *forced = the backend it names, or -1 for
 * auto or unset; *per_shape = 1 unless forced. ADT_ERR_ARG naming ADT_GEMM and the accepted
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
/* The automatic choice from measured rates (a pure function: the probe and the cache reader
 * call it): among the backends that passed their check (info->check_ok), the one of least
 * score = sum over the shapes of share_plain / rate + share_acc / rate_acc (info's rates of the
 * same index, GFLOP/s), the seconds each step's products would take per GFLOP, summed over the
 * steps. A rate of 0 where its share is not is an infinite score. OpenBLAS when no backend
 * passed. score (may be NULL) receives each backend's score (INFINITY for one that failed). */
adt_gemm_backend adt_gemm_choose(const adt_gemm_info *info, const adt_gemm_shape shapes[ADT_GEMM_PROBE_SHAPES],
                                 double score[ADT_GEMM_N_BACKENDS]);
/* Why the layer runs its backend, for banners: "ADT_GEMM", or "chosen by the (cached) probe for
 * the shapes not timed on their own; the rest per shape" (inits). */
const char *adt_gemm_reason(void);

const adt_gemm_info *adt_gemm_get_info(void);      /* the layer's decision (inits) */
const char *adt_gemm_backend_name(void);           /* "openblas", "onednn" or "onednn-matmul" (inits) */
const char *adt_gemm_backend_str(adt_gemm_backend b);
/* "OpenBLAS 0.3.21 (Haswell)", "oneDNN 2.6.3 (OpenMP)": what a banner prints for b. */
const char *adt_gemm_backend_version(adt_gemm_backend b);

/* Threads for every backend: OpenBLAS's pool and the OpenMP team oneDNN runs on (applied to each
 * calling thread before its next oneDNN product). n <= 0 keeps the libraries' own settings. */
void adt_gemm_set_threads(int n);

#endif
