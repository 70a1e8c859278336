/*
 * test_train_ps.c - `adtrain train --mode ps` through the binary: a DLRM on 2 parameter servers +
 * 2 workers (mpiexec -n 4) in sync mode logs the one-process run's losses at every step (sparse
 * SGD is dense SGD on every row; with and without prefetch, with the dense parameters on the
 * workers or on the servers); an uneven batch over 3 workers too; with --eval-every, every
 * evaluation's val_loss and val_auc are the one-process run's (the holdout and --val, the dense
 * parameters on the workers and on the servers); under --schedule cosine with --warmup the
 * servers apply each step's rate, so the losses are the one-process run's again; bounded staleness and
 * asynchronous runs lower the loss; every flag that cannot act is refused with exit 2, naming it.
 */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_run.h"
#include "mpi_world.h"

static const char *DLRM = "{\"type\":\"dlrm\",\"n_dense\":5,\"n_tables\":4,\"table_rows\":[50,9,200,31],\"emb_dim\":4,"
                          "\"bottom\":[16,4],\"top\":[16,1]}\n";

/* mpiexec -n nranks adtrain train <flags>; the world's result in *wd. */
static void run_world(int nranks, char *flagbuf, mpi_world *wd, const char **argv) {
    int k = 0;
    argv[k++] = g_bin, argv[k++] = "train";
    for (char *t = strtok(flagbuf, " "); t && k < 62; t = strtok(NULL, " ")) argv[k++] = t;
    argv[k] = NULL;
    *wd = (mpi_world){.n = nranks, .argv = argv};
    mpi_run_world(wd, check_tmpdir(), 180);
}

/* The evaluation lines of a JSONL log: step, val_loss, val_auc (-1 when absent). */
static int read_evals(const char *path, long *step, double *vloss, double *vauc, int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        const char *v = strstr(line, "\"val_loss\":"), *a = strstr(line, "\"val_auc\":"), *st = strstr(line, "\"step\":");
        if (!v || !st) continue;
        step[n] = atol(st + 7), vloss[n] = atof(v + 11), vauc[n] = a ? atof(a + 10) : -1;
        n++;
    }
    fclose(f);
    return n;
}

/* Every evaluation of the parameter-server run at the one-process run's steps, its loss within
 * rtol and its AUC within 1e-4 (a pair of near-equal scores may swap). */
static void compare_evals(const char *label, const char *slog, const char *plog, double rtol) {
    long rs[64], ps[64];
    double rl[64], ra[64], pl[64], pa[64];
    int nr = read_evals(slog, rs, rl, ra, 64), np = read_evals(plog, ps, pl, pa, 64);
    CHECK(nr == np, "%s: %d evaluations logged, the one-process run %d", label, np, nr);
    for (int i = 0; i < nr && i < np; i++) {
        CHECK(ps[i] == rs[i], "%s: evaluation %d after step %ld, the one-process run's after %ld", label, i, ps[i], rs[i]);
        CHECK(fabs(pl[i] - rl[i]) <= rtol * fabs(rl[i]), "%s: step %ld: val_loss %.9g, the one-process run's %.9g",
              label, rs[i], pl[i], rl[i]);
        CHECK(ra[i] >= 0 && fabs(pa[i] - ra[i]) <= 1e-4, "%s: step %ld: val_auc %.6f, the one-process run's %.6f", label,
              rs[i], pa[i], ra[i]);
    }
}

/* The one-process run with `common`, then `ranks` ranks with `common` + `ps`: every step's loss
 * within rtol of the one-process run's; rtol < 0: the loss falls (the last 10 steps' mean at least
 * 0.01 below the first 10's), and for rtol < -1 ends within 0.03 of the one-process run's. */
static void compare(const char *label, const char *common, const char *ps, int ranks, double rtol) {
    char cfg[512], slog[512], plog[512], args[2048], out[16384], flagbuf[2048];
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("dlrm.json"));
    snprintf(slog, sizeof slog, "%s", check_tmp_path("one.jsonl"));
    snprintf(plog, sizeof plog, "%s", check_tmp_path("ps.jsonl"));
    write_text(cfg, DLRM);
    snprintf(args, sizeof args, "train --model %s %s --log %s", cfg, common, slog);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "%s: one process: exit %d:\n%s", label, rc, out);
    snprintf(flagbuf, sizeof flagbuf, "--model %s %s %s --log %s", cfg, common, ps, plog);
    const char *argv[64];
    mpi_world wd;
    run_world(ranks, flagbuf, &wd, argv);
    CHECK(wd.status == 0, "%s: %d ranks: exit %d", label, ranks, wd.status);
    CHECK(contains(wd.err, "ps     "), "%s: no parameter-server banner", label);
    double ref[128], got[128];
    int ne, n_ref = read_losses(slog, ref, 128, &ne), n = read_losses(plog, got, 128, &ne);
    CHECK(n == n_ref && n > 2, "%s: %d steps logged, the one-process run %d", label, n, n_ref);
    if (rtol >= 0) {
        int bad = 0, first = -1;
        for (int i = 0; i < n && i < n_ref; i++)
            if (!(fabs(got[i] - ref[i]) <= rtol * fabs(ref[i]))) bad++, first = first < 0 ? i : first;
        CHECK(bad == 0, "%s: %d steps' losses differ from the one-process run's by more than %g (first: step %d, %.9g "
              "vs %.9g)", label, bad, rtol, first + 1, first >= 0 ? got[first] : 0, first >= 0 ? ref[first] : 0);
        if (contains(common, "--eval-every")) compare_evals(label, slog, plog, rtol);
    } else if (n >= 40 && n == n_ref) { /* trains: the last 10 steps' mean loss below the first 10's */
        double a = 0, b = 0, ra = 0, rb = 0;
        for (int i = 0; i < 10; i++) a += got[i] / 10, b += got[n - 1 - i] / 10, ra += ref[i] / 10, rb += ref[n - 1 - i] / 10;
        CHECK(b < a - 0.01, "%s: the mean loss went from %.4f (first 10 steps) to %.4f (last 10)", label, a, b);
        if (rtol < -1) /* the same optimizer as the one-process run: near its loss */
            CHECK(fabs(b - rb) <= 0.03, "%s: the last 10 steps' mean loss %.4f, the one-process run's %.4f", label, b, rb);
    }
    if (check_cur_failed) mpi_print_tail("stderr", wd.err, 30);
    mpi_world_free(&wd);
    unlink(slog), unlink(plog), unlink(cfg);
}

