/*
 * exec.c - runs a training graph: one state block, one planned arena, one scratch buffer, and
 * the nodes in order through the op registry's kernels; communication nodes through the hook,
 * split into start and wait around the computation when the hook allows (schedule below).
 */
#include "adtrain/exec.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"
#include "adtrain/ops.h"

/* One event of a split schedule: run a compute node, start a communication node, or wait for it. */
enum { EV_RUN, EV_START, EV_WAIT };
typedef struct sched_ev {
    int kind, node;
} sched_ev;

struct adt_exec {
    const adt_graph *g;
    adt_exec_opts o;
    adt_memplan mp;
    char *arena, *state;
    float *scratch;
    void **ptr; /* [n_values] */
    double *node_s;
    /* split communication (hook with start / test / finish, and not comm_sync) */
    int split;
    sched_ev *ev, *fev; /* the whole step; the forward pass only */
    int n_ev, n_fev;
    int *pend, n_pend;    /* started communication nodes not finished yet, in start order */
    unsigned char *done;  /* [n_nodes] completion seen by a poll                          */
    double *t_start;      /* [n_nodes] when the start returned                            */
    double *t_done;       /* [n_nodes] when a poll saw it complete                        */
    adt_exec_stats last, total;
};

static int node_phase(const adt_node *n) { return n->is_optimizer ? 2 : n->is_backward ? 1 : 0; }
static int is_comm(const adt_graph *g, int i) { return adt_op_get(g->nodes[i].op)->is_comm; }

/* ---- the split schedule ----------------------------------------------------------------------
 * Built once: node order with every communication node started as soon as its input is ready and
 * waited for just before the first node that reads its output (or updates its input in place).
 * `order` lists the started and run nodes (the memory plan's positions) and read_until[p] the
 * position before which node order[p]'s wait comes, so that its buffers outlive the transfer.
 */
typedef struct sched {
    const adt_graph *g;
    sched_ev *ev;
    int n_ev;
    int *order, n_order, *pos, *read_until;
    int *pend, n_pend;
    unsigned char *started;
    int *comm_nodes, n_comm;
} sched;

static int root_of(const adt_graph *g, int v) {
    while (g->values[v].alias_of >= 0) v = g->values[v].alias_of;
    return v;
}

static void emit(sched *s, int kind, int node) {
    s->ev[s->n_ev++] = (sched_ev){kind, node};
    if (kind == EV_WAIT) {
        s->read_until[s->pos[node]] = s->n_order; /* in flight until just before the next position */
        int j = 0;
        while (s->pend[j] != node) j++;
        memmove(s->pend + j, s->pend + j + 1, (size_t)(s->n_pend - j - 1) * sizeof *s->pend);
        s->n_pend--;
        return;
    }
    s->pos[node] = s->n_order;
    s->read_until[s->n_order] = s->n_order;
    s->order[s->n_order++] = node;
    if (kind == EV_START) {
        s->started[node] = 1;
        s->pend[s->n_pend++] = node;
    }
}

/* Waits for every pending collective node i depends on: one whose output it reads, or (an
 * in-place update) one whose input shares storage with what it overwrites. */
static void wait_for(sched *s, int i) {
    const adt_graph *g = s->g;
    const adt_node *n = &g->nodes[i];
    int inplace = adt_op_get(n->op)->inplace;
    for (int j = 0; j < s->n_pend;) {
        const adt_node *b = &g->nodes[s->pend[j]];
        int dep = 0;
        for (int k = 0; k < n->n_in && !dep; k++)
            dep = n->in[k] == b->out[0] || (inplace && root_of(g, n->in[k]) == root_of(g, b->in[0]));
        if (dep) emit(s, EV_WAIT, s->pend[j]); /* removes entry j */
        else j++;
    }
}

/* A collective may start right after its input's producer unless the input is a leaf (it starts
 * where the partitioner put it) or a forward value that a later phase reads (it would hold a
 * buffer across the whole forward pass). */
static int hoistable(const adt_graph *g, int c) {
    int p = g->values[g->nodes[c].in[0]].producer;
    if (p < 0 || is_comm(g, p)) return 0;
    return !(node_phase(&g->nodes[p]) == 0 && node_phase(&g->nodes[c]) != 0);
}

static void start_readers(sched *s, int i) {
    const adt_node *n = &s->g->nodes[i];
    for (int j = 0; j < s->n_comm; j++) {
        int c = s->comm_nodes[j];
        if (c <= i || s->started[c] || !hoistable(s->g, c)) continue;
        for (int k = 0; k < n->n_out; k++)
            if (s->g->nodes[c].in[0] == n->out[k]) {
                emit(s, EV_START, c);
                break;
            }
    }
}

