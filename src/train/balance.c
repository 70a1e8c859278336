/*
 * balance.c - the balanced data-parallel runner (AntDT-DD): every rank takes
 * its own number of the global batch's samples, in proportion to its measured speed, and the
 * update is still the one computed on all the samples at once.
 *
 * The loss is a mean over the global batch of B samples, so its gradient is
 *     g = (1/B) sum_samples grad l  =  sum_ranks sum_passes (s/B) g_pass
 * where a pass is one forward/backward run on s samples whose own loss is the mean over those s
 * (g_pass its gradient). Each rank runs its local batch b_i as passes of at most --micro-batch
 * samples (so a rank stays within its memory however large its share grows), adds the gradients
 * up weighted by s/B, and one all-reduce sums them over the ranks; the optimizer then runs once,
 * on the same gradient on every rank. The samples are the sampler's global batch cut in rank
 * order (rank 0 the first b_0 of them, ...), so the set of samples per step is the one-process
 * run's whatever the split.
 *
 * Graphs: one small "update" graph (every parameter, its optimizer state, the gradient as a fed
 * input, the optimizer's update nodes) is t->g with executor t->ex, so checkpoints, --init and
 * --resume see the usual names; and per pass size s a step graph (the model at batch s, forward
 * and backward, no optimizer) with its executor, kept in a small cache. A step executor's
 * parameters are bound to the update executor's storage (adt_exec_bind): what the update writes
 * the next pass reads, with no copy.
 *
 * Overlap: a pass's gradients are added into the update's inputs as each is made (the executor's
 * after_node callback), and on a rank's last pass of the step each sum is final then, so its
 * all-reduce starts at once while the backward pass goes on to the earlier layers. The
 * all-reduces start in one fixed order on every rank (the parameters in the order the model's
 * backward pass makes their gradients), a gradient made out of that order waiting for those
 * before it, since collectives on a communicator must start in the same order everywhere.
 *
 * Monitor and controller (adtrain/straggler.h): after its passes each rank knows its compute time
 * (the passes' wall time, excluding the all-reduces); one all-reduce gives every rank every
 * rank's time and sample count (and the weighted loss). Each rank feeds the same numbers to its own monitor, so every
 * rank takes the same decision at the same step boundary without a further message; rank 0
 * prints and logs it. --inject-slowdown makes a rank's compute take FACTOR times as long, as on
 * a slower CPU: it sleeps after each node of its passes (FACTOR - 1) x the node's time (sleeps
 * under 1 ms are saved up), so its all-reduces run during its stretched backward pass as they
 * would there; what is left (and a +SECONDS pause) after the passes. The sleep counts as
 * compute: deterministic slowness for tests.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cJSON.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "adtrain/straggler.h"
#include "train_internal.h"

#define BAL_CACHE 4

typedef struct bal_exec {
    int batch; /* samples per pass; 0: empty slot */
    adt_graph *g;
    adt_model_io io;
    adt_exec *ex;
    int *param, *grad; /* [n_param] value ids in g                           */
    int *made_by;      /* [n_nodes] the first parameter whose gradient the node makes, or -1 */
    int *next_made;    /* [n_param] the next one the same node makes, or -1    */
    long used;         /* last step it ran (eviction)                          */
} bal_exec;

typedef struct train_bal {
    int n_param;
    int *u_param, *u_grad; /* [n_param] the update graph's parameter and gradient-input ids */
    int64_t *elems;        /* [n_param] elements of each                                    */
    double loss_w;         /* this rank's sum over passes of (s/B) loss                     */
    bal_exec cache[BAL_CACHE];
    adt_exec_opts eo;
    int64_t *split;         /* [nranks] local batch of every rank                           */
    double *times;          /* [2 nranks + 1] compute seconds, samples, the weighted loss
                               (all-reduced)                                                 */
    adt_straggler *mon;
    adt_straggler_cfg cfg;
    double comm_s, compute_s; /* this rank's totals                                         */
    double step_s, slowest_s; /* summed wall time of the steps, and of their slowest rank's
                                 compute: the difference is what data parallelism adds      */
    double *rank_compute;     /* [nranks] summed compute seconds per rank                   */
    int64_t *rank_samples;    /* [nranks] summed samples per rank                           */
    double *fin_compute;      /* [nranks] the same since the split last changed: the capacities */
    int64_t *fin_samples;     /* at the split the run ends with (a rank's samples/s depend on   */
    long fin_steps;           /* its local batch)                                             */
    int64_t *prev_split;      /* [nranks] the split of the step being observed                 */
    double make_s;            /* seconds spent making step executors this step (not compute)  */
    long steps;
    int64_t generation;      /* --straggler-master: the generation reports name             */
    double last_compute_s;   /* this rank's compute seconds of the last step                 */
    int master_warned;       /* the master could not be reached (said once)                 */
    int32_t *split32;        /* [nranks] the split as rank 0 broadcasts it                  */
    /* the pass in progress, for the after_node callback */
    bal_exec *cur;
    float cur_w;             /* s/B of the pass                                              */
    int cur_first, cur_last; /* the rank's first / last pass of the step                     */
    int cb_rc;               /* the first error a callback met                               */
    int *seq;                /* [n_param] the order the all-reduces start in                 */
    unsigned char *ready;    /* [n_param] the gradient's sum is final                        */
    int n_started;           /* all-reduces started this step (seq[0..n_started))            */
    adt_comm_req **req;      /* [n_param] in flight                                          */
    /* --inject-slowdown FACTOR: every node of the rank's passes takes FACTOR times as long */
    int slowing;
    double slow_mark, slow_debt, slept; /* last accounting time, sleep owed, slept this step  */
} train_bal;

