/*
 * op_nn.c - neural-network ops: relu, gelu, sigmoid, layernorm, softmax, fused causal
 * attention and dropout, each with its backward op.
 */
#include "op_util.h"

/* ---- pointwise activations ---------------------------------------------------------------- */

/* Non-linear pointwise: any split passes through, partial sums do not. */
static int pointwise_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    op_sig_each_axis(g, n, out, &c, max, OP_OUT(g, n, 0)->shape.ndim);
    return c;
}

/* Backward of a pointwise op: linear in the incoming gradient, so a partial sum passes through
 * when the saved forward value is whole. */
static int pointwise_bwd_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = pointwise_sbp(g, n, out, max);
    op_sig(g, n, out, &c, max, "P B -> P");
    return c;
}

static double flops_x1(const adt_graph *g, const adt_node *n) { return (double)OP_NUMEL(g, n->out[0]); }
static double flops_x4(const adt_graph *g, const adt_node *n) { return 4.0 * (double)OP_NUMEL(g, n->out[0]); }
static double flops_x16(const adt_graph *g, const adt_node *n) { return 16.0 * (double)OP_NUMEL(g, n->out[0]); }

#define POINTWISE_OP(NAME, KIND, FWD_KERNEL, BWD_KERNEL, BWD_ARG, FLOPS)                       \
    static void NAME##_forward(const adt_kctx *k) {                                          \
        FWD_KERNEL(K_OUT(k, 0), K_IN(k, 0), K_NUMEL_OUT(k, 0));                                \
    }                                                                                          \
    static void NAME##_bwd_forward(const adt_kctx *k) {                                      \
        BWD_KERNEL(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), K_NUMEL_OUT(k, 0));                    \
    }                                                                                          \
    static int NAME##_backward(adt_graph *g, int node, const int *dout, const int *need,      \
                               int *din) {                                                     \
        if (need[0]) {                                                                         \
            const adt_node *n = &g->nodes[node];                                               \
            din[0] = op_node_out(g, KIND##_BWD, (int[]){dout[0], BWD_ARG}, 2, NULL, 0);        \
        }                                                                                      \
        return 0;                                                                              \
    }                                                                                          \
    const adt_op_def adt_opdef_##NAME = {                                                      \
        .name = #NAME, .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,                \
        .infer = op_infer_same_shape, .forward = NAME##_forward, .backward = NAME##_backward,          \
        .flops = FLOPS, .sbp = pointwise_sbp,                                                  \
    };                                                                                         \
    const adt_op_def adt_opdef_##NAME##_bwd = {                                                \
        .name = #NAME "_bwd", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,         \
        .infer = op_infer_same_shape, .forward = NAME##_bwd_forward, .flops = FLOPS,                   \
        .sbp = pointwise_bwd_sbp,                                                              \
    };

/* gelu differentiates from its input; relu and sigmoid from their output. relu's output is
 * positive exactly where its input is, and reading it (as PyTorch's threshold_backward does)
 * lets the pre-activation die after the forward pass: the weight gradient of the next layer
 * has just read the output, so it is also the one still in cache. */
POINTWISE_OP(relu, ADT_OP_RELU, adt_k_relu_forward, adt_k_relu_backward, n->out[0], flops_x1)
POINTWISE_OP(gelu, ADT_OP_GELU, adt_k_gelu_forward, adt_k_gelu_backward, n->in[0], flops_x16)
POINTWISE_OP(sigmoid, ADT_OP_SIGMOID, adt_k_sigmoid_forward, adt_k_sigmoid_backward, n->out[0],
             flops_x4)

int adt_relu(adt_graph *g, int x) { return op_node_out(g, ADT_OP_RELU, (int[]){x}, 1, NULL, 0); }
int adt_gelu(adt_graph *g, int x) { return op_node_out(g, ADT_OP_GELU, (int[]){x}, 1, NULL, 0); }
int adt_sigmoid(adt_graph *g, int x) {
    return op_node_out(g, ADT_OP_SIGMOID, (int[]){x}, 1, NULL, 0);
}

/* ---- layernorm over the last axis --------------------------------------------------------- */

static adt_shape rows_shape(const adt_shape *x) {
    adt_shape r = *x;
    r.ndim--;
    if (r.ndim == 0) r = adt_shape_1d(1);
    return r;
}

