/*
 * test_balance.c - balanced data parallelism (`adtrain train --split / --straggler-policy`)
 * through the binary, against the one-process run as the reference.
 *
 * The DD update must be the one computed on all the samples at once: after a few steps the saved
 * weights and optimizer state of `mpiexec -n 2 adtrain train --split 5,11 --micro-batch 4` equal
 * those of `adtrain train` on one process (the partitioned trainer is not involved) within float
 * tolerance, for SGD with momentum on an MLP and AdamW on a GPT; and the same while the DD
 * controller moves the split under an injected 3x slowdown of rank 1 (which must move samples off
 * rank 1). A single 2 s pause of one rank must cause no action. Under a plan (ZeRO, dp x tp,
 * dp x pp) the same controller moves the plan's batch split, and the losses stay the one-process
 * run's. Bad flags exit 2 naming the flag.
 */
#include "check.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "adtrain/adtrain.h"
#include "adtrain/safetensors.h"
#include "cli_run.h"
#include "mpi_world.h"

/* Largest |a - b| - atol over every element of two checkpoints, relative to the largest |b| of its
 * tensor; -1 if the files differ in their tensors. The atol is for values whose gradient is zero
 * in exact arithmetic (a GPT's key bias: softmax ignores a constant shift), so rounding noise,
 * which AdamW divides by its own size, is all that moves them. */
#define CKPT_ATOL 1e-6
static double ckpt_max_rel_diff(const char *pa, const char *pb, int *n_tensors) {
    adt_st_file *a = NULL, *b = NULL;
    double worst = -1;
    *n_tensors = 0;
    if (adt_st_open(&a, pa) || adt_st_open(&b, pb)) goto out;
    if (adt_st_count(a) != adt_st_count(b)) goto out;
    worst = 0;
    for (int i = 0; i < adt_st_count(a); i++) {
        const adt_st_tensor *x = adt_st_get(a, i), *y = adt_st_find(b, x->name);
        if (!y || x->nbytes != y->nbytes || x->dtype != ADT_ST_F32) {
            if (y && x->nbytes == y->nbytes && !memcmp(x->data, y->data, x->nbytes)) continue; /* step, positions */
            worst = -1;
            goto out;
        }
        size_t n = x->nbytes / 4;
        float *u = malloc(x->nbytes), *v = malloc(y->nbytes);
        memcpy(u, x->data, x->nbytes), memcpy(v, y->data, y->nbytes);
        double scale = 1e-30, d = 0;
        for (size_t k = 0; k < n; k++) {
            if (fabs(v[k]) > scale) scale = fabs(v[k]);
            if (fabs(u[k] - v[k]) - CKPT_ATOL > d) d = fabs(u[k] - v[k]) - CKPT_ATOL;
        }
        if (d / scale > worst) worst = d / scale;
        free(u), free(v);
        (*n_tensors)++;
    }
out:
    adt_st_close(a);
    adt_st_close(b);
    return worst;
}

static int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* mpiexec -n nranks adtrain train <flags> (space-separated, no quoting) */
static void run_world(int nranks, const char *flags, mpi_world *wd, char *flagbuf, const char **argv) {
    int k = 0;
    argv[k++] = g_bin, argv[k++] = "train";
    for (char *t = strtok(flagbuf, " "); t && k < 62; t = strtok(NULL, " ")) argv[k++] = t;
    argv[k] = NULL;
    (void)flags;
    *wd = (mpi_world){.n = nranks, .argv = argv};
    mpi_run_world(wd, check_tmpdir(), 180);
}

/* The serial run with `common`, then `nranks` ranks (0: the program alone, no mpiexec) with
 * `common` + `dist`; the checkpoints compared. The balanced run's world is kept in *keep if asked. */
static void compare(const char *label, const char *model_json, const char *common, const char *dist, int nranks,
                    double tol, mpi_world *keep) {
    const char *cfg = check_tmp_path("model.json");
    write_text(cfg, model_json);
    char cfgp[512], sp[512], dp[512], args[2048], out[32768];
    snprintf(cfgp, sizeof cfgp, "%s", cfg);
    snprintf(sp, sizeof sp, "%s", check_tmp_path("serial.safetensors"));
    snprintf(dp, sizeof dp, "%s", check_tmp_path("dd.safetensors"));
    snprintf(args, sizeof args, "train --model %s %s --save %s", cfgp, common, sp);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "%s: serial: exit %d:\n%s", label, rc, out);
    char flagbuf[2048];
    const char *argv[64];
    snprintf(flagbuf, sizeof flagbuf, "--model %s %s %s --save %s", cfgp, common, dist, dp);
    mpi_world wd;
    run_world(nranks, flagbuf, &wd, flagbuf, argv);
    CHECK(wd.status == 0, "%s: %d ranks: exit %d", label, nranks, wd.status);
    CHECK(count_of(wd.err, "balanced data parallel") == 1, "%s: one banner naming balanced data parallelism", label);
    if (check_cur_failed) mpi_print_tail("stderr", wd.err, 30);
    int nt;
    double d = ckpt_max_rel_diff(dp, sp, &nt);
    CHECK(d >= 0 && nt >= 2, "%s: the checkpoints hold different tensors (%d compared)", label, nt);
    CHECK(d <= tol, "%s: weights and optimizer state differ from the one-process run by %.3g (relative), "
          "expected <= %.1g", label, d, tol);
    if (keep) *keep = wd;
    else mpi_world_free(&wd);
    unlink(sp), unlink(dp), unlink(cfgp);
}