/* ---- flags ------------------------------------------------------------------------------------- */

static int parse_slowdown(train_opts *o, const char *v) {
    adt_train_balance_opts *b = &o->bal;
    char *end;
    errno = 0;
    long r = strtol(v, &end, 10);
    if (end == v || *end != ':' || r < 0 || r > 1 << 20) goto bad;
    const char *f = end + 1;
    int add = *f == '+'; /* +SECONDS: a pause rather than a factor */
    double x = strtod(f + add, &end);
    if (end == f + add || !isfinite(x) || (add ? x < 0 || x > 3600 : x < 1 || x > 1000)) goto bad;
    b->slow_factor = add ? 1 : x;
    b->slow_add_s = add ? x : 0;
    b->slow_rank = (int)r;
    b->slow_first = 1, b->slow_last = INT32_MAX;
    if (*end == '@') {
        const char *w = end + 1;
        b->slow_first = strtol(w, &end, 10);
        if (end == w || *end != '-') goto bad;
        w = end + 1;
        b->slow_last = strtol(w, &end, 10);
        if (end == w || b->slow_first < 1 || b->slow_last < b->slow_first) goto bad;
    }
    if (*end) goto bad;
    return 0;
bad:
    return train_fail(EXIT_USAGE, "--inject-slowdown: expected RANK:FACTOR or RANK:+SECONDS, optionally "
                      "@FIRST-LAST (FACTOR in [1, 1000], SECONDS in [0, 3600], steps 1 <= FIRST <= LAST), got '%s'", v);
}

int train_balance_flag(train_opts *o, const char *f, const char *v) {
    adt_train_balance_opts *b = &o->bal;
    b->on = 1;
    if (!strcmp(f, "--straggler-policy")) {
        adt_straggler_policy p;
        if (adt_straggler_policy_parse(v, &p)) return train_fail(EXIT_USAGE, "--straggler-policy: expected off, dd "
                                                                 "or nd, got '%s'", v);
        b->policy = p;
    } else if (!strcmp(f, "--straggler-config")) {
        adt_straggler_cfg c = adt_straggler_defaults(ADT_STRAGGLER_OFF);
        if (adt_straggler_cfg_parse(&c, v)) return train_fail(EXIT_USAGE, "--straggler-config: %s", adt_error_message());
        b->config = v;
    } else if (!strcmp(f, "--straggler-master")) {
        b->master = v;
    } else if (!strcmp(f, "--split")) {
        b->split = v;
    } else if (!strcmp(f, "--micro-batch")) {
        char *end;
        errno = 0;
        long long m = strtoll(v, &end, 10);
        if (!*v || *end || errno || m < 1 || m > (1 << 20))
            return train_fail(EXIT_USAGE, "--micro-batch: expected an integer in [1, %d], got '%s'", 1 << 20, v);
        b->micro_batch = (long)m;
    } else {
        return parse_slowdown(o, v);
    }
    return 0;
}

int train_balance_check(const train_opts *o) {
    if (o->plan_path) { /* the plan's batch split (plan_split.c) */
        if (o->bal.micro_batch)
            return train_fail(EXIT_USAGE, "--micro-batch with --plan: the plan's microbatches set the passes; expected "
                              "no --micro-batch (adtrain plan --microbatches M)");
        if (o->bal.master)
            return train_fail(EXIT_USAGE, "--straggler-master with --plan: the ranks decide the plan's batch split "
                              "among themselves; expected no --straggler-master");
        return 0;
    }
    if (o->eval_every)
        return train_fail(EXIT_USAGE, "--eval-every: evaluation is not run by balanced data parallelism yet "
                          "(--straggler-policy, --split, --micro-batch, --inject-slowdown); expected --eval-every 0");
    return 0;
}

/* --split B0,B1,... against --batch and the world. */
static int parse_split(trainer *t, int64_t *split) {
    int n = t->nranks;
    int64_t B = t->o.batch, sum = 0;
    if (!t->o.bal.split) {
        for (int i = 0; i < n; i++) split[i] = B / n + (i < B % n);
        if (B < n) return train_fail(EXIT_USAGE, "--batch %lld: fewer samples than the %d ranks", (long long)B, n);
        return 0;
    }
    const char *p = t->o.bal.split;
    for (int i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 1 || (i < n - 1 ? *end != ',' : *end != 0))
            return train_fail(EXIT_USAGE, "--split '%s': expected %d local batches >= 1 separated by commas, one per "
                              "rank", t->o.bal.split, n);
        split[i] = v, sum += v;
        p = end + 1;
    }
    if (sum != B)
        return train_fail(EXIT_USAGE, "--split '%s': the local batches sum to %lld; expected --batch %lld",
                          t->o.bal.split, (long long)sum, (long long)B);
    return 0;
}

