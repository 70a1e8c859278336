/*
 * op_cv.c - convolution, max-pooling and the DLRM pairwise dot interaction, with backward ops.
 */
#include "op_util.h"

/* ---- conv2d -------------------------------------------------------------------------------
 * attrs: i0 stride, i1 pad, i2 has_bias; the backward ops also carry i3 H, i4 W (input plane),
 * i5 C (input channels), i6 R, i7 S (kernel). */

static int64_t conv_out_dim(int64_t in, int64_t k, int64_t stride, int64_t pad) {
    return (in + 2 * pad - k) / stride + 1;
}

static int conv2d_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    for (int i = 0; i < n->n_in; i++)
        if (op_need_dtype(g, n, i, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape, *w = &OP_IN(g, n, 1)->shape;
    int64_t stride = n->a.i[0], pad = n->a.i[1];
    if (x->ndim != 4) return op_fail_shape(g, n, 0, "[N,C,H,W]");
    if (w->ndim != 4 || w->dim[1] != x->dim[1]) return op_fail_shape(g, n, 1, "[K,C,R,S] with C equal to the input's channels");
    if (stride < 1 || pad < 0)
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: stride %lld and padding %lld, expected stride >= 1 and padding >= 0",
                              n->name, (long long)stride, (long long)pad);
    if (x->dim[2] + 2 * pad < w->dim[2] || x->dim[3] + 2 * pad < w->dim[3])
        return op_fail_shape(g, n, 0, "an image at least as large as the kernel (after padding)");
    if (n->n_in == 3 && (OP_IN(g, n, 2)->shape.ndim != 1 || OP_IN(g, n, 2)->shape.dim[0] != w->dim[0]))
        return op_fail_shape(g, n, 2, "[K] (one bias per output channel)");
    os[0] = adt_shape_4d(x->dim[0], w->dim[0], conv_out_dim(x->dim[2], w->dim[2], stride, pad),
                         conv_out_dim(x->dim[3], w->dim[3], stride, pad));
    od[0] = ADT_F32;
    return 0;
}

static int64_t conv2d_scratch(const adt_graph *g, const adt_node *n) {
    int64_t C, H, W, K, R, S;
    if (n->op == ADT_OP_CONV2D) {
        const adt_shape *x = &g->values[n->in[0]].shape, *w = &g->values[n->in[1]].shape;
        C = x->dim[1], H = x->dim[2], W = x->dim[3], K = w->dim[0], R = w->dim[2], S = w->dim[3];
    } else {
        const adt_shape *w = &g->values[n->op == ADT_OP_CONV2D_BWD_DATA ? n->in[1] : n->out[0]].shape;
        C = n->a.i[5], H = n->a.i[3], W = n->a.i[4], K = w->dim[0], R = w->dim[2], S = w->dim[3];
    }
    return adt_k_conv2d_scratch_floats(C, H, W, K, R, S, n->a.i[0], n->a.i[1]);
}

static void conv2d_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0), *w = K_SHAPE_IN(k, 1);
    adt_k_conv2d_forward(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), k->n->n_in == 3 ? K_IN(k, 2) : NULL,
                         k->scratch, x->dim[0], x->dim[1], x->dim[2], x->dim[3], w->dim[0], w->dim[2],
                         w->dim[3], k->n->a.i[0], k->n->a.i[1]);
}

static int conv2d_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    const adt_node *n = &g->nodes[node];
    const adt_shape *x = &g->values[n->in[0]].shape;
    adt_attrs at = n->a;
    at.i[3] = x->dim[2];
    at.i[4] = x->dim[3];
    at.i[5] = x->dim[1];
    at.i[6] = g->values[n->in[1]].shape.dim[2]; /* the kernel size cannot be recovered from */
    at.i[7] = g->values[n->in[1]].shape.dim[3]; /* the planes when the stride does not divide */
    if (need[0]) din[0] = op_node_out(g, ADT_OP_CONV2D_BWD_DATA, (int[]){dout[0], n->in[1]}, 2, &at, 0);
    if (need[1] || (n->n_in == 3 && need[2])) {
        int outs[2];
        if (op_node(g, ADT_OP_CONV2D_BWD_WEIGHT, (int[]){dout[0], n->in[0]}, 2, &at, outs) < 0) return -1;
        if (need[1]) din[1] = outs[0];
        if (n->n_in == 3 && need[2]) din[2] = outs[1];
    }
    return 0;
}