static const char *SGD = "--data synthetic:dlrm --steps 8 --batch 32 --optimizer sgd --lr 0.5 --schedule constant --seed 5";

static void test_sync_equals_one_process(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    compare("sync, prefetch 1", SGD, "--mode ps --ps-servers 2 --ps-sync sync", 4, 1e-5);
    compare("sync, prefetch 0, dense on the servers", SGD, "--mode ps --ps-servers 2 --ps-prefetch 0 --ps-dense servers",
            4, 1e-5);
    /* 32 samples over 3 workers: 11, 11, 10 */
    compare("sync, 1 server + 3 workers", SGD, "--mode ps --ps-servers 1 --ps-prefetch 2", 4, 1e-5);
}

static void test_sync_eval_equals_one_process(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    char flags[512];
    snprintf(flags, sizeof flags, "%s --eval-every 3 --eval-batches 4", SGD); /* after steps 3, 6 and 8 */
    compare("sync, evaluation on the holdout", flags, "--mode ps --ps-servers 2 --ps-sync sync", 4, 1e-5);
    snprintf(flags, sizeof flags, "%s --eval-every 4 --eval-batches 3 --val synthetic:dlrm", SGD);
    compare("sync, evaluation on --val, dense on the servers", flags, "--mode ps --ps-servers 2 --ps-dense servers",
            4, 1e-5);
}

static void test_sync_schedule_equals_one_process(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    /* the rate rises over 3 steps, then falls to lr/10 at step 10: a server keeping one rate, or
     * the rate of another step, changes the loss from step 2 on */
    const char *sched = "--data synthetic:dlrm --steps 10 --batch 32 --optimizer sgd --lr 0.5 --schedule cosine "
                        "--warmup 3 --seed 7";
    compare("sync, cosine with warmup", sched, "--mode ps --ps-servers 2", 4, 1e-5);
    compare("sync, cosine with warmup, dense on the servers", sched, "--mode ps --ps-servers 2 --ps-dense servers", 4,
            1e-5);
}

static void test_stale_modes_train(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const char *longer = "--data synthetic:dlrm --steps 60 --batch 32 --optimizer sgd --lr 0.5 --schedule constant";
    compare("ssp:2", longer, "--mode ps --ps-servers 2 --ps-sync ssp:2", 4, -2);
    compare("ssp:2, adagrad rows", longer, "--mode ps --ps-servers 2 --ps-sync ssp:2 --ps-optimizer adagrad", 4, -1);
    compare("async", longer, "--mode ps --ps-servers 2 --ps-sync async --ps-prefetch 2", 4, -2);
}

static void test_refusals(void) {
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("dlrm.json"));
    write_text(cfg, DLRM);
    struct {
        const char *flags, *expect;
    } cases[] = {
        {"--ps-servers 2", "--ps-servers: only acts with --mode ps"},
        {"--ps-sync async", "--ps-sync: only acts with --mode ps"},
        {"--mode ps --ps-sync ssp:0", "--ps-sync"},
        {"--mode ps --ps-optimizer lamb", "--ps-optimizer"},
        {"--mode ps --ps-dense both", "--ps-dense"},
        {"--mode ps", "--ps-servers 1: the world has 1 rank"},
        {"--mode ps --optimizer sgd --momentum 0.9", "--momentum"},
        {"--mode ps --weight-decay 0.1", "--weight-decay"},
        {"--mode ps --save x.safetensors", "--save"},
        {"--mode ps --split 16", "--split"},
        {"--mode parameter-server", "--mode: expected 'collective' or 'ps'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[1024], out[8192];
        snprintf(args, sizeof args, "train --model %s --data synthetic:dlrm --steps 2 --batch 16 %s", cfg,
                 cases[i].flags);
        int rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 2, "'%s': exit %d, expected 2:\n%s", cases[i].flags, rc, out);
        CHECK(contains(out, cases[i].expect), "'%s': message:\n%s\nexpected to contain: %s", cases[i].flags, out,
              cases[i].expect);
    }
    char args[1024], out[8192];
    snprintf(args, sizeof args, "train --model configs/mlp-mnist.json --data synthetic:mlp --steps 2 --mode ps");
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && contains(out, "is a mlp; the parameter servers hold a DLRM"), "an MLP in --mode ps: exit %d:\n%s",
          rc, out);
    unlink(cfg);
}

int main(void) {
    cli_find_binary();
    if (check_tmpdir_make("train_ps")) return 1;
    setenv("ADT_COMM_TIMEOUT", "60", 1);
    mpi_world_sanitizer_env();
    RUN(test_refusals);
    RUN(test_sync_equals_one_process);
    RUN(test_sync_eval_equals_one_process);
    RUN(test_sync_schedule_equals_one_process);
    RUN(test_stale_modes_train);
    rmdir(check_tmpdir());
    return check_finish();
}