/* ---- graphs ------------------------------------------------------------------------------------ */

static void bal_exec_free(bal_exec *c) {
    adt_exec_free(c->ex);
    adt_graph_free(c->g);
    free(c->param), free(c->grad), free(c->made_by), free(c->next_made);
    memset(c, 0, sizeof *c);
}

/* Starts, in the fixed order, the all-reduces of the gradient sums that are final. */
static int start_ready(trainer *t) {
    train_bal *b = t->bal;
    while (b->n_started < b->n_param && b->ready[b->seq[b->n_started]]) {
        int i = b->seq[b->n_started++];
        if (adt_comm_iallreduce(t->world, adt_exec_data(t->ex, b->u_grad[i]), b->elems[i], ADT_F32, &b->req[i]))
            return -1;
    }
    return 0;
}

/* After each node of a pass: the gradients it made go into the update's inputs, weighted by s/B
 * (written by the rank's first pass, added to by the others: no separate buffer); on the last
 * pass they are final, and their all-reduces start. */
static void bal_after_node(void *ctx, int node) {
    trainer *t = ctx;
    train_bal *b = t->bal;
    const bal_exec *c = b->cur;
    int any = 0;
    for (int i = c->made_by[node]; i >= 0; i = c->next_made[i]) {
        const float *g = adt_exec_data(c->ex, c->grad[i]);
        float *a = adt_exec_data(t->ex, b->u_grad[i]), w = b->cur_w;
        if (b->cur_first)
            for (int64_t e = 0; e < b->elems[i]; e++) a[e] = w * g[e];
        else
            for (int64_t e = 0; e < b->elems[i]; e++) a[e] += w * g[e];
        b->ready[i] = (unsigned char)b->cur_last;
        any = 1;
    }
    if (t->world && b->cur_last && !b->cb_rc) {
        if (any && start_ready(t)) b->cb_rc = -1;
        else if (b->n_started && adt_comm_progress(t->world)) b->cb_rc = -1; /* MPI moves data inside its calls */
    }
    if (b->slowing) { /* as on a slower CPU: each node stretched, the collectives in flight meanwhile */
        double now = adt_now_s();
        b->slow_debt += (t->o.bal.slow_factor - 1) * (now - b->slow_mark);
        if (b->slow_debt >= 1e-3) { /* shorter sleeps would overshoot */
            adt_sleep_s(b->slow_debt);
            double woke = adt_now_s();
            b->slow_debt -= woke - now, b->slept += woke - now;
            now = woke;
        }
        b->slow_mark = now;
    }
}

/* The model at `batch` samples per pass, forward and backward; every parameter's gradient and the
 * loss kept to the end of the run. */
static int bal_exec_make(trainer *t, bal_exec *c, int batch) {
    train_bal *b = t->bal;
    memset(c, 0, sizeof *c);
    c->batch = batch;
    c->g = adt_graph_create();
    if (adt_model_build(c->g, &t->model, batch, &c->io))
        return train_fail(EXIT_USAGE, "--model %s at %d samples per pass: %s", t->model_label, batch, adt_error_message());
    adt_graph_backward(c->g, c->io.loss);
    adt_graph_mark_output(c->g, c->io.loss);
    c->param = adt_malloc((size_t)b->n_param * sizeof *c->param);
    c->grad = adt_malloc((size_t)b->n_param * sizeof *c->grad);
    for (int i = 0; i < b->n_param; i++) {
        c->param[i] = adt_graph_find_value(c->g, t->g->values[b->u_param[i]].name);
        c->grad[i] = c->param[i] >= 0 ? c->g->values[c->param[i]].grad : -1;
        ADT_ASSERT(c->grad[i] >= 0); /* the same model: the same parameters with gradients */
        adt_graph_mark_output(c->g, c->grad[i]);
    }
    if (adt_graph_error(c->g))
        return train_fail(EXIT_RUNTIME, "building the step graph: %s", adt_graph_error_message(c->g));
    c->made_by = adt_malloc((size_t)c->g->n_nodes * sizeof *c->made_by);
    c->next_made = adt_malloc((size_t)b->n_param * sizeof *c->next_made);
    for (int v = 0; v < c->g->n_nodes; v++) c->made_by[v] = -1;
    for (int i = b->n_param - 1; i >= 0; i--) {
        int p = c->g->values[c->grad[i]].producer;
        ADT_ASSERT(p >= 0);
        c->next_made[i] = c->made_by[p], c->made_by[p] = i;
    }
    adt_exec_opts eo = b->eo;
    eo.after_node = bal_after_node, eo.after_ctx = t;
    if (adt_exec_create(&c->ex, c->g, &eo)) return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
    for (int i = 0; i < b->n_param; i++)
        if (adt_exec_bind(c->ex, c->param[i], adt_exec_data(t->ex, b->u_param[i])))
            return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
    return 0;
}

