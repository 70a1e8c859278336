/*
 * gemm.c - the GEMM layer: one row-major sgemm entry point over three backends (OpenBLAS,
 * oneDNN's sgemm and oneDNN's matmul primitive), the choice among them, and its cache file.
 *
 * Why several: Debian 12's OpenBLAS 0.3.21 knows no Zen 4 / Sapphire Rapids kernels, so on such a
 * CPU it runs its AVX2 (Haswell) ones at about half the FMA peak, while oneDNN's JIT sgemm uses
 * AVX-512. Neither wins on every CPU, nor on every shape of one CPU, so the layer measures: a
 * correctness check against a naive double product (a backend that is wrong is never chosen,
 * however fast), a speed probe on training shapes at one thread, each timed plain and
 * accumulating and weighted as the steps run them (both cached per machine), which names the
 * backend of the shapes not timed on their own; and each product shape's own timing on its
 * first product on the machine, which picks the backend that shape runs and is kept in a routes
 * file beside the cache, so that every process of the machine runs a shape alike (a near tie
 * timed afresh in each process would fall either way, and a resumed run would not repeat the
 * uninterrupted one bit for bit).
 * ADT_GEMM=openblas|onednn|onednn-matmul skips the choice.
 *
 * Threads: OpenBLAS (pthread build) has one global pool, sized by openblas_set_num_threads.
 * Debian's libdnnl is built on OpenMP (libgomp, DNNL_CPU_RUNTIME_OMP) and sizes each product's
 * team by omp_get_max_threads() of the CALLING thread, an OpenMP per-thread setting: so the
 * count is kept here and applied to each thread before its next oneDNN call.
 */
#include <cJSON.h>
#include <cblas.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/gemm.h"

static const char *const backend_names[ADT_GEMM_N_BACKENDS] = {"openblas", "onednn", "onednn-matmul"};

static atomic_int g_threads;             /* 0: the libraries' own settings */
static _Thread_local int omp_applied;    /* the count this thread's OpenMP ICV holds (0: none) */
static adt_gemm_info g_info;
static int g_init_status;
static char g_init_msg[512]; /* init's error, for adt_gemm_init on any thread */
static _Thread_local int init_quiet; /* adt_gemm_init reports the error itself */
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

const char *adt_gemm_backend_str(adt_gemm_backend b) {
    return (unsigned)b < ADT_GEMM_N_BACKENDS ? backend_names[b] : "?";
}

const char *adt_gemm_backend_version(adt_gemm_backend b) {
    static char s[ADT_GEMM_N_BACKENDS][128];
    if (b == ADT_GEMM_OPENBLAS) {
        /* openblas_get_config: "OpenBLAS 0.3.21 DYNAMIC_ARCH NO_AFFINITY Haswell MAX_THREADS=64" */
        char ver[32] = "?";
        sscanf(openblas_get_config(), "OpenBLAS %31s", ver);
        snprintf(s[b], sizeof s[b], "OpenBLAS %s (%s)", ver, openblas_get_corename());
        return s[b];
    }
    if (b == ADT_GEMM_ONEDNN || b == ADT_GEMM_ONEDNN_MATMUL) {
        const dnnl_version_t *v = dnnl_version();
        snprintf(s[b], sizeof s[b], "oneDNN %d.%d.%d (%s%s)", v->major, v->minor, v->patch,
                 v->cpu_runtime == DNNL_RUNTIME_OMP ? "OpenMP" : v->cpu_runtime == DNNL_RUNTIME_TBB ? "TBB" : "sequential",
                 b == ADT_GEMM_ONEDNN_MATMUL ? ", matmul primitive" : "");
        return s[b];
    }
    return "?";
}

void adt_gemm_set_threads(int n) {
    if (n <= 0) return;
    atomic_store(&g_threads, n);
    openblas_set_num_threads(n);
}

/* ---- the backends ------------------------------------------------------------------------ */

static void run_openblas(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                         int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, (blasint)M,
                (blasint)N, (blasint)K, alpha, A, (blasint)lda, B, (blasint)ldb, beta, C, (blasint)ldc);
}

/* The calling thread's OpenMP team to the layer's count before a oneDNN call (see the header). */
static int omp_apply(void) {
    int want = atomic_load_explicit(&g_threads, memory_order_relaxed);
    if (want > 0 && omp_applied != want) {
        omp_set_num_threads(want);
        omp_applied = want;
    }
    return want > 0 ? want : omp_get_max_threads();
}

/* dnnl_sgemm is row-major (unlike Fortran BLAS), so the arguments pass through unchanged. */
static int run_onednn(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    omp_apply();
    return dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == dnnl_success
               ? 0
               : -1;
}

/* oneDNN's matmul primitive: the same product through its brgemm kernels, which on AVX-512 run
 * a product whose B is stored transposed (a linear layer's forward, x W^T) 10-20% faster than
 * dnnl_sgemm does. A primitive is made for one shape (sizes, transposes as strides, leading
 * dimensions, alpha as its output scale, beta as a sum post-op, the thread count) and kept:
 * MM_PRIMS of them, published through an atomic count so that a lookup takes no lock; a shape
 * past the table, or one oneDNN cannot make, runs dnnl_sgemm instead (a shape's beta = 0 and
 * beta = 1 forms both, see mm_find). Each calling thread has a
 * stream of its own (oneDNN streams are not shared between threads), kept on a list so that
 * none is lost when its thread ends. */
#define MM_PRIMS 256

typedef struct mm_prim {
    int64_t M, N, K, lda, ldb, ldc;
    int ta, tb, threads;
    float alpha, beta;
    dnnl_primitive_t prim; /* NULL: oneDNN could not make it (dnnl_sgemm runs the shape) */
    dnnl_memory_desc_t a, b, c, scratch;
    size_t scratch_bytes;  /* its user-managed scratchpad (see mm_scratch_get) */
} mm_prim;

/* A thread's stream and scratchpad. Debian's oneDNN shares the library-managed scratchpad among
 * primitives (built without DNNL_ENABLE_CONCURRENT_EXEC), so two threads running primitives at
 * once (ranks as threads, an executor's threads) would write each other's buffers: each primitive
 * takes a user-managed scratchpad, and each thread brings its own. */
typedef struct mm_stream {
    dnnl_stream_t s;
    void *scratch;
    size_t scratch_cap;
    struct mm_stream *next;
} mm_stream;

static mm_prim mm_prims[MM_PRIMS];
static atomic_int mm_count;
static pthread_mutex_t mm_lock = PTHREAD_MUTEX_INITIALIZER;
static dnnl_engine_t mm_engine;
static mm_stream *mm_streams;
static _Thread_local mm_stream *mm_stream_here;

