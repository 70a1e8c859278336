/*
 * train_log.h - comparing `adtrain train` runs: reading what --log wrote (step losses, validation
 * lines), counting lines in captured output, and an `mpiexec -n N adtrain train` run against the
 * one-process run. Include after check.h, cli_run.h and mpi_world.h.
 */
#ifndef ADTRAIN_TESTS_TRAIN_LOG_H
#define ADTRAIN_TESTS_TRAIN_LOG_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Step losses and validation lines (val_loss, val_acc) of a --log file. */
typedef struct log_lines {
    int n, n_eval;
    double loss[64], val_loss[16], val_acc[16];
} log_lines;

static inline int read_log(const char *path, log_lines *l) {
    memset(l, 0, sizeof *l);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    while (fgets(line, sizeof line, f)) {
        const char *vl = strstr(line, "\"val_loss\":"), *va = strstr(line, "\"val_acc\":"), *lo = strstr(line, "\"loss\":");
        if (vl && l->n_eval < 16) {
            l->val_loss[l->n_eval] = atof(vl + 11);
            l->val_acc[l->n_eval++] = va ? atof(va + 10) : -1;
        } else if (lo && l->n < 64) {
            l->loss[l->n++] = atof(lo + 7);
        }
    }
    fclose(f);
    return 0;
}

static inline int count_of(const char *hay, const char *needle) {
    int n = 0;
    for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle)) n++;
    return n;
}

/* `mpiexec -n N adtrain train --model M <flags>` (under a plan file `adtrain plan --devices N
 * <plan_flags>` wrote, when plan_flags is given) against `adtrain train` on one process: the
 * same step losses and validation losses within 1e-5 relative, the same accuracy, and each of
 * says[] (NULL-terminated) exactly once in what the ranks printed (rank 0 alone prints). Returns
 * the worst relative step-loss error. */
static inline double train_compare(const char *label, int n, const char *model_json, const char *flags,
                                   const char *plan_flags, const char *const *says) {
    char cfgp[512], serial_log[512], dist_log[512], planp[512], args[2048], out[32768];
    snprintf(cfgp, sizeof cfgp, "%s", check_tmp_path("cli_model.json"));
    write_text(cfgp, model_json);
    snprintf(serial_log, sizeof serial_log, "%s", check_tmp_path("serial.jsonl"));
    snprintf(dist_log, sizeof dist_log, "%s", check_tmp_path("dist.jsonl"));
    snprintf(planp, sizeof planp, "%s", check_tmp_path("plan.json"));
    snprintf(args, sizeof args, "train --model '%s' %s --log '%s'", cfgp, flags, serial_log);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "%s: serial run: exit %d:\n%s", label, rc, out);
    if (plan_flags) {
        snprintf(args, sizeof args, "plan --devices %d --model '%s' %s -o '%s'", n, cfgp, plan_flags, planp);
        rc = run_adtrain(args, out, sizeof out);
        CHECK(rc == 0, "%s: adtrain %s: exit %d:\n%s", label, args, rc, out);
    }
    /* the same flags, split into argv for mpiexec */
    const char *argv[48];
    int k = 0;
    char flagbuf[1024];
    snprintf(flagbuf, sizeof flagbuf, "%s", flags);
    argv[k++] = g_bin, argv[k++] = "train", argv[k++] = "--model", argv[k++] = cfgp;
    for (char *t = strtok(flagbuf, " "); t && k < 42; t = strtok(NULL, " ")) argv[k++] = t;
    if (plan_flags) argv[k++] = "--plan", argv[k++] = planp;
    argv[k++] = "--log", argv[k++] = dist_log, argv[k] = NULL;
    mpi_world wd = {.n = n, .argv = argv};
    mpi_run_world(&wd, check_tmpdir(), 120);
    CHECK(wd.status == 0, "%s: mpiexec -n %d adtrain train: exit %d after %.1f s", label, n, wd.status, wd.secs);
    for (int i = 0; says && says[i]; i++)
        CHECK(count_of(wd.err, says[i]) == 1, "%s: '%s' printed %d times, expected once (rank 0 prints)", label, says[i],
              count_of(wd.err, says[i]));
    if (check_cur_failed) mpi_print_tail("stderr", wd.err, 20);
    log_lines a, b;
    CHECK(read_log(serial_log, &a) == 0 && read_log(dist_log, &b) == 0, "%s: logs missing", label);
    CHECK(a.n > 0 && a.n == b.n && a.n_eval == b.n_eval, "%s: %d/%d step lines, %d/%d eval lines", label, a.n, b.n,
          a.n_eval, b.n_eval);
    double worst = 0;
    for (int i = 0; i < a.n && i < b.n; i++) {
        double e = fabs(a.loss[i] - b.loss[i]) / fabs(a.loss[i]);
        CHECK(e <= 1e-5, "%s: step %d loss %.9g on %d ranks, %.9g on one", label, i + 1, b.loss[i], n, a.loss[i]);
        if (!(e <= worst)) worst = e;
    }
    for (int i = 0; i < a.n_eval && i < b.n_eval; i++) {
        CHECK(fabs(a.val_loss[i] - b.val_loss[i]) <= 1e-5 * fabs(a.val_loss[i]),
              "%s: evaluation %d: val_loss %.9g on %d ranks, %.9g on one", label, i + 1, b.val_loss[i], n, a.val_loss[i]);
        CHECK(a.val_acc[i] == b.val_acc[i], "%s: evaluation %d: val_acc %.6f on %d ranks, %.6f on one", label, i + 1,
              b.val_acc[i], n, a.val_acc[i]);
    }
    mpi_world_free(&wd);
    unlink(serial_log);
    unlink(dist_log);
    unlink(cfgp);
    unlink(planp);
    return worst;
}

#endif
