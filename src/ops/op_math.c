/*
 * op_math.c - linear algebra and elementwise arithmetic ops: matmul, add, sub, mul, scale,
 * bias-add, reduce-sum and its inverse expand, and fill.
 */
#include "op_util.h"

/* ---- matmul ------------------------------------------------------------------------------- */

/* A non-batched product views each operand X as a matrix [rows, cols]: its last q axes are the
 * columns (q = 1, or attribute i3 for A and i4 for B), the others the rows; a transposed operand
 * swaps the two groups. The output's axes are op(A)'s row axes followed by op(B)'s column axes,
 * so an axis grouping survives the product and its gradients:
 *   X[..,K] @ W[K,N]         -> [..,N]     (q 1, 1)
 *   X[..,C] @ W[C,3,C]       -> [..,3,C]   (q 1, 2: q | k | v stay a separate axis)
 *   dY[..,3,C] @ W[C,3,C]^T  -> [..,C]     (q 2, 2)
 *   X[..,C]^T @ dY[..,3,C]   -> [C,3,C]    (q 1, 2)
 * A batched product multiplies the last two axes of each batch (q must be 1). */
typedef struct mm_axes {
    int m0, nm; /* op(A)'s row axes: A's axes [m0, m0 + nm)                 */
    int ka, nk; /* op(A)'s column axes, contracted: A's [ka, ka + nk)       */
    int kb, nkb; /* op(B)'s row axes, contracted: B's [kb, kb + nkb)        */
    int n0, nn; /* op(B)'s column axes: B's [n0, n0 + nn)                   */
} mm_axes;

static int mm_q(int64_t q) { return q > 1 ? (int)q : 1; }

static mm_axes mm_axes_of(int ra, int rb, const adt_attrs *at) {
    int qa = mm_q(at->i[3]), qb = mm_q(at->i[4]);
    mm_axes x;
    if (!at->i[0]) x.m0 = 0, x.nm = ra - qa, x.ka = ra - qa, x.nk = qa;
    else x.m0 = ra - qa, x.nm = qa, x.ka = 0, x.nk = ra - qa;
    if (!at->i[1]) x.kb = 0, x.nkb = rb - qb, x.n0 = rb - qb, x.nn = qb;
    else x.kb = rb - qb, x.nkb = qb, x.n0 = 0, x.nn = rb - qb;
    return x;
}

/* M, N, K (as op(A) sees it; Kb as op(B) does) and batch count of a matmul node. */
static void matmul_dims(const adt_graph *g, const adt_node *n, int64_t *M, int64_t *N, int64_t *K,
                        int64_t *Kb, int64_t *batch) {
    const adt_shape *a = &OP_IN(g, n, 0)->shape, *b = &OP_IN(g, n, 1)->shape;
    int ta = (int)n->a.i[0], tb = (int)n->a.i[1];
    if (n->a.i[2]) {
        *batch = adt_shape_prod(a, 0, a->ndim - 2);
        int64_t ar = a->dim[a->ndim - 2], ac = a->dim[a->ndim - 1];
        int64_t br = b->dim[b->ndim - 2], bc = b->dim[b->ndim - 1];
        *M = ta ? ac : ar, *K = ta ? ar : ac;
        *Kb = tb ? bc : br, *N = tb ? br : bc;
        return;
    }
    mm_axes x = mm_axes_of(a->ndim, b->ndim, &n->a);
    *batch = 1;
    *M = adt_shape_prod(a, x.m0, x.m0 + x.nm);
    *K = adt_shape_prod(a, x.ka, x.ka + x.nk);
    *Kb = adt_shape_prod(b, x.kb, x.kb + x.nkb);
    *N = adt_shape_prod(b, x.n0, x.n0 + x.nn);
}

void adt_matmul_dims(const adt_graph *g, const adt_node *n, int64_t *M, int64_t *N, int64_t *K, int64_t *batch) {
    int64_t Kb;
    matmul_dims(g, n, M, N, K, &Kb, batch);
}

