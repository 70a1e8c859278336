/*
 * calibrate.c - `adtrain calibrate`: measures this machine and writes a cluster file
 * (docs/formats.md "Cluster files") the planner prices plans with.
 *
 *   compute   the real kernels: training steps of small models (an MLP, a VGG, a GPT, a DLRM, each
 *             at two batch sizes, and each --model at B, B/2 and B/4) run by the executor with
 *             per-node timing, in --procs processes one after another (with --ranks, spread between
 *             the rank measurements), each node's median time kept; launch_s = the median time of tiny
 *             ops; FLOP/s per op class and size class (below / above small_flops per op) = the
 *             FLOPs over the seconds less the ops' fixed costs, for matrix products and
 *             convolutions fitted with a byte rate beside it (device.byte_rates); per op kind and
 *             decade of FLOPs, the nodes' time over what those rates price them at
 *             (device.op_factors);
 *   memory    the bandwidth of a 64 MiB copy; the executor's gradient accumulation at 64 KiB ..
 *             64 MiB (device.accumulate);
 *   cores     the online cores / threads per rank (cores_per_node: more ranks time-share them);
 *             with --ranks N, the compute slowdown of k = 2..N ranks busy at once (a probe's time
 *             on each of k ranks over its time on one rank alone right after, the median of 5 such
 *             pairs; the median of --repeat such measurements), into device.slowdown; where k
 *             ranks outnumber the cores (and only there: src/planner/cores.c) also what a
 *             collective that follows compute costs beyond its back-to-back time (sync_s after
 *             about 1 ms of compute, sync_curve after 0.05 to 30 ms) and what a data-parallel
 *             step's shared-memory all-reduces cost inside it over their back-to-back time
 *             (coll_factor: the ranks' cores move the data, between their kernels; fitted through
 *             the cost model, which then prices the probe's step as measured);
 *   links     with --ranks N >= 2: for k = 2..N ranks `mpiexec -n k` runs this binary as a worker
 *             that times all-reduce, reduce-scatter, all-gather, all-to-all and send/recv of
 *             4 KiB .. 16 MiB; per kind and k the least-squares alpha and beta of that kind's
 *             formula (include/adtrain/dist.h's boxing table) go into links[0].collectives, and
 *             the all-reduce fit over every (k, S) into the link's latency and bandwidth (what
 *             the search prices with); one link level spanning the N ranks of this node.
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

#define CAL_MAX_USER_MODELS 8
#define CAL_COMPUTE_PROCS 5 /* --procs: see cal_workers */
#define CAL_MAX_PROCS 9
#define CAL_REPEAT 3 /* --repeat: see cli_calibrate's rank probes */
#define CAL_MAX_REPEAT 9

typedef struct cal_opts {
    const char *out_path;
    long ranks, threads, batch, procs, repeat;
    int comm_worker, compute_worker, n_models;
    int dedicated; /* --comm-worker-dedicated: the world's ranks have a core each */
    const char *model[CAL_MAX_USER_MODELS]; /* --model: the user's own, timed beside ours */
} cal_opts;

static void cal_usage(FILE *f) {
    fprintf(f, "usage: adtrain calibrate [-o CLUSTER.json] [--ranks N] [--threads T] [--model CFG[:B]]...\n"
               "                         [--batch B] [--procs P] [--repeat R]\n"
               "\n"
               "Measures this machine and writes a cluster file for adtrain plan --strategy auto:\n"
               "FLOP/s per op class and a factor per op kind with the real kernels, memory bandwidth,\n"
               "and with --ranks N >= 2 the alpha/beta of each collective over MPI for 2..N ranks and\n"
               "what they cost inside a data-parallel step (mpiexec must be on PATH).\n"
               "  -o FILE       write the cluster there (default: print it)\n"
               "  --ranks N     devices (ranks) on this node, 1 to 64 (default 1)\n"
               "  --threads T   GEMM threads per rank (default 1)\n"
               "  --model CFG[:B]  also time this model's ops (repeatable, up to 8) at global batch B\n"
               "                (default --batch), half and a quarter of it: the op factors then fit its\n"
               "                shapes on 1, 2 and 4 data-parallel ranks\n"
               "  --batch B     the --model's default global batch (default 32)\n"
               "  --procs P     processes that time the kernels, one after another (with --ranks, spread\n"
               "                between the rank measurements); each node's median time is kept\n"
               "                (default 5, at most 9: one process runs up to 25%% off)\n"
               "  --repeat R    with --ranks: measure every rank count R times, in turn, and keep the\n"
               "                median of each probe and one fit over every collective timed (default 3,\n"
               "                at most 9: one measurement's probes move by tens of percent)\n"
               "exit status: 0 done, 1 a measurement or the file failed, 2 bad flag\n");
}

static int cal_apply(void *opts, const char *f, const char *v) {
    cal_opts *o = opts;
    if (!strcmp(f, "-o") || !strcmp(f, "--output")) o->out_path = v;
    else if (!strcmp(f, "--ranks")) return cli_parse_long("calibrate", f, v, 1, 64, &o->ranks);
    else if (!strcmp(f, "--batch")) return cli_parse_long("calibrate", f, v, 1, 1 << 20, &o->batch);
    else if (!strcmp(f, "--procs")) return cli_parse_long("calibrate", f, v, 1, CAL_MAX_PROCS, &o->procs);
    else if (!strcmp(f, "--repeat")) return cli_parse_long("calibrate", f, v, 1, CAL_MAX_REPEAT, &o->repeat);
    else if (!strcmp(f, "--model")) {
        if (o->n_models >= CAL_MAX_USER_MODELS)
            return cal_fail(2, "--model: at most %d models, got another ('%s')", CAL_MAX_USER_MODELS, v);
        o->model[o->n_models++] = v;
    }
    else if (!strcmp(f, "--threads")) return cli_parse_long("calibrate", f, v, 1, 256, &o->threads);
    else if (!strcmp(f, "--comm-worker")) o->comm_worker = 1;
    else if (!strcmp(f, "--comm-worker-dedicated")) o->comm_worker = o->dedicated = 1;
    else if (!strcmp(f, "--compute-worker")) o->compute_worker = 1;
    else return cal_fail(2, "unknown flag '%s' (see adtrain calibrate --help)", f);
    return 0;
}

/* ---- compute ------------------------------------------------------------------------------------ */

/* The size class boundary: an op doing fewer FLOPs (per device) than this is "small"; small
 * matrix products and convolutions reach a fraction of the large ones' FLOP/s. */
#define CAL_SMALL_FLOPS 4e6
/* An op moving at most this many bytes and doing no more FLOPs than this is "tiny": its time is
 * the fixed cost of running one op (launch_s). */
#define CAL_TINY 4096.0

#define CAL_MAX_NODES 16384
typedef struct cal_compute {
    double flops[2][ADT_OPCLASS_COUNT], secs[2][ADT_OPCLASS_COUNT]; /* [0] small, [1] large */
    double ops[2][ADT_OPCLASS_COUNT];                              /* op runs timed         */
    double tiny[4096];                                             /* seconds of tiny ops  */
    int n_tiny;
    /* every node timed: its kind, FLOPs, bytes and seconds per run (the op factors) */
    struct { int op; double flops, bytes, secs; } node[CAL_MAX_NODES];
    int n_nodes;
} cal_compute;

/* An executor of one model's training step (AdamW), its parameters initialised. */
static int model_exec(const char *json, int batch, int threads, int profile, adt_graph **g, adt_exec **ex) {
    adt_model_cfg m;
    *g = NULL, *ex = NULL;
    if (adt_model_cfg_parse(&m, json, "calibration model")) return ADT_ERR_ARG;
    adt_plan p;
    memset(&p, 0, sizeof p);
    p.model = m, p.batch = batch, p.microbatches = 1, p.optim = ADT_OPTIM_ADAMW;
    int rc = adt_plan_build_graph(&p, NULL, g);
    adt_exec_opts eo = {.threads = threads, .seed = 1, .profile = profile};
    if (!rc) rc = adt_exec_create(ex, *g, &eo);
    if (!rc) rc = adt_exec_init_params(*ex);
    /* f32 inputs and labels uniform in [-1, 1], as data: a max-pool's compares or a ReLU's
     * branches run at another speed on zeros. Ids stay 0, in range for every table. */
    for (int v = 0; !rc && v < (*g)->n_values; v++) {
        const adt_value *val = &(*g)->values[v];
        if (!adt_role_is_fed(val->role) || val->dtype != ADT_F32 || v == (*g)->lr_input) continue;
        float *d = adt_exec_data(*ex, v);
        for (int64_t i = 0; i < adt_shape_numel(&val->shape); i++) d[i] = 2 * adt_rng_uniform(7, (uint64_t)i) - 1;
    }
    return rc;
}

