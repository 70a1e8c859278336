/*
 * exec.c - runs a training graph: one state block, one planned arena, one scratch buffer, and
 * the nodes in order through the op registry's kernels.
 *
 * The run order is the graph's with each optimizer update moved up to right after the last
 * node it conflicts with (schedule below); the memory plan is made for that order.
 * Two fusions: a matmul whose product only a bias_add reads runs as a product-plus-bias that
 * writes the bias_add's output directly, and the bias_add is skipped; a weight gradient's
 * matmul feeding an SGD update with momentum accumulates into the momentum buffer (fold_nodes).
 */
#include "adtrain/exec.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "adtrain/base.h"
#include "adtrain/ops.h"

struct adt_exec {
    const adt_graph *g;
    adt_exec_opts o;
    adt_memplan mp;
    char *arena, *state;
    float *scratch;
    void **ptr; /* [n_values] */
    double *node_s;
    int *bias_of;       /* [n_nodes] for a matmul: the bias_add folded into it, else -1 */
    unsigned char *done_by_matmul; /* [n_nodes] bias_adds folded into their matmul       */
    int *momentum_of;   /* [n_nodes] for a matmul: the SGD update it accumulates for, or -1 */
    unsigned char *momentum_done;  /* [n_nodes] SGD updates whose momentum a matmul made  */
    int *order;         /* [n_nodes] node ids in the order they run                      */
    int *pos;           /* [n_nodes] a node's position in that order (the plan's time)   */
};

/* The arena and the state block, zeroed. A step streams them through the TLB several times
 * (every weight, gradient and optimizer moment), and with 4 KiB pages a model of some MB
 * outgrows it, so blocks of 2 MiB and more are 2 MiB-aligned and marked for transparent huge
 * pages (the kernel's "madvise" mode; where it refuses, the block stays as it is). */
static void *exec_block(size_t n) {
    const size_t huge = (size_t)2 << 20;
#ifdef MADV_HUGEPAGE
    if (n >= huge) {
        size_t sz = (n + huge - 1) & ~(huge - 1);
        void *p = NULL;
        if (posix_memalign(&p, huge, sz) == 0) {
            (void)madvise(p, sz, MADV_HUGEPAGE);
            memset(p, 0, sz);
            return p;
        }
    }
#endif
    return adt_alloc_aligned(n);
}

static int storage_root(const adt_graph *g, int v) {
    while (g->values[v].alias_of >= 0) v = g->values[v].alias_of;
    return v;
}

/* The run order: the graph's, except that each optimizer node runs as soon as every earlier
 * node it conflicts with has run (one that writes storage it reads, or reads or writes storage
 * it writes): right after its parameter's last use in the backward pass, once its gradient is
 * complete. The update then finds the gradient, and the weights the backward pass just read,
 * still in cache instead of streaming every parameter, gradient and state through memory again
 * at the end, and each gradient buffer is free for reuse earlier. Nothing moves past a node it
 * depends on or that depends on it: nodes after an optimizer node in the graph still run after
 * it. */
typedef struct sched {
    /* after[0]: optimizer nodes that conflict with no earlier node; after[i + 1]: those that
     * run right after node i. Each a list through next[]. */
    int *after, *next, *order, *pos, n;
} sched;

static void sched_emit(sched *s, int i) {
    s->pos[i] = s->n;
    s->order[s->n++] = i;
    for (int o = s->after[i + 1]; o >= 0; o = s->next[o]) sched_emit(s, o);
}

