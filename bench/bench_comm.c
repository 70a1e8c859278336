/*
 * bench_comm.c - adtrain's collectives against the bare MPI calls they stand on, in one MPI
 * world: the cost of adtrain's path (argument checks, a request, MPI's non-blocking collective
 * and the bounded, polling wait) next to MPI's own blocking collective on the same bytes, and
 * next to the bare non-blocking collective adtrain calls, polled with MPI_Test in a tight loop
 * (so that what adtrain adds and what MPI's non-blocking path costs can be told apart).
 *
 *   mpiexec -n 2 build/bench/bench_comm [--ops allreduce,reduce_scatter,allgather]
 *                                       [--min-bytes 65536] [--max-bytes 67108864]
 *                                       [--reps 30] [--warmup 3] [--budget-s 20]
 *
 * Sizes go from --min-bytes to --max-bytes by factors of 4. For each op and size the three paths
 * take turns, rep by rep, and the order rotates every rep, so that whatever else the machine
 * does hits them alike; after --budget-s seconds on one op and size it stops at the rep it is on
 * (at least 5 reps; "reps" in the output says how many ran), because some bare calls crawl when
 * ranks outnumber cores (4 ranks on 2 cores: MPI_Allgatherv of 16 MiB took seconds). Each timed
 * call starts after an MPI_Barrier; its time is the slowest
 * rank's. Rank 0 prints one JSON line per op and size on stdout: per path ("adtrain", "mpi",
 * "mpi_nb") the median, min/max and 10th/90th percentiles in microseconds and the bus bandwidth
 * of the median; the ratio of adtrain's bandwidth to MPI's blocking call (mpi time / adtrain
 * time: above 1 is faster), of the medians and as the median of the per-rep ratios; and the same
 * ratio against the bare non-blocking call (nb_ratio_of_medians).
 *
 * Bus bandwidth follows nccl-tests: S is the whole buffer (allreduce: the vector; reduce-scatter:
 * the input; all-gather: the output); allreduce moves 2(p-1)/p S per rank, the others (p-1)/p S.
 *
 * The bare calls are MPI_Allreduce(MPI_IN_PLACE) for adt_comm_allreduce_f32 (which is in place),
 * MPI_Reduce_scatter with the same counts for adt_comm_reduce_scatter_f32, MPI_Allgatherv with the
 * same counts for adt_comm_allgather_f32, and their MPI_I... forms; buffers are zeros (no
 * denormals, no overflow), in shared memory (adt_comm_shared_alloc, as the executor's arena), so
 * that adtrain's all-reduce of 64 KiB and more runs through it on one node ("shared": true in the
 * output); --private puts them in private memory, where adtrain takes MPI's path.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/comm.h"

typedef enum { OP_AR, OP_RS, OP_AG, OP_N } op_kind;
static const char *OP_NAMES[OP_N] = {"allreduce", "reduce_scatter", "allgather"};

typedef struct opts {
    int ops[OP_N];
    long long min_bytes, max_bytes;
    int reps, warmup;
    double budget_s;
    int private_buf; /* --private: buffers from malloc, not adt_comm_shared_alloc */
} opts;

static void usage(FILE *f) {
    fprintf(f, "usage: mpiexec -n P bench_comm [--ops allreduce,reduce_scatter,allgather]\n"
               "                                [--min-bytes 65536] [--max-bytes 67108864]\n"
               "                                [--reps 30] [--warmup 3] [--budget-s 20] [--private]\n");
}

static int parse_ll(const char *flag, const char *v, long long lo, long long *out) {
    char *end;
    long long x = v ? strtoll(v, &end, 10) : 0;
    if (!v || *end || x < lo) {
        fprintf(stderr, "bench_comm: %s '%s': expected an integer >= %lld\n", flag, v ? v : "", lo);
        return -1;
    }
    *out = x;
    return 0;
}

static int parse_opts(int argc, char **argv, opts *o) {
    *o = (opts){.ops = {1, 1, 1}, .min_bytes = 65536, .max_bytes = 64LL << 20, .reps = 30, .warmup = 3, .budget_s = 20};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long x;
        if (!strcmp(a, "--ops") && v) {
            memset(o->ops, 0, sizeof o->ops);
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
                int k = 0;
                while (k < OP_N && strcmp(t, OP_NAMES[k])) k++;
                if (k == OP_N) {
                    fprintf(stderr, "bench_comm: --ops: unknown op '%s' (allreduce, reduce_scatter, allgather)\n", t);
                    return -1;
                }
                o->ops[k] = 1;
            }
            i++;
        } else if (!strcmp(a, "--min-bytes")) {
            if (parse_ll(a, v, 64, &o->min_bytes)) return -1;
            i++;
        } else if (!strcmp(a, "--max-bytes")) {
            if (parse_ll(a, v, 64, &o->max_bytes)) return -1;
            i++;
        } else if (!strcmp(a, "--reps")) {
            if (parse_ll(a, v, 1, &x) || x > 100000) return -1;
            o->reps = (int)x, i++;
        } else if (!strcmp(a, "--warmup")) {
            if (parse_ll(a, v, 0, &x) || x > 1000) return -1;
            o->warmup = (int)x, i++;
        } else if (!strcmp(a, "--budget-s")) {
            if (parse_ll(a, v, 1, &x)) return -1;
            o->budget_s = (double)x, i++;
        } else if (!strcmp(a, "--private")) {
            o->private_buf = 1;
        } else if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else {
            fprintf(stderr, "bench_comm: unknown flag '%s'\n", a);
            usage(stderr);
            return -1;
        }
    }
    return 0;
}

