/*
 * test_dist_vmesh.c - the virtual-mesh checker: every op kind under every registered 1-D SBP
 * signature and every n-D product of them, on meshes (2), (3), (4), (2,2) and (2,3), against
 * the serial op; a discovery pass for valid input layouts that have no signature; and every
 * boxing path the shortest-path search emits, run by the in-memory executor.
 *
 * Op check, per case (one global node on random inputs):
 *   - the serial node runs once on the global inputs (the reference);
 *   - per usable n-D signature and per mesh coordinate, a one-node local graph is built from the
 *     localisation (adt_dist_localize / adt_dist_add_local_node) and run by the real executor on
 *     the inputs scattered per their nd-SBP. A P input is cut into unequal random parts that
 *     sum to it (not copies, not halves), so no layout passes by coincidence;
 *   - every rank's output block is compared with the reference block (an output that is P on
 *     some mesh axes is compared after summing the ranks of each partial group).
 * Shapes are uneven (split axes of 7, 11, 13: no mesh size divides them) and, in a second pass,
 * even (multiples of 12), where no product signature may be refused by the shape check: that
 * pass proves the localize rules complete, the uneven one proves the blocks right.
 *
 * Discovery: for each case and each combination of 1-D input SBPs that no registered signature
 * has, the local ops run on meshes (2) and (3); an output SBP "reproduces" when every rank's
 * output block matches the serial one. Combinations where every output has such an SBP on both
 * meshes are printed (a list to review, not a failure).
 *
 * Boxing: for a few tensors on each mesh (and (2,2,2)), every pair of nd-SBP states under three
 * cost settings: the planned program is run in memory from a scattered random tensor and the
 * result compared with the scatter of the same tensor in the target layout; every single valid
 * step is run alone too; the plan's cost is checked against an independent all-pairs search.
 */
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"
#include "dist_check.h"

static uint64_t g_seed;
static uint64_t g_ctr;
static int g_even; /* shapes divisible by every mesh product */

static float urand(float lo, float hi) { return lo + (hi - lo) * adt_rng_uniform(g_seed, g_ctr++); }
static int irand(int lo, int hi) { return lo + (int)(adt_rng_u32(g_seed, g_ctr++) % (uint32_t)(hi - lo + 1)); }

/* an uneven size, or its even stand-in */
#define D(u, e) ((int64_t)(g_even ? (e) : (u)))

/* ---- how each leaf is filled ------------------------------------------------------------------ */

typedef enum { FILL_F32, FILL_PROB, FILL_POS, FILL_IDS, FILL_LABELS, FILL_STEP } fill_kind;

#define MAX_VALUES 64
static fill_kind g_fill[MAX_VALUES];
static int g_hi[MAX_VALUES];

static int leaf(adt_graph *g, const char *name, adt_shape s, fill_kind f, int hi) {
    int v = adt_input(g, name, f >= FILL_IDS ? ADT_I32 : ADT_F32, s);
    if (v >= 0 && v < MAX_VALUES) g_fill[v] = f, g_hi[v] = hi;
    return v;
}
#define SH(...) adt_shape_make(sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__})
#define F(name, ...) leaf(g, name, SH(__VA_ARGS__), FILL_F32, 0)

static int node(adt_graph *g, int op, const int *in, int n, adt_attrs a) {
    return adt_graph_add_node(g, op, in, n, &a);
}
#define NODE(op, attrs, ...) node(g, op, (int[]){__VA_ARGS__}, sizeof((int[]){__VA_ARGS__}) / sizeof(int), attrs)
#define A(...) ((adt_attrs){__VA_ARGS__})

/* ---- the cases: one node each ----------------------------------------------------------------- */

static int c_matmul(adt_graph *g, int ta, int tb) {
    int64_t M = D(7, 12), K = D(11, 24), N = D(13, 12);
    int a = ta ? F("a", K, M) : F("a", M, K), b = tb ? F("b", N, K) : F("b", K, N);
    return NODE(ADT_OP_MATMUL, A(.i = {ta, tb, 0}), a, b);
}
static int c_matmul_nn(adt_graph *g) { return c_matmul(g, 0, 0); }
static int c_matmul_tn(adt_graph *g) { return c_matmul(g, 1, 0); }
static int c_matmul_nt(adt_graph *g) { return c_matmul(g, 0, 1); }
static int c_matmul_tt(adt_graph *g) { return c_matmul(g, 1, 1); }
/* X[B,T,K] W[K,N]: a linear layer on a sequence */
static int c_matmul_3d(adt_graph *g) {
    int x = F("x", D(7, 12), D(11, 12), D(13, 12)), w = F("w", D(13, 12), D(7, 24));
    return NODE(ADT_OP_MATMUL, A(.i = {0, 0, 0}), x, w);
}
/* X^T dY with X[B,T,K], dY[B,T,N]: the weight gradient of that layer */
static int c_matmul_wgrad(adt_graph *g) {
    int x = F("x", D(7, 12), D(11, 12), D(13, 12)), dy = F("dy", D(7, 12), D(11, 12), D(5, 24));
    return NODE(ADT_OP_MATMUL, A(.i = {1, 0, 0}), x, dy);
}
/* grouped products (GPT's c_attn): X[B,T,C] @ W[C,G,C] -> [B,T,G,C], its data gradient
 * dY[B,T,G,C] @ W^T and its weight gradient X^T dY. G is q | k | v's 3 in GPT; the even pass
 * needs it divisible by every mesh size, as any axis a signature splits. */
#define GRP D(3, 12)
static int c_matmul_grouped(adt_graph *g) {
    int x = F("x", D(7, 12), D(11, 12), D(13, 12)), w = F("w", D(13, 12), GRP, D(5, 12));
    return NODE(ADT_OP_MATMUL, A(.i = {0, 0, 0, 1, 2}), x, w);
}
static int c_matmul_grouped_dx(adt_graph *g) {
    int dy = F("dy", D(7, 12), D(11, 12), GRP, D(5, 12)), w = F("w", D(13, 12), GRP, D(5, 12));
    return NODE(ADT_OP_MATMUL, A(.i = {0, 1, 0, 2, 2}), dy, w);
}
static int c_matmul_grouped_dw(adt_graph *g) {
    int x = F("x", D(7, 12), D(11, 12), D(13, 12)), dy = F("dy", D(7, 12), D(11, 12), GRP, D(5, 12));
    return NODE(ADT_OP_MATMUL, A(.i = {1, 0, 0, 1, 2}), x, dy);
}
static int c_matmul_batched(adt_graph *g, int ta, int tb) {
    int64_t B = D(7, 12), H = D(3, 12), M = D(11, 12), K = D(5, 12), N = D(13, 12);
    int a = ta ? F("a", B, H, K, M) : F("a", B, H, M, K), b = tb ? F("b", B, H, N, K) : F("b", B, H, K, N);
    return NODE(ADT_OP_MATMUL, A(.i = {ta, tb, 1}), a, b);
}
static int c_bmm_nn(adt_graph *g) { return c_matmul_batched(g, 0, 0); }
static int c_bmm_nt(adt_graph *g) { return c_matmul_batched(g, 0, 1); }
static int c_bmm_tn(adt_graph *g) { return c_matmul_batched(g, 1, 0); }

