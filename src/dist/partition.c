/*
 * partition.c - the partitioner: a global training graph and a plan (mesh, one n-D signature
 * per node, the layout of each leaf) become one rank's local graph.
 *
 * Every rank builds the same sequence of nodes (SPMD): the localised global nodes in their
 * order, and before a node whose input layout differs from the layout the value was produced
 * (or is held) in, the boxing steps of the cheapest program, one BOXING node each. So the
 * ranks reach every communication node in the same order, which is what collectives need.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

/* ---- BOXING node attributes ------------------------------------------------------------------ */

/* An nd-SBP in 32 bits: ndim in the low byte, then a byte per mesh axis (kind | axis << 2). */
static uint32_t pack_ndsbp(const adt_ndsbp *s) {
    uint32_t x = (uint32_t)s->ndim & 0xffu;
    for (int a = 0; a < s->ndim; a++)
        x |= (uint32_t)((s->s[a].kind & 3) | ((s->s[a].kind == ADT_SBP_S ? s->s[a].axis & 7 : 0) << 2)) << (8 * (a + 1));
    return x;
}

static adt_ndsbp unpack_ndsbp(uint32_t x) {
    adt_ndsbp s = adt_ndsbp_all_b((int)(x & 0xffu));
    for (int a = 0; a < s.ndim && a < ADT_MAX_MESH_DIMS; a++) {
        uint32_t b = x >> (8 * (a + 1)) & 0xffu;
        s.s[a].kind = (int8_t)(b & 3);
        s.s[a].axis = (int8_t)(b >> 2 & 7);
    }
    return s;
}

int adt_boxing_node_step(const adt_graph *lg, const adt_node *n, const adt_mesh *m, adt_boxing_step *st) {
    if (n->op != ADT_OP_BOXING) return adt_error(ADT_ERR_ARG, "node %s is not a boxing node", n->name);
    memset(st, 0, sizeof *st);
    st->kind = (int)(n->a.i[0] & 0xff);
    st->mesh_axis = (int)(n->a.i[0] >> 8 & 0xff);
    st->from = unpack_ndsbp((uint32_t)(n->a.i[1] & 0xffffffffu));
    st->to = unpack_ndsbp((uint32_t)((uint64_t)n->a.i[1] >> 32));
    if (st->from.ndim != m->ndim || st->to.ndim != m->ndim || st->mesh_axis >= m->ndim)
        return adt_error(ADT_ERR_ARG, "boxing node %s: a step for %d mesh axes on a %d-axis mesh", n->name, st->from.ndim,
                         m->ndim);
    adt_sbp f = st->from.s[st->mesh_axis], t = st->to.s[st->mesh_axis];
    st->from_axis = f.kind == ADT_SBP_S ? f.axis : -1;
    st->to_axis = t.kind == ADT_SBP_S ? t.axis : -1;
    st->group_size = m->dim[st->mesh_axis];
    const adt_value *x = &lg->values[n->in[0]];
    st->group_bytes = adt_boxing_group_bytes(&st->from, st->mesh_axis, m, x->global_shape, adt_dtype_size(x->dtype));
    st->bytes = adt_boxing_bytes(st->kind, st->group_size, st->group_bytes);
    return ADT_OK;
}

/* k >= 0 in decimal at out (no NUL); returns the length. */
static size_t int_text(int k, char *out) {
    char d[12];
    size_t n = 0;
    do d[n++] = (char)('0' + k % 10), k /= 10;
    while (k > 0);
    for (size_t i = 0; i < n; i++) out[i] = d[n - 1 - i];
    return n;
}

/* Appends one BOXING node reading local value x; returns the local value it writes. */
static int add_boxing_node(adt_graph *lg, int x, const adt_boxing_step *st, const adt_mesh *m, const int *coord,
                           const adt_node *consumer, int *serial) {
    const adt_value *xv = &lg->values[x];
    adt_box b = adt_ndsbp_block(&st->to, m, coord, xv->global_shape);
    adt_attrs a = {0};
    a.i[0] = st->kind | st->mesh_axis << 8;
    a.i[1] = (int64_t)((uint64_t)pack_ndsbp(&st->from) | (uint64_t)pack_ndsbp(&st->to) << 32);
    for (int d = 0; d < b.shape.ndim; d++) a.i[2 + d] = b.shape.dim[d];
    char base[ADT_NAME_LEN];
    adt_str_copy(base, sizeof base, xv->name);
    adt_role role = xv->role == ADT_ROLE_GRAD ? ADT_ROLE_GRAD : ADT_ROLE_ACT;
    int id = adt_graph_add_node(lg, ADT_OP_BOXING, &x, 1, &a);
    if (id < 0) return -1;
    adt_node *n = &lg->nodes[id];
    int k = (*serial)++;
    char num[16]; /* "box<k>.<kind>", "<value>@box<k>": a stage graph has thousands, built hundreds of times */
    size_t nk = int_text(k, num);
    memcpy(n->name, "box", 3), memcpy(n->name + 3, num, nk), n->name[3 + nk] = '.';
    adt_str_copy(n->name + 4 + nk, sizeof n->name - 4 - nk, adt_boxing_kind_name(st->kind));
    n->is_backward = consumer->is_backward;
    n->is_optimizer = consumer->is_optimizer;
    n->stage = consumer->stage;
    n->layer_tag = consumer->layer_tag;
    adt_value *o = &lg->values[n->out[0]];
    size_t nb = adt_str_copy(o->name, ADT_NAME_LEN - 15, base);
    nb = nb < ADT_NAME_LEN - 16 ? nb : ADT_NAME_LEN - 16;
    memcpy(o->name + nb, "@box", 4), memcpy(o->name + nb + 4, num, nk), o->name[nb + 4 + nk] = 0;
    o->role = role;
    o->global_shape = b.global;
    memcpy(o->offset, b.offset, sizeof o->offset);
    return n->out[0];
}

