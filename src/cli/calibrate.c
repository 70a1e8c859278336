/*
 * calibrate.c - `adtrain calibrate`: measures this machine and writes a cluster file
 * (docs/formats.md "Cluster files") the planner prices plans with.
 *
 *   compute   the real kernels: training steps of small models (an MLP, a VGG, a GPT) run by
 *             the executor with per-node timing; FLOP/s per op class = the class's FLOPs over
 *             its seconds, for each size class (the models at two batch sizes), the larger size
 *             class kept (what planning at scale sees);
 *   memory    the bandwidth of a 64 MiB copy;
 *   links     with --ranks N >= 2: for k = 2..N ranks `mpiexec -n k` runs this binary as a worker
 *             that times all-reduces of 4 KiB .. 16 MiB; alpha and beta are the least-squares fit
 *             of the ring formula t = 2(k-1) alpha + 2(k-1)/k S beta over every (k, S); one link
 *             level spanning the N ranks of this node.
 * Every rank is one device: devices_per_node = N.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/comm.h"
#include "adtrain/exec.h"
#include "adtrain/planner.h"
#include "cli.h"

#define cal_fail(...) cli_fail("calibrate", __VA_ARGS__)

typedef struct cal_opts {
    const char *out_path;
    long ranks, threads;
    int comm_worker;
} cal_opts;

static void cal_usage(FILE *f) {
    fprintf(f, "usage: adtrain calibrate [-o CLUSTER.json] [--ranks N] [--threads T]\n"
               "\n"
               "Measures this machine and writes a cluster file for adtrain plan --strategy auto:\n"
               "FLOP/s per op class with the real kernels, memory bandwidth, and with --ranks N >= 2 the\n"
               "alpha/beta of all-reduce over MPI for 2..N ranks (mpiexec must be on PATH).\n"
               "  -o FILE       write the cluster there (default: print it)\n"
               "  --ranks N     devices (ranks) on this node, 1 to 64 (default 1)\n"
               "  --threads T   OpenBLAS threads per rank (default 1)\n"
               "exit status: 0 done, 1 a measurement or the file failed, 2 bad flag\n");
}

static int cal_apply(void *opts, const char *f, const char *v) {
    cal_opts *o = opts;
    if (!strcmp(f, "-o") || !strcmp(f, "--output")) o->out_path = v;
    else if (!strcmp(f, "--ranks")) return cli_parse_long("calibrate", f, v, 1, 64, &o->ranks);
    else if (!strcmp(f, "--threads")) return cli_parse_long("calibrate", f, v, 1, 256, &o->threads);
    else if (!strcmp(f, "--comm-worker")) o->comm_worker = 1;
    else return cal_fail(2, "unknown flag '%s' (see adtrain calibrate --help)", f);
    return 0;
}

/* ---- compute ------------------------------------------------------------------------------------ */

/* One model's training step timed node by node: FLOPs and seconds per op class added to acc. */
static int time_model(const char *json, int batch, int threads, double *flops, double *secs) {
    adt_model_cfg m;
    if (adt_model_cfg_parse(&m, json, "calibration model")) return ADT_ERR_ARG;
    adt_plan p;
    memset(&p, 0, sizeof p);
    p.model = m, p.batch = batch, p.microbatches = 1, p.optim = ADT_OPTIM_ADAMW;
    adt_graph *g = NULL;
    int rc = adt_plan_build_graph(&p, NULL, &g);
    adt_exec *ex = NULL;
    adt_exec_opts eo = {.threads = threads, .seed = 1, .profile = 1};
    if (!rc) rc = adt_exec_create(&ex, g, &eo);
    if (!rc) rc = adt_exec_init_params(ex);
    for (int s = 0; s < 4 && !rc; s++) { /* the profile sums the four steps, the first warm */
        adt_exec_set_lr_step(ex, 1e-4f, s + 1);
        rc = adt_exec_run(ex);
    }
    if (!rc) {
        const double *t = adt_exec_node_seconds(ex);
        for (int i = 0; i < g->n_nodes; i++) {
            int k = adt_op_class_of(g->nodes[i].op);
            flops[k] += 4 * adt_node_flops(g, &g->nodes[i]);
            secs[k] += t[i];
        }
    }
    adt_exec_free(ex);
    adt_graph_free(g);
    return rc;
}