static const char *MLP = "{\"type\":\"mlp\",\"sizes\":[16,48,4],\"activation\":\"relu\"}\n";
static const char *GPT = "{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":16,\"n_layer\":1,\"n_embd\":16,\"n_head\":2}\n";

static void test_dd_equals_serial(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    compare("mlp sgd+momentum 5/11", MLP,
            "--data synthetic:mlp --steps 4 --batch 16 --optimizer sgd --momentum 0.9 --lr 0.2 --seed 3",
            "--split 5,11 --micro-batch 4", 2, 2e-5, NULL);
    compare("gpt adamw 5/11", GPT, "--data synthetic:text --steps 3 --batch 16 --lr 3e-3 --seed 9",
            "--split 5,11 --micro-batch 4", 2, 2e-5, NULL);
    /* a split that cannot be even, passes of one sample */
    compare("mlp 1/15, passes of 1", MLP, "--data synthetic:mlp --steps 2 --batch 16 --optimizer sgd --lr 0.2",
            "--split 1,15 --micro-batch 1", 2, 2e-5, NULL);
}

/* One process, gradient accumulation only: passes of 3 over a batch of 16 (3,3,3,3,2,2). */
static void test_accumulation_one_process(void) {
    mpi_world wd;
    compare("one process, passes of 3", MLP,
            "--data synthetic:mlp --steps 3 --batch 16 --optimizer adamw --weight-decay 0.1 --lr 1e-2",
            "--micro-batch 3", 0, 2e-5, &wd);
    CHECK(contains(wd.err, "passes of at most 3 samples"), "banner:\n%s", wd.err);
    mpi_world_free(&wd);
}

/* The actions of a JSONL log: step, slowest rank and the split of two ranks; returns how many. */
static int read_actions(const char *path, long *step, int *rank, long *s0, long *s1, int cap) {
    FILE *f = fopen(path, "r");
    char line[4096];
    int n = 0;
    while (f && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"straggler_action\""), *q = strstr(line, "\"split\":["), *r = strstr(line, "\"rank\":");
        if (!p || !q || !r || n >= cap) continue;
        step[n] = atol(line + 8);
        rank[n] = atoi(r + 7);
        if (sscanf(q + 9, "%ld,%ld", &s0[n], &s1[n]) == 2) n++;
    }
    if (f) fclose(f);
    return n;
}

/* DD under a 4x slowdown of rank 1: the controller moves samples off rank 1, and the weights
 * still equal the one-process run's. Other processes on a shared machine can slow rank 0 even
 * more for a while, so the direction is asked of one of up to three runs; the equality of every
 * run. */
static void test_dd_rebalances_exactly(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const char *big = "{\"type\":\"mlp\",\"sizes\":[64,256,256,4],\"activation\":\"relu\"}\n";
    char dist[1024], logp[512];
    snprintf(logp, sizeof logp, "%s", check_tmp_path("dd.jsonl"));
    snprintf(dist, sizeof dist, "--straggler-policy dd --inject-slowdown 1:4 --straggler-config "
             "warmup=2,dd_after=3,cooldown=5 --log %s", logp);
    int right = 0;
    for (int attempt = 0; attempt < 3 && !right; attempt++) {
        mpi_world wd;
        compare("mlp dd rebalanced", big, "--data synthetic:mlp --steps 16 --batch 64 --optimizer sgd --lr 0.05", dist,
                2, 2e-5, &wd);
        long step[64], s0[64], s1[64];
        int rank[64], n = read_actions(logp, step, rank, s0, s1, 64);
        CHECK(n >= 1 && contains(wd.err, "rebalance"), "no rebalance reported:\n%s", wd.err);
        for (int i = 0; i < n; i++) CHECK(s0[i] + s1[i] == 64 && s0[i] >= 1 && s1[i] >= 1, "split %ld/%ld", s0[i], s1[i]);
        /* 4x slower: the proportional split of 64 is 51/13 */
        right = n >= 1 && s1[0] < s0[0] && s1[0] <= 24 && rank[0] == 1;
        if (!right) fprintf(stderr, "  (attempt %d: first action moved the split to %ld/%ld; rank 0 was slowed by "
                            "others)\n", attempt + 1, n ? s0[0] : -1, n ? s1[0] : -1);
        mpi_world_free(&wd);
        unlink(logp);
    }
    CHECK(right, "in three runs the first action never moved samples off the slowed rank 1");
}