#define X3 D(7, 12), D(11, 12), D(13, 12)
static int c_add(adt_graph *g) { return NODE(ADT_OP_ADD, A(0), F("a", X3), F("b", X3)); }
static int c_add3(adt_graph *g) { return NODE(ADT_OP_ADD, A(0), F("a", X3), F("b", X3), F("c", X3)); }
static int c_sub(adt_graph *g) { return NODE(ADT_OP_SUB, A(0), F("a", X3), F("b", X3)); }
static int c_mul(adt_graph *g) { return NODE(ADT_OP_MUL, A(0), F("a", X3), F("b", X3)); }
static int c_scale(adt_graph *g) { return NODE(ADT_OP_SCALE, A(.f = {-1.75f}), F("x", X3)); }
static int c_bias_add(adt_graph *g) { return NODE(ADT_OP_BIAS_ADD, A(0), F("x", X3), F("b", D(13, 12))); }
/* over the last two axes: qkv [B,T,G,C] + b [G,C] */
static int c_bias_add2(adt_graph *g) {
    return NODE(ADT_OP_BIAS_ADD, A(0), F("x", D(7, 12), D(11, 12), GRP, D(5, 12)), F("b", GRP, D(5, 12)));
}
static int c_reduce_0(adt_graph *g) { return NODE(ADT_OP_REDUCE_SUM, A(.i = {0, 0}), F("x", X3)); }
static int c_reduce_12(adt_graph *g) { return NODE(ADT_OP_REDUCE_SUM, A(.i = {1, 2}), F("x", X3)); }
static int c_reduce_1(adt_graph *g) { return NODE(ADT_OP_REDUCE_SUM, A(.i = {1, 1}), F("x", X3)); }
static int c_reduce_all(adt_graph *g) { return NODE(ADT_OP_REDUCE_SUM, A(.i = {0, 2}), F("x", X3)); }
static int c_expand_1(adt_graph *g) {
    return NODE(ADT_OP_EXPAND, A(.i = {1, 1, D(11, 12)}), F("x", D(7, 12), D(13, 12)));
}
static int c_expand_0(adt_graph *g) {
    return NODE(ADT_OP_EXPAND, A(.i = {0, 0, D(7, 12)}), F("x", D(11, 12), D(13, 12)));
}
static int c_expand_all(adt_graph *g) {
    return NODE(ADT_OP_EXPAND, A(.i = {0, 1, D(7, 12), D(11, 12)}, .f = {1.0f}), F("x", 1));
}
static int c_relu(adt_graph *g) { return NODE(ADT_OP_RELU, A(0), F("x", X3)); }
static int c_gelu(adt_graph *g) { return NODE(ADT_OP_GELU, A(0), F("x", X3)); }
static int c_sigmoid(adt_graph *g) { return NODE(ADT_OP_SIGMOID, A(0), F("x", X3)); }
static int c_relu_bwd(adt_graph *g) { return NODE(ADT_OP_RELU_BWD, A(0), F("dy", X3), F("x", X3)); }
static int c_gelu_bwd(adt_graph *g) { return NODE(ADT_OP_GELU_BWD, A(0), F("dy", X3), F("x", X3)); }
static int c_sigmoid_bwd(adt_graph *g) { return NODE(ADT_OP_SIGMOID_BWD, A(0), F("dy", X3), F("y", X3)); }
static int c_layernorm(adt_graph *g) {
    return NODE(ADT_OP_LAYERNORM, A(.f = {1e-5f}), F("x", X3), F("w", D(13, 12)), F("b", D(13, 12)));
}
static int c_layernorm_bwd(adt_graph *g) {
    int rs = leaf(g, "rstd", SH(D(7, 12), D(11, 12)), FILL_POS, 0);
    return NODE(ADT_OP_LAYERNORM_BWD, A(.f = {1e-5f}), F("dy", X3), F("x", X3), F("w", D(13, 12)),
                F("mean", D(7, 12), D(11, 12)), rs);
}
static int c_softmax(adt_graph *g) { return NODE(ADT_OP_SOFTMAX, A(0), F("x", X3)); }
static int c_softmax_bwd(adt_graph *g) {
    int y = leaf(g, "y", SH(X3), FILL_PROB, 0);
    return NODE(ADT_OP_SOFTMAX_BWD, A(0), F("dy", X3), y);
}
/* qkv[B,T,3,C] of H heads of 2 columns. Uneven: C = 12 over 6 heads, so a head split is whole
 * heads on meshes (2), (3) and (2,3) and refused on (4) and (2,2) (blocks of 3 columns cut a
 * head); even: 12 heads, whole on every mesh. */
