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
 * answers pulls and applies pushes until every worker is done (after the final evaluation and
 * checkpoint: the runner's finish), then the run is complete. The first worker (rank S) prints
 * and logs.
 *
 * Evaluation (--eval-every, --val) runs on the workers: each takes its block of every validation
 * batch, reads the rows with a lookup the servers answer once every worker has pushed the steps
 * so far (adt_ps_worker_lookup), and the logits and labels are gathered in worker order, which
 * is the batch's order, so the loss and AUC are the one-process run's under sync.
 *
 * The learning-rate schedule (--schedule, --warmup) is the trainer's (train_lr_at, a pure function
 * of the step): the servers apply each push with the rate of the step it belongs to, the workers
 * their hybrid dense update with the rate of the step they run.
 *
 * Checkpoints (--save, --save-every, --resume) are one consistent cut after step s: the reporter
 * makes the directory and removes its run file, every worker sends every server a cut marker
 * after its push of step s and waits for the answer (adt_ps_worker_save): a server writes its
 * shard (rows, their optimizer state, the dense tables when it holds them) once every worker's
 * marker came, which under sync is after step s's summed update and under ssp/async after every
 * worker's pushes of steps <= s, none later (no worker pushes before its answer; the faster ones
 * wait there for the slowest). Then the reporter writes the run file: the metadata (step, seed,
 * batch, ..., servers) and the hybrid dense parameters with their optimizer state, the same on
 * every worker. The step is the data position (the sampler is a function of seed and step) and
 * the schedule's. A resume loads each server's shard, the dense state into every worker, and
 * starts the servers' clock at step s. It needs as many servers (rows are placed by a hash
 * modulo their number: refused otherwise, not re-sharded); the workers may differ in number.
 *
 * Not run in this mode yet (refused at start): --init (a collective checkpoint's tables are not
 * loaded into shards), the elastic agent, momentum and weight decay (their sparse forms are not
 * defined here).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    int64_t *counts;     /* [workers] every worker's samples per batch (gathers) */
    float *logits;       /* [Bw] an evaluation batch's */
    int said_done;       /* the servers were told this worker stops */
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
    else if (o->init_path) why = "--init: a checkpoint's weights are not loaded into the servers' shards; expected "
                                 "--resume DIR of a run saved with --mode ps --save";
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

/* The trainer's schedule: the rate one process would use at the step a push belongs to. */
static float ps_lr_at(void *ctx, int64_t step) { return (float)train_lr_at(ctx, (long)step); }

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
    p->pc.lr_at = ps_lr_at, p->pc.lr_ctx = &t->o;
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
    p->counts = adt_malloc((size_t)W * sizeof *p->counts);
    for (int v = 0; v < W; v++) p->counts[v] = B / W + (v < B % W);
    p->logits = adt_malloc((size_t)p->Bw * sizeof *p->logits);
    int read[2] = {t->io.logits, t->io.label}; /* the whole batch's, for the metric (train_read) */
    for (int i = 0; i < 2; i++) t->gathered[i] = adt_malloc((size_t)adt_value_bytes(t->g, read[i]));
    int T = t->model.dlrm.n_tables;
    p->idx = adt_malloc((size_t)B * sizeof *p->idx);
    p->ids = adt_malloc((size_t)p->Bw * (size_t)T * sizeof *p->ids);
    p->dense_in = adt_malloc((size_t)p->Bw * (size_t)t->model.dlrm.n_dense * sizeof *p->dense_in);
    p->labels = adt_malloc((size_t)p->Bw * sizeof *p->labels);
    if (adt_ps_dlrm_create(&p->d, &t->model.dlrm, p->Bw, &p->dense, eo))
        return train_fail(EXIT_RUNTIME, "--mode ps: %s", adt_error_message());
    return 0;
}