static double copy_bandwidth(void) {
    size_t n = (size_t)64 << 20;
    char *a = adt_alloc_aligned(n), *b = adt_alloc_aligned(n);
    memset(a, 1, n);
    memcpy(b, a, n); /* fault the pages in */
    double best = 0;
    for (int r = 0; r < 5; r++) {
        double t0 = adt_now_s();
        memcpy(b, a, n);
        double t = adt_now_s() - t0;
        double bw = 2.0 * (double)n / t; /* read and write */
        if (bw > best) best = bw;
    }
    adt_free_aligned(a), adt_free_aligned(b);
    return best;
}

/* ---- links ---------------------------------------------------------------------------------------- */

#define CAL_SIZES 7 /* 4 KiB .. 16 MiB by 4x */

/* The worker: every rank times all-reduces; rank 0 prints "size seconds" lines (median of 9). */
static int comm_worker(void) {
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) return cal_fail(1, "--comm-worker: %s", adt_error_message());
    int rc = 0;
    float *buf = adt_malloc(((size_t)16 << 20));
    memset(buf, 0, (size_t)16 << 20);
    for (int si = 0; si < CAL_SIZES && !rc; si++) {
        int64_t bytes = (int64_t)4096 << (2 * si), n = bytes / 4;
        double t[9];
        for (int r = 0; r < 9 + 2 && !rc; r++) {
            adt_comm_barrier(w);
            double t0 = adt_now_s();
            rc = adt_comm_allreduce(w, buf, n, ADT_F32);
            double dt = adt_now_s() - t0;
            adt_comm_allreduce_f64(w, &dt, 1); /* the ranks' mean */
            if (r >= 2) t[r - 2] = dt / adt_comm_size(w);
        }
        for (int i = 1; i < 9; i++)
            for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
                double x = t[j];
                t[j] = t[j - 1], t[j - 1] = x;
            }
        if (!rc && adt_comm_rank(w) == 0) printf("%lld %.9g\n", (long long)bytes, t[4]);
    }
    free(buf);
    adt_comm_finalize(w);
    return rc ? 1 : 0;
}

/* Runs the worker on k ranks; adds its (k, S, t) rows to the normal equations of the fit. */
static int measure_ranks(int k, double ata[2][2], double atb[2]) {
    char self[1024], cmd[1200];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return cal_fail(1, "--ranks: cannot find this program's path to start workers");
    self[n] = 0;
    snprintf(cmd, sizeof cmd, "mpiexec -n %d '%s' calibrate --comm-worker 2>&1", k, self);
    FILE *p = popen(cmd, "r");
    if (!p) return cal_fail(1, "--ranks: cannot start '%s'", cmd);
    char line[256];
    int rows = 0;
    while (fgets(line, sizeof line, p)) {
        long long s;
        double t;
        if (sscanf(line, "%lld %lg", &s, &t) != 2) {
            fprintf(stderr, "calibrate: %d ranks: %s", k, line);
            continue;
        }
        /* t = a x_a + b x_b with x_a = 2(k-1) messages, x_b = 2(k-1)/k S bytes */
        double xa = 2.0 * (k - 1), xb = 2.0 * (k - 1) / k * (double)s;
        ata[0][0] += xa * xa, ata[0][1] += xa * xb, ata[1][1] += xb * xb;
        atb[0] += xa * t, atb[1] += xb * t;
        rows++;
        fprintf(stderr, "calibrate: all-reduce on %d ranks, %lld bytes: %.1f us\n", k, s, t * 1e6);
    }
    int st = pclose(p);
    if (st || rows != CAL_SIZES) return cal_fail(1, "--ranks: '%s' gave %d of %d sizes (status %d)", cmd, rows, CAL_SIZES, st);
    return 0;
}

/* ---- the command ---------------------------------------------------------------------------------- */