/* ---- layouts ----------------------------------------------------------------------------------- */

/* Input index of node n that its in-place output k overwrites (graph.c's convention: w, then
 * the states in order). */
static int inplace_input(int k) { return k == 0 ? 0 : 1 + k; }

static adt_ndsbp no_partial(adt_ndsbp s) {
    for (int a = 0; a < s.ndim; a++)
        if (s.s[a].kind == ADT_SBP_P) s.s[a] = (adt_sbp){ADT_SBP_B, 0};
    return s;
}

adt_ndsbp adt_dist_leaf_layout(const adt_graph *g, const adt_dist_plan *p, int v) {
    if (p->leaf_sbp && p->leaf_sbp[v].ndim) return p->leaf_sbp[v];
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (!adt_op_get(n->op)->inplace) continue;
        for (int k = 0; k < n->n_out; k++)
            if (n->in[inplace_input(k)] == v) return no_partial(p->node_sig[i].in[inplace_input(k)]);
    }
    for (int i = 0; i < g->n_nodes; i++)
        for (int j = 0; j < g->nodes[i].n_in; j++)
            if (g->nodes[i].in[j] == v) return no_partial(p->node_sig[i].in[j]);
    return adt_ndsbp_all_b(p->mesh.ndim);
}

static int check_plan(const adt_graph *g, const adt_dist_plan *p, adt_ndsbp *layout) {
    char a[64], mb[32];
    if (g->status) return adt_error(g->status, "partition: the graph has an error: %s", g->err);
    adt_sig_cache sc = {.g = g, .m = &p->mesh, .check_only = 1}; /* repeated layers are checked once */
    for (int i = 0; i < g->n_nodes && !p->sigs_checked; i++) {
        int rc = adt_sig_cache_valid(&sc, i, &p->node_sig[i]);
        if (rc) return adt_sig_cache_free(&sc), adt_error_prefix(rc, "partition: ");
    }
    adt_sig_cache_free(&sc);
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->producer >= 0) {
            layout[v] = p->node_sig[val->producer].out[val->out_index];
            continue;
        }
        layout[v] = adt_dist_leaf_layout(g, p, v);
        if (!adt_ndsbp_fits(&layout[v], &p->mesh, val->shape) || adt_ndsbp_partial_mask(&layout[v]))
            return adt_error(ADT_ERR_ARG, "partition: leaf '%s' %s cannot be held as %s on mesh %s (a leaf is B or S, "
                             "every block non-empty)",
                             val->name, adt_shape_str(&val->shape, mb, sizeof mb), adt_ndsbp_str(&layout[v], a, sizeof a),
                             adt_mesh_str(&p->mesh, mb, sizeof mb));
    }
    return ADT_OK;
}

/* ---- the partitioner --------------------------------------------------------------------------- */

typedef struct boxed {
    int value;      /* global value */
    adt_ndsbp to;   /* the layout it was boxed to */
    int local;      /* the local value holding it */
} boxed;

void adt_dist_local_free(adt_dist_local *l) {
    if (!l) return;
    adt_graph_free(l->g);
    free(l->value);
    free(l->layout);
    memset(l, 0, sizeof *l);
}

/* The local value of global value u in layout `want`: as held, or boxed (cached). */
static int input_in_layout(adt_graph *lg, const adt_graph *g, const adt_dist_plan *p, const int *coord,
                           adt_dist_local *out, boxed **cache, int *n_cache, adt_boxing_cache *bc, int u,
                           const adt_ndsbp *want, const adt_node *consumer) {
    if (adt_ndsbp_equal(&out->layout[u], want)) return out->value[u];
    for (int c = 0; c < *n_cache; c++)
        if ((*cache)[c].value == u && adt_ndsbp_equal(&(*cache)[c].to, want)) return (*cache)[c].local;
    const adt_value *gv = &g->values[u];
    adt_boxing_prog prog;
    int rc = adt_boxing_cache_plan(bc, gv, &out->layout[u], want, &prog);
    if (rc) return adt_error_prefix(rc, "partition: value '%s' into node %s: ", gv->name, consumer->name), -1;
    int x = out->value[u];
    for (int s = 0; s < prog.n_steps && x >= 0; s++) {
        out->uneven |= !adt_ndsbp_even(&prog.step[s].to, &p->mesh, gv->shape);
        x = add_boxing_node(lg, x, &prog.step[s], &p->mesh, coord, consumer, &out->n_boxing);
        out->boxing_time += prog.step[s].time;
    }
    if (x < 0) return adt_error(ADT_ERR_SHAPE, "partition: boxing '%s': %s", gv->name, adt_graph_error_message(lg)), -1;
    *cache = adt_realloc(*cache, (size_t)(*n_cache + 1) * sizeof **cache);
    (*cache)[(*n_cache)++] = (boxed){u, *want, x};
    return x;
}