#define HEADS D(6, 12)
static int c_attention(adt_graph *g) {
    return NODE(ADT_OP_ATTENTION, A(.i = {HEADS, 2}), F("qkv", D(7, 12), D(11, 12), 3, 2 * HEADS));
}
static int c_attention_bwd(adt_graph *g) {
    int64_t B = D(7, 12), T = D(11, 12), H = HEADS;
    int att = leaf(g, "att", SH(B, H, T, T), FILL_PROB, 0);
    return NODE(ADT_OP_ATTENTION_BWD, A(.i = {H, 2}), F("dy", B, T, 2 * H), F("qkv", B, T, 3, 2 * H), att);
}
static int c_embedding(adt_graph *g) {
    int64_t V = D(13, 24);
    int ids = leaf(g, "ids", SH(D(7, 12), D(11, 12)), FILL_IDS, (int)V);
    return NODE(ADT_OP_EMBEDDING, A(0), ids, F("table", V, D(11, 12)));
}
static int c_embedding_bwd(adt_graph *g) {
    int64_t V = D(13, 24), C = D(11, 12);
    int ids = leaf(g, "ids", SH(D(7, 12), D(5, 12)), FILL_IDS, (int)V);
    return NODE(ADT_OP_EMBEDDING_BWD, A(.i = {0, V}), F("dy", D(7, 12), D(5, 12), C), ids);
}
/* labels include -1 (ignored positions) */
static int c_xent(adt_graph *g) {
    int64_t B = D(7, 12), T = D(11, 12), V = D(13, 12);
    int y = leaf(g, "y", SH(B, T), FILL_LABELS, (int)V);
    return NODE(ADT_OP_SOFTMAX_XENT, A(.f = {(float)(B * T)}), F("logits", B, T, V), y);
}
static int c_xent_bwd(adt_graph *g) {
    int64_t B = D(7, 12), T = D(11, 12), V = D(13, 12);
    int y = leaf(g, "y", SH(B, T), FILL_LABELS, (int)V);
    int p = leaf(g, "probs", SH(B, T, V), FILL_PROB, 0);
    return NODE(ADT_OP_SOFTMAX_XENT_BWD, A(.f = {(float)(B * T)}), F("dloss", 1), p, y);
}
static int c_bce(adt_graph *g) {
    int64_t N = D(7, 12), M = D(11, 12);
    int y = leaf(g, "y", SH(N, M), FILL_PROB, 0);
    return NODE(ADT_OP_BCE_LOGITS, A(.f = {(float)(N * M)}), F("x", N, M), y);
}
static int c_bce_bwd(adt_graph *g) {
    int64_t N = D(7, 12), M = D(11, 12);
    int y = leaf(g, "y", SH(N, M), FILL_PROB, 0);
    return NODE(ADT_OP_BCE_LOGITS_BWD, A(.f = {(float)(N * M)}), F("dloss", 1), F("x", N, M), y);
}
/* x[N,C,H,W], w[K,C,3,3]; stride 1 pad 1, or stride 2 pad 1 on a 7x7 plane */
static int c_conv(adt_graph *g, int bias, int stride) {
    int64_t N = D(7, 12), C = D(7, 12), K = D(11, 12), H = stride == 1 ? 6 : 7;
    int x = F("x", N, C, H, H), w = F("w", K, C, 3, 3);
    if (bias) return NODE(ADT_OP_CONV2D, A(.i = {stride, 1, 1}), x, w, F("bias", K));
    return NODE(ADT_OP_CONV2D, A(.i = {stride, 1, 0}), x, w);
}
static int c_conv_bias(adt_graph *g) { return c_conv(g, 1, 1); }
static int c_conv_nobias(adt_graph *g) { return c_conv(g, 0, 1); }
static int c_conv_stride2(adt_graph *g) { return c_conv(g, 1, 2); }
static int c_conv_bwd_data(adt_graph *g, int stride) {
    int64_t N = D(7, 12), C = D(7, 12), K = D(11, 12), H = stride == 1 ? 6 : 7, P = (H + 2 - 3) / stride + 1;
    return NODE(ADT_OP_CONV2D_BWD_DATA, A(.i = {stride, 1, 1, H, H, C, 3, 3}), F("dy", N, K, P, P), F("w", K, C, 3, 3));
}
static int c_conv_bwd_data1(adt_graph *g) { return c_conv_bwd_data(g, 1); }
static int c_conv_bwd_data2(adt_graph *g) { return c_conv_bwd_data(g, 2); }
static int c_conv_bwd_weight(adt_graph *g) {
    int64_t N = D(7, 12), C = D(7, 12), K = D(11, 12), H = 7, P = (H + 2 - 3) / 2 + 1;
    return NODE(ADT_OP_CONV2D_BWD_WEIGHT, A(.i = {2, 1, 1, H, H, C, 3, 3}), F("dy", N, K, P, P), F("x", N, C, H, H));
}
static int c_maxpool(adt_graph *g) { return NODE(ADT_OP_MAXPOOL2D, A(.i = {2, 2}), F("x", D(7, 12), D(11, 12), 6, 5)); }
static int c_maxpool_bwd(adt_graph *g) {
    int64_t N = D(7, 12), C = D(11, 12);
    int am = leaf(g, "argmax", SH(N, C, 3, 2), FILL_IDS, 30); /* any index of the 6x5 plane */
    return NODE(ADT_OP_MAXPOOL2D_BWD, A(.i = {2, 2, 6, 5}), F("dy", N, C, 3, 2), am);
}
static int reshape_to(adt_graph *g, int x, adt_shape s) {
    adt_attrs a = {0};
    for (int i = 0; i < s.ndim; i++) a.i[i] = s.dim[i];
    a.i[6] = s.ndim;
    return node(g, ADT_OP_RESHAPE, (int[]){x}, 1, a);
}
static int c_reshape_merge01(adt_graph *g) { return reshape_to(g, F("x", X3), SH(D(7, 12) * D(11, 12), D(13, 12))); }
static int c_reshape_merge12(adt_graph *g) { return reshape_to(g, F("x", X3), SH(D(7, 12), D(11, 12) * D(13, 12))); }
static int c_reshape_split(adt_graph *g) {
    return reshape_to(g, F("x", D(7, 12) * D(11, 12), D(13, 12)), SH(X3));
}
static int c_permute(adt_graph *g) { return NODE(ADT_OP_PERMUTE, A(.i = {2, 0, 1}), F("x", X3)); }
static int c_concat(adt_graph *g) {
    return NODE(ADT_OP_CONCAT, A(.i = {1}), F("a", X3), F("b", D(7, 12), 5, D(13, 12)), F("c", D(7, 12), 3, D(13, 12)));
}
static int c_slice(adt_graph *g) { return NODE(ADT_OP_SLICE, A(.i = {1, 3, 6}), F("x", X3)); }
static int c_slice_grad(adt_graph *g) {
    return NODE(ADT_OP_SLICE_GRAD, A(.i = {1, 3, D(11, 12)}), F("dy", D(7, 12), 6, D(13, 12)));
}
static int c_interaction(adt_graph *g) { return NODE(ADT_OP_INTERACTION, A(0), F("x", D(7, 12), 5, D(13, 12))); }
static int c_interaction_bwd(adt_graph *g) {
    return NODE(ADT_OP_INTERACTION_BWD, A(0), F("dz", D(7, 12), 10), F("x", D(7, 12), 5, D(13, 12)));
}
static int c_dropout(adt_graph *g) {
    int step = leaf(g, "step", SH(1), FILL_STEP, 0);
    return NODE(ADT_OP_DROPOUT, A(.i = {5}, .f = {0.3f}), F("x", X3), step);
}
static int c_dropout_bwd(adt_graph *g) {
    int step = leaf(g, "step", SH(1), FILL_STEP, 0);
    return NODE(ADT_OP_DROPOUT_BWD, A(.i = {5}, .f = {0.3f}), F("dy", X3), step);
}
static int c_fill(adt_graph *g) { return node(g, ADT_OP_FILL, NULL, 0, A(.f = {1.0f})); }
#define W2 D(7, 12), D(11, 12)
static int c_sgd(adt_graph *g) {
    int lr = leaf(g, "lr", SH(1), FILL_POS, 0), step = leaf(g, "step", SH(1), FILL_STEP, 0);
    return NODE(ADT_OP_SGD, A(.f = {0.0f, 0.01f}), F("w", W2), F("g", W2), lr, step);
}
static int c_sgd_momentum(adt_graph *g) {
    int lr = leaf(g, "lr", SH(1), FILL_POS, 0), step = leaf(g, "step", SH(1), FILL_STEP, 0);
    return NODE(ADT_OP_SGD, A(.f = {0.9f, 0.01f}), F("w", W2), F("g", W2), F("m", W2), lr, step);
}
static int c_adamw(adt_graph *g) {
    int lr = leaf(g, "lr", SH(1), FILL_POS, 0), step = leaf(g, "step", SH(1), FILL_STEP, 0);
    int v = leaf(g, "v", SH(W2), FILL_POS, 0);
    return NODE(ADT_OP_ADAMW, A(.f = {0.9f, 0.95f, 1e-8f, 0.1f}), F("w", W2), F("g", W2), F("m", W2), v, lr, step);
}

typedef struct op_case {
    const char *name;
    int (*build)(adt_graph *g);
} op_case;

#define CASE(fn) {#fn + 2, fn}
static const op_case cases[] = {
    CASE(c_matmul_nn), CASE(c_matmul_tn), CASE(c_matmul_nt), CASE(c_matmul_tt), CASE(c_matmul_3d),
    CASE(c_matmul_wgrad), CASE(c_matmul_grouped), CASE(c_matmul_grouped_dx), CASE(c_matmul_grouped_dw), CASE(c_bmm_nn),
    CASE(c_bmm_nt), CASE(c_bmm_tn), CASE(c_add), CASE(c_add3), CASE(c_sub), CASE(c_mul), CASE(c_scale), CASE(c_bias_add),
    CASE(c_bias_add2), CASE(c_reduce_0), CASE(c_reduce_12), CASE(c_reduce_1),
    CASE(c_reduce_all), CASE(c_expand_1), CASE(c_expand_0), CASE(c_expand_all), CASE(c_relu), CASE(c_gelu),
    CASE(c_sigmoid), CASE(c_relu_bwd), CASE(c_gelu_bwd), CASE(c_sigmoid_bwd), CASE(c_layernorm),
    CASE(c_layernorm_bwd), CASE(c_softmax), CASE(c_softmax_bwd), CASE(c_attention), CASE(c_attention_bwd),
    CASE(c_embedding), CASE(c_embedding_bwd), CASE(c_xent), CASE(c_xent_bwd), CASE(c_bce), CASE(c_bce_bwd),
    CASE(c_conv_bias), CASE(c_conv_nobias), CASE(c_conv_stride2), CASE(c_conv_bwd_data1), CASE(c_conv_bwd_data2),
    CASE(c_conv_bwd_weight), CASE(c_maxpool), CASE(c_maxpool_bwd), CASE(c_reshape_merge01), CASE(c_reshape_merge12),
    CASE(c_reshape_split), CASE(c_permute), CASE(c_concat), CASE(c_slice), CASE(c_slice_grad), CASE(c_interaction),
    CASE(c_interaction_bwd), CASE(c_dropout), CASE(c_dropout_bwd), CASE(c_fill), CASE(c_sgd), CASE(c_sgd_momentum),
    CASE(c_adamw),
};
#define N_CASES ((int)(sizeof cases / sizeof cases[0]))

