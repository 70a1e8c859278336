/*
 * bench_core.c - the core engine's training-step benchmark, the adtrain side of
 * bench/torch_peer.py.
 *
 *   build/bench/bench_core --model gpt-s|mlp|vgg|dlrm|all --threads 1 --warmup 3 --steps 20
 *                          [--gemm-reps 9] [--seed 0] [--profile]
 *   build/bench/bench_core --blas-core
 *
 * Builds the same models as the PyTorch peer (same sizes, batch, initialisation scheme,
 * optimizer and hyperparameters; vgg and dlrm are configs/vgg-mnist.json and
 * configs/dlrm-small.json at batch 64 and 256 with SGD, momentum 0.9, lr 0.01, as the peer), feeds
 * one batch of random data drawn once, and times whole
 * training steps: adt_exec_set_lr_step followed by adt_exec_run (forward, loss, backward and
 * the optimizer update). Prints one JSON line per model on stdout with the peer's fields
 * (framework "adtrain"), plus: blas_config and blas_core (the kernel family OpenBLAS runs),
 * sgemm_gflops, gemm_floor_ms and step_over_floor (below), cpu_ms_median (process
 * CPU time per step: next to the wall time it shows how much of a step went to other
 * processes on a shared machine), the loss after the first and the last step, and max_rss_mib,
 * the process's peak resident set so far (getrusage; with --model all, of every model run up to
 * that line, so measure one model per process to compare it with the peer's).
 *
 * In the same process it then replays every GEMM the step performs - each matmul node's exact
 * M, N, K and transposes, in the form the executor runs it (plain, or accumulating onto its
 * folded bias rows or momentum buffer), and the per-(batch, head) products of the fused
 * attention ops at the full T x T size that the FLOP count assumes - through adt_gemm (the GEMM
 * layer's chosen backend) on private buffers. The
 * replay's FLOP rate (median over --gemm-reps repetitions) gives a GEMM-bound floor for the
 * step, matmul_flops_per_step / rate: the time the step would take if it did nothing but its
 * matrix products, at the speed the GEMM backend reaches on those shapes on this machine right now.
 * step_ms_median / floor then says how far the step is from being GEMM-bound.
 *
 * Like the CLI, the program first lets adt_blas_fix_coretype correct OpenBLAS's fallback to its
 * SSE3 kernels on CPUs newer than the library, so it measures adtrain as it runs. --blas-core
 * prints the kernel family OpenBLAS runs after that correction and exits: bench/run_core.sh
 * hands it to PyTorch too, so that both frameworks run the same GEMM kernels.
 *
 * Under mpiexec (N > 1 ranks) it measures data parallelism instead: the global graph of N times
 * the per-rank batch, partitioned under the data-parallel expert plan (adt_expert_plan "dp", or
 * "zero" with --strategy zero: gradients reduce-scattered, each rank updating its shard), every
 * rank running its part with gradient all-reduces overlapped with the backward pass (or, with
 * --no-overlap, each run where it stands). Each step is timed on rank 0 between barriers, so the
 * slowest rank sets the time, as torch_ddp.py times DDP. Rank 0 prints the JSON line with
 * "world", "batch_per_rank", the aggregate samples_per_s (N x per-rank batch / median step),
 * and the executor's communication counters per step (medians): comm_wait_ms (blocked in waits),
 * comm_flight_ms (collectives in flight), comm_start_ms, comm_poll_ms, and comm_hidden, the
 * fraction of in-flight time not spent blocked (1 - wait / flight over all timed steps); and
 * rank 0's CPU time per step (cpu_ms_median, its run without the closing barrier).
 * --gemm-reps 0 skips the GEMM replay (the DP mode always does).
 *
 * --profile turns on the executor's per-node timers and prints to stderr the top ops by time
 * per step (aggregated by op name and phase) as a mean and as the sum of each node's fastest
 * step (which load from other processes can only make slower), the phase totals, and the
 * matmul nodes grouped by shape next to the replay rate of the same shape. Nodes the executor
 * folds into another node (a bias_add into its matmul) never run and show 0. Timer overhead is
 * two clock reads per node (a few hundred nodes), well below the run-to-run noise, so the JSON
 * line stays valid. Under mpiexec it prints rank 0's local graph (boxing nodes are the waits on
 * its collectives).
 */
#include <cJSON.h>
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "bench_models.h"

/* ---- options ------------------------------------------------------------------------------ */

typedef struct opts {
    const char *model; /* "gpt-s", "mlp" or "all" */
    int threads, warmup, steps, gemm_reps, profile, no_overlap;
    const char *strategy; /* data-parallel mode's expert plan: "dp" or "zero" */
    uint64_t seed;
} opts;

/* Data-parallel mode: the world and this rank (NULL world: one process). */
static adt_comm *g_world;
static int g_rank, g_nranks = 1;

