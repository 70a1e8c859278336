/*
 * train_ckpt.c - checkpoints of `adtrain train`: --init (weights), --save and --resume (weights,
 * optimizer state, and what the run needs to go on exactly where it stopped).
 *
 * Nothing else has to be stored to resume bit for bit: the sample order, dropout masks and the
 * learning-rate schedule are pure functions of (seed, step), so the step number is the RNG state
 * and the data position. What the file does store besides the tensors is what must not change
 * between the two halves of a run (seed, batch, shuffling, optimizer, the data's size and
 * vocabulary), so that resuming under different flags is refused rather than silently diverging.
 *
 * One process saves one safetensors file. A run over several ranks saves a distributed checkpoint
 * (a directory: docs/formats.md, "Distributed checkpoints"): every rank writes the blocks it is
 * the writer of, rank 0 gathers the ranks' parts of the manifest and commits it; under a pipeline
 * plan each rank writes its stage's blocks (a tied parameter once, by the first stage holding it).
 * --init and --resume read either kind under any plan and world size: each rank loads its own
 * blocks (the boxes of its layouts; a tied parameter into every stage holding it) from whichever
 * files hold them.
 *
 * --mode ps writes a directory of its own (ps.c): every server's shard and a run file with the
 * same metadata (format TRAIN_PS_CKPT_FORMAT, and the servers' count, where the dense parameters
 * live and the rows' optimizer, which a resume must match: rows are placed by a hash modulo the
 * number of servers, and are not re-sharded).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "train_internal.h"

#define CKPT_FORMAT "adtrain-train-state-1"

/* Storage of a value of the graph the executor runs (the global graph, or this rank's local one). */
static void *exec_data(void *ctx, int v) { return adt_exec_data(((trainer *)ctx)->ex, v); }

/* Where this rank's share of the model lives: all of it, the blocks of its local graph, or those
 * of its pipeline stage's (the plan's graph names the same tensors in the same shapes). */
static adt_ckpt_view ckpt_view(trainer *t) {
    adt_ckpt_view v = {.g = t->g, .data = exec_data, .ctx = t};
    if (t->loc.g) v.local = &t->loc, v.mesh = &t->plan.mesh, v.coord = t->coord;
    if (t->pipe) {
        v.g = t->pg, v.local = adt_pipe_local(t->pipe), v.mesh = &t->plan.mesh, v.coord = t->coord;
        if (!t->ckpt_elsewhere) t->ckpt_elsewhere = adt_malloc((size_t)t->pg->n_values + 1);
        adt_ckpt_view_stage(&v, adt_pipe_stage_info(t->pipe), t->nranks, t->ckpt_elsewhere);
    }
    return v;
}

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

/* The metadata pairs of a checkpoint at `step` (the strings live in m). */
typedef struct ckpt_meta {
    char step[32], seed[32], batch[32], samples[32], vocab[520], servers[32];
    char *model_json;
    char *split;    /* "b0,b1,..." the balanced runner's split, or NULL */
    const char *kv[34];
    int n_pairs;
} ckpt_meta;

/* split: the local batches of the t->nranks ranks in force at `step` (balanced data
 * parallelism), or NULL. */
static void meta_make(trainer *t, long step, const int64_t *split, ckpt_meta *m) {
    snprintf(m->step, sizeof m->step, "%ld", step);
    snprintf(m->seed, sizeof m->seed, "%" PRIu64, t->o.seed);
    snprintf(m->batch, sizeof m->batch, "%ld", t->o.batch);
    snprintf(m->samples, sizeof m->samples, "%" PRId64, t->train.count);
    vocab_hex(t, m->vocab, sizeof m->vocab);
    m->model_json = adt_model_cfg_to_json(&t->model);
    const char *kv[] = {
        "adtrain.format", CKPT_FORMAT,
        "adtrain.step", m->step,
        "adtrain.seed", m->seed,
        "adtrain.batch", m->batch,
        "adtrain.shuffle", t->o.shuffle ? "on" : "off",
        "adtrain.optimizer", t->o.optimizer == ADT_OPTIM_SGD ? "sgd" : "adamw",
        "adtrain.data", t->train.spec,
        "adtrain.train_samples", m->samples,
        "adtrain.model", t->model_label,
        "adtrain.model_config", m->model_json,
        "adtrain.vocab", m->vocab,
    };
    memcpy(m->kv, kv, sizeof kv);
    m->n_pairs = 11;
    m->split = NULL;
    if (t->ps) {
        snprintf(m->servers, sizeof m->servers, "%d", t->o.ps_servers);
        const char *ps[] = {"adtrain.ps_servers", m->servers, "adtrain.ps_dense",
                            t->o.ps_dense_servers ? "servers" : "workers", "adtrain.ps_optimizer",
                            train_ps_sparse_optimizer(t)};
        m->kv[1] = TRAIN_PS_CKPT_FORMAT;
        memcpy(m->kv + 2 * m->n_pairs, ps, sizeof ps);
        m->n_pairs += 3;
    }
    if (split) {
        size_t cap = (size_t)t->nranks * 21 + 1, k = 0;
        m->split = adt_malloc(cap);
        m->split[0] = 0;
        for (int r = 0; r < t->nranks; r++) k += (size_t)snprintf(m->split + k, cap - k, "%s%lld", r ? "," : "", (long long)split[r]);
        m->kv[2 * m->n_pairs] = "adtrain.balance_split";
        m->kv[2 * m->n_pairs + 1] = m->split;
        m->n_pairs++;
    }
}

