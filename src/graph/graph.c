/*
 * graph.c - graph storage, the sticky error, leaves, and generic node creation.
 */
#include "adtrain/graph.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ops.h"

const char *adt_role_name(adt_role r) {
    static const char *names[] = {"input", "act", "param", "grad", "opt_state", "label"};
    return (unsigned)r < sizeof names / sizeof names[0] ? names[r] : "?";
}

int adt_role_is_persistent(adt_role r) { return r == ADT_ROLE_PARAM || r == ADT_ROLE_OPT_STATE; }
int adt_role_is_fed(adt_role r) { return r == ADT_ROLE_INPUT || r == ADT_ROLE_LABEL; }

adt_graph *adt_graph_create(void) {
    adt_graph *g = adt_calloc(1, sizeof *g);
    g->loss = g->lr_input = g->step_input = -1;
    g->cur_fwd_node = -1;
    return g;
}

void adt_graph_free(adt_graph *g) {
    if (!g) return;
    free(g->name_index);
    free(g->values);
    free(g->nodes);
    free(g);
}

int adt_graph_error(const adt_graph *g) { return g->status; }
const char *adt_graph_error_message(const adt_graph *g) { return g->status ? g->err : "no error"; }

int adt_graph_fail(adt_graph *g, int code, const char *fmt, ...) {
    if (g->status == ADT_OK) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(g->err, sizeof g->err, fmt, ap);
        va_end(ap);
        g->status = code;
        adt_error(code, "%s", g->err);
    }
    return -1;
}

void adt_graph_set_layer_tag(adt_graph *g, int tag) { g->cur_layer_tag = tag; }
void adt_graph_set_stage(adt_graph *g, int stage) { g->cur_stage = stage; }

/* ---- value names: a hash index, so that building a graph of n leaves costs n lookups, not n^2
 * string compares (the planner builds and partitions graphs of thousands of values per plan) ---- */