static void usage(FILE *f) {
    fprintf(f, "usage: bench_core [--model gpt-s|mlp|vgg|dlrm|all] [--threads N] [--warmup N] [--steps N]\n"
               "                  [--gemm-reps N] [--seed N] [--profile] [--no-overlap]\n"
               "       mpiexec -n N bench_core ... [--strategy dp|zero]   (data parallel over N ranks)\n"
               "       bench_core --blas-core   (print the OpenBLAS kernel family in use)\n"
               "  defaults: --model all --threads 1 --warmup 3 --steps 20 --gemm-reps 9 --seed 0\n");
}

static int parse_int(const char *flag, const char *s, int min, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min || v > 1000000) {
        fprintf(stderr, "bench_core: %s expects an integer >= %d, got '%s'\n", flag, min, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_args(int argc, char **argv, opts *o) {
    *o = (opts){.model = "all", .strategy = "dp", .threads = 1, .warmup = 3, .steps = 20, .gemm_reps = 9};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--profile")) {
            o->profile = 1;
            continue;
        }
        if (!strcmp(a, "--no-overlap")) {
            o->no_overlap = 1;
            continue;
        }
        if (!strcmp(a, "--blas-core")) {
            printf("%s\n", adt_blas_core_name());
            exit(0);
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "bench_core: %s needs a value\n", a);
            usage(stderr);
            return -1;
        }
        const char *v = argv[++i];
        int rc = 0, seed = 0;
        if (!strcmp(a, "--model")) {
            if (strcmp(v, "gpt-s") && strcmp(v, "mlp") && strcmp(v, "vgg") && strcmp(v, "dlrm") &&
                strcmp(v, "all")) {
                fprintf(stderr, "bench_core: --model expects gpt-s, mlp, vgg, dlrm or all, got '%s'\n", v);
                return -1;
            }
            o->model = v;
        } else if (!strcmp(a, "--strategy")) {
            if (strcmp(v, "dp") && strcmp(v, "zero")) {
                fprintf(stderr, "bench_core: --strategy expects dp or zero, got '%s'\n", v);
                return -1;
            }
            o->strategy = v;
        } else if (!strcmp(a, "--threads")) rc = parse_int(a, v, 1, &o->threads);
        else if (!strcmp(a, "--warmup")) rc = parse_int(a, v, 0, &o->warmup);
        else if (!strcmp(a, "--steps")) rc = parse_int(a, v, 1, &o->steps);
        else if (!strcmp(a, "--gemm-reps")) rc = parse_int(a, v, 0, &o->gemm_reps);
        else if (!strcmp(a, "--seed")) {
            rc = parse_int(a, v, 0, &seed);
            o->seed = (uint64_t)seed;
        } else {
            fprintf(stderr, "bench_core: unknown option '%s'\n", a);
            usage(stderr);
            return -1;
        }
        if (rc) return -1;
    }
    return 0;
}