/* Key of an optimizer node: the latest start among the collectives it waits for. */
static int ready_key(const sched *s, int i) {
    const adt_node *n = &s->g->nodes[i];
    int key = -1;
    for (int j = 0; j < s->n_pend; j++)
        for (int k = 0; k < n->n_in; k++)
            if (n->in[k] == s->g->nodes[s->pend[j]].out[0] && j > key) key = j;
    return key;
}

/* From node i0 on, the optimizer updates only, every collective they wait for already started:
 * they are independent, so run them in the order their collectives started. 1 when done. */
static int run_updates_by_arrival(sched *s, int i0) {
    const adt_graph *g = s->g;
    int n = g->n_nodes - i0;
    for (int i = i0; i < g->n_nodes; i++)
        if (is_comm(g, i) ? !s->started[i] : !g->nodes[i].is_optimizer) return 0;
    int *ids = adt_malloc((size_t)n * sizeof *ids), *key = adt_malloc((size_t)n * sizeof *key), m = 0;
    for (int i = i0; i < g->n_nodes; i++)
        if (!is_comm(g, i)) ids[m] = i, key[m++] = ready_key(s, i);
    for (int a = 1; a < m; a++) /* stable insertion sort by key */
        for (int b = a; b > 0 && key[b - 1] > key[b]; b--) {
            int t = key[b]; key[b] = key[b - 1]; key[b - 1] = t;
            t = ids[b]; ids[b] = ids[b - 1]; ids[b - 1] = t;
        }
    for (int a = 0; a < m; a++) {
        wait_for(s, ids[a]);
        emit(s, EV_RUN, ids[a]);
    }
    free(ids);
    free(key);
    return 1;
}

/* share[] for the memory plan: the output of an all-reduce step whose input nothing else reads
 * (a partial gradient) takes the input's buffer, when the hook allows; NULL if none does. */
static int *inplace_allreduces(const adt_graph *g) {
    int *share = NULL, *readers = adt_calloc((size_t)(g->n_values + 1), sizeof *readers);
    for (int i = 0; i < g->n_nodes; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) readers[root_of(g, g->nodes[i].in[k])]++;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (!is_comm(g, i) || (n->a.i[0] & 0xff) != ADT_BOXING_ALL_REDUCE) continue; /* ops.h: i0 = kind | ... */
        /* the input may be a view (a reshaped gradient): then the views between it and its root
         * are the root's only other readers */
        int r = n->in[0], links = 0, ok = 1;
        for (; g->values[r].alias_of >= 0; r = g->values[r].alias_of, links++) {
            const adt_value *v = &g->values[r];
            ok &= v->producer >= 0 && adt_op_get(g->nodes[v->producer].op)->view_of >= 0 && !v->is_output;
        }
        const adt_value *root = &g->values[r];
        if (!ok || root->producer < 0 || root->is_output || readers[r] != links + 1) continue;
        if (!share) {
            share = adt_malloc((size_t)g->n_values * sizeof *share);
            for (int v = 0; v < g->n_values; v++) share[v] = -1;
        }
        share[n->out[0]] = n->in[0];
    }
    free(readers);
    return share;
}

static void build_schedule(adt_exec *ex, int **order_out, int **read_until_out) {
    const adt_graph *g = ex->g;
    int nn = g->n_nodes;
    sched s = {.g = g};
    s.ev = adt_malloc((size_t)(2 * nn + 1) * sizeof *s.ev);
    s.order = adt_malloc((size_t)(nn + 1) * sizeof *s.order);
    s.pos = adt_calloc((size_t)(nn + 1), sizeof *s.pos);
    s.read_until = adt_calloc((size_t)(nn + 1), sizeof *s.read_until);
    s.pend = adt_malloc((size_t)(nn + 1) * sizeof *s.pend);
    s.started = adt_calloc((size_t)(nn + 1), 1);
    s.comm_nodes = adt_malloc((size_t)(nn + 1) * sizeof *s.comm_nodes);
    for (int i = 0; i < nn; i++)
        if (is_comm(g, i)) s.comm_nodes[s.n_comm++] = i;
    for (int i = 0; i < nn; i++) {
        if (g->nodes[i].is_optimizer && !is_comm(g, i) && run_updates_by_arrival(&s, i)) break;
        if (is_comm(g, i)) {
            if (s.started[i]) continue;
            wait_for(&s, i);
            emit(&s, EV_START, i);
            continue;
        }
        wait_for(&s, i);
        emit(&s, EV_RUN, i);
        start_readers(&s, i);
    }
    while (s.n_pend) emit(&s, EV_WAIT, s.pend[0]);
    ex->ev = s.ev;
    ex->n_ev = s.n_ev;
    ex->fev = adt_malloc((size_t)(s.n_ev + 1) * sizeof *ex->fev);
    for (int e = 0; e < s.n_ev; e++)
        if (node_phase(&g->nodes[s.ev[e].node]) == 0) ex->fev[ex->n_fev++] = s.ev[e];
    *order_out = s.order;
    *read_until_out = s.read_until;
    free(s.pos);
    free(s.pend);
    free(s.started);
    free(s.comm_nodes);
}