static int layernorm_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    for (int i = 0; i < 3; i++)
        if (op_need_dtype(g, n, i, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape;
    int64_t C = x->dim[x->ndim - 1];
    char exp[64];
    snprintf(exp, sizeof exp, "[%lld] (the last dim of input 0)", (long long)C);
    for (int i = 1; i < 3; i++) {
        const adt_shape *p = &OP_IN(g, n, i)->shape;
        if (p->ndim != 1 || p->dim[0] != C) return op_fail_shape(g, n, i, exp);
    }
    os[0] = *x;
    os[1] = os[2] = rows_shape(x);
    od[0] = od[1] = od[2] = ADT_F32;
    return 0;
}

static void layernorm_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    int64_t C = x->dim[x->ndim - 1], N = adt_shape_numel(x) / C;
    adt_k_layernorm_forward(K_OUT(k, 0), K_OUT(k, 1), K_OUT(k, 2), K_IN(k, 0), K_IN(k, 1), K_IN(k, 2),
                            N, C, k->n->a.f[0]);
}

static int layernorm_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    const adt_node *n = &g->nodes[node];
    int outs[3];
    int in[5] = {dout[0], n->in[0], n->in[1], n->out[1], n->out[2]};
    if (op_node(g, ADT_OP_LAYERNORM_BWD, in, 5, &n->a, outs) < 0) return -1;
    for (int i = 0; i < 3; i++)
        if (need[i]) din[i] = outs[i];
    return 0;
}

static int layernorm_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 0)->shape.ndim;
    for (int ax = 0; ax < r - 1; ax++) op_sig(g, n, out, &c, max, "S%d B B -> S%d S%d S%d", ax, ax, ax, ax);
    return c;
}

static double layernorm_flops(const adt_graph *g, const adt_node *n) {
    return 8.0 * (double)OP_NUMEL(g, n->in[0]);
}

const adt_op_def adt_opdef_layernorm = {
    .name = "layernorm", .n_in_min = 3, .n_in_max = 3, .n_out = 3, .view_of = -1,
    .infer = layernorm_infer, .forward = layernorm_forward, .backward = layernorm_backward,
    .flops = layernorm_flops, .sbp = layernorm_sbp,
};

/* inputs dy, x, w, mean, rstd */
static int layernorm_bwd_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    for (int i = 0; i < 5; i++)
        if (op_need_dtype(g, n, i, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 1)->shape;
    adt_shape c = adt_shape_1d(x->dim[x->ndim - 1]), rows = rows_shape(x);
    if (op_need_shape(g, n, 0, x, "the shape of x") || op_need_shape(g, n, 2, &c, "the last dim of x") ||
        op_need_shape(g, n, 3, &rows, "x without its last axis") || op_need_shape(g, n, 4, &rows, "x without its last axis"))
        return -1;
    os[0] = *x;
    os[1] = os[2] = OP_IN(g, n, 2)->shape;
    od[0] = od[1] = od[2] = ADT_F32;
    return 0;
}

static void layernorm_bwd_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 1);
    int64_t C = x->dim[x->ndim - 1], N = adt_shape_numel(x) / C;
    adt_k_layernorm_backward(K_OUT(k, 0), K_OUT(k, 1), K_OUT(k, 2), K_IN(k, 0), K_IN(k, 1), K_IN(k, 2),
                             K_IN(k, 3), K_IN(k, 4), N, C);
}

static int layernorm_bwd_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 1)->shape.ndim;
    for (int ax = 0; ax < r - 1; ax++)
        op_sig(g, n, out, &c, max, "S%d S%d B S%d S%d -> S%d P P", ax, ax, ax, ax, ax);
    op_sig(g, n, out, &c, max, "P B B B B -> P P P"); /* linear in dy */
    return c;
}

const adt_op_def adt_opdef_layernorm_bwd = {
    .name = "layernorm_bwd", .n_in_min = 5, .n_in_max = 5, .n_out = 3, .view_of = -1,
    .infer = layernorm_bwd_infer, .forward = layernorm_bwd_forward, .flops = layernorm_flops,
    .sbp = layernorm_bwd_sbp,
};

