/*
 * trainer.c - adt_trainer: setup, the step, evaluation, the log, and what falls due after a step.
 *
 * The flow every trainer follows: every option checked before touching data, then the data, the
 * training graph (model, backward, optimizer) and plan through the runner, memory planned once,
 * the executors, the checkpoints to load; then per step the feed's batch, lr and step set, the
 * runner's step, the global loss, and what falls due after it (evaluation, a checkpoint, the
 * feed's report and commit). Setup runs in two halves with the ranks' agreement after each: what
 * each rank does alone (options, config, data, graph, plan, log file), then the collective part
 * (communicators, executor) and the checkpoints every rank reads. One process agrees with itself.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cJSON.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "adtrain/gemm.h"
#include "train_internal.h"

void train_note(const trainer *t, const char *fmt, ...) {
    if (t->rank != t->reporter || !t->o.note) return;
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    t->o.note(t->o.note_ctx, line);
}

double train_slow_step(const trainer *t, long step, double compute) {
    const adt_train_balance_opts *o = &t->o.bal;
    if (t->rank != o->slow_rank || step < o->slow_first || step > o->slow_last) return compute;
    double extra = (o->slow_factor - 1) * compute + o->slow_add_s;
    adt_sleep_s(extra);
    return compute + extra;
}

int train_check_memory(const trainer *t) {
    adt_memplan mp;
    const adt_graph *g = train_run_graph(t);
    if (adt_memplan_build(&mp, g, NULL, g->n_nodes, 0))
        return train_fail(EXIT_RUNTIME, "memory plan: %s", adt_error_message());
    double need = (double)(mp.arena_bytes + mp.state_bytes + mp.scratch_bytes);
    adt_memplan_free(&mp);
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    double have = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    if (have > 0 && need > have)
        return train_fail(EXIT_USAGE, "--model %s with --batch %ld needs %.1f GiB, this machine has %.1f GiB; "
                          "expected a smaller --batch or model", t->model_label, t->o.batch, need / 1073741824.0,
                          have / 1073741824.0);
    return 0;
}

void train_log_action(trainer *t, const adt_straggler_action *act, const char *by, const int64_t *split, int n,
                      const adt_straggler *mon) {
    if (!t->log) return;
    const char *kind = act->kind == ADT_ACTION_RESTART ? "restart" : "rebalance";
    fprintf(t->log, "{\"step\":%ld,\"straggler_action\":\"%s\",\"by\":\"%s\",\"rank\":%d,\"gain\":%.6g,\"wall\":%.3f,"
            "\"split\":[", act->step, kind, by, act->rank, act->gain, adt_wall_s());
    for (int i = 0; i < n; i++) fprintf(t->log, "%s%lld", i ? "," : "", (long long)split[i]);
    fprintf(t->log, "]");
    if (mon) {
        fprintf(t->log, ",\"states\":[");
        for (int i = 0; i < n; i++) {
            char js[256];
            adt_straggler_rank_json(mon, i, js, sizeof js);
            fprintf(t->log, "%s%s", i ? "," : "", js);
        }
        fprintf(t->log, "]");
    }
    fprintf(t->log, "}\n");
    fflush(t->log);
}

/* ---- the sampler feed: the seeded order of the whole run ------------------------------------- */

static int sampler_batch(trainer *t, long step, int64_t *idx) {
    adt_sampler_batch(&t->sampler, step - 1, idx);
    return 0;
}

const train_feed train_feed_sampler = {"sampler", NULL, NULL, sampler_batch, NULL, NULL};

/* ---- setup ----------------------------------------------------------------------------------- */

static int open_log(trainer *t) {
    if (!t->o.log_path || t->rank != t->reporter) return 0;
    /* A resumed run continues its log, as does every elastic world after the first. */
    t->log = fopen(t->o.log_path, t->start_step || train_elastic_continues() ? "a" : "w");
    if (!t->log) return train_fail(EXIT_USAGE, "--log: cannot open '%s' for writing: %s", t->o.log_path, strerror(errno));
    return 0;
}

/* ---- an elastic job's spec: what the job trains, said once ------------------------------------ */

static int spec_conflict(const char *flag, const char *mine, const char *job) {
    return train_fail(EXIT_USAGE, "%s %s: the job's master was told %s %s; expected the same value or none (what an "
                      "elastic job trains is said once: on adtrain launch / adtrain master, or on the trainer)", flag,
                      mine, flag, job);
}