static void schedule(adt_exec *ex) {
    const adt_graph *g = ex->g;
    int nn = g->n_nodes;
    /* per storage root: the last node that wrote it, and the last that read or wrote it */
    int *last_w = adt_malloc((size_t)(g->n_values + 1) * sizeof *last_w);
    int *last_rw = adt_malloc((size_t)(g->n_values + 1) * sizeof *last_rw);
    int *tail = adt_malloc((size_t)(nn + 1) * sizeof *tail);
    sched s = {adt_malloc((size_t)(nn + 1) * sizeof(int)), adt_malloc((size_t)(nn + 1) * sizeof(int)),
               ex->order, ex->pos, 0};
    for (int v = 0; v < g->n_values; v++) last_w[v] = last_rw[v] = -1;
    for (int i = 0; i <= nn; i++) s.after[i] = tail[i] = -1;
    for (int i = 0; i < nn; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->is_optimizer) {
            int a = -1;
            for (int k = 0; k < n->n_in; k++) {
                int t = last_w[storage_root(g, n->in[k])];
                a = t > a ? t : a;
            }
            for (int k = 0; k < n->n_out; k++) {
                int t = last_rw[storage_root(g, n->out[k])];
                a = t > a ? t : a;
            }
            s.next[i] = -1;
            if (s.after[a + 1] < 0) s.after[a + 1] = i;
            else s.next[tail[a + 1]] = i;
            tail[a + 1] = i;
        }
        for (int k = 0; k < n->n_in; k++) last_rw[storage_root(g, n->in[k])] = i;
        for (int k = 0; k < n->n_out; k++) {
            int r = storage_root(g, n->out[k]);
            last_w[r] = last_rw[r] = i;
        }
    }
    for (int o = s.after[0]; o >= 0; o = s.next[o]) sched_emit(&s, o);
    for (int i = 0; i < nn; i++)
        if (!g->nodes[i].is_optimizer) sched_emit(&s, i);
    ADT_ASSERT(s.n == nn);
    free(s.after);
    free(s.next);
    free(last_w);
    free(last_rw);
    free(tail);
}

/* Whether matmul node mm can do bias_add node ba's work, given reads[r] = how many nodes read
 * storage root r. The fused node writes ba's output when mm runs; that is sound when
 *  - the product has no reader but ba (nor is it kept as an output or seen through a view), so
 *    it need not exist on its own;
 *  - the bias exists when mm runs (a parameter or input, or produced earlier) and nothing
 *    writes it between mm and ba;
 *  - ba's output buffer holds nothing else alive between mm and ba: the plan placed it for
 *    ba's position only, and a value that dies at mm (an input of the product, say) or lives
 *    in between may share its bytes. */
static int can_fold_bias(const adt_exec *ex, const int *reads, int mm, int ba) {
    const adt_graph *g = ex->g;
    const adt_memplan *mp = &ex->mp;
    const adt_node *m = &g->nodes[mm], *b = &g->nodes[ba];
    const int pm = ex->pos[mm], pb = ex->pos[ba]; /* the plan's times */
    int prod = m->out[0], bias = b->in[1], y = b->out[0];
    if (m->n_in != 2 || m->a.i[2] != 0 || b->in[0] != prod || mp->root[bias] == prod) return 0;
    if (m->is_backward != b->is_backward || m->is_optimizer != b->is_optimizer) return 0;
    if (mp->root[prod] != prod || reads[prod] != 1 || g->values[prod].is_output) return 0;
    for (int v = 0; v < g->n_values; v++)
        if (v != prod && mp->root[v] == prod) return 0; /* a view of the product */
    int rb = mp->root[bias];
    if (mp->state_offset[rb] < 0 && !(mp->first[rb] >= 0 && mp->first[rb] < pm)) return 0;
    for (int p = pm + 1; p < pb; p++) {
        const adt_node *w = &g->nodes[ex->order[p]];
        for (int k = 0; k < w->n_out; k++)
            if (mp->root[w->out[k]] == rb) return 0;
    }
    if (mp->root[y] != y || mp->offset[y] < 0) return 0;
    int64_t y0 = mp->offset[y], y1 = y0 + adt_value_bytes(g, y);
    for (int v = 0; v < g->n_values; v++) {
        if (v == y || mp->root[v] != v || mp->offset[v] < 0) continue;
        int64_t v0 = mp->offset[v], v1 = v0 + adt_value_bytes(g, v);
        if (v0 < y1 && y0 < v1 && mp->first[v] < pb && mp->last[v] >= pm) return 0;
    }
    return 1;
}