/* ---- tensors in memory ------------------------------------------------------------------------ */

typedef struct tensor {
    adt_shape shape;
    adt_dtype dt;
    void *data;
} tensor;

static size_t tbytes(const tensor *t) { return (size_t)adt_shape_numel(&t->shape) * adt_dtype_size(t->dt); }

static tensor tensor_new(adt_shape s, adt_dtype dt) {
    tensor t = {s, dt, NULL};
    t.data = calloc(tbytes(&t) ? tbytes(&t) : 1, 1);
    return t;
}

/* Plain f32 inputs are multiples of 1/64 in [-1, 1]: sums of their products (matmul, conv,
 * reductions, partial sums) are then exact in float whatever the order, so a reordered sum on a
 * mesh must match the serial one to the last bit and the tolerance can stay tight for the
 * non-linear ops. */
static float grid(void) { return (float)irand(-64, 64) / 64.0f; }

static void fill_leaf(tensor *t, fill_kind f, int hi) {
    int64_t n = adt_shape_numel(&t->shape);
    for (int64_t i = 0; i < n; i++) {
        switch (f) {
        case FILL_F32: ((float *)t->data)[i] = grid(); break;
        case FILL_PROB: ((float *)t->data)[i] = urand(0.02f, 0.98f); break;
        case FILL_POS: ((float *)t->data)[i] = urand(0.05f, 1.0f); break;
        case FILL_IDS: ((int32_t *)t->data)[i] = irand(0, hi - 1); break;
        case FILL_LABELS: ((int32_t *)t->data)[i] = irand(0, 5) ? irand(0, hi - 1) : -1; break;
        case FILL_STEP: ((int32_t *)t->data)[i] = 3; break;
        }
    }
}

static tensor extract(const tensor *g, const adt_box *b) {
    tensor t = tensor_new(b->shape, g->dt);
    dc_copy_block(t.data, g->data, b, adt_dtype_size(g->dt));
    return t;
}

/* Local inputs of every rank for one nd-SBP: blocks, and for P axes unequal random parts of
 * each block that sum to it over the partial group. A part is a function of the element's
 * global index and the rank's coordinates on the P axes only, so copies along B axes agree (a
 * (P,B) tensor is the same on (i,0) and (i,1)). Parts of a grid value stay on the grid, so
 * they sum back exactly. */
static void scatter(const tensor *g, const adt_ndsbp *s, const adt_mesh *m, tensor *local) {
    unsigned pm = adt_ndsbp_partial_mask(s);
    int nparts = 1;
    for (int a = 0; a < m->ndim; a++)
        if (pm >> a & 1) nparts *= m->dim[a];
    uint64_t key = adt_rng_u32(g_seed, g_ctr++);
    for (int r = 0; r < m->nranks; r++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, r, c);
        adt_box b = adt_ndsbp_block(s, m, c, g->shape);
        local[r] = extract(g, &b);
        if (!pm) continue;
        int mine = 0; /* which part: the P coordinates in mixed radix */
        for (int a = 0; a < m->ndim; a++)
            if (pm >> a & 1) mine = mine * m->dim[a] + c[a];
        int64_t n = adt_shape_numel(&b.shape);
        float *x = local[r].data;
        for (int64_t e = 0; e < n; e++) {
            int64_t gi = dc_global_index(&b, e);
            float v = x[e], acc = 0, part = 0;
            for (int t = 0; t < nparts; t++) {
                /* a random grid value in [-1, 1], the last part what is left */
                float u = adt_rng_uniform(key, (uint64_t)gi * 64 + (uint64_t)t);
                part = t < nparts - 1 ? (float)((int)(u * 129.0f) - 64) / 64.0f : v - acc;
                if (t == mine) break;
                acc += part;
            }
            x[e] = part;
        }
    }
}

/* Max over elements of |got - want| / (|want| + scale): relative, with a floor at the output's
 * own magnitude so near-zero elements do not blow it up. */
static double block_err(const tensor *got, const tensor *want, double scale) {
    int64_t n = adt_shape_numel(&want->shape);
    if (!adt_shape_equal(&got->shape, &want->shape)) return INFINITY;
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double a, b;
        if (want->dt == ADT_I32) a = ((int32_t *)got->data)[i], b = ((int32_t *)want->data)[i];
        else a = ((float *)got->data)[i], b = ((float *)want->data)[i];
        double e = fabs(a - b) / (fabs(b) + scale);
        if (!(e <= worst)) worst = e; /* NaN counts as infinitely wrong */
    }
    return worst;
}

static double max_abs(const tensor *t) {
    if (t->dt != ADT_F32) return 1.0;
    double s = 0;
    for (int64_t i = 0; i < adt_shape_numel(&t->shape); i++) s = fmax(s, fabs(((float *)t->data)[i]));
    return s > 0 ? s : 1.0;
}

/* ---- running a node ---------------------------------------------------------------------------- */

/* Runs the only node of graph g (inputs are its fed leaves) on `in`, returns its outputs. */
static int run_node(adt_graph *g, int node_id, tensor *in, tensor *out) {
    const adt_node *n = &g->nodes[node_id];
    for (int k = 0; k < n->n_out; k++) adt_graph_mark_output(g, n->out[k]);
    adt_exec *ex;
    adt_exec_opts o = {.threads = 1, .seed = g_seed};
    if (adt_exec_create(&ex, g, &o)) return -1;
    for (int i = 0; i < n->n_in; i++) memcpy(adt_exec_data(ex, n->in[i]), in[i].data, tbytes(&in[i]));
    adt_exec_run(ex);
    for (int k = 0; k < n->n_out; k++) {
        const adt_value *v = &g->values[n->out[k]];
        out[k] = tensor_new(v->shape, v->dtype);
        memcpy(out[k].data, adt_exec_data(ex, n->out[k]), tbytes(&out[k]));
    }
    adt_exec_free(ex);
    return 0;
}

/* Runs node `node_id` of g under nd-signature s on every rank of m with the given local inputs.
 * outs[r * ADT_MAX_OUTPUTS + k]. Returns -1 (message in *why) if some rank's local node is
 * refused by the shape rule. */
static int run_local(const adt_graph *g, int node_id, const adt_nd_sig *s, const adt_mesh *m, tensor *const *lin,
                     tensor *outs, char *why, size_t nwhy) {
    const adt_node *n = &g->nodes[node_id];
    for (int r = 0; r < m->nranks; r++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, r, c);
        adt_local_node ln;
        if (adt_dist_localize(g, node_id, s, m, c, &ln)) {
            snprintf(why, nwhy, "%s", adt_error_message());
            return -1;
        }
        adt_graph *lg = adt_graph_create();
        int lv[ADT_MAX_INPUTS];
        tensor in[ADT_MAX_INPUTS];
        for (int i = 0; i < n->n_in; i++) {
            lv[i] = adt_dist_add_local_leaf(lg, g, n->in[i], &ln.in[i]);
            in[i] = lin[i][r];
        }
        int id = adt_dist_add_local_node(lg, g, &ln, lv);
        if (id < 0) {
            snprintf(why, nwhy, "%s", adt_graph_error_message(lg));
            adt_graph_free(lg);
            for (int q = 0; q < r; q++)
                for (int k = 0; k < n->n_out; k++) free(outs[q * ADT_MAX_OUTPUTS + k].data);
            return -1;
        }
        run_node(lg, id, in, outs + r * ADT_MAX_OUTPUTS);
        adt_graph_free(lg);
    }
    return 0;
}

