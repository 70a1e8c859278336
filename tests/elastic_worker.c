/*
 * elastic_worker.c - the worker tests/test_elastic.c runs under `adtrain agent`: a data-parallel
 * MPI "trainer" on the elastic client (adtrain/elastic.h), plain MPICH, built without
 * sanitizers.
 *
 *   elastic_worker OUTDIR SAMPLES BATCH SHARD EPOCHS SEED STEP_MS COMMIT_EVERY LEASE_TIMEOUT MAX_FAILURES
 *
 * Its "model" is a table count[epoch][sample id] of how often each sample was trained. Each step
 * every rank (one replica each) leases exactly its share of the global batch, marks the samples
 * (through the epoch's seeded order) in its private delta table, "trains" for STEP_MS, joins an
 * allreduce of the step's sample total (a collective, as a gradient allreduce would be) and
 * reports what it consumed. Every COMMIT_EVERY steps, and when the master asks for a stop, the
 * deltas are summed onto rank 0's model, which writes OUTDIR/ckpt-S-gG.bin (atomically) and
 * commits it. A new generation restores the checkpoint the ledger names. At the end, the model
 * of the last commit must count every sample of every epoch exactly once: the test checks it.
 *
 * A request refused as stale (its generation ended) leaves OUTDIR/refused-gG-rR.txt and exits 3.
 * SIGTERM sets a flag; the rank leaves after its current step (as a trainer saving at a
 * breakpoint would), so a stopped-then-continued rank still sends its late report.
 * OUTDIR/steps-gG-rR.txt gets one line per step: "step S n N t T" (T wall-clock seconds).
 *
 * The split: when the master sends one (a straggler policy), each rank leases exactly its local
 * batch of the step (adt_elastic_local_batch) instead of an even share, checks with the others
 * that the local batches sum to the global batch (else exit 8: the replicas disagree), and
 * reports its "compute" seconds with the step. ADT_TEST_SLOW_RANK=R:F makes rank R's compute
 * take F times as long per sample (STEP_MS is an even share's).
 */
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/data.h"
#include "adtrain/elastic.h"

static volatile sig_atomic_t g_term;
static void on_term(int sig) {
    (void)sig;
    g_term = 1;
}

static const char *g_out;
static int64_t g_gen;
static int g_rank;