/* A number option: the job's value where the trainer was not given one, a refusal where both
 * were and differ. */
static int spec_double(trainer *t, const char *flag, double *mine, double job) {
    if (!train_opts_given(&t->o, flag)) {
        *mine = job;
        return 0;
    }
    if (*mine == job) return 0;
    char a[32], b[32];
    snprintf(a, sizeof a, "%g", *mine), snprintf(b, sizeof b, "%g", job);
    return spec_conflict(flag, a, b);
}

static int spec_long(trainer *t, const char *flag, long *mine, long job) {
    double m = (double)*mine;
    int rc = spec_double(t, flag, &m, (double)job);
    *mine = (long)m;
    return rc;
}

/* The model: the same config (by content, not path) or none on the trainer. */
static int spec_model(trainer *t, const adt_elastic_job_spec *sp) {
    if (!t->o.model_path) {
        t->spec_model_json = adt_strdup(sp->model_json ? sp->model_json : "");
        return 0;
    }
    adt_model_cfg mine, job;
    if (adt_model_cfg_load(&mine, t->o.model_path)) return train_fail(EXIT_USAGE, "--model: %s", adt_error_message());
    if (adt_model_cfg_parse(&job, sp->model_json ? sp->model_json : "", "the job's --model"))
        return train_fail(EXIT_USAGE, "%s", adt_error_message());
    char *a = adt_model_cfg_to_json(&mine), *b = adt_model_cfg_to_json(&job);
    int same = !strcmp(a, b);
    free(a), free(b);
    return same ? 0 : spec_conflict("--model", t->o.model_path, sp->model);
}

static int apply_spec(trainer *t, const adt_elastic_job_spec *sp) {
    adt_train_opts *o = &t->o;
    int rc = 0;
    if (!rc && (sp->have & ADT_SPEC_MODEL)) rc = spec_model(t, sp);
    if (!rc && (sp->have & ADT_SPEC_BATCH)) rc = spec_long(t, "--batch", &o->batch, (long)sp->batch);
    if (!rc && (sp->have & ADT_SPEC_STEPS)) rc = spec_long(t, "--steps", &o->steps, (long)sp->steps);
    if (!rc && (sp->have & ADT_SPEC_OPTIMIZER)) {
        adt_optim_kind k = !strcmp(sp->optimizer, "sgd") ? ADT_OPTIM_SGD : ADT_OPTIM_ADAMW;
        if (!train_opts_given(o, "--optimizer")) o->optimizer = k;
        else if (o->optimizer != k) rc = spec_conflict("--optimizer", o->optimizer == ADT_OPTIM_SGD ? "sgd" : "adamw", sp->optimizer);
    }
    if (!rc && (sp->have & ADT_SPEC_LR)) {
        rc = spec_double(t, "--lr", &o->lr, sp->lr);
        o->lr_given = 1;
    }
    if (!rc && (sp->have & ADT_SPEC_MOMENTUM)) {
        rc = spec_double(t, "--momentum", &o->momentum, sp->momentum);
        o->momentum_given = 1;
    }
    if (!rc && (sp->have & ADT_SPEC_WEIGHT_DECAY)) rc = spec_double(t, "--weight-decay", &o->weight_decay, sp->weight_decay);
    if (!rc && (sp->have & ADT_SPEC_SEED)) {
        if (!train_opts_given(o, "--seed")) o->seed = sp->seed;
        else if (o->seed != sp->seed) {
            char a[32], b[32];
            snprintf(a, sizeof a, "%llu", (unsigned long long)o->seed), snprintf(b, sizeof b, "%llu", (unsigned long long)sp->seed);
            rc = spec_conflict("--seed", a, b);
        }
    }
    if (!rc && (sp->have & ADT_SPEC_DATA)) {
        if (!o->data) o->data = sp->data; /* the spec outlives setup: kept in t->spec */
        else if (strcmp(o->data, sp->data)) rc = spec_conflict("--data", o->data, sp->data);
    }
    if (!rc && (sp->have & ADT_SPEC_STRAGGLER) && strcmp(sp->straggler_policy, "off")) {
        adt_straggler_policy p;
        if (adt_straggler_policy_parse(sp->straggler_policy, &p)) p = ADT_STRAGGLER_OFF;
        if (train_opts_given(o, "--straggler-policy") && o->bal.policy != p)
            rc = spec_conflict("--straggler-policy", adt_straggler_policy_name(o->bal.policy), sp->straggler_policy);
        else if (train_opts_given(o, "--straggler-config"))
            rc = train_fail(EXIT_USAGE, "--straggler-config: the job's master runs the straggler policy; expected its "
                            "thresholds on adtrain launch / master --straggler-config");
        else if (p != ADT_STRAGGLER_OFF) {
            o->bal.on = 1, o->bal.policy = p;
            o->bal.by_feed = 1; /* the master's controller sets the split in its data replies */
        }
    }
    if (!rc && (sp->have & ADT_SPEC_CHECKPOINT_DIR) && !o->elastic_dir && sp->checkpoint_dir[0]) {
        snprintf(t->spec_ckpt_dir, sizeof t->spec_ckpt_dir, "%s", sp->checkpoint_dir);
        o->elastic_dir = t->spec_ckpt_dir;
    }
    /* the optimizer's default learning rate, for the optimizer the run now has */
    if (!rc && !o->lr_given) o->lr = o->optimizer == ADT_OPTIM_SGD ? 0.1 : 1e-3;
    if (!rc && o->momentum_given && o->optimizer != ADT_OPTIM_SGD)
        rc = train_fail(EXIT_USAGE, "--momentum: only applies to --optimizer sgd (the job's optimizer is adamw)");
    return rc;
}

