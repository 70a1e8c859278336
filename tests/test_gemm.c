/*
 * test_gemm.c - the GEMM layer (src/ops/gemm.c): every backend against a naive double product,
 * the accumulation rule the executor's momentum fold relies on, the thread count reaching
 * oneDNN's OpenMP team, the automatic choice (adt_gemm_choose on made-up rates, plain and
 * accumulating), the cache file (written, read back, a corrupt, foreign or older-format one
 * ignored and rewritten), and ADT_GEMM (forcing, bad values, the CLI's refusal and --version
 * line).
 *
 * Shapes and values are fresh each run (seed from the clock unless ADT_TEST_SEED is set; a
 * failing run prints it).
 */
#include <math.h>
#include <omp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>

#include "adtrain/base.h"
#include "adtrain/gemm.h"
#include "check.h"
#include "cli_run.h"

static uint64_t g_seed, g_state;

static uint64_t rnd_u64(void) {
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static int64_t irand(int64_t lo, int64_t hi) { return lo + (int64_t)(rnd_u64() % (uint64_t)(hi - lo + 1)); }
static float urand(float lo, float hi) { return lo + (hi - lo) * (float)((double)(rnd_u64() >> 11) * 0x1.0p-53); }

#define PAD_MARK 777.0f

static char g_self[1024]; /* this binary, for the child processes of some cases */

/* One product through backend b (b < 0: the layer's adt_gemm) against the double reference.
 * A's and B's row padding holds NaN (read past a row: fails), C's padding a mark that must
 * survive, and with beta = 0 C starts as NaN (read: fails). Returns the worst error relative to
 * the bound that rounding allows, > 1 meaning wrong. */
static double one_case(int b, int ta, int tb, int64_t M, int64_t N, int64_t K, float alpha, float beta,
                       int64_t pa, int64_t pb, int64_t pc) {
    int64_t ar = ta ? K : M, ac = ta ? M : K, br = tb ? N : K, bc = tb ? K : N;
    int64_t lda = ac + pa, ldb = bc + pb, ldc = N + pc;
    if (lda == 0) lda = 1; /* an empty operand still has a row stride of at least 1 (BLAS) */
    if (ldb == 0) ldb = 1;
    if (ldc == 0) ldc = 1;
    size_t na = (size_t)(ar * lda) + 1, nb = (size_t)(br * ldb) + 1, nc = (size_t)(M * ldc) + 1;
    float *A = malloc(na * sizeof *A), *B = malloc(nb * sizeof *B), *C = malloc(nc * sizeof *C),
          *C0 = malloc(nc * sizeof *C0);
    for (size_t i = 0; i < na; i++) A[i] = (int64_t)i % lda < ac ? urand(-1, 1) : NAN;
    for (size_t i = 0; i < nb; i++) B[i] = (int64_t)i % ldb < bc ? urand(-1, 1) : NAN;
    for (size_t i = 0; i < nc; i++) C0[i] = (int64_t)i % ldc < N ? (beta == 0.0f ? NAN : urand(-1, 1)) : PAD_MARK;
    memcpy(C, C0, nc * sizeof *C);
    if (b < 0) adt_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    else CHECK(adt_gemm_with((adt_gemm_backend)b, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc) == 0,
               "%s refused %lldx%lldx%lld", adt_gemm_backend_str((adt_gemm_backend)b), (long long)M, (long long)N,
               (long long)K);
    double worst = 0.0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < ldc; j++) {
            float got = C[i * ldc + j];
            if (j >= N) {
                if (got != PAD_MARK) worst = INFINITY;
                continue;
            }
            double ref = 0.0, mag = 0.0;
            for (int64_t k = 0; k < K; k++) {
                double x = ta ? A[k * lda + i] : A[i * lda + k], y = tb ? B[j * ldb + k] : B[k * ldb + j];
                ref += x * y, mag += fabs(x * y);
            }
            ref *= alpha, mag *= fabs(alpha);
            if (beta != 0.0f) ref += (double)beta * C0[i * ldc + j], mag += fabs((double)beta * C0[i * ldc + j]);
            /* float rounding: at most ~K+2 roundings of eps/2 each on the magnitudes summed */
            double bound = 6e-8 * (double)(K + 2) * mag + 1e-30;
            double e = isfinite(got) ? fabs(got - ref) / bound : INFINITY;
            if (e > worst) worst = e;
        }
    free(A), free(B), free(C), free(C0);
    return worst;
}

static void random_cases(int b, int n) {
    const char *name = b < 0 ? "adt_gemm" : adt_gemm_backend_str((adt_gemm_backend)b);
    for (int c = 0; c < n; c++) {
        /* mostly small odd sizes, some past the libraries' block sizes, some degenerate */
        int64_t big = c % 7 == 0 ? 400 : 70;
        int64_t M = irand(c % 11 == 0 ? 0 : 1, big), N = irand(c % 13 == 0 ? 0 : 1, big),
                K = irand(c % 17 == 0 ? 0 : 1, c % 5 == 0 ? 600 : big);
        int ta = (int)irand(0, 1), tb = (int)irand(0, 1);
        float alpha = c % 3 == 0 ? 1.0f : urand(-2, 2);
        float beta = c % 4 == 0 ? 0.0f : c % 4 == 1 ? 1.0f : urand(-2, 2);
        int64_t pa = irand(0, 1) ? 0 : irand(1, 9), pb = irand(0, 1) ? 0 : irand(1, 9), pc = irand(0, 1) ? 0 : irand(1, 9);
        double e = one_case(b, ta, tb, M, N, K, alpha, beta, pa, pb, pc);
        CHECK(e <= 1.0, "%s %lldx%lldx%lld %c%c alpha %g beta %g pads %lld/%lld/%lld: %.3g x the rounding bound "
              "(seed %llu)", name, (long long)M, (long long)N, (long long)K, ta ? 'T' : 'N', tb ? 'T' : 'N', alpha,
              beta, (long long)pa, (long long)pb, (long long)pc, e, (unsigned long long)g_seed);
    }
}

static void test_openblas(void) {
    CHECK(adt_gemm_self_check(ADT_GEMM_OPENBLAS), "the self-check fails");
    random_cases(ADT_GEMM_OPENBLAS, 120);
}

static void test_onednn(void) {
    CHECK(adt_gemm_self_check(ADT_GEMM_ONEDNN), "the self-check fails");
    random_cases(ADT_GEMM_ONEDNN, 120);
    /* a leading dimension shorter than a row is refused, not read past */
    float a[16] = {0}, b[16] = {0}, c[16] = {0};
    CHECK(adt_gemm_with(ADT_GEMM_ONEDNN, 0, 0, 4, 4, 4, 1.0f, a, 2, b, 4, 0.0f, c, 4) == -1, "lda 2 < K 4 accepted");
}