static void meta_free(ckpt_meta *m) {
    free(m->model_json);
    free(m->split);
}

/* Every rank's part of the manifest, on every rank (parts are a few hundred bytes per rank). */
static int gather_parts(trainer *t, const char *part, char ***parts_out) {
    int p = t->nranks;
    int32_t *len = adt_calloc((size_t)p, sizeof *len);
    int64_t *counts = adt_calloc((size_t)p, sizeof *counts);
    len[t->rank] = (int32_t)strlen(part) + 1;
    int rc = adt_comm_allreduce_i32(t->world, len, p);
    int64_t words = 0;
    for (int r = 0; r < p; r++) words += counts[r] = (len[r] + 3) / 4; /* moved as i32 words */
    int32_t *mine = adt_calloc((size_t)counts[t->rank], 4), *all = adt_calloc((size_t)words, 4);
    memcpy(mine, part, strlen(part) + 1);
    if (!rc) rc = adt_comm_allgather(t->world, mine, all, counts, ADT_I32);
    char **parts = adt_calloc((size_t)p, sizeof *parts);
    for (int r = 0, at = 0; r < p && !rc; at += (int)counts[r], r++) {
        parts[r] = adt_malloc((size_t)len[r]);
        memcpy(parts[r], all + at, (size_t)len[r]);
        parts[r][len[r] - 1] = 0;
    }
    free(len), free(counts), free(mine), free(all);
    *parts_out = parts;
    return rc;
}

/* train_world_agree, and on a failure a barrier: the message is out before a rank ends the world. */
static int save_agree(trainer *t, int rc) {
    rc = train_world_agree(t, rc);
    if (rc) adt_comm_barrier(t->world);
    return rc;
}

/* A distributed checkpoint: every rank writes its file, then rank 0 commits the manifest. A failure
 * on any rank is agreed on (one message, from the lowest failing rank) and fails every rank. */
static int save_distributed(trainer *t, const char *dir, long step, ckpt_meta *m) {
    adt_ckpt_view view = ckpt_view(t);
    char *part = NULL, **parts = NULL;
    int rc = 0;
    if (adt_dckpt_write_rank(dir, step, &view, 1, &part)) rc = train_fail(EXIT_RUNTIME, "--save: %s", adt_error_message());
    if ((rc = save_agree(t, rc))) {
        free(part);
        return rc;
    }
    if (gather_parts(t, part, &parts)) rc = train_fail(EXIT_RUNTIME, "--save: gathering the manifest: %s", adt_error_message());
    if (!rc && t->rank == 0 &&
        adt_dckpt_commit(dir, step, view.g, 1, (const char *const *)parts, t->nranks, m->kv, m->n_pairs))
        rc = train_fail(EXIT_RUNTIME, "--save: %s", adt_error_message());
    for (int r = 0; parts && r < t->nranks; r++) free(parts[r]);
    free(parts);
    free(part);
    return save_agree(t, rc);
}

int train_ckpt_save(trainer *t, const char *pattern, long step) {
    char path[4096];
    save_path_for(pattern, step, path, sizeof path);
    ckpt_meta m;
    meta_make(t, step, t->bal ? train_balance_split(t) : NULL, &m);
    int rc = 0;
    int dist = t->world && (t->loc.g || t->pipe); /* partitioned, or pipeline stages: each rank its blocks; else
                                                   * every rank holds the whole state and rank 0 writes one file */
    if (t->ps) rc = train_ps_save(t, path, step, m.kv, m.n_pairs);
    else if (dist) rc = save_distributed(t, path, step, &m);
    else if (t->rank == 0 && adt_ckpt_save(path, t->g, exec_data, t, 1, m.kv, m.n_pairs)) /* metadata made once */
        rc = train_fail(EXIT_RUNTIME, "--save: %s", adt_error_message());
    meta_free(&m);
    if (rc) return rc;
    train_note(t, "saved %s%s (step %ld)", path,
               t->ps ? " (the servers' shards and the workers' state)" : dist ? " (distributed checkpoint)" : "", step);
    return 0;
}