/* The cached executor for passes of `batch` samples (made, evicting the least recently used). Its
 * parameters are the update executor's. */
static int bal_exec_get(trainer *t, int batch, long step, bal_exec **out) {
    train_bal *b = t->bal;
    bal_exec *c = NULL;
    for (int i = 0; i < BAL_CACHE && !c; i++)
        if (b->cache[i].batch == batch) c = &b->cache[i];
    if (!c) {
        c = &b->cache[0];
        for (int i = 1; i < BAL_CACHE; i++)
            if (b->cache[i].used < c->used) c = &b->cache[i];
        bal_exec_free(c);
        /* made once per pass size, so not part of the compute a rank's speed is judged on (nor
         * stretched by --inject-slowdown) */
        double m0 = adt_now_s();
        int rc = bal_exec_make(t, c, batch);
        double dt = adt_now_s() - m0;
        b->make_s += dt, b->slow_mark += dt;
        if (rc) return rc;
    }
    c->used = step;
    *out = c;
    return 0;
}

/* The update graph from a step graph's parameters: each parameter (same name, shape, init, file
 * shape), its gradient as a fed input "grad:<id>", and the optimizer. */
static int build_update_graph(trainer *t, const adt_graph *sg) {
    train_bal *b = t->bal;
    adt_graph *u = t->g = adt_graph_create();
    b->u_param = adt_malloc((size_t)sg->n_values * sizeof *b->u_param);
    b->u_grad = adt_malloc((size_t)sg->n_values * sizeof *b->u_grad);
    b->elems = adt_malloc((size_t)sg->n_values * sizeof *b->elems);
    for (int v = 0; v < sg->n_values; v++) {
        const adt_value *x = &sg->values[v];
        if (x->role != ADT_ROLE_PARAM || x->grad < 0) continue;
        if (x->dtype != ADT_F32)
            return train_fail(EXIT_USAGE, "--model %s: parameter '%s' is not f32; balanced data parallelism sums f32 "
                              "gradients", t->model_label, x->name);
        adt_graph_set_layer_tag(u, x->layer_tag);
        int p = adt_param(u, x->name, x->shape, x->init);
        if (x->file_shape.ndim) adt_graph_set_file_shape(u, p, x->file_shape);
        char name[ADT_NAME_LEN];
        snprintf(name, sizeof name, "grad:%d", b->n_param);
        int gi = adt_input(u, name, ADT_F32, x->shape);
        if (p < 0 || gi < 0) break;
        u->values[p].grad = gi;
        b->u_param[b->n_param] = p, b->u_grad[b->n_param] = gi;
        b->elems[b->n_param++] = adt_shape_numel(&x->shape);
    }
    u->loss = adt_input(u, "loss", ADT_F32, adt_shape_1d(1)); /* the optimizer asks for a loss */
    t->oc = t->o.optimizer == ADT_OPTIM_SGD ? adt_optim_sgd((float)t->o.momentum, (float)t->o.weight_decay)
                                            : adt_optim_adamw(0.9f, 0.95f, 1e-8f, (float)t->o.weight_decay);
    adt_graph_optimizer(u, &t->oc);
    if (adt_graph_error(u)) return train_fail(EXIT_RUNTIME, "building the update graph: %s", adt_graph_error_message(u));
    return 0;
}

/* seq: the parameters in the order the backward pass of graph sg makes their gradients (their
 * producers' order; every rank builds the same sg), the order their all-reduces start in. */
static void order_allreduces(train_bal *b, const adt_graph *u, const adt_graph *sg) {
    int *key = adt_malloc((size_t)b->n_param * sizeof *key);
    b->seq = adt_malloc((size_t)b->n_param * sizeof *b->seq);
    b->ready = adt_calloc((size_t)b->n_param, 1);
    b->req = adt_calloc((size_t)b->n_param, sizeof *b->req);
    for (int i = 0; i < b->n_param; i++) {
        int v = adt_graph_find_value(sg, u->values[b->u_param[i]].name);
        key[i] = sg->values[sg->values[v].grad].producer;
        int j = i; /* insertion: few parameters */
        while (j > 0 && key[b->seq[j - 1]] > key[i]) b->seq[j] = b->seq[j - 1], j--;
        b->seq[j] = i;
    }
    free(key);
}

