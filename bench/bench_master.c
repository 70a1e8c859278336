/*
 * bench_master.c - what the job master costs a training step over HTTP: the data calls of R
 * replicas (threads with one adt_elastic client each) against an in-process master on loopback,
 * with its ledger on a real file.
 *
 *   build/bench/bench_master [--dir DIR] [--replicas 8] [--steps 1000] [--batch 256]
 *                            [--commit-every 100] [--nosync]
 *
 * Every step each replica leases exactly its share of the global batch (batch/R positions) and
 * reports it - two HTTP round trips, two ledger transactions - then all meet at a barrier (the
 * step's collective); every --commit-every steps replica 0 commits. Each call is timed on its own,
 * from the client's side. Prints one JSON line (per-call medians, p99 and means in microseconds,
 * steps per second) and a summary on stderr: a replica waits for its lease and its report once
 * per step, so the master's share of a step is their sum over the step time.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "bench_stats.h"

typedef struct opts {
    const char *dir;
    int replicas;
    int64_t steps, batch, commit_every;
    int nosync;
} opts;

typedef struct replica {
    int r;
    const opts *o;
    char addr[64];
    pthread_barrier_t *bar;
    double *t_lease, *t_report, *t_commit;
    int64_t n_commit;
    int failed;
} replica;

static void *run_replica(void *arg) {
    replica *x = arg;
    const opts *o = x->o;
    adt_elastic *c;
    adt_elastic_config cfg = {.master = x->addr, .generation = 1, .replica = x->r, .timeout_s = 30};
    if (adt_elastic_open(&c, &cfg)) {
        fprintf(stderr, "bench_master: %s\n", adt_error_message());
        x->failed = 1;
    }
    int64_t share = o->batch / o->replicas;
    for (int64_t step = 0; step < o->steps && !x->failed; step++) {
        adt_ledger_lease l;
        int grant;
        double t0 = adt_now_s();
        if (adt_elastic_lease(c, share, &l, &grant) || grant != ADT_LEDGER_GRANTED) {
            fprintf(stderr, "bench_master: replica %d step %lld lease: %s\n", x->r, (long long)step, adt_error_message());
            x->failed = 1;
            break;
        }
        double t1 = adt_now_s();
        adt_ledger_range rg = {l.id, l.start, l.end};
        if (adt_elastic_report(c, step, &rg, 1)) {
            fprintf(stderr, "bench_master: replica %d step %lld report: %s\n", x->r, (long long)step,
                    adt_error_message());
            x->failed = 1;
            break;
        }
        x->t_lease[step] = t1 - t0;
        x->t_report[step] = adt_now_s() - t1;
        pthread_barrier_wait(x->bar);
        if (x->r == 0 && (step + 1) % o->commit_every == 0) {
            t0 = adt_now_s();
            if (adt_elastic_commit(c, step + 1, "bench")) {
                fprintf(stderr, "bench_master: commit: %s\n", adt_error_message());
                x->failed = 1;
            }
            x->t_commit[x->n_commit++] = adt_now_s() - t0;
        }
        pthread_barrier_wait(x->bar);
    }
    /* a failed replica must not leave the others at the barrier */
    if (x->failed) fprintf(stderr, "bench_master: replica %d gives up\n", x->r), exit(1);
    adt_elastic_close(c);
    return NULL;
}