int train_ckpt_write(trainer *t, const char *path, long step, const int64_t *split, adt_ckpt_data_fn data, void *ctx) {
    ckpt_meta m;
    meta_make(t, step, split, &m);
    int rc = adt_ckpt_save(path, t->g, data, ctx, 1, m.kv, m.n_pairs);
    meta_free(&m);
    return rc;
}

int train_ckpt_write_rank(trainer *t, const char *dir, long step, adt_ckpt_data_fn data, void *ctx, char **part) {
    adt_ckpt_view view = ckpt_view(t);
    view.data = data, view.ctx = ctx;
    return adt_dckpt_write_rank(dir, step, &view, 1, part);
}

int train_ckpt_commit_parts(trainer *t, const char *dir, long step, const char *const *parts) {
    ckpt_meta m;
    meta_make(t, step, NULL, &m);
    adt_ckpt_view view = ckpt_view(t);
    int rc = adt_dckpt_commit(dir, step, view.g, 1, parts, t->nranks, m.kv, m.n_pairs);
    meta_free(&m);
    return rc;
}

/* A checkpoint being read: one safetensors file, or a distributed checkpoint's directory. */
typedef struct ckpt_src {
    const char *flag, *path;
    adt_st_file *f;
    adt_dckpt *d;
} ckpt_src;

static const char *src_meta(const ckpt_src *c, const char *key) {
    return c->d ? adt_dckpt_metadata(c->d, key) : adt_st_metadata(c->f, key);
}

/* A directory is a distributed checkpoint; anything else is read as one file. */
static int src_open(ckpt_src *c, const char *flag, const char *path) {
    struct stat st;
    memset(c, 0, sizeof *c);
    c->flag = flag, c->path = path;
    int rc = stat(path, &st) == 0 && S_ISDIR(st.st_mode) ? adt_dckpt_open(&c->d, path) : adt_st_open(&c->f, path);
    if (rc) return train_fail(EXIT_USAGE, "%s: %s", flag, adt_error_message());
    return 0;
}

static void src_close(ckpt_src *c) {
    if (c->d) adt_dckpt_close(c->d);
    if (c->f) adt_st_close(c->f);
}

/* This rank's blocks of every parameter (and with_state every optimizer state). */
static int src_load(trainer *t, const ckpt_src *c, int with_state) {
    adt_ckpt_view view = ckpt_view(t);
    int rc = c->d ? adt_dckpt_load(c->d, &view, with_state) : adt_ckpt_load_local(c->f, &view, with_state);
    if (rc) return train_fail(EXIT_USAGE, "%s: %s", c->flag, adt_error_message());
    return 0;
}

/* A text run must see the vocabulary the checkpoint was trained with: token ids would mean other
 * characters otherwise. Checkpoints without the entry (PyTorch's) are taken as they are. */
static int check_vocab(trainer *t, const ckpt_src *c) {
    const char *want = src_meta(c, "adtrain.vocab");
    char have[520];
    vocab_hex(t, have, sizeof have);
    if (!want || !*want || !*have || !strcmp(want, have)) return 0;
    return train_fail(EXIT_USAGE,
                      "%s %s: vocabulary mismatch: the checkpoint was trained on %zu distinct symbols (%.40s%s), "
                      "--data %s has %zu (%.40s%s); expected the same training text",
                      c->flag, c->path, strlen(want) / 2, want, strlen(want) > 40 ? "..." : "", t->train.spec,
                      strlen(have) / 2, have, strlen(have) > 40 ? "..." : "");
}

int train_ckpt_init(trainer *t) {
    if (!t->o.init_path) return 0;
    ckpt_src c;
    int rc = src_open(&c, "--init", t->o.init_path);
    if (rc) return rc;
    if (!(rc = check_vocab(t, &c))) rc = src_load(t, &c, 0);
    src_close(&c);
    return rc;
}

/* The checkpoint's value for `key` must equal `have` (what this run's flags give). */
static int check_same(const ckpt_src *c, const char *key, const char *have, const char *flag) {
    const char *want = src_meta(c, key);
    if (!want)
        return train_fail(EXIT_USAGE, "--resume %s: metadata '%s' is missing; expected a checkpoint written by "
                          "adtrain train --save (use --init to start from bare weights)", c->path, key);
    if (strcmp(want, have))
        return train_fail(EXIT_USAGE, "--resume %s: the run was saved with %s %s, this one has %s; expected the same "
                          "to continue it", c->path, flag, want, have);
    return 0;
}