int train_balance_build(trainer *t) {
    train_bal *b = t->bal = adt_calloc(1, sizeof *t->bal);
    int n = t->nranks;
    b->split = adt_calloc((size_t)n, sizeof *b->split);
    b->times = adt_calloc(2 * (size_t)n + 1, sizeof *b->times);
    b->rank_compute = adt_calloc((size_t)n, sizeof *b->rank_compute);
    b->rank_samples = adt_calloc((size_t)n, sizeof *b->rank_samples);
    b->fin_compute = adt_calloc((size_t)n, sizeof *b->fin_compute);
    b->fin_samples = adt_calloc((size_t)n, sizeof *b->fin_samples);
    b->prev_split = adt_calloc((size_t)n, sizeof *b->prev_split);
    b->split32 = adt_calloc((size_t)n, sizeof *b->split32);
    const char *gen = getenv("ADT_GENERATION");
    b->generation = gen ? atoll(gen) : 0;
    int rc = parse_split(t, b->split);
    if (rc) return rc;
    if (t->o.bal.slow_rank >= n)
        return train_fail(EXIT_USAGE, "--inject-slowdown: rank %d, but the world has %d rank%s", t->o.bal.slow_rank, n,
                          n == 1 ? "" : "s");
    /* with a master (asked, or driving the split through the elastic feed), its controller
     * decides; this monitor only measures */
    int decides = !t->o.bal.master && !t->o.bal.by_feed;
    b->cfg = adt_straggler_defaults(decides ? (adt_straggler_policy)t->o.bal.policy : ADT_STRAGGLER_OFF);
    if (t->o.bal.config && adt_straggler_cfg_parse(&b->cfg, t->o.bal.config))
        return train_fail(EXIT_USAGE, "--straggler-config: %s", adt_error_message());
    b->mon = adt_straggler_create(n, &b->cfg);
    if (!b->mon) return train_fail(EXIT_USAGE, "--straggler-config: %s", adt_error_message());
    /* the parameters come from the model at one sample: the same names and shapes at any batch */
    adt_graph *sg = adt_graph_create();
    adt_model_io io;
    if (adt_model_build(sg, &t->model, 1, &io) || adt_graph_backward(sg, io.loss)) {
        adt_graph_free(sg);
        return train_fail(EXIT_USAGE, "--model %s: %s", t->model_label, adt_error_message());
    }
    /* the banner's FLOPs of a step: the passes at the global batch, and the update */
    t->step_flops = adt_graph_flops(sg) * (double)t->o.batch;
    rc = build_update_graph(t, sg);
    if (!rc) t->step_flops += adt_graph_flops(t->g);
    if (!rc) order_allreduces(b, t->g, sg);
    adt_graph_free(sg);
    if (rc) return rc;
    t->io = (adt_model_io){.input = -1, .input2 = -1, .label = -1, .logits = -1, .loss = t->g->loss};
    return 0;
}

int train_balance_executor(trainer *t, const adt_exec_opts *eo) {
    t->bal->eo = *eo;
    if (adt_exec_create(&t->ex, t->g, eo)) return train_fail(EXIT_RUNTIME, "executor: %s", adt_error_message());
    return 0;
}

void train_balance_banner(const trainer *t, FILE *f) {
    const train_bal *b = t->bal;
    const adt_train_balance_opts *o = &t->o.bal;
    fprintf(f, "dist   %d rank%s, balanced data parallel (straggler policy %s%s), split", t->nranks,
            t->nranks == 1 ? "" : "s", adt_straggler_policy_name(o->master || o->by_feed ? o->policy : b->cfg.policy),
            o->master || o->by_feed ? ", decided by the job's master" : "");
    for (int i = 0; i < t->nranks; i++) fprintf(f, "%s%lld", i ? "/" : " ", (long long)b->split[i]);
    if (o->micro_batch) fprintf(f, ", passes of at most %ld samples", o->micro_batch);
    if (o->slow_rank >= 0) {
        if (o->slow_add_s > 0) fprintf(f, "; rank %d pauses %g s", o->slow_rank, o->slow_add_s);
        else fprintf(f, "; rank %d slowed %gx", o->slow_rank, o->slow_factor);
        if (o->slow_last < INT32_MAX) fprintf(f, " on steps %ld-%ld", o->slow_first, o->slow_last);
    }
    fprintf(f, "\n");
}

/* Appends " r0 C0 r1 C1 ..." (samples per compute second of each rank) to buf and returns their
 * sum over the global batch: the steps/s of the ideal. */
static double format_capacities(const trainer *t, const double *compute, const int64_t *samples, char *buf, size_t n) {
    double cap = 0;
    size_t k = strlen(buf);
    for (int i = 0; i < t->nranks; i++) {
        double c = compute[i] > 0 ? (double)samples[i] / compute[i] : 0;
        cap += c;
        if (k < n) k += (size_t)snprintf(buf + k, n - k, " r%d %.1f", i, c);
    }
    return cap / (double)t->o.batch;
}

