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
 * Straggler mitigation (--straggler-policy dd: dynamic sharding; --ps-sync async and --ps-dense
 * servers only, so that no collective holds the workers in step): the run's samples are cut into
 * chunks of a worker's batch B/W, chunk c being block c mod W of the sampler's global batch c / W,
 * so the --steps x W chunks are the one-process run's samples, each once. Server 0 hands the next
 * chunk to whichever worker asks (src/ps/dispatch.c); a worker asks as it pulls rows ahead
 * (--ps-prefetch chunks, and one ask more in flight: at most prefetch + 1 chunks held beyond the
 * one it computes), trains each chunk as a step of its own clock with 1/W of a global
 * batch's loss (as a block of the fixed split), and stops when none is left: a slow worker
 * trains fewer. Its whole run is its first call of ps_step, as a server's is, so the log has no
 * line per step; the run's mean loss and the chunks each worker took are logged at the end.
 * A schedule by step, evaluation, --save and --resume are refused with it: a worker's steps are
 * not the run's. --inject-slowdown RANK:FACTOR (a worker's rank) stretches that worker's compute
 * FACTOR times (a sleep after each step's compute, counted as compute), in either sharding.
 * At the end the reporter notes and logs the workers' record {"ps_workers": ...}: samples,
 * compute seconds (a step's time less its waits for rows and for pushes), capacity (samples per
 * second of compute), the throughput and its ratio to the capacities' sum (rates of the steady
 * state: each worker's first step, which makes the data and the primitives, left out), and under
 * dynamic sharding the chunks each worker took and a digest of the sample indices trained (the
 * sums of two 20-bit hashes of each; a test compares it with the one-process run's samples).
 *
 * Under adtrain agent (an elastic job, elastic.c) the first S ranks of every world serve and the
 * workers are the data replicas: they lease each step's samples from the master's ledger, so a
 * step's batch is known only when its leases come and its rows are pulled then (--ps-prefetch 0),
 * and every commit is the checkpoint above, cut into the commit's directory and committed by the
 * reporter with the data position. A new world restores the commit on every rank; its workers may
 * differ in number, its servers may not (a world of fewer than S + 1 ranks is refused). A server
 * takes no part in the feed: its one step is its service, which ends when the workers stop.
 *
 * Not run in this mode yet (refused at start): --init (a collective checkpoint's tables are not
 * loaded into shards), momentum and weight decay (their sparse forms are not defined here),
 * --straggler-policy nd, --split, --micro-batch, --straggler-config/-master; under adtrain agent
 * a straggler policy given to the trainer alone (dynamic sharding hands out samples apart from the
 * ledger), --val with the master's policy, rows pulled ahead and --flash on.
 *
 * Under adtrain agent with the master's policy dd or nd, the master's controller splits each step's
 * samples among the workers (the servers are idle replicas of its data job): a worker leases its
 * local batch, reports its compute seconds, and remakes its model when its share changes
 * (train_ps_set_split, from the gathered leases).
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
    int dynamic;         /* --straggler-policy dd: chunks from server 0's dispatcher */
    int by_feed;         /* the elastic master's split sets Bw each step (buffers hold a batch) */
    adt_exec_opts eo;    /* the executor's options: a new share of the batch remakes the model */
    double last_compute_s; /* the last step's compute seconds (the master's monitor judges them) */
    int32_t *taken;      /* [n_taken] the chunks this worker trained, in its order */
    int64_t n_taken, cap_taken;
    double digest[2];    /* the samples trained: sums of two 20-bit hashes of their indices */
    int64_t samples;     /* this worker's samples trained */
    /* after its first step (which makes the data and the executor's primitives): */
    double warm_t;       /* when that step ended */
    double compute_s;    /* compute since (steps less their waits for rows and pushes) */
    double wait_s;       /* waits since: for rows, pushes, chunks, the other workers (loss sum) */
    int64_t steady;      /* samples since */
    adt_ps_server_stats served;
};

/* --straggler-policy dd under mpiexec: dynamic sharding. Under adtrain agent the master's
 * controller splits each step's samples instead (elastic.c, train_ps_set_split). */
static int ps_dynamic(const adt_train_opts *o) {
    return o->bal.on && o->bal.policy == ADT_STRAGGLER_DD && !o->bal.by_feed;
}

/* What keeps --straggler-policy dd (dynamic sharding) from acting in this run, or NULL. */
static const char *ps_check_dynamic(const adt_train_opts *o) {
    adt_ps_sync sy = {ADT_PS_SYNC, 0};
    if (o->ps_sync) adt_ps_sync_parse(o->ps_sync, "--ps-sync", &sy);
    if (sy.kind != ADT_PS_ASYNC)
        return "--straggler-policy dd: dynamic sharding needs --ps-sync async (sync trains each step's fixed split, "
               "and ssp's clock holds a fast worker within K steps of the slowest)";
    if (!o->ps_dense_servers)
        return "--straggler-policy dd: the workers' all-reduce of the dense gradients keeps them in step; expected "
               "--ps-dense servers";
    if (o->save_path || o->save_every || o->resume_path)
        return "--straggler-policy dd: --save, --save-every, --resume: a checkpoint's cut is after one step of every "
               "worker, and here the workers run different numbers of steps";
    if (o->val)
        return "--straggler-policy dd: --val: evaluation waits for every worker at the asker's step, and here the "
               "workers run different numbers of steps";
    if (o->cosine || o->warmup)
        return "--straggler-policy dd: a schedule by step (--schedule cosine, --warmup) cannot act: a worker's steps "
               "are not the run's; expected --schedule constant";
    return NULL;
}

/* What keeps --mode ps from running under adtrain agent (an elastic world), or NULL; with none,
 * --ps-prefetch becomes 0 (its default is 1). The master's ledger hands out every step's samples
 * (elastic.c), so a worker knows a step's batch only when its leases come: no rows pulled ahead,
 * no dispatcher of its own. */
static const char *ps_check_elastic(trainer *t) {
    const adt_train_opts *o = &t->o;
    if (o->bal.on && o->bal.policy != ADT_STRAGGLER_OFF && !o->bal.by_feed)
        return "--straggler-policy: under adtrain agent the workers' samples come from the master's ledger, so the "
               "master's controller splits them; expected the policy on adtrain launch / master --straggler-policy dd "
               "(dynamic sharding runs under mpiexec)";
    if (o->bal.by_feed && o->val)
        return "--val: with the master's straggler policy a worker's share of the batch changes, and evaluation "
               "runs on even blocks; expected no --val";
    if (o->ps_prefetch > 0 && train_opts_given(o, "--ps-prefetch"))
        return "--ps-prefetch: under adtrain agent a step's samples are known when its leases come, so no rows are "
               "pulled ahead; expected --ps-prefetch 0 or none";
    if (o->flash && train_opts_given(o, "--flash"))
        return "--flash on: the servers write their shards at the checkpoint's cut themselves, with no copy in "
               "shared memory; expected --flash off or none";
    t->o.ps_prefetch = 0;
    return NULL;
}

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
    else if (o->bal.split || o->bal.micro_batch || o->bal.config || o->bal.master)
        why = "--split, --micro-batch, --straggler-config, --straggler-master: not in --mode ps (its straggler "
              "mitigation is --straggler-policy dd: dynamic sharding)";
    else if (o->bal.on && o->bal.policy == ADT_STRAGGLER_ND && !o->bal.by_feed)
        why = "--straggler-policy nd: not in --mode ps under mpiexec (under adtrain launch the master's nd restarts a "
              "slow worker elsewhere); expected dd (dynamic sharding) or off";
    else if (o->momentum_given && o->momentum != 0) why = "--momentum: the sparse optimizers have no momentum";
    else if (o->weight_decay != 0) why = "--weight-decay: the sparse optimizers have no weight decay";
    else if (o->init_path) why = "--init: a checkpoint's weights are not loaded into the servers' shards; expected "
                                 "--resume DIR of a run saved with --mode ps --save";
    else if (o->profile) why = "--profile: not in --mode ps yet";
    else if (getenv("ADT_MASTER")) why = ps_check_elastic(t);
    if (!why && ps_dynamic(o)) why = ps_check_dynamic(o);
    if (why) return train_fail(EXIT_USAGE, "--mode ps: %s", why);
    if (t->nranks < o->ps_servers + 1 && getenv("ADT_MASTER"))
        return train_fail(EXIT_USAGE, "--ps-servers %d: the elastic world has %d rank%s; expected at least %d (%d "
                          "servers and one or more workers: a world resized below that cannot run)", o->ps_servers,
                          t->nranks, t->nranks == 1 ? "" : "s", o->ps_servers + 1, o->ps_servers);
    if (t->nranks < o->ps_servers + 1)
        return train_fail(EXIT_USAGE, "--ps-servers %d: the world has %d rank%s; expected at least %d (mpiexec -n %d: "
                          "%d servers and one or more workers)", o->ps_servers, t->nranks, t->nranks == 1 ? "" : "s",
                          o->ps_servers + 1, o->ps_servers + 1, o->ps_servers);
    int W = t->nranks - o->ps_servers;
    if (o->bal.slow_rank >= t->nranks && getenv("ADT_MASTER")) { /* an elastic world of another size */
        train_note(t, "--inject-slowdown: rank %d is not in this world of %d ranks: no rank is slowed", o->bal.slow_rank,
                   t->nranks);
        t->o.bal.slow_rank = -1;
    } else if (o->bal.slow_rank >= t->nranks) {
        return train_fail(EXIT_USAGE, "--inject-slowdown: rank %d, but the world has %d ranks", o->bal.slow_rank,
                          t->nranks);
    }
    /* a server has no compute of its own to stretch: it pauses before each answer instead */
    if (o->bal.slow_rank >= 0 && o->bal.slow_rank < o->ps_servers &&
        (o->bal.slow_add_s <= 0 || o->bal.slow_first != 1 || o->bal.slow_last != INT32_MAX))
        return train_fail(EXIT_USAGE, "--inject-slowdown: rank %d is a server, which pauses before each answer to a "
                          "pull; expected %d:+SECONDS (no FACTOR, no @FIRST-LAST)", o->bal.slow_rank, o->bal.slow_rank);
    if (ps_dynamic(o) && o->batch % W)
        return train_fail(EXIT_USAGE, "--mode ps: --straggler-policy dd: --batch %ld is not a multiple of the %d workers "
                          "(a chunk is a worker's batch)", o->batch, W);
    if (ps_dynamic(o) && o->steps > INT32_MAX / W)
        return train_fail(EXIT_USAGE, "--mode ps: --straggler-policy dd: --steps %ld x %d workers chunks exceed 2^31",
                          o->steps, W);
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
    if (o->bal.slow_rank == t->rank && t->rank < o->ps_servers) p->pc.answer_delay_s = o->bal.slow_add_s;
    /* ADT_INJECT_SERVER_DELAY=SECONDS, a test's and a benchmark's hook: a server whose process has
     * it pauses that long before every answer too. Set for one agent's processes, the slowness
     * belongs to that node, not to a rank number: ND moving the server leaves it behind. */
    const char *sd = getenv("ADT_INJECT_SERVER_DELAY");
    if (sd && *sd) {
        char *end = NULL;
        double d = strtod(sd, &end);
        if (*end || !(d >= 0 && d <= 60))
            return train_fail(EXIT_USAGE, "ADT_INJECT_SERVER_DELAY: expected seconds in [0, 60], got '%.40s'", sd);
        if (t->rank < o->ps_servers) p->pc.answer_delay_s += d;
    }
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
    if (ps_dynamic(&t->o)) p->pc.chunks = t->o.steps * p->pw.n_workers;
    if (p->pw.is_server) {
        if (adt_ps_store_create(&p->store, p->pc.tables, p->pc.n_tables, &p->pc.optim, p->pc.seed))
            return train_fail(EXIT_RUNTIME, "--mode ps: %s", adt_error_message());
        return 0;
    }
    int W = p->pw.n_workers, w = p->pw.worker;
    int64_t B = t->o.batch;
    p->dynamic = ps_dynamic(&t->o);
    p->by_feed = t->o.bal.by_feed;
    p->eo = *eo;
    int64_t cap = p->by_feed ? B : B / W + (w < B % W); /* buffers for the largest share this worker can get */
    p->Bw = (int)(B / W + (w < B % W));
    p->off = (int64_t)w * (B / W) + (w < B % W ? w : B % W);
    p->counts = adt_malloc((size_t)W * sizeof *p->counts);
    for (int v = 0; v < W; v++) p->counts[v] = B / W + (v < B % W);
    p->logits = adt_malloc((size_t)cap * sizeof *p->logits);
    int read[2] = {t->io.logits, t->io.label}; /* the whole batch's, for the metric (train_read) */
    for (int i = 0; i < 2; i++) t->gathered[i] = adt_malloc((size_t)adt_value_bytes(t->g, read[i]));
    int T = t->model.dlrm.n_tables;
    p->idx = adt_malloc((size_t)B * sizeof *p->idx);
    p->ids = adt_malloc((size_t)cap * (size_t)T * sizeof *p->ids);
    p->dense_in = adt_malloc((size_t)cap * (size_t)t->model.dlrm.n_dense * sizeof *p->dense_in);
    p->labels = adt_malloc((size_t)cap * sizeof *p->labels);
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

/* One step's compute on this worker's batch: adt_ps_dlrm_step less its waits for rows and pushes. */
static int ps_compute(trainer *t, train_ps *p, long s, adt_comm *workers, float share, float *l) {
    adt_ps_worker_stats a, b;
    adt_ps_worker_get_stats(p->wk, &a);
    double t0 = adt_now_s(), sync0 = adt_ps_dlrm_sync_s(p->d);
    if (adt_ps_dlrm_step(p->d, p->wk, workers, s, p->dense_in, p->labels, share, l))
        return train_fail(EXIT_RUNTIME, "step %ld: %s", s + 1, adt_error_message());
    adt_ps_worker_get_stats(p->wk, &b);
    /* less the waits for rows, pushes and the other workers (the dense all-reduce): what this worker
     * computed, which the straggler monitor compares */
    double sync = adt_ps_dlrm_sync_s(p->d) - sync0;
    double c = adt_now_s() - t0 - (b.wait_rows_s - a.wait_rows_s) - (b.push_s - a.push_s) - sync;
    c = train_slow_step(t, s + 1, c > 0 ? c : 0); /* --inject-slowdown: the sleep counts as compute */
    p->last_compute_s = c;
    if (p->samples)
        p->compute_s += c, p->steady += p->Bw, p->wait_s += (b.wait_rows_s - a.wait_rows_s) + (b.push_s - a.push_s) + sync;
    else if (p->dynamic) p->warm_t = adt_now_s(); /* the fixed split's: after the step's loss sum */
    p->samples += p->Bw;
    return 0;
}

/* The record's fields, W values each (worker k's at field * W + k), then the loss sum and the
 * sample digest: one all-reduce of doubles carries them all. */
enum { REC_SAMPLES, REC_COMPUTE, REC_CHUNKS, REC_STEADY, REC_SPAN, REC_WAIT, REC_FIELDS };

/* The workers' record, once at the end: samples, compute seconds and capacity per worker (and
 * under dynamic sharding the chunks each took) noted and logged by the reporter as one JSON line
 * {"ps_workers": ...}. The rates are of the steady state, each worker's first step (it makes the
 * data and the executor's primitives) left out: a worker's rate is its samples after it over its
 * time after it (under the fixed split from the first step's loss sum, which every worker leaves
 * together), the run's the sum of the workers'; a worker's capacity its samples over that time
 * less its waits (for rows, pushes, chunks and, under the fixed split, the other workers): what it
 * would train alone. Collective over the workers. */
static int ps_record(trainer *t, train_ps *p, double loss_sum, double *mean_loss) {
    int W = p->pw.n_workers, w = p->pw.worker;
    double *v = adt_calloc((size_t)(REC_FIELDS * W + 3), sizeof *v), *tail = v + REC_FIELDS * W;
    v[REC_SAMPLES * W + w] = (double)p->samples, v[REC_COMPUTE * W + w] = p->compute_s;
    v[REC_CHUNKS * W + w] = (double)p->n_taken, v[REC_STEADY * W + w] = (double)p->steady;
    v[REC_SPAN * W + w] = p->steady ? adt_now_s() - p->warm_t : 0, v[REC_WAIT * W + w] = p->wait_s;
    tail[0] = loss_sum, tail[1] = p->digest[0], tail[2] = p->digest[1];
    int64_t *counts = adt_malloc((size_t)W * sizeof *counts), total = 0;
    int rc = W > 1 && adt_comm_allreduce_f64(p->pw.workers, v, REC_FIELDS * W + 3);
    for (int k = 0; k < W; k++) total += counts[k] = (int64_t)v[REC_CHUNKS * W + k];
    int32_t *all = adt_malloc((size_t)(total ? total : 1) * sizeof *all);
    if (!rc && p->dynamic) {
        if (W > 1) rc = adt_comm_allgather(p->pw.workers, p->taken, all, counts, ADT_I32);
        else memcpy(all, p->taken, (size_t)total * sizeof *all);
    }
    double rate = 0, sum_cap = 0;
    if (mean_loss) *mean_loss = total ? tail[0] / (double)total : 0;
    if (!rc && t->rank == t->reporter) {
        char line[1024];
        int n = 0;
        for (int k = 0; k < W; k++) {
            double span = v[REC_SPAN * W + k], busy = span - v[REC_WAIT * W + k], steady = v[REC_STEADY * W + k];
            double cap = busy > 0 ? steady / busy : 0;
            rate += span > 0 ? steady / span : 0, sum_cap += cap;
            n += snprintf(line + n, sizeof line - (size_t)n, "%s%d: %.0f samples (capacity %.0f/s)", k ? ", " : "", k,
                          v[REC_SAMPLES * W + k], cap);
            if (n >= (int)sizeof line) break;
        }
        train_note(t, "ps: %s sharding; workers %s; after the first step %.0f samples/s in all, %.0f%% of the "
                   "workers' capacities' sum", p->dynamic ? "dynamic" : "static", line, rate,
                   sum_cap > 0 ? 100 * rate / sum_cap : 0);
        if (t->log) {
            fprintf(t->log, "{\"ps_workers\":{\"sharding\":\"%s\",\"samples_per_s\":%.3f,\"capacity_sum\":%.3f",
                    p->dynamic ? "dynamic" : "static", rate, sum_cap);
            const char *key[REC_FIELDS] = {"samples", "compute_s", "chunks", "steady_samples", "steady_s", "wait_s"};
            for (int j = 0; j < REC_FIELDS; j++) {
                fprintf(t->log, ",\"%s\":[", key[j]);
                for (int k = 0; k < W; k++) fprintf(t->log, "%s%.6g", k ? "," : "", v[j * W + k]);
                fputc(']', t->log);
            }
            if (p->dynamic && mean_loss) {
                fprintf(t->log, ",\"mean_loss\":%.9g,\"sample_digest\":[%.0f,%.0f],\"taken\":[", *mean_loss,
                        tail[1], tail[2]);
                for (int k = 0, at = 0; k < W; at += (int)counts[k], k++) {
                    fputs(k ? ",[" : "[", t->log);
                    for (int64_t i = 0; i < counts[k]; i++) fprintf(t->log, "%s%d", i ? "," : "", all[at + i]);
                    fputc(']', t->log);
                }
                fputc(']', t->log);
            }
            fputs("}}\n", t->log);
            fflush(t->log);
        }
    }
    free(v), free(counts), free(all);
    if (rc) return train_fail(EXIT_RUNTIME, "the workers' record: %s", adt_error_message());
    return 0;
}

/* Chunk c's samples into ids, dense_in, labels: block c mod W of the sampler's global batch c / W. */
static int fill_chunk(trainer *t, train_ps *p, int64_t c, int trained) {
    int W = p->pw.n_workers;
    adt_sampler_batch(&t->sampler, c / W, p->idx);
    int64_t *idx = p->idx + (c % W) * p->Bw;
    if (train_source_fill(&t->train, idx, p->Bw, p->dense_in, p->ids, p->labels))
        return train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
    for (int i = 0; trained && i < p->Bw; i++) { /* exact in a double up to 2^33 samples */
        uint64_t h = adt_rng_mix64((uint64_t)idx[i]);
        p->digest[0] += (double)(h & 0xfffff), p->digest[1] += (double)(h >> 44);
    }
    return 0;
}

/* Dynamic sharding, a worker's whole run: it asks server 0 for the next chunk as long as there is
 * one, its rows pulled up to --ps-prefetch chunks ahead (with the ask in flight, a worker holds at
 * most prefetch + 1 more chunks than it is computing), and trains each as a step of its own (steps 0, 1, ... of its
 * clock). Each chunk carries 1/W of a global batch's loss, as a worker's block does in the fixed
 * split. */
static int ps_run_chunks(trainer *t, train_ps *p, double *loss) {
    int D = p->pc.prefetch;
    int64_t q[65]; /* the chunks of steps [s, pulled): q[step % (D + 1)] */
    long s = 0;
    int out = 0;
    double loss_sum = 0;
    float share = 1.0f / (float)p->pw.n_workers;
    for (;;) {
        while (!out && p->pulled < s + 1 + D) {
            int64_t c;
            double t0 = adt_now_s();
            if (adt_ps_worker_next_chunk(p->wk, &c))
                return train_fail(EXIT_RUNTIME, "asking for a chunk: %s", adt_error_message());
            if (p->steady) p->wait_s += adt_now_s() - t0;
            if (c < 0) {
                out = 1;
                break;
            }
            int rc = fill_chunk(t, p, c, 0);
            if (rc) return rc;
            if (adt_ps_worker_pull(p->wk, p->pulled, p->ids, p->Bw))
                return train_fail(EXIT_RUNTIME, "chunk %lld: pulling rows: %s", (long long)c, adt_error_message());
            q[p->pulled % (D + 1)] = c;
            p->pulled++;
        }
        if (s == p->pulled) break;
        int64_t c = q[s % (D + 1)];
        int rc = fill_chunk(t, p, c, 1);
        float l = 0;
        if (!rc) rc = ps_compute(t, p, s, NULL, share, &l);
        if (rc) return rc;
        if (p->n_taken == p->cap_taken) {
            p->cap_taken = p->cap_taken ? 2 * p->cap_taken : 64;
            p->taken = adt_realloc(p->taken, (size_t)p->cap_taken * sizeof *p->taken);
        }
        p->taken[p->n_taken++] = (int32_t)c;
        loss_sum += l;
        s++;
    }
    return ps_record(t, p, loss_sum, loss); /* the run's mean loss over every chunk */
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
    if (!rc && p->dynamic) { /* the worker's whole run, as a server's service is */
        rc = ps_run_chunks(t, p, loss);
        t->finished = t->serving = 1;
        return rc;
    }
    if (!rc && t->el) { /* an elastic job's leased batch: its rows asked for now, none ahead (prefetch 0) */
        if (fill_step(t, p, s, idx) || adt_ps_worker_pull(p->wk, s, p->ids, p->Bw))
            return train_fail(EXIT_RUNTIME, "step %ld: pulling rows: %s", step, adt_error_message());
        p->pulled = s + 1;
    } else if (!rc) {
        rc = pull_ahead(t, p, s + 1 + p->pc.prefetch);
        if (!rc && fill_step(t, p, s, idx)) rc = train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
    }
    if (rc) return rc;
    float l = 0;
    float share = (float)p->Bw / (float)t->o.batch;
    adt_ps_dlrm_set_lr(p->d, ps_lr_at(&t->o, step)); /* the hybrid dense update's; the servers set the rows' */
    if ((rc = ps_compute(t, p, s, p->pw.workers, share, &l))) return rc;
    double g = (double)share * l; /* the global loss: the share-weighted sum of the workers' means */
    double t0 = adt_now_s();
    if (p->pw.workers && adt_comm_allreduce_f64(p->pw.workers, &g, 1))
        return train_fail(EXIT_RUNTIME, "step %ld: the global loss: %s", step, adt_error_message());
    if (p->steady) p->wait_s += adt_now_s() - t0; /* the others' step: a straggler's cost */
    else p->warm_t = adt_now_s();
    *loss = g;
    return step == t->o.steps ? ps_record(t, p, 0, NULL) : 0;
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
    /* no client: this worker ran nothing (an elastic world that started after the last commit),
     * and neither did the servers, which are not listening */
    if (p->pw.is_server || !p->pw_ready || p->said_done || !p->wk) return 0;
    p->said_done = 1;
    if (ps_client(p)) return EXIT_RUNTIME;
    if (adt_ps_worker_done(p->wk)) return train_fail(EXIT_RUNTIME, "the parameter servers: %s", adt_error_message());
    return 0;
}

int train_ps_serves(const trainer *t) { return t->ps && t->ps->pw_ready && t->ps->pw.is_server; }

adt_comm *train_ps_workers(const trainer *t) { return t->ps && t->ps->pw_ready ? t->ps->pw.workers : NULL; }

int64_t train_ps_local_batch(const trainer *t) { return train_ps_serves(t) ? 0 : t->ps->Bw; }

double train_ps_compute_s(const trainer *t) { return train_ps_serves(t) || !t->ps->samples ? -1 : t->ps->last_compute_s; }

int train_ps_answer_s(const trainer *t, double *s, int n) {
    if (train_ps_serves(t) || !t->ps->wk || !t->ps->samples) return 0;
    return adt_ps_worker_answer_s(t->ps->wk, s, n);
}

int train_ps_set_split(trainer *t, const int64_t *split, int n, long step) {
    train_ps *p = t->ps;
    if (train_ps_serves(t) || !p->by_feed || n != p->pw.n_workers) return 0;
    int w = p->pw.worker;
    int64_t off = 0;
    for (int v = 0; v < w; v++) off += split[v];
    p->off = off;
    for (int v = 0; v < n; v++) p->counts[v] = split[v];
    if (split[w] == p->Bw) return 0;
    if (split[w] < 1 || split[w] > t->o.batch)
        return train_fail(EXIT_RUNTIME, "step %ld: a local batch of %lld samples; expected 1..%ld", step,
                          (long long)split[w], t->o.batch);
    if (adt_ps_dlrm_resize(p->d, (int)split[w], &p->eo))
        return train_fail(EXIT_RUNTIME, "step %ld: the model at a local batch of %lld: %s", step, (long long)split[w],
                          adt_error_message());
    train_note(t, "ps: worker %d takes %lld of every %ld samples from step %ld (the master's split)", w,
               (long long)split[w], t->o.batch, step);
    p->Bw = (int)split[w];
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
            "%s%d of every %ld samples\n", p->pw.n_servers, p->pw.n_servers == 1 ? "" : "s",
            p->pw.n_workers, p->pw.n_workers == 1 ? "" : "s", sync, p->pc.prefetch, optim[p->pc.optim.kind],
            p->pc.optim.lr, t->o.ps_dense_servers ? "on the servers" : "all-reduced among the workers",
            p->dynamic ? "dynamic sharding: server 0 hands out chunks of " : "worker 0 takes ", p->Bw, t->o.batch);
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
    free(p->taken);
    free(p);
    t->ps = NULL;
}

const train_runner train_runner_ps = {"the parameter-server mode", ps_build, ps_executor, ps_step, ps_eval, ps_banner,
                                      ps_free, ps_finish};