/* The worker's client, made at its first use: a resume sets the step it starts at before. */
static int ps_client(train_ps *p) {
    if (!p->wk && adt_ps_worker_create(&p->wk, &p->pw, &p->pc))
        return train_fail(EXIT_RUNTIME, "--mode ps: %s", adt_error_message());
    return 0;
}

static int ps_step(trainer *t, long step, int64_t *idx, double *loss) {
    train_ps *p = t->ps;
    if (p->pw.is_server) { /* its whole service: until every worker is done */
        if (adt_ps_server_run(&p->pw, &p->pc, p->store, &p->served))
            return train_fail(EXIT_RUNTIME, "parameter server %d: %s", p->pw.server, adt_error_message());
        t->finished = t->serving = 1;
        *loss = 0;
        return 0;
    }
    long s = step - 1; /* the servers count steps from 0 */
    int rc = ps_client(p);
    if (!rc) rc = pull_ahead(t, p, s + 1 + p->pc.prefetch);
    if (rc) return rc;
    if (fill_step(t, p, s, idx)) return train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
    float l = 0;
    float share = (float)p->Bw / (float)t->o.batch;
    adt_ps_dlrm_set_lr(p->d, ps_lr_at(&t->o, step)); /* the hybrid dense update's; the servers set the rows' */
    if (adt_ps_dlrm_step(p->d, p->wk, p->pw.workers, s, p->dense_in, p->labels, share, &l))
        return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
    double g = (double)share * l; /* the global loss: the share-weighted sum of the workers' means */
    if (p->pw.workers && adt_comm_allreduce_f64(p->pw.workers, &g, 1))
        return train_fail(EXIT_RUNTIME, "step %ld: the global loss: %s", step, adt_error_message());
    *loss = g;
    return 0;
}

/* One validation batch: this worker's block of it on the rows the servers hold once every worker
 * pushed as many steps as this one; the loss the share-weighted sum of the workers' means, the
 * logits and labels gathered in worker order (the batch's) for the metric. */
static int ps_eval(trainer *t, const train_source *s, int64_t *idx, double *loss) {
    train_ps *p = t->ps;
    if (p->pw.is_server)
        return train_fail(EXIT_USAGE, "evaluation: parameter server %d serves the workers, which evaluate",
                          p->pw.server);
    int rc = ps_client(p);
    if (rc) return rc;
    if (train_source_fill(s, idx + p->off, p->Bw, p->dense_in, p->ids, p->labels))
        return train_fail(EXIT_RUNTIME, "--val: %s", adt_error_message());
    float l = 0;
    if (adt_ps_dlrm_eval(p->d, p->wk, p->ids, p->dense_in, p->labels, &l, p->logits))
        return train_fail(EXIT_RUNTIME, "evaluation: %s", adt_error_message());
    double g = (double)p->Bw / (double)t->o.batch * l;
    if (p->pw.n_workers > 1)
        rc = adt_comm_allreduce_f64(p->pw.workers, &g, 1) ||
             adt_comm_allgather(p->pw.workers, p->logits, t->gathered[0], p->counts, ADT_F32) ||
             adt_comm_allgather(p->pw.workers, p->labels, t->gathered[1], p->counts, ADT_F32);
    else
        memcpy(t->gathered[0], p->logits, (size_t)p->Bw * sizeof(float)),
        memcpy(t->gathered[1], p->labels, (size_t)p->Bw * sizeof(float));
    if (rc) return train_fail(EXIT_RUNTIME, "evaluation: gathering the workers' results: %s", adt_error_message());
    *loss = g;
    return 0;
}

/* After the final evaluation and checkpoint: the servers may stop once every worker said so. */
static int ps_finish(trainer *t) {
    train_ps *p = t->ps;
    if (p->pw.is_server || !p->pw_ready || p->said_done) return 0;
    p->said_done = 1;
    if (ps_client(p)) return EXIT_RUNTIME;
    if (adt_ps_worker_done(p->wk)) return train_fail(EXIT_RUNTIME, "the parameter servers: %s", adt_error_message());
    return 0;
}

