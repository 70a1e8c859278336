/*
 * opts.c - the trainer's options: their documented defaults, each set from text and checked
 * (the flag named in every message), and the checks of each against the others. Every option is
 * checked before any file is touched, so a typo never costs a run.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"
#include "adtrain/models.h"
#include "adtrain/ps.h"
#include "train_internal.h"

void adt_train_opts_init(adt_train_opts *o) {
    *o = (adt_train_opts){.steps = 200, .batch = 16, .eval_batches = 20, .optimizer = ADT_OPTIM_ADAMW,
                          .cosine = 1, .shuffle = 1, .threads = 1, .seed = 1337, .bal = {.slow_rank = -1},
                          .commit_every = 10, .lease_timeout = 30, .flash = 1, .ps_servers = 1, .ps_prefetch = 1};
}

static const char *const train_flags[] = {
    "--model", "--data", "--val", "--steps", "--batch", "--optimizer", "--lr", "--momentum", "--weight-decay",
    "--warmup", "--schedule", "--shuffle", "--seed", "--threads", "--eval-every", "--eval-batches", "--log",
    "--init", "--resume", "--save", "--save-every", "--plan",
    "--straggler-policy", "--straggler-config", "--straggler-master", "--split", "--micro-batch", "--inject-slowdown",
    "--elastic-dir", "--commit-every", "--lease-timeout", "--flash", "--profile",
    "--mode", "--ps-servers", "--ps-sync", "--ps-prefetch", "--ps-optimizer", "--ps-dense", NULL,
};

/* The option's index in train_flags, or -1. */
static int flag_index(const char *name) {
    if (!name) return -1;
    const char *n = name[0] == '-' && name[1] == '-' ? name + 2 : name;
    for (int i = 0; train_flags[i]; i++)
        if (!strcmp(train_flags[i] + 2, n)) return i;
    return -1;
}

int adt_train_opts_known(const char *name) { return flag_index(name) >= 0; }

int train_opts_given(const adt_train_opts *o, const char *flag) {
    int i = flag_index(flag);
    if (i >= 0 && (o->given >> i & 1)) return 1;
    adt_train_opts d;
    adt_train_opts_init(&d);
    if (!strcmp(flag, "--model")) return o->model_path != NULL;
    if (!strcmp(flag, "--data")) return o->data != NULL;
    if (!strcmp(flag, "--steps")) return o->steps != d.steps;
    if (!strcmp(flag, "--batch")) return o->batch != d.batch;
    if (!strcmp(flag, "--optimizer")) return o->optimizer != d.optimizer;
    if (!strcmp(flag, "--lr")) return o->lr_given;
    if (!strcmp(flag, "--momentum")) return o->momentum_given;
    if (!strcmp(flag, "--weight-decay")) return o->weight_decay != d.weight_decay;
    if (!strcmp(flag, "--seed")) return o->seed != d.seed;
    if (!strcmp(flag, "--elastic-dir")) return o->elastic_dir != NULL;
    if (!strcmp(flag, "--straggler-policy")) return o->bal.on && o->bal.policy != ADT_STRAGGLER_OFF;
    return 0;
}

static int parse_long(const char *flag, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi)
        return train_fail(EXIT_USAGE, "%s: expected an integer in [%ld, %ld], got '%s'", flag, lo, hi, s);
    *out = (long)v;
    return 0;
}

/* A finite number in [lo, hi] (or (lo, hi] when lo_open). */
static int parse_double(const char *flag, const char *s, double lo, double hi, int lo_open, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    int ok = *s && !*end && !errno && isfinite(v) && (lo_open ? v > lo : v >= lo) && v <= hi;
    if (!ok)
        return train_fail(EXIT_USAGE, "%s: expected a number in %c%g, %g], got '%s'", flag, lo_open ? '(' : '[', lo,
                          hi, s);
    *out = v;
    return 0;
}

static int parse_choice(const char *flag, const char *s, const char *a, const char *b, int *out) {
    if (!strcmp(s, a)) *out = 0;
    else if (!strcmp(s, b)) *out = 1;
    else return train_fail(EXIT_USAGE, "%s: expected '%s' or '%s', got '%s'", flag, a, b, s);
    return 0;
}

static int parse_seed(const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (!*s || *end || errno || s[0] == '-')
        return train_fail(EXIT_USAGE, "--seed: expected a non-negative integer below 2^64, got '%s'", s);
    *out = v;
    return 0;
}