static void test_onednn_matmul(void) {
    CHECK(adt_gemm_self_check(ADT_GEMM_ONEDNN_MATMUL), "the self-check fails");
    random_cases(ADT_GEMM_ONEDNN_MATMUL, 120);
    /* the same shape again runs the primitive made for it: the same bits */
    float A[6 * 5], B[5 * 7], C1[6 * 7], C2[6 * 7];
    for (int i = 0; i < 30; i++) A[i] = urand(-1, 1);
    for (int i = 0; i < 35; i++) B[i] = urand(-1, 1);
    adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, 0, 6, 7, 5, 1.0f, A, 5, B, 7, 0.0f, C1, 7);
    adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, 0, 6, 7, 5, 1.0f, A, 5, B, 7, 0.0f, C2, 7);
    CHECK(!memcmp(C1, C2, sizeof C1), "the same product twice differs");
    float a[16] = {0}, b[16] = {0}, c[16] = {0};
    CHECK(adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, 0, 4, 4, 4, 1.0f, a, 2, b, 4, 0.0f, c, 4) == -1,
          "lda 2 < K 4 accepted");
}

/* A thread that reaches a primitive another thread made runs it too (on a stream of its own),
 * not dnnl_sgemm: the same bits as the first thread, where dnnl_sgemm's differ. */
enum { MT_M = 64, MT_N = 96, MT_K = 700 };
static float mt_A[MT_M * MT_K], mt_B[MT_N * MT_K];

static void *thread_matmul(void *arg) {
    adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, 1, MT_M, MT_N, MT_K, 1.0f, mt_A, MT_K, mt_B, MT_K, 0.0f, arg, MT_N);
    return NULL;
}

/* Threads running the same primitives at once (ranks as threads, an executor's threads), each on
 * operands of its own: every product equals the one the thread's operands give alone. oneDNN's
 * library-managed scratchpad is shared among primitives in Debian's build, so without a
 * scratchpad per thread the products of concurrent threads corrupt each other. */
enum { CT_THREADS = 4, CT_REPS = 40, CT_M = 48, CT_N = 64, CT_K = 320 };
static float ct_A[CT_THREADS][CT_M * CT_K], ct_B[CT_THREADS][CT_K * CT_N], ct_ref[CT_THREADS][CT_M * CT_N];
static int ct_bad[CT_THREADS];

static void *thread_concurrent(void *arg) {
    int t = (int)(intptr_t)arg;
    static float out[CT_THREADS][CT_M * CT_N];
    for (int r = 0; r < CT_REPS; r++) {
        /* both layouts of B, so two primitives run at once too */
        int tb = r & 1;
        adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, tb, CT_M, CT_N, CT_K, 1.0f, ct_A[t], CT_K, ct_B[t], tb ? CT_K : CT_N,
                      0.0f, out[t], CT_N);
        if (!tb && memcmp(out[t], ct_ref[t], sizeof out[t])) ct_bad[t]++;
    }
    return NULL;
}

static void test_matmul_concurrent(void) {
    for (int t = 0; t < CT_THREADS; t++) {
        for (int i = 0; i < CT_M * CT_K; i++) ct_A[t][i] = urand(-1, 1);
        for (int i = 0; i < CT_K * CT_N; i++) ct_B[t][i] = urand(-1, 1);
        adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, 0, CT_M, CT_N, CT_K, 1.0f, ct_A[t], CT_K, ct_B[t], CT_N, 0.0f,
                      ct_ref[t], CT_N);
    }
    pthread_t th[CT_THREADS];
    for (int t = 0; t < CT_THREADS; t++) pthread_create(&th[t], NULL, thread_concurrent, (void *)(intptr_t)t);
    for (int t = 0; t < CT_THREADS; t++) pthread_join(th[t], NULL);
    for (int t = 0; t < CT_THREADS; t++)
        CHECK(ct_bad[t] == 0, "thread %d: %d of %d products differ from the same operands' product alone", t,
              ct_bad[t], CT_REPS / 2);
}

static void test_matmul_threads(void) {
    static float here[MT_M * MT_N], there[MT_M * MT_N], sg[MT_M * MT_N];
    for (int i = 0; i < MT_M * MT_K; i++) mt_A[i] = urand(-1, 1);
    for (int i = 0; i < MT_N * MT_K; i++) mt_B[i] = urand(-1, 1);
    thread_matmul(here);
    pthread_t t;
    pthread_create(&t, NULL, thread_matmul, there);
    pthread_join(t, NULL);
    CHECK(!memcmp(here, there, sizeof here), "another thread's product through the same primitive differs");
    adt_gemm_with(ADT_GEMM_ONEDNN, 0, 1, MT_M, MT_N, MT_K, 1.0f, mt_A, MT_K, mt_B, MT_K, 0.0f, sg, MT_N);
    if (!memcmp(sg, here, sizeof sg))
        fprintf(stderr, "test_gemm: note: dnnl_sgemm and the primitive agree bitwise on %dx%dx%d this run\n", MT_M,
                MT_N, MT_K);
    else
        CHECK(memcmp(sg, there, sizeof sg), "the other thread ran dnnl_sgemm, not the primitive");
}

/* Under auto each shape runs the backend its routes entry names (adt_gemm_route): a backend that
 * passed its check, the same one for every later product of the shape whatever beta, and its
 * result is that backend's, bit for bit; a shape too small to time runs the probe's backend.
 * Forced, the route of every shape is the forced backend. */