/* The job's spec from its master (GET /v1/job), applied to the options. */
static int job_spec(trainer *t) {
    adt_elastic_config cfg = {.replica = t->rank, .timeout_s = 60};
    adt_elastic *c = NULL;
    int rc = adt_elastic_open(&c, &cfg);
    if (rc) return train_fail(rc == ADT_ERR_STALE ? ADT_ERR_STALE : EXIT_RUNTIME, "elastic client: %s", adt_error_message());
    rc = adt_elastic_client_job(c, &t->spec);
    adt_elastic_close(c);
    if (rc) return train_fail(rc == ADT_ERR_STALE ? ADT_ERR_STALE : EXIT_RUNTIME, "elastic job spec: %s", adt_error_message());
    return apply_spec(t, &t->spec);
}

/* The plan the master made for this elastic world, if any (t->plan_text; none: *dp = 1): whether
 * it is one data-parallel replica per rank (data parallel over one mesh axis, no sharded optimizer,
 * one stage), its strategy and mesh. */
static int master_plan(trainer *t, int *dp, char *strategy, size_t ns, char *mesh, size_t nm) {
    *dp = 1, strategy[0] = 0, mesh[0] = 0;
    int rc = train_elastic_plan(t);
    if (rc || !t->plan_text) return rc;
    adt_plan p;
    memset(&p, 0, sizeof p);
    if (adt_plan_parse(&p, t->plan_text, "the master's plan")) return train_fail(EXIT_USAGE, "%s", adt_error_message());
    *dp = p.mesh.ndim == 1 && p.n_stages <= 1 && p.microbatches <= 1 && !strncmp(p.strategy, "dp", 2) &&
          !strchr(p.strategy, ',');
    adt_mesh_str(&p.mesh, mesh, nm);
    snprintf(strategy, ns, "%s", p.strategy);
    adt_plan_free(&p);
    return 0;
}

/* Balanced data parallelism in an elastic world runs one data-parallel replica per rank: the plan
 * the master made for the world must be that, or there must be none. */
static int balance_fits_plan(trainer *t) {
    char mb[32], strategy[64];
    int dp, rc = master_plan(t, &dp, strategy, sizeof strategy, mb, sizeof mb);
    if (rc || dp) return rc;
    return train_fail(EXIT_USAGE, "--straggler-policy %s: balanced data parallelism runs one data-parallel replica "
                      "per rank under an elastic job, but the master planned %s on mesh %s for this world; expected "
                      "adtrain launch / master --strategy dp with a straggler policy",
                      adt_straggler_policy_name(t->o.bal.policy), strategy, mb);
}

/* --mode ps runs its own layout (the first --ps-servers ranks serve, the others work) whatever the
 * master planned: a data-parallel plan - the master's default for a model it was told - goes
 * unused, and says so; another was asked for (--strategy) and cannot act, so it is refused. */