static int mm_same(const mm_prim *p, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, int64_t lda,
                   int64_t ldb, float beta, int64_t ldc, int threads) {
    return p->M == M && p->N == N && p->K == K && p->ta == ta && p->tb == tb && p->lda == lda && p->ldb == ldb &&
           p->ldc == ldc && p->threads == threads && !memcmp(&p->alpha, &alpha, sizeof alpha) &&
           !memcmp(&p->beta, &beta, sizeof beta);
}

/* Makes the primitive of one entry (under mm_lock); leaves prim NULL where oneDNN refuses. */
static void mm_make(mm_prim *p) {
    if (!mm_engine && dnnl_engine_create(&mm_engine, dnnl_cpu, 0) != dnnl_success) return;
    dnnl_dims_t da = {p->M, p->K}, db = {p->K, p->N}, dc = {p->M, p->N};
    dnnl_dims_t sa = {p->ta ? 1 : p->lda, p->ta ? p->lda : 1}, sb = {p->tb ? 1 : p->ldb, p->tb ? p->ldb : 1},
                sc = {p->ldc, 1};
    dnnl_matmul_desc_t d;
    dnnl_primitive_attr_t attr = NULL;
    dnnl_post_ops_t po = NULL;
    dnnl_primitive_desc_t pd = NULL;
    int ok = dnnl_memory_desc_init_by_strides(&p->a, 2, da, dnnl_f32, sa) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&p->b, 2, db, dnnl_f32, sb) == dnnl_success &&
             dnnl_memory_desc_init_by_strides(&p->c, 2, dc, dnnl_f32, sc) == dnnl_success &&
             dnnl_matmul_desc_init(&d, &p->a, &p->b, NULL, &p->c) == dnnl_success &&
             dnnl_primitive_attr_create(&attr) == dnnl_success;
    if (ok) ok = dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user) == dnnl_success;
    if (ok && p->alpha != 1.0f) ok = dnnl_primitive_attr_set_output_scales(attr, 1, 0, &p->alpha) == dnnl_success;
    if (ok && p->beta != 0.0f)
        ok = dnnl_post_ops_create(&po) == dnnl_success && dnnl_post_ops_append_sum(po, p->beta) == dnnl_success &&
             dnnl_primitive_attr_set_post_ops(attr, po) == dnnl_success;
    if (ok) ok = dnnl_primitive_desc_create(&pd, &d, attr, mm_engine, NULL) == dnnl_success;
    const dnnl_memory_desc_t *smd = ok ? dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0) : NULL;
    if (smd) p->scratch = *smd, p->scratch_bytes = dnnl_memory_desc_get_size(smd);
    if (ok && dnnl_primitive_create(&p->prim, pd) != dnnl_success) p->prim = NULL;
    if (pd) dnnl_primitive_desc_destroy(pd);
    if (po) dnnl_post_ops_destroy(po);
    if (attr) dnnl_primitive_attr_destroy(attr);
}

/* The entry for a product, made on first use; NULL when the table is full. */
static const mm_prim *mm_find(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, int64_t lda,
                              int64_t ldb, float beta, int64_t ldc, int threads) {
    int n = atomic_load_explicit(&mm_count, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (mm_same(&mm_prims[i], ta, tb, M, N, K, alpha, lda, ldb, beta, ldc, threads)) return &mm_prims[i];
    const mm_prim *found = NULL;
    pthread_mutex_lock(&mm_lock);
    n = atomic_load_explicit(&mm_count, memory_order_relaxed);
    for (int i = 0; i < n && !found; i++)
        if (mm_same(&mm_prims[i], ta, tb, M, N, K, alpha, lda, ldb, beta, ldc, threads)) found = &mm_prims[i];
    /* a plain (beta 0) and an accumulating (beta 1) product of one shape are made as a pair:
     * were the table to fill between them, one form would run dnnl_sgemm and the other the
     * primitive, and the accumulating form would no longer be C + (the plain one) bitwise,
     * which the momentum fold relies on (adt_gemm_acc_exact) */
    int pair = beta == 0.0f || beta == 1.0f;
    if (!found && n + 1 + pair <= MM_PRIMS) {
        for (int k = 0; k <= pair; k++) {
            mm_prim *p = &mm_prims[n + k];
            *p = (mm_prim){.M = M, .N = N, .K = K, .lda = lda, .ldb = ldb, .ldc = ldc, .ta = ta, .tb = tb,
                           .threads = threads, .alpha = alpha, .beta = k ? 1.0f - beta : beta};
            mm_make(p);
        }
        atomic_store_explicit(&mm_count, n + 1 + pair, memory_order_release);
        found = &mm_prims[n];
    }
    pthread_mutex_unlock(&mm_lock);
    return found;
}

/* This thread's stream and scratchpad, made on its first primitive (NULL if oneDNN cannot make
 * a stream). Kept on a list for the process's life: a thread's buffers outlive no one's use. */
static mm_stream *mm_stream_get(void) {
    if (mm_stream_here) return mm_stream_here;
    pthread_mutex_lock(&mm_lock);
    mm_stream *s = mm_engine ? calloc(1, sizeof *s) : NULL;
    if (s && dnnl_stream_create(&s->s, mm_engine, dnnl_stream_default_flags) == dnnl_success) {
        s->next = mm_streams, mm_streams = s;
        mm_stream_here = s;
    } else
        free(s);
    pthread_mutex_unlock(&mm_lock);
    return mm_stream_here;
}

/* The thread's scratchpad of at least n bytes (64-byte aligned); NULL if it cannot grow. */
static void *mm_scratch_get(mm_stream *s, size_t n) {
    if (n <= s->scratch_cap) return s->scratch;
    size_t cap = (n + 63) / 64 * 64;
    void *b = aligned_alloc(64, cap);
    if (!b) return NULL;
    free(s->scratch);
    s->scratch = b, s->scratch_cap = cap;
    return b;
}

static int run_onednn_matmul(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                             int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    /* the leading dimensions dnnl_sgemm refuses are refused here too (a caller's bug) */
    if (lda < (ta ? M : K) || ldb < (tb ? K : N) || ldc < N) return -1;
    int threads = omp_apply();
    const mm_prim *p = mm_find(ta, tb, M, N, K, alpha, lda, ldb, beta, ldc, threads);
    mm_stream *st = p && p->prim ? mm_stream_get() : NULL;
    void *scratch = st && p->scratch_bytes ? mm_scratch_get(st, p->scratch_bytes) : NULL;
    if (!st || (p->scratch_bytes && !scratch)) return run_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    dnnl_memory_t ma = NULL, mb = NULL, mc = NULL, ms = NULL;
    int ok = dnnl_memory_create(&ma, &p->a, mm_engine, (void *)A) == dnnl_success &&
             dnnl_memory_create(&mb, &p->b, mm_engine, (void *)B) == dnnl_success &&
             dnnl_memory_create(&mc, &p->c, mm_engine, C) == dnnl_success &&
             (!p->scratch_bytes || dnnl_memory_create(&ms, &p->scratch, mm_engine, scratch) == dnnl_success);
    if (ok) {
        dnnl_exec_arg_t args[4] = {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc},
                                   {DNNL_ARG_SCRATCHPAD, ms}};
        ok = dnnl_primitive_execute(p->prim, st->s, ms ? 4 : 3, args) == dnnl_success &&
             dnnl_stream_wait(st->s) == dnnl_success;
    }
    if (ma) dnnl_memory_destroy(ma);
    if (mb) dnnl_memory_destroy(mb);
    if (mc) dnnl_memory_destroy(mc);
    if (ms) dnnl_memory_destroy(ms);
    return ok ? 0 : -1;
}

