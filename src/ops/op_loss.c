/*
 * op_loss.c - embedding lookup and the fused losses (softmax cross-entropy, binary
 * cross-entropy with logits), with their backward ops.
 *
 * Losses divide by a denominator fixed when the graph is built (the number of label positions
 * in the GLOBAL batch), not by the local count: a batch-split run then yields partial sums of
 * the serial loss, which is what the P signature promises.
 */
#include "op_util.h"

/* ---- embedding ------------------------------------------------------------------------------ */

static int embedding_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_I32) || op_need_dtype(g, n, 1, ADT_F32)) return -1;
    const adt_shape *ids = &OP_IN(g, n, 0)->shape, *t = &OP_IN(g, n, 1)->shape;
    if (t->ndim != 2) return op_fail_shape(g, n, 1, "a table [V,C]");
    if (ids->ndim >= ADT_MAX_DIMS) return op_fail_shape(g, n, 0, "a lower rank");
    adt_shape o = *ids;
    o.dim[o.ndim++] = t->dim[1];
    os[0] = o;
    od[0] = ADT_F32;
    return 0;
}

static void embedding_forward(const adt_kctx *k) {
    const adt_shape *t = K_SHAPE_IN(k, 1);
    adt_k_embedding_forward(K_OUT(k, 0), (const int32_t *)k->in[0], K_IN(k, 1), K_NUMEL_IN(k, 0),
                            t->dim[0], t->dim[1], k->n->a.i[0]);
}

static int embedding_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[1]) return 0;
    const adt_node *n = &g->nodes[node];
    adt_attrs at = n->a;
    at.i[1] = g->values[n->in[1]].shape.dim[0]; /* rows of the table */
    din[1] = op_node_out(g, ADT_OP_EMBEDDING_BWD, (int[]){dout[0], n->in[0]}, 2, &at, 0);
    return 0;
}

static int embedding_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 0)->shape.ndim;
    for (int ax = 0; ax < r; ax++) op_sig(g, n, out, &c, max, "S%d B -> S%d", ax, ax);
    op_sig(g, n, out, &c, max, "B S0 -> P");   /* vocabulary-parallel: owner rows, zeros */
    op_sig(g, n, out, &c, max, "B S1 -> S-1"); /* hidden-split table */
    op_sig(g, n, out, &c, max, "B P -> P");    /* a lookup is linear in the table */
    return c;
}

/* A vocabulary-split table holds rows [row0, row0 + V) of the full one. */
static void embedding_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    a->i[0] = in[1].offset[0];
}

const adt_op_def adt_opdef_embedding = {
    .name = "embedding", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = embedding_infer, .forward = embedding_forward, .backward = embedding_backward,
    .flops = op_flops_per_out, .sbp = embedding_sbp, .localize = embedding_localize,
};

/* inputs dy[...,C], ids[...]; i0 row0, i1 rows of the gradient block */
static int embedding_bwd_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_I32)) return -1;
    const adt_shape *d = &OP_IN(g, n, 0)->shape, *ids = &OP_IN(g, n, 1)->shape;
    if (ids->ndim >= ADT_MAX_DIMS) return op_fail_shape(g, n, 1, "a lower rank");
    adt_shape want = *ids;
    want.dim[want.ndim++] = d->dim[d->ndim - 1];
    if (op_need_shape(g, n, 0, &want, "the ids' shape and a last axis C")) return -1;
    if (n->a.i[0] < 0 || n->a.i[1] < 1)
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: rows [%lld, +%lld) of the table, expected row0 >= 0 and >= 1 rows",
                              n->name, (long long)n->a.i[0], (long long)n->a.i[1]);
    os[0] = adt_shape_2d(n->a.i[1], d->dim[d->ndim - 1]);
    od[0] = ADT_F32;
    return 0;
}

static void embedding_bwd_forward(const adt_kctx *k) {
    const adt_shape *o = K_SHAPE_OUT(k, 0);
    adt_k_embedding_backward(K_OUT(k, 0), K_IN(k, 0), (const int32_t *)k->in[1], K_NUMEL_IN(k, 1),
                             o->dim[0], o->dim[1], k->n->a.i[0]);
}