int adt_layernorm(adt_graph *g, int x, int w, int b, float eps) {
    adt_attrs at = {.f = {eps}};
    return op_node_out(g, ADT_OP_LAYERNORM, (int[]){x, w, b}, 3, &at, 0);
}

/* ---- softmax over the last axis ------------------------------------------------------------ */

static void softmax_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    int64_t C = x->dim[x->ndim - 1];
    adt_k_softmax_forward(K_OUT(k, 0), K_IN(k, 0), adt_shape_numel(x) / C, C);
}

static void softmax_bwd_forward(const adt_kctx *k) {
    const adt_shape *x = K_SHAPE_IN(k, 0);
    int64_t C = x->dim[x->ndim - 1];
    adt_k_softmax_backward(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), adt_shape_numel(x) / C, C);
}

static int softmax_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (need[0])
        din[0] = op_node_out(g, ADT_OP_SOFTMAX_BWD, (int[]){dout[0], g->nodes[node].out[0]}, 2, NULL, 0);
    return 0;
}

static int softmax_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    op_sig_each_axis(g, n, out, &c, max, OP_OUT(g, n, 0)->shape.ndim - 1);
    return c;
}

const adt_op_def adt_opdef_softmax = {
    .name = "softmax", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = op_infer_same_shape, .forward = softmax_forward, .backward = softmax_backward,
    .flops = flops_x4, .sbp = softmax_sbp,
};
/* linear in dy: a partial sum passes through with the softmax output whole */
static int softmax_bwd_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = softmax_sbp(g, n, out, max);
    op_sig(g, n, out, &c, max, "P B -> P");
    return c;
}

const adt_op_def adt_opdef_softmax_bwd = {
    .name = "softmax_bwd", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = op_infer_same_shape, .forward = softmax_bwd_forward, .flops = flops_x4, .sbp = softmax_bwd_sbp,
};

int adt_softmax(adt_graph *g, int x) { return op_node_out(g, ADT_OP_SOFTMAX, (int[]){x}, 1, NULL, 0); }

/* ---- fused causal self-attention ---------------------------------------------------------- */

/* qkv[B,T,3,C] holds q | k | v, each C = H heads of D. Row-major it is the [B,T,3C] of Hugging
 * Face's c_attn output, so the kernels read either alike. A split of the last axis into blocks
 * of whole heads is again such a tensor, [B,T,3,C_local] with C_local / D heads: that is the
 * head split of tensor parallelism, and the localize rule below rewrites the head count. */
static int attn_qkv_input(const adt_node *n) { return n->op == ADT_OP_ATTENTION ? 0 : 1; }

static void attn_dims(const adt_shape *qkv, int64_t *B, int64_t *T, int64_t *C) {
    *B = qkv->dim[0];
    *T = qkv->dim[1];
    *C = qkv->dim[3];
}

static int attention_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32)) return -1;
    const adt_shape *q = &OP_IN(g, n, 0)->shape;
    int64_t H = n->a.i[0], D = n->a.i[1];
    if (q->ndim != 4 || q->dim[2] != 3) return op_fail_shape(g, n, 0, "[B,T,3,C] (q|k|v)");
    int64_t C = q->dim[3];
    if (H < 1 || D < 0 || (D ? C != H * D : C % H != 0)) {
        char exp[128];
        if (D) snprintf(exp, sizeof exp, "a width C of %lld heads x %lld (whole heads)", (long long)H, (long long)D);
        else snprintf(exp, sizeof exp, "a width C divisible by the %lld heads", (long long)H);
        return op_fail_shape(g, n, 0, exp);
    }
    int64_t B, T;
    attn_dims(q, &B, &T, &C);
    os[0] = adt_shape_3d(B, T, C);
    os[1] = adt_shape_4d(B, H, T, T);
    od[0] = od[1] = ADT_F32;
    return 0;
}

static int64_t attention_scratch(const adt_graph *g, const adt_node *n) {
    int64_t B, T, C;
    attn_dims(&g->values[n->in[attn_qkv_input(n)]].shape, &B, &T, &C);
    return adt_k_attention_scratch_floats(B, T, C, n->a.i[0]);
}

