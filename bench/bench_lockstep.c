/*
 * bench_lockstep.c - what a lockstep point costs inside a step, against the compute before it.
 *
 *   mpiexec -n K build/bench/bench_lockstep [--segments "256,512,256,10:64;64,128,64,10:32"]
 *                                           [--patterns "1x256,34x10000"] [--rounds 11]
 *
 * The cost model charges a rank that blocks on a collective inside a step the cluster's sync_s
 * (the calibration's sync probe: one segment of about 1 ms of compute on one core, then a small
 * all-reduce), ramped by the compute since the last blocked wait over SYNC_RAMP_S
 * (src/planner/cost.c); the all-reduces themselves at their back-to-back fit times the in-step
 * factor. This measures the same thing over a range of segments: every rank runs segments of
 * compute (one training step of an MLP through the executor, as the calibration's probe does),
 * in one timed run with a pattern of all-reduces after each segment ("with") and in one without
 * ("without"), the two in turn first from round to round; per round the ranks' mean of the
 * difference per segment, and the pattern's time back to back (after a barrier, 8 times, the
 * ranks' mean). Where ranks outnumber the cores, "without" is the ranks time-sharing the cores
 * freely, and "with" adds what holding them in step costs beyond the all-reduces' own time: the
 * loss (with - without - back to back).
 *
 * A segment is "SIZES:BATCH" (an MLP's layer sizes and its batch; by default [64,128,64,10] at
 * 8, 32 and 128 and [256,512,256,10] at 16 to 1024: about 0.03 to 30 ms with 3 ranks on 2 cores);
 * a pattern "NxE" (N all-reduces of E floats, in shared memory as the executor's arena, one after
 * another), "NmE" (the same in private memory: MPI's all-reduce) or "NpE" (the same in shared
 * memory on pairs of ranks, the two pairings of a 2x2 mesh in turn, as a hybrid plan's collectives
 * along its dp and tp axes: every rank count a multiple of 4; a pair whose peer is off the cores
 * waits for it where ranks outnumber the cores). Rank 0 prints one JSON line
 * per segment and pattern: "segment_ms" (the free-running segment: the compute clock the cost
 * model prices), "with_minus_without_ms" (median, quartiles and mean over rounds), "back_to_back_ms"
 * (median), "loss_ms" (the difference of the medians) and "loss_per_segment".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/comm.h"
#include "adtrain/exec.h"
#include "adtrain/planner.h"
#include "bench_stats.h"

#define MAX_ITEMS 16

typedef struct segment {
    char sizes[96];
    int batch;
} segment;

typedef struct pattern {
    int n, mpi; /* mpi: private buffers, so MPI's path (comm.h), not the shared-memory one */
    int pairs;  /* on pairs: the two pairings of a 2x2 mesh in turn */
    long elems;
} pattern;

static adt_comm *g_pair[2]; /* this rank's pair of each pairing (NULL unless the ranks are 4k) */

typedef struct opts {
    segment seg[MAX_ITEMS];
    pattern pat[MAX_ITEMS];
    int n_seg, n_pat, rounds;
} opts;

static int usage(const char *why) {
    const char *rank = getenv("PMI_RANK"); /* before MPI starts: one rank says it, not all */
    if (rank && strcmp(rank, "0")) return 2;
    fprintf(stderr,
            "bench_lockstep: %s\n"
            "usage: mpiexec -n K bench_lockstep [--segments \"SIZES:BATCH;...\"] [--patterns \"NxE,...\"]\n"
            "                                   [--rounds R]\n"
            "  SIZES: an MLP's layer sizes, comma-separated (e.g. 256,512,256,10); BATCH >= 1\n"
            "  NxE: N all-reduces (1..64) of E floats (1..4194304) after every segment, in shared\n"
            "  memory; NmE: the same through MPI's all-reduce; NpE: in shared memory on pairs of\n"
            "  ranks, two pairings in turn (K a multiple of 4); R: 3..99\n",
            why);
    return 2;
}

static int parse_segments(const char *v, opts *o) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", v);
    o->n_seg = 0;
    for (char *save = NULL, *t = strtok_r(buf, ";", &save); t; t = strtok_r(NULL, ";", &save)) {
        char *colon = strrchr(t, ':'), *end;
        if (!colon || o->n_seg == MAX_ITEMS || colon - t >= (long)sizeof o->seg[0].sizes) return -1;
        long b = strtol(colon + 1, &end, 10);
        if (*end || b < 1 || b > 65536) return -1;
        *colon = 0;
        for (const char *c = t; *c; c++)
            if ((*c < '0' || *c > '9') && *c != ',') return -1;
        snprintf(o->seg[o->n_seg].sizes, sizeof o->seg[0].sizes, "%s", t);
        o->seg[o->n_seg++].batch = (int)b;
    }
    return o->n_seg ? 0 : -1;
}