/* How far output k of every rank is from the reference under nd-SBP o (partial groups summed). */
static double output_err(const tensor *ref, const adt_ndsbp *o, const adt_mesh *m, const tensor *outs, int k) {
    unsigned pm = adt_ndsbp_partial_mask(o);
    double scale = max_abs(ref), worst = 0;
    for (int r = 0; r < m->nranks; r++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, r, c);
        if (!dc_group_leader(m, pm, c)) continue;
        adt_box b = adt_ndsbp_block(o, m, c, ref->shape);
        tensor want = extract(ref, &b);
        const tensor *got = &outs[r * ADT_MAX_OUTPUTS + k];
        tensor sum = {0};
        double bscale = scale;
        if (pm) { /* sum the group in double, then compare once */
            if (ref->dt != ADT_F32 || !adt_shape_equal(&got->shape, &b.shape)) {
                free(want.data);
                return INFINITY;
            }
            int64_t ne = adt_shape_numel(&b.shape);
            /* Each part rounds at its own size, and unequal parts may be much larger than their
             * sum: the error is judged at the largest sum of the parts' magnitudes (a (P,P)
             * layernorm_bwd over 6 parts measured 2.03e-6 at the result's scale, seed
             * 1795318382; 0.4-1.0e-6 on other seeds). */
            double *acc = calloc((size_t)ne, sizeof *acc), *mag = calloc((size_t)ne, sizeof *mag);
            for (int q = 0; q < m->nranks; q++) {
                int cq[ADT_MAX_MESH_DIMS];
                adt_mesh_coord(m, q, cq);
                const tensor *t = &outs[q * ADT_MAX_OUTPUTS + k];
                if (!dc_same_group(m, pm, c, cq)) continue;
                if (!adt_shape_equal(&t->shape, &b.shape)) {
                    free(acc);
                    free(mag);
                    free(want.data);
                    return INFINITY;
                }
                for (int64_t e = 0; e < ne; e++) {
                    acc[e] += ((float *)t->data)[e];
                    mag[e] += fabs(((float *)t->data)[e]);
                }
            }
            sum = tensor_new(b.shape, ADT_F32);
            for (int64_t e = 0; e < ne; e++) {
                ((float *)sum.data)[e] = (float)acc[e];
                if (mag[e] > bscale) bscale = mag[e];
            }
            free(acc);
            free(mag);
            got = &sum;
        }
        double e = block_err(got, &want, bscale);
        if (!(e <= worst)) worst = e;
        free(want.data);
        free(sum.data);
    }
    return worst;
}

/* ---- the op check ------------------------------------------------------------------------------ */

static const int mesh_shapes[][4] = {{1, 2}, {1, 3}, {1, 4}, {2, 2, 2}, {2, 2, 3}}; /* ndim, dims */
#define N_MESHES 5
#define TOL 2e-6

typedef struct op_stats {
    int sigs1d, checked, filtered, mismatches, cases;
    double worst;
} op_stats;
static op_stats g_stats[ADT_OP_COUNT];
static int g_total_checked, g_total_mismatch, g_total_filtered;

typedef struct built {
    adt_graph *g;
    int node;
    tensor in[ADT_MAX_INPUTS], ref[ADT_MAX_OUTPUTS];
} built;

static int build_case(const op_case *oc, built *b) {
    memset(b, 0, sizeof *b);
    b->g = adt_graph_create();
    b->node = oc->build(b->g);
    if (b->node < 0 || adt_graph_error(b->g)) {
        CHECK(0, "case %s: building failed: %s", oc->name, adt_graph_error_message(b->g));
        return -1;
    }
    const adt_node *n = &b->g->nodes[b->node];
    for (int i = 0; i < n->n_in; i++) {
        const adt_value *v = &b->g->values[n->in[i]];
        b->in[i] = tensor_new(v->shape, v->dtype);
        fill_leaf(&b->in[i], g_fill[n->in[i]], g_hi[n->in[i]]);
    }
    return run_node(b->g, b->node, b->in, b->ref);
}

static void free_built(built *b) {
    if (b->g && b->node >= 0) {
        const adt_node *n = &b->g->nodes[b->node];
        for (int i = 0; i < n->n_in; i++) free(b->in[i].data);
        for (int k = 0; k < n->n_out; k++) free(b->ref[k].data);
    }
    adt_graph_free(b->g);
}

static void free_locals(tensor **lin, int n_in, tensor *outs, int nranks, int n_out) {
    for (int i = 0; i < n_in; i++) {
        for (int r = 0; r < nranks; r++) free(lin[i][r].data);
        free(lin[i]);
    }
    if (outs)
        for (int r = 0; r < nranks; r++)
            for (int k = 0; k < n_out; k++) free(outs[r * ADT_MAX_OUTPUTS + k].data);
}

/* Runs one n-D signature of a built case on a mesh and compares; returns the worst error. */
static double check_sig(const built *b, const adt_nd_sig *s, const adt_mesh *m, char *why, size_t nwhy) {
    const adt_node *n = &b->g->nodes[b->node];
    tensor *lin[ADT_MAX_INPUTS];
    for (int i = 0; i < n->n_in; i++) {
        lin[i] = calloc((size_t)m->nranks, sizeof **lin);
        scatter(&b->in[i], &s->in[i], m, lin[i]);
    }
    tensor *outs = calloc((size_t)m->nranks * ADT_MAX_OUTPUTS, sizeof *outs);
    double worst = 0;
    if (run_local(b->g, b->node, s, m, lin, outs, why, nwhy)) {
        worst = INFINITY;
        free_locals(lin, n->n_in, NULL, m->nranks, n->n_out);
    } else {
        for (int k = 0; k < n->n_out; k++) {
            double e = output_err(&b->ref[k], &s->out[k], m, outs, k);
            if (!(e <= worst)) worst = e;
        }
        free_locals(lin, n->n_in, outs, m->nranks, n->n_out);
    }
    free(outs);
    return worst;
}

static void check_case(const op_case *oc) {
    built b;
    if (build_case(oc, &b)) {
        free_built(&b);
        return;
    }
    const adt_node *n = &b.g->nodes[b.node];
    op_stats *st = &g_stats[n->op];
    adt_sbp_sig sigs[64];
    int n1d = adt_node_sbp_signatures(b.g, n, sigs, 64);
    if (!g_even) st->sigs1d += n1d, st->cases++;
    for (int mi = 0; mi < N_MESHES; mi++) {
        adt_mesh m;
        adt_mesh_init(&m, mesh_shapes[mi][0], &mesh_shapes[mi][1]);
        int64_t total = adt_nd_sig_count(n1d, m.ndim);
        int usable = 0;
        for (int64_t idx = 0; idx < total; idx++) {
            int choice[ADT_MAX_MESH_DIMS];
            adt_nd_sig s;
            char sb[512], mb[32], why[1024] = "";
            adt_nd_sig_choice(idx, n1d, m.ndim, choice);
            adt_nd_sig_product(sigs, choice, m.ndim, n->n_in, n->n_out, &s);
            adt_nd_sig_str(&s, n->n_in, n->n_out, sb, sizeof sb);
            adt_mesh_str(&m, mb, sizeof mb);
            if (adt_nd_sig_check(b.g, b.node, &s, &m)) {
                /* even shapes: nothing may be refused (a missing localize rule would show here) */
                CHECK(!g_even, "case %s, mesh %s, signature %s refused on even shapes: %s", oc->name, mb, sb,
                      adt_error_message());
                st->filtered++;
                g_total_filtered++;
                if (getenv("CHECK_VERBOSE")) fprintf(stderr, "  filtered %s: %s\n", oc->name, adt_error_message());
                continue;
            }
            usable++;
            double e = check_sig(&b, &s, &m, why, sizeof why);
            st->checked++;
            g_total_checked++;
            if (!(e <= st->worst)) st->worst = e;
            if (!(e <= TOL)) {
                st->mismatches++;
                g_total_mismatch++;
                CHECK(0, "case %s (%s shapes), mesh %s, signature %s: error %.3g %s (seed %llu)", oc->name,
                      g_even ? "even" : "uneven", mb, sb, e, why, (unsigned long long)g_seed);
            }
        }
        /* the planner's enumeration agrees with the product-and-check above */
        CHECK(adt_node_nd_sigs(b.g, b.node, &m, NULL, 0) == usable, "case %s: adt_node_nd_sigs disagrees", oc->name);
        CHECK(usable >= 1, "case %s: not even all-B is usable", oc->name);
    }
    free_built(&b);
}