/* One node's run of `secs` seconds into acc: its op class and size class's sums, the tiny ops'
 * times, the node records. */
static void acc_add(cal_compute *acc, int op, double f, double b, double secs) {
    if (f <= CAL_TINY && b <= CAL_TINY && acc->n_tiny < (int)(sizeof acc->tiny / sizeof acc->tiny[0]))
        acc->tiny[acc->n_tiny++] = secs;
    if (acc->n_nodes < CAL_MAX_NODES) {
        acc->node[acc->n_nodes].op = op, acc->node[acc->n_nodes].flops = f;
        acc->node[acc->n_nodes].bytes = b, acc->node[acc->n_nodes++].secs = secs;
    }
    if (f <= 0) return;
    int sc = f >= CAL_SMALL_FLOPS, k = adt_op_class_of(op);
    acc->flops[sc][k] += f;
    acc->secs[sc][k] += secs;
    acc->ops[sc][k] += 1;
}

/* One model's training step timed node by node: FLOPs and seconds per op class and size class,
 * and the times of tiny ops, added to acc. */
static int time_model(const char *json, int batch, int threads, cal_compute *acc) {
    adt_graph *g;
    adt_exec *ex;
    int rc = model_exec(json, batch, threads, 1, &g, &ex);
    enum { STEPS = 4 };
    for (int s = 0; s < STEPS && !rc; s++) { /* the profile sums the steps, the first warm */
        adt_exec_set_lr_step(ex, 1e-4f, s + 1);
        rc = adt_exec_run(ex);
    }
    if (!rc) {
        const double *t = adt_exec_node_seconds(ex);
        for (int i = 0; i < g->n_nodes; i++)
            acc_add(acc, g->nodes[i].op, adt_node_flops(g, &g->nodes[i]), adt_node_bytes(g, &g->nodes[i]), t[i] / STEPS);
    }
    adt_exec_free(ex);
    adt_graph_free(g);
    return rc;
}

/* The rate and byte rate of the GEMM-backed class k's ops of size class sc (device.byte_rates):
 * seconds = flops / rate + bytes / byte_rate fitted to the timed nodes by least squares on the
 * relative error, each node weighted by the square root of its time (the many small ops do not
 * outvote the ones a step spends its time in). Left as they are (rate from the sums, no byte
 * rate) where the fit gives either term a negative or vanishing share. */
static int byte_fit_node(const cal_compute *acc, int i, int k, int sc, double launch, double *f, double *b, double *t) {
    *f = acc->node[i].flops, *b = acc->node[i].bytes, *t = acc->node[i].secs - launch;
    return *f > 0 && *t > 0 && adt_op_class_of(acc->node[i].op) == k && (*f >= CAL_SMALL_FLOPS) == sc;
}

static void fit_byte_rate(const cal_compute *acc, int k, int sc, double launch, double *rate, double *byte_rate) {
    double s11 = 0, s12 = 0, s22 = 0, s1 = 0, s2 = 0, tsum = 0, f, b, t;
    int n = 0;
    for (int i = 0; i < acc->n_nodes; i++)
        if (byte_fit_node(acc, i, k, sc, launch, &f, &b, &t)) tsum += t, n++;
    if (n < 4) return;
    for (int i = 0; i < acc->n_nodes; i++) {
        if (!byte_fit_node(acc, i, k, sc, launch, &f, &b, &t)) continue;
        double w = t / (tsum / n), x1 = f / t, x2 = b / t; /* w: the weight squared */
        s11 += w * x1 * x1, s12 += w * x1 * x2, s22 += w * x2 * x2, s1 += w * x1, s2 += w * x2;
    }
    double det = s11 * s22 - s12 * s12;
    if (!(det > 0)) return;
    double a = (s1 * s22 - s2 * s12) / det, c = (s2 * s11 - s1 * s12) / det; /* seconds per FLOP, per byte */
    if (!(a > 0) || !(c > 0)) return;
    *rate = 1 / a, *byte_rate = 1 / c;
}

/* The op factors (device.op_factors): per op kind and decade of FLOPs, the seconds the timed
 * nodes took over the seconds the rates just fitted price them at. Where a kind's nodes of a
 * decade took less than CAL_FACTOR_MIN_S per step in all, the decade is left unmeasured: too
 * little to time. */
#define CAL_FACTOR_MIN_S 2e-5
static void fit_op_factors(adt_cluster *c, const cal_compute *acc) {
    static double meas[ADT_OP_FACTOR_BUCKETS][ADT_OP_COUNT], pred[ADT_OP_FACTOR_BUCKETS][ADT_OP_COUNT];
    memset(meas, 0, sizeof meas), memset(pred, 0, sizeof pred);
    for (int i = 0; i < acc->n_nodes; i++) {
        int op = acc->node[i].op, sc = adt_op_factor_bucket(acc->node[i].flops);
        if (op < 0 || op >= ADT_OP_COUNT) continue;
        meas[sc][op] += acc->node[i].secs;
        pred[sc][op] += adt_cluster_op_time(c, op, acc->node[i].flops, acc->node[i].bytes);
    }
    for (int op = 0; op < ADT_OP_COUNT; op++)
        for (int sc = 0; sc < ADT_OP_FACTOR_BUCKETS; sc++) {
            if (!(meas[sc][op] >= CAL_FACTOR_MIN_S) || !(pred[sc][op] > 0)) continue;
            double f = meas[sc][op] / pred[sc][op];
            c->op_factor[sc][op] = f < 0.02 ? 0.02 : f > 50 ? 50 : f;
            fprintf(stderr, "calibrate: %-18s 1e%d FLOPs: %.2fx the class rate's time (%.3g ms timed)\n",
                    adt_op_name(op), sc + 3, c->op_factor[sc][op], meas[sc][op] * 1e3);
        }
}

/* The compute probe: seconds of a few training steps of a mid-size MLP, the kernels alone. Run
 * by one rank, then by k ranks at once: the ratio is the slowdown of k busy ranks. Repeated for
 * at least CAL_PROBE_S: ranks that time-share cores trade them every few milliseconds, and a
 * probe of 40 ms saw 3 ranks on 2 cores only 1.10x slower, where a training step sees 1.5x. */
