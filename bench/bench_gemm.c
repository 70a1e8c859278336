/*
 * bench_gemm.c - the GEMM backends side by side on the training steps' own matrix products.
 *
 *   build/bench/bench_gemm [--model gpt-s|mlp|all] [--threads T] [--rounds R]
 *
 * For each model (bench_models.h: GPT-S vocab 65, ctx 128, 4 layers, width 256, 4 heads,
 * batch 8; the MLP 784-1024-1024-10 at batch 128) it builds the training graph and collects every
 * GEMM one step performs (collect_gemms: each matmul node's M, N, K and transposes, forward and
 * both backward products, and the fused attention's per-(batch, head) products at full T x T),
 * then times each backend of the GEMM layer on them: R rounds, each running every backend over
 * every shape (as many calls as the step makes), the backends' order alternating from round to
 * round so that load from other processes falls on all alike. Operands are private buffers of
 * values of order 1, C written with beta = 0.
 *
 * stdout: one JSON line per (model, shape) with each backend's median GFLOP/s and the range over
 * rounds, and one per model with the step's GEMM rate per backend (its matmul FLOPs over the
 * median of the rounds' summed times), the GEMM floor per backend (FLOPs / that rate: the time
 * the step would take doing nothing but its products), the floor of the backend the layer chose
 * (ADT_GEMM or the probe) and the floor if each shape went to its fastest backend. Each figure
 * also in this thread's CPU time (_cpu_: at one thread, the products' own time on a shared
 * machine). A table of the same goes to stderr.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "bench_models.h"

#define NB ADT_GEMM_N_BACKENDS

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* median, min and max of v[0..n) (sorts v) */
static void stats(double *v, int n, double *med, double *lo, double *hi) {
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    *med = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    *lo = v[0], *hi = v[n - 1];
}

/* This thread's CPU time: at one thread the products' own time, without the slices the
 * scheduler gave other processes (the machine may be shared); with more threads it misses the
 * helpers' time, so only the wall-clock figures mean anything there. */
static double thread_cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void fill(float *p, int64_t n, uint64_t key) {
    for (int64_t i = 0; i < n; i++) p[i] = adt_rng_uniform(key, (uint64_t)i) - 0.5f;
}