void train_balance_free(trainer *t) {
    train_bal *b = t->bal;
    if (!b) return;
    if (t->rank == 0 && b->steps > 0) {
        /* measured capacities over the judged steps, and what they add up to */
        char line[4096] = "straggler: capacity (samples/s of compute)";
        double ideal = format_capacities(t, b->rank_compute, b->rank_samples, line, sizeof line);
        train_note(t, "%s; ideal %.3f steps/s; %lld actions; %.1f ms per step besides the slowest rank's compute", line,
                   ideal, (long long)adt_straggler_actions(b->mon), 1e3 * (b->step_s - b->slowest_s) / (double)b->steps);
        /* the same at the split the run ends with (each rank's samples/s at its final local batch) */
        if (b->fin_steps > 0) {
            size_t k = (size_t)snprintf(line, sizeof line, "straggler: capacity at the final split");
            for (int i = 0; i < t->nranks && k < sizeof line; i++)
                k += (size_t)snprintf(line + k, sizeof line - k, "%s%lld", i ? "/" : " ", (long long)b->split[i]);
            if (k < sizeof line) snprintf(line + k, sizeof line - k, " (%ld steps)", b->fin_steps);
            ideal = format_capacities(t, b->fin_compute, b->fin_samples, line, sizeof line);
            train_note(t, "%s; ideal %.3f steps/s", line, ideal);
        }
    }
    for (int i = 0; i < BAL_CACHE; i++) bal_exec_free(&b->cache[i]);
    adt_straggler_free(b->mon);
    free(b->u_param), free(b->u_grad), free(b->elems), free(b->split), free(b->times);
    free(b->rank_compute), free(b->rank_samples), free(b->split32);
    free(b->fin_compute), free(b->fin_samples), free(b->prev_split);
    free(b->seq), free(b->ready), free(b->req);
    free(b);
    t->bal = NULL;
}

/* ---- the step ---------------------------------------------------------------------------------- */

/* This rank's passes over its samples idx[0..n): the update graph's gradient inputs get
 * sum (s/B) g_pass (bal_after_node), loss_w = sum (s/B) loss; the gradients' all-reduces are
 * started (each as soon as its sum is final) but not waited for. */
static int run_passes(trainer *t, long step, int64_t *idx, int64_t n) {
    train_bal *b = t->bal;
    const double B = (double)t->o.batch;
    int64_t m = t->o.bal.micro_batch > 0 ? t->o.bal.micro_batch : n;
    int64_t k = (n + m - 1) / m; /* passes, of q or q+1 samples */
    int64_t q = n / k, r = n % k;
    b->loss_w = 0;
    b->n_started = 0, b->cb_rc = 0;
    memset(b->ready, 0, (size_t)b->n_param);
    float lr = *(const float *)adt_exec_data(t->ex, t->g->lr_input);
    for (int64_t p = 0, off = 0; p < k; p++) {
        int s = (int)(q + (p < r));
        bal_exec *c;
        int rc = bal_exec_get(t, s, step, &c);
        if (rc) return rc;
        if (train_source_fill(&t->train, idx + off, s, adt_exec_data(c->ex, c->io.input),
                              c->io.input2 >= 0 ? adt_exec_data(c->ex, c->io.input2) : NULL,
                              adt_exec_data(c->ex, c->io.label)))
            return train_fail(EXIT_RUNTIME, "--data: %s", adt_error_message());
        adt_exec_set_lr_step(c->ex, lr, (int32_t)step);
        b->cur = c, b->cur_w = (float)((double)s / B), b->cur_first = p == 0, b->cur_last = p == k - 1;
        if (adt_exec_run(c->ex) || b->cb_rc) return train_fail(EXIT_RUNTIME, "step %ld: %s", step, adt_error_message());
        b->loss_w += b->cur_w * *(const float *)adt_exec_data(c->ex, c->io.loss);
        off += s;
    }
    if (t->world && start_ready(t)) /* every sum is final after the last pass: none left unstarted */
        return train_fail(EXIT_RUNTIME, "step %ld: summing the gradients: %s", step, adt_error_message());
    return 0;
}

static void log_action_line(trainer *t, const adt_straggler_action *act, const char *by);
static void log_action(trainer *t, const adt_straggler_action *act) {
    if (t->rank != 0) return;
    const char *kind = act->kind == ADT_ACTION_RESTART ? "restart" : "rebalance";
    train_note(t, "straggler: step %ld: %s%s (rank %d): %s", act->step, kind,
               act->kind == ADT_ACTION_RESTART && t->world ? " advised, not possible under mpiexec; rebalanced" : "",
               act->rank, act->why);
    log_action_line(t, act, "ranks");
}

/* The action's JSON log line: who decided it, the split it set, every rank's state. */
static void log_action_line(trainer *t, const adt_straggler_action *act, const char *by) {
    train_log_action(t, act, by, t->bal->split, t->nranks, t->bal->mon);
}

/* Rank 0: the step's timings to the master, whose split (and action) comes back. A master that
 * cannot be reached or refuses leaves the split as it is (said once). */