/* Whether matmul node mm, whose product only SGD node o reads (reads[] as above), can
 * accumulate straight into o's momentum buffer. With momentum mu and no weight decay o computes
 * m = mu m + g (m = g at step 1), then w -= lr m. sgemm with beta = mu (0 at step 1) gives the
 * same m from the product's inputs (its beta pass rounds mu m, then the product is added with
 * one rounding), so the update is left with w -= lr m: the gradient buffer is never written or
 * read, and of the update's five streams over the parameter's size three remain. That equality
 * needs the inner dimension to be one block of OpenBLAS's sgemm (else C takes each block's sum
 * in turn): FOLD_MAX_K is below the block of every x86 kernel family. A weight gradient's inner
 * dimension is the batch. The two must run back to back, so that nothing sees m in between. */
#define FOLD_MAX_K 256

static int can_fold_momentum(const adt_exec *ex, const int *reads, int mm, int o) {
    const adt_graph *g = ex->g;
    const adt_memplan *mp = &ex->mp;
    const adt_node *m = &g->nodes[mm], *u = &g->nodes[o];
    int prod = m->out[0];
    if (u->op != ADT_OP_SGD || u->n_in != 5 || u->in[1] != prod || !(u->a.f[0] > 0.0f) ||
        u->a.f[1] != 0.0f)
        return 0;
    if (m->n_in != 2 || m->a.i[2] != 0 || ex->bias_of[mm] >= 0 || ex->pos[o] != ex->pos[mm] + 1)
        return 0;
    if (mp->root[prod] != prod || reads[prod] != 1 || g->values[prod].is_output) return 0;
    for (int v = 0; v < g->n_values; v++)
        if (v != prod && mp->root[v] == prod) return 0; /* a view of the product */
    for (int k = 0; k < 2; k++) /* the product must not read what the update writes */
        if (mp->root[m->in[k]] == mp->root[u->in[0]] || mp->root[m->in[k]] == mp->root[u->in[2]])
            return 0;
    const adt_shape *a = &g->values[m->in[0]].shape;
    int64_t K = m->a.i[0] ? adt_shape_prod(a, 0, a->ndim - 1) : a->dim[a->ndim - 1];
    return K <= FOLD_MAX_K;
}

static void fold_nodes(adt_exec *ex) {
    const adt_graph *g = ex->g;
    int *reads = adt_calloc((size_t)g->n_values, sizeof *reads);
    int *reader = adt_malloc((size_t)g->n_values * sizeof *reader); /* the last reading node */
    for (int v = 0; v < g->n_values; v++) reader[v] = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        ex->bias_of[i] = -1;
        for (int k = 0; k < n->n_in; k++) {
            int r = ex->mp.root[n->in[k]];
            int seen = 0; /* a node reading the same root twice counts once */
            for (int j = 0; j < k; j++) seen |= ex->mp.root[n->in[j]] == r;
            if (!seen) reads[r]++, reader[r] = i;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->op != ADT_OP_MATMUL) continue;
        int ba = reader[n->out[0]];
        if (ba >= 0 && ex->pos[ba] > ex->pos[i] && g->nodes[ba].op == ADT_OP_BIAS_ADD &&
            can_fold_bias(ex, reads, i, ba)) {
            ex->bias_of[i] = ba;
            ex->done_by_matmul[ba] = 1;
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        ex->momentum_of[i] = -1;
        const adt_node *n = &g->nodes[i];
        if (n->op != ADT_OP_MATMUL) continue;
        int o = reader[n->out[0]];
        if (o >= 0 && can_fold_momentum(ex, reads, i, o)) {
            ex->momentum_of[i] = o;
            ex->momentum_done[o] = 1;
        }
    }
    free(reads);
    free(reader);
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
    ex->order = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->order);
    ex->pos = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->pos);
    schedule(ex);
    adt_memplan_build(&ex->mp, g, ex->order, g->n_nodes, ex->o.no_reuse);
    ex->arena = exec_block((size_t)ex->mp.arena_bytes);
    ex->state = exec_block((size_t)ex->mp.state_bytes);
    ex->scratch = adt_alloc_aligned((size_t)ex->mp.scratch_bytes);
    ex->ptr = adt_calloc((size_t)g->n_values, sizeof *ex->ptr);
    ex->node_s = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->node_s);
    ex->bias_of = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->bias_of);
    ex->done_by_matmul = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->done_by_matmul);
    ex->momentum_of = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->momentum_of);
    ex->momentum_done = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->momentum_done);
    for (int v = 0; v < g->n_values; v++) { /* a view shares its root's storage */
        int r = ex->mp.root[v];
        if (ex->mp.state_offset[r] >= 0) ex->ptr[v] = ex->state + ex->mp.state_offset[r];
        else if (ex->mp.offset[r] >= 0) ex->ptr[v] = ex->arena + ex->mp.offset[r];
    }
    fold_nodes(ex);
    *out = ex;
    return ADT_OK;
}