/* ND: a single 2 s pause of rank 1 is no reason to act. The step is made long enough (about
 * 10 ms) and the gain threshold high enough (35%) that ordinary noise stays below it; the pause
 * cuts the step time by 99% if acted on, so only the median over the window keeps ND from acting.
 * Contention from other processes on a shared machine is a legitimate reason for ND to act, on
 * any rank at any time; an action that takes samples off rank 1 in the steps whose window holds
 * the pause (15-19) would be the pause's doing, so one of three runs must have none (a deterministic fault fails
 * all; contention that happens to slow rank 1 right after its pause, rarely all). The early first decision
 * (first=) is off: on 3 start-up steps of a loaded machine it moves the split on noise, and its correction
 * can fall in the pause's window. */
static void test_single_pause_no_action(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const char *cfg = check_tmp_path("model.json");
    char cfgp[512], logp[512];
    snprintf(cfgp, sizeof cfgp, "%s", cfg);
    snprintf(logp, sizeof logp, "%s", check_tmp_path("pause.jsonl"));
    write_text(cfgp, "{\"type\":\"mlp\",\"sizes\":[256,512,512,4],\"activation\":\"relu\"}\n");
    int clean = 0;
    for (int attempt = 0; attempt < 3 && !clean; attempt++) {
        char flagbuf[2048];
        const char *argv[64];
        snprintf(flagbuf, sizeof flagbuf, "--model %s --data synthetic:mlp --steps 40 --batch 128 --optimizer sgd "
                 "--straggler-policy nd --straggler-config gain=0.35,nd_after=5,first=0 --inject-slowdown 1:+2@15-15 "
                 "--log %s", cfgp, logp);
        mpi_world wd;
        run_world(2, flagbuf, &wd, flagbuf, argv);
        CHECK(wd.status == 0, "exit %d", wd.status);
        CHECK(wd.secs >= 2, "the pause did not happen: %.1f s", wd.secs);
        long step[64], s0[64], s1[64];
        int rank[64], n = read_actions(logp, step, rank, s0, s1, 64), on_pause = 0;
        /* the pause's doing: an action in those steps that takes samples off rank 1 (one that
         * gives it more, undoing an earlier move on noise, is not) */
        for (int i = 0; i < n; i++) on_pause += step[i] >= 15 && step[i] < 20 && s1[i] < (i ? s1[i - 1] : 64);
        clean = on_pause == 0;
        if (!clean) fprintf(stderr, "  (attempt %d: an action on rank 1 within 5 steps of its pause)\n%s", attempt + 1,
                            wd.err);
        mpi_world_free(&wd);
        unlink(logp);
    }
    CHECK(clean, "all three runs acted on rank 1 within 5 steps of its single pause");
    unlink(cfgp);
}

/* Balanced data parallelism under plans with a data-parallel axis: the plan's batch split moved
 * by DD under a 30 ms pause a step on rank 1 (a fixed pause: the tiny MLP's compute is a
 * millisecond or two, and a factor on it drowned in the noise of 4 ranks on 2 cores; ZeRO on 2 ranks; 2 replicas of tensor parallelism, and of 2
 * pipeline stages with 2 microbatches, on 4): every step's loss is the one-process run's within
 * 1e-5, the controller acted, and every split it set sums to the batch in whole microbatches. */