#define CAL_PROBE "{\"type\":\"mlp\",\"sizes\":[512,1024,1024,10],\"activation\":\"relu\"}"
#define CAL_PROBE_S 0.5
static double compute_probe(int threads) {
    double t = 0, t0 = adt_now_s();
    int reps = 0;
    do {
        cal_compute *acc = adt_calloc(1, sizeof *acc);
        if (time_model(CAL_PROBE, 64, threads, acc)) {
            free(acc);
            return 0;
        }
        for (int sc = 0; sc < 2; sc++)
            for (int k = 0; k < ADT_OPCLASS_COUNT; k++) t += acc->secs[sc][k];
        free(acc);
        reps++;
    } while (adt_now_s() - t0 < CAL_PROBE_S);
    return t / reps;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
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

/* The executor's gradient accumulation (adt_exec_accumulate) at 64 KiB .. 64 MiB by 4x: before
 * each add the gradients are written afresh, as a backward pass leaves them, so a size that stays
 * in cache is timed in cache; the median of CAL_ACC_ROUNDS adds per size. */
#define CAL_ACC_ROUNDS 9
static void accumulate_rates(adt_cluster *c) {
    size_t max = (size_t)64 << 20;
    float *g = adt_alloc_aligned(max), *a = adt_alloc_aligned(max);
    memset(a, 0, max);
    c->n_accumulate = 0;
    for (size_t bytes = (size_t)64 << 10; bytes <= max; bytes *= 4) {
        int64_t n = (int64_t)(bytes / sizeof(float));
        double r[CAL_ACC_ROUNDS];
        for (int k = 0; k < CAL_ACC_ROUNDS; k++) {
            for (int64_t i = 0; i < n; i++) g[i] = (float)(i & 255) * 1e-3f;
            double t0 = adt_now_s();
            adt_exec_accumulate(a, g, n, 0);
            r[k] = adt_now_s() - t0;
        }
        qsort(r, CAL_ACC_ROUNDS, sizeof r[0], cmp_double);
        double t = r[CAL_ACC_ROUNDS / 2] > 1e-9 ? r[CAL_ACC_ROUNDS / 2] : 1e-9;
        c->accumulate[c->n_accumulate].bytes = (double)bytes;
        c->accumulate[c->n_accumulate++].bytes_per_s = (double)bytes / t;
        fprintf(stderr, "calibrate: accumulating %zu KiB of gradients: %.3g GB/s\n", bytes >> 10, (double)bytes / t * 1e-9);
    }
    adt_free_aligned(g), adt_free_aligned(a);
}

/* ---- links ---------------------------------------------------------------------------------------- */

#define CAL_SIZES 7 /* 4 KiB .. 16 MiB by 4x */
#define CAL_KINDS 5 /* all-reduce, reduce-scatter, all-gather, all-to-all, send/recv */

static const int cal_kind[CAL_KINDS] = {ADT_BOXING_ALL_REDUCE, ADT_BOXING_REDUCE_SCATTER, ADT_BOXING_ALL_GATHER,
                                        ADT_BOXING_ALL_TO_ALL, ADT_COLL_SEND_RECV};

/* One collective of `kind` on a group sharing G = n floats (dist.h's boxing table: a reduce-
 * scatter reads G and keeps G/k, an all-gather the reverse, an all-to-all exchanges G/k^2 per
 * pair); send/recv: rank 2i sends n floats to rank 2i+1 (an odd last rank waits). */
static int run_collective(adt_comm *w, int kind, float *a, float *b, int64_t n, int64_t *cnt) {
    int k = adt_comm_size(w), r = adt_comm_rank(w);
    switch (kind) {
    case ADT_BOXING_ALL_REDUCE: return adt_comm_allreduce(w, a, n, ADT_F32);
    case ADT_BOXING_REDUCE_SCATTER:
        for (int i = 0; i < k; i++) cnt[i] = n / k;
        return adt_comm_reduce_scatter(w, a, b, cnt, ADT_F32);
    case ADT_BOXING_ALL_GATHER:
        for (int i = 0; i < k; i++) cnt[i] = n / k;
        return adt_comm_allgather(w, a, b, cnt, ADT_F32);
    case ADT_BOXING_ALL_TO_ALL:
        for (int i = 0; i < k; i++) cnt[i] = n / ((int64_t)k * k);
        return adt_comm_alltoall(w, a, cnt, b, cnt, ADT_F32);
    default:
        if ((r ^ 1) >= k) return 0;
        return r % 2 == 0 ? adt_comm_send(w, a, n, ADT_F32, r + 1, 7) : adt_comm_recv(w, b, n, ADT_F32, r - 1, 7);
    }
}

/* What a rank loses when it blocks on a collective inside a step (device.slowdown[].sync_s and
 * sync_curve): every rank runs segments of compute (a training step of a small MLP) with and
 * without a small all-reduce after each; the difference per segment less the all-reduce's own
 * back-to-back time, the ranks' mean, the median of CAL_SYNC_ROUNDS (with and without in turn
 * first: a difference of 2-10% of the segment, which five rounds put anywhere in 0.03-0.12 ms on
 * 2 ranks). Back to back, collectives find every rank waiting; after compute, the peers arrive
 * spread out and a rank that blocked is woken late, most of all when ranks time-share the cores,
 * and the more the longer the compute (bench/bench_lockstep.c: on 3 ranks sharing 2 cores about
 * half of it from 0.05 to 14 ms, then held). So the loss is measured after segments of 0.05 to
 * 30 ms (CAL_SYNC_SEGMENTS), each with the segment itself (the ranks computing at once, the cost
 * model's clock); the third, a step of about 1 ms on one core, is sync_s, and the fifth is the
 * in-step probe's own step (instep_probe), so that the loss its waits take is measured, not
 * left to its in-step factor. */
#define CAL_SYNC_ROUNDS 11
#define CAL_SYNC_POINTS 6
#define CAL_SYNC_PROBE 2 /* the point that is sync_s */
static const struct {
    const char *model;
    int batch;
} CAL_SYNC_SEGMENTS[CAL_SYNC_POINTS] = {
    {"{\"type\":\"mlp\",\"sizes\":[64,128,64,10],\"activation\":\"relu\"}", 32},
    {"{\"type\":\"mlp\",\"sizes\":[64,128,64,10],\"activation\":\"relu\"}", 128},
    {"{\"type\":\"mlp\",\"sizes\":[256,512,256,10],\"activation\":\"relu\"}", 64},
    {"{\"type\":\"mlp\",\"sizes\":[256,512,256,10],\"activation\":\"relu\"}", 256},
    {"{\"type\":\"mlp\",\"sizes\":[512,1024,1024,10],\"activation\":\"relu\"}", 64}, /* CAL_PROBE's step */
    {"{\"type\":\"mlp\",\"sizes\":[256,512,256,10],\"activation\":\"relu\"}", 1024},
};
#define CAL_SYNC_MODEL "{\"type\":\"mlp\",\"sizes\":[256,512,256,10],\"activation\":\"relu\"}" /* the relay's too */

/* The ranks' mean of x. */
static double ranks_mean(adt_comm *w, double x) {
    adt_comm_allreduce_f64(w, &x, 1);
    return x / adt_comm_size(w);
}

/* The loss after segments of point i (0 where it failed), *segment the segment. */
static double sync_cost(adt_comm *w, float *x, int i, double *segment) {
    adt_graph *g;
    adt_exec *ex;
    double r[CAL_SYNC_ROUNDS], seg[CAL_SYNC_ROUNDS];
    int rc = model_exec(CAL_SYNC_SEGMENTS[i].model, CAL_SYNC_SEGMENTS[i].batch, 1, 0, &g, &ex), ok = rc == ADT_OK;
    double bad = !ok; /* every rank built its executor, or none times */
    adt_comm_allreduce_f64(w, &bad, 1);
    ok = bad == 0;
    *segment = 0;
    /* segments per timed run: about 40 ms of them (at least 4), from a first estimate */
    double t0 = adt_now_s();
    for (int q = 0; q < 3 && ok; q++) ok = adt_exec_run(ex) == ADT_OK;
    double est = ranks_mean(w, (adt_now_s() - t0) / 3);
    int segs = est > 0 ? (int)(0.04 / est) : 4;
    segs = segs < 4 ? 4 : segs > 400 ? 400 : segs;
    for (int i_r = 0; i_r < CAL_SYNC_ROUNDS; i_r++) {
        double t[2] = {0, 0};
        for (int o = 0; o < 2; o++) {
            int with = o ^ (i_r & 1); /* the order alternates: a drift in speed falls on both alike */
            adt_comm_barrier(w);
            double s0 = adt_now_s();
            for (int q = 0; q < segs && ok; q++) {
                adt_exec_set_lr_step(ex, 1e-4f, q + 1);
                ok = adt_exec_run(ex) == ADT_OK && (!with || adt_comm_allreduce(w, x, 256, ADT_F32) == ADT_OK);
            }
            t[with] = (adt_now_s() - s0) / segs;
        }
        adt_comm_barrier(w);
        double s0 = adt_now_s();
        for (int q = 0; q < 8 && ok; q++) ok = adt_comm_allreduce(w, x, 256, ADT_F32) == ADT_OK;
        r[i_r] = ranks_mean(w, t[1] - t[0] - (adt_now_s() - s0) / 8);
        seg[i_r] = ranks_mean(w, t[0]);
    }
    adt_exec_free(ex);
    adt_graph_free(g);
    qsort(r, CAL_SYNC_ROUNDS, sizeof r[0], cmp_double);
    qsort(seg, CAL_SYNC_ROUNDS, sizeof seg[0], cmp_double);
    *segment = ok ? seg[CAL_SYNC_ROUNDS / 2] : 0;
    return ok && r[CAL_SYNC_ROUNDS / 2] > 0 ? r[CAL_SYNC_ROUNDS / 2] : 0;
}

/* One rank's compute while the others wait for its messages (device.slowdown[].relay_factor):
 * a token passes round the ranks, each computing a segment (a step of CAL_SYNC_MODEL, about 1 ms
 * on one core) before it sends the token on, so one rank computes while the others wait in
 * adt_comm_recv, as a pipeline's stages take turns; the time per segment over a segment's time
 * on rank 0 while the others sleep, the median of CAL_RELAY_ROUNDS. Where ranks outnumber the
 * cores a waiting rank yields and naps (comm.c), and still takes some of them: 4 stages of an
 * MLP at one microbatch ran 1.4 times one rank's step on 2 cores, neither 1 nor 2 times.
 * *segment: the median of rank 0's segment alone (device.slowdown[].relay_segment_s): how long
 * the waits were, of which a waiting rank yielded for the first millisecond. A segment of `runs`
 * steps: at 1 the waits mostly yield, at CAL_RELAY_LONG_RUNS they mostly nap, and the two
 * factors tell a waiting rank's share while it yields from its share once it naps
 * (adt_cluster_nap_share: on one 2-core VM napping ranks took nothing, on another 4 stages of
 * GPT-S at one microbatch ran 1.24 times one rank's step, passes of 150 ms). */
#define CAL_RELAY_ROUNDS 21 /* of 9 the median on 2 ranks moved in 1.03-1.44 across four calibrations in an hour */
#define CAL_RELAY_TURNS 8
#define CAL_RELAY_LONG_RUNS 10 /* steps per segment of the long relay: turns of about 15 ms */
#define CAL_RELAY_LONG_ROUNDS 7
#define CAL_RELAY_LONG_TURNS 3
static double relay_probe(adt_comm *w, int runs, int rounds, int turns, double *segment) {
    adt_graph *g;
    adt_exec *ex;
    int k = adt_comm_size(w), me = adt_comm_rank(w), rc = model_exec(CAL_SYNC_MODEL, 64, 1, 0, &g, &ex), n = 0;
    double bad = rc != ADT_OK, r[CAL_RELAY_ROUNDS], seg[CAL_RELAY_ROUNDS];
    *segment = 0;
    if (rounds > CAL_RELAY_ROUNDS) rounds = CAL_RELAY_ROUNDS;
    adt_comm_allreduce_f64(w, &bad, 1);
    for (int i = 0; i < rounds && bad == 0 && !rc; i++) {
        double lone = 0; /* rank 0's segments alone for at least 50 ms, the others asleep */
        int segs = 0;
        adt_comm_barrier(w);
        if (me == 0) {
            double t0 = adt_now_s();
            do {
                adt_exec_set_lr_step(ex, 1e-4f, segs + 1);
                rc = adt_exec_run(ex);
            } while (!rc && ++segs < 1000 && (segs < runs || adt_now_s() - t0 < 0.05));
            lone = (adt_now_s() - t0) / (segs ? segs : 1) * runs;
        } else {
            usleep(150000 + 20000 * (useconds_t)runs);
        }
        adt_comm_allreduce_f64(w, &lone, 1); /* rank 0's: the others add 0 */
        int32_t token = 0;
        adt_comm_barrier(w);
        double t0 = adt_now_s();
        for (int t = 0; t < turns && !rc; t++) {
            if (me || t) rc = adt_comm_recv(w, &token, 1, ADT_I32, (me + k - 1) % k, 7);
            for (int j = 0; j < runs && !rc; j++) {
                adt_exec_set_lr_step(ex, 1e-4f, t * runs + j + 1);
                rc = adt_exec_run(ex);
            }
            if (!rc && (me < k - 1 || t < turns - 1)) rc = adt_comm_send(w, &token, 1, ADT_I32, (me + 1) % k, 7);
        }
        /* the last rank's clock: it runs the relay's last segment */
        double relay = me == k - 1 ? (adt_now_s() - t0) / (turns * k) : 0;
        adt_comm_allreduce_f64(w, &relay, 1);
        if (lone > 0) seg[n] = lone, r[n++] = relay / lone;
    }
    adt_exec_free(ex);
    adt_graph_free(g);
    if (rc || !n) return 0;
    qsort(r, (size_t)n, sizeof r[0], cmp_double);
    qsort(seg, (size_t)n, sizeof seg[0], cmp_double);
    *segment = seg[n / 2];
    return r[n / 2];
}

/* What the gradient all-reduces of a data-parallel step cost inside the step (the cores' own
 * work, and their waits), beyond the same ranks' compute: in each of CAL_INSTEP_ROUNDS rounds
 * every rank runs CAL_INSTEP_STEPS steps of the compute probe data-parallel over the world (the
 * executor and the mesh communicator `adtrain train` runs, 64 samples per rank), then as many
 * of its own model alone at 64 samples (the two in turn first); the difference per step, the
 * ranks' mean, the median over rounds. Rank 0 prints it ("instep") and the gradients' sizes ("instep_grad"): the parent
 * turns it into device.slowdown[].coll_factor once the all-reduce fit is known. */
#define CAL_INSTEP_ROUNDS 21 /* of 9 the median on 4 ranks moved by 30% from one calibration to the next */
#define CAL_INSTEP_STEPS 8
static int instep_probe(adt_comm *w) {
    int k = adt_comm_size(w), rc = ADT_OK, ranks[64];
    adt_model_cfg m;
    adt_plan p, xp;
    memset(&p, 0, sizeof p), memset(&xp, 0, sizeof xp);
    adt_graph *g = NULL, *lg = NULL;
    adt_exec *dp = NULL, *one = NULL;
    adt_mesh_comm *mc = NULL;
    adt_dist_local loc;
    memset(&loc, 0, sizeof loc);
    if ((rc = adt_model_cfg_parse(&m, CAL_PROBE, "calibration probe"))) return rc;
    p.model = m, p.batch = 64 * k, p.microbatches = 1, p.optim = ADT_OPTIM_ADAMW;
    adt_expert_opts xo = {.strategy = "dp", .devices = k, .batch = 64 * k};
    if (!(rc = adt_plan_build_graph(&p, NULL, &g)) && !(rc = adt_expert_plan(g, &m, &xo, &xp))) {
        adt_dist_plan d = adt_plan_dist(&xp, 0, ranks);
        if (!(rc = adt_mesh_comm_create(&mc, w, &d.mesh)) &&
            !(rc = adt_dist_partition(g, &d, adt_mesh_comm_coord(mc), &loc))) {
            adt_exec_opts eo = {.threads = 1, .seed = 1, .comm = adt_mesh_comm_hook(mc, loc.g)};
            if (!(rc = adt_exec_create(&dp, loc.g, &eo))) rc = adt_exec_init_params(dp);
        }
    }
    if (!rc) rc = model_exec(CAL_PROBE, 64, 1, 0, &lg, &one);
    double bad = rc != ADT_OK; /* every rank built both, or none times */
    adt_comm_allreduce_f64(w, &bad, 1);
    double r[CAL_INSTEP_ROUNDS];
    int n = 0;
    for (int i = 0; i < CAL_INSTEP_ROUNDS && bad == 0; i++) {
        double t[2];
        for (int o = 0; o < 2 && !rc; o++) {
            int which = o ^ (i & 1); /* the order alternates, as in sync_cost */
            adt_exec *ex = which ? one : dp;
            adt_comm_barrier(w);
            double t0 = adt_now_s();
            for (int q = 0; q < CAL_INSTEP_STEPS && !rc; q++) {
                adt_exec_set_lr_step(ex, 1e-4f, q + 1);
                rc = adt_exec_run(ex);
            }
            t[which] = (adt_now_s() - t0) / CAL_INSTEP_STEPS;
            adt_comm_barrier(w); /* the slowest rank's dp step ends the round for all */
        }
        if (rc) break;
        r[n++] = ranks_mean(w, t[0] - t[1]);
    }
    if (!rc && n && adt_comm_rank(w) == 0) {
        qsort(r, (size_t)n, sizeof r[0], cmp_double);
        printf("instep 0 %.9g\n", r[n / 2]);
    }
    adt_exec_free(dp), adt_exec_free(one);
    adt_dist_local_free(&loc);
    adt_mesh_comm_free(mc);
    adt_plan_free(&xp);
    adt_graph_free(g), adt_graph_free(lg);
    return rc;
}

/* The compute slowdown of the k ranks of this world (device.slowdown[].factor): in each of
 * CAL_PAIRS rounds every rank runs the probe at once, then rank 0 alone while the others sleep
 * (spinning in MPI they would take the cores it is timed on); the ranks' mean time over the lone
 * one, the median over rounds. Paired in time: this VM's speed drifts by tens of percent over
 * minutes, and a lone probe timed before the workers started put 4 ranks at 1.95x in one quiet
 * run and 2.66x in another two hours later, where the training runs after each saw about 2. */
#define CAL_PAIRS 5 /* of 3 the median put 2 ranks anywhere in 1.00-1.17 across a day's calibrations */
static double slowdown_probe(adt_comm *w) {
    double ratio[CAL_PAIRS];
    for (int i = 0; i < CAL_PAIRS; i++) {
        adt_comm_barrier(w);
        double all = ranks_mean(w, compute_probe(1));
        adt_comm_barrier(w);
        double one = 0;
        if (adt_comm_rank(w) == 0) one = compute_probe(1);
        else usleep((useconds_t)(2 * CAL_PROBE_S * 1e6));
        adt_comm_allreduce_f64(w, &one, 1); /* rank 0's: the others add 0 */
        ratio[i] = one > 0 ? all / one : 0;
    }
    qsort(ratio, CAL_PAIRS, sizeof ratio[0], cmp_double);
    return ratio[CAL_PAIRS / 2];
}

/* The worker: every rank times each collective kind at each size; rank 0 prints
 * "kind size seconds" lines (per collective, back to back, the mean over rounds and ranks).
 * dedicated: the ranks have a core each, so the probes of ranks time-sharing cores (the sync
 * curve, the relays, the in-step all-reduces) are not run: the cost model applies what they
 * measure only where ranks outnumber cores (src/planner/cores.c). */
static int comm_worker(int dedicated) {
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) return cal_fail(1, "--comm-worker: %s", adt_error_message());
    int rc = 0;
    size_t cap = (size_t)16 << 20;
    /* shared memory, as the executor's arena: its all-reduces take that path (comm.h) */
    float *a = adt_comm_shared_alloc(cap), *b = adt_comm_shared_alloc(cap);
    int64_t *cnt = adt_malloc((size_t)adt_comm_size(w) * sizeof *cnt);
    memset(a, 0, cap), memset(b, 0, cap);
    double slow = slowdown_probe(w);
    if (adt_comm_rank(w) == 0) printf("slowdown 0 %.9g\n", slow);
    for (int i = 0; i < CAL_SYNC_POINTS && !dedicated; i++) {
        double segment, sync = sync_cost(w, a, i, &segment);
        if (adt_comm_rank(w) == 0) printf("sync_loss %d %.9g\nsync_segment %d %.9g\n", i, sync, i, segment);
    }
    if (!dedicated) {
        double segment, relay = relay_probe(w, 1, CAL_RELAY_ROUNDS, CAL_RELAY_TURNS, &segment);
        if (adt_comm_rank(w) == 0) printf("relay 0 %.9g\nrelay_segment 0 %.9g\n", relay, segment);
        relay = relay_probe(w, CAL_RELAY_LONG_RUNS, CAL_RELAY_LONG_ROUNDS, CAL_RELAY_LONG_TURNS, &segment);
        if (adt_comm_rank(w) == 0) printf("relay_long 0 %.9g\nrelay_long_segment 0 %.9g\n", relay, segment);
        if (instep_probe(w)) fprintf(stderr, "calibrate: the in-step probe failed: %s\n", adt_error_message());
    }
    for (int ki = 0; ki < CAL_KINDS && !rc; ki++)
        for (int si = 0; si < CAL_SIZES && !rc; si++) {
            int64_t bytes = (int64_t)4096 << (2 * si), n = bytes / 4;
            /* rounds of CAL_BURST collectives back to back, as a step issues them: a barrier
             * before each round would charge every collective a fresh wake-up of every rank
             * (a scheduler time slice when ranks outnumber the cores); the mean over rounds, a
             * step paying the mean, the scheduler's delays included */
            enum { CAL_BURST = 8, CAL_ROUNDS = 4 };
            double mean = 0;
            for (int r = 0; r < CAL_ROUNDS + 1 && !rc; r++) {
                adt_comm_barrier(w);
                double t0 = adt_now_s();
                for (int q = 0; q < CAL_BURST && !rc; q++) rc = run_collective(w, cal_kind[ki], a, b, n, cnt);
                double dt = ranks_mean(w, (adt_now_s() - t0) / CAL_BURST);
                if (r >= 1) mean += dt / CAL_ROUNDS;
            }
            if (!rc && adt_comm_rank(w) == 0) printf("%s %lld %.9g\n", adt_coll_kind_name(cal_kind[ki]), (long long)bytes, mean);
        }
    adt_comm_shared_free(a), adt_comm_shared_free(b), free(cnt);
    adt_comm_finalize(w);
    return rc ? 1 : 0;
}