/* ---- statistics --------------------------------------------------------------------------- */

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Linear interpolation between order statistics (numpy's default, as the peer computes it). */
static double percentile(const double *sorted, int n, double q) {
    double pos = (n - 1) * q / 100.0;
    int lo = (int)floor(pos);
    int hi = lo + 1 < n ? lo + 1 : n - 1;
    return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

static double median_of(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return percentile(v, n, 50);
}

/* CPU seconds of the whole process. At one thread this is the step's own work without the
 * time the scheduler gave to other processes, so wall / CPU shows how loaded the machine was. */
static double cpu_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* The peer prints times rounded to 4 decimals; so do we, so the lines read alike. */
static double round4(double x) { return round(x * 1e4) / 1e4; }

/* One batch of random data, drawn once and reused every step as the peer does, into x and y
 * (the global batch: data parallelism splits it). The GPT's targets are its inputs shifted by
 * one position (idx[:, :-1], idx[:, 1:]). */
static void feed_data(const adt_graph *g, const adt_model_io *io, uint64_t seed, void *xp, void *yp) {
    if (g->values[io->input].dtype == ADT_I32) {
        uint64_t key = adt_rng_key(seed, "bench.gpt.idx");
        int32_t *x = xp, *y = yp;
        int64_t B = g->values[io->input].shape.dim[0];
        for (int64_t b = 0; b < B; b++)
            for (int t = 0; t < GPT_T; t++) {
                uint64_t i = (uint64_t)b * (GPT_T + 1) + (uint64_t)t;
                x[b * GPT_T + t] = (int32_t)(adt_rng_u32(key, i) % GPT_V);
                y[b * GPT_T + t] = (int32_t)(adt_rng_u32(key, i + 1) % GPT_V);
            }
    } else {
        /* Normal inputs; class labels below the logits' width (mlp, vgg), or 0/1 as floats for
         * the DLRM's single logit. */
        uint64_t kx = adt_rng_key(seed, "bench.mlp.x"), ky = adt_rng_key(seed, "bench.mlp.y");
        float *x = xp;
        int64_t nx = adt_value_numel(g, io->input), ny = adt_value_numel(g, io->label);
        for (int64_t i = 0; i < nx; i++) x[i] = adt_rng_normal(kx, (uint64_t)i);
        const adt_shape *ls = &g->values[io->logits].shape;
        uint32_t classes = ls->ndim == 2 ? (uint32_t)ls->dim[1] : 2;
        for (int64_t i = 0; i < ny; i++) {
            uint32_t c = adt_rng_u32(ky, (uint64_t)i) % classes;
            if (g->values[io->label].dtype == ADT_F32) ((float *)yp)[i] = (float)c;
            else ((int32_t *)yp)[i] = (int32_t)c;
        }
    }
}

/* The DLRM's categorical ids: column t a row of table t. */
static void feed_ids(const adt_graph *g, const adt_model_io *io, const adt_model_cfg *cfg, uint64_t seed, int32_t *ids) {
    uint64_t k = adt_rng_key(seed, "bench.dlrm.ids");
    int64_t B = g->values[io->input2].shape.dim[0], T = cfg->dlrm.n_tables;
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            ids[b * T + t] = (int32_t)(adt_rng_u32(k, (uint64_t)(b * T + t)) % (uint32_t)cfg->dlrm.table_rows[t]);
}

/* Peak resident set of this process so far, MiB (ru_maxrss is in KiB on Linux). */
static double max_rss_mib(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) ? NAN : (double)ru.ru_maxrss / 1024.0;
}

/* ---- the step's GEMMs --------------------------------------------------------------------- */

static void fill_small(float *p, int64_t n, uint64_t key) {
    /* values of order 1: no denormals or overflow to slow the replay down */
    for (int64_t i = 0; i < n; i++) p[i] = adt_rng_uniform(key, (uint64_t)i) - 0.5f;
}

/* Replays the list `reps` times (after one untimed pass that warms caches and OpenBLAS's
 * buffers) and returns the median rate in GFLOP/s; each shape's median time lands in med_s.
 * *cpu_rate gets the same rate by process CPU time, which other processes' load disturbs less. */
static double replay_gemms(gemm_list *l, int reps, double *cpu_rate) {
    int64_t ma = 1, mb = 1, mc = 1;
    for (int i = 0; i < l->n; i++) {
        const gemm_shape *s = &l->s[i];
        if (s->M * s->K > ma) ma = s->M * s->K;
        if (s->K * s->N > mb) mb = s->K * s->N;
        if (s->M * s->N > mc) mc = s->M * s->N;
    }
    float *A = adt_alloc_aligned((size_t)ma * sizeof(float));
    float *B = adt_alloc_aligned((size_t)mb * sizeof(float));
    float *Cm = adt_alloc_aligned((size_t)mc * sizeof(float));
    fill_small(A, ma, 1);
    fill_small(B, mb, 2);
    fill_small(Cm, mc, 3); /* what an accumulating product adds onto */
    double *per = calloc((size_t)(l->n * reps), sizeof *per); /* [shape][rep] seconds */
    double *total = calloc((size_t)reps, sizeof *total), *total_cpu = calloc((size_t)reps, sizeof *total_cpu);
    double flops = 0;
    if (!per || !total || !total_cpu) abort();
    for (int r = -1; r < reps; r++) {
        double c0 = cpu_now_s();
        for (int i = 0; i < l->n; i++) {
            const gemm_shape *s = &l->s[i];
            double t0 = adt_now_s();
            for (int64_t c = 0; c < s->count; c++)
                adt_gemm(s->ta, s->tb, s->M, s->N, s->K, 1.0f, A, s->ta ? s->M : s->K, B, s->tb ? s->K : s->N,
                         s->acc ? 1.0f : 0.0f, Cm, s->N);
            double dt = adt_now_s() - t0;
            if (r >= 0) {
                per[i * reps + r] = dt;
                total[r] += dt;
            }
        }
        if (r >= 0) total_cpu[r] = cpu_now_s() - c0;
    }
    for (int i = 0; i < l->n; i++) {
        gemm_shape *s = &l->s[i];
        s->med_s = median_of(per + i * reps, reps);
        flops += 2.0 * (double)(s->count * s->M * s->N * s->K);
    }
    double rate = flops / median_of(total, reps) / 1e9;
    *cpu_rate = flops / median_of(total_cpu, reps) / 1e9;
    free(per);
    free(total);
    free(total_cpu);
    adt_free_aligned(A);
    adt_free_aligned(B);
    adt_free_aligned(Cm);
    return rate;
}

/* ---- profile ------------------------------------------------------------------------------ */

static const char *phase_name(const adt_node *n) {
    return n->is_optimizer ? "optimizer" : n->is_backward ? "backward" : "forward";
}

typedef struct prof_row {
    const char *op, *phase;
    int nodes;
    double s, s_min, flops;
} prof_row;

static int cmp_prof(const void *a, const void *b) {
    double x = ((const prof_row *)a)->s, y = ((const prof_row *)b)->s;
    return (x < y) - (x > y); /* descending */
}

/* After run i: each node's time in this run (the timers' growth since prev) kept as its minimum
 * over the timed runs (i >= warmup). */
static void track_node_minima(adt_exec *ex, int n_nodes, int i, int warmup, double *prev, double *sec_min) {
    const double *s = adt_exec_node_seconds(ex);
    for (int k = 0; k < n_nodes; k++) {
        if (i >= warmup && s[k] - prev[k] < sec_min[k]) sec_min[k] = s[k] - prev[k];
        prev[k] = s[k];
    }
}

/* `sec` holds each node's seconds over the timed steps only (warmup subtracted), `sec_min` its
 * fastest single step; step_ms is the mean step time, so that node times and step time add up
 * over the same steps. */
static void print_profile(const adt_graph *g, const adt_exec *ex, const model_spec *spec, const double *sec,
                          const double *sec_min, int steps, double step_ms, const gemm_list *gl) {
    prof_row *rows = calloc((size_t)g->n_nodes + 1, sizeof *rows);
    if (!rows) abort();
    int nr = 0;
    double node_total = 0, min_total = 0, phase_s[3] = {0, 0, 0};
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        const char *op = adt_op_name(n->op), *ph = phase_name(n);
        int r = 0;
        while (r < nr && (strcmp(rows[r].op, op) || strcmp(rows[r].phase, ph))) r++;
        if (r == nr) rows[nr++] = (prof_row){op, ph, 0, 0, 0, 0};
        rows[r].nodes++;
        rows[r].s += sec[i];
        rows[r].s_min += sec_min[i];
        min_total += sec_min[i];
        rows[r].flops += adt_node_flops(g, n);
        node_total += sec[i];
        phase_s[n->is_optimizer ? 2 : n->is_backward ? 1 : 0] += sec[i];
    }
    qsort(rows, (size_t)nr, sizeof *rows, cmp_prof);
    double per = 1e3 / steps; /* seconds over all steps -> ms per step */
    fprintf(stderr, "\n%s: time per step by op (%d timed steps; mean step %.2f ms, sum of node times %.2f ms, "
            "of node minima %.2f ms)\n", spec->name, steps, step_ms, node_total * per, min_total * 1e3);
    fprintf(stderr, "  %-4s %-18s %-9s %5s %9s %6s %9s %9s\n", "rank", "op", "phase", "nodes", "ms/step", "%step",
            "GFLOP/s", "min ms");
    for (int r = 0; r < nr && r < 15; r++) {
        double ms = rows[r].s * per;
        double gf = rows[r].s > 0 ? rows[r].flops * steps / rows[r].s / 1e9 : 0;
        fprintf(stderr, "  %-4d %-18s %-9s %5d %9.3f %5.1f%% %9.2f %9.3f\n", r + 1, rows[r].op, rows[r].phase,
                rows[r].nodes, ms, 100.0 * ms / step_ms, gf, rows[r].s_min * 1e3);
    }
    fprintf(stderr, "  phases: forward %.2f ms, backward %.2f ms, optimizer %.2f ms; outside nodes %.2f ms\n",
            phase_s[0] * per, phase_s[1] * per, phase_s[2] * per, step_ms - node_total * per);

    /* matmul nodes by shape, next to the rate the replay reached on the same shape: a node much
     * slower than its replay points at layout or cache effects rather than at OpenBLAS */
    fprintf(stderr, "  matmul nodes by shape (C[M,N] = op(A) op(B), K inner):\n");
    fprintf(stderr, "    %-9s %6s %6s %6s %-2s %-4s %5s %9s %9s %9s  %s\n", "phase", "M", "N", "K", "tr", "form", "nodes",
            "ms/step", "GFLOP/s", "replay", "backend");
    for (int si = 0; si < gl->n; si++) {
        const gemm_shape *s = &gl->s[si];
        double t = 0;
        int cnt = 0;
        for (int i = 0; i < g->n_nodes; i++) {
            const adt_node *n = &g->nodes[i];
            if (n->op != ADT_OP_MATMUL || (n->is_backward ? 1 : 0) != s->phase) continue;
            int64_t M, N, K, batch;
            adt_matmul_dims(g, n, &M, &N, &K, &batch);
            if (M != s->M || N != s->N || K != s->K || n->a.i[0] != s->ta || n->a.i[1] != s->tb ||
                adt_exec_matmul_accumulates(ex, i) != s->acc)
                continue;
            t += sec[i];
            cnt++;
        }
        if (!cnt) continue; /* attention-internal shapes have no matmul node of their own */
        double fl = 2.0 * (double)(s->count * s->M * s->N * s->K);
        int route = adt_gemm_route(s->ta, s->tb, s->M, s->N, s->K);
        fprintf(stderr, "    %-9s %6lld %6lld %6lld %c%c %-4s %5d %9.3f %9.2f %9.2f  %s\n",
                s->phase ? "backward" : "forward", (long long)s->M, (long long)s->N, (long long)s->K, s->ta ? 'T' : 'N',
                s->tb ? 'T' : 'N', s->acc ? "acc" : "set", cnt,
                t * per, t > 0 ? fl * steps / t / 1e9 : 0, s->med_s > 0 ? fl / s->med_s / 1e9 : 0,
                route < 0 ? "-" : adt_gemm_backend_str((adt_gemm_backend)route));
    }
    free(rows);
}