static void test_routes(void) {
    const adt_gemm_info *info = adt_gemm_get_info();
    for (int c = 0; c < 12; c++) {
        int64_t M = irand(1, 160), N = irand(1, 160), K = irand(1, 300);
        int ta = (int)irand(0, 1), tb = (int)irand(0, 1);
        float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(K * N) * sizeof *B);
        float *C = malloc((size_t)(M * N) * sizeof *C), *R = malloc((size_t)(M * N) * sizeof *R);
        for (int64_t i = 0; i < M * K; i++) A[i] = urand(-1, 1);
        for (int64_t i = 0; i < K * N; i++) B[i] = urand(-1, 1);
        int64_t lda = ta ? M : K, ldb = tb ? K : N;
        adt_gemm(ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        int r = adt_gemm_route(ta, tb, M, N, K);
        CHECK(r >= 0 && r < ADT_GEMM_N_BACKENDS && info->check_ok[r], "%lldx%lldx%lld: route %d", (long long)M,
              (long long)N, (long long)K, r);
        if (!info->per_shape) CHECK(r == (int)info->backend, "backend %d, route %d", info->backend, r);
        if (r < 0 || r >= ADT_GEMM_N_BACKENDS) continue;
        adt_gemm_with((adt_gemm_backend)r, ta, tb, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, R, N);
        CHECK(!memcmp(C, R, (size_t)(M * N) * sizeof *C), "%lldx%lldx%lld: adt_gemm is not its route %s",
              (long long)M, (long long)N, (long long)K, adt_gemm_backend_str((adt_gemm_backend)r));
        for (int64_t i = 0; i < M * N; i++) C[i] = R[i] = urand(-1, 1);
        adt_gemm(ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, C, N);
        adt_gemm_with((adt_gemm_backend)r, ta, tb, M, N, K, 0.5f, A, lda, B, ldb, 1.0f, R, N);
        CHECK(adt_gemm_route(ta, tb, M, N, K) == r && !memcmp(C, R, (size_t)(M * N) * sizeof *C),
              "%lldx%lldx%lld with beta 1: not its route's result", (long long)M, (long long)N, (long long)K);
        free(A), free(B), free(C), free(R);
    }
    CHECK(adt_gemm_route(0, 0, 3, 3, 100003) == (info->per_shape ? -1 : (int)info->backend),
          "a shape never run: route %d", adt_gemm_route(0, 0, 3, 3, 100003));
    CHECK(adt_gemm_route(1, 0, 7, 9, 11) == (int)info->backend, "a shape too small to time: route %d, backend %d",
          adt_gemm_route(1, 0, 7, 9, 11), info->backend);
}

/* the entry point the kernels call, through whichever backend the layer chose */
static void test_layer(void) { random_cases(-1, 60); }

/* The reference itself must be able to catch a wrong product: a transposed flag, a wrong beta
 * and a wrong leading dimension are each far outside the bound. */
static void test_reference_catches(void) {
    int64_t M = 23, N = 17, K = 31;
    float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(K * N) * sizeof *B),
          *C = malloc((size_t)(M * M) * sizeof *C); /* M >= N: room for A A^T too */
    for (int64_t i = 0; i < M * K; i++) A[i] = urand(-1, 1);
    for (int64_t i = 0; i < K * N; i++) B[i] = urand(-1, 1);
    adt_gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    double ref = 0.0;
    for (int64_t k = 0; k < K; k++) ref += (double)A[k] * B[k * N];
    CHECK(fabs(C[0] - ref) < 1e-5, "C[0,0] = %g, the double product %g", C[0], ref);
    /* the same call with B read as transposed differs from the reference */
    adt_gemm(0, 1, M, M, K, 1.0f, A, K, A, K, 0.0f, C, M); /* A A^T: symmetric */
    double asym = 0.0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < M; j++) asym = fmax(asym, fabs(C[i * M + j] - C[j * M + i]));
    CHECK(asym < 1e-5, "A A^T is not symmetric: %g", asym);
    free(A), free(B), free(C);
}

/* The momentum fold's premise (adt_gemm_acc_exact): where the rule says so, the beta = 1
 * product is bitwise C + (the beta = 0 product), for the layer (b < 0: whatever runs each shape)
 * and for each backend on its own rule. */
static void acc_exact_cases(int b) {
    int checked = 0;
    for (int c = 0; c < 200; c++) {
        int64_t M = irand(1, c % 4 == 0 ? 3 : 200), N = irand(1, c % 5 == 0 ? 3 : 200), K = irand(1, 300);
        int ta = (int)irand(0, 1), tb = (int)irand(0, 1);
        if (b < 0 ? !adt_gemm_acc_exact(M, N, K) : !adt_gemm_acc_exact_with((adt_gemm_backend)b, M, N, K)) continue;
        checked++;
        float *A = malloc((size_t)(M * K) * sizeof *A), *B = malloc((size_t)(K * N) * sizeof *B);
        float *C = malloc((size_t)(M * N) * sizeof *C), *P = malloc((size_t)(M * N) * sizeof *P),
              *F = malloc((size_t)(M * N) * sizeof *F);
        for (int64_t i = 0; i < M * K; i++) A[i] = urand(-1, 1);
        for (int64_t i = 0; i < K * N; i++) B[i] = urand(-1, 1);
        for (int64_t i = 0; i < M * N; i++) F[i] = C[i] = urand(-3, 3);
        if (b < 0) {
            adt_gemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, P, N);
            adt_gemm(ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 1.0f, F, N);
        } else {
            adt_gemm_with((adt_gemm_backend)b, ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 0.0f, P, N);
            adt_gemm_with((adt_gemm_backend)b, ta, tb, M, N, K, 1.0f, A, ta ? M : K, B, tb ? K : N, 1.0f, F, N);
        }
        int64_t bad = 0;
        for (int64_t i = 0; i < M * N; i++) bad += F[i] != C[i] + P[i];
        CHECK(bad == 0, "%s %lldx%lldx%lld %c%c: %lld elements of C + AB differ from C + (AB) (seed %llu)",
              b < 0 ? "adt_gemm" : adt_gemm_backend_str((adt_gemm_backend)b), (long long)M, (long long)N, (long long)K, ta ? 'T' : 'N', tb ? 'T' : 'N',
              (long long)bad, (unsigned long long)g_seed);
        free(A), free(B), free(C), free(P), free(F);
    }
    CHECK(checked > 50, "only %d shapes were in the rule's domain", checked);
}

static void test_acc_exact(void) {
    acc_exact_cases(-1);
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) {
        acc_exact_cases(b);
        CHECK(!adt_gemm_acc_exact_with((adt_gemm_backend)b, 8, 8, 257), "%s: past one block of the inner dimension",
              adt_gemm_backend_str((adt_gemm_backend)b));
    }
    CHECK(!adt_gemm_acc_exact(8, 8, 257), "past one block of the inner dimension it cannot hold");
}

/* The matmul primitive's table fills up (256 entries); a shape past it runs dnnl_sgemm. Its plain
 * and accumulating forms must still run the same kernel, or C + AB stops being C + (AB) bitwise
 * for a shape whose plain form took the last slot. In a fresh process (`test_gemm --table-full`,
 * its table empty): 300 shapes' plain products first (the table fills among them), then their
 * accumulating ones; it prints how many shapes differ. */