/* Least squares t = x_a alpha + x_b beta (relative error) of the rows of one kind on k ranks. */
typedef struct cal_fit {
    double ata[2][2], atb[2];
    int rows;
} cal_fit;

static void fit_add(cal_fit *f, int kind, int k, double bytes, double t) {
    double xa, xb, kk = k;
    switch (kind) { /* dist.h's boxing table, as adt_cluster_coll_time prices */
    case ADT_BOXING_ALL_REDUCE: xa = 2 * (kk - 1), xb = 2 * (kk - 1) / kk * bytes; break;
    case ADT_BOXING_REDUCE_SCATTER:
    case ADT_BOXING_ALL_GATHER: xa = kk - 1, xb = (kk - 1) / kk * bytes; break;
    case ADT_BOXING_ALL_TO_ALL: xa = kk - 1, xb = (kk - 1) / (kk * kk) * bytes; break;
    default: xa = 1, xb = bytes; break;
    }
    /* relative errors: every size counts alike (the small ones set alpha, the large ones beta) */
    double w = t > 0 ? 1.0 / t : 0;
    xa *= w, xb *= w, t *= w;
    f->ata[0][0] += xa * xa, f->ata[0][1] += xa * xb, f->ata[1][1] += xb * xb;
    f->atb[0] += xa * t, f->atb[1] += xb * t;
    f->rows++;
}

