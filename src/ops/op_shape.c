/*
 * op_shape.c - data-movement ops: reshape (a view), permute, concat, slice and the zero-padding
 * gradient of slice.
 */
#include "op_util.h"

/* ---- reshape: i0..i5 dims, i6 rank; output 0 shares the input's storage -------------------- */

static int reshape_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    const adt_value *x = OP_IN(g, n, 0);
    adt_shape o = {0};
    o.ndim = (int)n->a.i[6];
    if (o.ndim < 1 || o.ndim > ADT_MAX_DIMS)
        return adt_graph_fail(g, ADT_ERR_SHAPE, "node %s: reshape to rank %d, expected 1..%d", n->name,
                              o.ndim, ADT_MAX_DIMS);
    for (int i = 0; i < o.ndim; i++) o.dim[i] = n->a.i[i];
    if (adt_shape_numel(&o) != adt_shape_numel(&x->shape)) {
        char exp[96], buf[64];
        snprintf(exp, sizeof exp, "%lld elements to reshape to %s", (long long)adt_shape_numel(&o),
                 adt_shape_str(&o, buf, sizeof buf));
        return op_fail_shape(g, n, 0, exp);
    }
    os[0] = o;
    od[0] = x->dtype;
    return 0;
}

static void reshape_forward(const adt_kctx *k) { (void)k; /* a view: nothing moves */ }

static int reshape_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (need[0]) din[0] = adt_reshape(g, dout[0], g->values[g->nodes[node].in[0]].shape);
    return 0;
}

/* A split of input axis i stays a block split of output axis j when both start at the same
 * flat stride and one dim is a multiple of the other (the split lands on the outer factor). */
static int reshape_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    const adt_shape *x = &OP_IN(g, n, 0)->shape, *o = &OP_OUT(g, n, 0)->shape;
    for (int i = 0; i < x->ndim; i++)
        for (int j = 0; j < o->ndim; j++) {
            if (adt_shape_prod(x, 0, i) != adt_shape_prod(o, 0, j)) continue;
            if (x->dim[i] == 1 || o->dim[j] == 1) continue;
            if (x->dim[i] % o->dim[j] && o->dim[j] % x->dim[i]) continue;
            op_sig(g, n, out, &c, max, "S%d -> S%d", i, j);
        }
    op_sig_partial(g, n, out, &c, max);
    return c;
}

/* the target shape is the output block (the shape rule then checks the element counts agree) */
static void reshape_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    for (int i = 0; i < out[0].shape.ndim; i++) a->i[i] = out[0].shape.dim[i];
    a->i[6] = out[0].shape.ndim;
}

const adt_op_def adt_opdef_reshape = {
    .name = "reshape", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = 0,
    .infer = reshape_infer, .forward = reshape_forward, .backward = reshape_backward,
    .sbp = reshape_sbp, .localize = reshape_localize,
};

int adt_reshape(adt_graph *g, int x, adt_shape shape) {
    if (g->status) return -1;
    if (x >= 0 && x < g->n_values && adt_shape_equal(&g->values[x].shape, &shape)) return x;
    adt_attrs at = {0};
    for (int i = 0; i < shape.ndim && i < ADT_MAX_DIMS; i++) at.i[i] = shape.dim[i];
    at.i[6] = shape.ndim;
    return op_node_out(g, ADT_OP_RESHAPE, (int[]){x}, 1, &at, 0);
}

int adt_flatten(adt_graph *g, int x) {
    if (g->status) return -1;
    if (x < 0 || x >= g->n_values) return adt_graph_fail(g, ADT_ERR_ARG, "flatten: bad input value");
    const adt_shape *s = &g->values[x].shape;
    return adt_reshape(g, x, adt_shape_2d(s->dim[0], adt_shape_prod(s, 1, s->ndim)));
}

/* ---- permute: i0..i(r-1) the permutation --------------------------------------------------- */

static int permute_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape;
    int seen[ADT_MAX_DIMS] = {0};
    adt_shape o = {0};
    o.ndim = x->ndim;
    for (int i = 0; i < x->ndim; i++) {
        int p = (int)n->a.i[i];
        if (p < 0 || p >= x->ndim || seen[p]++)
            return adt_graph_fail(g, ADT_ERR_ARG, "node %s: the permutation is not one of %d axes", n->name, x->ndim);
        o.dim[i] = x->dim[p];
    }
    os[0] = o;
    od[0] = ADT_F32;
    return 0;
}

static void permute_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    int perm[ADT_MAX_DIMS];
    for (int i = 0; i < x->ndim; i++) perm[i] = (int)k->n->a.i[i];
    adt_k_permute(K_OUT(k, 0), K_IN(k, 0), x->ndim, x->dim, perm);
}