static void attention_forward(const adt_kctx *k) {
    int64_t B, T, C;
    attn_dims(K_SHAPE_IN(k, 0), &B, &T, &C);
    adt_k_attention_forward(K_OUT(k, 0), K_OUT(k, 1), K_IN(k, 0), k->scratch, B, T, C, k->n->a.i[0]);
}

static int attention_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[0]) return 0;
    const adt_node *n = &g->nodes[node];
    int in[3] = {dout[0], n->in[0], n->out[1]};
    din[0] = op_node_out(g, ADT_OP_ATTENTION_BWD, in, 3, &n->a, 0);
    return 0;
}

static double attention_flops(const adt_graph *g, const adt_node *n) {
    int64_t B, T, C;
    attn_dims(&g->values[n->in[attn_qkv_input(n)]].shape, &B, &T, &C);
    double f = 4.0 * (double)B * (double)T * (double)T * (double)C; /* q k^T and att v */
    return n->op == ADT_OP_ATTENTION ? f : 2.0 * f;
}

/* Batch split, and head split: qkv's last axis in blocks of whole heads gives each device its
 * heads' q, k and v, its heads' columns of y and its heads' rows of att. */
static int attention_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    if (n->op == ADT_OP_ATTENTION) {
        op_sig(g, n, out, &c, max, "S0 -> S0 S0");
        op_sig(g, n, out, &c, max, "S3 -> S2 S1");
    } else {
        op_sig(g, n, out, &c, max, "S0 S0 S0 -> S0");
        op_sig(g, n, out, &c, max, "S2 S3 S1 -> S3");
        op_sig(g, n, out, &c, max, "P B B -> P"); /* linear in dy */
    }
    return c;
}

/* The heads of a block of qkv: its width over the head size (whole heads, or the shape rule
 * refuses the block: the count then no longer multiplies out to the width). */
static void attention_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    const adt_box *q = &in[attn_qkv_input(n)];
    int64_t H = n->a.i[0], C = q->global.dim[3], D = n->a.i[1] ? n->a.i[1] : (H > 0 ? C / H : 0);
    if (D < 1) return;
    a->i[0] = q->shape.dim[3] / D;
    a->i[1] = D;
    if (a->i[0] < 1) a->i[0] = 1; /* less than a head: refused by C != H x D */
}

const adt_op_def adt_opdef_attention = {
    .name = "attention", .n_in_min = 1, .n_in_max = 1, .n_out = 2, .view_of = -1,
    .infer = attention_infer, .forward = attention_forward, .backward = attention_backward,
    .flops = attention_flops, .scratch = attention_scratch, .sbp = attention_sbp,
    .localize = attention_localize, .is_matmul = 1,
};

/* inputs dy[B,T,C], qkv[B,T,3,C], att[B,H,T,T]: the forward's rule on qkv, then the others */
static int attention_bwd_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    adt_node fwd = *n;
    fwd.in[0] = n->in[1];
    fwd.n_in = 1;
    adt_shape fo[2];
    adt_dtype fd[2];
    if (attention_infer(g, &fwd, fo, fd)) return -1;
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 2, ADT_F32) ||
        op_need_shape(g, n, 0, &fo[0], "[B,T,C] of qkv") || op_need_shape(g, n, 2, &fo[1], "[B,H,T,T] of qkv"))
        return -1;
    os[0] = OP_IN(g, n, 1)->shape;
    od[0] = ADT_F32;
    return 0;
}

static void attention_bwd_forward(const adt_kctx *k) {
    int64_t B, T, C;
    attn_dims(K_SHAPE_IN(k, 1), &B, &T, &C);
    adt_k_attention_backward(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), K_IN(k, 2), k->scratch, B, T, C,
                             k->n->a.i[0]);
}

const adt_op_def adt_opdef_attention_bwd = {
    .name = "attention_bwd", .n_in_min = 3, .n_in_max = 3, .n_out = 1, .view_of = -1,
    .infer = attention_bwd_infer, .forward = attention_bwd_forward, .flops = attention_flops,
    .scratch = attention_scratch, .sbp = attention_sbp, .localize = attention_localize, .is_matmul = 1,
};