/* ---- one model ---------------------------------------------------------------------------- */

static int bench_model(const char *name, const opts *o) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    model_spec spec;
    adt_exec *ex = NULL;
    gemm_list gl = {0};
    double *times = NULL, *cpu = NULL, *sec0 = NULL, *sec = NULL, *prev = NULL, *sec_min = NULL;
    int rc = -1;
    adt_model_cfg cfg;
    if (build_model(g, name, 1, &spec, &io, &cfg)) goto out;

    adt_exec_opts eo = {.threads = o->threads, .seed = o->seed, .profile = o->profile};
    if (adt_exec_create(&ex, g, &eo)) {
        fprintf(stderr, "bench_core: %s: %s\n", name, adt_error_message());
        goto out;
    }
    adt_exec_init_params(ex);
    feed_data(g, &io, o->seed, adt_exec_data(ex, io.input), adt_exec_data(ex, io.label));
    if (cfg.type == ADT_MODEL_DLRM) feed_ids(g, &io, &cfg, o->seed, adt_exec_data(ex, io.input2));

    times = calloc((size_t)o->steps, sizeof *times);
    cpu = calloc((size_t)o->steps, sizeof *cpu);
    sec0 = calloc((size_t)g->n_nodes + 1, sizeof *sec0);
    sec = calloc((size_t)g->n_nodes + 1, sizeof *sec);
    prev = calloc((size_t)g->n_nodes + 1, sizeof *prev);
    sec_min = calloc((size_t)g->n_nodes + 1, sizeof *sec_min);
    if (!times || !cpu || !sec0 || !sec || !prev || !sec_min) abort();
    for (int i = 0; i < g->n_nodes; i++) sec_min[i] = INFINITY;
    const float *loss = adt_exec_data(ex, io.loss);
    float loss_first = NAN, loss_last = NAN;
    for (int i = 0; i < o->warmup + o->steps; i++) {
        if (i == o->warmup && o->profile) /* the timers run from creation: drop the warmup */
            memcpy(sec0, adt_exec_node_seconds(ex), (size_t)g->n_nodes * sizeof *sec0);
        double t0 = adt_now_s(), c0 = cpu_now_s();
        adt_exec_set_lr_step(ex, spec.lr, (int32_t)(i + 1));
        if (adt_exec_run(ex)) {
            fprintf(stderr, "bench_core: %s: step %d: %s\n", name, i + 1, adt_error_message());
            goto out;
        }
        double ms = (adt_now_s() - t0) * 1e3, cms = (cpu_now_s() - c0) * 1e3;
        if (i >= o->warmup) {
            times[i - o->warmup] = ms;
            cpu[i - o->warmup] = cms;
        }
        if (o->profile) track_node_minima(ex, g->n_nodes, i, o->warmup, prev, sec_min);
        if (i == 0) loss_first = *loss;
        loss_last = *loss;
    }
    if (!isfinite(loss_first) || !isfinite(loss_last)) {
        fprintf(stderr, "bench_core: %s: the loss is not finite (%g, then %g)\n", name, loss_first, loss_last);
        goto out;
    }
    double mean = 0;
    for (int i = 0; i < o->steps; i++) mean += times[i] / o->steps;
    qsort(times, (size_t)o->steps, sizeof *times, cmp_double);
    double med = percentile(times, o->steps, 50);
    double cpu_med = median_of(cpu, o->steps);

    /* The FLOP count the step is judged by, checked against an independent tally (the GEMMs
     * collected from the nodes) and against the peer's closed form. */
    double mm_flops = adt_graph_matmul_flops(g);
    /* vgg and dlrm: convolutions and the interaction are not replayed, so there is no floor */
    int reps = spec.peer_flops >= 0 ? o->gemm_reps : 0;
    double replay_flops = reps ? collect_gemms(g, ex, &gl) : mm_flops;
    if (fabs(replay_flops - mm_flops) > 1e-9 * mm_flops)
        fprintf(stderr, "bench_core: %s: note: replayed GEMMs hold %.0f FLOPs, adt_graph_matmul_flops %.0f\n", name,
                replay_flops, mm_flops);
    if (spec.peer_flops >= 0 && fabs(spec.peer_flops - mm_flops) > 1e-9 * mm_flops)
        fprintf(stderr, "bench_core: %s: note: matmul FLOPs %.0f differ from the peer's formula %.0f\n", name,
                mm_flops, spec.peer_flops);
    adt_gemm_set_threads(o->threads);
    double cpu_gflops = NAN, gflops = reps ? replay_gemms(&gl, reps, &cpu_gflops) : NAN;
    double floor_ms = mm_flops / (gflops * 1e9) * 1e3, floor_cpu_ms = mm_flops / (cpu_gflops * 1e9) * 1e3;

    if (o->profile) {
        const double *s = adt_exec_node_seconds(ex);
        for (int i = 0; i < g->n_nodes; i++) sec[i] = s[i] - sec0[i];
        print_profile(g, ex, &spec, sec, sec_min, o->steps, mean, &gl);
    }

    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "model", name);
    cJSON_AddStringToObject(j, "framework", "adtrain");
    cJSON_AddNumberToObject(j, "threads", o->threads);
    cJSON_AddNumberToObject(j, "world", 1);
    cJSON_AddNumberToObject(j, "batch", spec.batch);
    cJSON_AddNumberToObject(j, "batch_per_rank", spec.batch);
    cJSON_AddNumberToObject(j, "samples_per_s", round4(spec.batch / (med / 1e3)));
    cJSON_AddNumberToObject(j, "params", (double)adt_graph_param_count(g));
    cJSON_AddNumberToObject(j, "step_ms_median", round4(med));
    cJSON_AddNumberToObject(j, "step_ms_p10", round4(percentile(times, o->steps, 10)));
    cJSON_AddNumberToObject(j, "step_ms_p90", round4(percentile(times, o->steps, 90)));
    cJSON_AddNumberToObject(j, "step_ms_min", round4(times[0]));
    cJSON_AddNumberToObject(j, "steps", o->steps);
    cJSON_AddNumberToObject(j, "matmul_flops_per_step", mm_flops);
    cJSON_AddNumberToObject(j, "warmup", o->warmup);
    cJSON_AddStringToObject(j, "blas", "openblas");
    cJSON_AddStringToObject(j, "gemm_backend", adt_gemm_backend_name());
    cJSON_AddStringToObject(j, "gemm_version", adt_gemm_backend_version(adt_gemm_get_info()->backend));
    cJSON_AddNumberToObject(j, "blas_threads", openblas_get_num_threads());
    cJSON_AddStringToObject(j, "blas_config", openblas_get_config());
    cJSON_AddStringToObject(j, "blas_core", adt_blas_core_name());
    cJSON_AddStringToObject(j, "optimizer", spec.optimizer);
    if (reps) {
        cJSON_AddNumberToObject(j, "sgemm_gflops", round4(gflops));
        cJSON_AddNumberToObject(j, "sgemm_reps", reps);
        cJSON_AddNumberToObject(j, "gemm_floor_ms", round4(floor_ms));
        cJSON_AddNumberToObject(j, "step_over_floor", round4(med / floor_ms));
        /* the same by CPU time: the step's CPU time over the replay's */
        cJSON_AddNumberToObject(j, "sgemm_gflops_cpu", round4(cpu_gflops));
        cJSON_AddNumberToObject(j, "gemm_floor_cpu_ms", round4(floor_cpu_ms));
        cJSON_AddNumberToObject(j, "step_cpu_over_floor", round4(cpu_med / floor_cpu_ms));
    }
    cJSON_AddNumberToObject(j, "cpu_ms_median", round4(cpu_med));
    cJSON_AddNumberToObject(j, "loss_first", loss_first);
    cJSON_AddNumberToObject(j, "loss_last", loss_last);
    cJSON_AddBoolToObject(j, "profiled", o->profile);
    cJSON_AddNumberToObject(j, "max_rss_mib", round(max_rss_mib() * 10) / 10);
    char *txt = cJSON_PrintUnformatted(j);
    if (txt) {
        printf("%s\n", txt);
        fflush(stdout);
    }
    cJSON_free(txt);
    cJSON_Delete(j);
    rc = 0;