const char *train_ps_sparse_optimizer(const trainer *t) {
    static const char *const name[] = {"sgd", "adagrad", "adam"};
    return name[t->ps->pc.optim.kind];
}

int train_ps_save(trainer *t, const char *dir, long step, const char *const *kv, int n_pairs) {
    train_ps *p = t->ps;
    if (p->pw.is_server)
        return train_fail(EXIT_USAGE, "--save: parameter server %d writes its shard when the workers ask for it",
                          p->pw.server);
    char run[4096];
    snprintf(run, sizeof run, "%s/%s", dir, TRAIN_PS_RUN_FILE);
    int rc = ps_client(p);
    /* a save that does not complete leaves no run file: a resume refuses the directory */
    if (!rc && t->rank == t->reporter && ((mkdir(dir, 0777) && errno != EEXIST) || (unlink(run) && errno != ENOENT)))
        rc = train_fail(EXIT_RUNTIME, "--save %s: %s", dir, strerror(errno));
    int32_t bad = rc != 0; /* no worker asks the servers for a cut into a directory that is not there */
    if (p->pw.n_workers > 1 && adt_comm_allreduce_i32(p->pw.workers, &bad, 1))
        return train_fail(EXIT_RUNTIME, "--save: %s", adt_error_message());
    if (bad) return rc ? rc : train_fail(EXIT_RUNTIME, "--save %s: the first worker could not prepare it", dir);
    int S = p->pw.n_servers;
    char **paths = adt_calloc((size_t)S, sizeof *paths);
    for (int k = 0; k < S; k++) {
        size_t n = strlen(dir) + 40;
        paths[k] = adt_malloc(n);
        snprintf(paths[k], n, "%s/server-%d.safetensors", dir, k);
    }
    if (adt_ps_worker_save(p->wk, (const char *const *)paths))
        rc = train_fail(EXIT_RUNTIME, "--save %s (step %ld): %s", dir, step, adt_error_message());
    for (int k = 0; k < S; k++) free(paths[k]);
    free(paths);
    if (!rc && t->rank == t->reporter && adt_ps_dlrm_save(p->d, run, kv, n_pairs))
        rc = train_fail(EXIT_RUNTIME, "--save %s: %s", run, adt_error_message());
    return rc;
}

int train_ps_resume(trainer *t, const char *dir, long step) {
    train_ps *p = t->ps;
    char path[4096];
    p->pc.first_step = step;
    p->pulled = step;
    if (p->pw.is_server) {
        snprintf(path, sizeof path, "%s/server-%d.safetensors", dir, p->pw.server);
        if (adt_ps_store_load(p->store, path)) return train_fail(EXIT_USAGE, "--resume %s: %s", dir, adt_error_message());
        return 0;
    }
    snprintf(path, sizeof path, "%s/%s", dir, TRAIN_PS_RUN_FILE);
    if (adt_ps_dlrm_load(p->d, path)) return train_fail(EXIT_USAGE, "--resume %s: %s", dir, adt_error_message());
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
    if (t->finished && !p->said_done) ps_finish(t); /* a caller that skipped adt_trainer_finish */
    if (p->pw.is_server && p->pw_ready && p->served.pulls)
        train_note(t, "ps: server statistics: %lld pulls, %lld pushes, %lld rows pulled", (long long)p->served.pulls,
                   (long long)p->served.pushes, (long long)p->served.rows_pulled);
    adt_ps_dlrm_free(p->d);
    adt_ps_worker_free(p->wk);
    adt_ps_store_free(p->store);
    if (p->pw_ready) adt_ps_world_free(&p->pw);
    free(p->idx), free(p->ids), free(p->dense_in), free(p->labels), free(p->counts), free(p->logits);
    free(p);
    t->ps = NULL;
}

const train_runner train_runner_ps = {"the parameter-server mode", ps_build, ps_executor, ps_step, ps_eval, ps_banner,
                                      ps_free, ps_finish};