static int embedding_bwd_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 1)->shape.ndim;
    for (int ax = 0; ax < r; ax++) op_sig(g, n, out, &c, max, "S%d S%d -> P", ax, ax);
    op_sig(g, n, out, &c, max, "B B -> S0"); /* vocabulary-parallel: each rank its rows */
    op_sig(g, n, out, &c, max, "S-1 B -> S1");
    op_sig(g, n, out, &c, max, "P B -> P");
    return c;
}

/* i0 the first table row this rank's gradient block holds, i1 its row count */
static void embedding_bwd_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    a->i[0] = out[0].offset[0];
    a->i[1] = out[0].shape.dim[0];
}

const adt_op_def adt_opdef_embedding_bwd = {
    .name = "embedding_bwd", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = embedding_bwd_infer, .forward = embedding_bwd_forward, .flops = op_flops_per_out,
    .sbp = embedding_bwd_sbp, .localize = embedding_bwd_localize,
};

int adt_embedding(adt_graph *g, int ids, int table) {
    return op_node_out(g, ADT_OP_EMBEDDING, (int[]){ids, table}, 2, NULL, 0);
}

/* ---- softmax cross-entropy ---------------------------------------------------------------- */

static int xent_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_I32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape, *y = &OP_IN(g, n, 1)->shape;
    adt_shape rows = *x;
    rows.ndim--;
    if (rows.ndim == 0) rows = adt_shape_1d(1);
    if (!adt_shape_equal(&rows, y)) {
        char exp[96], buf[64];
        snprintf(exp, sizeof exp, "%s (the logits' shape without the class axis)",
                 adt_shape_str(&rows, buf, sizeof buf));
        return op_fail_shape(g, n, 1, exp);
    }
    os[0] = adt_shape_1d(1);
    os[1] = *x;
    od[0] = od[1] = ADT_F32;
    return 0;
}

static void xent_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    int64_t V = x->dim[x->ndim - 1];
    adt_k_softmax_xent_forward(K_OUT(k, 0), K_OUT(k, 1), K_IN(k, 0), (const int32_t *)k->in[1],
                               adt_shape_numel(x) / V, V, k->n->a.f[0]);
}

static int xent_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[0]) return 0;
    const adt_node *n = &g->nodes[node];
    int in[3] = {dout[0], n->out[1], n->in[1]};
    din[0] = op_node_out(g, ADT_OP_SOFTMAX_XENT_BWD, in, 3, &n->a, 0);
    return 0;
}

static int xent_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    /* the rank of the logits: input 0 of the loss, input 1 (probs) of its backward */
    int c = 0, r = OP_IN(g, n, n->op == ADT_OP_SOFTMAX_XENT ? 0 : 1)->shape.ndim;
    if (n->op == ADT_OP_SOFTMAX_XENT)
        for (int ax = 0; ax < r - 1; ax++) op_sig(g, n, out, &c, max, "S%d S%d -> P S%d", ax, ax, ax);
    else
        for (int ax = 0; ax < r - 1; ax++) op_sig(g, n, out, &c, max, "B S%d S%d -> S%d", ax, ax, ax);
    return c;
}

static double xent_flops(const adt_graph *g, const adt_node *n) {
    return 5.0 * (double)OP_NUMEL(g, n->in[n->op == ADT_OP_SOFTMAX_XENT ? 0 : 1]);
}

const adt_op_def adt_opdef_softmax_xent = {
    .name = "softmax_xent", .n_in_min = 2, .n_in_max = 2, .n_out = 2, .view_of = -1,
    .infer = xent_infer, .forward = xent_forward, .backward = xent_backward, .flops = xent_flops,
    .sbp = xent_sbp,
};

/* inputs dloss[1], probs[..,V], labels[..] */
static int xent_bwd_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    adt_shape one = adt_shape_1d(1), rows = OP_IN(g, n, 1)->shape;
    rows.ndim--;
    if (rows.ndim == 0) rows = one;
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_F32) || op_need_dtype(g, n, 2, ADT_I32) ||
        op_need_shape(g, n, 0, &one, "the loss gradient, a scalar") ||
        op_need_shape(g, n, 2, &rows, "the probabilities' shape without the class axis"))
        return -1;
    os[0] = OP_IN(g, n, 1)->shape;
    od[0] = ADT_F32;
    return 0;
}

static void xent_bwd_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 1);
    int64_t V = x->dim[x->ndim - 1];
    adt_k_softmax_xent_backward(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), (const int32_t *)k->in[2],
                                adt_shape_numel(x) / V, V, k->n->a.f[0]);
}