typedef struct bufs {
    float *a, *b;     /* allreduce: a in place; reduce-scatter: a -> b; all-gather: b -> a */
    int64_t *counts;  /* [p] block distribution of the whole buffer */
    int *icounts, *displs;
} bufs;

enum { P_ADT, P_MPI, P_NB, P_N };
static const char *PATH_NAMES[P_N] = {"adtrain", "mpi", "mpi_nb"};

/* One call of one op on one path; returns 0 or prints the error. */
static int call(op_kind op, int path, adt_comm *w, bufs *B, int64_t n, int rank) {
    int rc;
    if (path == P_ADT) {
        switch (op) {
        case OP_AR: rc = adt_comm_allreduce_f32(w, B->a, n); break;
        case OP_RS: rc = adt_comm_reduce_scatter_f32(w, B->a, B->b, B->counts); break;
        default: rc = adt_comm_allgather_f32(w, B->b, B->a, B->counts); break;
        }
        if (rc) fprintf(stderr, "bench_comm: %s\n", adt_error_message());
        return rc != 0;
    }
    MPI_Comm cw = MPI_COMM_WORLD;
    MPI_Request q;
    if (path == P_MPI) {
        switch (op) {
        case OP_AR: rc = MPI_Allreduce(MPI_IN_PLACE, B->a, (int)n, MPI_FLOAT, MPI_SUM, cw); break;
        case OP_RS: rc = MPI_Reduce_scatter(B->a, B->b, B->icounts, MPI_FLOAT, MPI_SUM, cw); break;
        default:
            rc = MPI_Allgatherv(B->b, B->icounts[rank], MPI_FLOAT, B->a, B->icounts, B->displs, MPI_FLOAT, cw);
            break;
        }
    } else {
        switch (op) {
        case OP_AR: rc = MPI_Iallreduce(MPI_IN_PLACE, B->a, (int)n, MPI_FLOAT, MPI_SUM, cw, &q); break;
        case OP_RS: rc = MPI_Ireduce_scatter(B->a, B->b, B->icounts, MPI_FLOAT, MPI_SUM, cw, &q); break;
        default:
            rc = MPI_Iallgatherv(B->b, B->icounts[rank], MPI_FLOAT, B->a, B->icounts, B->displs, MPI_FLOAT, cw, &q);
            break;
        }
        for (int done = 0; rc == MPI_SUCCESS && !done;) rc = MPI_Test(&q, &done, MPI_STATUS_IGNORE);
    }
    if (rc != MPI_SUCCESS) fprintf(stderr, "bench_comm: MPI %s (%s) failed (%d)\n", OP_NAMES[op], PATH_NAMES[path], rc);
    return rc != MPI_SUCCESS;
}