/* The cases every backend must get right without help: no rows, no columns, an empty sum. The
 * libraries reject some of them (zero leading dimensions) or differ on whether beta = 0 reads C. */
static int degenerate(int64_t M, int64_t N, int64_t K, float beta, float *C, int64_t ldc) {
    if (M <= 0 || N <= 0) return 1;
    if (K > 0) return 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) C[i * ldc + j] = beta == 0.0f ? 0.0f : beta * C[i * ldc + j];
    return 1;
}

static int run_backend(adt_gemm_backend b, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                       const float *A, int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (b == ADT_GEMM_ONEDNN) return run_onednn(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    if (b == ADT_GEMM_ONEDNN_MATMUL) return run_onednn_matmul(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    run_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return 0;
}

int adt_gemm_with(adt_gemm_backend b, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A,
                  int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    if (degenerate(M, N, K, beta, C, ldc)) return 0;
    return run_backend(b, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

static void init_once(void);
static int mkdir_parent(const char *path, char dir[1024]);
static adt_gemm_backend route_of(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc);

void adt_gemm(int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t lda,
              const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    pthread_once(&g_once, init_once);
    if (degenerate(M, N, K, beta, C, ldc)) return;
    adt_gemm_backend b = g_info.per_shape ? route_of(ta, tb, M, N, K, A, lda, B, ldb, beta, C, ldc) : g_info.backend;
    if (run_backend(b, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == 0) return;
    /* oneDNN checks its arguments and refuses bad ones (a caller's bug); OpenBLAS's xerbla
     * then names the fault, and the product still comes out where OpenBLAS can make it */
    static atomic_int warned;
    if (!atomic_exchange(&warned, 1))
        adt_log(ADT_LOG_WARN, "gemm: oneDNN refused a %lldx%lldx%lld %c%c product (lda %lld, ldb %lld, ldc %lld); "
                "running OpenBLAS for it", (long long)M, (long long)N, (long long)K, ta ? 'T' : 'N',
                tb ? 'T' : 'N', (long long)lda, (long long)ldb, (long long)ldc);
    run_openblas(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

/* OpenBLAS 0.3.21 sums the inner dimension in blocks of GEMM_Q (256 to 384 floats by kernel
 * family) and adds each block's sum to C, so up to 256 the accumulating product is C + (the
 * product's one rounding). oneDNN 2.6's sgemm measured the same up to K = 384 on every shape
 * with M, N > 1 (1, 2 threads); its matrix-vector path (M or N = 1) folds C into the sum and
 * rounds differently. Its matmul primitive (beta C as a sum post-op) measured the same with M, N > 1,
 * and not with one row or column (tests/test_gemm.c holds each backend to its rule). */
int adt_gemm_acc_exact_with(adt_gemm_backend b, int64_t M, int64_t N, int64_t K) {
    if (K > 256) return 0;
    if (b == ADT_GEMM_ONEDNN || b == ADT_GEMM_ONEDNN_MATMUL) return M > 1 && N > 1;
    return 1;
}

/* Per shape any backend that passed its check may run a shape (route_of), so the rule must
 * hold for each of them. */
int adt_gemm_acc_exact(int64_t M, int64_t N, int64_t K) {
    const adt_gemm_info *info = adt_gemm_get_info();
    if (!info->per_shape) return adt_gemm_acc_exact_with(info->backend, M, N, K);
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++)
        if (info->check_ok[b] && !adt_gemm_acc_exact_with((adt_gemm_backend)b, M, N, K)) return 0;
    return 1;
}

/* ---- the correctness check ---------------------------------------------------------------- */

static uint64_t mix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float unit(uint64_t *s) { return (float)((double)(mix(s) >> 11) * 0x1.0p-53 * 2.0 - 1.0); }

/* One case: fresh operands with padded rows (the pad holds NaN, so a backend that reads past a
 * row or misreads a leading dimension fails), C's pad checked untouched afterwards, and with
 * beta = 0 C starting as NaN (the product must not read it). Each element is held to a bound
 * proportional to the magnitudes summed, so rounding passes and a wrong element does not. */
static int check_case(adt_gemm_backend b, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha,
                      float beta, int64_t pad, uint64_t seed) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + pad, ldb = bc + pad, ldc = N + pad;
    float *A = adt_malloc((size_t)(ar * lda) * sizeof *A), *B = adt_malloc((size_t)(br * ldb) * sizeof *B);
    float *C = adt_malloc((size_t)(M * ldc) * sizeof *C), *C0 = adt_malloc((size_t)(M * ldc) * sizeof *C0);
    uint64_t s = seed;
    for (int64_t i = 0; i < ar * lda; i++) A[i] = (i % lda) < ac ? unit(&s) : NAN;
    for (int64_t i = 0; i < br * ldb; i++) B[i] = (i % ldb) < bc ? unit(&s) : NAN;
    for (int64_t i = 0; i < M * ldc; i++) C0[i] = (i % ldc) < N ? (beta == 0.0f ? NAN : unit(&s)) : 12345.0f;
    memcpy(C, C0, (size_t)(M * ldc) * sizeof *C);
    int ok = adt_gemm_with(b, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == 0;
    for (int64_t i = 0; ok && i < M; i++) {
        for (int64_t j = 0; ok && j < ldc; j++) {
            if (j >= N) {
                ok = C[i * ldc + j] == 12345.0f;
                continue;
            }
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double a = ta ? A[k * lda + i] : A[i * lda + k], bb = tb ? B[j * ldb + k] : B[k * ldb + j];
                ref += a * bb, mag += fabs(a * bb);
            }
            ref *= alpha, mag *= fabs(alpha);
            if (beta != 0.0f) ref += (double)beta * C0[i * ldc + j], mag += fabs((double)beta * C0[i * ldc + j]);
            double got = C[i * ldc + j];
            ok = isfinite(got) && fabs(got - ref) <= 1e-6 * (double)(K + 4) * mag + 1e-30;
        }
    }
    free(A), free(B), free(C), free(C0);
    return ok;
}

int adt_gemm_self_check(adt_gemm_backend b) {
    /* M, N, K, ta, tb, alpha, beta, pad: every transpose pair, beta 0 / 1 / other, alpha != 1,
     * sizes off every vector width, K past one block of either library, padded rows */
    static const struct {
        int64_t M, N, K;
        int ta, tb;
        float alpha, beta;
        int64_t pad;
    } cases[] = {
        {1, 1, 1, 0, 0, 1.0f, 0.0f, 0},      {7, 5, 3, 0, 0, 1.0f, 0.0f, 1},
        {33, 17, 65, 1, 0, 1.0f, 0.5f, 3},   {64, 48, 96, 0, 1, -1.5f, 1.0f, 0},
        {29, 65, 31, 1, 1, 0.25f, -2.0f, 5}, {130, 97, 300, 0, 0, 1.0f, 0.9f, 2},
        {96, 130, 513, 1, 0, 1.0f, 0.0f, 0}, {17, 200, 129, 0, 1, 2.0f, 1.0f, 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!check_case(b, cases[i].ta, cases[i].tb, cases[i].M, cases[i].N, cases[i].K, cases[i].alpha,
                        cases[i].beta, cases[i].pad, 0x5eed0000u + i)) {
            adt_log(ADT_LOG_WARN, "gemm: %s failed its correctness check on case %zu (%lldx%lldx%lld %c%c)",
                    adt_gemm_backend_str(b), i, (long long)cases[i].M, (long long)cases[i].N,
                    (long long)cases[i].K, cases[i].ta ? 'T' : 'N', cases[i].tb ? 'T' : 'N');
            return 0;
        }
    return 1;
}

/* ---- the speed probe ----------------------------------------------------------------------- */

/* The two reference steps' products in the form each step runs them (bench/bench_core's
 * models; which products accumulate is the executor's: a linear layer's product onto its bias
 * rows, an SGD weight gradient folded into its momentum buffer), each shape standing for a kind
 * of product with the share of its step's multiply-adds that kind has. An accumulating product
 * costs some backends more than its plain form (the matmul primitive's sum post-op), so a probe
 * of plain products alone can pick the backend slower on the step.
 * GPT-S (8 x 128 tokens, width 256, 4 layers; x W with W [in, out]): the linear layers' forward
 * (onto the bias), input gradients (dY W^T) and weight gradients (x^T dY, AdamW: plain) are a
 * third each of its linear products (92% of the step's; the attention's small per-head products
 * are left out): the qkv and MLP-out forwards in proportion to their sizes; the MLP's two
 * layers' input gradients, and their weight gradients, a sixth each (backends rank the two
 * shapes of one kind differently: dnnl_sgemm ran the 1024 x 256 x 1024 TN one 13% slower than
 * the matmul primitive, the 256 x 1024 x 1024 one 2%; so neither stands for both). The MLP (784-1024-1024-10, batch 128, x W^T, SGD
 * with momentum): the forwards 38.9% (onto the bias), the input gradients 22.1% (plain), the
 * weight gradients 38.9% (folded: accumulating), forwards and weight gradients each split
 * between the 1024-square layer's and the 784-input one's, which backends rank differently
 * (the primitive ran the first forward 13% faster than dnnl_sgemm, the second at par). */
static const adt_gemm_shape probe_shapes[ADT_GEMM_PROBE_SHAPES] = {
    {1024, 768, 256, 0, 0, "gpt-s", 0.0, 1.0 / 7}, /* 3 : 4, a third together */
    {1024, 256, 1024, 0, 0, "gpt-s", 0.0, 4.0 / 21},
    {1024, 256, 1024, 0, 1, "gpt-s", 1.0 / 6, 0.0},
    {1024, 1024, 256, 0, 1, "gpt-s", 1.0 / 6, 0.0},
    {1024, 256, 1024, 1, 0, "gpt-s", 1.0 / 6, 0.0},
    {256, 1024, 1024, 1, 0, "gpt-s", 1.0 / 6, 0.0},
    {128, 1024, 1024, 0, 1, "mlp", 0.0, 0.2214},
    {128, 1024, 784, 0, 1, "mlp", 0.0, 0.1679},
    {128, 1024, 1024, 0, 0, "mlp", 0.2214, 0.0},
    {1024, 1024, 128, 1, 0, "mlp", 0.0, 0.2214},
    {1024, 784, 128, 1, 0, "mlp", 0.0, 0.1679},
};

const adt_gemm_shape *adt_gemm_probe_shapes(void) { return probe_shapes; }

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#define PROBE_ROUNDS 5

/* This thread's CPU time. At one thread both libraries compute on the calling thread, so its CPU
 * time is the product's own, whatever else the machine runs: on a shared machine wall time also
 * counts other processes' time slices, and one burst could then decide (and be cached). */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* GFLOP/s per backend, shape and form (beta 0, beta 1): the best of PROBE_ROUNDS interleaved
 * rounds (interleaving spreads what the machine's other work does to caches over every backend
 * alike; each backend first in turn), at one thread, the per-rank setting of data-parallel
 * training, in thread CPU time. The best, not the median, as the per-shape choice takes it:
 * other work on a shared machine only makes a product slower (thread CPU time still counts what
 * a busy sibling hyperthread or a shared cache costs it), and the backends may differ by less.
 * Both forms of every shape are timed, whatever its shares: the cache then shows what
 * accumulating costs each backend. The accumulating form adds onto a matrix of its own, as a
 * step adds onto a momentum buffer or bias rows that no product has just written: onto the C a
 * plain product of the same shape had just written, the matmul primitive's sum post-op measured
 * as fast as its plain product, and 13-42% slower onto a buffer of its own (1024 x 1024 x 128
 * and 1024 x 784 x 128, TN, Zen 5, three runs at load 8), as the MLP's step runs it (its weight
 * gradients folded into the momentum). Its values stay of order K times the rounds: no
 * overflow, no subnormals. */
static void probe(adt_gemm_info *info) {
    size_t big = 1024 * 1024;
    float *A = adt_malloc(big * sizeof *A), *B = adt_malloc(big * sizeof *B), *C = adt_malloc(big * sizeof *C),
          *Cacc = adt_malloc(big * sizeof *Cacc);
    uint64_t s = 7;
    for (size_t i = 0; i < big; i++) A[i] = unit(&s), B[i] = unit(&s), Cacc[i] = unit(&s);
    int ob = openblas_get_num_threads(), om = omp_get_max_threads();
    openblas_set_num_threads(1);
    omp_set_num_threads(1);
    omp_applied = 1;
    int save = atomic_exchange(&g_threads, 1);
    double t[ADT_GEMM_N_BACKENDS][ADT_GEMM_PROBE_SHAPES][2][PROBE_ROUNDS];
    for (int r = -1; r < PROBE_ROUNDS; r++) /* round -1 warms up (oneDNN compiles its kernels) */
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++)
            for (int f = 0; f < 2; f++) /* f = 0: beta 0, f = 1: beta 1 */
                for (int j = 0; j < ADT_GEMM_N_BACKENDS; j++) {
                    int b = (j + (r < 0 ? 0 : r)) % ADT_GEMM_N_BACKENDS;
                    if (!info->check_ok[b]) continue;
                    const adt_gemm_shape *p = &probe_shapes[i];
                    double t0 = thread_cpu_s();
                    adt_gemm_with((adt_gemm_backend)b, p->ta, p->tb, p->M, p->N, p->K, 1.0f, A, p->ta ? p->M : p->K,
                                  B, p->tb ? p->K : p->N, (float)f, f ? Cacc : C, p->N);
                    if (r >= 0) t[b][i][f][r] = thread_cpu_s() - t0;
                }
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++)
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++)
            for (int f = 0; f < 2; f++) {
                double *rate = f ? &info->rate_acc[b][i] : &info->rate[b][i];
                if (!info->check_ok[b]) {
                    *rate = 0.0;
                    continue;
                }
                qsort(t[b][i][f], PROBE_ROUNDS, sizeof(double), cmp_double);
                const adt_gemm_shape *p = &probe_shapes[i];
                *rate = 2.0 * (double)(p->M * p->N * p->K) / t[b][i][f][0] * 1e-9;
            }
    atomic_store(&g_threads, save);
    if (ob > 0) openblas_set_num_threads(ob);
    omp_set_num_threads(om);
    omp_applied = 0;
    free(A), free(B), free(C), free(Cacc);
}

/* ---- the per-shape choice ------------------------------------------------------------------ */

/* Under auto the backend is chosen per product shape, not once: on this kind of machine
 * (AVX-512, one thread) no backend is fastest on every shape of one training step (the MLP's:
 * the matmul primitive on x W^T, dnnl_sgemm on the 1024-square weight gradient, OpenBLAS on
 * the 1024 x 784 one; GPT-S's 1024 x 256 x 1024 weight gradient 8-13% faster in the primitive,
 * its other shapes in dnnl_sgemm; bench/run_gemm.sh). The first product of a shape on the
 * machine times every backend that passed its check on the caller's own operands (ROUTE_REPS
 * interleaved rounds after a warm-up one, each backend first in turn; thread CPU time at one
 * thread, where the product runs on the calling thread, wall time above), keeps the one of least
 * best time (what the kernel costs, where a median still carries the bursts of other work), and
 * appends it to the machine's routes file (beside the probe's cache, the same key): every later
 * product of the shape, in this process or any other on the machine, runs that backend. A
 * resumed run therefore repeats the uninterrupted one bit for bit, which a choice timed afresh
 * in each process would not (a near tie falls either way). The file is read and appended under
 * an exclusive flock, the measuring included, so two processes that meet a new shape at once
 * agree (the second waits and reads the first one's line). The product is timed in the form of
 * the shape's first call (beta = 0, or accumulating with beta = 1), the form a training step
 * repeats: an accumulating product costs some backends more (the matmul primitive's sum
 * post-op, 30% on the MLP's weight gradients). The backend depends on the shape alone (sizes,
 * transposes, thread count), never on beta: a shape's accumulating product and its plain form
 * run the same backend, which the momentum fold relies on (adt_gemm_acc_exact). The probe's
 * backend runs: products under ROUTE_MIN_WORK multiply-adds (their choice is worth less than
 * its timing) or over ROUTE_MAX_WORK (a measurement would take seconds), shapes past the
 * process's table or the file's, and every shape when the file cannot be opened, locked or
 * appended to (so processes still agree). */
#define ROUTES 512
#define ROUTE_REPS 6
#define ROUTE_MIN_WORK 65536.0
#define ROUTE_MAX_WORK 4e9
#define ROUTE_FILE_MAX 4096
#define ROUTE_FILE_BYTES (1 << 20)
#define ROUTE_FILE_MAGIC "adtrain-gemm-routes"

static adt_gemm_route_entry routes[ROUTES];
static atomic_int route_count;
static pthread_mutex_t route_lock = PTHREAD_MUTEX_INITIALIZER;

static int route_same(const adt_gemm_route_entry *r, int ta, int tb, int64_t M, int64_t N, int64_t K, int threads) {
    return r->M == M && r->N == N && r->K == K && r->ta == ta && r->tb == tb && r->threads == threads;
}

static int route_routed(int64_t M, int64_t N, int64_t K) {
    double work = (double)M * (double)N * (double)K;
    return work >= ROUTE_MIN_WORK && work <= ROUTE_MAX_WORK;
}

/* A decimal of 1-13 digits (no sign: every field is a count or a flag) into *v; NULL if none. */
static const char *take_count(const char *p, long long *v) {
    long long x = 0;
    int n = 0;
    for (; p[n] >= '0' && p[n] <= '9'; n++) {
        if (n == 13) return NULL;
        x = x * 10 + (p[n] - '0');
    }
    if (!n) return NULL;
    *v = x;
    return p + n;
}

int adt_gemm_route_parse(const char *line, const char *where, adt_gemm_route_entry *out) {
    long long v[6]; /* M N K ta tb threads */
    const char *p = line;
    for (int i = 0; i < 6 && p; i++) {
        p = take_count(p, &v[i]);
        p = p && *p == ' ' ? p + 1 : NULL;
    }
    if (!p)
        return adt_error(ADT_ERR_FORMAT, "%s: expected \"M N K ta tb threads backend\" (counts one space apart), "
                         "got \"%.80s\"", where, line);
    if (v[0] < 1 || v[1] < 1 || v[2] < 1 || v[0] > (1ll << 40) || v[1] > (1ll << 40) || v[2] > (1ll << 40))
        return adt_error(ADT_ERR_FORMAT, "%s: sizes %lld %lld %lld: expected each in 1..2^40", where, v[0], v[1], v[2]);
    if (v[3] > 1 || v[4] > 1)
        return adt_error(ADT_ERR_FORMAT, "%s: transposes %lld %lld: expected 0 or 1", where, v[3], v[4]);
    if (v[5] > 4096) return adt_error(ADT_ERR_FORMAT, "%s: threads %lld: expected 0..4096", where, v[5]);
    int b = -1;
    for (int i = 0; i < ADT_GEMM_N_BACKENDS; i++)
        if (!strcmp(p, backend_names[i])) b = i;
    if (b < 0)
        return adt_error(ADT_ERR_FORMAT, "%s: backend \"%.40s\": expected openblas, onednn or onednn-matmul", where, p);
    *out = (adt_gemm_route_entry){.M = v[0], .N = v[1], .K = v[2], .ta = (int)v[3], .tb = (int)v[4],
                                  .threads = (int)v[5], .backend = (adt_gemm_backend)b};
    return 0;
}

int adt_gemm_routes_path(char *buf, size_t n, const char *cache_path) {
    size_t len = strlen(cache_path);
    if (len < 5 || strcmp(cache_path + len - 5, ".json"))
        return adt_error(ADT_ERR_ARG, "gemm routes: the cache path \"%s\" does not end in .json", cache_path);
    if ((size_t)snprintf(buf, n, "%.*s.routes", (int)(len - 5), cache_path) >= n)
        return adt_error(ADT_ERR_IO, "gemm routes: the path beside %s is too long", cache_path);
    return 0;
}

static adt_gemm_backend route_measure(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                      const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                                      int one_thread) {
    double best_of[ADT_GEMM_N_BACKENDS];
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) best_of[b] = INFINITY;
    for (int r = -1; r < ROUTE_REPS; r++) /* round -1 makes oneDNN's kernels and primitives */
        for (int j = 0; j < ADT_GEMM_N_BACKENDS; j++) {
            int b = (j + (r < 0 ? 0 : r)) % ADT_GEMM_N_BACKENDS; /* each backend first in turn */
            if (!g_info.check_ok[b]) continue;
            double t0 = one_thread ? thread_cpu_s() : adt_now_s();
            int rc = adt_gemm_with((adt_gemm_backend)b, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, beta, C, ldc);
            double dt = (one_thread ? thread_cpu_s() : adt_now_s()) - t0;
            if (r >= 0 && rc == 0 && dt < best_of[b]) best_of[b] = dt;
        }
    adt_gemm_backend best = g_info.backend;
    double best_t = INFINITY;
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++)
        if (best_of[b] < best_t) best_t = best_of[b], best = (adt_gemm_backend)b;
    adt_log(ADT_LOG_DEBUG, "gemm: %lldx%lldx%lld %c%c beta %g: %s (us: openblas %.0f, onednn %.0f, onednn-matmul %.0f)",
            (long long)M, (long long)N, (long long)K, ta ? 'T' : 'N', tb ? 'T' : 'N', beta, adt_gemm_backend_str(best),
            best_of[0] * 1e6, best_of[1] * 1e6, best_of[2] * 1e6);
    return best;
}