static double wall(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

static void sleep_ms(double ms) {
    struct timespec ts = {(time_t)(ms / 1000), (long)(((long long)(ms * 1e6)) % 1000000000)};
    while (nanosleep(&ts, &ts) && errno == EINTR) {
    }
}

static void die(int code, const char *what) {
    fprintf(stderr, "elastic_worker rank %d gen %lld: %s: %s\n", g_rank, (long long)g_gen, what, adt_error_message());
    exit(code);
}

/* A refused (stale) request: leave a mark for the test, then go. */
static void check(int rc, const char *what, int64_t step) {
    if (rc == ADT_OK) return;
    if (rc == ADT_ERR_STALE) {
        char path[4096];
        snprintf(path, sizeof path, "%s/refused-g%lld-r%d.txt", g_out, (long long)g_gen, g_rank);
        FILE *f = fopen(path, "a");
        if (f) fprintf(f, "%s step %lld refused: %s\n", what, (long long)step, adt_error_message()), fclose(f);
        exit(3);
    }
    die(4, what);
}

typedef struct model_file {
    char magic[4];
    int32_t steps, epochs, samples;
} model_file;

/* A checkpoint after `step` steps: every rank's deltas summed onto rank 0's model, which writes
 * OUTDIR/ckpt-S-gG.bin (to a temporary name, then renamed) and commits it. */
static void checkpoint(adt_elastic *c, int32_t *model, int32_t *delta, int64_t cells, int64_t step, int64_t E,
                       int64_t N) {
    int32_t *sum = g_rank == 0 ? calloc((size_t)cells, sizeof *sum) : NULL;
    MPI_Reduce(delta, sum, (int)cells, MPI_INT32_T, MPI_SUM, 0, MPI_COMM_WORLD);
    memset(delta, 0, (size_t)cells * sizeof *delta);
    if (g_rank == 0) {
        for (int64_t i = 0; i < cells; i++)
            model[i] += sum[i];
        free(sum);
        char name[128], path[4096], tmp[4200];
        snprintf(name, sizeof name, "ckpt-%lld-g%lld.bin", (long long)step, (long long)g_gen);
        snprintf(path, sizeof path, "%s/%s", g_out, name);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        model_file h = {{'A', 'D', 'T', 'W'}, (int32_t)step, (int32_t)E, (int32_t)N};
        FILE *f = fopen(tmp, "wb");
        if (!f || fwrite(&h, sizeof h, 1, f) != 1 || fwrite(model, sizeof *model, (size_t)cells, f) != (size_t)cells ||
            fclose(f) || rename(tmp, path)) {
            fprintf(stderr, "elastic_worker: writing %s failed\n", path);
            exit(6);
        }
        check(adt_elastic_commit(c, step, name), "commit", step);
    }
    MPI_Barrier(MPI_COMM_WORLD);
}

int main(int argc, char **argv) {
    if (argc != 11) {
        fprintf(stderr, "usage: elastic_worker OUTDIR SAMPLES BATCH SHARD EPOCHS SEED STEP_MS COMMIT_EVERY "
                        "LEASE_TIMEOUT MAX_FAILURES\n");
        return 64;
    }
    g_out = argv[1];
    adt_ledger_job job = {.samples = atoll(argv[2]),
                          .global_batch = atoll(argv[3]),
                          .shard_size = atoll(argv[4]),
                          .epochs = atoll(argv[5]),
                          .seed = strtoull(argv[6], NULL, 10),
                          .shuffle = 1,
                          .max_leases = 16,
                          .lease_timeout_s = atof(argv[9]),
                          .max_failures = atoi(argv[10])};
    double step_ms = atof(argv[7]);
    int every = atoi(argv[8]);
    int slow_rank = -1;
    double slow = 1;
    const char *sr = getenv("ADT_TEST_SLOW_RANK");
    if (sr && strchr(sr, ':')) slow_rank = atoi(sr), slow = atof(strchr(sr, ':') + 1);
    signal(SIGTERM, on_term);
    MPI_Init(NULL, NULL);
    int size;
    MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    adt_elastic *c;
    if (adt_elastic_open(&c, &(adt_elastic_config){.replica = g_rank, .timeout_s = 30})) die(2, "open");
    g_gen = adt_elastic_generation(c);
    check(adt_elastic_data_init(c, &job, 1), "data init", -1);

    /* rank 0 reads where to restart from and tells the others */
    int64_t N = job.samples, E = job.epochs, B = job.global_batch;
    int32_t *model = NULL, *delta = calloc((size_t)(E * N), sizeof *delta);
    int64_t start = 0;
    if (g_rank == 0) {
        adt_elastic_info info;
        check(adt_elastic_get_info(c, &info), "info", -1);
        start = info.committed_steps;
        model = calloc((size_t)(E * N), sizeof *model);
        if (start > 0) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", g_out, info.checkpoint);
            FILE *f = fopen(path, "rb");
            model_file h;
            if (!f || fread(&h, sizeof h, 1, f) != 1 || memcmp(h.magic, "ADTW", 4) || h.steps != start ||
                h.epochs != E || h.samples != N || fread(model, sizeof *model, (size_t)(E * N), f) != (size_t)(E * N)) {
                fprintf(stderr, "elastic_worker: checkpoint %s unreadable or not of step %lld\n", path,
                        (long long)start);
                exit(5);
            }
            fclose(f);
        }
    }
    MPI_Bcast(&start, 1, MPI_INT64_T, 0, MPI_COMM_WORLD);

    char path[4096];
    snprintf(path, sizeof path, "%s/steps-g%lld-r%d.txt", g_out, (long long)g_gen, g_rank);
    FILE *log = fopen(path, "a");
    int64_t *perm = malloc((size_t)N * sizeof *perm), perm_epoch = -1;
    adt_ledger_lease cur = {0};
    int have = 0;
    int64_t step = start, committed = start;
    for (;;) {
        int64_t even = B / size + (g_rank < B % size), need = even, got = 0;
        int64_t local = adt_elastic_local_batch(c, step), sum = 0;
        if (local > 0) need = local;
        MPI_Allreduce(&need, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (sum != B) {
            fprintf(stderr, "elastic_worker rank %d gen %lld step %lld: local batches sum to %lld, not %lld\n", g_rank,
                    (long long)g_gen, (long long)step, (long long)sum, (long long)B);
            exit(8);
        }
        adt_ledger_range r[64];
        int nr = 0;
        for (int waits = 0; need > 0 && nr < 64;) {
            if (!have || cur.cursor == cur.end) {
                int grant;
                check(adt_elastic_lease(c, need, &cur, &grant), "lease", step);
                have = grant == ADT_LEDGER_GRANTED;
                if (grant == ADT_LEDGER_DONE) break;
                if (grant == ADT_LEDGER_WAIT) {
                    if (++waits > 25) break;
                    sleep_ms(20);
                    continue;
                }
            }
            int64_t take = cur.end - cur.cursor < need ? cur.end - cur.cursor : need;
            if (cur.epoch != perm_epoch) {
                adt_sample_permutation(perm, N, job.seed, cur.epoch);
                perm_epoch = cur.epoch;
            }
            for (int64_t p = cur.cursor; p < cur.cursor + take; p++)
                delta[cur.epoch * N + perm[p]]++;
            r[nr++] = (adt_ledger_range){cur.id, cur.cursor, cur.cursor + take};
            cur.cursor += take;
            need -= take;
            got += take;
        }
        double compute_ms = step_ms * (double)got / (double)even * (g_rank == slow_rank ? slow : 1);
        sleep_ms(compute_ms); /* "compute" */
        int64_t total = 0;
        MPI_Allreduce(&got, &total, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
        if (total == 0) break; /* every sample of every epoch consumed */
        if (nr) check(adt_elastic_report_compute(c, step, r, nr, compute_ms * 1e-3), "report", step);
        if (log) fprintf(log, "step %lld n %lld t %.6f\n", (long long)step, (long long)got, wall()), fflush(log);
        step++;
        int64_t stop = adt_elastic_stop_at(c), any_stop = 0;
        MPI_Allreduce(&stop, &any_stop, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        int stopping = any_stop > 0 && step >= any_stop;
        if (stopping || step % every == 0) {
            checkpoint(c, model, delta, E * N, step, E, N);
            committed = step;
        }
        if (stopping) break;
        int term = g_term, any_term = 0;
        MPI_Allreduce(&term, &any_term, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        if (any_term) exit(7);
    }
    if (step > committed) checkpoint(c, model, delta, E * N, step, E, N); /* the last steps */
    if (log) fclose(log);
    adt_elastic_close(c);
    free(perm);
    free(delta);
    free(model);
    MPI_Finalize();
    return 0;
}