static void test_ops_uneven(void) {
    g_even = 0;
    for (int c = 0; c < N_CASES; c++) check_case(&cases[c]);
}

static void test_ops_even(void) {
    g_even = 1;
    for (int c = 0; c < N_CASES; c++) check_case(&cases[c]);
    g_even = 0;
}

/* Every op kind has at least one case and was checked (communication ops exist only in local
 * graphs: tests/test_dist_partition.c runs them). */
static void test_ops_covered(void) {
    printf("virtual-mesh op check (meshes (2) (3) (4) (2,2) (2,3); uneven and even shapes):\n");
    printf("  %-20s %5s %7s %8s %8s %10s\n", "op", "cases", "1-D sig", "checked", "refused", "worst err");
    for (int k = 0; k < ADT_OP_COUNT; k++) {
        op_stats *st = &g_stats[k];
        if (adt_op_get(k)->is_comm) continue;
        CHECK(st->cases > 0, "op %s has no virtual-mesh case", adt_op_name(k));
        CHECK(st->checked > 0, "op %s was never checked", adt_op_name(k));
        printf("  %-20s %5d %7d %8d %8d %10.2e\n", adt_op_name(k), st->cases, st->sigs1d, st->checked, st->filtered,
               st->worst);
    }
    printf("  total: %d n-D signature x mesh x shape-set runs, %d refused by the shape check, %d mismatches\n",
           g_total_checked, g_total_filtered, g_total_mismatch);
    CHECK(g_total_mismatch == 0, "%d mismatches", g_total_mismatch);
}

/* ---- discovery ---------------------------------------------------------------------------------- */

/* The 1-D SBP options of a value: B, P (f32 only), S(k) for each axis. */
static int sbp_options(const adt_value *v, adt_sbp *o) {
    int c = 0;
    o[c++] = (adt_sbp){ADT_SBP_B, 0};
    if (v->dtype == ADT_F32) o[c++] = (adt_sbp){ADT_SBP_P, 0};
    for (int k = 0; k < v->shape.ndim && k < ADT_MAX_DIMS; k++) o[c++] = (adt_sbp){ADT_SBP_S, (int8_t)k};
    return c;
}

static int sbp_eq(adt_sbp a, adt_sbp b) { return a.kind == b.kind && (a.kind != ADT_SBP_S || a.axis == b.axis); }

static int runnable_sbp(const adt_node *n, int value_rank, int is_class_operand, adt_sbp s);

/* Which output SBPs reproduce the serial op for input layout `in` on a 1-D mesh: bit j of
 * found[k] set when option j of output k matches on every rank. Returns 0 when the local op
 * cannot be built for this layout at all. */
static int discover_on(const built *b, const adt_sbp *in, const adt_mesh *m, unsigned *found) {
    const adt_node *n = &b->g->nodes[b->node];
    const adt_op_def *d = adt_op_get(n->op);
    adt_nd_sig s = adt_nd_sig_all_b(1, n->n_in, n->n_out);
    for (int i = 0; i < n->n_in; i++) s.in[i].s[0] = in[i];
    for (int i = 0; i < n->n_in; i++)
        if (!adt_ndsbp_fits(&s.in[i], m, b->g->values[n->in[i]].shape)) return 0;
    tensor *lin[ADT_MAX_INPUTS];
    for (int i = 0; i < n->n_in; i++) {
        lin[i] = calloc((size_t)m->nranks, sizeof **lin);
        scatter(&b->in[i], &s.in[i], m, lin[i]);
    }
    tensor *outs = calloc((size_t)m->nranks * ADT_MAX_OUTPUTS, sizeof *outs);
    char why[1024];
    int any = 0;
    /* attributes that depend on the output block (localize rules) need one run per candidate */
    int per_candidate = d->localize && n->n_out == 1;
    adt_sbp opts[ADT_MAX_OUTPUTS][ADT_MAX_DIMS + 2];
    int nopt[ADT_MAX_OUTPUTS];
    for (int k = 0; k < n->n_out; k++) {
        nopt[k] = sbp_options(&b->g->values[n->out[k]], opts[k]);
        found[k] = 0;
    }
    int runs = per_candidate ? nopt[0] : 1;
    for (int ci = 0; ci < runs; ci++) {
        if (per_candidate) s.out[0].s[0] = opts[0][ci];
        if (per_candidate && (!adt_ndsbp_fits(&s.out[0], m, b->g->values[n->out[0]].shape) ||
                              !runnable_sbp(n, b->g->values[n->out[0]].shape.ndim, 0, opts[0][ci])))
            continue;
        if (run_local(b->g, b->node, &s, m, lin, outs, why, sizeof why)) continue;
        any = 1;
        for (int k = 0; k < n->n_out; k++)
            for (int j = 0; j < nopt[k]; j++) {
                if (per_candidate && j != ci) continue;
                adt_ndsbp o = adt_ndsbp_all_b(1);
                o.s[0] = opts[k][j];
                if (!adt_ndsbp_fits(&o, m, b->ref[k].shape)) continue;
                if (output_err(&b->ref[k], &o, m, outs, k) <= TOL) found[k] |= 1u << j;
            }
        for (int r = 0; r < m->nranks; r++)
            for (int k = 0; k < n->n_out; k++) {
                free(outs[r * ADT_MAX_OUTPUTS + k].data);
                outs[r * ADT_MAX_OUTPUTS + k].data = NULL;
            }
    }
    free_locals(lin, n->n_in, NULL, m->nranks, n->n_out);
    free(outs);
    return any;
}

/* A discovery line: "discover <case>: <in SBPs> -> <out SBP sets>", sets as "P|B". */
static void discovery_line(const built *b, const char *name, const adt_sbp *in, const unsigned *found, char *buf,
                           size_t nb) {
    const adt_node *n = &b->g->nodes[b->node];
    size_t k = (size_t)snprintf(buf, nb, "discover %s:", name);
    char one[16];
    for (int i = 0; i < n->n_in; i++) k += (size_t)snprintf(buf + k, nb - k, " %s", adt_sbp_str(in[i], one, sizeof one));
    k += (size_t)snprintf(buf + k, nb - k, " ->");
    for (int o = 0; o < n->n_out; o++) {
        adt_sbp opts[ADT_MAX_DIMS + 2];
        int no = sbp_options(&b->g->values[n->out[o]], opts), first = 1;
        k += (size_t)snprintf(buf + k, nb - k, " ");
        for (int j = 0; j < no; j++)
            if (found[o] >> j & 1) {
                k += (size_t)snprintf(buf + k, nb - k, "%s%s", first ? "" : "|", adt_sbp_str(opts[j], one, sizeof one));
                first = 0;
            }
    }
}