int adt_exec_create(adt_exec **out, const adt_graph *g, const adt_exec_opts *opts) {
    *out = NULL;
    if (g->status) return adt_error(g->status, "%s", g->err);
    for (int i = 0; i < g->n_nodes; i++)
        if (adt_op_get(g->nodes[i].op)->is_comm && !(opts && opts->comm && opts->comm->run))
            return adt_error(ADT_ERR_ARG, "node %s communicates, but the executor was given no communicator (adt_exec_opts.comm)",
                             g->nodes[i].name);
    adt_exec *ex = adt_calloc(1, sizeof *ex);
    ex->g = g;
    if (opts) ex->o = *opts;
    if (ex->o.threads > 0) openblas_set_num_threads(ex->o.threads);
    const adt_comm_hook *h = ex->o.comm;
    ex->split = h && h->start && h->test && h->finish && !ex->o.comm_sync;
    int any_comm = 0;
    for (int i = 0; i < g->n_nodes; i++) any_comm |= is_comm(g, i);
    int *share = any_comm && h->inplace_allreduce ? inplace_allreduces(g) : NULL;
    if (ex->split && any_comm) {
        int *order, *read_until;
        build_schedule(ex, &order, &read_until);
        adt_memplan_build_sched(&ex->mp, g, order, g->n_nodes, ex->o.no_reuse, read_until, share);
        free(order);
        free(read_until);
        ex->pend = adt_malloc((size_t)g->n_nodes * sizeof *ex->pend);
        ex->done = adt_calloc((size_t)g->n_nodes, 1);
        ex->t_start = adt_calloc((size_t)g->n_nodes, sizeof *ex->t_start);
        ex->t_done = adt_calloc((size_t)g->n_nodes, sizeof *ex->t_done);
    } else {
        ex->split = 0;
        adt_memplan_build_sched(&ex->mp, g, NULL, g->n_nodes, ex->o.no_reuse, NULL, share);
    }
    free(share);
    ex->arena = adt_alloc_aligned((size_t)ex->mp.arena_bytes);
    ex->state = adt_alloc_aligned((size_t)ex->mp.state_bytes);
    ex->scratch = adt_alloc_aligned((size_t)ex->mp.scratch_bytes);
    ex->ptr = adt_calloc((size_t)g->n_values, sizeof *ex->ptr);
    ex->node_s = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->node_s);
    for (int v = 0; v < g->n_values; v++) { /* a view shares its root's storage */
        int r = ex->mp.root[v];
        if (ex->mp.state_offset[r] >= 0) ex->ptr[v] = ex->state + ex->mp.state_offset[r];
        else if (ex->mp.offset[r] >= 0) ex->ptr[v] = ex->arena + ex->mp.offset[r];
    }
    *out = ex;
    return ADT_OK;
}

void adt_exec_free(adt_exec *ex) {
    if (!ex) return;
    adt_memplan_free(&ex->mp);
    adt_free_aligned(ex->arena);
    adt_free_aligned(ex->state);
    adt_free_aligned(ex->scratch);
    free(ex->ptr);
    free(ex->node_s);
    free(ex->ev);
    free(ex->fev);
    free(ex->pend);
    free(ex->done);
    free(ex->t_start);
    free(ex->t_done);
    free(ex);
}

void *adt_exec_data(adt_exec *ex, int value) {
    if (value < 0 || value >= ex->g->n_values) return NULL;
    return ex->ptr[value];
}

float *adt_exec_f32(adt_exec *ex, const char *name) {
    int v = adt_graph_find_value(ex->g, name);
    if (v < 0 || ex->g->values[v].dtype != ADT_F32) return NULL;
    return ex->ptr[v];
}