static int cmp_d(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

/* q-quantile of sorted v[n], linear between neighbours */
static double quant(const double *v, int n, double q) {
    double k = q * (n - 1);
    int i = (int)k;
    return i + 1 < n ? v[i] + (k - i) * (v[i + 1] - v[i]) : v[n - 1];
}

int main(int argc, char **argv) {
    opts o;
    if (parse_opts(argc, argv, &o)) return 2;
    adt_comm *w;
    if (adt_comm_init(ADT_COMM_MPI, &w)) {
        fprintf(stderr, "bench_comm: %s\n", adt_error_message());
        return 1;
    }
    int rank = adt_comm_rank(w), p = adt_comm_size(w);
    const char *poll = getenv("ADT_COMM_POLL");
    int64_t nmax = o.max_bytes / 4;
    /* The buffers of every path: shared memory, as the executor's arena is (so adtrain's
     * all-reduce runs through it; comm.h), unless --private. */
    void *(*alloc)(size_t) = o.private_buf ? adt_alloc_aligned : adt_comm_shared_alloc;
    void (*release)(void *) = o.private_buf ? adt_free_aligned : adt_comm_shared_free;
    bufs B = {alloc((size_t)nmax * 4), alloc((size_t)nmax * 4),
              malloc((size_t)p * sizeof(int64_t)), malloc((size_t)p * sizeof(int)), malloc((size_t)p * sizeof(int))};
    double *t[P_N], *tmax[P_N], *ratio = malloc((size_t)o.reps * sizeof(double));
    for (int k = 0; k < P_N; k++) {
        t[k] = malloc((size_t)o.reps * sizeof(double));
        tmax[k] = malloc((size_t)o.reps * sizeof(double));
    }
    int failed = 0;
    for (int op = 0; op < OP_N && !failed; op++) {
        if (!o.ops[op]) continue;
        for (long long bytes = o.min_bytes; bytes <= o.max_bytes && !failed; bytes *= 4) {
            int64_t n = bytes / 4;
            adt_comm_block_counts(n, p, B.counts);
            for (int i = 0, off = 0; i < p; off += B.icounts[i], i++) B.icounts[i] = (int)B.counts[i], B.displs[i] = off;
            int reps = o.reps;
            double start = MPI_Wtime();
            for (int rep = -o.warmup; rep < reps && !failed; rep++) {
                int stop = rep >= 5 && MPI_Wtime() - start > o.budget_s;
                MPI_Bcast(&stop, 1, MPI_INT, 0, MPI_COMM_WORLD); /* rank 0's clock decides */
                if (stop) {
                    reps = rep;
                    break;
                }
                for (int k = 0; k < P_N; k++) {
                    int path = (k + rep + o.warmup) % P_N; /* each path first in every third rep */
                    MPI_Barrier(MPI_COMM_WORLD);
                    double t0 = MPI_Wtime();
                    failed |= call((op_kind)op, path, w, &B, n, rank);
                    double dt = MPI_Wtime() - t0;
                    if (rep >= 0) t[path][rep] = dt;
                }
            }
            int any = failed;
            MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
            if ((failed = any)) break;
            for (int k = 0; k < P_N; k++) MPI_Reduce(t[k], tmax[k], reps, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
            if (rank) continue;
            for (int i = 0; i < reps; i++) ratio[i] = tmax[P_MPI][i] / tmax[P_ADT][i];
            qsort(ratio, (size_t)reps, sizeof(double), cmp_d);
            double st[P_N][5];
            for (int k = 0; k < P_N; k++) {
                qsort(tmax[k], (size_t)reps, sizeof(double), cmp_d);
                st[k][0] = tmax[k][0], st[k][1] = quant(tmax[k], reps, 0.1), st[k][2] = quant(tmax[k], reps, 0.5);
                st[k][3] = quant(tmax[k], reps, 0.9), st[k][4] = tmax[k][reps - 1];
            }
            double factor = op == OP_AR ? 2.0 * (p - 1) / p : (double)(p - 1) / p;
            printf("{\"op\": \"%s\", \"bytes\": %lld, \"ranks\": %d, \"reps\": %d, \"shared\": %s, \"poll\": \"%s\"", OP_NAMES[op],
                   bytes, p, reps, o.private_buf ? "false" : "true", poll && *poll ? poll : "auto");
            for (int k = 0; k < P_N; k++) {
                const char *nm = PATH_NAMES[k];
                printf(", \"%s_us\": {\"min\": %.2f, \"p10\": %.2f, \"median\": %.2f, \"p90\": %.2f, \"max\": %.2f}", nm,
                       st[k][0] * 1e6, st[k][1] * 1e6, st[k][2] * 1e6, st[k][3] * 1e6, st[k][4] * 1e6);
                printf(", \"%s_busbw_gbs\": %.4f", nm, factor * (double)bytes / st[k][2] / 1e9);
            }
            printf(", \"ratio_of_medians\": %.4f, \"ratio_paired\": {\"p10\": %.4f, \"median\": %.4f, \"p90\": %.4f}"
                   ", \"nb_ratio_of_medians\": %.4f}\n",
                   st[P_MPI][2] / st[P_ADT][2], quant(ratio, reps, 0.1), quant(ratio, reps, 0.5),
                   quant(ratio, reps, 0.9), st[P_NB][2] / st[P_ADT][2]);
            fflush(stdout);
        }
    }
    if (rank == 0 && !failed) fprintf(stderr, "bench_comm: %d ranks, %s\n", p, adt_comm_mpi_library());
    release(B.a), release(B.b);
    free(B.counts), free(B.icounts), free(B.displs), free(ratio);
    for (int k = 0; k < P_N; k++) free(t[k]), free(tmax[k]);
    int rc = adt_comm_finalize(w);
    if (rc) fprintf(stderr, "bench_comm: %s\n", adt_error_message());
    return failed || rc ? 1 : 0;
}