static int permute_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[0]) return 0;
    const adt_node *n = &g->nodes[node];
    int r = g->values[n->in[0]].shape.ndim, inv[ADT_MAX_DIMS];
    for (int i = 0; i < r; i++) inv[n->a.i[i]] = i;
    din[0] = adt_permute(g, dout[0], inv);
    return 0;
}

static int permute_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 0)->shape.ndim;
    for (int j = 0; j < r; j++) op_sig(g, n, out, &c, max, "S%d -> S%d", (int)n->a.i[j], j);
    op_sig_partial(g, n, out, &c, max);
    return c;
}

const adt_op_def adt_opdef_permute = {
    .name = "permute", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = permute_infer, .forward = permute_forward, .backward = permute_backward,
    .flops = op_flops_per_out, .sbp = permute_sbp,
};

int adt_permute(adt_graph *g, int x, const int *perm) {
    if (g->status) return -1;
    if (x < 0 || x >= g->n_values) return adt_graph_fail(g, ADT_ERR_ARG, "permute: bad input value");
    adt_attrs at = {0};
    for (int i = 0; i < g->values[x].shape.ndim; i++) at.i[i] = perm[i];
    return op_node_out(g, ADT_OP_PERMUTE, (int[]){x}, 1, &at, 0);
}

/* ---- concat: i0 axis ----------------------------------------------------------------------- */

static int concat_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    const adt_shape *x0 = &OP_IN(g, n, 0)->shape;
    int ax = (int)n->a.i[0];
    if (ax < 0 || ax >= x0->ndim)
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: concat axis %d of a rank-%d tensor", n->name, ax, x0->ndim);
    adt_shape o = *x0;
    o.dim[ax] = 0;
    for (int i = 0; i < n->n_in; i++) {
        if (op_need_dtype(g, n, i, ADT_F32)) return -1;
        const adt_shape *x = &OP_IN(g, n, i)->shape;
        int ok = x->ndim == x0->ndim;
        for (int d = 0; ok && d < x->ndim; d++) ok = d == ax || x->dim[d] == x0->dim[d];
        if (!ok) return op_fail_shape(g, n, i, "the shape of input 0 except along the concat axis");
        o.dim[ax] += x->dim[ax];
    }
    os[0] = o;
    od[0] = ADT_F32;
    return 0;
}

static void concat_forward(const adt_kctx *k) {
    const adt_shape *o = K_SHAPE_OUT(k, 0);
    int ax = (int)k->n->a.i[0], n = k->n->n_in;
    const float *xs[ADT_MAX_INPUTS];
    int64_t sizes[ADT_MAX_INPUTS];
    for (int i = 0; i < n; i++) {
        xs[i] = K_IN(k, i);
        sizes[i] = K_SHAPE_IN(k, i)->dim[ax];
    }
    adt_k_concat(K_OUT(k, 0), xs, sizes, n, adt_shape_prod(o, 0, ax), adt_shape_prod(o, ax + 1, o->ndim));
}

static int concat_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    const adt_node n = g->nodes[node];
    int ax = (int)n.a.i[0];
    int64_t off = 0;
    for (int i = 0; i < n.n_in; i++) {
        int64_t len = g->values[n.in[i]].shape.dim[ax];
        if (need[i]) din[i] = adt_slice(g, dout[0], ax, off, len);
        off += len;
    }
    return 0;
}

static int concat_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_OUT(g, n, 0)->shape.ndim, ax = (int)n->a.i[0];
    for (int d = 0; d < r; d++) {
        if (d == ax || c >= max) continue;
        adt_sbp_sig sig;
        memset(&sig, 0, sizeof sig);
        for (int i = 0; i < n->n_in; i++) sig.in[i] = (adt_sbp){ADT_SBP_S, (int8_t)d};
        sig.out[0] = (adt_sbp){ADT_SBP_S, (int8_t)d};
        out[c++] = sig;
    }
    op_sig_partial(g, n, out, &c, max);
    return c;
}

const adt_op_def adt_opdef_concat = {
    .name = "concat", .n_in_min = 1, .n_in_max = ADT_MAX_INPUTS, .n_out = 1, .view_of = -1,
    .infer = concat_infer, .forward = concat_forward, .backward = concat_backward,
    .flops = op_flops_per_out, .sbp = concat_sbp,
};

int adt_concat(adt_graph *g, const int *xs, int n, int axis) {
    adt_attrs at = {.i = {axis}};
    return op_node_out(g, ADT_OP_CONCAT, xs, n, &at, 0);
}

/* ---- slice: i0 axis, i1 start, i2 len; slice_grad pads back to i2 = full length ------------ */

