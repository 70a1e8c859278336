/*
 * train_ckpt.c - checkpoints of `adtrain train`: --init (weights), --save and --resume (weights,
 * optimizer state, and what the run needs to go on exactly where it stopped).
 *
 * Nothing else has to be stored to resume bit for bit: the sample order, dropout masks and the
 * learning-rate schedule are pure functions of (seed, step), so the step number is the RNG state
 * and the data position. What the file does store besides the tensors is what must not change
 * between the two halves of a run (seed, batch, shuffling, optimizer, the data's size and
 * vocabulary), so that resuming under different flags is refused rather than silently diverging.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "train.h"

#define CKPT_FORMAT "adtrain-train-state-1"

/* Storage of a global value on this rank (a checkpoint names the global values; under
 * data parallelism every rank holds each persistent value whole). */
static void *exec_data(void *ctx, int v) { return train_value(ctx, v); }

/* The training vocabulary as hex ("0a20..."): metadata values are strings. */
static void vocab_hex(const trainer *t, char *buf, size_t n) {
    buf[0] = 0;
    const adt_text_vocab *v = adt_dataset_vocab(t->train.ds);
    if (!v) return;
    for (int i = 0; i < v->size && (size_t)(2 * i + 3) <= n; i++) snprintf(buf + 2 * i, 3, "%02x", v->byte[i]);
}

/* The --save path with "{step}" (if any) replaced by the step number. */
static void save_path_for(const char *pattern, long step, char *buf, size_t n) {
    const char *at = strstr(pattern, "{step}");
    if (!at) snprintf(buf, n, "%s", pattern);
    else snprintf(buf, n, "%.*s%ld%s", (int)(at - pattern), pattern, step, at + 6);
}

int train_ckpt_save(trainer *t, const char *pattern, long step) {
    if (t->rank != 0) return 0; /* every rank holds the same state: rank 0 writes it */
    char path[4096];
    save_path_for(pattern, step, path, sizeof path);
    if (train_ckpt_write(t, path, step, exec_data, t)) return train_fail(EXIT_RUNTIME, "--save: %s", adt_error_message());
    if (!t->tty || step == t->o.steps) fprintf(stderr, "saved %s (step %ld)\n", path, step);
    return 0;
}

int train_ckpt_write(trainer *t, const char *path, long step, adt_ckpt_data_fn data, void *ctx) {
    char s_step[32], s_seed[32], s_batch[32], s_samples[32], vocab[520];
    snprintf(s_step, sizeof s_step, "%ld", step);
    snprintf(s_seed, sizeof s_seed, "%" PRIu64, t->o.seed);
    snprintf(s_batch, sizeof s_batch, "%ld", t->o.batch);
    snprintf(s_samples, sizeof s_samples, "%" PRId64, t->train.count);
    vocab_hex(t, vocab, sizeof vocab);
    char *model_json = adt_model_cfg_to_json(&t->model);
    const char *meta[] = {
        "adtrain.format", CKPT_FORMAT,
        "adtrain.step", s_step,
        "adtrain.seed", s_seed,
        "adtrain.batch", s_batch,
        "adtrain.shuffle", t->o.shuffle ? "on" : "off",
        "adtrain.optimizer", t->o.optimizer == ADT_OPTIM_SGD ? "sgd" : "adamw",
        "adtrain.data", t->train.spec,
        "adtrain.train_samples", s_samples,
        "adtrain.model", t->model_label,
        "adtrain.model_config", model_json,
        "adtrain.vocab", vocab,
    };
    int rc = adt_ckpt_save(path, t->g, data, ctx, 1, meta, (int)(sizeof meta / sizeof *meta / 2));
    free(model_json);
    return rc;
}

/* A text run must see the vocabulary the checkpoint was trained with: token ids would mean other
 * characters otherwise. Checkpoints without the entry (PyTorch's) are taken as they are. */
static int check_vocab(trainer *t, const adt_st_file *f, const char *flag) {
    const char *want = adt_st_metadata(f, "adtrain.vocab");
    char have[520];
    vocab_hex(t, have, sizeof have);
    if (!want || !*want || !*have || !strcmp(want, have)) return 0;
    return train_fail(EXIT_USAGE,
                      "%s %s: vocabulary mismatch: the checkpoint was trained on %zu distinct symbols (%.40s%s), "
                      "--data %s has %zu (%.40s%s); expected the same training text",
                      flag, adt_st_name(f), strlen(want) / 2, want, strlen(want) > 40 ? "..." : "", t->train.spec,
                      strlen(have) / 2, have, strlen(have) > 40 ? "..." : "");
}

