/*
 * bench_ledger.c - what the data-sharding ledger costs the job master: reports, leases, commits,
 * rewinds and audits on a real file.
 *
 *   build/bench/bench_ledger [--dir DIR] [--replicas 8] [--steps 4000] [--batch 256]
 *                            [--shard-steps 16] [--commit-every 100] [--nosync]
 *
 * Runs one epoch of steps x batch samples. Every step each of the R replicas reports its share
 * of the global batch (one range of batch/R positions: one adt_ledger_report, one transaction),
 * leasing a new shard when the last one is used up (a shard lasts --shard-steps steps of one
 * replica); every --commit-every steps the trainer commits (one fsync of the WAL). Each call is
 * timed on its own. At the end: one rewind to the last commit, one audit of the whole ledger, and
 * the file's size.
 *
 * Prints one JSON line on stdout (per-call medians, p99 and means in microseconds, reports per
 * second) and a summary on stderr, including the overhead the ledger adds to a training step:
 * a replica waits for its own report once per step, so the added fraction is the report latency
 * over the step time; the summary gives the shortest step time for which that stays under 2 %,
 * and the same with the commit's fsync amortised over its interval.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/ledger.h"
#include "bench_stats.h"

typedef struct opts {
    const char *dir;
    int replicas;
    int64_t steps, batch, shard_steps, commit_every;
    int nosync;
} opts;

static int usage(const char *msg) {
    fprintf(stderr, "bench_ledger: %s\nusage: bench_ledger [--dir DIR] [--replicas R] [--steps S] [--batch B] "
                    "[--shard-steps K] [--commit-every C] [--nosync]\n", msg);
    return 2;
}

static int parse(int argc, char **argv, opts *o) {
    const char *tmp = getenv("TMPDIR");
    *o = (opts){tmp && *tmp ? tmp : "/tmp", 8, 4000, 256, 16, 100, 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--nosync")) {
            o->nosync = 1;
            continue;
        }
        if (i + 1 >= argc) return usage("a flag without its value");
        const char *v = argv[++i];
        char *end;
        long long x = strtoll(v, &end, 10);
        if (!strcmp(a, "--dir")) o->dir = v;
        else if (*end || x < 1) return usage("values must be positive integers");
        else if (!strcmp(a, "--replicas")) o->replicas = (int)x;
        else if (!strcmp(a, "--steps")) o->steps = x;
        else if (!strcmp(a, "--batch")) o->batch = x;
        else if (!strcmp(a, "--shard-steps")) o->shard_steps = x;
        else if (!strcmp(a, "--commit-every")) o->commit_every = x;
        else return usage("unknown flag");
    }
    if (o->batch % o->replicas) return usage("--batch must be a multiple of --replicas");
    return 0;
}

static int fail(const char *what) {
    fprintf(stderr, "bench_ledger: %s: %s\n", what, adt_error_message());
    return 1;
}

int main(int argc, char **argv) {
    opts o;
    if (parse(argc, argv, &o)) return 2;
    char path[512];
    snprintf(path, sizeof path, "%s/bench_ledger_%d.db", o.dir, (int)getpid());
    const int R = o.replicas;
    const int64_t share = o.batch / R;
    adt_ledger_job job = {.samples = o.steps * o.batch, .seed = 1, .shuffle = 1, .global_batch = o.batch,
                          .shard_size = share * o.shard_steps, .epochs = 1, .replicas = R, .lease_timeout_s = 600};
    adt_ledger *L = NULL;
    if (adt_ledger_create(&L, path, &job, o.nosync ? ADT_LEDGER_NOSYNC : 0)) return fail("create");

    double *t_rep = malloc((size_t)(o.steps * R) * sizeof(double));
    double *t_lease = malloc((size_t)(o.steps * R) * sizeof(double));
    double *t_commit = malloc((size_t)(o.steps / o.commit_every + 2) * sizeof(double));
    int64_t n_rep = 0, n_lease = 0, n_commit = 0;
    adt_ledger_lease *held = calloc((size_t)R, sizeof *held);
    double t_all = adt_now_s();
    for (int64_t step = 0; step < o.steps; step++) {
        for (int r = 0; r < R; r++) {
            if (held[r].id == 0 || held[r].cursor == held[r].end) {
                int grant;
                double t0 = adt_now_s();
                if (adt_ledger_lease_next(L, 1, r, 0, &held[r], &grant)) return fail("lease");
                t_lease[n_lease++] = adt_now_s() - t0;
                if (grant != ADT_LEDGER_GRANTED) return fail("ran out of data");
            }
            adt_ledger_range rr = {held[r].id, held[r].cursor, held[r].cursor + share};
            double t0 = adt_now_s();
            if (adt_ledger_report(L, 1, r, step, &rr, 1)) return fail("report");
            t_rep[n_rep++] = adt_now_s() - t0;
            held[r].cursor += share;
        }
        if ((step + 1) % o.commit_every == 0) {
            double t0 = adt_now_s();
            if (adt_ledger_commit(L, 1, step + 1, "bench")) return fail("commit");
            t_commit[n_commit++] = adt_now_s() - t0;
        }
    }
    t_all = adt_now_s() - t_all;
    /* a failure after the last commit: everything since is discarded */
    adt_ledger_status st;
    adt_ledger_get_status(L, &st);
    double t0 = adt_now_s();
    int64_t gen;
    if (adt_ledger_rewind(L, 1, st.committed_steps, R, "bench", &gen)) return fail("rewind");
    double t_rewind = adt_now_s() - t0;
    adt_ledger_audit au;
    t0 = adt_now_s();
    if (adt_ledger_audit_run(L, &au)) return fail("audit");
    double t_audit = adt_now_s() - t0;
    int audit_ok = au.ok;
    adt_ledger_audit_free(&au);
    adt_ledger_close(L);
    struct stat sb;
    long long bytes = stat(path, &sb) == 0 ? (long long)sb.st_size : -1;
    unlink(path);

    int64_t reports = n_rep;
    stat_us rep = summarise(t_rep, n_rep), lease = summarise(t_lease, n_lease), com = summarise(t_commit, n_commit);
    double reports_per_s = (double)reports / t_all;
    /* The step time at which the ledger costs a replica 2 %: its report once per step, and the
     * commit's wait spread over the steps between commits (the trainer waits for it at a
     * checkpoint, which it takes anyway). */
    double min_step_report_ms = rep.mean / 1e3 / 0.02;
    double min_step_all_ms = (rep.mean + com.mean / (double)o.commit_every) / 1e3 / 0.02;

    printf("{\"bench\": \"ledger\", \"sync\": \"%s\", \"replicas\": %d, \"steps\": %lld, \"batch\": %lld, "
           "\"shard_size\": %lld, \"commit_every\": %lld, ",
           o.nosync ? "off" : "normal+full-at-commit", R, (long long)o.steps, (long long)o.batch,
           (long long)job.shard_size, (long long)o.commit_every);
    print_stat(stdout, "report", rep, 1);
    print_stat(stdout, "lease", lease, 1);
    print_stat(stdout, "commit", com, 1);
    printf("\"reports_per_s\": %.0f, \"rewind_ms\": %.2f, \"audit_ms\": %.1f, \"audit_ok\": %s, \"events\": %lld, "
           "\"file_bytes\": %lld, \"min_step_ms_for_2pct\": %.2f, \"min_step_ms_for_2pct_with_commits\": %.2f}\n",
           reports_per_s, t_rewind * 1e3, t_audit * 1e3, audit_ok ? "true" : "false", (long long)st.events, bytes,
           min_step_report_ms, min_step_all_ms);
    fprintf(stderr,
            "ledger on %s (%s): %d replicas, %lld steps of %lld samples\n"
            "  report  median %.1f us  p99 %.1f us  mean %.1f us  -> %.0f reports/s through one handle\n"
            "  lease   median %.1f us  p99 %.1f us  (%lld leases)\n"
            "  commit  median %.1f us  p99 %.1f us  (%lld commits, every %lld steps)\n"
            "  rewind %.2f ms, audit of %lld events %.1f ms (ok: %s), file %.1f MiB\n"
            "  2%% of a step: a replica waits for one report per step -> steps of >= %.2f ms;\n"
            "  with the commit wait spread over its interval -> >= %.2f ms; the master serves %d reports\n"
            "  per step, so steps of >= %.3f ms keep it below %.0f %% busy\n",
            o.dir, o.nosync ? "no fsync" : "fsync at commits", R, (long long)o.steps, (long long)o.batch, rep.median,
            rep.p99, rep.mean, reports_per_s, lease.median, lease.p99, (long long)lease.n, com.median, com.p99,
            (long long)com.n, (long long)o.commit_every, t_rewind * 1e3, (long long)st.events, t_audit * 1e3,
            audit_ok ? "yes" : "NO", (double)bytes / (1 << 20), min_step_report_ms, min_step_all_ms, R,
            (double)R / reports_per_s * 1e3 / 0.5, 50.0);
    free(t_rep);
    free(t_lease);
    free(t_commit);
    free(held);
    return audit_ok ? 0 : 1;
}