int cli_calibrate(int argc, char **argv) {
    cal_opts o = {.ranks = 1, .threads = 1};
    static const char *const switches[] = {"--comm-worker", NULL};
    int rc = cli_parse_flags_switches("calibrate", argc, argv, cal_usage, cal_apply, &o, switches);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.comm_worker) return comm_worker();

    static const struct { const char *json; int batch[2]; } models[] = {
        {"{\"type\":\"mlp\",\"sizes\":[512,1024,1024,10],\"activation\":\"relu\"}", {16, 128}},
        {"{\"type\":\"vgg\",\"in_channels\":3,\"height\":32,\"width\":32,\"blocks\":[[32],[64]],\"fc\":[128],"
         "\"classes\":10}", {4, 16}},
        {"{\"type\":\"gpt\",\"vocab_size\":256,\"n_ctx\":128,\"n_layer\":2,\"n_embd\":256,\"n_head\":4}", {2, 8}},
    };
    double flops[2][ADT_OPCLASS_COUNT] = {{0}}, secs[2][ADT_OPCLASS_COUNT] = {{0}};
    for (int sc = 0; sc < 2; sc++)
        for (size_t i = 0; i < sizeof models / sizeof models[0]; i++)
            if (time_model(models[i].json, models[i].batch[sc], (int)o.threads, flops[sc], secs[sc]))
                return cal_fail(1, "timing the kernels: %s", adt_error_message());
    adt_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "calibrated");
    snprintf(c.device_kind, sizeof c.device_kind, "this machine: one rank, %ld OpenBLAS thread(s)", o.threads);
    c.nodes = 1, c.devices_per_node = (int)o.ranks;
    c.compute_dtype = ADT_F32, c.efficiency = 1.0;
    for (int k = 0; k < ADT_OPCLASS_COUNT; k++) {
        for (int sc = 0; sc < 2; sc++)
            if (secs[sc][k] > 0)
                fprintf(stderr, "calibrate: %-9s size class %d: %.3g GFLOP/s\n", adt_op_class_name(k), sc,
                        flops[sc][k] / secs[sc][k] * 1e-9);
        c.rate[k] = secs[1][k] > 0 ? flops[1][k] / secs[1][k] : 0;
        if (c.rate[k] > c.peak_flops[ADT_F32]) c.peak_flops[ADT_F32] = c.rate[k];
    }
    c.memory_bw = copy_bandwidth();
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    c.memory_bytes = pages > 0 && psz > 0 ? (double)pages * (double)psz / (double)o.ranks : 8e9;
    fprintf(stderr, "calibrate: memory bandwidth %.3g GB/s, %.3g GB per rank\n", c.memory_bw * 1e-9, c.memory_bytes * 1e-9);
    c.n_links = 1;
    snprintf(c.link[0].name, sizeof c.link[0].name, "shared-memory");
    c.link[0].span = (int)o.ranks;
    c.link[0].bandwidth = c.memory_bw / 2, c.link[0].latency = 1e-6; /* without --ranks: a guess */
    if (o.ranks >= 2) {
        double ata[2][2] = {{0}}, atb[2] = {0};
        for (int k = 2; k <= o.ranks; k++)
            if ((rc = measure_ranks(k, ata, atb))) return rc;
        double det = ata[0][0] * ata[1][1] - ata[0][1] * ata[0][1];
        double a = (atb[0] * ata[1][1] - atb[1] * ata[0][1]) / det, b = (ata[0][0] * atb[1] - ata[0][1] * atb[0]) / det;
        if (!(det > 0) || !(b > 0)) return cal_fail(1, "--ranks: the all-reduce times do not fit alpha + S beta");
        c.link[0].latency = a > 0 ? a : 0, c.link[0].bandwidth = 1.0 / b;
        fprintf(stderr, "calibrate: link alpha %.3g us, beta %.3g GB/s\n", c.link[0].latency * 1e6, 1e-9 / b);
    }
    if (adt_cluster_validate(&c, "calibrated cluster")) return cal_fail(1, "%s", adt_error_message());
    char *json = adt_cluster_to_json(&c);
    if (!o.out_path) printf("%s\n", json);
    else {
        FILE *f = fopen(o.out_path, "w");
        if (!f || fprintf(f, "%s\n", json) < 0 || fclose(f)) rc = cal_fail(1, "-o %s: cannot write it", o.out_path);
        else fprintf(stderr, "calibrate: wrote %s\n", o.out_path);
    }
    free(json);
    return rc;
}