static uint32_t name_hash(const char *s) { /* FNV-1a */
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static void index_insert(adt_graph *g, int v) {
    uint32_t m = (uint32_t)g->name_cap - 1, i = name_hash(g->values[v].name) & m;
    while (g->name_index[i] >= 0) i = (i + 1) & m;
    g->name_index[i] = v;
}

static void index_drop(adt_graph *g) {
    free(g->name_index);
    g->name_index = NULL, g->name_cap = 0;
}

static void index_build(adt_graph *g) {
    int cap = 64;
    while (cap < 2 * g->n_values + 16) cap *= 2;
    g->name_index = adt_malloc((size_t)cap * sizeof *g->name_index);
    g->name_cap = cap;
    for (int i = 0; i < cap; i++) g->name_index[i] = -1;
    for (int v = 0; v < g->n_values; v++) index_insert(g, v);
}

int adt_graph_find_value(const adt_graph *cg, const char *name) {
    adt_graph *g = (adt_graph *)cg; /* the index is a cache: the graph itself is not changed */
    if (!g->name_index) index_build(g);
    uint32_t m = (uint32_t)g->name_cap - 1, i = name_hash(name) & m;
    for (; g->name_index[i] >= 0; i = (i + 1) & m)
        if (!strcmp(g->values[g->name_index[i]].name, name)) return g->name_index[i];
    return -1;
}

void adt_graph_rename_value(adt_graph *g, int v, const char *name) {
    snprintf(g->values[v].name, sizeof g->values[v].name, "%s", name);
    index_drop(g);
}

void adt_graph_mark_output(adt_graph *g, int v) {
    if (v >= 0 && v < g->n_values) g->values[v].is_output = 1;
}

/* dst = a b sep num, a and b cut to leave room for the number: the names of every node and
 * value, made without printf (graphs of the planner's candidates have tens of thousands). */
static void join_name(char *dst, size_t cap, const char *a, const char *b, char sep, unsigned num) {
    size_t at = 0, room = cap - 13; /* the names' old cut: room for sep, digits, terminator */
    for (; *a && at < room; a++) dst[at++] = *a;
    for (; *b && at < room; b++) dst[at++] = *b;
    dst[at++] = sep;
    char digits[12];
    int nd = 0;
    unsigned u = num;
    do digits[nd++] = (char)('0' + u % 10), u /= 10;
    while (u);
    while (nd) dst[at++] = digits[--nd];
    dst[at] = 0;
}

static int new_value(adt_graph *g, const char *name, adt_dtype dt, adt_shape shape, adt_role role) {
    if (g->n_values == g->cap_values) {
        g->cap_values = g->cap_values ? 2 * g->cap_values : 64;
        g->values = adt_realloc(g->values, (size_t)g->cap_values * sizeof *g->values);
    }
    int id = g->n_values++;
    adt_value *v = &g->values[id];
    memset(v, 0, sizeof *v);
    size_t len = strnlen(name, sizeof v->name - 1);
    memcpy(v->name, name, len);
    v->name[len] = 0;
    if (g->name_index && 2 * g->n_values + 16 > g->name_cap) index_drop(g); /* rebuilt larger when needed */
    else if (g->name_index) index_insert(g, id);
    v->dtype = dt;
    v->shape = shape;
    v->global_shape = shape;
    v->role = role;
    v->producer = -1;
    v->alias_of = -1;
    v->grad = -1;
    v->param = -1;
    v->layer_tag = g->cur_layer_tag;
    return id;
}

static int check_leaf(adt_graph *g, const char *what, const char *name, adt_shape shape) {
    if (g->status) return -1;
    if (!name || !name[0] || strlen(name) >= ADT_NAME_LEN)
        return adt_graph_fail(g, ADT_ERR_ARG, "%s: a name of 1 to %d characters is required", what,
                              ADT_NAME_LEN - 1);
    if (adt_graph_find_value(g, name) >= 0)
        return adt_graph_fail(g, ADT_ERR_ARG, "%s '%s': the name is already used", what, name);
    if (shape.ndim < 1 || shape.ndim > ADT_MAX_DIMS)
        return adt_graph_fail(g, ADT_ERR_SHAPE, "%s '%s': rank %d, expected 1..%d", what, name,
                              shape.ndim, ADT_MAX_DIMS);
    for (int i = 0; i < shape.ndim; i++)
        if (shape.dim[i] < 1)
            return adt_graph_fail(g, ADT_ERR_SHAPE, "%s '%s': dimension %d is %lld, expected >= 1",
                                  what, name, i, (long long)shape.dim[i]);
    return 0;
}

int adt_input(adt_graph *g, const char *name, adt_dtype dt, adt_shape shape) {
    if (check_leaf(g, "input", name, shape)) return -1;
    return new_value(g, name, dt, shape, ADT_ROLE_INPUT);
}

int adt_label(adt_graph *g, const char *name, adt_dtype dt, adt_shape shape) {
    if (check_leaf(g, "label", name, shape)) return -1;
    return new_value(g, name, dt, shape, ADT_ROLE_LABEL);
}

int adt_param(adt_graph *g, const char *name, adt_shape shape, adt_init init) {
    if (check_leaf(g, "parameter", name, shape)) return -1;
    int v = new_value(g, name, ADT_F32, shape, ADT_ROLE_PARAM);
    g->values[v].init = init;
    g->values[v].requires_grad = 1;
    return v;
}

int adt_graph_set_file_shape(adt_graph *g, int v, adt_shape file_shape) {
    if (g->status) return -1;
    if (v < 0 || v >= g->n_values || g->values[v].role != ADT_ROLE_PARAM)
        return adt_graph_fail(g, ADT_ERR_ARG, "file shape: value %d is not a parameter", v);
    adt_value *val = &g->values[v];
    char a[64], b[64];
    if (file_shape.ndim < 1 || file_shape.ndim > ADT_MAX_DIMS ||
        adt_shape_numel(&file_shape) != adt_shape_numel(&val->shape))
        return adt_graph_fail(g, ADT_ERR_SHAPE, "parameter '%s': file shape %s, expected a shape of the %lld elements of %s",
                              val->name, adt_shape_str(&file_shape, a, sizeof a), (long long)adt_shape_numel(&val->shape),
                              adt_shape_str(&val->shape, b, sizeof b));
    val->file_shape = adt_shape_equal(&file_shape, &val->shape) ? (adt_shape){0} : file_shape;
    return v;
}

adt_shape adt_value_file_shape(const adt_graph *g, int v) {
    const adt_value *val = &g->values[v];
    return val->file_shape.ndim ? val->file_shape : val->shape;
}

/* Internal: optimizer state and other persistent values created by graph passes. A state has
 * its parameter's shape, and its file shape. */
int adt_graph_new_state(adt_graph *g, const char *name, adt_shape shape, int param) {
    if (check_leaf(g, "optimizer state", name, shape)) return -1;
    int v = new_value(g, name, ADT_F32, shape, ADT_ROLE_OPT_STATE);
    g->values[v].param = param;
    g->values[v].layer_tag = g->values[param].layer_tag;
    if (adt_shape_equal(&shape, &g->values[param].shape)) g->values[v].file_shape = g->values[param].file_shape;
    return v;
}

int adt_graph_add_node(adt_graph *g, int op, const int *in, int n_in, const adt_attrs *a) {
    if (g->status) return -1;
    const adt_op_def *def = adt_op_get(op);
    if (!def) return adt_graph_fail(g, ADT_ERR_ARG, "unknown op kind %d", op);
    if (n_in < def->n_in_min || n_in > def->n_in_max)
        return adt_graph_fail(g, ADT_ERR_ARG, "%s: %d inputs given, expected %d..%d", def->name,
                              n_in, def->n_in_min, def->n_in_max);
    for (int i = 0; i < n_in; i++)
        if (in[i] < 0 || in[i] >= g->n_values)
            return adt_graph_fail(g, ADT_ERR_ARG, "%s: input %d is not a value of this graph (id %d)",
                                  def->name, i, in[i]);
    /* Backward rules pass the forward node's own attributes and inputs: copy them before the
     * node array may move. */
    adt_attrs attrs = a ? *a : (adt_attrs){0};
    int ins[ADT_MAX_INPUTS];
    if (n_in) memcpy(ins, in, (size_t)n_in * sizeof *in);
    if (g->n_nodes == g->cap_nodes) {
        g->cap_nodes = g->cap_nodes ? 2 * g->cap_nodes : 64;
        g->nodes = adt_realloc(g->nodes, (size_t)g->cap_nodes * sizeof *g->nodes);
    }
    int id = g->n_nodes;
    adt_node *n = &g->nodes[id];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->n_in = n_in;
    if (n_in) memcpy(n->in, ins, (size_t)n_in * sizeof *ins);
    n->a = attrs;
    n->layer_tag = g->cur_layer_tag;
    n->stage = g->cur_stage;
    n->is_backward = g->in_backward;
    n->is_optimizer = g->in_optimizer;
    n->fwd_node = g->in_backward ? g->cur_fwd_node : -1;
    n->n_out = def->count_out ? def->count_out(n) : def->n_out;
    join_name(n->name, sizeof n->name, g->in_backward ? "bwd." : "", def->name, '_', (unsigned)id);

    adt_shape shapes[ADT_MAX_OUTPUTS];
    adt_dtype dts[ADT_MAX_OUTPUTS];
    for (int k = 0; k < n->n_out; k++) dts[k] = ADT_F32;
    if (def->infer(g, n, shapes, dts) < 0 || g->status) return -1;
    g->n_nodes++; /* committed only once the shape rule accepted it */

    int rg = 0;
    for (int i = 0; i < n_in; i++) rg |= g->values[in[i]].requires_grad;
    for (int k = 0; k < n->n_out; k++) {
        char name[ADT_NAME_LEN];
        join_name(name, sizeof name, n->name, "", ':', (unsigned)k);
        adt_role role = g->in_backward ? ADT_ROLE_GRAD : ADT_ROLE_ACT;
        int v = new_value(g, name, dts[k], shapes[k], role);
        n->out[k] = v;
        g->values[v].producer = id;
        g->values[v].out_index = k;
        g->values[v].requires_grad = rg && !g->in_backward && !g->in_optimizer && dts[k] == ADT_F32;
    }
    if (def->view_of >= 0) g->values[n->out[0]].alias_of = n->in[def->view_of];
    if (def->inplace)
        for (int k = 0; k < n->n_out; k++) {
            /* optimizer outputs are written over the state they update: w, m, v in order */
            int src = k == 0 ? n->in[0] : n->in[1 + k];
            g->values[n->out[k]].alias_of = src;
        }
    return id;
}

int64_t adt_value_numel(const adt_graph *g, int v) { return adt_shape_numel(&g->values[v].shape); }
int64_t adt_value_bytes(const adt_graph *g, int v) {
    return adt_value_numel(g, v) * (int64_t)adt_dtype_size(g->values[v].dtype);
}

int64_t adt_graph_param_count(const adt_graph *g) {
    int64_t n = 0;
    for (int i = 0; i < g->n_values; i++)
        if (g->values[i].role == ADT_ROLE_PARAM) n += adt_value_numel(g, i);
    return n;
}

double adt_graph_flops(const adt_graph *g) {
    double f = 0;
    for (int i = 0; i < g->n_nodes; i++) f += adt_node_flops(g, &g->nodes[i]);
    return f;
}

double adt_graph_matmul_flops(const adt_graph *g) {
    double f = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (adt_op_get(g->nodes[i].op)->is_matmul) f += adt_node_flops(g, &g->nodes[i]);
    return f;
}