/* --mode ps: the same servers, the dense parameters in the same place, the same rows' optimizer. */
static int check_ps(trainer *t, const ckpt_src *c) {
    const char *s = src_meta(c, "adtrain.ps_servers");
    if (!s || atoi(s) != t->o.ps_servers)
        return train_fail(EXIT_USAGE, "--resume %s: saved by %s parameter server%s, this run has --ps-servers %d; "
                          "expected --ps-servers %s (rows are placed by a hash modulo the number of servers and are "
                          "not re-sharded)", c->path, s ? s : "(unknown)", s && !strcmp(s, "1") ? "" : "s",
                          t->o.ps_servers, s ? s : "as saved");
    int rc = check_same(c, "adtrain.ps_dense", t->o.ps_dense_servers ? "servers" : "workers", "--ps-dense");
    if (!rc) rc = check_same(c, "adtrain.ps_optimizer", train_ps_sparse_optimizer(t), "the rows' optimizer");
    return rc;
}

static int resume_from(trainer *t, const ckpt_src *c) {
    const char *fmt = src_meta(c, "adtrain.format"), *want = t->ps ? TRAIN_PS_CKPT_FORMAT : CKPT_FORMAT;
    if (!fmt || strcmp(fmt, want))
        return train_fail(EXIT_USAGE, "--resume %s: format '%s', expected '%s' (a checkpoint written by adtrain train "
                          "%s--save%s)", c->path, fmt ? fmt : "(none)", want, t->ps ? "--mode ps " : "",
                          t->ps ? "" : "; use --init to start from bare weights");
    char s_seed[32], s_batch[32], s_samples[32];
    snprintf(s_seed, sizeof s_seed, "%" PRIu64, t->o.seed);
    snprintf(s_batch, sizeof s_batch, "%ld", t->o.batch);
    snprintf(s_samples, sizeof s_samples, "%" PRId64, t->train.count);
    int rc;
    if ((rc = check_same(c, "adtrain.seed", s_seed, "--seed")) || (rc = check_same(c, "adtrain.batch", s_batch, "--batch")) ||
        (rc = check_same(c, "adtrain.shuffle", t->o.shuffle ? "on" : "off", "--shuffle")) ||
        (rc = check_same(c, "adtrain.optimizer", t->o.optimizer == ADT_OPTIM_SGD ? "sgd" : "adamw", "--optimizer")) ||
        (rc = check_same(c, "adtrain.train_samples", s_samples, "training samples")) || (rc = check_vocab(t, c)) ||
        (t->ps && (rc = check_ps(t, c))))
        return rc;
    const char *s = src_meta(c, "adtrain.step");
    char *end;
    errno = 0;
    long step = s ? strtol(s, &end, 10) : -1;
    if (!s || !*s || *end || errno || step < 0)
        return train_fail(EXIT_USAGE, "--resume %s: metadata adtrain.step is '%s'; expected a step number", c->path,
                          s ? s : "(none)");
    if (step >= t->o.steps)
        return train_fail(EXIT_USAGE, "--resume %s: the checkpoint is at step %ld already; expected --steps above it "
                          "(the total for the whole run)", c->path, step);
    if ((rc = t->ps ? train_ps_resume(t, t->o.resume_path, step) : src_load(t, c, 1))) return rc;
    t->start_step = step;
    const char *split = src_meta(c, "adtrain.balance_split");
    if (split && t->bal) train_balance_adopt_split(t, split); /* a split of another world is left */
    return 0;
}

int train_ckpt_resume(trainer *t) {
    if (!t->o.resume_path) return 0;
    ckpt_src c;
    char run[4096];
    const char *path = t->o.resume_path;
    struct stat st;
    if (t->ps) { /* the run file holds the metadata; it is written last */
        snprintf(run, sizeof run, "%s/%s", path, TRAIN_PS_RUN_FILE);
        if (stat(path, &st) || !S_ISDIR(st.st_mode) || stat(run, &st))
            return train_fail(EXIT_USAGE, "--resume %s: no %s in it; expected a directory written by adtrain train "
                              "--mode ps --save (one whose save did not complete has none)", path, TRAIN_PS_RUN_FILE);
        path = run;
    }
    int rc = src_open(&c, "--resume", path);
    if (rc) return rc;
    rc = resume_from(t, &c);
    src_close(&c);
    if (!rc) train_note(t, "resume %s: continuing after step %ld", t->o.resume_path, t->start_step);
    return rc;
}