int adt_train_opts_set(adt_train_opts *o, const char *name, const char *v) {
    char f[64];
    int known = adt_train_opts_known(name);
    if (!known) return train_fail(EXIT_USAGE, "unknown option '%s'", name);
    snprintf(f, sizeof f, "%s%s", name[0] == '-' ? "" : "--", name);
    if (!v) return train_fail(EXIT_USAGE, "%s: missing value", f);
    o->given |= (uint64_t)1 << flag_index(f);
    long l = 0;
    int c = 0, rc = 0;
    if (!strcmp(f, "--model")) o->model_path = v;
    else if (!strcmp(f, "--data")) o->data = v;
    else if (!strcmp(f, "--val")) o->val = v;
    else if (!strcmp(f, "--log")) o->log_path = v;
    else if (!strcmp(f, "--init")) o->init_path = v;
    else if (!strcmp(f, "--resume")) o->resume_path = v;
    else if (!strcmp(f, "--save")) o->save_path = v;
    else if (!strcmp(f, "--plan")) o->plan_path = v;
    else if (!strncmp(f, "--straggler-", 12) || !strcmp(f, "--split") || !strcmp(f, "--micro-batch") ||
             !strcmp(f, "--inject-slowdown"))
        rc = train_balance_flag(o, f, v);
    else if (!strcmp(f, "--elastic-dir")) o->elastic_dir = v;
    else if (!strcmp(f, "--commit-every")) rc = parse_long(f, v, 1, INT32_MAX, &o->commit_every);
    else if (!strcmp(f, "--lease-timeout")) rc = parse_double(f, v, 0, 1e6, 1, &o->lease_timeout);
    else if (!strcmp(f, "--flash")) rc = parse_choice(f, v, "off", "on", &o->flash);
    else if (!strcmp(f, "--save-every")) rc = parse_long(f, v, 1, INT32_MAX, &o->save_every);
    else if (!strcmp(f, "--steps")) rc = parse_long(f, v, 1, INT32_MAX, &o->steps);
    else if (!strcmp(f, "--batch")) rc = parse_long(f, v, 1, 1 << 20, &o->batch);
    else if (!strcmp(f, "--warmup")) rc = parse_long(f, v, 0, INT32_MAX, &o->warmup);
    else if (!strcmp(f, "--eval-every")) rc = parse_long(f, v, 0, INT32_MAX, &o->eval_every);
    else if (!strcmp(f, "--eval-batches")) rc = parse_long(f, v, 1, 1000000, &o->eval_batches);
    else if (!strcmp(f, "--threads")) rc = parse_long(f, v, 1, 1024, &l), o->threads = (int)l;
    else if (!strcmp(f, "--lr")) rc = parse_double(f, v, 0, 1e3, 1, &o->lr), o->lr_given = 1;
    else if (!strcmp(f, "--momentum")) rc = parse_double(f, v, 0, 0.999999, 0, &o->momentum), o->momentum_given = 1;
    else if (!strcmp(f, "--weight-decay")) rc = parse_double(f, v, 0, 1e3, 0, &o->weight_decay);
    else if (!strcmp(f, "--seed")) rc = parse_seed(v, &o->seed);
    else if (!strcmp(f, "--optimizer")) rc = parse_choice(f, v, "sgd", "adamw", &c), o->optimizer = c ? ADT_OPTIM_ADAMW : ADT_OPTIM_SGD;
    else if (!strcmp(f, "--schedule")) rc = parse_choice(f, v, "constant", "cosine", &o->cosine);
    else if (!strcmp(f, "--shuffle")) rc = parse_choice(f, v, "off", "on", &o->shuffle);
    else if (!strcmp(f, "--profile")) rc = parse_choice(f, v, "off", "on", &o->profile);
    else if (!strcmp(f, "--mode")) rc = parse_choice(f, v, "collective", "ps", &o->ps_mode);
    else if (!strcmp(f, "--ps-servers")) rc = parse_long(f, v, 1, 4096, &l), o->ps_servers = (int)l;
    else if (!strcmp(f, "--ps-prefetch")) rc = parse_long(f, v, 0, 64, &l), o->ps_prefetch = (int)l;
    else if (!strcmp(f, "--ps-dense")) rc = parse_choice(f, v, "workers", "servers", &o->ps_dense_servers);
    else if (!strcmp(f, "--ps-sync")) {
        adt_ps_sync sy;
        rc = adt_ps_sync_parse(v, "--ps-sync", &sy) ? EXIT_USAGE : 0;
        o->ps_sync = v;
    } else if (!strcmp(f, "--ps-optimizer")) {
        adt_ps_optim_kind k;
        rc = adt_ps_optim_parse(v, "--ps-optimizer", &k) ? EXIT_USAGE : 0;
        o->ps_optimizer = v;
    }
    else ADT_ASSERT(0 && "option in the table without a handler");
    return rc;
}

/* --plan with a parameter-server plan (adtrain plan chose the ps mode): the run takes its
 * settings as --mode ps; a flag that says otherwise, another model or batch, is refused. */