static double conv2d_flops(const adt_graph *g, const adt_node *n) {
    /* 2 K C R S P Q N for each of forward, data grad and weight grad */
    const adt_shape *o = &g->values[n->op == ADT_OP_CONV2D ? n->out[0] : n->in[0]].shape;
    const adt_shape *w = &g->values[n->op == ADT_OP_CONV2D_BWD_WEIGHT ? n->out[0] : n->in[1]].shape;
    return 2.0 * (double)adt_shape_numel(o) * (double)(w->dim[1] * w->dim[2] * w->dim[3]);
}

static int conv2d_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    if (n->n_in == 3) {
        op_sig(g, n, out, &c, max, "S0 B B -> S0");   /* data parallel */
        op_sig(g, n, out, &c, max, "B S0 S0 -> S1");  /* output channels */
        op_sig(g, n, out, &c, max, "S1 S1 P -> P");   /* input channels: partial sums */
        op_sig(g, n, out, &c, max, "P B P -> P");     /* bilinear, as matmul */
        op_sig(g, n, out, &c, max, "B P P -> P");
    } else {
        op_sig(g, n, out, &c, max, "S0 B -> S0");
        op_sig(g, n, out, &c, max, "B S0 -> S1");
        op_sig(g, n, out, &c, max, "S1 S1 -> P");
        op_sig(g, n, out, &c, max, "P B -> P");
        op_sig(g, n, out, &c, max, "B P -> P");
    }
    return c;
}

const adt_op_def adt_opdef_conv2d = {
    .name = "conv2d", .n_in_min = 2, .n_in_max = 3, .n_out = 1, .view_of = -1,
    .infer = conv2d_infer, .forward = conv2d_forward, .backward = conv2d_backward,
    .flops = conv2d_flops, .scratch = conv2d_scratch, .sbp = conv2d_sbp, .is_matmul = 1,
};

/* inputs dy[N,K,P,Q], w[K,C,R,S]; the input plane H, W and channels C come from attributes,
 * which must agree with w and with P, Q */
static int conv2d_bwd_data_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_F32)) return -1;
    const adt_shape *d = &OP_IN(g, n, 0)->shape;
    const int64_t *a = n->a.i;
    if (d->ndim != 4) return op_fail_shape(g, n, 0, "[N,K,P,Q]");
    if (a[0] < 1 || a[1] < 0 || a[3] + 2 * a[1] < a[6] || a[4] + 2 * a[1] < a[7])
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: stride %lld, padding %lld, plane %lldx%lld and kernel %lldx%lld do not fit",
                              n->name, (long long)a[0], (long long)a[1], (long long)a[3], (long long)a[4], (long long)a[6],
                              (long long)a[7]);
    adt_shape ws = adt_shape_4d(d->dim[1], a[5], a[6], a[7]);
    adt_shape ds = adt_shape_4d(d->dim[0], d->dim[1], conv_out_dim(a[3], a[6], a[0], a[1]), conv_out_dim(a[4], a[7], a[0], a[1]));
    if (op_need_shape(g, n, 1, &ws, "[K,C,R,S] from dy and the attributes") ||
        op_need_shape(g, n, 0, &ds, "the convolution of the input plane"))
        return -1;
    os[0] = adt_shape_4d(d->dim[0], n->a.i[5], n->a.i[3], n->a.i[4]);
    od[0] = ADT_F32;
    return 0;
}

static void conv2d_bwd_data_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_OUT(k, 0), *w = K_SHAPE_IN(k, 1);
    adt_k_conv2d_backward_data(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), k->scratch, x->dim[0], x->dim[1],
                               x->dim[2], x->dim[3], w->dim[0], w->dim[2], w->dim[3], k->n->a.i[0],
                               k->n->a.i[1]);
}

static int conv2d_bwd_data_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    op_sig(g, n, out, &c, max, "S0 B -> S0");
    op_sig(g, n, out, &c, max, "S1 S0 -> P");
    op_sig(g, n, out, &c, max, "B S1 -> S1");
    op_sig(g, n, out, &c, max, "P B -> P");
    op_sig(g, n, out, &c, max, "B P -> P");
    return c;
}

