/*
 * ps.c - the parameter-server runner (--mode ps): of an MPI world of N ranks the first
 * --ps-servers S hold a DLRM's embedding tables sharded by row (src/ps/), the other N - S are
 * workers that pull the rows of their part of each global batch, run the dense part, and push the
 * rows' gradients; the dense parameters are all-reduced among the workers (the hybrid), or kept on
 * the servers too (--ps-dense servers).
 *
 * Worker w of W takes samples [off_w, off_w + B_w) of every global batch of the sampler (the
 * block split of B over the workers), so the samples of a step are the one-process run's; its
 * gradients carry its share B_w / B, and the global loss is the share-weighted sum of the
 * workers' means. With --ps-sync sync every step's update is the one-process update (SGD exactly;
 * Adam lazily on the rows a step touches, as PyTorch's SparseAdam). Pulls of the next
 * --ps-prefetch steps' rows are in flight while a step computes: their ids come from the
 * sampler, which knows every step's batch ahead. A server's step is its whole service: it
 * answers pulls and applies pushes until every worker is done, then the run is complete.
 * The first worker (rank S) prints and logs.
 *
 * Not run in this mode yet (refused at start): evaluation, checkpoints, the elastic agent, a
 * learning-rate schedule (the servers' optimizers keep one lr), momentum and weight decay (their
 * sparse forms are not defined here).
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ps.h"
#include "train_internal.h"

struct train_ps {
    adt_ps_world pw;
    int pw_ready;
    adt_ps_cfg pc;
    adt_ps_optim dense;
    adt_ps_store *store; /* a server's shard  */
    adt_ps_worker *wk;   /* a worker's client */
    adt_ps_dlrm *d;      /* a worker's model  */
    int Bw;              /* this worker's samples per step, from `off` of each global batch */
    int64_t off;
    int64_t *idx;        /* [B] a future step's global batch */
    int32_t *ids;        /* [Bw, tables] */
    float *dense_in, *labels;
    long pulled;         /* steps (0-based) whose rows were asked for: [0, pulled) */
    adt_ps_server_stats served;
};

int train_ps_check(trainer *t) {
    const adt_train_opts *o = &t->o;
    const char *why = NULL;
    char buf[512];
    if (t->model.type != ADT_MODEL_DLRM)
        snprintf(buf, sizeof buf, "--model %s is a %s; the parameter servers hold a DLRM's embedding tables",
                 t->model_label, adt_model_type_name(t->model.type)), why = buf;
    else if (o->plan_path && o->ps_plan_devices != t->nranks)
        why = !o->ps_plan_devices ? "--plan: a collective plan; the parameter-server mode runs a parameter-server plan "
                                    "(adtrain plan writes one when it chooses ps) or the --ps-* flags"
                                  : (snprintf(buf, sizeof buf, "--plan %s: made for %d ranks, %d started; expected mpiexec -n %d",
                                              o->plan_path, o->ps_plan_devices, t->nranks, o->ps_plan_devices), buf);
    else if (o->bal.on) why = "--straggler-policy, --split, --micro-batch, --inject-slowdown: not in --mode ps yet";
    else if (o->momentum_given && o->momentum != 0) why = "--momentum: the sparse optimizers have no momentum";
    else if (o->weight_decay != 0) why = "--weight-decay: the sparse optimizers have no weight decay";
    else if (o->cosine || o->warmup) why = "--schedule cosine / --warmup: the servers' optimizers keep one learning "
                                          "rate; expected --schedule constant and no --warmup";
    else if (o->eval_every) why = "--eval-every: evaluation is not run in --mode ps yet";
    else if (o->save_path || o->resume_path || o->init_path) why = "--save, --resume, --init: checkpoints of the "
                                                                  "servers' shards are not written in --mode ps yet";
    else if (o->profile) why = "--profile: not in --mode ps yet";
    else if (getenv("ADT_MASTER")) why = "--mode ps: not under adtrain agent yet (run it under mpiexec)";
    if (why) return train_fail(EXIT_USAGE, "--mode ps: %s", why);
    if (t->nranks < o->ps_servers + 1)
        return train_fail(EXIT_USAGE, "--ps-servers %d: the world has %d rank%s; expected at least %d (mpiexec -n %d: "
                          "%d servers and one or more workers)", o->ps_servers, t->nranks, t->nranks == 1 ? "" : "s",
                          o->ps_servers + 1, o->ps_servers + 1, o->ps_servers);
    if (o->batch < t->nranks - o->ps_servers)
        return train_fail(EXIT_USAGE, "--batch %ld: fewer samples than the %d workers", o->batch,
                          t->nranks - o->ps_servers);
    return 0;
}