/* alpha >= 0 and beta > 0 of a fit (alpha clamped at 0 refits beta alone); 0 when it fails. */
static int fit_solve(const cal_fit *f, double *alpha, double *beta) {
    double det = f->ata[0][0] * f->ata[1][1] - f->ata[0][1] * f->ata[0][1];
    if (!(det > 0)) return 0;
    double a = (f->atb[0] * f->ata[1][1] - f->atb[1] * f->ata[0][1]) / det;
    double b = (f->ata[0][0] * f->atb[1] - f->ata[0][1] * f->atb[0]) / det;
    if (a < 0) a = 0, b = f->atb[1] / f->ata[1][1];
    if (!(b > 0)) return 0;
    *alpha = a, *beta = b;
    return 1;
}

/* This binary's path (the workers run it again); 0 when found. */
static int self_path(char *buf, size_t n) {
    ssize_t len = readlink("/proc/self/exe", buf, n - 1);
    if (len <= 0) return -1;
    buf[len] = 0;
    return 0;
}

/* Runs the worker on k ranks: the pooled all-reduce rows into `pooled`, every kind's fit on k
 * ranks into the link's collectives. */
/* One measurement on k ranks: the probes' results into *slowdown, *sync, *instep_s, *relay and
 * *segment (the relay's turn alone), long[0] and long[1] (the same of the long relay), and every
 * collective's timings into fit[] (per kind) and, the all-reduces, into pooled. */