/* i3 H, i4 W, i5 C describe the input-gradient block */
static void conv2d_bwd_data_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    a->i[3] = out[0].shape.dim[2];
    a->i[4] = out[0].shape.dim[3];
    a->i[5] = out[0].shape.dim[1];
}

const adt_op_def adt_opdef_conv2d_bwd_data = {
    .name = "conv2d_bwd_data", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = conv2d_bwd_data_infer, .forward = conv2d_bwd_data_forward, .flops = conv2d_flops,
    .scratch = conv2d_scratch, .sbp = conv2d_bwd_data_sbp, .is_matmul = 1,
    .localize = conv2d_bwd_data_localize,
};

/* inputs dy[N,K,P,Q], x[N,C,H,W]; i6, i7 the kernel size */
static int conv2d_bwd_weight_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_F32)) return -1;
    const adt_shape *d = &OP_IN(g, n, 0)->shape, *x = &OP_IN(g, n, 1)->shape;
    const int64_t *a = n->a.i;
    if (x->ndim != 4) return op_fail_shape(g, n, 1, "[N,C,H,W]");
    if (d->ndim != 4) return op_fail_shape(g, n, 0, "[N,K,P,Q]");
    if (a[0] < 1 || a[1] < 0 || a[6] < 1 || a[7] < 1 || x->dim[2] + 2 * a[1] < a[6] || x->dim[3] + 2 * a[1] < a[7])
        return op_fail_shape(g, n, 1, "a plane at least as large as the kernel (after padding)");
    adt_shape ds = adt_shape_4d(x->dim[0], d->dim[1], conv_out_dim(x->dim[2], a[6], a[0], a[1]),
                                conv_out_dim(x->dim[3], a[7], a[0], a[1]));
    if (op_need_shape(g, n, 0, &ds, "the convolution of x")) return -1;
    os[0] = adt_shape_4d(d->dim[1], x->dim[1], n->a.i[6], n->a.i[7]);
    os[1] = adt_shape_1d(d->dim[1]);
    od[0] = od[1] = ADT_F32;
    return 0;
}

static void conv2d_bwd_weight_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 1), *w = K_SHAPE_OUT(k, 0);
    adt_k_conv2d_backward_weight(K_OUT(k, 0), K_OUT(k, 1), K_IN(k, 0), K_IN(k, 1), k->scratch,
                                 x->dim[0], x->dim[1], x->dim[2], x->dim[3], w->dim[0], w->dim[2],
                                 w->dim[3], k->n->a.i[0], k->n->a.i[1]);
}

static int conv2d_bwd_weight_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    op_sig(g, n, out, &c, max, "S0 S0 -> P P");
    op_sig(g, n, out, &c, max, "S1 B -> S0 S0");
    op_sig(g, n, out, &c, max, "B S1 -> S1 B");
    op_sig(g, n, out, &c, max, "P B -> P P"); /* linear in dy (the bias gradient too) */
    op_sig(g, n, out, &c, max, "B P -> P B"); /* linear in x; the bias gradient does not read x */
    return c;
}

/* i3 H, i4 W, i5 C describe the input block x (the scratch size reads them) */
static void conv2d_bwd_weight_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    a->i[3] = in[1].shape.dim[2];
    a->i[4] = in[1].shape.dim[3];
    a->i[5] = in[1].shape.dim[1];
}

const adt_op_def adt_opdef_conv2d_bwd_weight = {
    .name = "conv2d_bwd_weight", .n_in_min = 2, .n_in_max = 2, .n_out = 2, .view_of = -1,
    .infer = conv2d_bwd_weight_infer, .forward = conv2d_bwd_weight_forward, .flops = conv2d_flops,
    .scratch = conv2d_scratch, .sbp = conv2d_bwd_weight_sbp, .is_matmul = 1,
    .localize = conv2d_bwd_weight_localize,
};

int adt_conv2d(adt_graph *g, int x, int w, int bias, int stride, int pad) {
    adt_attrs at = {.i = {stride, pad, bias >= 0}};
    if (bias >= 0) return op_node_out(g, ADT_OP_CONV2D, (int[]){x, w, bias}, 3, &at, 0);
    return op_node_out(g, ADT_OP_CONV2D, (int[]){x, w}, 2, &at, 0);
}