out:
    free(gl.s);
    free(times);
    free(cpu);
    free(sec0);
    free(sec);
    free(prev);
    free(sec_min);
    adt_exec_free(ex);
    adt_graph_free(g);
    return rc;
}

/* ---- data parallel ------------------------------------------------------------------------- */

/* One model, data parallel over the world: the same model and per-rank batch as one process. */
static int bench_model_dp(const char *name, const opts *o) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    model_spec spec;
    adt_model_cfg cfg;
    adt_plan xp = {0};
    adt_dist_local loc = {0};
    adt_mesh_comm *mc = NULL;
    adt_exec *ex = NULL;
    void *x = NULL, *y = NULL;
    double *times = NULL, *wait = NULL, *flight = NULL, *start = NULL, *poll = NULL, *cpu = NULL;
    int rc = -1, ranks[64];
    if (g_nranks > 64 || !strcmp(name, "vgg") || !strcmp(name, "dlrm")) {
        fprintf(stderr, "bench_core: data-parallel mode measures gpt-s and mlp on at most 64 ranks, not %s on %d\n",
                name, g_nranks);
        goto out;
    }
    if (build_model(g, name, g_nranks, &spec, &io, &cfg)) goto out;
    adt_expert_opts xo = {.strategy = o->strategy, .devices = g_nranks, .batch = spec.batch * g_nranks};
    if (adt_expert_plan(g, &cfg, &xo, &xp)) {
        fprintf(stderr, "bench_core: %s: %s\n", name, adt_error_message());
        goto out;
    }
    adt_dist_plan plan = adt_plan_dist(&xp, 0, ranks);
    const adt_mesh m = plan.mesh;
    if (adt_mesh_comm_create(&mc, g_world, &m) || adt_dist_partition(g, &plan, adt_mesh_comm_coord(mc), &loc)) {
        fprintf(stderr, "bench_core: %s: %s\n", name, adt_error_message());
        goto out;
    }
    adt_exec_opts eo = {.threads = o->threads, .seed = o->seed, .comm = adt_mesh_comm_hook(mc, loc.g),
                        .comm_sync = o->no_overlap, .profile = o->profile};
    if (adt_exec_create(&ex, loc.g, &eo)) {
        fprintf(stderr, "bench_core: %s: %s\n", name, adt_error_message());
        goto out;
    }
    adt_exec_init_params(ex);
    /* the global batch, drawn once; each rank keeps its block */
    x = malloc((size_t)adt_value_bytes(g, io.input));
    y = malloc((size_t)adt_value_bytes(g, io.label));
    feed_data(g, &io, o->seed, x, y);
    int fed[2] = {io.input, io.label};
    void *src[2] = {x, y};
    for (int k = 0; k < 2; k++) {
        const adt_value *v = &g->values[fed[k]];
        adt_box all = {.global = v->shape, .shape = v->shape};
        adt_box b = adt_ndsbp_block(&loc.layout[fed[k]], &m, adt_mesh_comm_coord(mc), v->shape);
        adt_box_transfer(adt_exec_data(ex, loc.value[fed[k]]), &b, src[k], &all, 4, 0);
    }
    int n = o->steps;
    times = calloc((size_t)n, sizeof *times);
    wait = calloc((size_t)n, sizeof *wait);
    flight = calloc((size_t)n, sizeof *flight);
    start = calloc((size_t)n, sizeof *start);
    poll = calloc((size_t)n, sizeof *poll);
    cpu = calloc((size_t)n, sizeof *cpu);
    if (!times || !wait || !flight || !start || !poll || !cpu) abort();
    double sum_wait = 0, sum_flight = 0;
    float loss_first = NAN, loss_last = NAN;
    int nn = loc.g->n_nodes;
    double *sec0 = calloc((size_t)nn + 1, sizeof *sec0), *prev = calloc((size_t)nn + 1, sizeof *prev);
    double *smin = calloc((size_t)nn + 1, sizeof *smin);
    if (!sec0 || !prev || !smin) abort();
    for (int k = 0; k < nn; k++) smin[k] = INFINITY;
    double sum_ms = 0;
    for (int i = 0; i < o->warmup + n; i++) {
        if (i == o->warmup && o->profile) /* the timers run from creation: drop the warmup */
            memcpy(sec0, adt_exec_node_seconds(ex), (size_t)nn * sizeof *sec0);
        adt_comm_barrier(g_world);
        double t0 = adt_now_s(), c0 = cpu_now_s();
        adt_exec_set_lr_step(ex, spec.lr, (int32_t)(i + 1));
        if (adt_exec_run(ex)) {
            fprintf(stderr, "bench_core: %s: step %d: %s\n", name, i + 1, adt_error_message());
            adt_comm_abort(g_world, 1);
        }
        double cms = (cpu_now_s() - c0) * 1e3; /* this rank's own step, before the barrier */
        adt_comm_barrier(g_world);
        double ms = (adt_now_s() - t0) * 1e3;
        adt_exec_stats st;
        adt_exec_get_stats(ex, &st, NULL);
        if (i >= o->warmup) {
            int k = i - o->warmup;
            times[k] = ms, wait[k] = st.comm_wait_s * 1e3, flight[k] = st.comm_flight_s * 1e3;
            sum_ms += ms;
            start[k] = st.comm_start_s * 1e3, poll[k] = st.comm_poll_s * 1e3, cpu[k] = cms;
            sum_wait += st.comm_wait_s, sum_flight += st.comm_flight_s;
        }
        if (o->profile) track_node_minima(ex, nn, i, o->warmup, prev, smin);
        if (i == 0 || i + 1 == o->warmup + n) { /* outside the timed window */
            float l = NAN;
            adt_mesh_comm_gather(mc, &loc.layout[g->loss], g->values[g->loss].shape, ADT_F32,
                                 adt_exec_data(ex, loc.value[g->loss]), &l);
            if (i == 0) loss_first = l;
            else loss_last = l;
        }
    }
    if (o->profile && g_rank == 0) { /* rank 0's local graph: its kernels, and its boxing nodes' waits */
        const double *s = adt_exec_node_seconds(ex);
        double *sec = calloc((size_t)nn + 1, sizeof *sec);
        if (!sec) abort();
        for (int i = 0; i < nn; i++) sec[i] = s[i] - sec0[i];
        gemm_list none = {0};
        print_profile(loc.g, ex, &spec, sec, smin, n, sum_ms / n, &none);
        free(sec);
    }
    free(sec0);
    free(prev);
    free(smin);
    qsort(times, (size_t)n, sizeof *times, cmp_double);
    double med = percentile(times, n, 50);
    int64_t ops;
    double bytes;
    adt_mesh_comm_counts(mc, &ops, &bytes);
    /* every rank's peak resident set (each fills its own slot of a summed vector) */
    double rss[64] = {0};
    rss[g_rank] = max_rss_mib();
    adt_comm_allreduce_f64(g_world, rss, g_nranks);
    if (g_rank == 0) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "model", name);
        cJSON_AddStringToObject(j, "framework", "adtrain-dp");
        cJSON_AddStringToObject(j, "strategy", o->strategy);
        cJSON_AddNumberToObject(j, "world", g_nranks);
        cJSON_AddNumberToObject(j, "threads", o->threads);
        cJSON_AddNumberToObject(j, "batch_per_rank", spec.batch);
        cJSON_AddNumberToObject(j, "params", (double)adt_graph_param_count(g));
        cJSON_AddBoolToObject(j, "overlap", adt_exec_overlaps(ex));
        cJSON_AddNumberToObject(j, "collectives_per_step", loc.n_boxing);
        cJSON_AddNumberToObject(j, "sent_bytes_per_step", bytes / (double)(o->warmup + n));
        cJSON_AddNumberToObject(j, "step_ms_median", round4(med));
        cJSON_AddNumberToObject(j, "step_ms_p10", round4(percentile(times, n, 10)));
        cJSON_AddNumberToObject(j, "step_ms_p90", round4(percentile(times, n, 90)));
        cJSON_AddNumberToObject(j, "step_ms_min", round4(times[0]));
        cJSON_AddNumberToObject(j, "steps", n);
        cJSON_AddNumberToObject(j, "warmup", o->warmup);
        cJSON_AddNumberToObject(j, "samples_per_s", round4(g_nranks * spec.batch / (med / 1e3)));
        cJSON_AddNumberToObject(j, "cpu_ms_median", round4(median_of(cpu, n)));
        cJSON_AddNumberToObject(j, "comm_wait_ms", round4(median_of(wait, n)));
        cJSON_AddNumberToObject(j, "comm_flight_ms", round4(median_of(flight, n)));
        cJSON_AddNumberToObject(j, "comm_start_ms", round4(median_of(start, n)));
        cJSON_AddNumberToObject(j, "comm_poll_ms", round4(median_of(poll, n)));
        cJSON_AddNumberToObject(j, "comm_hidden", round4(sum_flight > 0 ? 1 - sum_wait / sum_flight : 0));
        cJSON_AddStringToObject(j, "blas_core", adt_blas_core_name());
        cJSON_AddStringToObject(j, "mpi_library", adt_comm_mpi_library());
        cJSON_AddStringToObject(j, "optimizer", spec.optimizer);
        cJSON_AddNumberToObject(j, "loss_first", loss_first);
        cJSON_AddNumberToObject(j, "loss_last", loss_last);
        double rss_max = 0;
        cJSON *ra = cJSON_AddArrayToObject(j, "rank_max_rss_mib");
        for (int r = 0; r < g_nranks; r++) {
            cJSON_AddItemToArray(ra, cJSON_CreateNumber(round(rss[r] * 10) / 10));
            rss_max = rss[r] > rss_max ? rss[r] : rss_max;
        }
        cJSON_AddNumberToObject(j, "max_rss_mib", round(rss_max * 10) / 10);
        char *txt = cJSON_PrintUnformatted(j);
        if (txt) printf("%s\n", txt);
        fflush(stdout);
        cJSON_free(txt);
        cJSON_Delete(j);
    }
    rc = 0;