int adt_attention(adt_graph *g, int qkv, int n_head) {
    if (g->status) return -1;
    adt_attrs at = {.i = {n_head}};
    /* the head size of the whole tensor, so that a block of it knows its own head count */
    if (qkv >= 0 && qkv < g->n_values && n_head > 0) {
        const adt_shape *s = &g->values[qkv].shape;
        if (s->ndim == 4 && s->dim[3] % n_head == 0) at.i[1] = s->dim[3] / n_head;
    }
    return op_node_out(g, ADT_OP_ATTENTION, (int[]){qkv}, 1, &at, 0);
}

/* ---- dropout ------------------------------------------------------------------------------- */

static int dropout_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    adt_shape one = adt_shape_1d(1);
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_I32) ||
        op_need_shape(g, n, 1, &one, "the step, a scalar"))
        return -1;
    float p = n->a.f[0];
    if (!(p >= 0.0f && p < 1.0f))
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: dropout probability %g, expected 0 <= p < 1",
                              n->name, (double)p);
    os[0] = OP_IN(g, n, 0)->shape;
    od[0] = ADT_F32;
    return 0;
}

/* The mask key: the run's seed, the dropout site and the step, so masks differ per step. */
static uint64_t dropout_key(const adt_kctx *k) {
    int32_t step = *(const int32_t *)k->in[1];
    return adt_rng_mix64(k->seed ^ adt_rng_mix64(((uint64_t)k->n->a.i[0] << 32) ^ (uint32_t)step));
}

/* The box's offset in the whole batch: microbatch m holds rows from m times its own size on,
 * so the mask is the one the serial run of the whole batch draws. */
static const int64_t *dropout_offset(const adt_kctx *k, const adt_value *x, int64_t *off) {
    memcpy(off, x->offset, sizeof x->offset);
    if (x->shape.ndim > 0) off[0] += (int64_t)k->microbatch * x->global_shape.dim[0];
    return off;
}

static void dropout_forward(const adt_kctx *k) {
    const adt_value *x = &k->g->values[k->n->in[0]];
    if (!k->training) {
        memcpy(K_OUT(k, 0), K_IN(k, 0), (size_t)adt_shape_numel(&x->shape) * sizeof(float));
        return;
    }
    int64_t off[ADT_MAX_DIMS];
    adt_k_dropout_forward(K_OUT(k, 0), K_IN(k, 0), k->n->a.f[0], dropout_key(k), x->shape.ndim,
                          x->shape.dim, x->global_shape.dim, dropout_offset(k, x, off));
}

static void dropout_bwd_forward(const adt_kctx *k) {
    const adt_value *x = &k->g->values[k->n->in[0]];
    int64_t off[ADT_MAX_DIMS];
    adt_k_dropout_backward(K_OUT(k, 0), K_IN(k, 0), k->n->a.f[0], dropout_key(k), x->shape.ndim,
                           x->shape.dim, x->global_shape.dim, dropout_offset(k, x, off));
}

static int dropout_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    const adt_node *n = &g->nodes[node];
    if (need[0]) din[0] = op_node_out(g, ADT_OP_DROPOUT_BWD, (int[]){dout[0], n->in[1]}, 2, &n->a, 0);
    return 0;
}

static int dropout_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_OUT(g, n, 0)->shape.ndim;
    for (int ax = 0; ax < r; ax++) op_sig(g, n, out, &c, max, "S%d B -> S%d", ax, ax);
    op_sig(g, n, out, &c, max, "P B -> P"); /* the mask is fixed: dropout is linear in x */
    return c;
}

const adt_op_def adt_opdef_dropout = {
    .name = "dropout", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = dropout_infer, .forward = dropout_forward, .backward = dropout_backward,
    .flops = flops_x4, .sbp = dropout_sbp,
};
const adt_op_def adt_opdef_dropout_bwd = {
    .name = "dropout_bwd", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = dropout_infer, .forward = dropout_bwd_forward, .flops = flops_x4, .sbp = dropout_sbp,
};

int adt_dropout(adt_graph *g, int x, float p, int stream) {
    if (g->status) return -1;
    if (p == 0.0f) return x;
    if (g->step_input < 0) {
        g->step_input = adt_input(g, "step", ADT_I32, adt_shape_1d(1));
        if (g->step_input < 0) return -1;
    }
    adt_attrs at = {.i = {stream}, .f = {p}};
    return op_node_out(g, ADT_OP_DROPOUT, (int[]){x, g->step_input}, 2, &at, 0);
}