/* ---- max-pool 2d: i0 window, i1 stride; the backward op also carries i2 H, i3 W ------------ */

static int maxpool_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape;
    int64_t k = n->a.i[0], s = n->a.i[1];
    if (x->ndim != 4) return op_fail_shape(g, n, 0, "[N,C,H,W]");
    if (k < 1 || s < 1)
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: window %lld and stride %lld, expected >= 1",
                              n->name, (long long)k, (long long)s);
    if (x->dim[2] < k || x->dim[3] < k) return op_fail_shape(g, n, 0, "an image at least as large as the window");
    os[0] = adt_shape_4d(x->dim[0], x->dim[1], (x->dim[2] - k) / s + 1, (x->dim[3] - k) / s + 1);
    os[1] = os[0];
    od[0] = ADT_F32;
    od[1] = ADT_I32;
    return 0;
}

static void maxpool_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    adt_k_maxpool2d_forward(K_OUT(k, 0), (int32_t *)k->out[1], K_IN(k, 0), x->dim[0], x->dim[1],
                            x->dim[2], x->dim[3], k->n->a.i[0], k->n->a.i[1]);
}

static int maxpool_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[0]) return 0;
    const adt_node *n = &g->nodes[node];
    const adt_shape *x = &g->values[n->in[0]].shape;
    adt_attrs at = n->a;
    at.i[2] = x->dim[2];
    at.i[3] = x->dim[3];
    din[0] = op_node_out(g, ADT_OP_MAXPOOL2D_BWD, (int[]){dout[0], n->out[1]}, 2, &at, 0);
    return 0;
}

static int maxpool_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    if (n->op == ADT_OP_MAXPOOL2D) {
        op_sig(g, n, out, &c, max, "S0 -> S0 S0");
        op_sig(g, n, out, &c, max, "S1 -> S1 S1");
    } else {
        op_sig(g, n, out, &c, max, "S0 S0 -> S0");
        op_sig(g, n, out, &c, max, "S1 S1 -> S1");
        op_sig(g, n, out, &c, max, "P B -> P"); /* linear in dy */
    }
    return c;
}

const adt_op_def adt_opdef_maxpool2d = {
    .name = "maxpool2d", .n_in_min = 1, .n_in_max = 1, .n_out = 2, .view_of = -1,
    .infer = maxpool_infer, .forward = maxpool_forward, .backward = maxpool_backward,
    .flops = op_flops_per_out, .sbp = maxpool_sbp,
};

/* inputs dy[N,C,P,Q], argmax (i32, same shape); i2 H, i3 W the input plane */
static int maxpool_bwd_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_I32)) return -1;
    const adt_shape *d = &OP_IN(g, n, 0)->shape;
    int64_t k = n->a.i[0], s = n->a.i[1], H = n->a.i[2], W = n->a.i[3];
    if (d->ndim != 4) return op_fail_shape(g, n, 0, "[N,C,P,Q]");
    if (k < 1 || s < 1 || H < k || W < k)
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: window %lld, stride %lld on a %lldx%lld plane do not fit", n->name,
                              (long long)k, (long long)s, (long long)H, (long long)W);
    adt_shape ds = adt_shape_4d(d->dim[0], d->dim[1], (H - k) / s + 1, (W - k) / s + 1);
    if (op_need_shape(g, n, 0, &ds, "the pooled plane") || op_need_shape(g, n, 1, d, "the shape of dy")) return -1;
    os[0] = adt_shape_4d(d->dim[0], d->dim[1], n->a.i[2], n->a.i[3]);
    od[0] = ADT_F32;
    return 0;
}

static void maxpool_bwd_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_OUT(k, 0);
    adt_k_maxpool2d_backward(K_OUT(k, 0), K_IN(k, 0), (const int32_t *)k->in[1], x->dim[0], x->dim[1],
                             x->dim[2], x->dim[3], k->n->a.i[0], k->n->a.i[1]);
}

/* i2 H, i3 W of the input-gradient block */
static void maxpool_bwd_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    a->i[2] = out[0].shape.dim[2];
    a->i[3] = out[0].shape.dim[3];
}