const adt_op_def adt_opdef_softmax_xent_bwd = {
    .name = "softmax_xent_bwd", .n_in_min = 3, .n_in_max = 3, .n_out = 1, .view_of = -1,
    .infer = xent_bwd_infer, .forward = xent_bwd_forward, .flops = xent_flops, .sbp = xent_sbp,
};

int adt_softmax_xent(adt_graph *g, int logits, int labels) {
    if (g->status) return -1;
    if (labels < 0 || labels >= g->n_values) return adt_graph_fail(g, ADT_ERR_ARG, "softmax_xent: bad labels value");
    adt_attrs at = {.f = {(float)adt_value_numel(g, labels)}};
    return op_node_out(g, ADT_OP_SOFTMAX_XENT, (int[]){logits, labels}, 2, &at, 0);
}

/* ---- binary cross-entropy with logits ------------------------------------------------------ */

static int bce_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_F32)) return -1;
    if (adt_shape_numel(&OP_IN(g, n, 0)->shape) != adt_shape_numel(&OP_IN(g, n, 1)->shape))
        return op_fail_shape(g, n, 1, "as many elements as the logits");
    os[0] = adt_shape_1d(1);
    od[0] = ADT_F32;
    return 0;
}

static void bce_forward(const adt_kctx *k) {
    adt_k_bce_logits_forward(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), K_NUMEL_IN(k, 0), k->n->a.f[0]);
}

static int bce_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[0]) return 0;
    const adt_node *n = &g->nodes[node];
    int in[3] = {dout[0], n->in[0], n->in[1]};
    din[0] = op_node_out(g, ADT_OP_BCE_LOGITS_BWD, in, 3, &n->a, 0);
    return 0;
}

static int bce_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    /* the rank of the logits: input 0 of the loss, input 1 of its backward */
    int c = 0, r = OP_IN(g, n, n->op == ADT_OP_BCE_LOGITS ? 0 : 1)->shape.ndim;
    if (n->op == ADT_OP_BCE_LOGITS)
        for (int ax = 0; ax < r; ax++) op_sig(g, n, out, &c, max, "S%d S%d -> P", ax, ax);
    else
        for (int ax = 0; ax < r; ax++) op_sig(g, n, out, &c, max, "B S%d S%d -> S%d", ax, ax, ax);
    return c;
}

static double bce_flops(const adt_graph *g, const adt_node *n) {
    return 6.0 * (double)OP_NUMEL(g, n->in[n->op == ADT_OP_BCE_LOGITS ? 0 : 1]);
}

const adt_op_def adt_opdef_bce_logits = {
    .name = "bce_logits", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = bce_infer, .forward = bce_forward, .backward = bce_backward, .flops = bce_flops,
    .sbp = bce_sbp,
};

/* inputs dloss[1], x, y (as many elements as x) */
static int bce_bwd_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    adt_shape one = adt_shape_1d(1);
    for (int i = 0; i < 3; i++)
        if (op_need_dtype(g, n, i, ADT_F32)) return -1;
    if (op_need_shape(g, n, 0, &one, "the loss gradient, a scalar")) return -1;
    if (adt_shape_numel(&OP_IN(g, n, 1)->shape) != adt_shape_numel(&OP_IN(g, n, 2)->shape))
        return op_fail_shape(g, n, 2, "as many elements as the logits");
    os[0] = OP_IN(g, n, 1)->shape;
    od[0] = ADT_F32;
    return 0;
}

static void bce_bwd_forward(const adt_kctx *k) {
    adt_k_bce_logits_backward(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), K_IN(k, 2), K_NUMEL_IN(k, 1),
                              k->n->a.f[0]);
}

const adt_op_def adt_opdef_bce_logits_bwd = {
    .name = "bce_logits_bwd", .n_in_min = 3, .n_in_max = 3, .n_out = 1, .view_of = -1,
    .infer = bce_bwd_infer, .forward = bce_bwd_forward, .flops = bce_flops, .sbp = bce_sbp,
};

int adt_bce_logits(adt_graph *g, int x, int y) {
    if (g->status) return -1;
    if (y < 0 || y >= g->n_values) return adt_graph_fail(g, ADT_ERR_ARG, "bce_logits: bad target value");
    adt_attrs at = {.f = {(float)adt_value_numel(g, y)}};
    return op_node_out(g, ADT_OP_BCE_LOGITS, (int[]){x, y}, 2, &at, 0);
}