static int child_table_full(void) {
    enum { SHAPES = 300, N = 190, K = 33 }; /* x W^T, where the two kernels round apart */
    const size_t stride = (size_t)(SHAPES + 1) * N;
    float *A = malloc((SHAPES + 1) * K * sizeof *A), *B = malloc(N * K * sizeof *B), *C = malloc(stride * sizeof *C),
          *P = malloc(SHAPES * stride * sizeof *P), *F = malloc(stride * sizeof *F);
    if (!A || !B || !C || !P || !F) return 3;
    for (int i = 0; i < (SHAPES + 1) * K; i++) A[i] = urand(-1, 1);
    for (int i = 0; i < N * K; i++) B[i] = urand(-1, 1);
    for (size_t i = 0; i < stride; i++) C[i] = urand(-3, 3);
    for (int s = 0; s < SHAPES; s++) /* M = s + 2 rows: a shape of its own */
        adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, 1, s + 2, N, K, 1.0f, A, K, B, K, 0.0f, P + s * stride, N);
    int bad = 0;
    for (int s = 0; s < SHAPES; s++) {
        memcpy(F, C, (size_t)(s + 2) * N * sizeof *F);
        adt_gemm_with(ADT_GEMM_ONEDNN_MATMUL, 0, 1, s + 2, N, K, 1.0f, A, K, B, K, 1.0f, F, N);
        for (int i = 0; i < (s + 2) * N; i++)
            if (F[i] != C[i] + P[s * stride + i]) {
                bad++;
                break;
            }
    }
    printf("%d\n", bad);
    free(A), free(B), free(C), free(P), free(F);
    return 0;
}

static void test_matmul_table_full(void) {
    char cmd[1100], out[64] = "";
    snprintf(cmd, sizeof cmd, "'%s' --table-full", g_self);
    FILE *p = popen(cmd, "r");
    size_t k = p ? fread(out, 1, sizeof out - 1, p) : 0;
    out[k] = 0;
    int st = p ? pclose(p) : -1, bad = -1;
    CHECK(st == 0 && sscanf(out, "%d", &bad) == 1 && bad == 0,
          "%s shapes' accumulating products are not C + (their plain ones) bitwise (exit %d)", out, st);
}

/* adt_gemm_set_threads reaches the OpenMP team oneDNN sizes by, on this thread and on one that
 * has never called OpenMP. */
static void *thread_product(void *arg) {
    float a[4] = {1, 2, 3, 4}, b[4] = {1, 0, 0, 1}, c[4];
    adt_gemm_with(ADT_GEMM_ONEDNN, 0, 0, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    *(int *)arg = omp_get_max_threads() * (c[0] == 1 && c[3] == 4);
    return NULL;
}

static void test_threads(void) {
    adt_gemm_set_threads(3);
    int here = 0, there = 0;
    thread_product(&here);
    pthread_t t;
    pthread_create(&t, NULL, thread_product, &there);
    pthread_join(t, NULL);
    CHECK(here == 3, "this thread's OpenMP team after a oneDNN product: %d, not 3", here);
    CHECK(there == 3, "a new thread's OpenMP team after a oneDNN product: %d, not 3", there);
    adt_gemm_set_threads(1);
    thread_product(&here);
    CHECK(here == 1, "after set_threads(1): %d", here);
    random_cases(ADT_GEMM_ONEDNN, 10);
}

/* ---- the automatic choice ------------------------------------------------------------------ */

/* adt_gemm_choose on made-up rates, against scores worked out by hand: backend 2 is fast on
 * plain products and slow on accumulating ones, backend 1 even on both, backend 0 slow on both.
 * One step's products (the others' shares 0) are mostly accumulating, then mostly plain. */
static void test_choose(void) {
    adt_gemm_shape sh[ADT_GEMM_PROBE_SHAPES] = {{0}};
    adt_gemm_info in = {0};
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) in.check_ok[b] = 1;
    for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++) {
        in.rate[0][i] = in.rate_acc[0][i] = 90.0;
        in.rate[1][i] = in.rate_acc[1][i] = 150.0;
        in.rate[2][i] = 200.0, in.rate_acc[2][i] = 100.0;
    }
    double score[ADT_GEMM_N_BACKENDS];
    /* accumulating dominates: 2 costs 0.2/200 + 0.8/100 = 9 ms per GFLOP, 1 costs 1/150 = 6.67 */
    sh[0].share_plain = 0.2, sh[1].share_acc = 0.8;
    CHECK(adt_gemm_choose(&in, sh, score) == ADT_GEMM_ONEDNN, "mostly accumulating: chose %d", (int)adt_gemm_choose(&in, sh, NULL));
    CHECK(fabs(score[2] - 0.009) < 1e-12 && fabs(score[1] - 1.0 / 150) < 1e-12 && fabs(score[0] - 1.0 / 90) < 1e-12,
          "scores %g %g %g", score[0], score[1], score[2]);
    /* plain dominates: 2 costs 0.8/200 + 0.2/100 = 6 ms, 1 still 6.67 */
    sh[0].share_plain = 0.8, sh[1].share_acc = 0.2;
    CHECK(adt_gemm_choose(&in, sh, score) == ADT_GEMM_ONEDNN_MATMUL && fabs(score[2] - 0.006) < 1e-12,
          "mostly plain: chose %d, score %g", (int)adt_gemm_choose(&in, sh, NULL), score[2]);
    /* a rate where the share is 0 does not count; one missing where the share is not, does */
    in.rate_acc[2][5] = 0.0;
    CHECK(adt_gemm_choose(&in, sh, NULL) == ADT_GEMM_ONEDNN_MATMUL, "an unused form's missing rate counted");
    in.rate_acc[2][1] = 0.0;
    CHECK(adt_gemm_choose(&in, sh, score) == ADT_GEMM_ONEDNN && isinf(score[2]), "a missing rate: score %g", score[2]);
    /* the fastest backend failing its check is never chosen; none passing means OpenBLAS */
    in.rate_acc[2][1] = 100.0, in.check_ok[2] = 0;
    CHECK(adt_gemm_choose(&in, sh, score) == ADT_GEMM_ONEDNN && isinf(score[2]), "a failed backend: score %g", score[2]);
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) in.check_ok[b] = 0;
    CHECK(adt_gemm_choose(&in, sh, NULL) == ADT_GEMM_OPENBLAS, "no backend passed");
    /* two steps count per GFLOP each: backend 2 wins the first by 10% and loses the second by
     * 30%; how many shapes or multiply-adds each step has does not enter */
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) in.check_ok[b] = 1;
    memset(sh, 0, sizeof sh);
    for (int i = 0; i < 6; i++) sh[i].share_plain = 1.0 / 6, in.rate[1][i] = 100.0, in.rate[2][i] = 110.0;
    sh[6].share_acc = 1.0, in.rate_acc[1][6] = 100.0, in.rate_acc[2][6] = 100.0 / 1.3;
    CHECK(adt_gemm_choose(&in, sh, NULL) == ADT_GEMM_ONEDNN, "the step of one shape did not count as one step");

    /* the probe's own table: two steps, each's shares summing to 1, every shape standing for some */
    const adt_gemm_shape *p = adt_gemm_probe_shapes();
    double sum_gpt = 0.0, sum_mlp = 0.0;
    for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++) {
        CHECK(p[i].share_plain + p[i].share_acc > 0 && p[i].M > 0 && p[i].N > 0 && p[i].K > 0, "probe shape %d", i);
        if (!strcmp(p[i].step, "gpt-s")) sum_gpt += p[i].share_plain + p[i].share_acc;
        else if (!strcmp(p[i].step, "mlp")) sum_mlp += p[i].share_plain + p[i].share_acc;
        else CHECK(0, "probe shape %d of step %s", i, p[i].step);
    }
    CHECK(fabs(sum_gpt - 1) < 1e-3 && fabs(sum_mlp - 1) < 1e-3, "shares sum to %g (gpt-s), %g (mlp)", sum_gpt, sum_mlp);
}