static int matmul_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_F32)) return -1;
    const adt_shape *a = &OP_IN(g, n, 0)->shape, *b = &OP_IN(g, n, 1)->shape;
    int batched = (int)n->a.i[2], qa = mm_q(n->a.i[3]), qb = mm_q(n->a.i[4]);
    char exp[128];
    if (batched) {
        if (qa != 1 || qb != 1) return op_fail_shape(g, n, 0, "a plain batched product (column groups of one axis)");
        if (a->ndim < 3 || a->ndim != b->ndim)
            return op_fail_shape(g, n, 1, "the same rank (>= 3) as input 0 for a batched matmul");
        for (int i = 0; i < a->ndim - 2; i++)
            if (a->dim[i] != b->dim[i])
                return op_fail_shape(g, n, 1, "the same leading (batch) dims as input 0");
    } else {
        /* every operand needs a row axis besides its q column axes */
        const adt_shape *s[2] = {a, b};
        int q[2] = {qa, qb};
        for (int i = 0; i < 2; i++)
            if (s[i]->ndim < q[i] + 1) {
                snprintf(exp, sizeof exp, "a tensor of rank >= %d (%d column axes and a row axis)", q[i] + 1, q[i]);
                return op_fail_shape(g, n, i, exp);
            }
    }
    int64_t M, N, K, Kb, batch;
    matmul_dims(g, n, &M, &N, &K, &Kb, &batch);
    if (K != Kb) {
        snprintf(exp, sizeof exp, "an inner dimension of %lld to match input 0", (long long)K);
        return op_fail_shape(g, n, 1, exp);
    }
    adt_shape o = *a;
    if (batched) {
        o.dim[o.ndim - 2] = M;
        o.dim[o.ndim - 1] = N;
    } else {
        mm_axes x = mm_axes_of(a->ndim, b->ndim, &n->a);
        if (x.nm + x.nn > ADT_MAX_DIMS) return op_fail_shape(g, n, 1, "an output of rank <= 6");
        o.ndim = 0;
        for (int i = 0; i < x.nm; i++) o.dim[o.ndim++] = a->dim[x.m0 + i];
        for (int i = 0; i < x.nn; i++) o.dim[o.ndim++] = b->dim[x.n0 + i];
    }
    os[0] = o;
    od[0] = ADT_F32;
    return 0;
}

/* Two forms that graphs never hold, which the executor runs in place of graph nodes (exec.c),
 * both of a non-batched product: a third input, a bias[N] added to every row (a bias_add
 * folded in), and attribute i5 = 1, which accumulates: C = op(A) op(B) + f0 C (a momentum
 * update folded in). */
static void matmul_forward(const adt_kctx *k) {
    int64_t M, N, K, Kb, batch;
    matmul_dims(k->g, k->n, &M, &N, &K, &Kb, &batch);
    int ta = (int)k->n->a.i[0], tb = (int)k->n->a.i[1];
    if (k->n->n_in == 3) {
        ADT_ASSERT(batch == 1);
        adt_k_matmul_bias(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), K_IN(k, 2), M, N, K, ta, tb);
    } else if (k->n->a.i[5] == 1) {
        ADT_ASSERT(batch == 1);
        adt_k_matmul_acc(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), k->n->a.f[0], M, N, K, ta, tb);
    } else if (batch == 1)
        adt_k_matmul(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), M, N, K, ta, tb);
    else
        adt_k_matmul_batched(K_OUT(k, 0), K_IN(k, 0), K_IN(k, 1), batch, M, N, K, ta, tb, M * K,
                             K * N, M * N);
}

/* A product of the right size but maybe another view of the target: reshape it. */
static int fit_shape(adt_graph *g, int v, int like) {
    if (v < 0) return -1;
    if (adt_shape_equal(&g->values[v].shape, &g->values[like].shape)) return v;
    return adt_reshape(g, v, g->values[like].shape);
}

/* op(x) op(y) with column groups qx, qy */
static int mm(adt_graph *g, int x, int y, int tx, int ty, int bt, int qx, int qy) {
    adt_attrs at = {.i = {tx, ty, bt, qx > 1 ? qx : 0, qy > 1 ? qy : 0}};
    return op_node_out(g, ADT_OP_MATMUL, (int[]){x, y}, 2, &at, 0);
}