int adt_dist_partition(const adt_graph *g, const adt_dist_plan *p, const int *coord, adt_dist_local *out) {
    memset(out, 0, sizeof *out);
    out->value = adt_malloc((size_t)(g->n_values ? g->n_values : 1) * sizeof *out->value);
    out->layout = adt_calloc((size_t)(g->n_values ? g->n_values : 1), sizeof *out->layout);
    for (int v = 0; v < g->n_values; v++) out->value[v] = -1;
    int rc = check_plan(g, p, out->layout);
    if (rc) {
        adt_dist_local_free(out);
        return rc;
    }
    adt_graph *lg = out->g = adt_graph_create();
    for (int v = 0; v < g->n_values; v++) { /* leaves first, in value order: the state layout */
        if (g->values[v].producer >= 0) continue;
        adt_box b = adt_ndsbp_block(&out->layout[v], &p->mesh, coord, g->values[v].shape);
        out->value[v] = adt_dist_add_local_leaf(lg, g, v, &b);
        if (out->value[v] < 0) {
            rc = adt_error(ADT_ERR_ARG, "partition: leaf '%s': %s", g->values[v].name, adt_graph_error_message(lg));
            adt_dist_local_free(out);
            return rc;
        }
        int param = g->values[v].param; /* optimizer state names its parameter (created earlier) */
        lg->values[out->value[v]].param = param >= 0 ? out->value[param] : -1;
    }
    boxed *cache = NULL;
    int n_cache = 0;
    adt_boxing_cache bc = {.m = &p->mesh, .cost = &p->cost}; /* repeated layers box alike */
    for (int i = 0; i < g->n_nodes && !rc; i++) {
        const adt_node *n = &g->nodes[i];
        const adt_op_def *d = adt_op_get(n->op);
        const adt_nd_sig *s = &p->node_sig[i];
        int lin[ADT_MAX_INPUTS];
        for (int j = 0; j < n->n_in && !rc; j++) {
            lin[j] = input_in_layout(lg, g, p, coord, out, &cache, &n_cache, &bc, n->in[j], &s->in[j], n);
            if (lin[j] < 0) rc = ADT_ERR_SHAPE;
        }
        if (rc) break;
        /* an in-place update must write the stored state, not a boxed copy of it */
        for (int k = 0; d->inplace && k < n->n_out; k++) {
            int j = inplace_input(k);
            if (lin[j] == out->value[n->in[j]]) continue;
            char held[64], upd[64];
            rc = adt_error(ADT_ERR_ARG, "partition: node %s updates '%s' in place as %s, but it is held as %s; hold it in "
                                        "the layout it is updated in",
                           n->name, g->values[n->in[j]].name, adt_ndsbp_str(&s->in[j], upd, sizeof upd),
                           adt_ndsbp_str(&out->layout[n->in[j]], held, sizeof held));
        }
        if (rc) break;
        adt_local_node ln;
        rc = adt_dist_localize(g, i, s, &p->mesh, coord, &ln);
        if (rc) break;
        int id = adt_dist_add_local_node(lg, g, &ln, lin);
        if (id < 0) {
            rc = adt_error(ADT_ERR_SHAPE, "partition: %s", adt_graph_error_message(lg));
            break;
        }
        for (int k = 0; k < n->n_out; k++) out->value[n->out[k]] = lg->nodes[id].out[k];
        if (i + 1 == g->n_forward_nodes) lg->n_forward_nodes = lg->n_nodes;
    }
    free(cache);
    adt_boxing_cache_free(&bc);
    if (rc) {
        adt_dist_local_free(out);
        return rc;
    }
    for (int v = 0; v < g->n_values; v++) {
        if (out->value[v] < 0) continue;
        out->uneven |= !adt_ndsbp_even(&out->layout[v], &p->mesh, g->values[v].shape);
        if (g->values[v].is_output) adt_graph_mark_output(lg, out->value[v]);
        int gr = g->values[v].grad; /* the gradient as produced (its layout may differ from v's) */
        if (gr >= 0 && out->value[gr] >= 0) lg->values[out->value[v]].grad = out->value[gr];
    }
    lg->loss = g->loss >= 0 ? out->value[g->loss] : -1;
    return ADT_OK;
}
