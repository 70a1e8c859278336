/*
 * ps.c - the parameter-server mode priced (planner.h, "parameter-server mode"): a DLRM's tables on
 * S server ranks, W = devices - S workers (adtrain train --mode ps, src/train/ps.c, src/ps/).
 *
 * What a synchronous step costs, in the order it happens on a worker:
 *  - compute: the dense part of the training graph at the worker's B/W samples (every node but the
 *    embedding lookups, their backward and the tables' updates), each on the cluster's roofline,
 *    plus the worker's samples produced (input_s each, twice: when its rows are pulled and when
 *    it runs) and the pulled rows copied into batch order;
 *  - push: the worker's distinct rows, each an 8-byte id and its gradient, to the servers; the
 *    servers sum the W workers' pushes per row and update every row the batch touched (Adam: read
 *    weight, moments and gradient, write three: 7 values a row; SGD 3), memory-bound, each row
 *    array moved in whole cache lines and found through one hash-slot line;
 *  - pull: the next step's rows come back once every push is applied (sync: a pull of step s is
 *    answered after all pushes of s-1); with prefetch its ids left during the compute;
 *  - the dense gradients all-reduced among the workers.
 * A transfer costs its bytes over the busier end's NIC (a worker's own rows, or a server's share
 * of every worker's: rows are hashed evenly over the servers) plus a latency per message that end
 * handles. Distinct rows of a table among n draws: sum over rows of 1 - (1 - p_r)^n.
 * Under ssp:K and async (ps_schedule) the push, update and pull of a step can run behind the
 * compute of the steps before it, and each push is applied apart.
 */
#include <math.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/models.h"
#include "adtrain/ops.h"
#include "adtrain/planner.h"

#define PS_ID_BYTES 8.0  /* ids travel as int64 (src/ps/ps_internal.h) */
#define PS_ROW_EXTRA 24.0 /* a stored row's hash slot and bookkeeping (src/ps/README.md) */
#define PS_LINE_BYTES 64.0 /* a cache line: what a random row access moves at least */
#define PS_EXACT_ROWS 4096 /* rows summed one by one; the rest by the integral (zipf_tail) */

/* 1 - (1 - p)^n without cancellation for small p */
static double touched(double p, double n) { return p >= 1 ? 1 : -expm1(n * log1p(-p)); }

/* sum_{k=a}^{b} (1 - (1 - c k^-s)^n) for a Zipf tail: the integral of the summand over [a-1/2,
 * b+1/2] on a log grid (the summand is smooth and monotone there). */
static double zipf_tail(double c, double s, double n, double a, double b) {
    const int steps = 400;
    double lo = log(a - 0.5), hi = log(b + 0.5), h = (hi - lo) / steps, sum = 0;
    for (int i = 0; i <= steps; i++) {
        double x = exp(lo + i * h), f = touched(c * pow(x, -s), n) * x; /* dx = x dlog x */
        sum += (i == 0 || i == steps ? 0.5 : 1.0) * f;
    }
    return sum * h;
}

double adt_ps_expected_distinct(const adt_ps_ids *law, int64_t rows, double n) {
    if (rows <= 0 || !(n > 0)) return 0;
    double R = (double)rows;
    if (!law || law->kind == ADT_PS_IDS_UNIFORM) return R * touched(1.0 / R, n);
    if (law->kind == ADT_PS_IDS_SQUARE) {
        /* value c in [0, V) with P = sqrt((c+1)/V) - sqrt(c/V); distinct values hashed onto the
         * rows as by a random function: k values cover R (1 - (1 - 1/R)^k) rows */
        double V = law->param, k = 0;
        for (long c = 0; c < (long)V; c++) k += touched(sqrt((c + 1) / V) - sqrt(c / V), n);
        return R * touched(1.0 / R, k);
    }
    double s = law->param, H = 0;
    int64_t exact = rows < PS_EXACT_ROWS ? rows : PS_EXACT_ROWS;
    for (int64_t k = 1; k <= exact; k++) H += pow((double)k, -s);
    if (rows > exact) { /* the normaliser's tail: the integral of x^-s over [exact + 1/2, R + 1/2] */
        double a = exact + 0.5, b = R + 0.5;
        H += fabs(s - 1) < 1e-12 ? log(b / a) : (pow(b, 1 - s) - pow(a, 1 - s)) / (1 - s);
    }
    double c = 1.0 / H, d = 0;
    for (int64_t k = 1; k <= exact; k++) d += touched(c * pow((double)k, -s), n);
    if (rows > exact) d += zipf_tail(c, s, n, (double)exact + 1, R);
    return d;
}