static int matmul_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    const adt_node n = g->nodes[node];
    int A = n.in[0], B = n.in[1], dC = dout[0];
    int ta = (int)n.a.i[0], tb = (int)n.a.i[1], bt = (int)n.a.i[2];
    int qa = mm_q(n.a.i[3]), qb = mm_q(n.a.i[4]);
    /* dC's columns are op(B)'s column axes */
    int qc = bt ? 1 : mm_axes_of(g->values[A].shape.ndim, g->values[B].shape.ndim, &n.a).nn;
    /* d(op(A) op(B)): each case is again one matmul with transposes, the groupings kept */
    if (need[0]) {
        int r;
        if (!ta) r = tb ? mm(g, dC, B, 0, 0, bt, qc, qb) : mm(g, dC, B, 0, 1, bt, qc, qb);
        else r = tb ? mm(g, B, dC, 1, 1, bt, qb, qc) : mm(g, B, dC, 0, 1, bt, qb, qc);
        din[0] = fit_shape(g, r, A);
    }
    if (need[1]) {
        int r;
        if (!tb) r = ta ? mm(g, A, dC, 0, 0, bt, qa, qc) : mm(g, A, dC, 1, 0, bt, qa, qc);
        else r = ta ? mm(g, dC, A, 1, 1, bt, qc, qa) : mm(g, dC, A, 1, 0, bt, qc, qa);
        din[1] = fit_shape(g, r, B);
    }
    return 0;
}

static double matmul_flops(const adt_graph *g, const adt_node *n) {
    int64_t M, N, K, Kb, batch;
    matmul_dims(g, n, &M, &N, &K, &Kb, &batch);
    return 2.0 * (double)batch * (double)M * (double)N * (double)K;
}

static int matmul_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    int ta = (int)n->a.i[0], tb = (int)n->a.i[1], bt = (int)n->a.i[2];
    const adt_shape *sa = &OP_IN(g, n, 0)->shape, *sb = &OP_IN(g, n, 1)->shape;
    if (bt) {
        for (int ax = 0; ax < sa->ndim - 2; ax++) op_sig(g, n, out, &c, max, "S%d S%d -> S%d", ax, ax, ax);
        /* m, n and k splits on the matrix axes */
        op_sig(g, n, out, &c, max, "S%d B -> S-2", ta ? -1 : -2);
        op_sig(g, n, out, &c, max, "B S%d -> S-1", tb ? -2 : -1);
        op_sig(g, n, out, &c, max, "S%d S%d -> P", ta ? -2 : -1, tb ? -1 : -2);
    } else {
        mm_axes x = mm_axes_of(sa->ndim, sb->ndim, &n->a);
        /* m split: any row axis of op(A); n split: any column axis of op(B) (groups kept) */
        for (int i = 0; i < x.nm; i++) op_sig(g, n, out, &c, max, "S%d B -> S%d", x.m0 + i, i);
        for (int j = 0; j < x.nn; j++) op_sig(g, n, out, &c, max, "B S%d -> S%d", x.n0 + j, x.nm + j);
        /* k split: partial sums. The first contracted axis cuts both into contiguous ranges of
         * the flattened k (the shape rule sees that the lengths agree); a later one only where
         * both operands group k alike up to it (X^T dY over [B,T], dY W^T over (3, C)). */
        op_sig(g, n, out, &c, max, "S%d S%d -> P", x.ka, x.kb);
        for (int i = 1; i < x.nk && i < x.nkb; i++)
            if (sa->dim[x.ka + i] == sb->dim[x.kb + i] &&
                adt_shape_prod(sa, x.ka, x.ka + i) == adt_shape_prod(sb, x.kb, x.kb + i))
                op_sig(g, n, out, &c, max, "S%d S%d -> P", x.ka + i, x.kb + i);
    }
    op_sig(g, n, out, &c, max, "P B -> P");
    op_sig(g, n, out, &c, max, "B P -> P");
    return c;
}

