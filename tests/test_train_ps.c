/*
 * test_train_ps.c - `adtrain train --mode ps` through the binary: a DLRM on 2 parameter servers +
 * 2 workers (mpiexec -n 4) in sync mode logs the one-process run's losses at every step (sparse
 * SGD is dense SGD on every row; with and without prefetch, with the dense parameters on the
 * workers or on the servers); an uneven batch over 3 workers too; with --eval-every, every
 * evaluation's val_loss and val_auc are the one-process run's (the holdout and --val, the dense
 * parameters on the workers and on the servers); under --schedule cosine with --warmup the
 * servers apply each step's rate, so the losses are the one-process run's again; a sync run of 2s
 * steps saved at s and resumed from there logs the uninterrupted run's losses and evaluations bit
 * for bit and ends with the same shards (row by row, weights and optimizer state) and dense state
 * (lazy Adam with a schedule; the dense parameters on the workers or on the servers), and 3
 * workers resuming 2 workers' cut log the same losses within 1e-5; an async
 * run resumes and continues (its steps counted from the cut, finite losses); a checkpoint of 2
 * servers is refused by a run of 1, and a directory whose save did not complete (no run file)
 * is refused; bounded staleness and
 * asynchronous runs lower the loss; every flag that cannot act is refused with exit 2, naming it.
 * Dynamic sharding (--straggler-policy dd, async): over 2 and 3 workers, one slowed by a 30 ms
 * pause a chunk (--inject-slowdown), every sample of the one-process run's batches (the sampler, rebuilt here)
 * is trained exactly once across the workers' logged chunks and no other (and the digest of the
 * samples the workers filled is the one-process batches'), and the slowed worker
 * takes clearly fewer chunks (less than half the fastest's); its refusals (sync, ssp, the
 * workers' dense all-reduce, a batch not a multiple of the workers, --val, a schedule, --save,
 * a server slowed) exit 2 naming the reason.
 */
#include "check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cJSON.h>

#include "adtrain/adtrain.h"
#include "adtrain/ps.h"
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

/* mpiexec -n ranks adtrain train --model DLRM <flags>: the exit status; stderr's tail on failure
 * when `expect_ok`. */
static int run_ps(int ranks, const char *flags, char *err, size_t n_err) {
    char flagbuf[2048];
    snprintf(flagbuf, sizeof flagbuf, "--model %s %s", check_tmp_path("dlrm.json"), flags);
    const char *argv[64];
    mpi_world wd;
    run_world(ranks, flagbuf, &wd, argv);
    int st = wd.status;
    if (err) snprintf(err, n_err, "%s", wd.err ? wd.err : "");
    mpi_world_free(&wd);
    return st;
}

/* Shard files a and b hold the same rows (every id of every table present in both or neither),
 * each with the same weights and optimizer state bits; *rows the rows compared. */
static int same_shards(const char *a, const char *b, const char *optim, int dense_on_servers, int *rows) {
    adt_model_cfg mc;
    if (adt_model_cfg_parse(&mc, DLRM, "dlrm")) return 0;
    adt_ps_cfg pc;
    memset(&pc, 0, sizeof pc);
    adt_ps_optim o = {ADT_PS_SGD, 0.1f, 0.9f, 0.95f, 1e-8f};
    adt_ps_optim_parse(optim, "optimizer", &o.kind);
    adt_ps_tables_dlrm(&pc, &mc.dlrm, 0, ADT_PS_REFUSE);
    if (dense_on_servers) adt_ps_tables_dlrm_dense(&pc, &mc.dlrm, &o);
    adt_ps_store *sa = NULL, *sb = NULL;
    int ok = !adt_ps_store_create(&sa, pc.tables, pc.n_tables, &o, 1) &&
             !adt_ps_store_create(&sb, pc.tables, pc.n_tables, &o, 1) && !adt_ps_store_load(sa, a) &&
             !adt_ps_store_load(sb, b);
    CHECK(ok, "loading %s and %s: %s", a, b, adt_error_message());
    int states = adt_ps_optim_states(o.kind);
    for (int t = 0; t < pc.n_tables && ok; t++)
        for (int64_t id = 0; id < pc.tables[t].rows && ok; id++) {
            const float *ta, *tb, *wa = adt_ps_store_row(sa, t, (uint64_t)id, &ta), *wb = adt_ps_store_row(sb, t, (uint64_t)id, &tb);
            size_t dim = (size_t)pc.tables[t].dim;
            if (!wa && !wb) continue;
            ok = wa && wb && !memcmp(wa, wb, dim * sizeof *wa) && (!states || !memcmp(ta, tb, states * dim * sizeof *ta));
            CHECK(ok, "%s vs %s: table %s row %lld differs (present %d / %d)", a, b, pc.tables[t].name, (long long)id,
                  wa != NULL, wb != NULL);
            ++*rows;
        }
    adt_ps_store_free(sa), adt_ps_store_free(sb);
    return ok;
}

