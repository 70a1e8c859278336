/*
 * exec.c - runs a training graph: one state block, one planned arena, one scratch buffer, and
 * the nodes in order through the op registry's kernels.
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
};

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
    adt_memplan_build(&ex->mp, g, NULL, g->n_nodes, ex->o.no_reuse);
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