static int is_table_value(const adt_graph *g, int v) { return v >= 0 && !strncmp(g->values[v].name, "emb.", 4); }

/* A worker's dense step at `bw` samples: its graph's nodes but the tables' (module comment).
 * *dense_params: the parameters outside the tables. */
static int dense_step(const adt_model_cfg *m, const adt_cluster *c, int bw, adt_optim_kind optim, double *time_s,
                      double *dense_params) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    int rc = adt_model_build(g, m, bw, &io);
    if (!rc) {
        adt_optim_cfg oc = optim == ADT_OPTIM_SGD ? adt_optim_sgd(0, 0) : adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0);
        adt_graph_backward(g, io.loss);
        adt_graph_optimizer(g, &oc);
        if (adt_graph_error(g)) rc = adt_error(ADT_ERR_ARG, "the training graph: %s", adt_graph_error_message(g));
    }
    double t = 0, P = 0;
    for (int i = 0; !rc && i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->op == ADT_OP_EMBEDDING || n->op == ADT_OP_EMBEDDING_BWD) continue;
        if ((n->op == ADT_OP_ADAMW || n->op == ADT_OP_SGD) && n->n_in > 0 && is_table_value(g, n->in[0])) continue;
        t += adt_cluster_op_time(c, n->op, adt_node_flops(g, n), adt_node_bytes(g, n));
    }
    for (int v = 0; !rc && v < g->n_values; v++)
        if (g->values[v].role == ADT_ROLE_PARAM && !is_table_value(g, v)) P += (double)adt_shape_numel(&g->values[v].shape);
    adt_graph_free(g);
    *time_s = t, *dense_params = P;
    return rc;
}

/* A step's waits under the staleness clock (src/ps/clock.c, server.c; the worker loop in
 * src/train/ps.c): each step the worker pulls the rows of step s + prefetch, waits for step s's,
 * computes, pushes, all-reduces the dense gradients; a server answers the pull of step s once the
 * slowest worker pushed step s - K - 1 (sync K = 0, async no bound) and applies pushes as they
 * come. So step s's answer can be made as soon as both its request (sent at the start of step
 * s - prefetch) and the push it waits for (end of step s - K - 1) are in: L = min(K, prefetch)
 * steps ahead (sync 0: the whole round trip, push + update + pull, is waited for every step).
 * Answers L steps ahead hide the round trip R behind L steps: in the steady state
 * T = C + max(0, R - L T), i.e. T = max(C, (C + R) / (L + 1)), C the worker's own work. What
 * staleness cannot hide: a server's own work per step (its updates and answers), a floor of T.
 * The workers stay in step anyway (the dense all-reduce, the loss), so the slowest worker's
 * barrier is not priced apart: the model's workers are alike. serve_s: a server's answers. */
static void ps_schedule(const adt_ps_opts *o, adt_ps_report *r, double serve_s) {
    int K = o->staleness == ADT_PS_COST_ASYNC ? o->prefetch : o->staleness;
    r->lookahead = K < o->prefetch ? K : o->prefetch;
    double C = r->compute_s + r->dense_s, R = r->push_s + r->update_s + r->pull_s, T;
    r->round_s = R;
    if (r->lookahead == 0) T = C + R;
    else T = fmax(C, (C + R) / (r->lookahead + 1));
    r->server_s = r->update_s + serve_s;
    r->step_s = fmax(T, r->server_s);
    r->wait_s = r->step_s - C;
}