/* The global graph (the banner's parameters and FLOPs) and the servers' configuration. */
static int ps_build(trainer *t) {
    int rc = train_ps_check(t);
    if (rc) return rc;
    t->reporter = t->o.ps_servers; /* the first worker logs and notes */
    t->g = adt_graph_create();
    if (adt_model_build(t->g, &t->model, (int)t->o.batch, &t->io))
        return train_fail(EXIT_USAGE, "--model %s: %s", t->model_label, adt_error_message());
    t->step_flops = adt_graph_flops(t->g);
    train_ps *p = t->ps = adt_calloc(1, sizeof *t->ps);
    const adt_train_opts *o = &t->o;
    p->pc.n_servers = o->ps_servers;
    p->pc.prefetch = o->ps_prefetch;
    p->pc.seed = o->seed;
    if (adt_ps_sync_parse(o->ps_sync ? o->ps_sync : "sync", "--ps-sync", &p->pc.sync))
        return train_fail(EXIT_USAGE, "%s", adt_error_message());
    /* the sparse optimizer: --ps-optimizer, else the dense one's sparse form */
    adt_ps_optim_kind k = o->optimizer == ADT_OPTIM_SGD ? ADT_PS_SGD : ADT_PS_ADAM;
    if (o->ps_optimizer && adt_ps_optim_parse(o->ps_optimizer, "--ps-optimizer", &k))
        return train_fail(EXIT_USAGE, "%s", adt_error_message());
    float lr = (float)o->lr;
    p->pc.optim = (adt_ps_optim){k, lr, 0.9f, 0.95f, k == ADT_PS_ADAGRAD ? 1e-10f : 1e-8f};
    p->dense = o->optimizer == ADT_OPTIM_SGD ? (adt_ps_optim){ADT_PS_SGD, lr, 0, 0, 0}
                                             : (adt_ps_optim){ADT_PS_ADAM, lr, 0.9f, 0.95f, 1e-8f};
    if (adt_ps_tables_dlrm(&p->pc, &t->model.dlrm, 0, ADT_PS_REFUSE))
        return train_fail(EXIT_USAGE, "--mode ps: %s", adt_error_message());
    if (o->ps_dense_servers && adt_ps_tables_dlrm_dense(&p->pc, &t->model.dlrm, &p->dense))
        return train_fail(EXIT_USAGE, "--ps-dense servers: %s", adt_error_message());
    return 0;
}

/* This worker's batch of step `step` (0-based) into ids, dense_in, labels. */
static int fill_step(trainer *t, train_ps *p, long step, const int64_t *global) {
    if (global) memcpy(p->idx, global, (size_t)t->o.batch * sizeof *p->idx);
    else adt_sampler_batch(&t->sampler, step, p->idx);
    return train_source_fill(&t->train, p->idx + p->off, p->Bw, p->dense_in, p->ids, p->labels);
}

/* Asks for the rows of steps up to `upto` (0-based, exclusive), within the run. */
static int pull_ahead(trainer *t, train_ps *p, long upto) {
    if (upto > t->o.steps) upto = t->o.steps;
    for (; p->pulled < upto; p->pulled++)
        if (fill_step(t, p, p->pulled, NULL) || adt_ps_worker_pull(p->wk, p->pulled, p->ids, p->Bw))
            return train_fail(EXIT_RUNTIME, "step %ld: pulling rows: %s", p->pulled + 1, adt_error_message());
    return 0;
}