/* The line's format: the prefix, n_in SBPs, "->", n_out non-empty '|'-lists of SBPs. */
static int line_well_formed(const char *line, int n_in, int n_out) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", line);
    char *save = NULL, *tok = strtok_r(buf, " ", &save);
    if (!tok || strcmp(tok, "discover")) return 0;
    tok = strtok_r(NULL, " ", &save);
    if (!tok || tok[strlen(tok) - 1] != ':') return 0;
    int ins = 0, outs = 0, arrow = 0;
    while ((tok = strtok_r(NULL, " ", &save))) {
        if (!strcmp(tok, "->")) {
            if (arrow++) return 0;
            continue;
        }
        char *s2 = NULL;
        for (char *alt = strtok_r(tok, "|", &s2); alt; alt = strtok_r(NULL, "|", &s2)) {
            adt_sbp s;
            if (adt_sbp_parse(alt, &s)) return 0;
        }
        if (arrow) outs++;
        else ins++;
    }
    return arrow == 1 && ins == n_in && outs == n_out;
}

/* Layouts a kernel cannot take at all, because it trusts index data: softmax cross-entropy
 * asserts labels < V (a split class axis would abort), and max-pool backward scatters to the
 * argmax positions of the whole plane (a split plane would write outside the block). */
static int runnable_sbp(const adt_node *n, int value_rank, int is_class_operand, adt_sbp s) {
    if (s.kind != ADT_SBP_S) return 1;
    if (is_class_operand && s.axis == value_rank - 1) return 0;
    if (n->op == ADT_OP_MAXPOOL2D_BWD && s.axis >= 2) return 0;
    return 1;
}

static int runnable_layout(const adt_node *n, const adt_graph *g, const adt_sbp *in) {
    for (int i = 0; i < n->n_in; i++) {
        int cls = (n->op == ADT_OP_SOFTMAX_XENT && i == 0) || (n->op == ADT_OP_SOFTMAX_XENT_BWD && i == 1);
        if (!runnable_sbp(n, g->values[n->in[i]].shape.ndim, cls, in[i])) return 0;
    }
    return 1;
}

static void test_discovery(void) {
    int combos = 0, found_n = 0;
    adt_mesh m2, m3;
    adt_mesh_init(&m2, 1, (int[]){2});
    adt_mesh_init(&m3, 1, (int[]){3});
    for (int c = 0; c < N_CASES; c++) {
        built b;
        if (build_case(&cases[c], &b)) {
            free_built(&b);
            continue;
        }
        const adt_node *n = &b.g->nodes[b.node];
        adt_sbp_sig sigs[64];
        int n1d = adt_node_sbp_signatures(b.g, n, sigs, 64);
        adt_sbp opts[ADT_MAX_INPUTS][ADT_MAX_DIMS + 2];
        int nopt[ADT_MAX_INPUTS], idx[ADT_MAX_INPUTS] = {0};
        for (int i = 0; i < n->n_in; i++) nopt[i] = sbp_options(&b.g->values[n->in[i]], opts[i]);
        for (;;) {
            adt_sbp in[ADT_MAX_INPUTS];
            for (int i = 0; i < n->n_in; i++) in[i] = opts[i][idx[i]];
            int registered = 0;
            for (int s = 0; s < n1d && !registered; s++) {
                int same = 1;
                for (int i = 0; i < n->n_in; i++) same &= sbp_eq(sigs[s].in[i], in[i]);
                registered = same;
            }
            if (!registered && runnable_layout(n, b.g, in)) {
                unsigned f2[ADT_MAX_OUTPUTS], f3[ADT_MAX_OUTPUTS];
                combos++;
                if (discover_on(&b, in, &m2, f2) && discover_on(&b, in, &m3, f3)) {
                    int all = 1;
                    for (int k = 0; k < n->n_out; k++) all &= (f2[k] & f3[k]) != 0, f2[k] &= f3[k];
                    if (all) {
                        char line[1024];
                        discovery_line(&b, cases[c].name, in, f2, line, sizeof line);
                        CHECK(line_well_formed(line, n->n_in, n->n_out), "malformed discovery line '%s'", line);
                        printf("%s\n", line);
                        found_n++;
                    }
                }
            }
            int i = 0; /* next combination (odometer) */
            while (i < n->n_in && ++idx[i] == nopt[i]) idx[i++] = 0;
            if (i == n->n_in) break;
        }
        free_built(&b);
    }
    printf("discovery: %d unregistered input layouts tried on meshes (2) and (3), %d reproduce the serial op\n",
           combos, found_n);
    CHECK(combos > 1000, "only %d layouts tried", combos);
}

/* ---- boxing ------------------------------------------------------------------------------------ */

typedef struct box_stats {
    int pairs, programs, steps, edges, mismatches;
    int kinds[ADT_BOXING_KIND_COUNT];
} box_stats;

/* All nd-SBP states of a rank-r tensor on a d-axis mesh, in a fixed order. */
static int all_states(int r, int d, adt_ndsbp *out) {
    int base = r + 2, n = 1;
    for (int a = 0; a < d; a++) n *= base;
    for (int id = 0; id < n; id++) {
        out[id] = adt_ndsbp_all_b(d);
        for (int a = d - 1, x = id; a >= 0; a--, x /= base) {
            int c = x % base;
            out[id].s[a] = c == 0 ? (adt_sbp){ADT_SBP_B, 0} : c == 1 ? (adt_sbp){ADT_SBP_P, 0} : (adt_sbp){ADT_SBP_S, (int8_t)(c - 2)};
        }
    }
    return n;
}

/* Runs prog from a scatter of x in its first state and compares every rank with the scatter of x
 * in its last state (P groups summed). Grid values: every path is exact, so any difference is
 * a wrong re-layout. */
static int run_and_compare(const adt_boxing_prog *p, const adt_mesh *m, const tensor *x, const adt_ndsbp *from,
                           const adt_ndsbp *to) {
    tensor *loc = calloc((size_t)m->nranks, sizeof *loc);
    scatter(x, from, m, loc);
    void **bufs = calloc((size_t)m->nranks, sizeof *bufs);
    for (int r = 0; r < m->nranks; r++) bufs[r] = loc[r].data;
    int rc = adt_boxing_run_virtual(p, m, bufs);
    CHECK(rc == ADT_OK, "run_virtual: %s", adt_error_message());
    tensor *outs = calloc((size_t)m->nranks * ADT_MAX_OUTPUTS, sizeof *outs);
    for (int r = 0; r < m->nranks; r++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, r, c);
        outs[r * ADT_MAX_OUTPUTS] = (tensor){adt_ndsbp_block(to, m, c, x->shape).shape, ADT_F32, bufs[r]};
    }
    double e = rc ? INFINITY : output_err(x, to, m, outs, 0);
    for (int r = 0; r < m->nranks; r++) free(bufs[r]);
    free(bufs);
    free(outs);
    free(loc);
    return e == 0.0;
}

/* Cheapest cost between all pairs of states by Floyd-Warshall over the same single-step edges:
 * an independent check of the Dijkstra search. With only_full, paths may pass only through
 * states whose blocks are all non-empty (what the planner prefers). */