static int bench_model(const char *name, int rounds, int threads) {
    adt_graph *g = adt_graph_create();
    model_spec spec;
    adt_model_io io;
    adt_model_cfg cfg;
    gemm_list l = {0};
    if (build_model(g, name, 1, &spec, &io, &cfg)) return -1;
    double flops = collect_gemms(g, NULL, &l), mm_flops = adt_graph_matmul_flops(g);
    if (fabs(flops - mm_flops) > 1e-9 * mm_flops)
        fprintf(stderr, "bench_gemm: %s: note: collected GEMMs hold %.0f FLOPs, adt_graph_matmul_flops %.0f\n", name,
                flops, mm_flops);
    int64_t ma = 1, mb = 1, mc = 1;
    for (int i = 0; i < l.n; i++) {
        const gemm_shape *s = &l.s[i];
        if (s->M * s->K > ma) ma = s->M * s->K;
        if (s->K * s->N > mb) mb = s->K * s->N;
        if (s->M * s->N > mc) mc = s->M * s->N;
    }
    float *A = adt_alloc_aligned((size_t)ma * sizeof(float)), *B = adt_alloc_aligned((size_t)mb * sizeof(float)),
          *C = adt_alloc_aligned((size_t)mc * sizeof(float));
    fill(A, ma, 1), fill(B, mb, 2), fill(C, mc, 3);
    /* t[(b * n + i) * rounds + r]: seconds for shape i's calls of one step, backend b, round r;
     * tc the same in this thread's CPU time */
    size_t nt = (size_t)(NB * l.n * rounds);
    double *t = calloc(nt, sizeof *t), *tot = calloc((size_t)(NB * rounds), sizeof *tot);
    double *tc = calloc(nt, sizeof *tc), *totc = calloc((size_t)(NB * rounds), sizeof *totc);
    if (!t || !tot || !tc || !totc) abort();
    for (int r = -1; r < rounds; r++) /* round -1 warms caches and JIT-compiles oneDNN's kernels */
        for (int k = 0; k < NB; k++) {
            int b = (r & 1) ? NB - 1 - k : k;
            for (int i = 0; i < l.n; i++) {
                const gemm_shape *s = &l.s[i];
                double t0 = adt_now_s(), c0 = thread_cpu_s();
                for (int64_t c = 0; c < s->count; c++)
                    adt_gemm_with((adt_gemm_backend)b, s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, s->ta ? s->M : s->K, B,
                                  s->tb ? s->K : s->N, 0.0f, C, s->N);
                double dt = adt_now_s() - t0, dc = thread_cpu_s() - c0;
                if (r >= 0) {
                    t[(b * l.n + i) * rounds + r] = dt, tot[b * rounds + r] += dt;
                    tc[(b * l.n + i) * rounds + r] = dc, totc[b * rounds + r] += dc;
                }
            }
        }
    const adt_gemm_info *gi = adt_gemm_get_info();
    fprintf(stderr, "\n%s: %d GEMM shapes, %.3f GFLOP per step, %d rounds, %d thread(s); GFLOP/s median [min, max]\n",
            name, l.n, flops * 1e-9, rounds, threads);
    fprintf(stderr, "  %-8s %5s %5s %5s %-2s %5s", "phase", "M", "N", "K", "tr", "calls");
    for (int b = 0; b < NB; b++) fprintf(stderr, " %25s %6s", adt_gemm_backend_str((adt_gemm_backend)b), "cpu");
    fprintf(stderr, "\n");
    double best_floor = 0.0;
    for (int i = 0; i < l.n; i++) {
        const gemm_shape *s = &l.s[i];
        double f = 2.0 * (double)(s->count * s->M * s->N * s->K), best = INFINITY;
        printf("{\"bench\": \"gemm\", \"model\": \"%s\", \"phase\": \"%s\", \"M\": %lld, \"N\": %lld, \"K\": %lld, "
               "\"tr\": \"%c%c\", \"calls\": %lld, \"threads\": %d",
               name, s->phase ? "backward" : "forward", (long long)s->M, (long long)s->N, (long long)s->K,
               s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', (long long)s->count, threads);
        fprintf(stderr, "  %-8s %5lld %5lld %5lld %c%c %5lld", s->phase ? "backward" : "forward", (long long)s->M,
                (long long)s->N, (long long)s->K, s->ta ? 'T' : 'N', s->tb ? 'T' : 'N', (long long)s->count);
        for (int b = 0; b < NB; b++) {
            const char *bn = adt_gemm_backend_str((adt_gemm_backend)b);
            double med, lo, hi, cmed, clo, chi;
            stats(t + (b * l.n + i) * rounds, rounds, &med, &lo, &hi);
            stats(tc + (b * l.n + i) * rounds, rounds, &cmed, &clo, &chi);
            if (med < best) best = med;
            /* rates: the fastest round is the highest rate */
            printf(", \"%s_gflops\": %.2f, \"%s_gflops_min\": %.2f, \"%s_gflops_max\": %.2f, \"%s_cpu_gflops\": %.2f, "
                   "\"%s_cpu_gflops_min\": %.2f, \"%s_cpu_gflops_max\": %.2f",
                   bn, f / med * 1e-9, bn, f / hi * 1e-9, bn, f / lo * 1e-9, bn, f / cmed * 1e-9, bn, f / chi * 1e-9, bn,
                   f / clo * 1e-9);
            fprintf(stderr, "  %6.1f [%6.1f, %6.1f] %6.1f", f / med * 1e-9, f / hi * 1e-9, f / lo * 1e-9, f / cmed * 1e-9);
        }
        best_floor += best;
        printf("}\n");
        fprintf(stderr, "\n");
    }
    printf("{\"bench\": \"gemm_step\", \"model\": \"%s\", \"matmul_flops_per_step\": %.0f, \"shapes\": %d, "
           "\"rounds\": %d, \"threads\": %d",
           name, flops, l.n, rounds, threads);
    fprintf(stderr, "  step's GEMMs:");
    double chosen_floor = 0.0;
    double chosen_cpu_floor = 0.0;
    for (int b = 0; b < NB; b++) {
        double med, lo, hi, cmed, clo, chi;
        stats(tot + b * rounds, rounds, &med, &lo, &hi);
        stats(totc + b * rounds, rounds, &cmed, &clo, &chi);
        const char *bn = adt_gemm_backend_str((adt_gemm_backend)b);
        printf(", \"%s_gflops\": %.2f, \"%s_gflops_min\": %.2f, \"%s_gflops_max\": %.2f, \"%s_floor_ms\": %.4f, "
               "\"%s_cpu_gflops\": %.2f, \"%s_cpu_floor_ms\": %.4f",
               bn, flops / med * 1e-9, bn, flops / hi * 1e-9, bn, flops / lo * 1e-9, bn, med * 1e3, bn,
               flops / cmed * 1e-9, bn, cmed * 1e3);
        fprintf(stderr, "\n    %-9s %6.1f GFLOP/s [%6.1f, %6.1f], floor %8.3f ms; in CPU time %6.1f GFLOP/s, floor %8.3f ms",
                bn, flops / med * 1e-9, flops / hi * 1e-9, flops / lo * 1e-9, med * 1e3, flops / cmed * 1e-9,
                cmed * 1e3);
        if (b == (int)gi->backend) chosen_floor = med, chosen_cpu_floor = cmed;
    }
    printf(", \"chosen\": \"%s\", \"chosen_by\": \"%s\", \"gemm_floor_ms\": %.4f, \"gemm_cpu_floor_ms\": %.4f, "
           "\"best_per_shape_floor_ms\": %.4f}\n",
           adt_gemm_backend_name(), gi->forced ? "ADT_GEMM" : gi->from_cache ? "cached probe" : "probe",
           chosen_floor * 1e3, chosen_cpu_floor * 1e3, best_floor * 1e3);
    fprintf(stderr, "\n  GEMM floor (%s, the layer's choice): %.3f ms (CPU time %.3f ms); each shape on its fastest "
            "backend: %.3f ms\n", adt_gemm_backend_name(), chosen_floor * 1e3, chosen_cpu_floor * 1e3, best_floor * 1e3);
    fflush(stdout);
    free(t), free(tot), free(tc), free(totc), free(l.s);
    adt_free_aligned(A), adt_free_aligned(B), adt_free_aligned(C);
    adt_graph_free(g);
    return 0;
}

static void usage(FILE *f) {
    fprintf(f, "usage: bench_gemm [--model gpt-s|mlp|all] [--threads T] [--rounds R]\n"
               "  --model    which step's GEMM shapes (default all)\n"
               "  --threads  threads for every backend (default 1)\n"
               "  --rounds   interleaved rounds, odd (default 9)\n");
}

int main(int argc, char **argv) {
    adt_blas_fix_coretype(argv); /* as the CLI: the kernels adtrain runs */
    const char *model = "all";
    long threads = 1, rounds = 9;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!v) {
            fprintf(stderr, "bench_gemm: %s needs a value\n", f);
            usage(stderr);
            return 2;
        }
        i++;
        if (!strcmp(f, "--model")) {
            if (strcmp(v, "gpt-s") && strcmp(v, "mlp") && strcmp(v, "all")) {
                fprintf(stderr, "bench_gemm: --model expects gpt-s, mlp or all, got '%s'\n", v);
                return 2;
            }
            model = v;
        } else if (!strcmp(f, "--threads") || !strcmp(f, "--rounds")) {
            long x = strtol(v, &end, 10);
            if (!*v || *end || x < 1 || x > 1024) {
                fprintf(stderr, "bench_gemm: %s expects a whole number in [1, 1024], got '%s'\n", f, v);
                return 2;
            }
            *(!strcmp(f, "--threads") ? &threads : &rounds) = x;
        } else {
            fprintf(stderr, "bench_gemm: unknown flag '%s'\n", f);
            usage(stderr);
            return 2;
        }
    }
    if (adt_gemm_init()) {
        fprintf(stderr, "bench_gemm: %s\n", adt_error_message());
        return 2;
    }
    adt_gemm_set_threads((int)threads);
    const adt_gemm_info *gi = adt_gemm_get_info();
    const char *ct = getenv("OPENBLAS_CORETYPE");
    printf("{\"bench\": \"gemm_meta\", \"threads\": %ld, \"rounds\": %ld, \"chosen\": \"%s\", \"key\": \"%s\", "
           "\"openblas\": \"%s\", \"onednn\": \"%s\", \"openblas_coretype\": \"%s\"",
           threads, rounds, adt_gemm_backend_name(), gi->key, adt_gemm_backend_version(ADT_GEMM_OPENBLAS),
           adt_gemm_backend_version(ADT_GEMM_ONEDNN), ct ? ct : "");
    /* the probe the choice rests on (one thread, adt_gemm_probe_shapes; GFLOP/s with beta 0 and
     * with beta 1, and the choice's score, ms per GFLOP of each step summed) */
    for (int b = 0; b < NB; b++) {
        printf(", \"probe_%s\": [", adt_gemm_backend_str((adt_gemm_backend)b));
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++) printf("%s%.1f", i ? ", " : "", gi->rate[b][i]);
        printf("], \"probe_acc_%s\": [", adt_gemm_backend_str((adt_gemm_backend)b));
        for (int i = 0; i < ADT_GEMM_PROBE_SHAPES; i++) printf("%s%.1f", i ? ", " : "", gi->rate_acc[b][i]);
        printf("], \"probe_score_%s\": %.3f", adt_gemm_backend_str((adt_gemm_backend)b),
               isfinite(gi->score[b]) ? gi->score[b] * 1e3 : -1.0);
    }
    printf(", \"probe_s\": %.3f}\n", gi->probe_s);
    int rc = 0;
    if (!strcmp(model, "all") || !strcmp(model, "gpt-s")) rc |= bench_model("gpt-s", (int)rounds, (int)threads);
    if (!strcmp(model, "all") || !strcmp(model, "mlp")) rc |= bench_model("mlp", (int)rounds, (int)threads);
    return rc ? 1 : 0;
}