const adt_op_def adt_opdef_matmul = {
    .name = "matmul", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = matmul_infer, .forward = matmul_forward, .backward = matmul_backward,
    .flops = matmul_flops, .sbp = matmul_sbp, .is_matmul = 1,
};

int adt_matmul(adt_graph *g, int a, int b, int trans_a, int trans_b, int batched) {
    return mm(g, a, b, trans_a ? 1 : 0, trans_b ? 1 : 0, batched ? 1 : 0, 1, 1);
}

int adt_matmul_grouped(adt_graph *g, int a, int b, int trans_a, int trans_b, int a_cols, int b_cols) {
    if (g->status) return -1;
    if (a_cols < 1 || b_cols < 1 || a_cols >= ADT_MAX_DIMS || b_cols >= ADT_MAX_DIMS)
        return adt_graph_fail(g, ADT_ERR_ARG, "matmul: column groups of %d and %d axes, expected 1..%d", a_cols, b_cols,
                              ADT_MAX_DIMS - 1);
    return mm(g, a, b, trans_a ? 1 : 0, trans_b ? 1 : 0, 0, a_cols, b_cols);
}

/* ---- add (n-ary), sub, mul, scale --------------------------------------------------------- */

static void add_forward(const adt_kctx *k) {
    int64_t n = K_NUMEL_OUT(k, 0);
    float *o = K_OUT(k, 0);
    const float *a = K_IN(k, 0), *b = K_IN(k, 1);
    for (int64_t i = 0; i < n; i++) o[i] = a[i] + b[i];
    for (int j = 2; j < k->n->n_in; j++) {
        const float *c = K_IN(k, j);
        for (int64_t i = 0; i < n; i++) o[i] += c[i];
    }
}

static int add_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    for (int i = 0; i < g->nodes[node].n_in; i++)
        if (need[i]) din[i] = dout[0];
    return 0;
}

static double add_flops(const adt_graph *g, const adt_node *n) {
    return (double)(n->n_in - 1) * (double)OP_NUMEL(g, n->out[0]);
}

static int elementwise_linear_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    op_sig_each_axis(g, n, out, &c, max, OP_OUT(g, n, 0)->shape.ndim);
    op_sig_partial(g, n, out, &c, max);
    return c;
}

const adt_op_def adt_opdef_add = {
    .name = "add", .n_in_min = 2, .n_in_max = ADT_MAX_INPUTS, .n_out = 1, .view_of = -1,
    .infer = op_infer_same_shape, .forward = add_forward, .backward = add_backward,
    .flops = add_flops, .sbp = elementwise_linear_sbp,
};

int adt_add(adt_graph *g, int a, int b) {
    return op_node_out(g, ADT_OP_ADD, (int[]){a, b}, 2, NULL, 0);
}

int adt_add_n(adt_graph *g, const int *xs, int n) {
    if (n == 1) return xs[0];
    return op_node_out(g, ADT_OP_ADD, xs, n, NULL, 0);
}

static void sub_forward(const adt_kctx *k) {
    int64_t n = K_NUMEL_OUT(k, 0);
    float *o = K_OUT(k, 0);
    const float *a = K_IN(k, 0), *b = K_IN(k, 1);
    for (int64_t i = 0; i < n; i++) o[i] = a[i] - b[i];
}

static int sub_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (need[0]) din[0] = dout[0];
    if (need[1]) din[1] = adt_scale(g, dout[0], -1.0f);
    return 0;
}

const adt_op_def adt_opdef_sub = {
    .name = "sub", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = op_infer_same_shape, .forward = sub_forward, .backward = sub_backward,
    .flops = op_flops_per_out, .sbp = elementwise_linear_sbp,
};

int adt_sub(adt_graph *g, int a, int b) {
    return op_node_out(g, ADT_OP_SUB, (int[]){a, b}, 2, NULL, 0);
}

static void mul_forward(const adt_kctx *k) {
    int64_t n = K_NUMEL_OUT(k, 0);
    float *o = K_OUT(k, 0);
    const float *a = K_IN(k, 0), *b = K_IN(k, 1);
    for (int64_t i = 0; i < n; i++) o[i] = a[i] * b[i];
}