static int write_all(int fd, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, s, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        s += w, n -= (size_t)w;
    }
    return 0;
}

/* A decision for one shape through the routes file (see above): 0 and *out, or -1 when the file
 * cannot be used (the caller then runs the probe's backend). Called under route_lock. */
static int route_from_file(int ta, int tb, int64_t M, int64_t N, int64_t K, int threads, const float *A,
                           int64_t lda, const float *B, int64_t ldb, float beta, float *C, int64_t ldc,
                           adt_gemm_backend *out) {
    char path[1100], header[640];
    if (!g_info.cache_path[0] || adt_gemm_routes_path(path, sizeof path, g_info.cache_path)) return -1;
    if (mkdir_parent(path, NULL)) return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    if (flock(fd, LOCK_EX)) {
        close(fd);
        return -1;
    }
    snprintf(header, sizeof header, ROUTE_FILE_MAGIC " %d %s\n", ADT_GEMM_ROUTES_VERSION, g_info.key);
    size_t n = 0, hlen = strlen(header);
    char *text = NULL; /* read by path: the lock is on the inode, and the file is never replaced */
    int rc = adt_file_read(path, ROUTE_FILE_BYTES, "gemm routes", &text, &n) ? -1 : 0, found = 0, entries = 0,
        torn = 0;
    if (!rc && (n < hlen || memcmp(text, header, hlen))) { /* new, foreign or of another version: begun anew */
        n = 0; /* no lines to read: text holds the old file, shorter than the header maybe */
        rc = ftruncate(fd, 0) || pwrite(fd, header, hlen, 0) != (ssize_t)hlen ? -1 : 0;
    }
    /* a last line without its newline (a writer died mid-line) is closed as " torn", which no
     * line parses with, before the next is appended: closed bare, it might read as valid */
    if (!rc && n > hlen) torn = text[n - 1] != '\n'; /* before the lines are cut in place */
    /* the first valid line of a shape decides; a torn last line (no newline) and lines naming a
     * backend that failed its check are passed over, as every process passes over them */
    for (char *line = n > hlen ? text + hlen : NULL; !rc && !found && line && *line;) {
        char *nl = strchr(line, '\n');
        if (!nl) break;
        *nl = 0;
        adt_gemm_route_entry e;
        if (adt_gemm_route_parse(line, "gemm routes", &e) == 0 && g_info.check_ok[e.backend]) {
            entries++;
            if (route_same(&e, ta, tb, M, N, K, threads)) found = 1, *out = e.backend;
        }
        line = nl + 1;
    }
    adt_error_clear();
    /* the timing writes C where beta = 0 (the product then writes it again), else a zeroed
     * scratch matrix of C's size, timed accumulating as the call is */
    float *scratch = !rc && !found && entries < ROUTE_FILE_MAX
                         ? (beta == 0.0f ? C : calloc((size_t)(M * ldc), sizeof *scratch))
                         : NULL;
    if (scratch) {
        int one_thread = threads == 1 ||
                         (threads == 0 && openblas_get_num_threads() == 1 && omp_get_max_threads() == 1);
        adt_gemm_backend b = route_measure(ta, tb, M, N, K, A, lda, B, ldb, beta == 0.0f ? 0.0f : 1.0f, scratch, ldc,
                                           one_thread);
        if (scratch != C) free(scratch);
        char line[160];
        int len = snprintf(line, sizeof line, "%s%lld %lld %lld %d %d %d %s\n",
                           torn ? " torn\n" : "", (long long)M, (long long)N, (long long)K,
                           ta, tb, threads, adt_gemm_backend_str(b));
        rc = lseek(fd, 0, SEEK_END) < 0 || write_all(fd, line, (size_t)len) ? -1 : 0;
        if (!rc) *out = b;
    } else if (!rc && !found)
        rc = -1; /* the file is full, or no scratch: the probe's backend */
    free(text);
    flock(fd, LOCK_UN);
    close(fd);
    return rc;
}