/* ---- cache and ADT_GEMM ------------------------------------------------------------------ */

static char g_cache_home[512];

static void env_set(const char *k, const char *v) {
    if (v) setenv(k, v, 1);
    else unsetenv(k);
}

/* A cache file for `key`: each backend's check and rates (one number for every shape and form
 * of a backend), in format `version` (0: none, as the layers before it wrote). Spoilers for
 * the corrupt cases: first, when not NULL, replaces OpenBLAS's first plain rate ("" drops it);
 * acc = 0 leaves out the accumulating rates. */
static void cache_text(char *buf, size_t n, const char *key, int version, const int ok[3], const double rate[3],
                       const char *first, int acc) {
    char r[3][256], ver[32] = "";
    for (int b = 0; b < 3; b++) {
        int o = 0;
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++) {
            if (b == 0 && i == 0 && first) {
                o += snprintf(r[b] + o, sizeof r[b] - (size_t)o, "%s%s", first, *first ? "," : "");
                continue;
            }
            o += snprintf(r[b] + o, sizeof r[b] - (size_t)o, "%g%s", rate[b], i + 1 < ADT_GEMM_PROBE_SHAPES ? "," : "");
        }
    }
    if (version) snprintf(ver, sizeof ver, "\"version\": %d, ", version);
    int o = snprintf(buf, n,
                     "{%s\"key\": \"%s\", \"check\": {\"openblas\": %s, \"onednn\": %s, \"onednn-matmul\": %s}, "
                     "\"gflops\": {\"openblas\": [%s], \"onednn\": [%s], \"onednn-matmul\": [%s]}",
                     ver, key, ok[0] ? "true" : "false", ok[1] ? "true" : "false", ok[2] ? "true" : "false", r[0], r[1],
                     r[2]);
    if (acc)
        o += snprintf(buf + o, n - (size_t)o,
                      ", \"gflops_acc\": {\"openblas\": [%s], \"onednn\": [%s], \"onednn-matmul\": [%s]}", r[0],
                      r[1], r[2]);
    snprintf(buf + o, n - (size_t)o, "}");
}