static int mul_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    int a = g->nodes[node].in[0], b = g->nodes[node].in[1];
    if (need[0]) din[0] = adt_mul(g, dout[0], b);
    if (need[1]) din[1] = adt_mul(g, dout[0], a);
    return 0;
}

static int mul_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0;
    op_sig_each_axis(g, n, out, &c, max, OP_OUT(g, n, 0)->shape.ndim);
    op_sig(g, n, out, &c, max, "P B -> P");
    op_sig(g, n, out, &c, max, "B P -> P");
    return c;
}

const adt_op_def adt_opdef_mul = {
    .name = "mul", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = op_infer_same_shape, .forward = mul_forward, .backward = mul_backward,
    .flops = op_flops_per_out, .sbp = mul_sbp,
};

int adt_mul(adt_graph *g, int a, int b) {
    return op_node_out(g, ADT_OP_MUL, (int[]){a, b}, 2, NULL, 0);
}

static void scale_forward(const adt_kctx *k) {
    int64_t n = K_NUMEL_OUT(k, 0);
    float *o = K_OUT(k, 0);
    const float *x = K_IN(k, 0);
    float s = k->n->a.f[0];
    for (int64_t i = 0; i < n; i++) o[i] = s * x[i];
}

static int scale_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (need[0]) din[0] = adt_scale(g, dout[0], g->nodes[node].a.f[0]);
    return 0;
}

const adt_op_def adt_opdef_scale = {
    .name = "scale", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = op_infer_same_shape, .forward = scale_forward, .backward = scale_backward,
    .flops = op_flops_per_out, .sbp = elementwise_linear_sbp,
};

int adt_scale(adt_graph *g, int x, float s) {
    adt_attrs at = {.f = {s}};
    return op_node_out(g, ADT_OP_SCALE, (int[]){x}, 1, &at, 0);
}

/* ---- bias add ----------------------------------------------------------------------------- */

/* x[..,N] + b[N], or over several trailing axes: x[..,3,C] + b[3,C] (b's shape is x's last
 * axes), so a bias held with an axis grouping splits along with its layer's output. */
static int bias_add_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32) || op_need_dtype(g, n, 1, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape, *b = &OP_IN(g, n, 1)->shape;
    int q = b->ndim, ok = q >= 1 && q <= x->ndim;
    for (int i = 0; i < q && ok; i++) ok = b->dim[i] == x->dim[x->ndim - q + i];
    if (!ok) {
        char exp[96], xs[64];
        adt_shape last = *x;
        if (q >= 1 && q <= x->ndim) {
            last.ndim = q;
            memmove(last.dim, x->dim + x->ndim - q, (size_t)q * sizeof *last.dim);
        } else {
            last = adt_shape_1d(x->dim[x->ndim - 1]);
        }
        snprintf(exp, sizeof exp, "%s (the last dims of input 0)", adt_shape_str(&last, xs, sizeof xs));
        return op_fail_shape(g, n, 1, exp);
    }
    os[0] = *x;
    od[0] = ADT_F32;
    return 0;
}

static void bias_add_forward(const adt_kctx *k) {
    int64_t C = K_NUMEL_IN(k, 1), R = K_NUMEL_IN(k, 0) / C;
    const float *in = K_IN(k, 0), *b = K_IN(k, 1);
    float *o = K_OUT(k, 0);
    for (int64_t r = 0; r < R; r++)
        for (int64_t c = 0; c < C; c++) o[r * C + c] = in[r * C + c] + b[c];
}

static int bias_add_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    const adt_node *n = &g->nodes[node];
    int lead = g->values[n->in[0]].shape.ndim - g->values[n->in[1]].shape.ndim; /* axes b is broadcast over */
    if (need[0]) din[0] = dout[0];
    if (need[1]) din[1] = lead > 0 ? adt_reduce_sum(g, dout[0], 0, lead - 1) : dout[0];
    return 0;
}