static int ps_price(const adt_model_cfg *m, const adt_cluster *c, const adt_ps_opts *o, int S, adt_ps_report *r) {
    const adt_dlrm_cfg *d = &m->dlrm;
    int N = o->devices, W = N - S;
    memset(r, 0, sizeof *r);
    r->servers = S, r->workers = W;
    /* the largest worker share: the block split gives the first B % W workers one more */
    int bw = o->batch / W + (o->batch % W != 0);
    double row_b = 4.0 * d->emb_dim, rows_w = 0, rows_b = 0, stored = 0;
    for (int t = 0; t < d->n_tables; t++) {
        const adt_ps_ids *law = o->ids ? &o->ids[t] : NULL;
        rows_w += adt_ps_expected_distinct(law, d->table_rows[t], bw);
        rows_b += adt_ps_expected_distinct(law, d->table_rows[t], o->batch);
        stored += d->table_rows[t];
    }
    r->rows_worker = rows_w, r->rows_step = rows_b;
    r->pull_bytes = rows_w * (PS_ID_BYTES + row_b);
    r->push_bytes = rows_w * (PS_ID_BYTES + row_b);
    r->server_bytes = (double)W * (r->pull_bytes + r->push_bytes) / S;
    double dense_p, work;
    int rc = dense_step(m, c, bw, o->optim, &work, &dense_p);
    if (rc) return rc;
    double mem_bw = c->memory_bw * (c->memory_fraction > 0 ? c->memory_fraction : 1.0);
    /* + the worker's samples produced twice (the trainer fills a step's batch when it pulls its
     * rows ahead and again when it runs it: the cluster's input price) and its rows put in batch
     * order */
    work += 2 * c->input_s * bw + 2 * rows_w * row_b / mem_bw;
    /* the link joining a server and a worker: the outermost level the ranks span */
    const adt_link *k = &c->link[adt_cluster_level(c, 0, N - 1)];
    double bw_link = k->bandwidth, lat = k->latency;
    double reply = rows_w * row_b, ask = rows_w * PS_ID_BYTES;
    double pull_path = o->prefetch > 0 ? reply : reply + ask; /* with prefetch the ids left earlier */
    double wk = pull_path / bw_link + S * lat, sv = (double)W * pull_path / S / bw_link + W * lat;
    r->pull_s = (wk > sv ? wk : sv) + lat;
    wk = r->push_bytes / bw_link + S * lat, sv = (double)W * r->push_bytes / S / bw_link + W * lat;
    r->push_s = wk > sv ? wk : sv;
    /* rows are touched at random: each array of a row moves whole cache lines, and finding it
     * costs its hash slot's line */
    double line = PS_LINE_BYTES * ceil(row_b / PS_LINE_BYTES), per_row = o->optim == ADT_OPTIM_SGD ? 3.0 : 7.0;
    double pushed = (double)W * rows_w / S, update; /* rows a server receives per step, all workers */
    if (o->staleness == 0) /* sync: the pushes summed into one buffer (2 lines a pushed row), each row updated once */
        update = (rows_b / S * (per_row * line + PS_LINE_BYTES) + 2.0 * pushed * line) / mem_bw;
    else /* ssp, async: each push applied as it comes, a row as often as workers pushed it */
        update = pushed * (per_row * line + PS_LINE_BYTES + 2.0 * line) / mem_bw;
    double serve = pushed * (PS_LINE_BYTES + line) / mem_bw; /* the answers: a hash slot and the row each */
    r->dense_s = adt_cluster_coll_time(c, adt_cluster_level(c, S, N - 1), ADT_BOXING_ALL_REDUCE, W, 4.0 * dense_p, N);
    /* Ranks that share a node's cores: a server naps between messages (src/ps/server.c), so the
     * load is the W workers and the servers' busy part of a step, which depends on the step: a
     * few rounds of the fixed point from idle servers. A blocked wait among ranks time-sharing
     * the cores loses what the calibration measured for one after that much compute: the
     * workers' dense all-reduce after the step's compute, and the rows' wait (the round trip's
     * part) after the batch filled since the last all-reduce. 0 on a cluster of its own cores. */
    double dense_coll = r->dense_s, load = W, pull = r->pull_s;
    for (int it = 0; it < 4; it++) {
        double share = adt_cluster_share_load(c, load);
        r->compute_s = work * share, r->update_s = update * share;
        r->dense_s = dense_coll + (W > 1 ? adt_cluster_sync_loss(c, N, r->compute_s, 1) : 0);
        r->pull_s = pull + adt_cluster_sync_loss(c, N, 2 * c->input_s * bw * share, 1);
        ps_schedule(o, r, serve * share);
        load = W + S * fmin(1.0, r->server_s / r->step_s);
    }
    double opt_vals = o->optim == ADT_OPTIM_SGD ? 1.0 : 3.0; /* weight (+ Adam's two moments) */
    r->server_mem_bytes = stored / S * (opt_vals * row_b + PS_ROW_EXTRA);
    r->worker_mem_bytes = 4.0 * dense_p * (o->optim == ADT_OPTIM_SGD ? 2 : 4) + (o->prefetch + 1.0) * rows_w * row_b;
    double lim = o->mem_limit > 0 ? o->mem_limit : c->memory_bytes;
    r->feasible = r->server_mem_bytes <= lim && r->worker_mem_bytes <= lim;
    return ADT_OK;
}