static void ask_master(trainer *t, long step, double loss) {
    train_bal *b = t->bal;
    int n = t->nranks;
    size_t cap = 256 + (size_t)n * 96;
    char *body = adt_malloc(cap);
    int k = snprintf(body, cap, "{\"generation\":%lld,\"step\":%ld,\"remaining_steps\":%ld,\"loss\":%.9g,"
                     "\"compute_s\":[", (long long)b->generation, step, t->o.steps - step, isfinite(loss) ? loss : -1.0);
    for (int i = 0; i < n; i++) k += snprintf(body + k, cap - (size_t)k, "%s%.9g", i ? "," : "", b->times[i]);
    k += snprintf(body + k, cap - (size_t)k, "],\"samples\":[");
    for (int i = 0; i < n; i++) k += snprintf(body + k, cap - (size_t)k, "%s%.0f", i ? "," : "", b->times[n + i]);
    k += snprintf(body + k, cap - (size_t)k, "],\"split\":[");
    for (int i = 0; i < n; i++) k += snprintf(body + k, cap - (size_t)k, "%s%lld", i ? "," : "", (long long)b->split[i]);
    snprintf(body + k, cap - (size_t)k, "]}");
    int status = 0;
    char *reply = NULL;
    int rc = adt_master_call(t->o.bal.master, getenv("ADT_JOB_TOKEN"), "POST", "/v1/straggler/report", body, 5.0,
                             &status, &reply);
    free(body);
    cJSON *r = !rc && status == 200 && reply ? cJSON_Parse(reply) : NULL;
    const cJSON *sp = cJSON_GetObjectItemCaseSensitive(r, "split"), *act = cJSON_GetObjectItemCaseSensitive(r, "action");
    int64_t got[ADT_STRAGGLER_MAX_RANKS], sum = 0;
    int ok = cJSON_IsArray(sp) && cJSON_GetArraySize(sp) == n;
    for (int i = 0; ok && i < n; i++) {
        const cJSON *x = cJSON_GetArrayItem(sp, i);
        ok = cJSON_IsNumber(x) && x->valuedouble >= 1;
        got[i] = ok ? (int64_t)x->valuedouble : 0, sum += got[i];
    }
    if (ok && sum == t->o.batch) {
        memcpy(b->split, got, (size_t)n * sizeof *got);
        if (cJSON_IsObject(act)) {
            const cJSON *why = cJSON_GetObjectItemCaseSensitive(act, "why"), *kind = cJSON_GetObjectItemCaseSensitive(act, "kind");
            const cJSON *rank = cJSON_GetObjectItemCaseSensitive(act, "rank"), *gain = cJSON_GetObjectItemCaseSensitive(act, "gain");
            const char *kname = cJSON_IsString(kind) ? kind->valuestring : "action";
            train_note(t, "straggler: step %ld: the master's %s: %s", step, kname, cJSON_IsString(why) ? why->valuestring : "");
            adt_straggler_action a = {.kind = !strcmp(kname, "restart") ? ADT_ACTION_RESTART : ADT_ACTION_REBALANCE,
                                      .rank = cJSON_IsNumber(rank) ? (int)rank->valuedouble : -1,
                                      .step = step, .gain = cJSON_IsNumber(gain) ? gain->valuedouble : 0};
            log_action_line(t, &a, "master");
        }
    } else if (!b->master_warned) {
        b->master_warned = 1;
        train_note(t, "straggler: --straggler-master %s: %s; the split stays as it is", t->o.bal.master,
                   rc ? adt_error_message() : reply ? reply : "no reply");
    }
    cJSON_Delete(r);
    free(reply);
}