static int bias_add_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 0)->shape.ndim, q = OP_IN(g, n, 1)->shape.ndim;
    for (int ax = 0; ax < r - q; ax++) op_sig(g, n, out, &c, max, "S%d B -> S%d", ax, ax);
    for (int j = 0; j < q; j++) op_sig(g, n, out, &c, max, "S%d S%d -> S%d", r - q + j, j, r - q + j);
    op_sig(g, n, out, &c, max, "P P -> P");
    return c;
}

const adt_op_def adt_opdef_bias_add = {
    .name = "bias_add", .n_in_min = 2, .n_in_max = 2, .n_out = 1, .view_of = -1,
    .infer = bias_add_infer, .forward = bias_add_forward, .backward = bias_add_backward,
    .flops = op_flops_per_out, .sbp = bias_add_sbp,
};

int adt_bias_add(adt_graph *g, int x, int b) {
    return op_node_out(g, ADT_OP_BIAS_ADD, (int[]){x, b}, 2, NULL, 0);
}

/* ---- reduce-sum over a range of axes, and expand (its inverse) ----------------------------- */

static int reduce_sum_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape;
    int f = (int)n->a.i[0], l = (int)n->a.i[1];
    if (f < 0 || l < f || l >= x->ndim)
        return adt_graph_fail(g, ADT_ERR_ARG, "node %s: axes %d..%d are not a range of a rank-%d tensor",
                              n->name, f, l, x->ndim);
    adt_shape o = {0};
    for (int i = 0; i < x->ndim; i++)
        if (i < f || i > l) o.dim[o.ndim++] = x->dim[i];
    if (o.ndim == 0) o = adt_shape_1d(1);
    os[0] = o;
    od[0] = ADT_F32;
    return 0;
}

/* x viewed as [outer, red, inner] */
static void reduce_view(const adt_shape *x, int f, int l, int64_t *outer, int64_t *red, int64_t *inner) {
    *outer = adt_shape_prod(x, 0, f);
    *red = adt_shape_prod(x, f, l + 1);
    *inner = adt_shape_prod(x, l + 1, x->ndim);
}

static void reduce_sum_forward(const adt_kctx *k) {
    int64_t outer, red, inner;
    reduce_view(K_SHAPE_IN(k, 0), (int)k->n->a.i[0], (int)k->n->a.i[1], &outer, &red, &inner);
    const float *x = K_IN(k, 0);
    float *o = K_OUT(k, 0);
    for (int64_t a = 0; a < outer; a++) {
        float *dst = o + a * inner;
        for (int64_t c = 0; c < inner; c++) dst[c] = 0.0f;
        for (int64_t r = 0; r < red; r++) {
            const float *src = x + (a * red + r) * inner;
            for (int64_t c = 0; c < inner; c++) dst[c] += src[c];
        }
    }
}

static int reduce_sum_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (!need[0]) return 0;
    const adt_node *n = &g->nodes[node];
    const adt_shape *x = &g->values[n->in[0]].shape;
    adt_attrs at = {.i = {n->a.i[0], n->a.i[1]}};
    at.f[0] = (n->a.i[0] == 0 && n->a.i[1] == x->ndim - 1) ? 1.0f : 0.0f;
    for (int i = (int)n->a.i[0]; i <= n->a.i[1]; i++) at.i[2 + i - n->a.i[0]] = x->dim[i];
    din[0] = op_node_out(g, ADT_OP_EXPAND, (int[]){dout[0]}, 1, &at, 0);
    return 0;
}

static int reduce_sum_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 0)->shape.ndim, f = (int)n->a.i[0], l = (int)n->a.i[1];
    for (int ax = 0; ax < r; ax++) {
        if (ax < f) op_sig(g, n, out, &c, max, "S%d -> S%d", ax, ax);
        else if (ax > l) op_sig(g, n, out, &c, max, "S%d -> S%d", ax, ax - (l - f + 1));
        else op_sig(g, n, out, &c, max, "S%d -> P", ax);
    }
    op_sig_partial(g, n, out, &c, max);
    return c;
}

static double reduce_sum_flops(const adt_graph *g, const adt_node *n) {
    return (double)OP_NUMEL(g, n->in[0]);
}