/* Two safetensors files with the same tensors, byte for byte; *n the tensors compared. */
static int same_tensors(const char *a, const char *b, int *n) {
    adt_st_file *fa = NULL, *fb = NULL;
    int ok = !adt_st_open(&fa, a) && !adt_st_open(&fb, b);
    CHECK(ok, "opening %s and %s: %s", a, b, adt_error_message());
    ok = ok && adt_st_count(fa) == adt_st_count(fb);
    for (int i = 0; ok && i < adt_st_count(fa); i++) {
        const adt_st_tensor *x = adt_st_get(fa, i), *y = adt_st_find(fb, x->name);
        ok = y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes);
        CHECK(ok, "%s vs %s: tensor %s differs", a, b, x->name);
        ++*n;
    }
    if (fa) adt_st_close(fa);
    if (fb) adt_st_close(fb);
    return ok;
}

/* 2s steps saved at s (run a), then resumed from s (run b): steps s+1 .. 2s log the same losses
 * and evaluations (the logged text: bit for bit), and the final checkpoints hold the same rows
 * and dense state. */
static void resume_case(const char *label, const char *flags, const char *optim, int dense_on_servers) {
    char fa[2048], fb[2048], err[8192];
    const char *dir = check_tmpdir();
    snprintf(fa, sizeof fa, "%s --save %s/a{step} --save-every 5 --log %s/a.jsonl", flags, dir, dir);
    int st = run_ps(4, fa, err, sizeof err);
    CHECK(st == 0, "%s: the uninterrupted run: exit %d\n%s", label, st, err);
    snprintf(fb, sizeof fb, "%s --resume %s/a5 --save %s/b --log %s/b.jsonl", flags, dir, dir, dir);
    st = run_ps(4, fb, err, sizeof err);
    CHECK(st == 0 && contains(err, "continuing after step 5"), "%s: the resumed run: exit %d\n%s", label, st, err);
    char la[512], lb[512];
    snprintf(la, sizeof la, "%s/a.jsonl", dir), snprintf(lb, sizeof lb, "%s/b.jsonl", dir);
    double a[64], b[64];
    int ne, na = read_losses(la, a, 64, &ne), nb = read_losses(lb, b, 64, &ne);
    CHECK(na == 10 && nb == 5, "%s: %d and %d steps logged, expected 10 and 5", label, na, nb);
    for (int i = 0; i < 5 && na == 10 && nb == 5; i++)
        CHECK(a[5 + i] == b[i], "%s: step %d: loss %.9g resumed, %.9g uninterrupted", label, 6 + i, b[i], a[5 + i]);
    long sa[16], sb[16];
    double va[16], vb[16], ua[16], ub[16];
    int ea = read_evals(la, sa, va, ua, 16), eb = read_evals(lb, sb, vb, ub, 16);
    CHECK(ea == 2 && eb == 1 && sa[1] == sb[0] && va[1] == vb[0] && ua[1] == ub[0],
          "%s: evaluations: %d uninterrupted (the last after step %ld: %.9g, %.6f), %d resumed (%ld: %.9g, %.6f)",
          label, ea, sa[ea > 1 ? 1 : 0], va[ea > 1 ? 1 : 0], ua[ea > 1 ? 1 : 0], eb, sb[0], vb[0], ub[0]);
    int rows = 0, tensors = 0;
    for (int k = 0; k < 2; k++) {
        char pa[512], pb[512];
        snprintf(pa, sizeof pa, "%s/a10/server-%d.safetensors", dir, k);
        snprintf(pb, sizeof pb, "%s/b/server-%d.safetensors", dir, k);
        same_shards(pa, pb, optim, dense_on_servers, &rows);
    }
    char ra[512], rb[512];
    snprintf(ra, sizeof ra, "%s/a10/run.safetensors", dir), snprintf(rb, sizeof rb, "%s/b/run.safetensors", dir);
    same_tensors(ra, rb, &tensors);
    CHECK(rows > 50 && (dense_on_servers || tensors > 4), "%s: %d rows and %d dense tensors compared", label, rows,
          tensors);
}