static adt_gemm_backend route_of(int ta, int tb, int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                 const float *B, int64_t ldb, float beta, float *C, int64_t ldc) {
    int threads = atomic_load_explicit(&g_threads, memory_order_relaxed);
    int n = atomic_load_explicit(&route_count, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (route_same(&routes[i], ta, tb, M, N, K, threads)) return routes[i].backend;
    if (!route_routed(M, N, K)) return g_info.backend;
    pthread_mutex_lock(&route_lock);
    adt_gemm_backend b = g_info.backend;
    n = atomic_load_explicit(&route_count, memory_order_relaxed);
    int i = 0;
    while (i < n && !route_same(&routes[i], ta, tb, M, N, K, threads)) i++;
    if (i < n) b = routes[i].backend;
    else if (n < ROUTES) {
        if (route_from_file(ta, tb, M, N, K, threads, A, lda, B, ldb, beta, C, ldc, &b)) b = g_info.backend;
        routes[n] = (adt_gemm_route_entry){.M = M, .N = N, .K = K, .ta = ta, .tb = tb, .threads = threads,
                                           .backend = b};
        atomic_store_explicit(&route_count, n + 1, memory_order_release);
    }
    pthread_mutex_unlock(&route_lock);
    return b;
}

int adt_gemm_route(int ta, int tb, int64_t M, int64_t N, int64_t K) {
    const adt_gemm_info *info = adt_gemm_get_info();
    if (!info->per_shape || !route_routed(M, N, K)) return (int)info->backend;
    int threads = atomic_load_explicit(&g_threads, memory_order_relaxed);
    int n = atomic_load_explicit(&route_count, memory_order_acquire);
    for (int i = 0; i < n; i++)
        if (route_same(&routes[i], ta, tb, M, N, K, threads)) return (int)routes[i].backend;
    return -1;
}

/* A share over its rate: the seconds per GFLOP of the step that part of it takes. */
static double share_time(double share, double rate) {
    if (share <= 0.0) return 0.0;
    return rate > 0.0 ? share / rate : INFINITY;
}

/* Each step's estimate is per GFLOP of its products, so GPT-S's step, 17 times the MLP's
 * multiply-adds, does not decide alone: the steps count alike. Ties go to the lower index. */
adt_gemm_backend adt_gemm_choose(const adt_gemm_info *info, const adt_gemm_shape shapes[ADT_GEMM_PROBE_SHAPES],
                                 double score[ADT_GEMM_N_BACKENDS]) {
    adt_gemm_backend best = ADT_GEMM_OPENBLAS;
    double best_t = INFINITY;
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) {
        double tt = INFINITY;
        if (info->check_ok[b]) {
            tt = 0.0;
            for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++)
                tt += share_time(shapes[i].share_plain, info->rate[b][i]) +
                      share_time(shapes[i].share_acc, info->rate_acc[b][i]);
        }
        if (score) score[b] = tt;
        if (tt < best_t) best_t = tt, best = (adt_gemm_backend)b;
    }
    return best;
}