static void test_cache(void) {
    char *old_gemm = getenv("ADT_GEMM") ? strdup(getenv("ADT_GEMM")) : NULL;
    env_set("ADT_GEMM", NULL);
    env_set("XDG_CACHE_HOME", g_cache_home);
    adt_gemm_info a, b;
    char want[1200];
    snprintf(want, sizeof want, "%s/adtrain/gemm-", g_cache_home);
    char first[1024];
    if (adt_gemm_cache_path(first, sizeof first, adt_gemm_get_info()->key) == 0) unlink(first); /* main's choice */
    CHECK(adt_gemm_select(&a, 1) == 0, "%s", adt_error_message());
    CHECK(!strcmp(a.cache_path, first), "cache path %s, expected %s", a.cache_path, first);
    CHECK(!strncmp(a.cache_path, want, strlen(want)), "cache path %s not under %s", a.cache_path, want);
    CHECK(!a.from_cache && !a.forced, "a first select measured (from_cache %d)", a.from_cache);
    CHECK(a.check_ok[0] && a.check_ok[1], "checks %d %d", a.check_ok[0], a.check_ok[1]);
    for (int k = 0; k < ADT_GEMM_N_BACKENDS; k++)
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++)
            CHECK(a.rate[k][i] > 0 && a.rate_acc[k][i] > 0, "rate[%d][%d] = %g, accumulating %g", k, i, a.rate[k][i],
                  a.rate_acc[k][i]);
    CHECK(a.backend == adt_gemm_choose(&a, adt_gemm_probe_shapes(), NULL), "the probe's backend is not its rates' choice");
    struct stat st;
    CHECK(stat(a.cache_path, &st) == 0 && st.st_size > 0, "no cache file at %s", a.cache_path);

    /* read back: the same decision and rates, no measuring */
    CHECK(adt_gemm_select(&b, 1) == 0, "%s", adt_error_message());
    CHECK(b.from_cache, "the second select did not use the cache");
    CHECK(b.backend == a.backend, "cached choice %d, measured %d", b.backend, a.backend);
    for (int k = 0; k < ADT_GEMM_N_BACKENDS; k++)
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++)
            CHECK(fabs(b.rate[k][i] - a.rate[k][i]) <= 1e-12 * a.rate[k][i] &&
                      fabs(b.rate_acc[k][i] - a.rate_acc[k][i]) <= 1e-12 * a.rate_acc[k][i],
                  "rate[%d][%d] read back as %.17g / %.17g, written %.17g / %.17g", k, i, b.rate[k][i], b.rate_acc[k][i],
                  a.rate[k][i], a.rate_acc[k][i]);

    /* corrupt files: each refused by the reader; select then measures again (no error) and
     * rewrites the file valid, shown on the format-1 file that every machine holds after an
     * upgrade (one path in select, whatever the reason; a probe costs about a second, so not on
     * every case) */
    const char *bad[] = {
        "",
        "{",
        "not json at all",
        "[1, 2, 3]",
        "{\"key\": \"another machine\", \"check\": {\"openblas\": true, \"onednn\": true}, "
        "\"gflops\": {\"openblas\": [1,1,1,1], \"onednn\": [1,1,1,1]}}",
        NULL, /* right key, a negative rate */
        NULL, /* right key, a rate missing */
        NULL, /* right key, no accumulating rates */
        NULL, /* right key and rates, format 1 (no version: a layer that timed no accumulating form) */
        NULL, /* right key and rates, a later format */
    };
    const int all_ok[3] = {1, 1, 1};
    const double ones[3] = {1, 1, 1};
    { /* the cases below spoil this file, which as written is valid */
        char text[4096];
        cache_text(text, sizeof text, a.key, ADT_GEMM_CACHE_VERSION, all_ok, ones, NULL, 1);
        adt_gemm_info r;
        CHECK(check_write_file(a.cache_path, text, strlen(text)) == 0 && adt_gemm_cache_read(a.cache_path, a.key, &r) == 0,
              "the unspoilt file: %s", adt_error_message());
    }
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        char text[4096];
        if (c >= 5) {
            const int version[] = {ADT_GEMM_CACHE_VERSION, ADT_GEMM_CACHE_VERSION, ADT_GEMM_CACHE_VERSION, 0,
                                   ADT_GEMM_CACHE_VERSION + 1};
            cache_text(text, sizeof text, a.key, version[c - 5], all_ok, ones, c == 5 ? "-4" : c == 6 ? "" : NULL,
                       c != 7);
        } else {
            snprintf(text, sizeof text, "%s", bad[c]);
        }
        CHECK(check_write_file(a.cache_path, text, strlen(text)) == 0, "cannot write %s", a.cache_path);
        adt_gemm_info r;
        CHECK(adt_gemm_cache_read(a.cache_path, a.key, &r) < 0, "corrupt file %zu read as valid", c);
        if (c != 8) continue;
        CHECK(adt_gemm_select(&b, 1) == 0, "corrupt file %zu: %s", c, adt_error_message());
        CHECK(!b.from_cache, "corrupt file %zu was used", c);
        CHECK(adt_gemm_cache_read(a.cache_path, a.key, &r) == 0, "corrupt file %zu not rewritten: %s", c,
              adt_error_message());
    }
    /* a hand-made valid file decides: oneDNN failing its checks means OpenBLAS, whatever the rates */
    char text[4096];
    const int blas_only[3] = {1, 0, 0};
    cache_text(text, sizeof text, a.key, ADT_GEMM_CACHE_VERSION, blas_only, (const double[3]){10, 0, 0}, NULL, 1);
    check_write_file(a.cache_path, text, strlen(text));
    CHECK(adt_gemm_select(&b, 1) == 0 && b.from_cache && b.backend == ADT_GEMM_OPENBLAS, "from_cache %d backend %d",
          b.from_cache, b.backend);
    cache_text(text, sizeof text, a.key, ADT_GEMM_CACHE_VERSION, all_ok, (const double[3]){10, 20, 15}, NULL, 1);
    check_write_file(a.cache_path, text, strlen(text));
    CHECK(adt_gemm_select(&b, 1) == 0 && b.from_cache && b.backend == ADT_GEMM_ONEDNN, "from_cache %d backend %d",
          b.from_cache, b.backend);
    /* the file's "auto" is a note for readers: the rates decide, by the probe's shares */
    double shares = 0.0;
    for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++)
        shares += adt_gemm_probe_shapes()[i].share_plain + adt_gemm_probe_shapes()[i].share_acc;
    CHECK(fabs(b.score[1] - shares / 20) < 1e-12 && fabs(b.score[2] - shares / 15) < 1e-12,
          "scores of the cached rates: %g, %g, expected %g, %g", b.score[1], b.score[2], shares / 20, shares / 15);

    /* an unwritable cache directory is not fatal */
    char blocked[600];
    snprintf(blocked, sizeof blocked, "%s/blocked", g_cache_home);
    check_write_file(blocked, "x", 1); /* a file where the directory should be */
    env_set("XDG_CACHE_HOME", blocked);
    CHECK(adt_gemm_select(&b, 1) == 0 && !b.from_cache, "unwritable cache: %s", adt_error_message());
    unlink(blocked);
    /* a relative XDG_CACHE_HOME is not a cache directory (XDG): $HOME's .cache is used */
    env_set("XDG_CACHE_HOME", "relative/dir");
    char path[1024], home_want[600];
    snprintf(home_want, sizeof home_want, "%s/.cache/adtrain/", getenv("HOME") ? getenv("HOME") : "");
    if (getenv("HOME") && getenv("HOME")[0] == '/')
        CHECK(adt_gemm_cache_path(path, sizeof path, "k") == 0 && !strncmp(path, home_want, strlen(home_want)),
              "relative XDG_CACHE_HOME gave %s", path);
    env_set("XDG_CACHE_HOME", g_cache_home);
    env_set("ADT_GEMM", old_gemm);
    free(old_gemm);
}

static void test_env(void) {
    char *old_gemm = getenv("ADT_GEMM") ? strdup(getenv("ADT_GEMM")) : NULL;
    adt_gemm_info a;
    env_set("ADT_GEMM", "onednn");
    CHECK(adt_gemm_select(&a, 1) == 0 && a.forced && a.backend == ADT_GEMM_ONEDNN, "forced onednn: %d %d", a.forced,
          a.backend);
    env_set("ADT_GEMM", "openblas");
    CHECK(adt_gemm_select(&a, 1) == 0 && a.forced && a.backend == ADT_GEMM_OPENBLAS, "forced openblas: %d %d",
          a.forced, a.backend);
    CHECK(!a.per_shape, "a forced backend runs every shape");
    env_set("ADT_GEMM", "auto");
    CHECK(adt_gemm_select(&a, 1) == 0 && !a.forced && a.per_shape, "auto: forced %d, per shape %d", a.forced,
          a.per_shape);
    env_set("ADT_GEMM", "");
    CHECK(adt_gemm_select(&a, 1) == 0 && !a.forced && a.per_shape, "empty is auto");
    env_set("ADT_GEMM", "onednn-matmul");
    CHECK(adt_gemm_select(&a, 1) == 0 && a.forced && a.backend == ADT_GEMM_ONEDNN_MATMUL, "forced onednn-matmul: %d %d",
          a.forced, a.backend);
    const char *bad[] = {"mkl", "OneDNN", "openblas ", "1", "onednn-", "tune"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        env_set("ADT_GEMM", bad[i]);
        int forced = 5, per_shape = 5;
        CHECK(adt_gemm_env(&forced, &per_shape) == ADT_ERR_ARG, "ADT_GEMM=%s accepted", bad[i]);
        CHECK(adt_gemm_select(&a, 1) == ADT_ERR_ARG, "ADT_GEMM=%s accepted by select", bad[i]);
        const char *m = adt_error_message();
        CHECK(strstr(m, "ADT_GEMM") && strstr(m, "openblas") && strstr(m, "onednn") && strstr(m, "auto"),
              "message: %s", m);
    }
    env_set("ADT_GEMM", old_gemm);
    free(old_gemm);
}