const adt_op_def adt_opdef_maxpool2d_bwd = {
    .name = "maxpool2d_bwd", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = maxpool_bwd_infer, .forward = maxpool_bwd_forward, .flops = op_flops_per_out,
    .sbp = maxpool_sbp, .localize = maxpool_bwd_localize,
};

int adt_maxpool2d(adt_graph *g, int x, int k, int stride) {
    adt_attrs at = {.i = {k, stride}};
    return op_node_out(g, ADT_OP_MAXPOOL2D, (int[]){x}, 1, &at, 0);
}

/* ---- DLRM pairwise dot interaction ---------------------------------------------------------- */

static int interaction_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape;
    if (x->ndim != 3 || x->dim[1] < 2) return op_fail_shape(g, n, 0, "[B,F,D] with F >= 2 features");
    os[0] = adt_shape_2d(x->dim[0], x->dim[1] * (x->dim[1] - 1) / 2);
    od[0] = ADT_F32;
    return 0;
}

static void interaction_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    adt_k_interaction_forward(K_OUT(k, 0), K_IN(k, 0), k->scratch, x->dim[0], x->dim[1], x->dim[2]);
}

static int64_t interaction_scratch(const adt_graph *g, const adt_node *n) {
    int bwd = n->op == ADT_OP_INTERACTION_BWD;
    const adt_shape *x = &g->values[n->in[bwd]].shape; /* x[B,F,D] */
    return adt_k_interaction_scratch_floats(x->dim[1], x->dim[2], bwd);
}

static int interaction_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (need[0])
        din[0] = op_node_out(g, ADT_OP_INTERACTION_BWD, (int[]){dout[0], g->nodes[node].in[0]}, 2, NULL, 0);
    return 0;
}

/* inputs dz[B, F(F-1)/2], x[B,F,D] */
static int interaction_bwd_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    adt_node fwd = *n;
    fwd.in[0] = n->in[1];
    fwd.n_in = 1;
    adt_shape zs;
    adt_dtype zd;
    if (interaction_infer(g, &fwd, &zs, &zd) || op_need_dtype(g, n, 0, ADT_F32) ||
        op_need_shape(g, n, 0, &zs, "the interaction of x"))
        return -1;
    os[0] = OP_IN(g, n, 1)->shape;
    od[0] = ADT_F32;
    return 0;
}

static void interaction_bwd_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 1);
    adt_k_interaction_backward(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), k->scratch, x->dim[0], x->dim[1], x->dim[2]);
}

static double interaction_flops(const adt_graph *g, const adt_node *n) {
    const adt_shape *x = &g->values[n->in[n->op == ADT_OP_INTERACTION ? 0 : 1]].shape;
    double f = (double)x->dim[0] * (double)x->dim[1] * (double)(x->dim[1] - 1) * (double)x->dim[2];
    return n->op == ADT_OP_INTERACTION ? f : 2.0 * f;
}

static int interaction_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    if (n->op == ADT_OP_INTERACTION) {
        op_sig(g, n, out, &c, max, "S0 -> S0");
        op_sig(g, n, out, &c, max, "S2 -> P"); /* dot products over a split embedding axis */
    } else {
        op_sig(g, n, out, &c, max, "S0 S0 -> S0");
        op_sig(g, n, out, &c, max, "B S2 -> S2");
        op_sig(g, n, out, &c, max, "P B -> P"); /* dx = (dZ + dZ^T) x: linear in each */
        op_sig(g, n, out, &c, max, "B P -> P");
    }
    return c;
}

const adt_op_def adt_opdef_interaction = {
    .name = "interaction", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = interaction_infer, .forward = interaction_forward, .backward = interaction_backward,
    .flops = interaction_flops, .scratch = interaction_scratch, .sbp = interaction_sbp,
};
const adt_op_def adt_opdef_interaction_bwd = {
    .name = "interaction_bwd", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = interaction_bwd_infer, .forward = interaction_bwd_forward, .flops = interaction_flops,
    .scratch = interaction_scratch, .sbp = interaction_sbp,
};

int adt_interaction(adt_graph *g, int x) {
    return op_node_out(g, ADT_OP_INTERACTION, (int[]){x}, 1, NULL, 0);
}