/* ---- the cache ------------------------------------------------------------------------------ */

/* The first processor's model name and its family / model / stepping numbers (a virtual machine
 * may show only "AMD EPYC"), both libraries' versions and kernel families, OPENBLAS_CORETYPE. */
static void machine_key(char *buf, size_t n) {
    static const char *const fields[] = {"model name", "cpu family", "model", "stepping"};
    char val[4][128] = {"unknown CPU", "?", "?", "?"};
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[512];
        while (fgets(line, sizeof line, f) && line[0] != '\n') { /* the first processor's block */
            char *c = strchr(line, ':');
            if (!c) continue;
            size_t klen = strcspn(line, "\t:");
            for (int k = 0; k < 4; k++)
                if (klen == strlen(fields[k]) && !strncmp(line, fields[k], klen)) {
                    for (c++; *c == ' ' || *c == '\t'; c++) {}
                    snprintf(val[k], sizeof val[k], "%s", c);
                    val[k][strcspn(val[k], "\n")] = 0;
                }
        }
        fclose(f);
    }
    const char *ct = getenv("OPENBLAS_CORETYPE");
    /* each part held to a length that keeps the whole within the 512 bytes keys have */
    snprintf(buf, n, "%.160s (family %.8s model %.8s stepping %.8s) | %.112s | %.112s | OPENBLAS_CORETYPE=%.32s",
             val[0], val[1], val[2], val[3], adt_gemm_backend_version(ADT_GEMM_OPENBLAS),
             adt_gemm_backend_version(ADT_GEMM_ONEDNN), ct ? ct : "(unset)");
}