const adt_op_def adt_opdef_reduce_sum = {
    .name = "reduce_sum", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = reduce_sum_infer, .forward = reduce_sum_forward, .backward = reduce_sum_backward,
    .flops = reduce_sum_flops, .sbp = reduce_sum_sbp,
};

int adt_reduce_sum(adt_graph *g, int x, int first_axis, int last_axis) {
    adt_attrs at = {.i = {first_axis, last_axis}};
    return op_node_out(g, ADT_OP_REDUCE_SUM, (int[]){x}, 1, &at, 0);
}

static int expand_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    if (op_need_dtype(g, n, 0, ADT_F32)) return -1;
    const adt_shape *x = &OP_IN(g, n, 0)->shape;
    int f = (int)n->a.i[0], l = (int)n->a.i[1], nr = l - f + 1;
    /* the input is the output with axes [f, l] removed, or [1] when every axis was reduced */
    int kept = n->a.f[0] != 0.0f ? 0 : x->ndim; /* f0 marks a reduction over every axis */
    if (f < 0 || nr < 1 || kept + nr > ADT_MAX_DIMS || f > kept)
        return op_fail_shape(g, n, 0, "a tensor that a reduce-sum over the given axes produced");
    adt_shape o = {0};
    int src = 0;
    for (int i = 0; i < kept + nr; i++)
        o.dim[o.ndim++] = (i >= f && i <= l) ? n->a.i[2 + i - f] : x->dim[src++];
    os[0] = o;
    od[0] = ADT_F32;
    return 0;
}

static void expand_forward(const adt_kctx *k) {
    int64_t outer, red, inner;
    reduce_view(K_SHAPE_OUT(k, 0), (int)k->n->a.i[0], (int)k->n->a.i[1], &outer, &red, &inner);
    const float *x = K_IN(k, 0);
    float *o = K_OUT(k, 0);
    for (int64_t a = 0; a < outer; a++)
        for (int64_t r = 0; r < red; r++) memcpy(o + (a * red + r) * inner, x + a * inner, (size_t)inner * sizeof(float));
}

static int expand_backward(adt_graph *g, int node, const int *dout, const int *need, int *din) {
    if (need[0]) din[0] = adt_reduce_sum(g, dout[0], (int)g->nodes[node].a.i[0], (int)g->nodes[node].a.i[1]);
    return 0;
}

static int expand_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_OUT(g, n, 0)->shape.ndim, f = (int)n->a.i[0], l = (int)n->a.i[1];
    int all = n->a.f[0] != 0.0f;
    for (int ax = 0; ax < r && !all; ax++) {
        if (ax < f) op_sig(g, n, out, &c, max, "S%d -> S%d", ax, ax);
        else if (ax > l) op_sig(g, n, out, &c, max, "S%d -> S%d", ax - (l - f + 1), ax);
    }
    op_sig_partial(g, n, out, &c, max);
    return c;
}

/* the sizes of the expanded axes are those of the output block */
static void expand_localize(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a) {
    for (int ax = (int)n->a.i[0]; ax <= n->a.i[1]; ax++) a->i[2 + ax - n->a.i[0]] = out[0].shape.dim[ax];
}

const adt_op_def adt_opdef_expand = {
    .name = "expand", .n_in_min = 1, .n_in_max = 1, .n_out = 1, .view_of = -1,
    .infer = expand_infer, .forward = expand_forward, .backward = expand_backward,
    .flops = op_flops_per_out, .sbp = expand_sbp, .localize = expand_localize,
};

/* ---- fill: a constant scalar (the seed gradient d loss / d loss) --------------------------- */

static int fill_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    os[0] = adt_shape_1d(1);
    od[0] = ADT_F32;
    return 0;
}

static void fill_forward(const adt_kctx *k) { K_OUT(k, 0)[0] = k->n->a.f[0]; }

const adt_op_def adt_opdef_fill = {
    .name = "fill", .n_in_min = 0, .n_in_max = 0, .n_out = 1, .view_of = -1,
    .infer = fill_infer, .forward = fill_forward,
};