static int measure_ranks(int k, int dedicated, cal_fit *pooled, cal_fit *fit, double *slowdown, double *sync,
                         double *instep_s, double *relay, double *segment, double *relay_long, double *curve) {
    char self[1024], cmd[1200];
    if (self_path(self, sizeof self)) return cal_fail(1, "--ranks: cannot find this program's path to start workers");
    snprintf(cmd, sizeof cmd, "mpiexec -n %d '%s' calibrate --comm-worker%s 2>&1", k, self,
             dedicated ? "-dedicated" : "");
    FILE *p = popen(cmd, "r");
    if (!p) return cal_fail(1, "--ranks: cannot start '%s'", cmd);
    char line[256];
    int rows = 0;
    while (fgets(line, sizeof line, p)) {
        char kind[32];
        long long s;
        double t;
        int ki = 0, got = sscanf(line, "%31s %lld %lg", kind, &s, &t) == 3;
        if (got && (!strcmp(kind, "instep") || !strcmp(kind, "relay_segment"))) {
            *(kind[0] == 'i' ? instep_s : segment) = t;
            continue;
        }
        if (got && (!strcmp(kind, "sync_loss") || !strcmp(kind, "sync_segment")) && s >= 0 && s < CAL_SYNC_POINTS) {
            curve[2 * s + !strcmp(kind, "sync_loss")] = t; /* [segment, loss] pairs */
            if (s == CAL_SYNC_PROBE && !strcmp(kind, "sync_loss")) *sync = t;
            continue;
        }
        if (got && (!strcmp(kind, "relay_long") || !strcmp(kind, "relay_long_segment"))) {
            relay_long[!strcmp(kind, "relay_long_segment")] = t;
            continue;
        }
        if (got && (!strcmp(kind, "slowdown") || !strcmp(kind, "relay"))) {
            *(kind[0] == 'r' ? relay : slowdown) = t;
            continue;
        }
        if (got)
            while (ki < CAL_KINDS && strcmp(kind, adt_coll_kind_name(cal_kind[ki]))) ki++;
        if (!got || ki >= CAL_KINDS) {
            fprintf(stderr, "calibrate: %d ranks: %s", k, line);
            continue;
        }
        fit_add(&fit[ki], cal_kind[ki], k, (double)s, t);
        if (cal_kind[ki] == ADT_BOXING_ALL_REDUCE) fit_add(pooled, cal_kind[ki], k, (double)s, t);
        rows++;
        fprintf(stderr, "calibrate: %-14s on %d ranks, %8lld bytes: %9.1f us\n", kind, k, s, t * 1e6);
    }
    int st = pclose(p);
    if (st || rows != CAL_SIZES * CAL_KINDS)
        return cal_fail(1, "--ranks: '%s' gave %d of %d timings (status %d)", cmd, rows, CAL_SIZES * CAL_KINDS, st);
    return 0;
}

/* Each kind's fit on k ranks from its timings (fit[]) into the link's collectives. */
static void add_fits(int k, const cal_fit *fit, adt_link *l) {
    for (int ki = 0; ki < CAL_KINDS; ki++) {
        adt_coll_fit f = {.kind = cal_kind[ki], .ranks = k};
        if (!fit_solve(&fit[ki], &f.alpha, &f.beta) || l->n_coll >= ADT_LINK_MAX_COLL) continue;
        l->coll[l->n_coll++] = f;
        fprintf(stderr, "calibrate: %-14s on %d ranks: alpha %.3g us, beta %.3g GB/s\n", adt_coll_kind_name(f.kind), k,
                f.alpha * 1e6, 1e-9 / f.beta);
    }
}