/* Global flat index of local element i of a value that is a box of a larger tensor. */
static int64_t global_index(const adt_value *v, int64_t i) {
    int64_t gidx = 0, stride = 1;
    for (int d = v->shape.ndim - 1; d >= 0; d--) {
        int64_t c = i % v->shape.dim[d];
        i /= v->shape.dim[d];
        gidx += (c + v->offset[d]) * stride;
        stride *= v->global_shape.dim[d];
    }
    return gidx;
}

int adt_exec_init_params(adt_exec *ex) {
    const adt_graph *g = ex->g;
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (!adt_role_is_persistent(val->role)) continue;
        float *p = ex->ptr[v];
        int64_t n = adt_shape_numel(&val->shape);
        uint64_t key = adt_rng_key(ex->o.seed, val->name);
        adt_init in = val->role == ADT_ROLE_PARAM ? val->init : (adt_init){ADT_INIT_ZEROS, 0, 0};
        for (int64_t i = 0; i < n; i++) {
            switch (in.kind) {
            case ADT_INIT_ZEROS: p[i] = 0.0f; break;
            case ADT_INIT_ONES: p[i] = 1.0f; break;
            case ADT_INIT_CONST: p[i] = in.a; break;
            case ADT_INIT_NORMAL: p[i] = in.a * adt_rng_normal(key, (uint64_t)global_index(val, i)); break;
            case ADT_INIT_UNIFORM:
                p[i] = in.a + (in.b - in.a) * adt_rng_uniform(key, (uint64_t)global_index(val, i));
                break;
            }
        }
    }
    return ADT_OK;
}

void adt_exec_set_lr_step(adt_exec *ex, float lr, int32_t step) {
    if (ex->g->lr_input >= 0) *(float *)ex->ptr[ex->g->lr_input] = lr;
    if (ex->g->step_input >= 0) *(int32_t *)ex->ptr[ex->g->step_input] = step;
}

static adt_kctx make_kctx(adt_exec *ex, int id, int training, void **in, void **outp) {
    const adt_node *n = &ex->g->nodes[id];
    for (int i = 0; i < n->n_in; i++) in[i] = ex->ptr[n->in[i]];
    for (int k = 0; k < n->n_out; k++) outp[k] = ex->ptr[n->out[k]];
    return (adt_kctx){.g = ex->g, .n = n, .in = in, .out = outp, .scratch = ex->scratch, .seed = ex->o.seed,
                      .training = training, .comm = ex->o.comm};
}

/* A node where it stands: a kernel, or a communication node run to completion. */
static int run_node(adt_exec *ex, int id, int training) {
    void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
    adt_kctx k = make_kctx(ex, id, training, in, outp);
    const adt_comm_hook *h = ex->o.comm;
    double t0 = ex->o.profile ? adt_now_s() : 0;
    int rc = ADT_OK;
    if (!is_comm(ex->g, id)) {
        adt_op_get(k.n->op)->forward(&k);
    } else {
        double c0 = adt_now_s(), c1 = c0;
        if (h->start && h->finish) {
            rc = h->start(h->ctx, &k);
            c1 = adt_now_s();
            if (!rc) rc = h->finish(h->ctx, &k);
        } else {
            rc = h->run(h->ctx, &k);
        }
        double c2 = adt_now_s();
        ex->last.comm_ops++;
        ex->last.comm_start_s += c1 - c0;
        ex->last.comm_wait_s += c2 - c1;
        ex->last.comm_flight_s += c2 - c1;
    }
    if (ex->o.profile) ex->node_s[id] += adt_now_s() - t0;
    return rc;
}

/* Polls the oldest collectives in flight until one is not complete yet: MPI progresses every
 * operation inside any of its calls, so one test moves them all. */
static int poll_pending(adt_exec *ex) {
    const adt_comm_hook *h = ex->o.comm;
    double t0 = adt_now_s();
    int rc = ADT_OK;
    for (int j = 0; j < ex->n_pend && !rc; j++) {
        int b = ex->pend[j];
        if (ex->done[b]) continue;
        void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
        adt_kctx k = make_kctx(ex, b, 1, in, outp);
        int d = 0;
        rc = h->test(h->ctx, &k, &d);
        if (!d) break;
        ex->done[b] = 1;
        ex->t_done[b] = adt_now_s();
    }
    ex->last.comm_poll_s += adt_now_s() - t0;
    return rc;
}