/* ---- the routes file: one choice per shape for every process of the machine ---------------- */


/* The child's part: `test_gemm --route M N K` runs one C = A B of that shape through adt_gemm
 * and prints the backend it ran (adt_gemm_route). */
static int child_route(char **argv) {
    int64_t M = atoll(argv[2]), N = atoll(argv[3]), K = atoll(argv[4]);
    float *A = calloc((size_t)(M * K), sizeof *A), *B = calloc((size_t)(K * N), sizeof *B),
          *C = calloc((size_t)(M * N), sizeof *C);
    if (!A || !B || !C) return 3;
    adt_gemm(0, 0, M, N, K, 1.0f, A, K, B, N, 0.0f, C, N);
    printf("%d\n", adt_gemm_route(0, 0, M, N, K));
    free(A), free(B), free(C);
    return 0;
}

/* The backend a child process ran for M x N x K (NN), or -2 if it failed. */
static int route_in_child(int64_t M, int64_t N, int64_t K) {
    char cmd[1400], out[256];
    snprintf(cmd, sizeof cmd, "'%s' --route %lld %lld %lld", g_self, (long long)M, (long long)N, (long long)K);
    FILE *p = popen(cmd, "r");
    if (!p) return -2;
    size_t k = fread(out, 1, sizeof out - 1, p);
    out[k] = 0;
    int st = pclose(p), r = -2;
    if (!WIFEXITED(st) || WEXITSTATUS(st) || sscanf(out, "%d", &r) != 1) return -2;
    return r;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char *s = calloc(1, 1 << 20);
    size_t n = s ? fread(s, 1, (1 << 20) - 1, f) : 0;
    (void)n;
    fclose(f);
    return s;
}

/* How many lines of text are exactly `line` (without its newline). */
static int count_lines(const char *text, const char *line) {
    int n = 0;
    size_t len = strlen(line);
    for (const char *p = text; p && *p;) {
        const char *nl = strchr(p, '\n');
        size_t l = nl ? (size_t)(nl - p) : strlen(p);
        if (l == len && !strncmp(p, line, len)) n++;
        p = nl ? nl + 1 : NULL;
    }
    return n;
}

static void test_route_parse(void) {
    adt_gemm_route_entry e;
    CHECK(adt_gemm_route_parse("1024 256 768 1 0 2 onednn-matmul", "f.routes:3", &e) == 0, "%s", adt_error_message());
    CHECK(e.M == 1024 && e.N == 256 && e.K == 768 && e.ta == 1 && e.tb == 0 && e.threads == 2 &&
              e.backend == ADT_GEMM_ONEDNN_MATMUL,
          "parsed %lld %lld %lld %d %d %d %d", (long long)e.M, (long long)e.N, (long long)e.K, e.ta, e.tb, e.threads,
          e.backend);
    const char *bad[] = {"",
                         "1024 256 768 1 0 2",
                         "1024 256 768 1 0 2 cublas",
                         "1024 256 768 2 0 2 onednn",
                         "0 256 768 0 0 1 onednn",
                         "1024 -1 768 0 0 1 onednn",
                         "1024 256 768 0 0 -1 onednn",
                         "1024 256 768 0 0 1 onednn extra",
                         "1024 256 768 0 0 1 onednn ",
                         "99999999999999 1 1 0 0 1 openblas",
                         "1024 256 768.5 0 0 1 onednn"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int rc = adt_gemm_route_parse(bad[i], "f.routes:3", &e);
        CHECK(rc == ADT_ERR_FORMAT && !strncmp(adt_error_message(), "f.routes:3: ", 12), "\"%s\": rc %d, %s", bad[i], rc,
              adt_error_message());
    }
    char path[1100];
    CHECK(adt_gemm_routes_path(path, sizeof path, "/c/adtrain/gemm-0123.json") == 0 &&
              !strcmp(path, "/c/adtrain/gemm-0123.routes"),
          "routes path %s", path);
    CHECK(adt_gemm_routes_path(path, sizeof path, "/c/adtrain/gemm") != 0, "a cache path without .json accepted");
}

/* Child processes (auto, this test's cache directory) run the backend the routes file names for
 * a shape, the first valid line of it, whatever their own timing would say; they time a shape
 * the file lacks and append it once, even when three of them meet it at once; a torn last line
 * is passed over and closed so that it cannot read as valid; a file of another machine is
 * begun anew. */