/* Slicing moves 4-byte elements without looking at them, so it takes i32 as well as f32: DLRM
 * cuts the id column of each embedding table out of one [B, tables] id input. An i32 slice has
 * no gradient (ids never depend on a parameter), so slice_grad stays f32. */
static int slice_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    const adt_value *xv = OP_IN(g, n, 0);
    if (n->op == ADT_OP_SLICE_GRAD || xv->dtype != ADT_I32)
        if (op_need_dtype(g, n, 0, ADT_F32)) return -1;
    const adt_shape *x = &xv->shape;
    int ax = (int)n->a.i[0];
    int64_t start = n->a.i[1], len = n->a.i[2];
    if (ax < 0 || ax >= x->ndim)
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: slice axis %d of a rank-%d tensor", n->name, ax, x->ndim);
    adt_shape o = *x;
    if (n->op == ADT_OP_SLICE) {
        if (start < 0 || len < 1 || start + len > x->dim[ax])
            return adt_graph_fail(g, ADT_ERR_SHAPE, "node %s: slice [%lld, %lld) of an axis of size %lld",
                                  n->name, (long long)start, (long long)(start + len), (long long)x->dim[ax]);
        o.dim[ax] = len;
    } else {
        if (start < 0 || start + x->dim[ax] > len)
            return adt_graph_fail(g, ADT_ERR_SHAPE, "node %s: a slice of length %lld at %lld does not fit an axis of size %lld",
                                  n->name, (long long)x->dim[ax], (long long)start, (long long)len);
        o.dim[ax] = len; /* the full length */
    }
    os[0] = o;
    od[0] = xv->dtype;
    return 0;
}

static void slice_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    int ax = (int)k->n->a.i[0];
    adt_k_slice(K_OUT(k, 0), K_IN(k, 0), adt_shape_prod(x, 0, ax), x->dim[ax], k->n->a.i[1],
                k->n->a.i[2], adt_shape_prod(x, ax + 1, x->ndim));
}

static int slice_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[0]) return 0;
    const adt_node *n = &g->nodes[node];
    adt_attrs at = n->a;
    at.i[2] = g->values[n->in[0]].shape.dim[n->a.i[0]];
    din[0] = op_node_out(g, ADT_OP_SLICE_GRAD, (int[]){dout[0]}, 1, &at, 0);
    return 0;
}

static void slice_grad_forward(const adt_kctx *k) {
    const adt_shape *o = K_SHAPE_OUT(k, 0), *x = K_SHAPE_IN(k, 0);
    int ax = (int)k->n->a.i[0];
    int64_t outer = adt_shape_prod(o, 0, ax), inner = adt_shape_prod(o, ax + 1, o->ndim);
    int64_t full = o->dim[ax], len = x->dim[ax], start = k->n->a.i[1];
    float *dst = K_OUT(k, 0);
    const float *src = K_IN(k, 0);
    memset(dst, 0, (size_t)adt_shape_numel(o) * sizeof(float));
    for (int64_t a = 0; a < outer; a++)
        memcpy(dst + (a * full + start) * inner, src + a * len * inner, (size_t)(len * inner) * sizeof(float));
}

static int slice_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_OUT(g, n, 0)->shape.ndim, ax = (int)n->a.i[0];
    for (int d = 0; d < r; d++)
        if (d != ax) op_sig(g, n, out, &c, max, "S%d -> S%d", d, d);
    op_sig_partial(g, n, out, &c, max);
    return c;
}

/* Positions along the slice axis move with the blocks: the output block's first element is
 * global input element start + out offset, which sits at that minus the input offset locally. */
static void slice_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    int ax = (int)n->a.i[0];
    a->i[1] = n->a.i[1] + out[0].offset[ax] - in[0].offset[ax];
    a->i[2] = out[0].shape.dim[ax];
}

static void slice_grad_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    int ax = (int)n->a.i[0];
    a->i[1] = n->a.i[1] + in[0].offset[ax] - out[0].offset[ax];
    a->i[2] = out[0].shape.dim[ax];
}

const adt_op_def adt_opdef_slice = {
    .name = "slice", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = slice_infer, .forward = slice_forward, .backward = slice_backward,
    .flops = op_flops_per_out, .sbp = slice_sbp, .localize = slice_localize,
};
const adt_op_def adt_opdef_slice_grad = {
    .name = "slice_grad", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = slice_infer, .forward = slice_grad_forward, .flops = op_flops_per_out, .sbp = slice_sbp,
    .localize = slice_grad_localize,
};

int adt_slice(adt_graph *g, int x, int axis, int64_t start, int64_t len) {
    adt_attrs at = {.i = {axis, start, len}};
    return op_node_out(g, ADT_OP_SLICE, (int[]){x}, 1, &at, 0);
}