static int run_event(adt_exec *ex, const sched_ev *e, int training) {
    const adt_comm_hook *h = ex->o.comm;
    int b = e->node, rc;
    if (e->kind == EV_RUN) {
        rc = run_node(ex, b, training);
        return rc ? rc : ex->n_pend ? poll_pending(ex) : ADT_OK;
    }
    void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
    adt_kctx k = make_kctx(ex, b, training, in, outp);
    double t0 = adt_now_s();
    if (e->kind == EV_START) {
        rc = h->start(h->ctx, &k);
        ex->t_start[b] = adt_now_s();
        ex->done[b] = 0;
        ex->pend[ex->n_pend++] = b;
        ex->last.comm_ops++;
        ex->last.comm_start_s += ex->t_start[b] - t0;
        if (ex->o.profile) ex->node_s[b] += ex->t_start[b] - t0;
        return rc;
    }
    rc = h->finish(h->ctx, &k);
    double t1 = adt_now_s();
    ex->last.comm_wait_s += t1 - t0;
    ex->last.comm_flight_s += (ex->done[b] ? ex->t_done[b] : t1) - ex->t_start[b];
    if (ex->o.profile) ex->node_s[b] += t1 - t0;
    int j = 0;
    while (j < ex->n_pend && ex->pend[j] != b) j++;
    if (j < ex->n_pend) memmove(ex->pend + j, ex->pend + j + 1, (size_t)(ex->n_pend - j - 1) * sizeof *ex->pend);
    ex->n_pend--;
    return rc;
}

static void stats_add(adt_exec_stats *t, const adt_exec_stats *a) {
    t->runs += a->runs;
    t->comm_ops += a->comm_ops;
    t->run_s += a->run_s;
    t->comm_start_s += a->comm_start_s;
    t->comm_poll_s += a->comm_poll_s;
    t->comm_wait_s += a->comm_wait_s;
    t->comm_flight_s += a->comm_flight_s;
}

/* forward_only: the forward nodes only (evaluation or gradient checks). */
static int exec_run(adt_exec *ex, int forward_only, int training) {
    double t0 = adt_now_s();
    memset(&ex->last, 0, sizeof ex->last);
    ex->last.runs = 1;
    int rc = ADT_OK;
    if (ex->split) {
        const sched_ev *ev = forward_only ? ex->fev : ex->ev;
        int n = forward_only ? ex->n_fev : ex->n_ev;
        for (int e = 0; e < n && !rc; e++) rc = run_event(ex, &ev[e], training);
        ex->n_pend = 0; /* after an error the collectives left in flight are the caller's to end */
    } else {
        for (int i = 0; i < ex->g->n_nodes && !rc; i++) {
            const adt_node *n = &ex->g->nodes[i];
            if (!forward_only || (!n->is_backward && !n->is_optimizer)) rc = run_node(ex, i, training);
        }
    }
    ex->last.run_s = adt_now_s() - t0;
    stats_add(&ex->total, &ex->last);
    return rc;
}

int adt_exec_run(adt_exec *ex) { return exec_run(ex, 0, 1); }
int adt_exec_run_forward_mode(adt_exec *ex, int training) { return exec_run(ex, 1, training); }
int adt_exec_run_forward(adt_exec *ex) { return exec_run(ex, 1, 0); }

void adt_exec_get_stats(const adt_exec *ex, adt_exec_stats *last, adt_exec_stats *total) {
    if (last) *last = ex->last;
    if (total) *total = ex->total;
}

void adt_exec_reset_stats(adt_exec *ex) {
    memset(&ex->last, 0, sizeof ex->last);
    memset(&ex->total, 0, sizeof ex->total);
}

int adt_exec_overlaps(const adt_exec *ex) { return ex->split; }

char *adt_exec_schedule_str(const adt_exec *ex) {
    if (!ex->split) return NULL;
    static const char *const kind[] = {"run", "start", "wait"};
    size_t cap = (size_t)ex->n_ev * (ADT_NAME_LEN + 24) + 1, k = 0;
    char *s = adt_malloc(cap);
    s[0] = 0;
    for (int e = 0; e < ex->n_ev; e++)
        k += (size_t)snprintf(s + k, cap - k, "%s %d %s\n", kind[ex->ev[e].kind], ex->ev[e].node,
                              ex->g->nodes[ex->ev[e].node].name);
    return s;
}

const adt_memplan *adt_exec_memplan(const adt_exec *ex) { return &ex->mp; }
const double *adt_exec_node_seconds(const adt_exec *ex) { return ex->node_s; }