static double *all_pairs(const adt_ndsbp *st, int n, const adt_mesh *m, adt_shape shape, const adt_comm_cost *cc,
                         int only_full) {
    double *d = malloc((size_t)n * n * sizeof *d);
    for (int i = 0; i < n * n; i++) d[i] = i % (n + 1) == 0 ? 0 : INFINITY;
    for (int i = 0; i < n; i++)
        for (int a = 0; a < m->ndim; a++)
            for (int j = 0; j < n; j++) {
                int differs = 0;
                for (int b = 0; b < m->ndim; b++) differs += !sbp_eq(st[i].s[b], st[j].s[b]);
                if (differs != 1 || sbp_eq(st[i].s[a], st[j].s[a])) continue;
                if (!adt_boxing_step_valid(&st[i], a, st[j].s[a])) continue;
                int kind = adt_boxing_kind_of(st[i].s[a], st[j].s[a]);
                double G = adt_boxing_group_bytes(&st[i], a, m, shape, 4);
                double t = adt_boxing_time(kind, m->dim[a], G, cc->alpha[a], cc->beta[a], cc->local);
                if (t < d[i * n + j]) d[i * n + j] = t;
            }
    for (int k = 0; k < n; k++) {
        if (only_full && !adt_ndsbp_fits(&st[k], m, shape)) continue;
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++)
                if (d[i * n + k] + d[k * n + j] < d[i * n + j]) d[i * n + j] = d[i * n + k] + d[k * n + j];
    }
    return d;
}

static void boxing_on(const adt_mesh *m, adt_shape shape, const adt_comm_cost *cc, box_stats *bs) {
    static adt_ndsbp st[512];
    int n = all_states(shape.ndim, m->ndim, st);
    tensor x = tensor_new(shape, ADT_F32);
    fill_leaf(&x, FILL_F32, 0);
    double *best = all_pairs(st, n, m, shape, cc, 1), *any = all_pairs(st, n, m, shape, cc, 0);
    char mb[32], sh[64], a[64], b[64], prog[2048];
    adt_mesh_str(m, mb, sizeof mb);
    adt_shape_str(&shape, sh, sizeof sh);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) {
            adt_boxing_prog p;
            int rc = adt_boxing_plan(m, shape, ADT_F32, &st[i], &st[j], cc, &p);
            CHECK(rc == ADT_OK, "plan %s -> %s: %s", adt_ndsbp_str(&st[i], a, sizeof a), adt_ndsbp_str(&st[j], b, sizeof b),
                  adt_error_message());
            if (rc) continue;
            bs->pairs++;
            /* a chain of valid single-axis steps from the source to the target */
            int ok = p.n_steps == 0 ? adt_ndsbp_equal(&st[i], &st[j]) : adt_ndsbp_equal(&p.step[0].from, &st[i]) &&
                                                                          adt_ndsbp_equal(&p.step[p.n_steps - 1].to, &st[j]);
            double sum = 0;
            for (int s = 0; s < p.n_steps; s++) {
                const adt_boxing_step *q = &p.step[s];
                ok &= adt_boxing_step_valid(&q->from, q->mesh_axis, q->to.s[q->mesh_axis]);
                if (s) ok &= adt_ndsbp_equal(&p.step[s - 1].to, &q->from);
                sum += q->time;
                bs->kinds[q->kind]++;
            }
            bs->steps += p.n_steps;
            CHECK(ok, "mesh %s %s: %s -> %s is not a chain of valid steps:\n%s", mb, sh, a, b,
                  adt_boxing_prog_str(&p, prog, sizeof prog));
            CHECK(fabs(sum - p.time) <= 1e-12 * fmax(1, sum), "program time %.6g is not the sum of its steps %.6g", p.time, sum);
            double want = best[i * n + j] < INFINITY ? best[i * n + j] : any[i * n + j];
            CHECK(fabs(p.time - want) <= 1e-12 * want + 1e-18, "mesh %s %s: %s -> %s costs %.6g, the all-pairs search found %.6g",
                  mb, sh, adt_ndsbp_str(&st[i], a, sizeof a), adt_ndsbp_str(&st[j], b, sizeof b), p.time, want);
            if (p.n_steps == 0) continue;
            bs->programs++;
            if (!run_and_compare(&p, m, &x, &st[i], &st[j])) {
                bs->mismatches++;
                CHECK(0, "mesh %s %s: program %s -> %s re-lays the tensor wrongly:\n%s", mb, sh,
                      adt_ndsbp_str(&st[i], a, sizeof a), adt_ndsbp_str(&st[j], b, sizeof b),
                      adt_boxing_prog_str(&p, prog, sizeof prog));
            }
        }
    /* every single valid step on its own, whether or not a shortest path uses it */
    for (int i = 0; i < n; i++)
        for (int ax = 0; ax < m->ndim; ax++)
            for (int j = 0; j < n; j++) {
                int same_elsewhere = 1;
                for (int q = 0; q < m->ndim; q++)
                    if (q != ax) same_elsewhere &= sbp_eq(st[i].s[q], st[j].s[q]);
                if (!same_elsewhere || !adt_boxing_step_valid(&st[i], ax, st[j].s[ax])) continue;
                adt_boxing_prog p = {.global = shape, .dtype = ADT_F32, .n_steps = 1};
                p.step[0] = (adt_boxing_step){.mesh_axis = ax, .kind = adt_boxing_kind_of(st[i].s[ax], st[j].s[ax]),
                                              .from = st[i], .to = st[j]};
                bs->edges++;
                if (!run_and_compare(&p, m, &x, &st[i], &st[j])) {
                    bs->mismatches++;
                    CHECK(0, "mesh %s %s: the step %s on axis %d, %s -> %s, is wrong", mb, sh,
                          adt_boxing_kind_name(p.step[0].kind), ax, adt_ndsbp_str(&st[i], a, sizeof a),
                          adt_ndsbp_str(&st[j], b, sizeof b));
                }
            }
    free(best);
    free(any);
    free(x.data);
}

static void test_boxing_paths(void) {
    static const int meshes[][4] = {{1, 2}, {1, 3}, {1, 4}, {2, 2, 2}, {2, 2, 3}, {3, 2, 2, 2}};
    /* bandwidth-bound, latency-bound, and a slow outer axis (inter-node) over fast inner ones */
    static const adt_comm_cost costs[] = {
        {{1e-6, 1e-6, 1e-6}, {1e-9, 1e-9, 1e-9}, 1e-12},
        {{1e-3, 1e-3, 1e-3}, {1e-12, 1e-12, 1e-12}, 1e-12},
        {{2e-5, 1e-6, 1e-6}, {4e-8, 1e-10, 1e-10}, 1e-12},
    };
    box_stats bs = {0};
    for (size_t mi = 0; mi < sizeof meshes / sizeof meshes[0]; mi++) {
        adt_mesh m;
        adt_mesh_init(&m, meshes[mi][0], &meshes[mi][1]);
        adt_shape shapes[3] = {adt_shape_1d(7), adt_shape_2d(7, 5), adt_shape_3d(5, 7, 6)};
        int nsh = m.ndim == 3 ? 2 : 3; /* (2,2,2) with rank 3: 125^2 pairs, left to the 2-D meshes */
        for (int si = 0; si < nsh; si++)
            for (size_t ci = 0; ci < sizeof costs / sizeof costs[0]; ci++) boxing_on(&m, shapes[si], &costs[ci], &bs);
    }
    printf("boxing: %d state pairs planned, %d programs (%d steps) and %d single steps run in memory, %d wrong\n",
           bs.pairs, bs.programs, bs.steps, bs.edges, bs.mismatches);
    printf("  steps by kind in the planned programs:");
    for (int k = 0; k < ADT_BOXING_KIND_COUNT; k++) {
        printf(" %s %d", adt_boxing_kind_name(k), bs.kinds[k]);
        CHECK(bs.kinds[k] > 0, "no planned program uses %s", adt_boxing_kind_name(k));
    }
    printf("\n");
    CHECK(bs.mismatches == 0, "%d wrong programs", bs.mismatches);
}

int main(void) {
    const char *s = getenv("ADT_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)g_seed);
    RUN(test_ops_uneven);
    RUN(test_ops_even);
    RUN(test_ops_covered);
    RUN(test_discovery);
    RUN(test_boxing_paths);
    return check_finish();
}