int adt_gemm_cache_path(char *buf, size_t n, const char *key) {
    const char *x = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char dir[900];
    /* the XDG spec: a relative $XDG_CACHE_HOME is invalid and ignored */
    if (x && x[0] == '/') snprintf(dir, sizeof dir, "%s/adtrain", x);
    else if (home && home[0] == '/') snprintf(dir, sizeof dir, "%s/.cache/adtrain", home);
    else return adt_error(ADT_ERR_IO, "gemm cache: neither $XDG_CACHE_HOME nor $HOME names an absolute directory");
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a of the key: a short, stable file name */
    for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
    if ((size_t)snprintf(buf, n, "%s/gemm-%016llx.json", dir, (unsigned long long)h) >= n)
        return adt_error(ADT_ERR_IO, "gemm cache: the path under %s is too long", dir);
    return 0;
}

/* Creates the directories above the file `path` (mkdir -p of its dirname): 0, or -1 with errno;
 * dir (may be NULL) receives that directory, for messages. */
static int mkdir_parent(const char *path, char dir[1024]) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash || slash == tmp) return 0;
    *slash = 0;
    if (dir) snprintf(dir, 1024, "%s", tmp);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return -1;
        *p = '/';
    }
    return mkdir(tmp, 0755) && errno != EEXIST ? -1 : 0;
}

int adt_gemm_cache_write(const char *path, const adt_gemm_info *info) {
    char dir[1024];
    if (mkdir_parent(path, dir)) return adt_error(ADT_ERR_IO, "gemm cache: cannot create %s: %s", dir, strerror(errno));
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "version", ADT_GEMM_CACHE_VERSION);
    cJSON_AddStringToObject(j, "key", info->key);
    cJSON_AddStringToObject(j, "auto", adt_gemm_backend_str(adt_gemm_choose(info, probe_shapes, NULL)));
    cJSON *chk = cJSON_AddObjectToObject(j, "check"), *rate = cJSON_AddObjectToObject(j, "gflops"),
          *rate_acc = cJSON_AddObjectToObject(j, "gflops_acc");
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) {
        cJSON_AddBoolToObject(chk, backend_names[b], info->check_ok[b]);
        cJSON *a = cJSON_AddArrayToObject(rate, backend_names[b]), *c = cJSON_AddArrayToObject(rate_acc, backend_names[b]);
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++) {
            cJSON_AddItemToArray(a, cJSON_CreateNumber(info->rate[b][i]));
            cJSON_AddItemToArray(c, cJSON_CreateNumber(info->rate_acc[b][i]));
        }
    }
    char *text = cJSON_Print(j);
    cJSON_Delete(j);
    int rc = adt_file_write_atomic(path, text, strlen(text));
    free(text);
    return rc;
}