static void test_route_file(void) {
    char *old_gemm = getenv("ADT_GEMM") ? strdup(getenv("ADT_GEMM")) : NULL;
    env_set("ADT_GEMM", NULL);
    env_set("XDG_CACHE_HOME", g_cache_home);
    adt_gemm_info info;
    CHECK(adt_gemm_select(&info, 1) == 0 && info.per_shape && !info.forced, "auto: per shape %d", info.per_shape);
    char path[1100], head[700], line[128];
    CHECK(adt_gemm_routes_path(path, sizeof path, info.cache_path) == 0, "%s", adt_error_message());
    snprintf(head, sizeof head, "adtrain-gemm-routes %d %s\n", ADT_GEMM_ROUTES_VERSION, info.key);

    /* each passing backend named for a shape of its own; 70^3 named twice (the first decides) */
    FILE *f = fopen(path, "w");
    CHECK(f != NULL, "cannot write %s", path);
    if (!f) goto out;
    fputs(head, f);
    fputs("garbage\n64 64 64 0 0 0 cublas\n\n", f);
    int named[ADT_GEMM_N_BACKENDS], n_named = 0, second = -1;
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++)
        if (info.check_ok[b]) {
            fprintf(f, "64 %d 64 0 0 0 %s\n", 64 + b, adt_gemm_backend_str((adt_gemm_backend)b));
            named[n_named++] = b;
        }
    CHECK(n_named >= 2, "only %d backends passed their check", n_named);
    if (n_named >= 2) {
        second = named[1];
        fprintf(f, "70 70 70 0 0 0 %s\n70 70 70 0 0 0 %s\n", adt_gemm_backend_str((adt_gemm_backend)named[1]),
                adt_gemm_backend_str((adt_gemm_backend)named[0]));
    }
    fputs("80 80 80 0 0 0 onednn", f); /* torn: no newline */
    fclose(f);
    for (int i = 0; i < n_named; i++) {
        int r = route_in_child(64, 64 + named[i], 64);
        CHECK(r == named[i], "64x%dx64: the child ran %d, the file names %d", 64 + named[i], r, named[i]);
    }
    if (second >= 0) CHECK(route_in_child(70, 70, 70) == second, "70^3: not the first line's backend");
    int torn = route_in_child(80, 80, 80);
    CHECK(torn >= 0 && torn < ADT_GEMM_N_BACKENDS && info.check_ok[torn], "80^3 (torn line): route %d", torn);
    char *text = slurp(path);
    CHECK(text && !strncmp(text, head, strlen(head)), "the header was not kept");
    snprintf(line, sizeof line, "80 80 80 0 0 0 %s", adt_gemm_backend_str((adt_gemm_backend)torn));
    CHECK(text && count_lines(text, line) == 1 && count_lines(text, "80 80 80 0 0 0 onednn torn") == 1,
          "the torn line and the appended one: %s", text ? text : "(no file)");
    CHECK(text && count_lines(text, "garbage") == 1, "a line that does not parse was removed");
    free(text);

    /* three processes meet a new shape at once: one times it, all run its choice, one line */
    char cmd[4000];
    snprintf(cmd, sizeof cmd,
             "for i in 1 2 3; do '%s' --route 512 512 512 > '%s'/route.$i & done; wait", g_self, g_cache_home);
    CHECK(system(cmd) == 0, "%s", cmd);
    int got[3] = {-2, -2, -2};
    for (int i = 0; i < 3; i++) {
        char p[1100];
        snprintf(p, sizeof p, "%s/route.%d", g_cache_home, i + 1);
        char *s = slurp(p);
        if (s && sscanf(s, "%d", &got[i]) != 1) got[i] = -2;
        free(s);
        unlink(p);
    }
    CHECK(got[0] >= 0 && got[0] == got[1] && got[1] == got[2], "concurrent routes %d %d %d", got[0], got[1], got[2]);
    text = slurp(path);
    int lines512 = 0;
    for (int b = 0; b < ADT_GEMM_N_BACKENDS; b++) {
        snprintf(line, sizeof line, "512 512 512 0 0 0 %s", adt_gemm_backend_str((adt_gemm_backend)b));
        lines512 += text ? count_lines(text, line) : 0;
    }
    CHECK(lines512 == 1, "512^3 has %d lines", lines512);
    free(text);

    /* another machine's file (its key in the header) is begun anew */
    f = fopen(path, "w");
    if (f) {
        fputs("adtrain-gemm-routes 1 another machine\n96 96 96 0 0 0 openblas\n", f);
        fclose(f);
    }
    int r = route_in_child(96, 96, 96);
    text = slurp(path);
    snprintf(line, sizeof line, "96 96 96 0 0 0 %s", r >= 0 ? adt_gemm_backend_str((adt_gemm_backend)r) : "?");
    CHECK(r >= 0 && text && !strncmp(text, head, strlen(head)) && count_lines(text, line) == 1 &&
              !strstr(text, "another machine"),
          "a foreign file: route %d, %s", r, text ? text : "(none)");
    free(text);
out:
    env_set("ADT_GEMM", old_gemm);
    free(old_gemm);
}

/* The CLI refuses a bad ADT_GEMM for any command, and --version names the backend it runs. */
static void test_cli(void) {
    char out[4096];
    char *old_gemm = getenv("ADT_GEMM") ? strdup(getenv("ADT_GEMM")) : NULL;
    env_set("ADT_GEMM", "cublas");
    int rc = run_adtrain("--version", out, sizeof out);
    CHECK(rc == 2, "exit %d for ADT_GEMM=cublas: %s", rc, out);
    CHECK(contains(out, "ADT_GEMM=cublas") && contains(out, "auto (the default") && contains(out, "onednn-matmul"), "%s", out);
    rc = run_adtrain("status --help", out, sizeof out);
    CHECK(rc == 2 && contains(out, "ADT_GEMM"), "status with a bad ADT_GEMM: exit %d: %s", rc, out);
    const char *names[] = {"openblas", "onednn", "onednn-matmul"};
    for (int b = 0; b < 3; b++) {
        env_set("ADT_GEMM", names[b]);
        rc = run_adtrain("--version", out, sizeof out);
        char want[64];
        snprintf(want, sizeof want, "gemm %s: ", names[b]);
        CHECK(rc == 0 && contains(out, want) && contains(out, "(ADT_GEMM)"), "exit %d: %s", rc, out);
    }
    env_set("ADT_GEMM", "auto");
    rc = run_adtrain("--version", out, sizeof out);
    CHECK(rc == 0 && contains(out, "chosen by the") && contains(out, "gemm probe: ms per GFLOP") &&
              contains(out, " onednn-matmul "),
          "exit %d: %s", rc, out);
    env_set("ADT_GEMM", old_gemm);
    free(old_gemm);
}

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--route")) return child_route(argv);
    if (argc == 2 && !strcmp(argv[1], "--table-full")) return child_table_full();
    ssize_t self = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (self > 0) g_self[self] = 0;
    const char *s = getenv("ADT_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    g_state = g_seed;
    cli_find_binary();
    if (check_tmpdir_make("gemm")) return 1;
    snprintf(g_cache_home, sizeof g_cache_home, "%s", check_tmpdir());
    /* a private cache, for the layer's own choice and the CLI runs below too */
    setenv("XDG_CACHE_HOME", g_cache_home, 1);
    fprintf(stderr, "test_gemm: seed %llu (ADT_TEST_SEED), backend %s\n", (unsigned long long)g_seed,
            adt_gemm_backend_name());
    RUN(test_openblas);
    RUN(test_onednn);
    RUN(test_onednn_matmul);
    RUN(test_routes);
    RUN(test_matmul_threads);
    RUN(test_matmul_concurrent);
    RUN(test_layer);
    RUN(test_reference_catches);
    RUN(test_acc_exact);
    RUN(test_matmul_table_full);
    RUN(test_threads);
    RUN(test_choose);
    RUN(test_cache);
    RUN(test_env);
    RUN(test_route_parse);
    RUN(test_route_file);
    RUN(test_cli);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_cache_home);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", g_cache_home);
    return check_finish();
}