static int ps_fits_plan(trainer *t) {
    char mb[32], strategy[64];
    int dp, rc = master_plan(t, &dp, strategy, sizeof strategy, mb, sizeof mb);
    if (rc || !t->plan_text) return rc;
    if (dp) {
        train_note(t, "elastic: the master's plan of this world (%s on mesh %s) is not used: under --mode ps the first "
                   "%d ranks serve and the others work", strategy, mb, t->o.ps_servers);
        return 0;
    }
    return train_fail(EXIT_USAGE, "--mode ps: the job's master planned %s on mesh %s for this world, which a "
                      "parameter-server job cannot run (its first --ps-servers ranks serve, the others work); "
                      "expected adtrain launch / master without --strategy, or --strategy dp", strategy, mb);
}

/* The parts a step runs through, from the options and the environment. Under an elastic agent
 * what the job trains and its straggler policy are said once: on the master (adtrain launch /
 * master), whose controller then decides every world's split, or on the trainer, whose ranks
 * decide it among themselves; said on both, the two must agree. */
static int choose_parts(trainer *t) {
    t->feed = getenv("ADT_MASTER") ? &train_feed_elastic : &train_feed_sampler;
    if (t->feed == &train_feed_elastic) {
        if (t->o.bal.master)
            return train_fail(EXIT_USAGE, "--straggler-master: under adtrain agent the job's master decides the split; "
                              "expected no --straggler-master (give --straggler-policy to adtrain launch or master)");
        if (t->o.bal.split)
            return train_fail(EXIT_USAGE, "--split: an elastic world's size changes from one generation to the next, "
                              "and the straggler policy sets its split; expected no --split under adtrain agent");
        int rc = job_spec(t);
        if (!rc && t->o.bal.on) rc = balance_fits_plan(t);
        if (!rc && t->o.ps_mode) rc = ps_fits_plan(t);
        if (rc) return rc;
    }
    /* with a plan, balanced data parallelism is the plan's batch split (plan_split.c) */
    t->run = t->o.bal.on && !t->o.plan_path ? &train_runner_balance : &train_runner_plan;
    if (t->o.ps_mode) t->run = &train_runner_ps;
    if (t->o.eval_every > 0 && !t->run->eval)
        return train_fail(EXIT_USAGE, "--eval-every: evaluation is not run by %s yet; expected --eval-every 0",
                          t->run->name);
    return 0;
}

static int setup(trainer *t) {
    int rc = choose_parts(t);
    if (!rc && !(rc = train_load_model(t)) && !(rc = train_open_data(t))) {
        t->T = t->model.type == ADT_MODEL_GPT ? t->model.gpt.n_ctx : 1;
        if (!(rc = train_check_batches(t)) && !(rc = t->run->build(t))) rc = open_log(t);
    }
    if ((rc = train_world_agree(t, rc))) return rc;
    adt_exec_opts eo = {.threads = (int)t->o.threads, .seed = t->o.seed, .profile = t->o.profile};
    rc = t->run->executor(t, &eo);
    if (!rc) {
        if (t->ex) adt_exec_init_params(t->ex); /* none on a parameter server */
        if (!(rc = train_ckpt_init(t))) rc = train_ckpt_resume(t);
    }
    if ((rc = train_world_agree(t, rc))) return rc;
    if (t->feed->start && (rc = t->feed->start(t)) < 0) return rc; /* an elastic job: leases, restore */
    if (rc == 1) t->finished = 1;
    t->idx = adt_malloc((size_t)t->o.batch * sizeof *t->idx);
    if (t->model.type == ADT_MODEL_DLRM) {
        size_t n = (size_t)t->o.eval_batches * (size_t)t->o.batch;
        t->scores = adt_malloc(n * sizeof *t->scores);
        t->labels = adt_malloc(n * sizeof *t->labels);
    }
    t->next_step = t->start_step + 1;
    if (t->next_step > t->o.steps) t->finished = 1;
    return 0;
}

int adt_trainer_create(adt_trainer **out, const adt_train_opts *opts) {
    *out = NULL;
    train_error_reset();
    adt_trainer *t = adt_calloc(1, sizeof *t);
    t->o = *opts;
    t->plan_text = NULL;
    t->first_loss = NAN;
    int rc = train_world_init(t);
    if (!rc) rc = setup(t);
    if (rc) {
        /* the message survives the teardown (which may set its own) */
        char msg[2048];
        snprintf(msg, sizeof msg, "%s", adt_error_message());
        int mine = adt_trainer_error_is_mine();
        adt_trainer_free(t);
        adt_error(rc, "%s", msg);
        train_error_mine(mine);
        return rc;
    }
    *out = t;
    return 0;
}