int adt_gemm_cache_read(const char *path, const char *key, adt_gemm_info *out) {
    char *text = NULL;
    size_t n = 0;
    int rc = adt_file_read(path, 1 << 16, "gemm cache", &text, &n);
    if (rc) return rc;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!j) return adt_error(ADT_ERR_FORMAT, "%s: not JSON", path);
    rc = 0;
    const cJSON *ver = cJSON_GetObjectItemCaseSensitive(j, "version"), *k = cJSON_GetObjectItemCaseSensitive(j, "key"),
                *chk = cJSON_GetObjectItemCaseSensitive(j, "check");
    const char *const forms[2] = {"gflops", "gflops_acc"};
    const cJSON *rate[2] = {cJSON_GetObjectItemCaseSensitive(j, forms[0]), cJSON_GetObjectItemCaseSensitive(j, forms[1])};
    if (!cJSON_IsNumber(ver))
        rc = adt_error(ADT_ERR_FORMAT, "%s: no format version (an older layer's file), expected %d", path,
                       ADT_GEMM_CACHE_VERSION);
    else if (ver->valuedouble != ADT_GEMM_CACHE_VERSION)
        rc = adt_error(ADT_ERR_FORMAT, "%s: format version %g, expected %d", path, ver->valuedouble,
                       ADT_GEMM_CACHE_VERSION);
    else if (!cJSON_IsString(k) || strcmp(k->valuestring, key))
        rc = adt_error(ADT_ERR_FORMAT, "%s: written for another machine or library", path);
    for (int b = 0; !rc && b < ADT_GEMM_N_BACKENDS; b++) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(chk, backend_names[b]);
        if (!cJSON_IsBool(c)) {
            rc = adt_error(ADT_ERR_FORMAT, "%s: check.%s missing or not a boolean", path, backend_names[b]);
            break;
        }
        out->check_ok[b] = cJSON_IsTrue(c);
        for (int f = 0; !rc && f < 2; f++) {
            const cJSON *a = cJSON_GetObjectItemCaseSensitive(rate[f], backend_names[b]);
            if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) != ADT_GEMM_PROBE_SHAPES) {
                rc = adt_error(ADT_ERR_FORMAT, "%s: %s.%s missing or not %d rates", path, forms[f], backend_names[b],
                               ADT_GEMM_PROBE_SHAPES);
                break;
            }
            for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++) {
                const cJSON *v = cJSON_GetArrayItem(a, i);
                double r = cJSON_IsNumber(v) ? v->valuedouble : -1.0;
                /* a passing backend has a rate; a failing one none */
                if (!(r >= 0.0 && r < 1e7) || (out->check_ok[b] && r <= 0.0)) {
                    rc = adt_error(ADT_ERR_FORMAT, "%s: %s.%s[%d] is not a rate", path, forms[f], backend_names[b], i);
                    break;
                }
                (f ? out->rate_acc : out->rate)[b][i] = r;
            }
        }
    }
    cJSON_Delete(j);
    if (!rc) out->backend = adt_gemm_choose(out, probe_shapes, out->score);
    return rc;
}

/* ---- the choice ----------------------------------------------------------------------------- */

int adt_gemm_env(int *forced, int *per_shape) {
    const char *env = getenv("ADT_GEMM");
    *forced = -1, *per_shape = 0;
    if (!env || !*env || !strcmp(env, "auto")) return *per_shape = 1, 0;
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++)
        if (!strcmp(env, backend_names[b])) *forced = b;
    if (*forced < 0)
        return adt_error(ADT_ERR_ARG, "ADT_GEMM=%s: expected auto (the default: a backend per shape, timed once "
                         "per machine), openblas, onednn or onednn-matmul (that one for every product)", env);
    return 0;
}

int adt_gemm_select(adt_gemm_info *out, int use_cache) {
    memset(out, 0, sizeof *out);
    out->backend = ADT_GEMM_OPENBLAS;
    const char *env = getenv("ADT_GEMM");
    int forced = -1, per_shape = 0;
    int rc = adt_gemm_env(&forced, &per_shape);
    if (rc) return rc;
    out->per_shape = per_shape;
    machine_key(out->key, sizeof out->key);
    double t0 = adt_now_s();
    if (forced >= 0) {
        /* a forced backend is checked (a wrong product is never run silently), not timed */
        out->forced = 1;
        out->backend = (adt_gemm_backend)forced;
        out->check_ok[forced] = adt_gemm_self_check(out->backend);
        out->probe_s = adt_now_s() - t0;
        if (!out->check_ok[forced]) {
            out->backend = ADT_GEMM_OPENBLAS;
            return adt_error(ADT_ERR_ARG, "ADT_GEMM=%s: the %s backend failed its correctness check on this machine",
                             env, backend_names[forced]);
        }
        return 0;
    }
    int have_path = adt_gemm_cache_path(out->cache_path, sizeof out->cache_path, out->key) == 0;
    if (!have_path) out->cache_path[0] = 0;
    if (use_cache && have_path) {
        if (adt_gemm_cache_read(out->cache_path, out->key, out) == 0) {
            out->from_cache = 1;
            return 0;
        }
        adt_log(ADT_LOG_DEBUG, "gemm: %s (measuring again)", adt_error_message());
    }
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) out->check_ok[b] = adt_gemm_self_check((adt_gemm_backend)b);
    probe(out);
    out->backend = adt_gemm_choose(out, probe_shapes, out->score);
    out->probe_s = adt_now_s() - t0;
    if (!out->check_ok[ADT_GEMM_OPENBLAS] && !out->check_ok[ADT_GEMM_ONEDNN])
        adt_log(ADT_LOG_ERROR, "gemm: no backend passed the correctness check; running OpenBLAS");
    if (have_path && adt_gemm_cache_write(out->cache_path, out))
        adt_log(ADT_LOG_DEBUG, "gemm: %s (the choice is not cached)", adt_error_message());
    adt_error_clear();
    return 0;
}

static void init_once(void) {
    g_init_status = adt_gemm_select(&g_info, 1);
    if (g_init_status) {
        snprintf(g_init_msg, sizeof g_init_msg, "%s", adt_error_message());
        if (!init_quiet) adt_log(ADT_LOG_ERROR, "%s", g_init_msg);
    } else
        adt_log(ADT_LOG_DEBUG, "gemm: %s (%s)", adt_gemm_backend_str(g_info.backend),
                g_info.forced ? "ADT_GEMM" : g_info.from_cache ? "cached choice" : "measured");
}

int adt_gemm_init(void) {
    init_quiet = 1;
    pthread_once(&g_once, init_once);
    init_quiet = 0;
    return g_init_status ? adt_error(g_init_status, "%s", g_init_msg) : 0;
}

const adt_gemm_info *adt_gemm_get_info(void) {
    pthread_once(&g_once, init_once);
    return &g_info;
}

const char *adt_gemm_backend_name(void) { return adt_gemm_backend_str(adt_gemm_get_info()->backend); }

const char *adt_gemm_reason(void) {
    const adt_gemm_info *info = adt_gemm_get_info();
    if (info->forced) return "ADT_GEMM";
    return info->from_cache ? "chosen by the cached probe for the shapes not timed on their own; the rest per shape"
                            : "chosen by the probe for the shapes not timed on their own; the rest per shape";
}