static int open_ckpt(const char *flag, const char *path, adt_st_file **f) {
    if (adt_st_open(f, path)) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    return 0;
}

int train_ckpt_init(trainer *t) {
    if (!t->o.init_path) return 0;
    adt_st_file *f;
    int rc = open_ckpt("--init", t->o.init_path, &f);
    if (rc) return rc;
    rc = check_vocab(t, f, "--init");
    if (!rc && adt_ckpt_load(f, t->g, exec_data, t, 0))
        rc = train_fail(EXIT_USAGE, "--init: %s", adt_error_message());
    adt_st_close(f);
    return rc;
}

/* The checkpoint's value for `key` must equal `have` (what this run's flags give). */
static int check_same(const adt_st_file *f, const char *key, const char *have, const char *flag) {
    const char *want = adt_st_metadata(f, key);
    if (!want)
        return train_fail(EXIT_USAGE, "--resume %s: metadata '%s' is missing; expected a checkpoint written by "
                          "adtrain train --save (use --init to start from bare weights)", adt_st_name(f), key);
    if (strcmp(want, have))
        return train_fail(EXIT_USAGE, "--resume %s: the run was saved with %s %s, this one has %s; expected the same "
                          "to continue it", adt_st_name(f), flag, want, have);
    return 0;
}

static int resume_from(trainer *t, const adt_st_file *f) {
    const char *fmt = adt_st_metadata(f, "adtrain.format");
    if (!fmt || strcmp(fmt, CKPT_FORMAT))
        return train_fail(EXIT_USAGE, "--resume %s: format '%s', expected '%s' (a checkpoint written by adtrain train "
                          "--save; use --init to start from bare weights)", adt_st_name(f), fmt ? fmt : "(none)",
                          CKPT_FORMAT);
    char s_seed[32], s_batch[32], s_samples[32];
    snprintf(s_seed, sizeof s_seed, "%" PRIu64, t->o.seed);
    snprintf(s_batch, sizeof s_batch, "%ld", t->o.batch);
    snprintf(s_samples, sizeof s_samples, "%" PRId64, t->train.count);
    int rc;
    if ((rc = check_same(f, "adtrain.seed", s_seed, "--seed")) || (rc = check_same(f, "adtrain.batch", s_batch, "--batch")) ||
        (rc = check_same(f, "adtrain.shuffle", t->o.shuffle ? "on" : "off", "--shuffle")) ||
        (rc = check_same(f, "adtrain.optimizer", t->o.optimizer == ADT_OPTIM_SGD ? "sgd" : "adamw", "--optimizer")) ||
        (rc = check_same(f, "adtrain.train_samples", s_samples, "training samples")) ||
        (rc = check_vocab(t, f, "--resume")))
        return rc;
    const char *s = adt_st_metadata(f, "adtrain.step");
    char *end;
    errno = 0;
    long step = s ? strtol(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || step < 0)
        return train_fail(EXIT_USAGE, "--resume %s: metadata adtrain.step is '%s'; expected a step number",
                          adt_st_name(f), s ? s : "(none)");
    if (step >= t->o.steps)
        return train_fail(EXIT_USAGE, "--resume %s: the checkpoint is at step %ld already; expected --steps above it "
                          "(the total for the whole run)", adt_st_name(f), step);
    if (adt_ckpt_load(f, t->g, exec_data, t, 1)) return train_fail(EXIT_USAGE, "--resume: %s", adt_error_message());
    t->start_step = step;
    return 0;
}

int train_ckpt_resume(trainer *t) {
    if (!t->o.resume_path) return 0;
    adt_st_file *f;
    int rc = open_ckpt("--resume", t->o.resume_path, &f);
    if (rc) return rc;
    rc = resume_from(t, f);
    adt_st_close(f);
    if (!rc && !cli_quiet) fprintf(stderr, "resume %s: continuing after step %ld\n", t->o.resume_path, t->start_step);
    return rc;
}
