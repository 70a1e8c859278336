/*
 * train.c - `adtrain train`: trains a model from a JSON config on a dataset, in one process or,
 * under mpiexec, on every rank of an MPI world (train_dist.c).
 *
 * The flow is the one every later (distributed, elastic) trainer follows: parse and check every
 * flag before touching data, open the data, build the training graph (model, backward,
 * optimizer), plan memory once, then per step fill the fed inputs, set lr and step, run, read the
 * loss. Exit status: 0 done, 1 a failure while running, 2 a bad flag, config or dataset
 * (found before the first step, so a typo never costs a run).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/gemm.h"
#include "train.h"

/* The executor allocates everything up front and aborts when memory runs out; a model or batch
 * too big for the machine is better refused with its size before that. */
static int check_memory(const trainer *t) {
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

/* The global training graph, and on a distributed run the rank's part of it. */
static int build_graph(trainer *t) {
    if (t->o.bal.on) return train_balance_build(t); /* balanced data parallelism: train_balance.c */
    t->g = adt_graph_create();
    if (adt_model_build(t->g, &t->model, (int)t->o.batch, &t->io))
        return train_fail(EXIT_USAGE, "--model %s: %s", t->model_label, adt_error_message());
    t->oc = t->o.optimizer == ADT_OPTIM_SGD ? adt_optim_sgd((float)t->o.momentum, (float)t->o.weight_decay)
                                            : adt_optim_adamw(0.9f, 0.95f, 1e-8f, (float)t->o.weight_decay);
    adt_graph_backward(t->g, t->io.loss);
    adt_graph_optimizer(t->g, &t->oc);
    if (adt_graph_error(t->g))
        return train_fail(EXIT_RUNTIME, "building the training graph: %s", adt_graph_error_message(t->g));
    /* Accuracy and AUC read the logits after a forward run. */
    if (t->model.type != ADT_MODEL_GPT) adt_graph_mark_output(t->g, t->io.logits);
    int rc = train_elastic_plan(t);
    if (!rc) rc = train_dist_partition(t);
    return rc ? rc : check_memory(t);
}

/* The executor (collective on a distributed run) and the initial parameters. */
static int make_executor(trainer *t) {
    adt_exec_opts eo = {.threads = (int)t->o.threads, .seed = t->o.seed, .profile = t->o.profile};
    if (t->bal) {
        int rc = train_balance_executor(t, &eo);
        if (rc) return rc;
    } else if (t->world) {
        train_dist_mem_report(t, "before_executor");
        int rc = train_dist_executor(t, &eo);
        if (rc) return rc;
    } else if (adt_exec_create(&t->ex, t->g, &eo)) {
        return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
    }
    adt_exec_init_params(t->ex);
    return 0;
}

static int open_log(trainer *t) {
    if (!t->o.log_path || t->rank != 0) return 0;
    /* A resumed run continues its log, as does every elastic world after the first. */
    t->log = fopen(t->o.log_path, t->start_step || train_elastic_continues() ? "a" : "w");
    if (!t->log) return train_fail(EXIT_USAGE, "--log: cannot open '%s' for writing: %s", t->o.log_path, strerror(errno));
    return 0;
}

static void print_banner(const trainer *t) {
    char *cfg = adt_model_cfg_to_json(&t->model);
    fprintf(stderr, "model  %s (%s): %s; %lld parameters\n", adt_model_type_name(t->model.type), t->model_label, cfg,
            (long long)adt_graph_param_count(t->g));
    free(cfg);
    fprintf(stderr, "data   %s; %lld train / %lld val samples%s\n", adt_dataset_describe(t->train.ds),
            (long long)t->train.count, (long long)t->val.count, t->val_holdout ? " (val = last 10%)" : "");
    if (t->o.optimizer == ADT_OPTIM_ADAMW)
        fprintf(stderr, "optim  adamw lr %g, betas (0.9, 0.95), eps 1e-8, weight decay %g", t->o.lr, t->o.weight_decay);
    else
        fprintf(stderr, "optim  sgd lr %g, momentum %g, weight decay %g", t->o.lr, t->o.momentum, t->o.weight_decay);
    fprintf(stderr, "; warmup %ld, %s\n", t->o.warmup, t->o.cosine ? "cosine to 10% of lr" : "constant");
    fprintf(stderr, "run    %ld steps x batch %ld, shuffle %s, seed %llu, threads %d, gemm %s (%s); %.3g GFLOP/step; "
            "eval %s\n",
            t->o.steps, t->o.batch, t->o.shuffle ? "on" : "off", (unsigned long long)t->o.seed, t->o.threads,
            adt_gemm_backend_name(), adt_gemm_backend_version(adt_gemm_get_info()->backend),
            adt_graph_flops(t->g) * 1e-9, t->o.eval_every > 0 ? "on" : "off");
    if (t->bal) train_balance_banner(t);
    else if (t->world) {
        char mb[32];
        fprintf(stderr, "dist   %d rank%s (%s), plan %s on mesh %s; %d collectives per step on rank 0, %s; "
                "--threads %d per rank\n",
                t->nranks, t->nranks == 1 ? "" : "s", t->nranks == 1 ? "this process" : "MPI", t->plan_label, adt_mesh_str(&t->plan.mesh, mb, sizeof mb),
                t->pipe ? adt_pipe_local(t->pipe)->n_boxing : t->loc.n_boxing,
                adt_exec_overlaps(t->ex) ? "overlapped with computation" : "blocking", t->o.threads);
        if (t->pipe)
            fprintf(stderr, "pipe   %d stages x %d microbatches of %ld samples, 1F1B; rank 0 runs stage 0 (the "
                    "collectives above: its, per microbatch)\n", t->xplan.n_stages, t->xplan.microbatches, t->o.batch / t->xplan.microbatches);
    }
}

static void trainer_free(trainer *t) {
    train_elastic_free(t);
    train_balance_free(t);
    if (!t->pipe) adt_exec_free(t->ex); /* else the pipe's, freed with it */
    train_world_end(t);
    adt_graph_free(t->g);
    adt_sampler_free(&t->sampler);
    train_data_free(t);
    free(t->idx);
    free(t->o.plan_text);
    if (t->log) fclose(t->log);
}

/* Setup in two halves with the ranks' agreement after each: first what each rank does alone
 * (flags, config, data, graph, plan, log file), then the collective part (communicators,
 * executor) and the checkpoints every rank reads. One process agrees with itself. */
static int trainer_setup(trainer *t, int rc) {
    if (!rc && !(rc = train_load_model(t)) && !(rc = train_open_data(t))) {
        t->T = t->model.type == ADT_MODEL_GPT ? t->model.gpt.n_ctx : 1;
        if (!(rc = train_check_batches(t)) && !(rc = build_graph(t))) rc = open_log(t);
    }
    if ((rc = train_world_agree(t, rc))) return rc;
    cli_defer_errors(t->world != NULL);
    if (!(rc = make_executor(t)) && !(rc = train_ckpt_init(t))) rc = train_ckpt_resume(t);
    if ((rc = train_world_agree(t, rc))) return rc;
    if ((rc = train_elastic_start(t))) return rc; /* under an elastic agent: leases, restore */
    t->idx = adt_malloc((size_t)t->o.batch * sizeof *t->idx);
    if (t->model.type == ADT_MODEL_DLRM) {
        size_t n = (size_t)t->o.eval_batches * (size_t)t->o.batch;
        t->scores = adt_malloc(n * sizeof *t->scores);
        t->labels = adt_malloc(n * sizeof *t->labels);
    }
    t->tty = isatty(STDERR_FILENO);
    if (!cli_quiet) print_banner(t);
    return 0;
}
/* ============================================================================================
 * The loop
 */

/* Learning rate of step s (1-based): linear warmup, then constant or cosine down to lr/10. */
static double lr_at(const train_opts *o, long s) {
    if (o->warmup > 0 && s <= o->warmup) return o->lr * (double)s / (double)o->warmup;
    if (!o->cosine || o->steps <= o->warmup) return o->lr;
    double p = (double)(s - o->warmup) / (double)(o->steps - o->warmup);
    double min_lr = 0.1 * o->lr;
    return min_lr + 0.5 * (1.0 + cos(M_PI * p)) * (o->lr - min_lr);
}

/* Mean loss (and the family's metric) over the first K validation batches: the same batches
 * every time, so successive evaluations compare like with like. */
static int evaluate(trainer *t, double *mean) {
    int B = (int)t->o.batch;
    int64_t k_max = t->val.count / B, K = t->o.eval_batches < k_max ? t->o.eval_batches : k_max;
    int64_t *idx = t->idx;
    double sum = 0;
    train_metric_reset(t);
    for (int64_t b = 0; b < K; b++) {
        for (int k = 0; k < B; k++) idx[k] = b * B + k;
        if (!t->pipe && train_fill(t, &t->val, idx)) return train_fail(EXIT_RUNTIME, "--val: %s", adt_error_message());
        double loss;
        if (t->pipe) {
            if (train_pipe_eval(t, &t->val, idx, &loss) || train_metric_add(t, B))
                return train_fail(EXIT_RUNTIME, "evaluation: %s", adt_error_message());
        } else if (adt_exec_run_forward(t->ex) || train_read_loss(t, &loss) || train_metric_add(t, B))
            return train_fail(EXIT_RUNTIME, "evaluation: %s", adt_error_message());
        sum += loss;
    }
    *mean = sum / (double)K;
    return 0;
}

static void format_eta(char *buf, size_t n, double s) {
    if (s < 60) snprintf(buf, n, "%.0fs", s);
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, n, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
}

typedef struct step_stats {
    long step;
    double loss, lr, ms, per_s;
    double total_s; /* wall time of all steps so far */
} step_stats;

static void print_progress(const trainer *t, const step_stats *st, double step_s) {
    double ms = step_s * 1e3, per_s = (double)t->o.batch * t->T / (step_s > 0 ? step_s : 1e-9);
    char eta[32];
    format_eta(eta, sizeof eta, st->total_s / (double)(st->step - t->start_step) * (double)(t->o.steps - st->step));
    const char *unit = t->model.type == ADT_MODEL_GPT ? "tok/s" : "samples/s";
    if (t->tty)
        fprintf(stderr, "\rstep %ld/%ld  loss %.4f  lr %.3g  %.3g ms/step  %.0f %s  ETA %s\033[K", st->step, t->o.steps,
                st->loss, st->lr, ms, per_s, unit, eta);
    else
        fprintf(stderr, "step %ld/%ld loss %.4f lr %.3g %.3g ms/step %.0f %s ETA %s\n", st->step, t->o.steps, st->loss,
                st->lr, ms, per_s, unit, eta);
    fflush(stderr);
}

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

static int run_eval(trainer *t, long step) {
    double vl = 0;
    int rc = evaluate(t, &vl);
    if (rc) return rc;
    if (t->tty && !cli_quiet) fprintf(stderr, "\r\033[K");
    char json[64], text[160];
    train_metric_format(t, json, sizeof json, text, sizeof text);
    if (!cli_quiet) fprintf(stderr, "eval step %ld/%ld: val_loss %.4f%s\n", step, t->o.steps, vl, text);
    return log_line(t, "{\"step\":%ld,\"val_loss\":%.9g%s}\n", step, vl, json);
}

static int train_step(trainer *t, long step, step_stats *st) {
    int B = (int)t->o.batch;
    int64_t *idx = t->idx;
    double t0 = adt_now_s();
    if (!t->el) adt_sampler_batch(&t->sampler, step - 1, idx);
    else if (train_elastic_batch(t, step, idx)) return EXIT_RUNTIME;
    st->step = step;
    st->lr = lr_at(&t->o, step);
    adt_exec_set_lr_step(t->ex, (float)st->lr, (int32_t)step);
    if (t->bal) {
        int rc = train_balance_step(t, step, idx, &st->loss);
        if (rc) return rc;
    } else if (t->pipe) {
        if (train_pipe_step(t, &t->train, idx, &st->loss))
            return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    } else {
        if (train_fill(t, &t->train, idx)) return train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
        if (adt_exec_run(t->ex) || train_read_loss(t, &st->loss))
            return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    }
    double dt = adt_now_s() - t0;
    st->total_s += dt;
    st->ms = dt * 1e3;
    st->per_s = (double)B * t->T / (dt > 0 ? dt : 1e-9);
    return 0;
}

/* --profile: where this rank's profiled steps went, per op (compute) and per collective kind
 * (its starts and waits: what the rank spent on it, not the transfer's own time), and the
 * slowest nodes. Every rank prints its own block; lines start with "profile rank R". */
#define PROFILE_TOP 10
static void print_profile(const trainer *t, long steps) {
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
    fprintf(stderr, "profile rank %d: %ld steps, %.3f ms per step in the executor: compute %.3f ms, collectives %.3f ms"
            " (blocked in waits %.3f ms; %.0f%% of their flight time hidden), polling between nodes %.3f ms\n", r, steps,
            tot.run_s * per, compute, comm, tot.comm_wait_s * per,
            tot.comm_flight_s > 0 ? 100 * (1 - tot.comm_wait_s / tot.comm_flight_s) : 0, tot.comm_poll_s * per);
    for (int op = 0; op < ADT_OP_COUNT; op++)
        if (op_ms[op] >= 0.0005) fprintf(stderr, "profile rank %d:   op %-22s %8.3f ms\n", r, adt_op_name(op), op_ms[op]);
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++)
        if (kind_n[k])
            fprintf(stderr, "profile rank %d:   %-25s %8.3f ms (%d nodes)\n", r, adt_boxing_kind_name(k), kind_ms[k], kind_n[k]);
    for (int q = 0; q < n_top; q++)
        fprintf(stderr, "profile rank %d:   node %-40s %8.3f ms\n", r, g->nodes[top[q]].name, ns[top[q]] * per);
}