void adt_exec_free(adt_exec *ex) {
    if (!ex) return;
    adt_memplan_free(&ex->mp);
    free(ex->arena); /* exec_block: posix_memalign or adt_alloc_aligned, both free() */
    free(ex->state);
    adt_free_aligned(ex->scratch);
    free(ex->ptr);
    free(ex->node_s);
    free(ex->bias_of);
    free(ex->done_by_matmul);
    free(ex->momentum_of);
    free(ex->momentum_done);
    free(ex->order);
    free(ex->pos);
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

static void run_node(adt_exec *ex, int id, int training) {
    const adt_graph *g = ex->g;
    const adt_node *n = &g->nodes[id];
    if (ex->done_by_matmul[id]) return;
    adt_node fused = *n; /* the node run in place of the graph's (matmul_forward, sgd) */
    if (ex->bias_of[id] >= 0) { /* the bias as a third input, writing the bias_add's output */
        const adt_node *ba = &g->nodes[ex->bias_of[id]];
        fused.n_in = 3;
        fused.in[2] = ba->in[1];
        fused.out[0] = ba->out[0];
        n = &fused;
    } else if (ex->momentum_of[id] >= 0) { /* m = beta m + product, beta 0 at step 1 */
        const adt_node *u = &g->nodes[ex->momentum_of[id]];
        int32_t step = *(const int32_t *)ex->ptr[u->in[4]];
        fused.out[0] = u->in[2];
        fused.a.i[3] = 1;
        fused.a.f[0] = step <= 1 ? 0.0f : u->a.f[0];
        n = &fused;
    } else if (ex->momentum_done[id]) { /* w -= lr m: plain SGD with m as the gradient */
        fused.n_in = 4;
        fused.in[1] = n->in[2];
        fused.in[2] = n->in[3];
        fused.in[3] = n->in[4];
        fused.n_out = 1;
        fused.a.f[0] = 0.0f;
        n = &fused;
    }
    void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
    for (int i = 0; i < n->n_in; i++) in[i] = ex->ptr[n->in[i]];
    for (int k = 0; k < n->n_out; k++) outp[k] = ex->ptr[n->out[k]];
    adt_kctx k = {.g = g, .n = n, .in = in, .out = outp, .scratch = ex->scratch, .seed = ex->o.seed,
                 .training = training, .comm = ex->o.comm};
    if (ex->o.profile) {
        double t0 = adt_now_s();
        adt_op_get(n->op)->forward(&k);
        ex->node_s[id] += adt_now_s() - t0;
    } else {
        adt_op_get(n->op)->forward(&k);
    }
}

int adt_exec_run(adt_exec *ex) {
    for (int p = 0; p < ex->g->n_nodes; p++) run_node(ex, ex->order[p], 1);
    return ADT_OK;
}

int adt_exec_run_forward_mode(adt_exec *ex, int training) {
    for (int p = 0; p < ex->g->n_nodes; p++) {
        int i = ex->order[p];
        const adt_node *n = &ex->g->nodes[i];
        if (!n->is_backward && !n->is_optimizer) run_node(ex, i, training);
    }
    return ADT_OK;
}

int adt_exec_run_forward(adt_exec *ex) { return adt_exec_run_forward_mode(ex, 0); }

const adt_memplan *adt_exec_memplan(const adt_exec *ex) { return &ex->mp; }
const double *adt_exec_node_seconds(const adt_exec *ex) { return ex->node_s; }