static int parse_patterns(const char *v, opts *o) {
    char buf[512];
    snprintf(buf, sizeof buf, "%s", v);
    o->n_pat = 0;
    for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        char *end;
        long n = strtol(t, &end, 10);
        if ((*end != 'x' && *end != 'm' && *end != 'p') || n < 1 || n > 64 || o->n_pat == MAX_ITEMS) return -1;
        int mpi = *end == 'm', pairs = *end == 'p';
        long e = strtol(end + 1, &end, 10);
        if (*end || e < 1 || e > (4L << 20)) return -1;
        o->pat[o->n_pat++] = (pattern){(int)n, mpi, pairs, e};
    }
    return o->n_pat ? 0 : -1;
}

static int parse_opts(int argc, char **argv, opts *o) {
    memset(o, 0, sizeof *o);
    o->rounds = 11;
    parse_segments("64,128,64,10:8;64,128,64,10:32;64,128,64,10:128;256,512,256,10:16;256,512,256,10:32;"
                   "256,512,256,10:64;256,512,256,10:128;256,512,256,10:256;256,512,256,10:1024",
                   o);
    parse_patterns("1x256", o);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--segments") && v) {
            if (parse_segments(v, o)) return usage("--segments: expected SIZES:BATCH;... (e.g. 256,512,256,10:64)");
        } else if (!strcmp(a, "--patterns") && v) {
            if (parse_patterns(v, o)) return usage("--patterns: expected NxE,... (e.g. 1x256,34x10000)");
        } else if (!strcmp(a, "--rounds") && v) {
            char *end;
            long r = strtol(v, &end, 10);
            if (*end || r < 3 || r > 99) return usage("--rounds: expected an integer in 3..99");
            o->rounds = (int)r;
        } else {
            return usage(v ? "unknown flag" : "a flag without its value");
        }
        i++;
    }
    return 0;
}

/* One training step of the MLP through the executor: the segment of compute. */
static int segment_exec(const segment *s, adt_graph **g, adt_exec **ex) {
    char json[256];
    snprintf(json, sizeof json, "{\"type\":\"mlp\",\"sizes\":[%s],\"activation\":\"relu\"}", s->sizes);
    adt_model_cfg m;
    *g = NULL, *ex = NULL;
    if (adt_model_cfg_parse(&m, json, "--segments")) return ADT_ERR_ARG;
    adt_plan p;
    memset(&p, 0, sizeof p);
    p.model = m, p.batch = s->batch, p.microbatches = 1, p.optim = ADT_OPTIM_ADAMW;
    int rc = adt_plan_build_graph(&p, NULL, g);
    adt_exec_opts eo = {.threads = 1, .seed = 1};
    if (!rc) rc = adt_exec_create(ex, *g, &eo);
    if (!rc) rc = adt_exec_init_params(*ex);
    return rc;
}

static int run_pattern(adt_comm *w, float *shared, float *private_buf, const pattern *p) {
    int rc = ADT_OK;
    float *buf = p->mpi ? private_buf : shared;
    for (int j = 0; j < p->n && !rc; j++)
        rc = adt_comm_allreduce(p->pairs ? g_pair[j & 1] : w, buf + (size_t)j * p->elems, p->elems, ADT_F32);
    return rc;
}

/* The ranks' mean of x. */
static double mean_over_ranks(adt_comm *w, double x) {
    adt_comm_allreduce_f64(w, &x, 1);
    return x / adt_comm_size(w);
}