static void test_dd_under_plans(void) {
    if (!g_mpiexec[0] && !mpi_find_mpiexec()) return;
    const struct {
        const char *strategy;
        int ranks, micro;
    } plans[] = {{"zero", 2, 1}, {"dp=2,tp=2", 4, 1}, {"dp=2,pp=2", 4, 2}};
    const char *cfg = check_tmp_path("plans.json");
    char cfgp[512], plan[512], slog[512], dlog[512], args[2048], out[32768];
    snprintf(cfgp, sizeof cfgp, "%s", cfg);
    snprintf(plan, sizeof plan, "%s", check_tmp_path("plan.json"));
    snprintf(slog, sizeof slog, "%s", check_tmp_path("serial.jsonl"));
    snprintf(dlog, sizeof dlog, "%s", check_tmp_path("plan-dd.jsonl"));
    write_text(cfgp, "{\"type\":\"mlp\",\"sizes\":[64,256,256,4],\"activation\":\"relu\"}\n");
    const char *common = "--data synthetic:mlp --steps 16 --batch 64 --optimizer sgd --lr 0.05";
    snprintf(args, sizeof args, "train --model %s %s --log %s", cfgp, common, slog);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "serial: exit %d:\n%s", rc, out);
    double ref[64], got[64];
    int n_eval, n_ref = read_losses(slog, ref, 64, &n_eval);
    CHECK(n_ref == 16, "%d serial steps logged", n_ref);
    for (size_t k = 0; k < sizeof plans / sizeof *plans && n_ref == 16; k++) {
        snprintf(args, sizeof args, "plan --devices %d --strategy %s --microbatches %d --model %s --batch 64 "
                 "--optimizer sgd -o %s", plans[k].ranks, plans[k].strategy, plans[k].micro, cfgp, plan);
        rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 0, "%s: adtrain plan: exit %d:\n%s", plans[k].strategy, rc, out);
        char flagbuf[2048];
        const char *argv[64];
        snprintf(flagbuf, sizeof flagbuf, "--model %s %s --plan %s --straggler-policy dd --inject-slowdown 1:+0.03 "
                 "--straggler-config warmup=2,dd_after=3,cooldown=5 --log %s", cfgp, common, plan, dlog);
        mpi_world wd;
        run_world(plans[k].ranks, flagbuf, &wd, flagbuf, argv);
        CHECK(wd.status == 0, "%s: exit %d", plans[k].strategy, wd.status);
        CHECK(contains(wd.err, "split  the batch over 2 data-parallel replicas"), "%s: no split banner",
              plans[k].strategy);
        int n = read_losses(dlog, got, 64, &n_eval), bad = 0;
        CHECK(n == 16, "%s: %d steps logged", plans[k].strategy, n);
        for (int i = 0; i < n && i < 16; i++) bad += !(fabs(got[i] - ref[i]) <= 1e-5 * fabs(ref[i]));
        CHECK(bad == 0, "%s: %d steps' losses differ from the one-process run's by more than 1e-5", plans[k].strategy,
              bad);
        long step[64], s0[64], s1[64];
        int rank[64], na = read_actions(dlog, step, rank, s0, s1, 64);
        CHECK(na >= 1, "%s: the controller never moved the split:\n%s", plans[k].strategy, wd.err);
        for (int i = 0; i < na; i++)
            CHECK(s0[i] + s1[i] == 64 && s0[i] % plans[k].micro == 0 && s1[i] % plans[k].micro == 0 && s0[i] >= 1 &&
                  s1[i] >= 1, "%s: split %ld/%ld", plans[k].strategy, s0[i], s1[i]);
        if (check_cur_failed) mpi_print_tail("stderr", wd.err, 30);
        mpi_world_free(&wd);
        unlink(dlog);
    }
    unlink(slog), unlink(plan), unlink(cfgp);
}

static void test_bad_flags(void) {
    struct {
        const char *flags, *expect;
    } cases[] = {
        {"--split 15", "--split '15': the local batches sum to 15; expected --batch 16"},
        {"--split 0", "--split '0'"},
        {"--split 8,8", "expected 1 local batches"},
        {"--straggler-policy fast", "--straggler-policy: expected off, dd or nd, got 'fast'"},
        {"--straggler-config nope=1", "unknown key 'nope'"},
        {"--straggler-config k=0.5", "--straggler-config"},
        {"--inject-slowdown 1", "--inject-slowdown: expected RANK:FACTOR"},
        {"--inject-slowdown 0:0.5", "--inject-slowdown"},
        {"--inject-slowdown 0:2@5-4", "--inject-slowdown"},
        {"--inject-slowdown 3:2", "--inject-slowdown: rank 3, but the world has 1 rank"},
        {"--micro-batch 0", "--micro-batch"},
        {"--straggler-policy dd --eval-every 5", "--eval-every: evaluation is not run by balanced"},
        {"--split 16 --micro-batch 4 --plan x.json", "--micro-batch with --plan: the plan's microbatches"},
        {"--straggler-policy dd --straggler-master 127.0.0.1:1 --plan x.json", "--straggler-master with --plan"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char args[512], out[8192];
        snprintf(args, sizeof args, "train --data synthetic:mlp --model configs/mlp-mnist.json --steps 2 %s",
                 cases[i].flags);
        int rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 2, "'%s': exit %d, expected 2:\n%s", cases[i].flags, rc, out);
        CHECK(contains(out, cases[i].expect), "'%s': message:\n%s\nexpected to contain: %s", cases[i].flags, out,
              cases[i].expect);
    }
}

int main(void) {
    cli_find_binary();
    if (check_tmpdir_make("balance")) return 1;
    setenv("ADT_COMM_TIMEOUT", "60", 1);
    mpi_world_sanitizer_env();
    RUN(test_bad_flags);
    RUN(test_accumulation_one_process);
    RUN(test_dd_equals_serial);
    RUN(test_dd_rebalances_exactly);
    RUN(test_single_pause_no_action);
    RUN(test_dd_under_plans);
    rmdir(check_tmpdir());
    return check_finish();
}