int train_balance_step(trainer *t, long step, int64_t *idx, double *loss) {
    train_bal *b = t->bal;
    const adt_train_balance_opts *o = &t->o.bal;
    int n = t->nranks, me = t->rank;
    int64_t first = 0;
    for (int i = 0; i < me; i++) first += b->split[i];
    double t0 = adt_now_s();
    int slow = me == o->slow_rank && step >= o->slow_first && step <= o->slow_last;
    b->slowing = slow && o->slow_factor > 1;
    b->slow_mark = t0, b->slow_debt = 0, b->slept = 0, b->make_s = 0;
    int rc = run_passes(t, step, idx + first, b->split[me]);
    b->slowing = 0;
    if (rc) return rc;
    double compute = adt_now_s() - t0 - b->make_s;
    if (slow) { /* the rest of FACTOR x the work (and what ran outside the nodes), then any pause */
        adt_sleep_s((o->slow_factor - 1) * (compute - b->slept) - b->slept + o->slow_add_s);
        compute = adt_now_s() - t0 - b->make_s;
    }
    b->last_compute_s = compute;
    /* the gradients' all-reduces (started in the passes) done, then every rank's timing and the
     * loss summed */
    double c0 = adt_now_s();
    memset(b->times, 0, (2 * (size_t)n + 1) * sizeof *b->times);
    b->times[me] = compute, b->times[n + me] = (double)b->split[me], b->times[2 * n] = b->loss_w;
    if (t->world && adt_comm_waitall(b->req, b->n_param))
        return train_fail(EXIT_RUNTIME, "step %ld: summing the gradients: %s", step, adt_error_message());
    if (t->world && adt_comm_allreduce_f64(t->world, b->times, 2 * n + 1))
        return train_fail(EXIT_RUNTIME, "step %ld: summing the timings: %s", step, adt_error_message());
    b->comm_s += adt_now_s() - c0;
    b->compute_s += compute;
    if (adt_exec_run(t->ex)) return train_fail(EXIT_RUNTIME, "step %ld: update: %s", step, adt_error_message());
    *loss = b->times[2 * n];
    double step_s = adt_now_s() - t0;

    /* the monitor and controller: the same inputs on every rank, so the same decision */
    int64_t samples[ADT_STRAGGLER_MAX_RANKS];
    /* the capacities are summed over the steps the monitor judges (not the warmup, which makes
     * the executors), as the controller sees them, unless the run is all warmup */
    int judged = step > b->cfg.warmup_steps || t->o.steps <= b->cfg.warmup_steps;
    double slowest = 0;
    for (int i = 0; i < n; i++) {
        samples[i] = (int64_t)b->times[n + i];
        if (judged) b->rank_compute[i] += b->times[i], b->rank_samples[i] += samples[i];
        slowest = fmax(slowest, b->times[i]);
    }
    if (judged) {
        b->step_s += step_s - b->make_s, b->slowest_s += slowest, b->steps++;
        for (int i = 0; i < n; i++) b->fin_compute[i] += b->times[i], b->fin_samples[i] += samples[i];
        b->fin_steps++;
    }
    memcpy(b->prev_split, b->split, (size_t)n * sizeof *b->split);
    adt_straggler_action act;
    if (adt_straggler_observe(b->mon, step, ADT_PHASE_TRAIN, b->times, samples, b->split, t->o.steps - step, &act))
        return train_fail(EXIT_RUNTIME, "straggler monitor: %s", adt_error_message());
    if (act.kind != ADT_ACTION_NONE) log_action(t, &act);
    if (o->master) {
        if (me == 0) ask_master(t, step, *loss);
        for (int i = 0; i < n; i++) b->split32[i] = (int32_t)b->split[i];
        if (t->world && adt_comm_bcast(t->world, b->split32, n, ADT_I32, 0))
            return train_fail(EXIT_RUNTIME, "step %ld: the split from rank 0: %s", step, adt_error_message());
        for (int i = 0; i < n; i++) b->split[i] = b->split32[i];
    }
    if (memcmp(b->prev_split, b->split, (size_t)n * sizeof *b->split)) { /* a new split: measured afresh */
        memset(b->fin_compute, 0, (size_t)n * sizeof *b->fin_compute);
        memset(b->fin_samples, 0, (size_t)n * sizeof *b->fin_samples);
        b->fin_steps = 0;
    }
    return 0;
}

int64_t train_local_batch(const trainer *t) {
    if (t->ps) return train_ps_local_batch(t);
    if (t->bal) return t->bal->split[t->rank];
    return t->o.batch / t->nranks + (t->rank < t->o.batch % t->nranks);
}

const int64_t *train_balance_split(const trainer *t) { return t->bal->split; }

double train_balance_compute_s(const trainer *t) {
    if (t->ps) return train_ps_compute_s(t); /* the parameter-server workers are the replicas */
    return t->bal ? t->bal->last_compute_s : -1;
}

void train_balance_set_split(trainer *t, const int64_t *split, long step) {
    train_bal *b = t->bal;
    int n = t->nranks;
    if (!memcmp(b->split, split, (size_t)n * sizeof *split)) return;
    memcpy(b->split, split, (size_t)n * sizeof *split);
    memset(b->fin_compute, 0, (size_t)n * sizeof *b->fin_compute); /* a new split: measured afresh */
    memset(b->fin_samples, 0, (size_t)n * sizeof *b->fin_samples);
    b->fin_steps = 0;
    char text[256];
    size_t k = 0;
    for (int r = 0; r < n && k < sizeof text; r++) k += (size_t)snprintf(text + k, sizeof text - k, "%s%lld", r ? "/" : "", (long long)split[r]);
    train_note(t, "straggler: step %ld: the master's split %s", step, text);
    adt_straggler_action a = {.kind = ADT_ACTION_REBALANCE, .rank = -1, .step = step};
    log_action_line(t, &a, "master");
}

void train_balance_adopt_split(trainer *t, const char *text) {
    int64_t got[ADT_STRAGGLER_MAX_RANKS], sum = 0;
    int n = 0;
    const char *p = text;
    while (*p && n < ADT_STRAGGLER_MAX_RANKS) {
        char *end;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 1) return;
        got[n++] = v, sum += v;
        p = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return;
    }
    if (n != t->nranks || sum != t->o.batch) return;
    memcpy(t->bal->split, got, (size_t)n * sizeof *got);
    train_note(t, "straggler: the split of the checkpoint, %s, restored", text);
}

static void balance_free(trainer *t) {
    train_balance_free(t);
    adt_exec_free(t->ex);
    t->ex = NULL;
}

const train_runner train_runner_balance = {"balanced data parallel", train_balance_build, train_balance_executor,
                                           train_balance_step, NULL, train_balance_banner, balance_free, NULL};
