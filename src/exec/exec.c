/*
 * exec.c - runs a training graph: one state block, one planned arena, one scratch buffer, and
 * the nodes in order through the op registry's kernels.
 *
 * One fusion: a matmul whose product only a bias_add reads runs as a product-plus-bias that
 * writes the bias_add's output directly, and the bias_add is skipped (fold_bias_adds below).
 */
#include "adtrain/exec.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

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
};

/* Whether matmul node mm can do bias_add node ba's work, given reads[r] = how many nodes read
 * storage root r. The fused node writes ba's output when mm runs; that is sound when
 *  - the product has no reader but ba (nor is it kept as an output or seen through a view), so
 *    it need not exist on its own;
 *  - the bias exists when mm runs (a parameter or input, or produced earlier);
 *  - ba's output buffer holds nothing else alive between mm and ba: the plan placed it for
 *    ba's position only, and a value that dies at mm (an input of the product, say) or lives
 *    in between may share its bytes. */
static int can_fold_bias(const adt_exec *ex, const int *reads, int mm, int ba) {
    const adt_graph *g = ex->g;
    const adt_memplan *mp = &ex->mp;
    const adt_node *m = &g->nodes[mm], *b = &g->nodes[ba];
    int prod = m->out[0], bias = b->in[1], y = b->out[0];
    if (m->n_in != 2 || m->a.i[2] != 0 || b->in[0] != prod || mp->root[bias] == prod) return 0;
    if (m->is_backward != b->is_backward || m->is_optimizer != b->is_optimizer) return 0;
    if (mp->root[prod] != prod || reads[prod] != 1 || g->values[prod].is_output) return 0;
    for (int v = 0; v < g->n_values; v++)
        if (v != prod && mp->root[v] == prod) return 0; /* a view of the product */
    int rb = mp->root[bias];
    if (mp->state_offset[rb] < 0 && !(mp->first[rb] >= 0 && mp->first[rb] < mm)) return 0;
    if (mp->root[y] != y || mp->offset[y] < 0) return 0;
    int64_t y0 = mp->offset[y], y1 = y0 + adt_value_bytes(g, y);
    for (int v = 0; v < g->n_values; v++) {
        if (v == y || mp->root[v] != v || mp->offset[v] < 0) continue;
        int64_t v0 = mp->offset[v], v1 = v0 + adt_value_bytes(g, v);
        if (v0 < y1 && y0 < v1 && mp->first[v] < ba && mp->last[v] >= mm) return 0;
    }
    return 1;
}

static void fold_bias_adds(adt_exec *ex) {
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
        if (ba > i && g->nodes[ba].op == ADT_OP_BIAS_ADD && can_fold_bias(ex, reads, i, ba)) {
            ex->bias_of[i] = ba;
            ex->done_by_matmul[ba] = 1;
        }
    }
    free(reads);
    free(reader);
}

int adt_exec_create(adt_exec **out, const adt_graph *g, const adt_exec_opts *opts) {
    *out = NULL;
    if (g->status) return adt_error(g->status, "%s", g->err);
    adt_exec *ex = adt_calloc(1, sizeof *ex);
    ex->g = g;
    if (opts) ex->o = *opts;
    if (ex->o.threads > 0) openblas_set_num_threads(ex->o.threads);
    adt_memplan_build(&ex->mp, g, NULL, g->n_nodes, ex->o.no_reuse);
    ex->arena = adt_alloc_aligned((size_t)ex->mp.arena_bytes);
    ex->state = adt_alloc_aligned((size_t)ex->mp.state_bytes);
    ex->scratch = adt_alloc_aligned((size_t)ex->mp.scratch_bytes);
    ex->ptr = adt_calloc((size_t)g->n_values, sizeof *ex->ptr);
    ex->node_s = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->node_s);
    ex->bias_of = adt_malloc((size_t)(g->n_nodes + 1) * sizeof *ex->bias_of);
    ex->done_by_matmul = adt_calloc((size_t)(g->n_nodes + 1), sizeof *ex->done_by_matmul);
    for (int v = 0; v < g->n_values; v++) { /* a view shares its root's storage */
        int r = ex->mp.root[v];
        if (ex->mp.state_offset[r] >= 0) ex->ptr[v] = ex->state + ex->mp.state_offset[r];
        else if (ex->mp.offset[r] >= 0) ex->ptr[v] = ex->arena + ex->mp.offset[r];
    }
    fold_bias_adds(ex);
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
    free(ex->bias_of);
    free(ex->done_by_matmul);
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
    adt_node fused; /* the matmul with the bias as a third input, writing the bias_add's output */
    if (ex->bias_of[id] >= 0) {
        const adt_node *ba = &g->nodes[ex->bias_of[id]];
        fused = *n;
        fused.n_in = 3;
        fused.in[2] = ba->in[1];
        fused.out[0] = ba->out[0];
        n = &fused;
    }
    void *in[ADT_MAX_INPUTS], *outp[ADT_MAX_OUTPUTS];
    for (int i = 0; i < n->n_in; i++) in[i] = ex->ptr[n->in[i]];
    for (int k = 0; k < n->n_out; k++) outp[k] = ex->ptr[n->out[k]];
    adt_kctx k = {.g = g, .n = n, .in = in, .out = outp, .scratch = ex->scratch, .seed = ex->o.seed,
                 .training = training};
    if (ex->o.profile) {
        double t0 = adt_now_s();
        adt_op_get(n->op)->forward(&k);
        ex->node_s[id] += adt_now_s() - t0;
    } else {
        adt_op_get(n->op)->forward(&k);
    }
}

int adt_exec_run(adt_exec *ex) {
    for (int i = 0; i < ex->g->n_nodes; i++) run_node(ex, i, 1);
    return ADT_OK;
}

int adt_exec_run_forward_mode(adt_exec *ex, int training) {
    for (int i = 0; i < ex->g->n_nodes; i++) {
        const adt_node *n = &ex->g->nodes[i];
        if (!n->is_backward && !n->is_optimizer) run_node(ex, i, training);
    }
    return ADT_OK;
}

int adt_exec_run_forward(adt_exec *ex) { return adt_exec_run_forward_mode(ex, 0); }

const adt_memplan *adt_exec_memplan(const adt_exec *ex) { return &ex->mp; }
const double *adt_exec_node_seconds(const adt_exec *ex) { return ex->node_s; }