static int train_loop(trainer *t) {
    step_stats st = {0};
    double first_loss = NAN, last_print = 0;
    double win_s = 0; /* step time since the last printed line: a smoother ms/step than one step */
    int win_n = 0;
    long first = t->start_step + 1;
    double loop_t0 = adt_now_s();
    for (long s = first; s <= t->o.steps; s++) {
        int rc = train_step(t, s, &st);
        if (rc) return rc;
        if (s == first) first_loss = st.loss;
        if (s == first && t->o.profile && s < t->o.steps) adt_exec_reset_stats(t->ex); /* the first step warms up */
        char loss_json[32]; /* JSON has no NaN: a diverged step logs null */
        if (isfinite(st.loss)) snprintf(loss_json, sizeof loss_json, "%.9g", st.loss);
        else snprintf(loss_json, sizeof loss_json, "null");
        rc = log_line(t, "{\"step\":%ld,\"loss\":%s,\"lr\":%.9g,\"ms\":%.3f,\"%s\":%.1f,\"time_s\":%.3f,\"wall_s\":%.6f}\n",
                      s, loss_json, st.lr, st.ms, t->model.type == ADT_MODEL_GPT ? "tokens_per_s" : "samples_per_s",
                      st.per_s, st.total_s, adt_now_s() - loop_t0);
        if (rc) return rc;
        if (!isfinite(st.loss)) { /* the global loss: every rank stops here */
            if (t->tty && !cli_quiet) fprintf(stderr, "\n");
            return train_fail(EXIT_RUNTIME, "step %ld: the loss is %g (training diverged); expected a finite loss - "
                              "try a lower --lr (now %g)", s, st.loss, t->o.lr);
        }
        int last = s == t->o.steps;
        double now = adt_now_s();
        win_s += st.ms * 1e-3, win_n++;
        if (cli_quiet) {
        } else if (t->tty ? (now - last_print > 0.1 || last || s == first) : (s == first || s % 10 == 0 || last)) {
            print_progress(t, &st, win_s / win_n);
            last_print = now, win_s = 0, win_n = 0;
        }
        if (t->o.eval_every > 0 && (s % t->o.eval_every == 0 || last) && (rc = run_eval(t, s))) return rc;
        if (t->o.save_every && s % t->o.save_every == 0 && (rc = train_ckpt_save(t, t->o.save_path, s))) return rc;
        int stop = 0;
        double t_done = adt_now_s(); /* the elastic step's end (report, agreement) is step time too */
        if (t->el && ((rc = train_elastic_step_done(t, s, &stop)) || (stop && !last))) return rc;
        if (t->el) st.total_s += adt_now_s() - t_done;
    }
    if (t->tty && !cli_quiet) fprintf(stderr, "\n");
    long done = t->o.steps - t->start_step;
    train_dist_mem_report(t, "end");
    if (t->o.profile) print_profile(t, done > 1 ? done - 1 : done);
    if (!cli_quiet)
        fprintf(stderr, "done: %ld steps in %.2f s (%.3g ms/step); loss %.4f -> %.4f\n", done, st.total_s,
                st.total_s * 1e3 / (double)done, first_loss, st.loss);
    int saved_in_loop = t->o.save_every && t->o.steps % t->o.save_every == 0;
    if (t->o.save_path && !saved_in_loop) {
        int rc = train_ckpt_save(t, t->o.save_path, t->o.steps);
        if (rc) return rc;
    }
    return 0;
}

int cli_train(int argc, char **argv) {
    trainer t = {0};
    int rc = train_world_init(&t);
    if (rc) return rc;
    cli_defer_errors(t.world != NULL);
    rc = trainer_setup(&t, train_parse_opts(&t.o, argc, argv));
    if (!rc) {
        rc = train_loop(&t);
        /* a rank that fails alone (a write, a read, a collective) must not leave the others
         * waiting in the next collective */
        if (rc && t.world) train_world_fatal(&t, rc);
    }
    trainer_free(&t);
    return rc < 0 ? 0 : rc;
}