static int parse(int argc, char **argv, opts *o) {
    const char *tmp = getenv("TMPDIR");
    *o = (opts){tmp && *tmp ? tmp : "/tmp", 8, 1000, 256, 100, 0};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--nosync")) {
            o->nosync = 1;
            continue;
        }
        char *end;
        long long x = i + 1 < argc ? strtoll(argv[i + 1], &end, 10) : 0;
        if (i + 1 >= argc) return 1;
        if (!strcmp(argv[i], "--dir")) o->dir = argv[++i];
        else if (*end || x < 1) return 1;
        else if (!strcmp(argv[i], "--replicas")) o->replicas = (int)x, i++;
        else if (!strcmp(argv[i], "--steps")) o->steps = x, i++;
        else if (!strcmp(argv[i], "--batch")) o->batch = x, i++;
        else if (!strcmp(argv[i], "--commit-every")) o->commit_every = x, i++;
        else return 1;
    }
    return o->batch % o->replicas ? 1 : 0;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) {
        fprintf(stderr, "usage: bench_master [--dir DIR] [--replicas R] [--steps S] [--batch B (a multiple of R)] "
                        "[--commit-every C] [--nosync]\n");
        return 2;
    }
    adt_log_set_level(ADT_LOG_WARN);
    const int R = o.replicas;
    char dir[600];
    snprintf(dir, sizeof dir, "%s/bench_master_%d", o.dir, (int)getpid());
    adt_ledger_job job = {.samples = o.steps * o.batch, .seed = 1, .shuffle = 1, .global_batch = o.batch,
                          .shard_size = o.batch, .epochs = 1, .replicas = R, .max_leases = 4, .lease_timeout_s = 600};
    adt_master_config cfg = {.job_dir = dir, .listen = "127.0.0.1:0", .data = &job, .join_wait_s = -1,
                             .heartbeat_s = 60, .ledger_flags = o.nosync ? ADT_LEDGER_NOSYNC : 0};
    adt_master *m;
    if (adt_master_create(&m, &cfg) || adt_master_start(m)) {
        fprintf(stderr, "bench_master: %s\n", adt_error_message());
        return 1;
    }
    char addr[64], body[128], *reply;
    int status;
    snprintf(addr, sizeof addr, "127.0.0.1:%d", adt_master_port(m));
    /* one agent holding every replica forms generation 1 (heartbeats: every 60 s is enough) */
    snprintf(body, sizeof body, "{\"node\":\"bench\",\"slots\":%d,\"pid\":%d}", R, (int)getpid());
    if (adt_master_call(addr, NULL, "POST", "/v1/agents", body, 5, &status, &reply) || status != 200) {
        fprintf(stderr, "bench_master: register: %d %s\n", status, reply ? reply : adt_error_message());
        return 1;
    }
    free(reply);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)R);
    replica *x = calloc((size_t)R, sizeof *x);
    pthread_t *th = calloc((size_t)R, sizeof *th);
    double t_all = adt_now_s();
    for (int r = 0; r < R; r++) {
        x[r] = (replica){.r = r, .o = &o, .bar = &bar};
        snprintf(x[r].addr, sizeof x[r].addr, "%s", addr);
        x[r].t_lease = calloc((size_t)o.steps, sizeof(double));
        x[r].t_report = calloc((size_t)o.steps, sizeof(double));
        x[r].t_commit = calloc((size_t)(o.steps / o.commit_every + 1), sizeof(double));
        pthread_create(&th[r], NULL, run_replica, &x[r]);
    }
    for (int r = 0; r < R; r++) pthread_join(th[r], NULL);
    t_all = adt_now_s() - t_all;
    double *lease = malloc((size_t)(o.steps * R) * sizeof *lease), *report = malloc((size_t)(o.steps * R) * sizeof *report);
    for (int r = 0; r < R; r++) {
        memcpy(lease + r * o.steps, x[r].t_lease, (size_t)o.steps * sizeof *lease);
        memcpy(report + r * o.steps, x[r].t_report, (size_t)o.steps * sizeof *report);
    }
    stat_us sl = summarise(lease, o.steps * R), sr = summarise(report, o.steps * R),
            sc = summarise(x[0].t_commit, x[0].n_commit);
    double steps_per_s = (double)o.steps / t_all, wait_ms = (sl.mean + sr.mean) / 1e3;
    printf("{\"bench\": \"master_http\", \"sync\": \"%s\", \"replicas\": %d, \"steps\": %lld, \"batch\": %lld, ",
           o.nosync ? "off" : "normal+full-at-commit", R, (long long)o.steps, (long long)o.batch);
    print_stat(stdout, "lease", sl, 1);
    print_stat(stdout, "report", sr, 1);
    print_stat(stdout, "commit", sc, 1);
    printf("\"steps_per_s\": %.1f, \"min_step_ms_for_2pct\": %.2f}\n", steps_per_s, wait_ms / 0.02);
    fprintf(stderr,
            "master over HTTP (%s): %d replicas, %lld steps of %lld samples, %.0f steps/s with no compute\n"
            "  lease   median %.0f us  p99 %.0f us  mean %.0f us\n"
            "  report  median %.0f us  p99 %.0f us  mean %.0f us\n"
            "  commit  median %.0f us  p99 %.0f us  (%lld commits)\n"
            "  a replica waits %.2f ms per step for the master: 2%% of steps of >= %.0f ms\n",
            o.nosync ? "no fsync" : "fsync at commits", R, (long long)o.steps, (long long)o.batch, steps_per_s,
            sl.median, sl.p99, sl.mean, sr.median, sr.p99, sr.mean, sc.median, sc.p99, (long long)sc.n, wait_ms,
            wait_ms / 0.02);
    for (int r = 0; r < R; r++) free(x[r].t_lease), free(x[r].t_report), free(x[r].t_commit);
    free(x);
    free(th);
    free(lease);
    free(report);
    pthread_barrier_destroy(&bar);
    adt_master_free(m);
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd)) {}
    return 0;
}