void adt_trainer_free(adt_trainer *t) {
    if (!t) return;
    if (t->feed && t->feed->free) t->feed->free(t);
    if (t->run) t->run->free(t);
    else adt_exec_free(t->ex);
    train_world_end(t);
    adt_graph_free(t->g);
    adt_sampler_free(&t->sampler);
    train_data_free(t);
    free(t->idx);
    free(t->plan_text);
    free(t->spec_model_json);
    adt_elastic_job_spec_free(&t->spec);
    if (t->log) fclose(t->log);
    free(t);
}

void adt_trainer_abort(adt_trainer *t, int code) { train_world_fatal(t, code); }

int adt_trainer_rank(const adt_trainer *t) { return t->rank; }
int adt_trainer_reports(const adt_trainer *t) { return t->rank == t->reporter; }
int adt_trainer_nranks(const adt_trainer *t) { return t->nranks; }
long adt_trainer_start_step(const adt_trainer *t) { return t->start_step; }
long adt_trainer_steps(const adt_trainer *t) { return t->o.steps; }
const char *adt_trainer_rate_unit(const adt_trainer *t) { return t->model.type == ADT_MODEL_GPT ? "tok/s" : "samples/s"; }

/* ---- the log --------------------------------------------------------------------------------- */

static int log_line(trainer *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int log_line(trainer *t, const char *fmt, ...) {
    if (!t->log) return 0;
    va_list ap;
    va_start(ap, fmt);
    int bad = vfprintf(t->log, fmt, ap) < 0;
    va_end(ap);
    bad |= fflush(t->log) != 0; /* a line per step, readable while the run goes on */
    return bad ? train_fail(EXIT_RUNTIME, "--log %s: write failed: %s", t->o.log_path, strerror(errno)) : 0;
}

/* ---- evaluation ------------------------------------------------------------------------------ */

/* Mean loss (and the family's metric) over the first K validation batches: the same batches
 * every time, so successive evaluations compare like with like. */
int adt_trainer_eval(adt_trainer *t, double *mean, char *json, size_t nj, char *text, size_t nt) {
    if (!t->run->eval) return train_fail(EXIT_USAGE, "evaluation is not run by %s yet", t->run->name);
    int B = (int)t->o.batch;
    int64_t k_max = t->val.count / B, K = t->o.eval_batches < k_max ? t->o.eval_batches : k_max;
    if (K < 1) return train_fail(EXIT_USAGE, "evaluation: the validation data has fewer samples than one batch");
    int64_t *idx = t->idx;
    double sum = 0;
    train_metric_reset(t);
    for (int64_t b = 0; b < K; b++) {
        for (int k = 0; k < B; k++) idx[k] = b * B + k;
        double loss;
        int rc = t->run->eval(t, &t->val, idx, &loss);
        if (rc) return rc;
        if (train_metric_add(t, B)) return train_fail(EXIT_RUNTIME, "evaluation: %s", adt_error_message());
        sum += loss;
    }
    *mean = sum / (double)K;
    train_metric_format(t, json, nj, text, nt);
    return 0;
}

/* ---- the step -------------------------------------------------------------------------------- */

double train_lr_at(const train_opts *o, long s) {
    if (o->warmup > 0 && s <= o->warmup) return o->lr * (double)s / (double)o->warmup;
    if (!o->cosine || o->steps <= o->warmup) return o->lr;
    double p = (double)(s - o->warmup) / (double)(o->steps - o->warmup);
    double min_lr = 0.1 * o->lr;
    return min_lr + 0.5 * (1.0 + cos(M_PI * p)) * (o->lr - min_lr);
}

/* The step's batch, lr and run: the global mean loss in info. */
static int run_step(trainer *t, long step, adt_train_step_info *info) {
    int64_t *idx = t->idx;
    double t0 = adt_now_s();
    int rc = t->feed->batch(t, step, idx);
    if (rc) return rc;
    info->lr = train_lr_at(&t->o, step);
    if (t->ex) adt_exec_set_lr_step(t->ex, (float)info->lr, (int32_t)step);
    if ((rc = t->run->step(t, step, idx, &info->loss))) return rc;
    info->seconds = adt_now_s() - t0;
    return 0;
}

int adt_trainer_step(adt_trainer *t, adt_train_step_info *info) {
    memset(info, 0, sizeof *info);
    train_error_reset();
    if (t->finished) return 1;
    long s = t->next_step;
    info->step = s, info->steps = t->o.steps;
    if (s == t->start_step + 1) t->loop_t0 = adt_now_s();
    int rc = run_step(t, s, info);
    if (rc) return rc;
    if (t->serving) { /* a parameter server served the whole run: nothing falls due after it */
        t->next_step = t->o.steps + 1, t->finished = 1, t->saved_at_end = 1;
        return 0;
    }
    t->total_s += info->seconds;
    if (s == t->start_step + 1) {
        t->first_loss = info->loss;
        /* the first step warms up: the profile counts the ones after it */
        if (t->o.profile && s < t->o.steps) adt_exec_reset_stats(t->ex), t->profiled_from = s + 1;
        else t->profiled_from = s;
    }
    char loss_json[32]; /* JSON has no NaN: a diverged step logs null */
    if (isfinite(info->loss)) snprintf(loss_json, sizeof loss_json, "%.9g", info->loss);
    else snprintf(loss_json, sizeof loss_json, "null");
    double per_s = (double)t->o.batch * t->T / (info->seconds > 0 ? info->seconds : 1e-9);
    info->items_per_s = per_s;
    rc = log_line(t, "{\"step\":%ld,\"loss\":%s,\"lr\":%.9g,\"ms\":%.3f,\"%s\":%.1f,\"time_s\":%.3f,\"wall_s\":%.6f}\n", s,
                  loss_json, info->lr, info->seconds * 1e3, t->model.type == ADT_MODEL_GPT ? "tokens_per_s" : "samples_per_s",
                  per_s, t->total_s, adt_now_s() - t->loop_t0);
    if (rc) return rc;
    if (!isfinite(info->loss)) /* the global loss: every rank stops here */
        return train_fail(EXIT_RUNTIME, "step %ld: the loss is %g (training diverged); expected a finite loss - try a "
                          "lower --lr (now %g)", s, info->loss, t->o.lr);
    int last = s == t->o.steps;
    t->next_step = s + 1;
    if (last) t->finished = 1;
    if (t->o.eval_every > 0 && (s % t->o.eval_every == 0 || last)) {
        if ((rc = adt_trainer_eval(t, &info->val_loss, info->metric_json, sizeof info->metric_json, info->metric_text,
                                   sizeof info->metric_text)))
            return rc;
        info->evaluated = 1;
        if ((rc = log_line(t, "{\"step\":%ld,\"val_loss\":%.9g%s}\n", s, info->val_loss, info->metric_json))) return rc;
    }
    if (t->o.save_every && s % t->o.save_every == 0) {
        if ((rc = train_ckpt_save(t, t->o.save_path, s))) return rc;
        info->saved = 1;
        if (last) t->saved_at_end = 1;
    }
    if (t->feed->done) {
        int stop = 0;
        double t_done = adt_now_s(); /* the elastic step's end (report, agreement) is step time too */
        if ((rc = t->feed->done(t, s, &stop))) return rc;
        double d = adt_now_s() - t_done;
        t->total_s += d, info->seconds += d;
        if (stop) {
            t->finished = 1;
            if (!last) t->saved_at_end = 1; /* a planned stop: the commit is its checkpoint */
        }
    }
    return 0;
}

int adt_trainer_save(adt_trainer *t, const char *path) {
    long step = t->next_step - 1;
    return train_ckpt_save(t, path, step);
}

int adt_trainer_finish(adt_trainer *t) {
    train_dist_mem_report(t, "end");
    int rc = 0;
    if (t->o.save_path && !t->saved_at_end && t->next_step - 1 >= t->o.steps) {
        t->saved_at_end = 1;
        rc = train_ckpt_save(t, t->o.save_path, t->o.steps);
    }
    if (!rc && t->run->finish) rc = t->run->finish(t);
    return rc;
}

/* ---- what a caller prints -------------------------------------------------------------------- */

void adt_trainer_print_banner(const adt_trainer *t, FILE *f) {
    char *cfg = adt_model_cfg_to_json(&t->model);
    fprintf(f, "model  %s (%s): %s; %lld parameters\n", adt_model_type_name(t->model.type), t->model_label, cfg,
            (long long)adt_graph_param_count(t->g));
    free(cfg);
    fprintf(f, "data   %s; %lld train / %lld val samples%s\n", adt_dataset_describe(t->train.ds),
            (long long)t->train.count, (long long)t->val.count, t->val_holdout ? " (val = last 10%)" : "");
    if (t->o.optimizer == ADT_OPTIM_ADAMW)
        fprintf(f, "optim  adamw lr %g, betas (0.9, 0.95), eps 1e-8, weight decay %g", t->o.lr, t->o.weight_decay);
    else
        fprintf(f, "optim  sgd lr %g, momentum %g, weight decay %g", t->o.lr, t->o.momentum, t->o.weight_decay);
    fprintf(f, "; warmup %ld, %s\n", t->o.warmup, t->o.cosine ? "cosine to 10% of lr" : "constant");
    fprintf(f, "run    %ld steps x batch %ld, shuffle %s, seed %llu, threads %d, gemm %s (%s, %s); %.3g GFLOP/step; "
            "eval %s\n",
            t->o.steps, t->o.batch, t->o.shuffle ? "on" : "off", (unsigned long long)t->o.seed, t->o.threads,
            adt_gemm_backend_name(), adt_gemm_backend_version(adt_gemm_get_info()->backend), adt_gemm_reason(),
            t->step_flops * 1e-9,
            t->o.eval_every > 0 ? "on" : "off");
    if (t->run->banner) t->run->banner(t, f);
}

/* Every rank prints its own block; lines start with "profile rank R". */
#define PROFILE_TOP 10
void adt_trainer_print_profile(const adt_trainer *t, FILE *f) {
    if (!t->ex) return;
    long steps = t->next_step - t->profiled_from;
    const adt_graph *g = adt_exec_graph(t->ex);
    const double *ns = adt_exec_node_seconds(t->ex);
    adt_exec_stats tot;
    adt_exec_get_stats(t->ex, NULL, &tot);
    double per = steps > 0 ? 1e3 / (double)steps : 0, op_ms[ADT_OP_COUNT] = {0}, kind_ms[ADT_BOXING_KIND_COUNT] = {0};
    int kind_n[ADT_BOXING_KIND_COUNT] = {0}, top[PROFILE_TOP], n_top = 0;
    double compute = 0, comm = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        double ms = ns[i] * per;
        if (n->op == ADT_OP_BOXING) {
            int k = (int)(n->a.i[0] & 0xff);
            if (k >= 0 && k < ADT_BOXING_KIND_COUNT) kind_ms[k] += ms, kind_n[k]++;
            comm += ms;
        } else {
            op_ms[n->op] += ms, compute += ms;
        }
        if (n_top < PROFILE_TOP) n_top++; /* insertion into the slowest ten, slowest first */
        else if (ns[i] <= ns[top[PROFILE_TOP - 1]]) continue;
        int at = n_top - 1;
        while (at > 0 && ns[top[at - 1]] < ns[i]) top[at] = top[at - 1], at--;
        top[at] = i;
    }
    int r = t->rank;
    fprintf(f, "profile rank %d: %ld steps, %.3f ms per step in the executor: compute %.3f ms, collectives %.3f ms"
            " (blocked in waits %.3f ms; %.0f%% of their flight time hidden), polling between nodes %.3f ms\n", r, steps,
            tot.run_s * per, compute, comm, tot.comm_wait_s * per,
            tot.comm_flight_s > 0 ? 100 * (1 - tot.comm_wait_s / tot.comm_flight_s) : 0, tot.comm_poll_s * per);
    for (int op = 0; op < ADT_OP_COUNT; op++)
        if (op_ms[op] >= 0.0005) fprintf(f, "profile rank %d:   op %-22s %8.3f ms\n", r, adt_op_name(op), op_ms[op]);
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++)
        if (kind_n[k])
            fprintf(f, "profile rank %d:   %-25s %8.3f ms (%d nodes)\n", r, adt_boxing_kind_name(k), kind_ms[k], kind_n[k]);
    for (int q = 0; q < n_top; q++)
        fprintf(f, "profile rank %d:   node %-40s %8.3f ms\n", r, g->nodes[top[q]].name, ns[top[q]] * per);
}