static int ps_plan_apply(adt_train_opts *o) {
    adt_ps_plan pp;
    int is_ps;
    if (!o->plan_path) return 0;
    if (adt_ps_plan_read(o->plan_path, &pp, &is_ps)) return train_fail(EXIT_USAGE, "--plan: %s", adt_error_message());
    if (!is_ps) return 0;
    char want[64], got[64];
    const char *flag = NULL;
    if (o->given >> flag_index("--mode") & 1 && !o->ps_mode)
        flag = "--mode", snprintf(want, sizeof want, "ps"), snprintf(got, sizeof got, "collective");
    else if (o->given >> flag_index("--ps-servers") & 1 && o->ps_servers != pp.servers)
        flag = "--ps-servers", snprintf(want, sizeof want, "%d", pp.servers), snprintf(got, sizeof got, "%d", o->ps_servers);
    else if (o->given >> flag_index("--ps-sync") & 1 && strcmp(o->ps_sync, pp.sync))
        flag = "--ps-sync", snprintf(want, sizeof want, "%s", pp.sync), snprintf(got, sizeof got, "%.40s", o->ps_sync);
    else if (o->given >> flag_index("--ps-prefetch") & 1 && o->ps_prefetch != pp.prefetch)
        flag = "--ps-prefetch", snprintf(want, sizeof want, "%d", pp.prefetch), snprintf(got, sizeof got, "%d", o->ps_prefetch);
    else if (o->given >> flag_index("--ps-dense") & 1 && o->ps_dense_servers != pp.dense_servers)
        flag = "--ps-dense", snprintf(want, sizeof want, "%s", pp.dense_servers ? "servers" : "workers"),
        snprintf(got, sizeof got, "%s", o->ps_dense_servers ? "servers" : "workers");
    else if (o->given >> flag_index("--batch") & 1 && o->batch != pp.batch)
        flag = "--batch", snprintf(want, sizeof want, "%d", pp.batch), snprintf(got, sizeof got, "%ld", o->batch);
    if (flag)
        return train_fail(EXIT_USAGE, "%s %s: the parameter-server plan %s says %s; expected %s %s or no %s", flag, got,
                          o->plan_path, want, flag, want, flag);
    adt_model_cfg m;
    if (!o->model_path || adt_model_cfg_load(&m, o->model_path))
        return train_fail(EXIT_USAGE, "--plan %s: a parameter-server plan for a DLRM; expected --model with its config%s%s",
                          o->plan_path, o->model_path ? ": " : "", o->model_path ? adt_error_message() : "");
    char *a = adt_model_cfg_to_json(&m), *b = adt_model_cfg_to_json(&pp.model);
    int same = !strcmp(a, b);
    free(a), free(b);
    if (!same) return train_fail(EXIT_USAGE, "--plan %s: made for another model than --model %s", o->plan_path, o->model_path);
    char what[300];
    adt_ps_sync sync;
    snprintf(what, sizeof what, "--plan %.200s: field \"ps.sync\"", o->plan_path);
    if (adt_ps_sync_parse(pp.sync, what, &sync)) return train_fail(EXIT_USAGE, "%s", adt_error_message());
    snprintf(o->ps_plan_sync, sizeof o->ps_plan_sync, "%s", pp.sync);
    o->batch = pp.batch;
    o->ps_mode = 1, o->ps_servers = pp.servers, o->ps_sync = o->ps_plan_sync, o->ps_prefetch = pp.prefetch;
    o->ps_dense_servers = pp.dense_servers, o->ps_plan_devices = pp.devices;
    return 0;
}

int adt_train_opts_check(adt_train_opts *o) {
    /* flags that contradict each other first: they need no file read */
    int prc = o->bal.on ? train_balance_check(o) : 0;
    if (!prc) prc = ps_plan_apply(o);
    if (prc) return prc;
    static const char *const ps_flags[] = {"--ps-servers", "--ps-sync", "--ps-prefetch", "--ps-optimizer", "--ps-dense",
                                           NULL};
    for (int i = 0; ps_flags[i] && !o->ps_mode; i++)
        if (o->given >> flag_index(ps_flags[i]) & 1)
            return train_fail(EXIT_USAGE, "%s: only acts with --mode ps; expected --mode ps, or no %s", ps_flags[i],
                              ps_flags[i]);
    if (o->momentum_given && o->optimizer != ADT_OPTIM_SGD)
        return train_fail(EXIT_USAGE, "--momentum: only applies to --optimizer sgd (adamw uses betas 0.9, 0.95)");
    if (!o->lr_given) o->lr = o->optimizer == ADT_OPTIM_SGD ? 0.1 : 1e-3;
    if (o->init_path && o->resume_path)
        return train_fail(EXIT_USAGE, "--init and --resume: expected one of them (--resume already restores the weights)");
    if (o->save_every && !o->save_path)
        return train_fail(EXIT_USAGE, "--save-every: expected --save PATH too (where to write)");
    if (o->warmup > o->steps)
        return train_fail(EXIT_USAGE, "--warmup: %ld warmup steps exceed --steps %ld; expected at most %ld", o->warmup,
                          o->steps, o->steps);
    return 0;
}