out:
    free(times);
    free(wait);
    free(flight);
    free(start);
    free(poll);
    free(cpu);
    free(x);
    free(y);
    adt_exec_free(ex);
    adt_mesh_comm_free(mc);
    adt_dist_local_free(&loc);
    adt_plan_free(&xp);
    adt_graph_free(g);
    return rc;
}

int main(int argc, char **argv) {
    adt_blas_fix_coretype(argv); /* may re-execute this program once, before any BLAS call */
    opts o;
    if (parse_args(argc, argv, &o)) return 2;
    /* The thread count is fixed before any BLAS call, as the peer does before any tensor work. */
    adt_gemm_set_threads(o.threads);
    if (adt_comm_launched()) {
        if (adt_comm_init(ADT_COMM_MPI, &g_world)) {
            fprintf(stderr, "bench_core: MPI: %s\n", adt_error_message());
            return 1;
        }
        g_rank = adt_comm_rank(g_world);
        g_nranks = adt_comm_size(g_world);
    }
    const char *all[] = {"gpt-s", "mlp", "vgg", "dlrm"};
    int first = 0, last = 3, rc = 0;
    for (int m = 0; m <= 3; m++)
        if (!strcmp(o.model, all[m])) first = last = m;
    for (int m = first; m <= last && !rc; m++)
        rc = g_nranks > 1 ? bench_model_dp(all[m], &o) : bench_model(all[m], &o);
    if (rc && g_world) adt_comm_abort(g_world, 1);
    if (g_world) adt_comm_finalize(g_world);
    return rc ? 1 : 0;
}