static void test_resume(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    write_text(check_tmp_path("dlrm.json"), DLRM);
    const char *adam = "--data synthetic:dlrm --steps 10 --batch 32 --optimizer adamw --lr 0.02 --schedule cosine "
                       "--warmup 3 --seed 11 --eval-every 5 --eval-batches 2 --mode ps --ps-servers 2";
    resume_case("sync, lazy adam, dense on the workers", adam, "adam", 0);
    char flags[1024], err[8192];
    snprintf(flags, sizeof flags, "%s --ps-dense servers --ps-prefetch 2", adam);
    resume_case("sync, lazy adam, dense on the servers", flags, "adam", 1);
    const char *dir = check_tmpdir();
    /* 3 workers go on from the cut 2 workers made: the same steps (sums in another order) */
    char more[2048], lc[512];
    snprintf(more, sizeof more, "%s --resume %s/a5 --log %s/e.jsonl", flags, dir, dir);
    int st = run_ps(5, more, err, sizeof err);
    CHECK(st == 0, "resumed by 3 workers: exit %d\n%s", st, err);
    double a[64], e[64];
    int ne;
    snprintf(lc, sizeof lc, "%s/a.jsonl", dir);
    int na = read_losses(lc, a, 64, &ne);
    snprintf(lc, sizeof lc, "%s/e.jsonl", dir);
    int nw = read_losses(lc, e, 64, &ne);
    CHECK(na == 10 && nw == 5, "resumed by 3 workers: %d and %d steps logged", na, nw);
    for (int i = 0; i < 5 && na == 10 && nw == 5; i++)
        CHECK(fabs(e[i] - a[5 + i]) <= 1e-5 * fabs(a[5 + i]), "resumed by 3 workers: step %d: loss %.9g, %.9g "
              "uninterrupted", 6 + i, e[i], a[5 + i]);
    /* async: the cut waits for the slowest worker; the resumed run goes on from it */
    snprintf(flags, sizeof flags, "--data synthetic:dlrm --steps 20 --batch 32 --optimizer sgd --lr 0.3 --seed 3 "
             "--mode ps --ps-servers 2 --ps-sync async --ps-prefetch 2 --save %s/c{step} --save-every 10 --log %s/c.jsonl",
             dir, dir);
    st = run_ps(4, flags, err, sizeof err);
    CHECK(st == 0, "async run: exit %d\n%s", st, err);
    snprintf(flags, sizeof flags, "--data synthetic:dlrm --steps 20 --batch 32 --optimizer sgd --lr 0.3 --seed 3 "
             "--mode ps --ps-servers 2 --ps-sync async --ps-prefetch 2 --resume %s/c10 --log %s/d.jsonl", dir, dir);
    st = run_ps(4, flags, err, sizeof err);
    CHECK(st == 0 && contains(err, "continuing after step 10"), "async resume: exit %d\n%s", st, err);
    char ld[512];
    snprintf(ld, sizeof ld, "%s/d.jsonl", dir);
    FILE *f = fopen(ld, "r");
    char line[512];
    long expect = 11;
    int finite = 1;
    while (f && fgets(line, sizeof line, f)) {
        const char *sp = strstr(line, "\"step\":"), *lp = strstr(line, "\"loss\":");
        if (!sp || !lp) continue;
        CHECK(atol(sp + 7) == expect, "async resume: logged step %ld, expected %ld", atol(sp + 7), expect);
        finite &= isfinite(atof(lp + 7)) && atof(lp + 7) > 0;
        expect++;
    }
    if (f) fclose(f);
    CHECK(expect == 21 && finite, "async resume: steps 11 .. %ld logged, finite losses: %d", expect - 1, finite);
    /* another number of servers: refused, naming both */
    snprintf(flags, sizeof flags, "--data synthetic:dlrm --steps 20 --batch 32 --optimizer sgd --lr 0.3 --seed 3 "
             "--mode ps --ps-servers 1 --ps-sync async --resume %s/c10", dir);
    st = run_ps(3, flags, err, sizeof err);
    CHECK(st == 2 && contains(err, "saved by 2 parameter servers, this run has --ps-servers 1"),
          "resume with 1 server: exit %d\n%s", st, err);
    /* a save that did not complete leaves no run file */
    char run[512];
    snprintf(run, sizeof run, "%s/c10/run.safetensors", dir);
    unlink(run);
    snprintf(flags, sizeof flags, "--data synthetic:dlrm --steps 20 --batch 32 --optimizer sgd --lr 0.3 --seed 3 "
             "--mode ps --ps-servers 2 --ps-sync async --resume %s/c10", dir);
    st = run_ps(4, flags, err, sizeof err);
    CHECK(st == 2 && contains(err, "no run.safetensors in it"), "resume of an incomplete save: exit %d\n%s", st, err);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/a5 '%s'/a10 '%s'/b '%s'/c10 '%s'/c20 '%s'/*.jsonl '%s'/dlrm.json", dir, dir, dir,
             dir, dir, dir, dir);
    CHECK(system(cmd) == 0, "%s", cmd);
}

static void test_stale_modes_train(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const char *longer = "--data synthetic:dlrm --steps 60 --batch 32 --optimizer sgd --lr 0.5 --schedule constant";
    compare("ssp:2", longer, "--mode ps --ps-servers 2 --ps-sync ssp:2", 4, -2);
    compare("ssp:2, adagrad rows", longer, "--mode ps --ps-servers 2 --ps-sync ssp:2 --ps-optimizer adagrad", 4, -1);
    compare("async", longer, "--mode ps --ps-servers 2 --ps-sync async --ps-prefetch 2", 4, -2);
}

/* The {"ps_workers": ...} record of a log, parsed (NULL when absent). */
static cJSON *read_record(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    char line[1 << 16];
    cJSON *rec = NULL;
    while (fgets(line, sizeof line, f))
        if (strstr(line, "\"ps_workers\"")) cJSON_Delete(rec), rec = cJSON_Parse(line);
    fclose(f);
    return rec;
}

/* The train split's sample count from the banner ("...; N train / M val samples"). */
static long banner_train_count(const char *err) {
    const char *e = err ? strstr(err, " train / ") : NULL;
    if (!e) return -1;
    const char *b = e;
    while (b > err && b[-1] >= '0' && b[-1] <= '9') b--;
    return atol(b);
}

/* A dynamic run of `workers` workers on 2 servers, worker 1 (rank 3) slowed by a 30 ms pause a
 * chunk (a fixed pause: a chunk's own compute is a millisecond or two, below the round trips and
 * the load of a shared machine, so a factor on it slows little): every sample of the one-process
 * run's `steps` batches trained exactly once, the slowed worker fewer chunks. */
static void dynamic_case(int workers, int prefetch) {
    enum { STEPS = 40, BATCH = 24, SEED = 7 };
    char flagbuf[2048], log[512], label[64];
    snprintf(label, sizeof label, "dynamic, %d workers, prefetch %d", workers, prefetch);
    snprintf(log, sizeof log, "%s", check_tmp_path("dyn.jsonl"));
    snprintf(flagbuf, sizeof flagbuf, "--model %s --data synthetic:dlrm --steps %d --batch %d --seed %d --optimizer "
             "sgd --lr 0.1 --schedule constant --mode ps --ps-servers 2 --ps-sync async --ps-dense servers "
             "--ps-prefetch %d --straggler-policy dd --inject-slowdown 3:+0.03 --log %s", check_tmp_path("dlrm.json"),
             STEPS, BATCH, SEED, prefetch, log);
    const char *argv[64];
    mpi_world wd;
    run_world(2 + workers, flagbuf, &wd, argv);
    CHECK(wd.status == 0, "%s: exit %d", label, wd.status);
    CHECK(contains(wd.err, "dynamic sharding"), "%s: no note of the sharding", label);
    long n_train = banner_train_count(wd.err);
    cJSON *rec = read_record(log), *r = rec ? cJSON_GetObjectItem(rec, "ps_workers") : NULL;
    cJSON *taken = r ? cJSON_GetObjectItem(r, "taken") : NULL, *chunks = r ? cJSON_GetObjectItem(r, "chunks") : NULL;
    CHECK(n_train > 0 && cJSON_GetArraySize(taken) == workers && cJSON_GetArraySize(chunks) == workers,
          "%s: the record (%s) or the banner's train count (%ld) missing", label, rec ? "present" : "absent", n_train);
    if (!check_cur_failed) {
        /* the one-process run's samples: the sampler's first STEPS batches */
        adt_sampler sm;
        CHECK(adt_sampler_init(&sm, n_train, BATCH, 1, SEED) == 0, "%s: sampler", label);
        int64_t *idx = malloc((size_t)BATCH * sizeof *idx);
        int *count = calloc((size_t)n_train, sizeof *count), *want = calloc((size_t)n_train, sizeof *want);
        for (int k = 0; k < STEPS; k++) {
            adt_sampler_batch(&sm, k, idx);
            for (int i = 0; i < BATCH; i++) want[idx[i]]++;
        }
        /* the workers' samples: chunk c is block c mod W of batch c / W (the runner's mapping) */
        int Bw = BATCH / workers, n_chunks[8] = {0}, bad_chunk = 0;
        for (int w = 0; w < workers; w++) {
            cJSON *list = cJSON_GetArrayItem(taken, w), *c;
            n_chunks[w] = cJSON_GetArraySize(list);
            CHECK(n_chunks[w] == (int)cJSON_GetArrayItem(chunks, w)->valuedouble, "%s: worker %d's chunk count", label, w);
            cJSON_ArrayForEach(c, list) {
                long ch = (long)c->valuedouble;
                if (ch < 0 || ch >= (long)STEPS * workers) {
                    bad_chunk++;
                    continue;
                }
                adt_sampler_batch(&sm, ch / workers, idx);
                for (int i = 0; i < Bw; i++) count[idx[(ch % workers) * Bw + i]]++;
            }
        }
        long wrong = 0, first = -1, trained = 0;
        for (long i = 0; i < n_train; i++) {
            trained += count[i];
            if (count[i] != want[i]) wrong++, first = first < 0 ? i : first;
        }
        CHECK(bad_chunk == 0 && wrong == 0 && trained == (long)STEPS * BATCH,
              "%s: %ld samples trained in all (expected %d), %ld sample ids trained a number of times other than the "
              "one-process run's (first: %ld, %d times vs %d), %d chunks out of range", label, trained, STEPS * BATCH,
              wrong, first, first >= 0 ? count[first] : 0, first >= 0 ? want[first] : 0, bad_chunk);
        int fastest = 0;
        for (int w = 0; w < workers; w++)
            if (w != 1 && n_chunks[w] > fastest) fastest = n_chunks[w];
        CHECK(2 * n_chunks[1] < fastest, "%s: the slowed worker took %d chunks, the fastest %d: expected under half",
              label, n_chunks[1], fastest);
        /* the samples the workers filled (not only the chunks they logged): the one-process run's */
        double ref[2] = {0, 0};
        for (int k = 0; k < STEPS; k++) {
            adt_sampler_batch(&sm, k, idx);
            for (int i = 0; i < BATCH; i++) {
                uint64_t h = adt_rng_mix64((uint64_t)idx[i]);
                ref[0] += (double)(h & 0xfffff), ref[1] += (double)(h >> 44);
            }
        }
        cJSON *dg = cJSON_GetObjectItem(r, "sample_digest");
        CHECK(cJSON_GetArraySize(dg) == 2 && cJSON_GetArrayItem(dg, 0)->valuedouble == ref[0] &&
              cJSON_GetArrayItem(dg, 1)->valuedouble == ref[1], "%s: the digest of the samples trained (%.0f, %.0f) is "
              "not the one-process run's (%.0f, %.0f)", label, dg ? cJSON_GetArrayItem(dg, 0)->valuedouble : -1,
              dg ? cJSON_GetArrayItem(dg, 1)->valuedouble : -1, ref[0], ref[1]);
        cJSON *ml = cJSON_GetObjectItem(r, "mean_loss");
        CHECK(ml && isfinite(ml->valuedouble) && ml->valuedouble > 0, "%s: mean loss", label);
        free(idx), free(count), free(want);
        adt_sampler_free(&sm);
    }
    if (check_cur_failed) mpi_print_tail("stderr", wd.err, 30);
    cJSON_Delete(rec);
    mpi_world_free(&wd);
    unlink(log);
}

static void test_dynamic_sharding(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    write_text(check_tmp_path("dlrm.json"), DLRM);
    dynamic_case(2, 1);
    dynamic_case(3, 2);
    dynamic_case(2, 0);
    /* refusals that need the world (the batch against the workers, the slowed rank) */
    const char *dd = "--data synthetic:dlrm --steps 4 --schedule constant --mode ps --ps-servers 2 --ps-sync async "
                     "--ps-dense servers --straggler-policy dd";
    struct {
        const char *flags, *expect;
    } cases[] = {
        {"--batch 15", "--batch 15 is not a multiple of the 2 workers"},
        {"--batch 16 --inject-slowdown 1:2", "--inject-slowdown: rank 1 is a server, which pauses before each answer"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char flags[1024], err[8192];
        snprintf(flags, sizeof flags, "%s %s", dd, cases[i].flags);
        int st = run_ps(4, flags, err, sizeof err);
        CHECK(st == 2 && contains(err, cases[i].expect), "'%s': exit %d, expected 2 naming '%s':\n%s", cases[i].flags,
              st, cases[i].expect, err);
    }
    unlink(check_tmp_path("dlrm.json"));
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
        {"--mode ps --init x.safetensors", "--init: a checkpoint's weights are not loaded into the servers' shards"},
        {"--mode ps --split 16", "--split"},
        {"--mode parameter-server", "--mode: expected 'collective' or 'ps'"},
        {"--mode ps --straggler-policy dd", "dynamic sharding needs --ps-sync async"},
        {"--mode ps --ps-sync ssp:2 --straggler-policy dd", "dynamic sharding needs --ps-sync async"},
        {"--mode ps --ps-sync async --straggler-policy dd", "expected --ps-dense servers"},
        {"--mode ps --ps-sync async --ps-dense servers --straggler-policy dd --schedule constant --val synthetic:dlrm",
         "--straggler-policy dd: --val"},
        {"--mode ps --ps-sync async --ps-dense servers --straggler-policy dd", "expected --schedule constant"},
        {"--mode ps --ps-sync async --ps-dense servers --straggler-policy dd --schedule constant --save x",
         "--straggler-policy dd: --save"},
        {"--mode ps --straggler-policy nd", "--straggler-policy nd: not in --mode ps"},
        {"--mode ps --micro-batch 4", "--micro-batch"},
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
    RUN(test_resume);
    RUN(test_stale_modes_train);
    RUN(test_dynamic_sharding);
    rmdir(check_tmpdir());
    return check_finish();
}