static int measure(adt_comm *w, const opts *o, const segment *s, const pattern *p, float *buf, float *priv) {
    adt_graph *g;
    adt_exec *ex;
    int rc = segment_exec(s, &g, &ex);
    double bad = rc != ADT_OK; /* every rank built it, or none times */
    adt_comm_allreduce_f64(w, &bad, 1);
    if (bad) {
        adt_exec_free(ex);
        adt_graph_free(g);
        return rc ? rc : ADT_ERR_STATE;
    }
    /* segments per timed run: about 60 ms of them, from a first estimate */
    double t0 = adt_now_s();
    for (int q = 0; q < 3 && !rc; q++) rc = adt_exec_run(ex);
    double est = mean_over_ranks(w, (adt_now_s() - t0) / 3);
    int segs = est > 0 ? (int)(0.06 / est) : 8;
    segs = segs < 8 ? 8 : segs > 400 ? 400 : segs;
    double *diff = adt_calloc((size_t)o->rounds, sizeof *diff), *alone = adt_calloc((size_t)o->rounds, sizeof *alone);
    double *b2b = adt_calloc((size_t)o->rounds, sizeof *b2b);
    for (int i = 0; i < o->rounds && !rc; i++) {
        double t[2] = {0, 0};
        for (int k = 0; k < 2 && !rc; k++) {
            int with = k ^ (i & 1); /* the order alternates: a drift in speed falls on both alike */
            adt_comm_barrier(w);
            double s0 = adt_now_s();
            for (int q = 0; q < segs && !rc; q++) {
                adt_exec_set_lr_step(ex, 1e-4f, q + 1);
                rc = adt_exec_run(ex);
                if (with && !rc) rc = run_pattern(w, buf, priv, p);
            }
            t[with] = (adt_now_s() - s0) / segs;
        }
        diff[i] = mean_over_ranks(w, t[1] - t[0]);
        alone[i] = mean_over_ranks(w, t[0]);
        adt_comm_barrier(w);
        double s0 = adt_now_s();
        for (int q = 0; q < 8 && !rc; q++) rc = run_pattern(w, buf, priv, p);
        b2b[i] = mean_over_ranks(w, (adt_now_s() - s0) / 8);
    }
    if (!rc && adt_comm_rank(w) == 0) {
        int r = o->rounds;
        qsort(diff, (size_t)r, sizeof *diff, bench_cmp_d);
        qsort(alone, (size_t)r, sizeof *alone, bench_cmp_d);
        qsort(b2b, (size_t)r, sizeof *b2b, bench_cmp_d);
        double seg = alone[r / 2], d = diff[r / 2], bb = b2b[r / 2], mean = 0;
        for (int i = 0; i < r; i++) mean += diff[i] / r;
        printf("{\"ranks\": %d, \"mlp\": [%s], \"batch\": %d, \"pattern\": \"%d%c%ld\", \"segments_per_run\": %d, "
               "\"rounds\": %d, \"segment_ms\": %.4f, \"with_minus_without_ms\": {\"median\": %.4f, \"q1\": %.4f, "
               "\"q3\": %.4f, \"mean\": %.4f}, \"back_to_back_ms\": %.4f, \"loss_ms\": %.4f, \"loss_per_segment\": %.3f}\n",
               adt_comm_size(w), s->sizes, s->batch, p->n, p->mpi ? 'm' : p->pairs ? 'p' : 'x', p->elems, segs, r, seg * 1e3, d * 1e3, diff[r / 4] * 1e3,
               diff[(3 * r) / 4] * 1e3, mean * 1e3, bb * 1e3, (d - bb) * 1e3, seg > 0 ? (d - bb) / seg : 0);
        fflush(stdout);
    }
    free(diff), free(alone), free(b2b);
    adt_exec_free(ex);
    adt_graph_free(g);
    return rc;
}

int main(int argc, char **argv) {
    opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    adt_comm *w = NULL;
    if (adt_comm_init(ADT_COMM_MPI, &w)) {
        fprintf(stderr, "bench_lockstep: %s\n", adt_error_message());
        return 1;
    }
    size_t most = 0;
    int want_pairs = 0;
    for (int i = 0; i < o.n_pat; i++) want_pairs |= o.pat[i].pairs;
    if (want_pairs) { /* ranks 4q..4q+3 a 2x2 mesh: pairs {4q, 4q+1}, {4q+2, 4q+3} and {4q, 4q+2}, {4q+1, 4q+3} */
        int r = adt_comm_rank(w);
        if (adt_comm_size(w) % 4) rc = usage("--patterns: NpE needs a multiple of 4 ranks");
        if (!rc && (adt_comm_split(w, r / 2, r, &g_pair[0]) || adt_comm_split(w, (r / 4) * 2 + r % 2 + 1000, r, &g_pair[1]))) {
            fprintf(stderr, "bench_lockstep: %s\n", adt_error_message());
            rc = 1;
        }
        if (rc) {
            adt_comm_finalize(w);
            return rc;
        }
    }
    for (int i = 0; i < o.n_pat; i++)
        if ((size_t)o.pat[i].n * (size_t)o.pat[i].elems > most) most = (size_t)o.pat[i].n * (size_t)o.pat[i].elems;
    /* shared memory, as the executor's arena: its all-reduces take that path (comm.h) */
    float *buf = adt_comm_shared_alloc(most * sizeof(float)), *priv = adt_calloc(most, sizeof(float));
    if (!buf) {
        fprintf(stderr, "bench_lockstep: cannot allocate %zu bytes of shared memory\n", most * sizeof(float));
        adt_comm_finalize(w);
        return 1;
    }
    memset(buf, 0, most * sizeof(float));
    for (int s = 0; s < o.n_seg && !rc; s++)
        for (int p = 0; p < o.n_pat && !rc; p++) rc = measure(w, &o, &o.seg[s], &o.pat[p], buf, priv);
    if (rc) fprintf(stderr, "bench_lockstep: %s\n", adt_error_message());
    adt_comm_shared_free(buf);
    free(priv);
    for (int k = 0; k < 2; k++)
        if (g_pair[k]) adt_comm_free(g_pair[k]);
    adt_comm_finalize(w);
    return rc ? 1 : 0;
}