static int ps_executor(trainer *t, const adt_exec_opts *eo) {
    train_ps *p = t->ps;
    if (adt_ps_world_init(&p->pw, t->world, p->pc.n_servers))
        return train_fail(EXIT_RUNTIME, "--mode ps: %s", adt_error_message());
    p->pw_ready = 1;
    if (p->pw.is_server) {
        if (adt_ps_store_create(&p->store, p->pc.tables, p->pc.n_tables, &p->pc.optim, p->pc.seed))
            return train_fail(EXIT_RUNTIME, "--mode ps: %s", adt_error_message());
        return 0;
    }
    int W = p->pw.n_workers, w = p->pw.worker;
    int64_t B = t->o.batch;
    p->Bw = (int)(B / W + (w < B % W));
    p->off = (int64_t)w * (B / W) + (w < B % W ? w : B % W);
    int T = t->model.dlrm.n_tables;
    p->idx = adt_malloc((size_t)B * sizeof *p->idx);
    p->ids = adt_malloc((size_t)p->Bw * (size_t)T * sizeof *p->ids);
    p->dense_in = adt_malloc((size_t)p->Bw * (size_t)t->model.dlrm.n_dense * sizeof *p->dense_in);
    p->labels = adt_malloc((size_t)p->Bw * sizeof *p->labels);
    if (adt_ps_worker_create(&p->wk, &p->pw, &p->pc) ||
        adt_ps_dlrm_create(&p->d, &t->model.dlrm, p->Bw, &p->dense, eo))
        return train_fail(EXIT_RUNTIME, "--mode ps: %s", adt_error_message());
    return 0;
}

static int ps_step(trainer *t, long step, int64_t *idx, double *loss) {
    train_ps *p = t->ps;
    if (p->pw.is_server) { /* its whole service: until every worker is done */
        if (adt_ps_server_run(&p->pw, &p->pc, p->store, &p->served))
            return train_fail(EXIT_RUNTIME, "parameter server %d: %s", p->pw.server, adt_error_message());
        t->finished = 1;
        *loss = 0;
        return 0;
    }
    long s = step - 1; /* the servers count steps from 0 */
    int rc = pull_ahead(t, p, s + 1 + p->pc.prefetch);
    if (rc) return rc;
    if (fill_step(t, p, s, idx)) return train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
    float l = 0;
    float share = (float)p->Bw / (float)t->o.batch;
    if (adt_ps_dlrm_step(p->d, p->wk, p->pw.workers, s, p->dense_in, p->labels, share, &l))
        return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    double g = (double)share * l; /* the global loss: the share-weighted sum of the workers' means */
    if (p->pw.workers && adt_comm_allreduce_f64(p->pw.workers, &g, 1))
        return train_fail(EXIT_RUNTIME, "step %ld: the global loss: %s", step, adt_error_message());
    *loss = g;
    if (step == t->o.steps && adt_ps_worker_done(p->wk))
        return train_fail(EXIT_RUNTIME, "the parameter servers: %s", adt_error_message());
    return 0;
}

static void ps_banner(const trainer *t, FILE *f) {
    const train_ps *p = t->ps;
    char sync[32];
    adt_ps_sync_str(p->pc.sync, sync, sizeof sync);
    static const char *const optim[] = {"sgd", "adagrad", "adam (lazy)"};
    fprintf(f, "ps     %d server%s + %d worker%s (MPI), %s, prefetch %d; sparse %s lr %g; dense parameters %s; "
            "worker %d takes %d of every %ld samples\n", p->pw.n_servers, p->pw.n_servers == 1 ? "" : "s",
            p->pw.n_workers, p->pw.n_workers == 1 ? "" : "s", sync, p->pc.prefetch, optim[p->pc.optim.kind],
            p->pc.optim.lr, t->o.ps_dense_servers ? "on the servers" : "all-reduced among the workers", p->pw.worker,
            p->Bw, t->o.batch);
}

static void ps_free(trainer *t) {
    train_ps *p = t->ps;
    if (!p) return;
    if (p->pw.is_server && p->pw_ready && p->served.pulls)
        train_note(t, "ps: server statistics: %lld pulls, %lld pushes, %lld rows pulled", (long long)p->served.pulls,
                   (long long)p->served.pushes, (long long)p->served.rows_pulled);
    adt_ps_dlrm_free(p->d);
    adt_ps_worker_free(p->wk);
    adt_ps_store_free(p->store);
    if (p->pw_ready) adt_ps_world_free(&p->pw);
    free(p->idx), free(p->ids), free(p->dense_in), free(p->labels);
    free(p);
    t->ps = NULL;
}

const train_runner train_runner_ps = {"the parameter-server mode", ps_build, ps_executor, ps_step, NULL, ps_banner,
                                      ps_free};