static double median_of(double *x, int n) {
    qsort(x, (size_t)n, sizeof x[0], cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* The seconds one step of the in-step probe's plan takes by the cost model on cluster c: CAL_PROBE
 * at `per_rank` samples on each of k devices, data parallel; -1 where it cannot be priced. */
static double probe_step_s(const adt_cluster *c, int k, int per_rank) {
    if (k > 64) return -1;
    adt_model_cfg m;
    adt_plan p, xp;
    memset(&p, 0, sizeof p), memset(&xp, 0, sizeof xp);
    adt_graph *g = NULL;
    double t = -1;
    if (adt_model_cfg_parse(&m, CAL_PROBE, "calibration probe")) return -1;
    p.model = m, p.batch = per_rank * k, p.microbatches = 1, p.optim = ADT_OPTIM_ADAMW;
    adt_expert_opts xo = {.strategy = "dp", .devices = k, .batch = per_rank * k};
    if (!adt_plan_build_graph(&p, NULL, &g) && !adt_expert_plan(g, &m, &xo, &xp)) {
        int rk[64];
        adt_mesh sm;
        adt_cost_report r;
        if (!adt_plan_stage_mesh(&xp, 0, &sm, rk)) {
            xp.cost = adt_cluster_mesh_cost(c, &sm);
            if (!adt_plan_cost(&xp, g, c, &r)) t = r.step_s;
        }
    }
    adt_error_clear();
    adt_plan_free(&xp);
    adt_graph_free(g);
    return t;
}

/* device.slowdown[].coll_factor of k ranks: the factor at which the cost model prices the in-step
 * probe's data-parallel step `instep` seconds over the same k ranks computing alone, as measured.
 * Fitted through the cost model itself, so that its own charges (the loss of each blocked wait
 * by the sync curve, measured after the probe's own step too) are what the factor leaves out: a
 * hand count of one wait left the model pricing the probe 2 ms (35%) over its measurement on 4
 * ranks, the model charging three. The price is linear in the factor (the shared-memory
 * all-reduces run on the compute clock, their bytes at coll_factor times the fit's): two
 * pricings find it. 0 where the probe cannot be priced. */
static double instep_coll_factor(const adt_cluster *c, int k, double instep) {
    adt_cluster *x = adt_malloc(sizeof *x);
    *x = *c;
    int e = -1;
    for (int i = 0; i < x->n_slowdown; i++)
        if (x->slowdown[i].ranks == k) e = i;
    double cf = 0;
    if (e >= 0) {
        x->slowdown[e].coll_factor = 1;
        double t1 = probe_step_s(x, k, 64);
        x->slowdown[e].coll_factor = 2;
        double t2 = probe_step_s(x, k, 64), alone = probe_step_s(x, 1, 64) * adt_cluster_share(x, k);
        double per = t2 - t1, fixed = t1 - per - alone; /* the factor's seconds per unit, the rest */
        if (t1 > 0 && alone > 0 && per > 0) {
            cf = (instep - fixed) / per;
            cf = cf < 0.25 ? 0.25 : cf > 50 ? 50 : cf;
        }
    }
    free(x);
    return cf;
}

/* ---- the command ---------------------------------------------------------------------------------- */

/* The user's --model i, FILE[:B]: its path and batch, the file read and checked as a model. */
static int user_model_arg(const cal_opts *o, int i, char *path, size_t n, long *batch, char **text) {
    size_t len;
    *batch = o->batch, *text = NULL;
    snprintf(path, n, "%s", o->model[i]);
    char *colon = strrchr(path, ':');
    if (colon) {
        *colon = 0;
        if (cli_parse_long("calibrate", "--model's :B", colon + 1, 1, 1 << 20, batch)) return 2;
    }
    adt_model_cfg m;
    if (adt_file_read(path, 1 << 20, "model file", text, &len) || adt_model_cfg_parse(&m, *text, path)) {
        free(*text);
        *text = NULL;
        return cal_fail(2, "--model: %s", adt_error_message());
    }
    return 0;
}

/* The user's --model i (FILE[:B]) timed at B, B/2 and B/4 into acc. */
static int time_user_model(const cal_opts *o, int i, cal_compute *acc) {
    char *text = NULL, path[1024];
    long batch;
    int rc = user_model_arg(o, i, path, sizeof path, &batch, &text);
    if (rc) return rc;
    for (long b = batch, q = 0; q < 3 && !rc; q++, b = (b + 1) / 2)
        if (time_model(text, (int)b, (int)o->threads, acc)) rc = cal_fail(2, "--model %s: %s", o->model[i], adt_error_message());
    free(text);
    return rc;
}

/* The compute timings: --procs processes (this binary as --compute-worker, with the same flags)
 * each time every node once; each node's median time goes into acc. A process's kernels run up
 * to 25% faster or slower than the next one's here, whatever its steps (VGG's step in six
 * processes: 5.0-6.3 ms), so one process's timings would price every plan by its luck. The
 * workers run one after another: none shares the cores with another. With --ranks they run
 * spread over the rank probes (cli_calibrate): this machine's speed also drifts over minutes,
 * and nine workers back to back (15 s) caught one moment of it: four calibrations within an
 * hour read the VGG's convolutions at 47 to 61 GFLOP/s while its one-rank step measured the same
 * in the rounds after each. */
typedef struct cal_workers {
    char cmd[8192];
    int procs, ran, count; /* workers asked for, run so far; node timings per worker */
    double secs[CAL_MAX_PROCS][CAL_MAX_NODES];
    struct { int op; double flops, bytes; } first[CAL_MAX_NODES];
} cal_workers;

static int workers_init(cal_workers *cw, int procs, int argc, char **argv) {
    char self[1024];
    if (self_path(self, sizeof self)) return cal_fail(1, "cannot find this program's path to start the compute workers");
    int len = snprintf(cw->cmd, sizeof cw->cmd, "'%s' calibrate --compute-worker", self);
    for (int i = 1; i < argc; i++) { /* the same flags, quoted; -o and --ranks do not matter there */
        if (strchr(argv[i], '\'') || len >= (int)sizeof cw->cmd - 8)
            return cal_fail(2, "flag '%s': a quote in a flag is not supported", argv[i]);
        len += snprintf(cw->cmd + len, sizeof cw->cmd - (size_t)len, " '%s'", argv[i]);
    }
    snprintf(cw->cmd + len, sizeof cw->cmd - (size_t)len, " 2>&1");
    cw->procs = procs, cw->ran = 0, cw->count = -1;
    return 0;
}

/* The next worker's node timings into cw. */
static int worker_run(cal_workers *cw) {
    int w = cw->ran;
    FILE *p = popen(cw->cmd, "r");
    if (!p) return cal_fail(1, "cannot start '%s'", cw->cmd);
    char line[512];
    int k = 0, op;
    double f, b, t;
    while (fgets(line, sizeof line, p)) {
        if (sscanf(line, "node %d %lg %lg %lg", &op, &f, &b, &t) != 4 || k >= CAL_MAX_NODES) {
            fprintf(stderr, "calibrate: compute worker: %s", line);
            continue;
        }
        if (w == 0) cw->first[k].op = op, cw->first[k].flops = f, cw->first[k].bytes = b;
        else if (cw->first[k].op != op || cw->first[k].flops != f) k = CAL_MAX_NODES; /* out of step: refused below */
        if (k < CAL_MAX_NODES) cw->secs[w][k++] = t;
    }
    int st = pclose(p);
    if (st || k == 0 || (cw->count >= 0 && k != cw->count))
        return cal_fail(1, "compute worker %d of %d ('%s') failed (status %d, %d node timings)", w + 1, cw->procs,
                        cw->cmd, st, k);
    cw->count = k, cw->ran++;
    return 0;
}

/* Workers until `upto` of them have run. */
static int workers_run_upto(cal_workers *cw, int upto) {
    int rc = 0;
    while (!rc && cw->ran < upto && cw->ran < cw->procs) rc = worker_run(cw);
    return rc;
}

/* Each node's median over the workers into acc. */
static void workers_finish(const cal_workers *cw, cal_compute *acc) {
    for (int i = 0; i < cw->count; i++) {
        double v[CAL_MAX_PROCS];
        for (int w = 0; w < cw->ran; w++) v[w] = cw->secs[w][i];
        qsort(v, (size_t)cw->ran, sizeof v[0], cmp_double);
        acc_add(acc, cw->first[i].op, cw->first[i].flops, cw->first[i].bytes, v[cw->ran / 2]);
    }
}

int cli_calibrate(int argc, char **argv) {
    cal_opts o = {.ranks = 1, .threads = 1, .batch = 32, .procs = CAL_COMPUTE_PROCS, .repeat = CAL_REPEAT};
    static const char *const switches[] = {"--comm-worker", "--comm-worker-dedicated", "--compute-worker", NULL};
    int rc = cli_parse_flags_switches("calibrate", argc, argv, cal_usage, cal_apply, &o, switches);
    if (rc) return rc < 0 ? 0 : rc;
    if (o.comm_worker) return comm_worker(o.dedicated);

    static const struct { const char *json; int batch[2]; } models[] = {
        {"{\"type\":\"mlp\",\"sizes\":[512,1024,1024,10],\"activation\":\"relu\"}", {16, 128}},
        {"{\"type\":\"vgg\",\"in_channels\":3,\"height\":32,\"width\":32,\"blocks\":[[32],[64]],\"fc\":[128],"
         "\"classes\":10}", {4, 16}},
        {"{\"type\":\"gpt\",\"vocab_size\":256,\"n_ctx\":128,\"n_layer\":2,\"n_embd\":256,\"n_head\":4}", {2, 8}},
        {"{\"type\":\"dlrm\",\"n_dense\":16,\"n_tables\":8,\"table_rows\":4096,\"emb_dim\":16,\"bottom\":[128,16],"
         "\"top\":[128,1]}", {64, 512}},
    };
    cal_compute *acc = adt_calloc(1, sizeof *acc);
    if (o.compute_worker) { /* one process's timings of every node, for the parent's medians */
        for (int sc = 0; sc < 2 && !rc; sc++)
            for (size_t i = 0; i < sizeof models / sizeof models[0] && !rc; i++)
                if (time_model(models[i].json, models[i].batch[sc], (int)o.threads, acc))
                    rc = cal_fail(1, "timing the kernels: %s", adt_error_message());
        for (int i = 0; i < o.n_models && !rc; i++) rc = time_user_model(&o, i, acc);
        for (int i = 0; i < acc->n_nodes && !rc; i++)
            printf("node %d %.17g %.17g %.9g\n", acc->node[i].op, acc->node[i].flops, acc->node[i].bytes,
                   acc->node[i].secs);
        free(acc);
        return rc;
    }
    for (int i = 0; i < o.n_models && !rc; i++) { /* bad --model: said here, not by every worker */
        char path[1024], *text;
        long batch;
        rc = user_model_arg(&o, i, path, sizeof path, &batch, &text);
        free(text);
    }
    /* R measurements of every rank count, the counts in turn (2, 3, .., N, 2, 3, ..): this VM's
     * speed drifts over minutes, and one measurement's probes move with it (within an hour: the
     * relay factor of 2 ranks 1.03-1.44, the slowdown of 3 1.45-1.72); the median of each probe,
     * and one fit of each collective over all its timings. The compute workers run spread
     * between them (cal_workers). */
    int nk = o.ranks >= 2 ? (int)o.ranks - 1 : 0, R = (int)o.repeat, slots = nk * R;
    /* [k][r][slow, sync, instep, relay, the relay's segment, the long relay's two, then the sync
     * curve's CAL_SYNC_POINTS [segment, loss] pairs] */
    enum { NP = 7 + 2 * CAL_SYNC_POINTS };
    double *probe = adt_calloc((size_t)(slots ? slots : 1) * NP, sizeof *probe);
    cal_fit *fits = adt_calloc((size_t)(nk ? nk : 1) * CAL_KINDS, sizeof *fits), pooled;
    memset(&pooled, 0, sizeof pooled);
    /* ranks beyond the cores time-share them (each with its threads) */
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int cores_per_node = cores > 0 ? (int)(cores / o.threads > 0 ? cores / o.threads : 1) : 0;
    cal_workers *cw = adt_calloc(1, sizeof *cw);
    if (!rc) rc = workers_init(cw, (int)o.procs, argc, argv);
    for (int j = 0; j <= slots && !rc; j++) { /* before measurement j: worker ceil((j+1) P / (slots+1)) */
        rc = workers_run_upto(cw, (int)(((long)(j + 1) * cw->procs + slots) / (slots + 1)));
        if (rc || j == slots) continue;
        int r = j / nk, k = 2 + j % nk;
        double *q = probe + ((size_t)(k - 2) * R + r) * NP;
        q[2] = -1;
        rc = measure_ranks(k, cores_per_node > 0 && k <= cores_per_node, &pooled, fits + (size_t)(k - 2) * CAL_KINDS, &q[0], &q[1], &q[2], &q[3], &q[4], &q[5],
                           &q[7]);
    }
    if (!rc) workers_finish(cw, acc);
    free(cw);
    if (rc) {
        free(acc), free(probe), free(fits);
        return rc;
    }
    adt_cluster c;
    memset(&c, 0, sizeof c);
    snprintf(c.name, sizeof c.name, "calibrated");
    snprintf(c.device_kind, sizeof c.device_kind, "this machine: one rank, %ld OpenBLAS thread(s), %ld cores", o.threads,
             cores);
    c.nodes = 1, c.devices_per_node = (int)o.ranks;
    c.cores_per_node = cores_per_node;
    c.compute_dtype = ADT_F32, c.efficiency = 1.0;
    /* the fixed cost of an op: the median time of the tiny ones; the rates count it out */
    if (acc->n_tiny) {
        qsort(acc->tiny, (size_t)acc->n_tiny, sizeof acc->tiny[0], cmp_double);
        c.launch_s = acc->tiny[acc->n_tiny / 2];
    }
    c.small_flops = CAL_SMALL_FLOPS;
    for (int k = 0; k < ADT_OPCLASS_COUNT; k++) {
        for (int sc = 0; sc < 2; sc++) {
            if (!(acc->secs[sc][k] > 0)) continue;
            double busy = acc->secs[sc][k] - acc->ops[sc][k] * c.launch_s; /* without the fixed costs */
            if (busy < 0.5 * acc->secs[sc][k]) busy = 0.5 * acc->secs[sc][k];
            double r = acc->flops[sc][k] / busy, br = 0;
            if (k == ADT_OPCLASS_MATMUL || k == ADT_OPCLASS_CONV) fit_byte_rate(acc, k, sc, c.launch_s, &r, &br);
            fprintf(stderr, "calibrate: %-9s %s ops: %.3g GFLOP/s", adt_op_class_name(k), sc ? "large" : "small", r * 1e-9);
            if (br > 0) fprintf(stderr, " and %.3g GB/s", br * 1e-9);
            fprintf(stderr, "\n");
            if (sc) c.rate[k] = r, c.byte_rate[k] = br;
            else c.rate_small[k] = r, c.byte_rate_small[k] = br;
            if (r > c.peak_flops[ADT_F32]) c.peak_flops[ADT_F32] = r;
        }
        if (!(c.rate[k] > 0)) c.rate[k] = c.rate_small[k];
    }
    c.memory_bw = copy_bandwidth();
    accumulate_rates(&c);
    fit_op_factors(&c, acc);
    free(acc);
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    c.memory_bytes = pages > 0 && psz > 0 ? (double)pages * (double)psz / (double)o.ranks : 8e9;
    fprintf(stderr, "calibrate: memory bandwidth %.3g GB/s, %.3g GB per rank\n", c.memory_bw * 1e-9, c.memory_bytes * 1e-9);
    c.n_links = 1;
    snprintf(c.link[0].name, sizeof c.link[0].name, "shared-memory");
    c.link[0].span = (int)o.ranks;
    c.link[0].bandwidth = c.memory_bw / 2, c.link[0].latency = 1e-6; /* without --ranks: a guess */
    if (o.ranks >= 2) {
        /* compute with k busy ranks against one: the slowdown the cost model applies */
        c.slowdown[c.n_slowdown].ranks = 1, c.slowdown[c.n_slowdown++].factor = 1.0;
        for (int k = 2; k <= o.ranks; k++) {
            add_fits(k, fits + (size_t)(k - 2) * CAL_KINDS, &c.link[0]);
            double m[NP], col[CAL_MAX_REPEAT];
            for (int j = 0; j < NP; j++) {
                int n = 0;
                for (int r = 0; r < R; r++) {
                    double v = probe[((size_t)(k - 2) * R + r) * NP + j];
                    /* a failed slowdown, relay or sync probe gives 0 (a loss of 0 counts), a
                     * missing in-step one -1 */
                    int loss = j >= 7 && (j - 7) % 2 == 1;
                    if ((j == 0 || j >= 3) && !loss ? v > 0 : v >= 0) col[n++] = v;
                }
                m[j] = n ? median_of(col, n) : j == 2 ? -1 : 0;
            }
            double slow = m[0], sync = m[1], instep = m[2], relay = m[3];
            if (slow > 0 && c.n_slowdown < ADT_CLUSTER_MAX_SLOWDOWN) {
                double f = slow < 1 ? 1 : slow;
                c.slowdown[c.n_slowdown].ranks = k, c.slowdown[c.n_slowdown].sync_s = sync;
                c.slowdown[c.n_slowdown].relay_factor = relay; /* 0 where the probe failed */
                c.slowdown[c.n_slowdown].relay_segment_s = relay > 0 ? m[4] : 0;
                c.slowdown[c.n_slowdown].relay_long_factor = relay > 0 && m[5] > 0 ? m[5] : 0;
                c.slowdown[c.n_slowdown].relay_long_segment_s = relay > 0 && m[5] > 0 ? m[6] : 0;
                int ns = 0; /* the points whose segment was measured, ascending */
                for (int i = 0; i < CAL_SYNC_POINTS && ns < ADT_SYNC_POINTS; i++) {
                    double seg = m[7 + 2 * i], loss = m[8 + 2 * i];
                    if (!(seg > (ns ? c.slowdown[c.n_slowdown].sync_curve[ns - 1][0] : 0))) continue;
                    c.slowdown[c.n_slowdown].sync_curve[ns][0] = seg, c.slowdown[c.n_slowdown].sync_curve[ns++][1] = loss;
                    fprintf(stderr, "calibrate: %d ranks: a blocked collective after %.3f ms of compute: %.0f us more\n", k,
                            seg * 1e3, loss * 1e6);
                }
                c.slowdown[c.n_slowdown].n_sync = ns;
                c.slowdown[c.n_slowdown++].factor = f;
                if (cores_per_node > 0 && k <= cores_per_node) { /* a core each: the factor alone */
                    fprintf(stderr, "calibrate: compute with %d busy ranks on %d cores: %.2fx one rank's time\n", k,
                            cores_per_node, f);
                    continue;
                }
                double cf = instep >= 0 ? instep_coll_factor(&c, k, instep) : 0;
                c.slowdown[c.n_slowdown - 1].coll_factor = cf;
                fprintf(stderr, "calibrate: compute with %d busy ranks: %.2fx one rank's time; a blocked collective "
                        "inside a step %.0f us more; one rank while %d wait for it: %.2fx on %.2f ms turns (medians "
                        "of %d); %.2fx on %.1f ms turns\n", k, f, sync * 1e6, k - 1, relay, m[4] * 1e3, R, m[5],
                        m[6] * 1e3);
                if (cf > 0)
                    fprintf(stderr, "calibrate: a data-parallel step's all-reduces on %d ranks: %.4g ms beyond compute, "
                            "their shared-memory part %.2fx its back-to-back time\n", k, instep * 1e3, cf);
            }
        }
        double a, b;
        if (!fit_solve(&pooled, &a, &b)) {
            free(probe), free(fits);
            return cal_fail(1, "--ranks: the all-reduce times do not fit alpha + S beta");
        }
        c.link[0].latency = a, c.link[0].bandwidth = 1.0 / b;
        fprintf(stderr, "calibrate: link (all-reduce, every rank count) alpha %.3g us, beta %.3g GB/s\n", a * 1e6,
                1e-9 / b);
    }
    free(probe), free(fits);
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