int adt_ps_cost(const adt_model_cfg *m, const adt_cluster *c, const adt_ps_opts *o, adt_ps_report *out) {
    if (m->type != ADT_MODEL_DLRM)
        return adt_error(ADT_ERR_ARG, "the parameter-server mode holds a DLRM's embedding tables; this model is '%s'",
                         adt_model_type_name(m->type));
    if (o->devices < 2 || o->devices > adt_cluster_devices(c))
        return adt_error(ADT_ERR_ARG, "--devices %d: the parameter-server mode needs 2 to %d (servers and workers)",
                         o->devices, adt_cluster_devices(c));
    if (o->staleness < ADT_PS_COST_ASYNC)
        return adt_error(ADT_ERR_ARG, "--ps-sync: staleness %d, expected sync (0), ssp:K (K > 0) or async", o->staleness);
    if (o->prefetch < 0) return adt_error(ADT_ERR_ARG, "--ps-prefetch %d: expected 0 or more steps", o->prefetch);
    if (o->servers < 0 || o->servers >= o->devices)
        return adt_error(ADT_ERR_ARG, "--ps-servers %d: expected 1 to %d on %d devices (one worker at least)", o->servers,
                         o->devices - 1, o->devices);
    int lo = o->servers ? o->servers : 1, hi = o->servers ? o->servers : o->devices - 1, found = 0;
    adt_ps_report r;
    for (int S = lo; S <= hi; S++) {
        if (o->batch < o->devices - S) continue; /* a worker without samples */
        int rc = ps_price(m, c, o, S, &r);
        if (rc) return rc;
        /* the fastest feasible, else the one of least server memory */
        int better = !found || (r.feasible && !out->feasible) ||
                     (r.feasible == out->feasible && (r.feasible ? r.step_s < out->step_s
                                                                 : r.server_mem_bytes < out->server_mem_bytes));
        if (better) *out = r, found = 1;
    }
    if (!found)
        return adt_error(ADT_ERR_ARG, "--batch %d: fewer samples than the workers of every server count on %d devices",
                         o->batch, o->devices);
    return ADT_OK;
}
