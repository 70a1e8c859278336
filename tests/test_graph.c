/*
 * test_graph.c - every op with a backward rule, checked through the graph, autodiff and the
 * executor against finite differences; optimizer steps against closed forms; the memory plan
 * against overlap of live buffers; shape errors against their messages.
 *
 * Gradient check: for a graph out = op(params...), the test builds L = sum(out * R) with R
 * random, runs autodiff, and compares the analytic directional derivative grad . d with the
 * central difference (L(p + e d) - L(p - e d)) / 2e along several random directions d, per
 * parameter. The metric |fd - an| / max(|fd|, |an|) is scale-free. Shapes and values are fresh
 * each run (ADT_TEST_SEED fixes them; the seed is printed on failure).
 */
#include <float.h>
#include <stdint.h>
#include <time.h>

#include "adtrain/adtrain.h"
#include "check.h"

static uint64_t g_seed;
static uint64_t g_ctr;

static float urand(float lo, float hi) { return lo + (hi - lo) * adt_rng_uniform(g_seed, g_ctr++); }
static int irand(int lo, int hi) { return lo + (int)(adt_rng_u32(g_seed, g_ctr++) % (uint32_t)(hi - lo + 1)); }

/* How a test wants a parameter filled (default uniform [-1, 1]). */
typedef void (*fill_fn)(const char *name, float *p, int64_t n);

/* A finite-difference step for the next checks, or 0 for the default (relative to the
 * parameter's size). Ops linear in each parameter (conv2d) take a large one: their central
 * difference is exact at any step, and a large step keeps float32 rounding of big sums from
 * swamping small directional derivatives. */
static double g_fd_step;

static void fill_default(const char *name, float *p, int64_t n) {
    (void)name;
    for (int64_t i = 0; i < n; i++) p[i] = urand(-1.0f, 1.0f);
}

/* away from relu's kink at 0: |x| in [0.1, 1] */
static void fill_away_from_zero(const char *name, float *p, int64_t n) {
    (void)name;
    for (int64_t i = 0; i < n; i++) {
        float v = urand(0.1f, 1.0f);
        p[i] = irand(0, 1) ? v : -v;
    }
}

/* distinct values at least 0.01 apart (max-pool ties are not differentiable) */
static void fill_distinct(const char *name, float *p, int64_t n) {
    (void)name;
    for (int64_t i = 0; i < n; i++) p[i] = 0.01f * (float)i;
    for (int64_t i = n - 1; i > 0; i--) { /* shuffle */
        int64_t j = (int64_t)(adt_rng_u32(g_seed, g_ctr++) % (uint32_t)(i + 1));
        float t = p[i];
        p[i] = p[j];
        p[j] = t;
    }
}

/* Layernorm is smooth but its curvature grows as a row's variance shrinks: rows whose values
 * nearly coincide would need a far smaller step than the check can resolve in float. Each row
 * gets a -1 and a +1 so its standard deviation is at least ~0.4 for the row lengths used. */
static int64_t g_ln_row;
static void fill_spread_rows(const char *name, float *p, int64_t n) {
    fill_default(name, p, n);
    if (strcmp(name, "x")) return;
    for (int64_t r = 0; r + g_ln_row <= n; r += g_ln_row) {
        int64_t i = r + irand(0, (int)g_ln_row - 1), j = r + (i - r + 1) % g_ln_row;
        p[i] = -1.0f;
        p[j] = 1.0f;
    }
}

/* Fills fed int inputs (ids, labels) with values in [0, hi). */
typedef struct feed_spec {
    const char *name;
    int hi;       /* i32: ids in [0, hi); f32: ignored */
    int is_prob;  /* f32 values in [0, 1] */
} feed_spec;

/* sum(out * R) in double from the op's own output, so the check sees the op's rounding only */
/* sum |out * R| of the last loss_value: the size the float outputs' rounding scales with */
static double g_loss_abs;

static double loss_value(adt_exec *ex, const adt_graph *g, int out, int R) {
    adt_exec_run_forward_mode(ex, 1);
    const float *o = adt_exec_data(ex, out), *r = adt_exec_data(ex, R);
    double s = 0, a = 0;
    for (int64_t i = 0; i < adt_value_numel(g, out); i++) {
        s += (double)o[i] * (double)r[i];
        a += fabs((double)o[i] * (double)r[i]);
    }
    g_loss_abs = a;
    return s;
}

/* Builds L = sum(out * R), differentiates, and checks every parameter's gradient. */
static void grad_check(const char *what, adt_graph *g, int out, fill_fn fill, const feed_spec *feeds, int nfeeds,
                       double tol) {
    if (adt_graph_error(g)) {
        CHECK(0, "%s: building failed: %s (seed %llu)", what, adt_graph_error_message(g), (unsigned long long)g_seed);
        return;
    }
    int R = adt_input(g, "R", ADT_F32, g->values[out].shape);
    int prod = adt_mul(g, out, R);
    int L = adt_reduce_sum(g, prod, 0, g->values[prod].shape.ndim - 1);
    adt_graph_mark_output(g, L);
    adt_graph_mark_output(g, out);
    int rc = adt_graph_backward(g, L);
    CHECK(rc == ADT_OK, "%s: backward failed: %s", what, adt_graph_error_message(g));
    if (rc) return;
    for (int v = 0; v < g->n_values; v++) /* keep the gradients readable after the step */
        if (g->values[v].role == ADT_ROLE_PARAM && g->values[v].grad >= 0) adt_graph_mark_output(g, g->values[v].grad);
    adt_exec *ex;
    adt_exec_opts opts = {.threads = 1, .seed = g_seed};
    CHECK(adt_exec_create(&ex, g, &opts) == ADT_OK, "%s: executor", what);
    adt_exec_set_lr_step(ex, 0.0f, 1);
    for (int v = 0; v < g->n_values; v++) {
        adt_value *val = &g->values[v];
        int64_t n = adt_shape_numel(&val->shape);
        if (val->role == ADT_ROLE_PARAM) (fill ? fill : fill_default)(val->name, adt_exec_data(ex, v), n);
        if (v == R) fill_default("R", adt_exec_data(ex, v), n);
        for (int f = 0; f < nfeeds; f++) {
            if (strcmp(val->name, feeds[f].name)) continue;
            if (val->dtype == ADT_I32) {
                int32_t *p = adt_exec_data(ex, v);
                for (int64_t i = 0; i < n; i++) p[i] = irand(0, feeds[f].hi - 1);
            } else {
                float *p = adt_exec_data(ex, v);
                for (int64_t i = 0; i < n; i++) p[i] = feeds[f].is_prob ? urand(0, 1) : urand(-1, 1);
            }
        }
    }
    adt_exec_run(ex); /* no optimizer in these graphs: parameters stay put */
    /* copy every gradient out first: the forward runs below reuse the arena */
    float **grads = calloc((size_t)g->n_values, sizeof *grads);
    for (int v = 0; v < g->n_values; v++) {
        adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM || val->grad < 0) continue;
        size_t bytes = (size_t)adt_value_bytes(g, v);
        grads[v] = malloc(bytes);
        memcpy(grads[v], adt_exec_data(ex, val->grad), bytes);
    }
    int checked = 0;
    for (int v = 0; v < g->n_values; v++) {
        adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM) continue;
        CHECK(val->grad >= 0, "%s: parameter %s got no gradient", what, val->name);
        if (val->grad < 0) continue;
        int64_t n = adt_shape_numel(&val->shape);
        float *p = adt_exec_data(ex, v);
        float *an = malloc((size_t)n * sizeof *an), *p0 = malloc((size_t)n * sizeof *p0), *d = malloc((size_t)n * sizeof *d);
        memcpy(an, grads[v], (size_t)n * sizeof *an);
        free(grads[v]);
        memcpy(p0, p, (size_t)n * sizeof *p0);
        double pmax = 0;
        for (int64_t i = 0; i < n; i++) pmax = fmax(pmax, fabs(p0[i]));
        double an_norm = 0;
        for (int64_t i = 0; i < n; i++) an_norm += (double)an[i] * an[i];
        an_norm = sqrt(an_norm);
        for (int dir = 0; dir < 4; dir++) {
            double an_dot = 0, d_norm = 0;
            for (int64_t i = 0; i < n; i++) {
                d[i] = urand(-1, 1);
                an_dot += (double)an[i] * d[i];
                d_norm += (double)d[i] * d[i];
            }
            d_norm = sqrt(d_norm);
            double e = 1e-2 * fmax(pmax, 0.1);
            if (fill == fill_away_from_zero || fill == fill_distinct) e = 1e-3; /* stay off the kinks */
            if (g_fd_step > 0) e = g_fd_step;
            for (int64_t i = 0; i < n; i++) p[i] = p0[i] + (float)e * d[i];
            double lp = loss_value(ex, g, out, R);
            for (int64_t i = 0; i < n; i++) p[i] = p0[i] - (float)e * d[i];
            double lm = loss_value(ex, g, out, R);
            memcpy(p, p0, (size_t)n * sizeof *p);
            double fd = (lp - lm) / (2 * e);
            /* typical |g.d| is |g||d|/sqrt(n): the floor keeps a lucky near-orthogonal direction
             * from turning rounding noise into a large relative error */
            double scale = fmax(fmax(fabs(fd), fabs(an_dot)), an_norm * d_norm / sqrt((double)n));
            double err = fabs(fd - an_dot) / fmax(scale, 1e-12);
            if (err >= tol && g_fd_step == 0) {
                /* near a minimum the derivative is small beside the step's e^2 f''' term (a
                 * bce_logits of 1 sample: 1e-4 against 2e-6): Richardson's extrapolation from
                 * half the step cancels that term; a wrong gradient misses both */
                for (int64_t i = 0; i < n; i++) p[i] = p0[i] + (float)(e / 2) * d[i];
                double lp2 = loss_value(ex, g, out, R);
                for (int64_t i = 0; i < n; i++) p[i] = p0[i] - (float)(e / 2) * d[i];
                double lm2 = loss_value(ex, g, out, R);
                memcpy(p, p0, (size_t)n * sizeof *p);
                double rich = (4 * (lp2 - lm2) / e - fd) / 3;
                double err_rich = fabs(rich - an_dot) / fmax(fmax(scale, fabs(rich)), 1e-12);
                if (err_rich < err) fd = rich, err = err_rich;
            }
            /* or within the rounding of the two float losses (one ulp of sum |out R| each, over
             * 2e): a direction with a derivative below it says nothing either way (a matmul whose
             * products cancel: 1e-5 against a loss of size 0.3) */
            int in_noise = fabs(fd - an_dot) < FLT_EPSILON * g_loss_abs / e;
            CHECK(err < tol || in_noise, "%s: d/d %s along direction %d: analytic %.6g, finite difference %.6g, rel err %.2e (seed %llu)",
                  what, val->name, dir, an_dot, fd, err, (unsigned long long)g_seed);
            checked++;
        }
        free(an);
        free(p0);
        free(d);
    }
    free(grads);
    CHECK(checked > 0, "%s: nothing was checked", what);
    adt_exec_free(ex);
}

#define P(g, name, ...) adt_param(g, name, adt_shape_make(sizeof((int64_t[]){__VA_ARGS__}) / 8, (int64_t[]){__VA_ARGS__}), (adt_init){0})

static void test_grad_matmul(void) {
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t M = irand(1, 9), N = irand(1, 9), K = irand(1, 9);
            adt_graph *g = adt_graph_create();
            int a = ta ? P(g, "a", K, M) : P(g, "a", M, K);
            int b = tb ? P(g, "b", N, K) : P(g, "b", K, N);
            grad_check("matmul", g, adt_matmul(g, a, b, ta, tb, 0), NULL, NULL, 0, 1e-2);
            adt_graph_free(g);
        }
    /* linear layer over a 3-D activation, and the weight-gradient form X^T dY */
    {
        adt_graph *g = adt_graph_create();
        int64_t B = irand(1, 4), T = irand(1, 5), K = irand(1, 7), N = irand(1, 7);
        int x = P(g, "x", B, T, K), w = P(g, "w", K, N);
        grad_check("matmul 3-D x 2-D", g, adt_matmul(g, x, w, 0, 0, 0), NULL, NULL, 0, 1e-2);
        adt_graph_free(g);
        g = adt_graph_create();
        x = P(g, "x", B, T, K);
        int y = P(g, "y", B, T, N);
        grad_check("matmul X^T Y over 3-D", g, adt_matmul(g, x, y, 1, 0, 0), NULL, NULL, 0, 1e-2);
        adt_graph_free(g);
    }
    /* axis groupings kept through the product: op(A) rows M, contraction K and op(B) columns N
     * of one or two axes each, every transpose (GPT's c_attn: X[B,T,C] @ W[C,3,C] -> [B,T,3,C],
     * and its gradients dY W^T and X^T dY, are among them) */
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            int64_t dm[2] = {irand(1, 4), irand(1, 4)}, dk[2] = {irand(1, 4), irand(1, 4)}, dn[2] = {irand(1, 4), irand(1, 4)};
            int nm = irand(1, 2), nk = irand(1, 2), nn = irand(1, 2);
            adt_shape sa = {0}, sb = {0};
            for (int i = 0; i < (ta ? nk : nm); i++) sa.dim[sa.ndim++] = ta ? dk[i] : dm[i];
            for (int i = 0; i < (ta ? nm : nk); i++) sa.dim[sa.ndim++] = ta ? dm[i] : dk[i];
            for (int i = 0; i < (tb ? nn : nk); i++) sb.dim[sb.ndim++] = tb ? dn[i] : dk[i];
            for (int i = 0; i < (tb ? nk : nn); i++) sb.dim[sb.ndim++] = tb ? dk[i] : dn[i];
            adt_graph *g = adt_graph_create();
            int a = adt_param(g, "a", sa, (adt_init){0}), b = adt_param(g, "b", sb, (adt_init){0});
            int c = adt_matmul_grouped(g, a, b, ta, tb, ta ? nm : nk, tb ? nk : nn);
            const adt_shape *sc = c >= 0 ? &g->values[c].shape : NULL;
            int shape_ok = sc && sc->ndim == nm + nn;
            for (int i = 0; shape_ok && i < nm + nn; i++) shape_ok = sc->dim[i] == (i < nm ? dm[i] : dn[i - nm]);
            CHECK(c < 0 || shape_ok, "grouped matmul (%d,%d) with M %d, K %d, N %d axes: output is not [M..,N..]", ta,
                  tb, nm, nk, nn);
            grad_check("grouped matmul", g, c, NULL, NULL, 0, 1e-2);
            adt_graph_free(g);
        }
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            adt_graph *g = adt_graph_create();
            int64_t B = irand(1, 3), H = irand(1, 3), M = irand(1, 6), N = irand(1, 6), K = irand(1, 6);
            int a = ta ? P(g, "a", B, H, K, M) : P(g, "a", B, H, M, K);
            int b = tb ? P(g, "b", B, H, N, K) : P(g, "b", B, H, K, N);
            grad_check("batched matmul", g, adt_matmul(g, a, b, ta, tb, 1), NULL, NULL, 0, 1e-2);
            adt_graph_free(g);
        }
}

static void test_grad_elementwise(void) {
    int64_t A = irand(1, 6), B = irand(1, 6), C = irand(1, 6);
    adt_graph *g = adt_graph_create();
    int x = P(g, "x", A, B, C), y = P(g, "y", A, B, C), z = P(g, "z", A, B, C);
    grad_check("add3", g, adt_add_n(g, (int[]){x, y, z}, 3), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B), y = P(g, "y", A, B);
    grad_check("sub", g, adt_sub(g, x, y), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B), y = P(g, "y", A, B);
    grad_check("mul", g, adt_mul(g, x, y), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B);
    grad_check("scale", g, adt_scale(g, x, urand(-3, 3)), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B, C), y = P(g, "b", C);
    grad_check("bias_add", g, adt_bias_add(g, x, y), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create(); /* over the last two axes: qkv [..,3,C] + b [3,C] */
    x = P(g, "x", A, B, 3, C), y = P(g, "b", 3, C);
    grad_check("bias_add 2-D", g, adt_bias_add(g, x, y), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    /* a value used twice: gradients from both uses add up */
    g = adt_graph_create();
    x = P(g, "x", A, B);
    grad_check("x*x + x", g, adt_add(g, adt_mul(g, x, x), x), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
}

static void test_grad_reduce_expand(void) {
    int64_t d[4] = {irand(1, 4), irand(1, 4), irand(1, 4), irand(1, 4)};
    for (int f = 0; f < 4; f++)
        for (int l = f; l < 4; l++) {
            adt_graph *g = adt_graph_create();
            int x = P(g, "x", d[0], d[1], d[2], d[3]);
            grad_check("reduce_sum", g, adt_reduce_sum(g, x, f, l), NULL, NULL, 0, 1e-2);
            adt_graph_free(g);
        }
    /* expand: reduce then expand back, so the expand node's own backward runs */
    adt_graph *g = adt_graph_create();
    int x = P(g, "x", d[0], d[1], d[2]);
    int r = adt_reduce_sum(g, x, 1, 1);
    adt_attrs at = {.i = {1, 1, d[1]}};
    int e = adt_graph_add_node(g, ADT_OP_EXPAND, (int[]){r}, 1, &at);
    int y = e >= 0 ? adt_mul(g, g->nodes[e].out[0], x) : -1;
    grad_check("expand", g, y, NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
}

static void test_grad_activations(void) {
    int64_t A = irand(1, 8), B = irand(1, 8);
    adt_graph *g = adt_graph_create();
    int x = P(g, "x", A, B);
    grad_check("relu", g, adt_relu(g, x), fill_away_from_zero, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B);
    grad_check("gelu", g, adt_gelu(g, adt_scale(g, x, 3.0f)), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B);
    grad_check("sigmoid", g, adt_sigmoid(g, adt_scale(g, x, 3.0f)), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B);
    grad_check("softmax", g, adt_softmax(g, x), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    int64_t N = irand(1, 5), C = irand(3, 12); /* C = 2 normalises every row to exactly -1, +1 */
    x = P(g, "x", N, 2, C);
    int w = P(g, "w", C), b = P(g, "b", C);
    g_ln_row = C;
    grad_check("layernorm", g, adt_layernorm(g, x, w, b, 1e-5f), fill_spread_rows, NULL, 0, 1e-2);
    adt_graph_free(g);
}

static void test_grad_dropout(void) {
    adt_graph *g = adt_graph_create();
    int x = P(g, "x", irand(2, 9), irand(2, 9));
    feed_spec step = {"step", 1000, 0};
    grad_check("dropout", g, adt_dropout(g, x, 0.3f, 7), NULL, &step, 1, 1e-2);
    adt_graph_free(g);
    /* evaluation runs are deterministic and keep every element */
    g = adt_graph_create();
    x = adt_input(g, "x", ADT_F32, adt_shape_1d(1000));
    int y = adt_dropout(g, x, 0.5f, 1);
    adt_graph_mark_output(g, y);
    adt_exec *ex;
    adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .seed = 5});
    float *px = adt_exec_data(ex, x);
    for (int i = 0; i < 1000; i++) px[i] = 1.0f;
    *(int32_t *)adt_exec_data(ex, g->step_input) = 3;
    adt_exec_run_forward(ex);
    const float *py = adt_exec_data(ex, y);
    int same = 0, zeros = 0;
    for (int i = 0; i < 1000; i++) same += py[i] == 1.0f;
    CHECK(same == 1000, "evaluation dropout changed %d of 1000 elements", 1000 - same);
    adt_exec_run_forward_mode(ex, 1);
    for (int i = 0; i < 1000; i++) zeros += py[i] == 0.0f;
    CHECK(zeros > 400 && zeros < 600, "training dropout p=0.5 zeroed %d of 1000", zeros);
    adt_exec_free(ex);
    adt_graph_free(g);
}

static void test_grad_attention(void) {
    int64_t B = irand(1, 2), T = irand(1, 6), H = irand(1, 3), D = irand(1, 4), C = H * D;
    adt_graph *g = adt_graph_create();
    int qkv = P(g, "qkv", B, T, 3, C);
    grad_check("attention", g, adt_attention(g, qkv, (int)H), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
}

static void test_grad_embedding_losses(void) {
    int64_t V = irand(2, 10), C = irand(1, 6), B = irand(1, 3), T = irand(1, 5);
    adt_graph *g = adt_graph_create();
    int ids = adt_input(g, "ids", ADT_I32, adt_shape_2d(B, T));
    int table = P(g, "table", V, C);
    feed_spec f = {"ids", (int)V, 0};
    grad_check("embedding", g, adt_embedding(g, ids, table), NULL, &f, 1, 1e-2);
    adt_graph_free(g);

    g = adt_graph_create();
    int logits = P(g, "logits", B, T, V);
    int labels = adt_label(g, "labels", ADT_I32, adt_shape_2d(B, T));
    f = (feed_spec){"labels", (int)V, 0};
    grad_check("softmax_xent", g, adt_softmax_xent(g, adt_scale(g, logits, 2.0f), labels), NULL, &f, 1, 1e-2);
    adt_graph_free(g);

    g = adt_graph_create();
    int64_t N = irand(1, 12);
    int x = P(g, "x", N);
    int y = adt_label(g, "y", ADT_F32, adt_shape_1d(N));
    f = (feed_spec){"y", 0, 1};
    grad_check("bce_logits", g, adt_bce_logits(g, adt_scale(g, x, 3.0f), y), NULL, &f, 1, 1e-2);
    adt_graph_free(g);
}

/* DLRM's path: one i32 id input [B, tables], a column sliced out per table, looked up in that
 * table. The gradient reaches each table through the i32 slice, which itself has none. */
static void test_grad_sliced_embedding(void) {
    int64_t B = irand(1, 4), T = irand(2, 4), C = irand(1, 5), V = irand(2, 6);
    int t = irand(0, (int)T - 1);
    adt_graph *g = adt_graph_create();
    int ids = adt_input(g, "ids", ADT_I32, adt_shape_2d(B, T));
    int table = P(g, "table", V, C);
    feed_spec f = {"ids", (int)V, 0};
    grad_check("embedding of a sliced id column", g, adt_embedding(g, adt_slice(g, ids, 1, t, 1), table), NULL, &f, 1,
               1e-2);
    adt_graph_free(g);
}

/* An i32 slice keeps its dtype and copies exactly the box it names, on every axis. */
static void test_slice_i32(void) {
    int64_t d[3] = {irand(1, 4), irand(1, 5), irand(1, 4)};
    int64_t n = d[0] * d[1] * d[2];
    for (int ax = 0; ax < 3; ax++) {
        int64_t start = irand(0, (int)d[ax] - 1), len = irand(1, (int)(d[ax] - start));
        adt_graph *g = adt_graph_create();
        int x = adt_input(g, "x", ADT_I32, adt_shape_3d(d[0], d[1], d[2]));
        int y = adt_slice(g, x, ax, start, len);
        CHECK(!adt_graph_error(g), "i32 slice refused: %s", adt_graph_error_message(g));
        if (adt_graph_error(g)) {
            adt_graph_free(g);
            return;
        }
        CHECK(g->values[y].dtype == ADT_I32, "an i32 slice came out as %s", adt_dtype_name(g->values[y].dtype));
        int64_t e[3] = {d[0], d[1], d[2]};
        e[ax] = len;
        adt_shape want = adt_shape_3d(e[0], e[1], e[2]);
        CHECK(adt_shape_equal(&g->values[y].shape, &want), "i32 slice shape");
        adt_graph_mark_output(g, y);
        adt_exec *ex;
        adt_exec_opts opts = {.threads = 1};
        CHECK(adt_exec_create(&ex, g, &opts) == ADT_OK, "executor: %s", adt_error_message());
        int32_t *xp = adt_exec_data(ex, x);
        /* values beyond 2^24 would not survive a trip through float */
        for (int64_t i = 0; i < n; i++) xp[i] = (int32_t)adt_rng_u32(g_seed, g_ctr++) - 7;
        adt_exec_run_forward(ex);
        const int32_t *yp = adt_exec_data(ex, y);
        int bad = 0;
        for (int64_t a = 0; a < e[0]; a++)
            for (int64_t b = 0; b < e[1]; b++)
                for (int64_t c = 0; c < e[2]; c++) {
                    int64_t i[3] = {a, b, c};
                    i[ax] += start;
                    bad += yp[(a * e[1] + b) * e[2] + c] != xp[(i[0] * d[1] + i[1]) * d[2] + i[2]];
                }
        CHECK(bad == 0, "i32 slice along axis %d [%lld, +%lld): %d wrong elements", ax, (long long)start,
              (long long)len, bad);
        adt_exec_free(ex);
        adt_graph_free(g);
    }
    /* bf16 is a storage type only: slicing it is still refused, naming the dtype */
    adt_graph *g = adt_graph_create();
    int x = adt_input(g, "h", ADT_BF16, adt_shape_2d(2, 2));
    CHECK(adt_slice(g, x, 0, 0, 1) < 0 && strstr(adt_graph_error_message(g), "bf16"), "%s", adt_graph_error_message(g));
    adt_graph_free(g);
}

static void test_grad_conv_pool(void) {
    for (int rep = 0; rep < 3; rep++) {
        int64_t N = irand(1, 2), C = irand(1, 3), H = irand(3, 7), W = irand(3, 7), K = irand(1, 3);
        int64_t R = irand(1, 3), stride = irand(1, 2), pad = irand(0, 1);
        adt_graph *g = adt_graph_create();
        int x = P(g, "x", N, C, H, W), w = P(g, "w", K, C, R, R);
        int b = rep == 1 ? -1 : P(g, "b", K);
        g_fd_step = 0.5; /* conv2d is linear in x, in w and in b */
        grad_check("conv2d", g, adt_conv2d(g, x, w, b, (int)stride, (int)pad), NULL, NULL, 0, 1e-2);
        g_fd_step = 0;
        adt_graph_free(g);
    }
    int64_t N = irand(1, 2), C = irand(1, 3), H = irand(2, 7), W = irand(2, 7);
    int k = irand(1, 2), s = irand(1, 2);
    adt_graph *g = adt_graph_create();
    int x = P(g, "x", N, C, H, W);
    grad_check("maxpool2d", g, adt_maxpool2d(g, x, k, s), fill_distinct, NULL, 0, 1e-2);
    adt_graph_free(g);
}

static void test_grad_shape_ops(void) {
    int64_t A = irand(1, 4), B = irand(1, 4), C = irand(1, 4);
    adt_graph *g = adt_graph_create();
    int x = P(g, "x", A, B, C);
    /* reshape is a view: follow it by a nonlinear op so the view's gradient matters */
    grad_check("reshape", g, adt_mul(g, adt_reshape(g, x, adt_shape_2d(A * B, C)), adt_reshape(g, x, adt_shape_2d(A * B, C))),
               NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    g = adt_graph_create();
    x = P(g, "x", A, B, C);
    grad_check("flatten", g, adt_flatten(g, x), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
    int perms[6][3] = {{0, 1, 2}, {0, 2, 1}, {1, 0, 2}, {1, 2, 0}, {2, 0, 1}, {2, 1, 0}};
    for (int p = 0; p < 6; p++) {
        g = adt_graph_create();
        x = P(g, "x", A, B, C);
        grad_check("permute", g, adt_permute(g, x, perms[p]), NULL, NULL, 0, 1e-2);
        adt_graph_free(g);
    }
    for (int ax = 0; ax < 3; ax++) {
        g = adt_graph_create();
        int a = P(g, "a", A, B, C);
        int64_t d[3] = {A, B, C};
        d[ax] = irand(1, 3);
        int b = adt_param(g, "b", adt_shape_3d(d[0], d[1], d[2]), (adt_init){0});
        grad_check("concat", g, adt_concat(g, (int[]){a, b, a}, 3, ax), NULL, NULL, 0, 1e-2);
        adt_graph_free(g);
        g = adt_graph_create();
        int64_t full = irand(2, 6);
        int64_t e[3] = {A, B, C};
        e[ax] = full;
        x = adt_param(g, "x", adt_shape_3d(e[0], e[1], e[2]), (adt_init){0});
        int64_t start = irand(0, (int)full - 1), len = irand(1, (int)(full - start));
        grad_check("slice", g, adt_slice(g, x, ax, start, len), NULL, NULL, 0, 1e-2);
        adt_graph_free(g);
    }
    g = adt_graph_create();
    x = P(g, "x", irand(1, 3), irand(2, 6), irand(1, 5));
    grad_check("interaction", g, adt_interaction(g, x), NULL, NULL, 0, 1e-2);
    adt_graph_free(g);
}

/* Every op kind with a backward rule appears above; this guards against a new op without a
 * gradient check. */
static void test_every_op_covered(void) {
    static const int checked[] = {ADT_OP_MATMUL, ADT_OP_ADD, ADT_OP_SUB, ADT_OP_MUL, ADT_OP_SCALE, ADT_OP_BIAS_ADD,
                                  ADT_OP_REDUCE_SUM, ADT_OP_EXPAND, ADT_OP_RELU, ADT_OP_GELU, ADT_OP_SIGMOID,
                                  ADT_OP_LAYERNORM, ADT_OP_SOFTMAX, ADT_OP_ATTENTION, ADT_OP_EMBEDDING,
                                  ADT_OP_SOFTMAX_XENT, ADT_OP_BCE_LOGITS, ADT_OP_CONV2D, ADT_OP_MAXPOOL2D,
                                  ADT_OP_RESHAPE, ADT_OP_PERMUTE, ADT_OP_CONCAT, ADT_OP_SLICE, ADT_OP_INTERACTION,
                                  ADT_OP_DROPOUT};
    for (int k = 0; k < ADT_OP_COUNT; k++) {
        const adt_op_def *d = adt_op_get(k);
        CHECK(d != NULL, "op %d has no definition", k);
        if (!d || !d->backward) continue;
        int found = 0;
        for (size_t i = 0; i < sizeof checked / sizeof checked[0]; i++) found |= checked[i] == k;
        CHECK(found, "op %s has a backward rule but no gradient check", d->name);
    }
}

/* ---- the executor's matmul + bias_add fold ----------------------------------------------- */

/* Runs the forward of a graph with output `out` = f(x, w, b) three times with the per-node
 * timers on; returns whether bias_add node `ba` ran (a node the executor folded into its matmul
 * is skipped and keeps a time of exactly 0), and checks `out` against want(x, w, b). */
typedef double (*fold_ref_fn)(const float *x, const float *w, const float *b, int64_t i, int64_t j,
                              int64_t K, int64_t N);

static double ref_linear(const float *x, const float *w, const float *b, int64_t i, int64_t j, int64_t K,
                         int64_t N) {
    double s = b[j];
    for (int64_t k = 0; k < K; k++) s += (double)x[i * K + k] * w[k * N + j];
    return s;
}
static double ref_linear_plus_3_product(const float *x, const float *w, const float *b, int64_t i, int64_t j,
                                        int64_t K, int64_t N) {
    return 4 * ref_linear(x, w, b, i, j, K, N) - 3 * b[j];
}
static double ref_linear_2b(const float *x, const float *w, const float *b, int64_t i, int64_t j, int64_t K,
                            int64_t N) {
    return ref_linear(x, w, b, i, j, K, N) + b[j];
}

static int fold_run(const char *what, adt_graph *g, int x, int w, int b, int out, int ba, int64_t M,
                    int64_t K, int64_t N, fold_ref_fn want) {
    adt_graph_mark_output(g, out);
    CHECK(!adt_graph_error(g), "%s: %s", what, adt_graph_error_message(g));
    adt_exec *ex;
    CHECK(adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .profile = 1}) == ADT_OK, "%s: executor", what);
    float *px = adt_exec_data(ex, x), *pw = adt_exec_data(ex, w), *pb = adt_exec_data(ex, b);
    for (int64_t i = 0; i < M * K; i++) px[i] = urand(-1, 1);
    for (int64_t i = 0; i < K * N; i++) pw[i] = urand(-1, 1);
    for (int64_t i = 0; i < N; i++) pb[i] = urand(-1, 1);
    for (int rep = 0; rep < 3; rep++) {
        adt_exec_run_forward(ex);
        const float *y = adt_exec_data(ex, out);
        double worst = 0;
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double r = want(px, pw, pb, i, j, K, N);
                worst = fmax(worst, fabs(y[i * N + j] - r) / fmax(fabs(r), 1.0));
            }
        CHECK(worst < 1e-5, "%s: run %d: output off the reference by %.3g (seed %llu)", what, rep, worst,
              (unsigned long long)g_seed);
    }
    int ran = adt_exec_node_seconds(ex)[ba] > 0;
    adt_exec_free(ex);
    return ran;
}

/* after_node: one call per node, in run order, each after the node's outputs are written. */
typedef struct after_log {
    int n, calls[64];
    const adt_graph *g;
    adt_exec *ex;
    int y;
    float *y_then; /* y as it was when its producer's call came */
} after_log;

static void after_record(void *ctx, int node) {
    after_log *l = ctx;
    if (l->n < 64) l->calls[l->n] = node;
    l->n++;
    if (node == l->g->values[l->y].producer)
        memcpy(l->y_then, adt_exec_data(l->ex, l->y), (size_t)adt_value_bytes(l->g, l->y));
}

/* Two executors, one parameter storage (adt_exec_bind): a forward-only executor bound to a training
 * executor's weights computes with the weights the training executor holds, before and after its
 * update, with no copy; the training executor's after_node callback sees every node once. */
static void test_exec_bind(void) {
    int64_t M = irand(2, 9), K = irand(1, 6), N = irand(2, 12);
    adt_graph *ga = adt_graph_create(), *gb = adt_graph_create();
    int xa = adt_input(ga, "x", ADT_F32, adt_shape_2d(M, K)), wa = P(ga, "w", K, N), ba = P(ga, "b", N);
    int ya = adt_bias_add(ga, adt_matmul(ga, xa, wa, 0, 0, 0), ba);
    adt_graph_mark_output(ga, ya);
    adt_graph_backward(ga, adt_reduce_sum(ga, adt_mul(ga, ya, ya), 0, 1));
    adt_optim_cfg sgd = adt_optim_sgd(0.0f, 0.0f);
    adt_graph_optimizer(ga, &sgd);
    int xb = adt_input(gb, "x", ADT_F32, adt_shape_2d(M, K)), wb = P(gb, "w", K, N), bb = P(gb, "b", N);
    int yb = adt_bias_add(gb, adt_matmul(gb, xb, wb, 0, 0, 0), bb);
    adt_graph_mark_output(gb, yb);
    CHECK(!adt_graph_error(ga) && !adt_graph_error(gb), "graphs: %s %s", adt_graph_error_message(ga),
          adt_graph_error_message(gb));
    float *y_then = malloc((size_t)(M * N) * sizeof *y_then);
    after_log log = {.g = ga, .y = ya, .y_then = y_then};
    adt_exec *ea, *eb;
    CHECK(adt_exec_create(&ea, ga, &(adt_exec_opts){.threads = 1, .after_node = after_record, .after_ctx = &log}) == 0,
          "%s", adt_error_message());
    CHECK(adt_exec_create(&eb, gb, &(adt_exec_opts){.threads = 1}) == 0, "%s", adt_error_message());
    log.ex = ea;
    CHECK(adt_exec_bind(eb, wb, adt_exec_data(ea, wa)) == 0 && adt_exec_bind(eb, bb, adt_exec_data(ea, ba)) == 0,
          "bind: %s", adt_error_message());
    CHECK(adt_exec_data(eb, wb) == adt_exec_data(ea, wa), "the bound storage is the other executor's");
    CHECK(adt_exec_bind(eb, yb, adt_exec_data(ea, wa)) != 0, "an activation cannot be bound");
    float *pxa = adt_exec_data(ea, xa), *pxb = adt_exec_data(eb, xb), *pw = adt_exec_data(ea, wa), *pb = adt_exec_data(ea, ba);
    for (int64_t i = 0; i < M * K; i++) pxa[i] = pxb[i] = urand(-1, 1);
    for (int64_t i = 0; i < K * N; i++) pw[i] = urand(-1, 1);
    for (int64_t i = 0; i < N; i++) pb[i] = urand(-1, 1);
    float *before = malloc((size_t)(M * N) * sizeof *before);
    double worst = 0, moved = 0;
    for (int round = 0; round < 2; round++) { /* before and after the training executor's update */
        CHECK(adt_exec_run_forward(eb) == 0, "forward: %s", adt_error_message());
        const float *py = adt_exec_data(eb, yb);
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double r = ref_linear(pxb, pw, pb, i, j, K, N);
                worst = fmax(worst, fabs(py[i * N + j] - r) / fmax(fabs(r), 1.0));
                if (round) moved = fmax(moved, fabs(py[i * N + j] - before[i * N + j]));
                else before[i * N + j] = py[i * N + j];
            }
        if (round) break;
        adt_exec_set_lr_step(ea, 0.1f, 1);
        log.n = 0;
        CHECK(adt_exec_run(ea) == 0, "step: %s", adt_error_message());
    }
    CHECK(worst < 1e-5, "the bound executor computed with other weights: off by %.3g (seed %llu)", worst,
          (unsigned long long)g_seed);
    CHECK(moved > 0, "the update did not reach the bound executor");
    /* the callback: every node once, in the executor's order, y final at its producer's call */
    CHECK(log.n == ga->n_nodes, "%d calls for %d nodes", log.n, ga->n_nodes);
    int seen[64] = {0}, ok = log.n <= 64;
    for (int k = 0; ok && k < log.n; k++) ok = !seen[log.calls[k]]++;
    CHECK(ok, "a node reported twice");
    const float *ya_now = adt_exec_data(ea, ya);
    CHECK(!memcmp(y_then, ya_now, (size_t)(M * N) * sizeof *y_then), "y changed after its producer's call");
    adt_exec_free(ea), adt_exec_free(eb);
    /* not with microbatch slots */
    CHECK(adt_exec_create(&eb, gb, &(adt_exec_opts){.threads = 1, .microbatch_slots = 2}) == 0, "%s", adt_error_message());
    CHECK(adt_exec_bind(eb, wb, before) != 0, "bound with microbatch slots");
    adt_exec_free(eb);
    free(before), free(y_then);
    adt_graph_free(ga), adt_graph_free(gb);
}

static void test_bias_fold(void) {
    int64_t M = irand(2, 12), K = irand(1, 6), N = irand(K + 1, 24); /* N > K: see case 2 */
    /* 1. a linear layer: folded */
    adt_graph *g = adt_graph_create();
    int x = P(g, "x", M, K), w = P(g, "w", K, N), b = P(g, "b", N);
    int y = adt_bias_add(g, adt_matmul(g, x, w, 0, 0, 0), b);
    CHECK(!fold_run("linear", g, x, w, b, y, g->values[y].producer, M, K, N, ref_linear),
          "linear: the bias_add was not folded into the matmul");
    adt_graph_free(g);

    /* 2. the product's input dies at the product: the plan may give the bias_add's output the
     * input's bytes, so writing the bias there before the product would destroy the input */
    g = adt_graph_create();
    int xp = P(g, "x", M, K);
    w = P(g, "w", K, N), b = P(g, "b", N);
    x = adt_scale(g, xp, 1.0f);
    y = adt_bias_add(g, adt_matmul(g, x, w, 0, 0, 0), b);
    adt_graph_mark_output(g, y);
    adt_memplan mp;
    adt_memplan_build(&mp, g, NULL, g->n_nodes, 0);
    CHECK(mp.offset[x] < mp.offset[y] + adt_value_bytes(g, y) && mp.offset[y] < mp.offset[x] + adt_value_bytes(g, x),
          "case 2 needs the plan to share bytes between x and y (x at %lld, y at %lld)",
          (long long)mp.offset[x], (long long)mp.offset[y]);
    adt_memplan_free(&mp);
    CHECK(fold_run("input dies at the product", g, xp, w, b, y, g->values[y].producer, M, K, N, ref_linear),
          "input dies at the product: folded although the output buffer overlaps the input");
    adt_graph_free(g);

    /* 3. the product has another reader before the bias_add: it must exist on its own */
    g = adt_graph_create();
    x = P(g, "x", M, K), w = P(g, "w", K, N), b = P(g, "b", N);
    int p = adt_matmul(g, x, w, 0, 0, 0);
    int q = adt_scale(g, p, 3.0f);
    y = adt_bias_add(g, p, b);
    int z = adt_add(g, y, q);
    CHECK(fold_run("product read twice", g, x, w, b, z, g->values[y].producer, M, K, N, ref_linear_plus_3_product),
          "product read twice: folded");
    adt_graph_free(g);

    /* 4. the bias is computed after the product: not there yet when the product runs */
    g = adt_graph_create();
    x = P(g, "x", M, K), w = P(g, "w", K, N), b = P(g, "b", N);
    p = adt_matmul(g, x, w, 0, 0, 0);
    y = adt_bias_add(g, p, adt_scale(g, b, 2.0f));
    CHECK(fold_run("bias computed later", g, x, w, b, y, g->values[y].producer, M, K, N, ref_linear_2b),
          "bias computed later: folded");
    adt_graph_free(g);

    /* 5. the bias is updated between the product and the bias_add: a node after the optimizer
     * adds the new bias to a product made before it (no buffer reuse, so that only the update
     * stands in the way of folding) */
    g = adt_graph_create();
    x = P(g, "x", M, K), w = P(g, "w", K, N), b = P(g, "b", N);
    int c = adt_input(g, "c", ADT_F32, adt_shape_1d(N));
    p = adt_matmul(g, x, w, 0, 0, 0);
    adt_graph_backward(g, adt_reduce_sum(g, adt_mul(g, b, c), 0, 0)); /* d/db = c */
    adt_optim_cfg sgd = adt_optim_sgd(0.0f, 0.0f);
    adt_graph_optimizer(g, &sgd);
    y = adt_bias_add(g, p, b);
    adt_graph_mark_output(g, y);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    adt_exec *ex;
    adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .no_reuse = 1});
    float *px = adt_exec_data(ex, x), *pw = adt_exec_data(ex, w), *pb = adt_exec_data(ex, b), *pc = adt_exec_data(ex, c);
    for (int64_t i = 0; i < M * K; i++) px[i] = urand(-1, 1);
    for (int64_t i = 0; i < K * N; i++) pw[i] = urand(-1, 1);
    for (int64_t i = 0; i < N; i++) pb[i] = urand(-1, 1), pc[i] = urand(-1, 1);
    float *b0 = malloc((size_t)N * sizeof *b0);
    memcpy(b0, pb, (size_t)N * sizeof *b0);
    adt_exec_set_lr_step(ex, 0.5f, 1);
    adt_exec_run(ex);
    const float *py = adt_exec_data(ex, y);
    double worst = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double r = ref_linear(px, pw, b0, i, j, K, N) - 0.5 * pc[j];
            worst = fmax(worst, fabs(py[i * N + j] - r) / fmax(fabs(r), 1.0));
        }
    CHECK(worst < 1e-5, "bias updated in between: output off the reference by %.3g (seed %llu)", worst,
          (unsigned long long)g_seed);
    free(b0);
    adt_exec_free(ex);
    adt_graph_free(g);

    /* the folded linear layer's gradients, through autodiff and the executor */
    for (int tb = 0; tb < 2; tb++) {
        g = adt_graph_create();
        int64_t B = irand(1, 3), T = irand(1, 5);
        x = P(g, "x", B, T, K), b = P(g, "b", N);
        w = tb ? P(g, "w", N, K) : P(g, "w", K, N);
        grad_check("linear", g, adt_bias_add(g, adt_matmul(g, x, w, 0, tb, 0), b), NULL, NULL, 0, 1e-2);
        adt_graph_free(g);
    }
}

/* ---- optimizers against closed forms ------------------------------------------------------ */

/* loss = sum(w * c): the gradient is exactly c, so the trajectory has a closed form. */
static void optim_closed_form(adt_optim_cfg cfg, const char *what) {
    int64_t n = irand(1, 20);
    adt_graph *g = adt_graph_create();
    int w = adt_param(g, "w", adt_shape_1d(n), (adt_init){0});
    int c = adt_input(g, "c", ADT_F32, adt_shape_1d(n));
    int L = adt_reduce_sum(g, adt_mul(g, w, c), 0, 0);
    adt_graph_backward(g, L);
    adt_graph_optimizer(g, &cfg);
    CHECK(!adt_graph_error(g), "%s: %s", what, adt_graph_error_message(g));
    adt_exec *ex;
    adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1});
    adt_exec_init_params(ex);
    float *pw = adt_exec_data(ex, w), *pc = adt_exec_data(ex, c);
    double *ew = malloc((size_t)n * sizeof *ew), *em = calloc((size_t)n, sizeof *em), *ev = calloc((size_t)n, sizeof *ev);
    for (int64_t i = 0; i < n; i++) {
        pw[i] = urand(-1, 1);
        pc[i] = urand(-1, 1);
        ew[i] = pw[i];
    }
    float lr = urand(0.01f, 0.2f);
    for (int t = 1; t <= 6; t++) {
        adt_exec_set_lr_step(ex, lr, t);
        adt_exec_run(ex);
        for (int64_t i = 0; i < n; i++) {
            double gr = pc[i];
            if (cfg.kind == ADT_OPTIM_SGD) {
                gr += cfg.weight_decay * ew[i];
                if (cfg.momentum > 0) {
                    em[i] = t == 1 ? gr : cfg.momentum * em[i] + gr;
                    gr = em[i];
                }
                ew[i] -= lr * gr;
            } else {
                ew[i] *= 1.0 - lr * cfg.weight_decay;
                em[i] = cfg.beta1 * em[i] + (1 - cfg.beta1) * gr;
                ev[i] = cfg.beta2 * ev[i] + (1 - cfg.beta2) * gr * gr;
                double mh = em[i] / (1 - pow(cfg.beta1, t)), vh = ev[i] / (1 - pow(cfg.beta2, t));
                ew[i] -= lr * mh / (sqrt(vh) + cfg.eps);
            }
        }
        for (int64_t i = 0; i < n; i++) CHECK_CLOSE(pw[i], ew[i], 1e-5, 1e-6);
    }
    free(ew);
    free(em);
    free(ev);
    adt_exec_free(ex);
    adt_graph_free(g);
}

/* The executor runs each update as soon as its parameter's last use and its gradient allow:
 * in a 3-layer MLP the last layer's gradient is then consumed (and its buffer free) before the
 * first layer's gradient is even produced; in graph order every update waits for the end. One
 * SGD step is checked against a double-precision reference of forward, backward and update.
 * Then a node that reads a parameter after its gradient is complete (appended after autodiff,
 * before the optimizer): the update must wait for it. */
static void test_update_schedule(void) {
    const int B = 3, n0 = 4, n1 = 5, n2 = 6, n3 = 2;
    adt_graph *g = adt_graph_create();
    adt_mlp_cfg m = {.n_sizes = 4, .sizes = {n0, n1, n2, n3}, .activation = ADT_ACT_SIGMOID};
    adt_model_io io;
    adt_model_mlp(g, &m, B, &io);
    adt_graph_backward(g, io.loss);
    adt_optim_cfg oc = adt_optim_sgd(0.0f, 0.0f);
    adt_graph_optimizer(g, &oc);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    const char *wn[3] = {"layers.0.weight", "layers.1.weight", "layers.2.weight"};
    const char *bn[3] = {"layers.0.bias", "layers.1.bias", "layers.2.bias"};
    adt_exec *ex;
    adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1});
    const adt_memplan *mp = adt_exec_memplan(ex);
    int g_first = g->values[adt_graph_find_value(g, wn[0])].grad, g_last = g->values[adt_graph_find_value(g, wn[2])].grad;
    CHECK(mp->last[mp->root[g_last]] < mp->first[mp->root[g_first]],
          "the last layer's gradient lives to %d, past the first layer's gradient at %d", mp->last[mp->root[g_last]],
          mp->first[mp->root[g_first]]);

    /* one step, and the reference in double */
    adt_exec_init_params(ex);
    float *x = adt_exec_data(ex, io.input);
    int32_t *y = adt_exec_data(ex, io.label);
    for (int i = 0; i < B * n0; i++) x[i] = urand(-2, 2);
    for (int i = 0; i < B; i++) y[i] = irand(0, n3 - 1);
    const int sz[4] = {n0, n1, n2, n3};
    double W[3][36], Bi[3][6], dW[3][36], dB[3][6];
    for (int l = 0; l < 3; l++) {
        const float *pw = adt_exec_f32(ex, wn[l]), *pb = adt_exec_f32(ex, bn[l]);
        for (int i = 0; i < sz[l + 1] * sz[l]; i++) W[l][i] = pw[i];
        for (int i = 0; i < sz[l + 1]; i++) Bi[l][i] = pb[i];
    }
    double h[4][3][6];
    for (int b = 0; b < B; b++) {
        for (int i = 0; i < n0; i++) h[0][b][i] = x[b * n0 + i];
        for (int l = 0; l < 3; l++)
            for (int o = 0; o < sz[l + 1]; o++) {
                double z = Bi[l][o];
                for (int i = 0; i < sz[l]; i++) z += W[l][o * sz[l] + i] * h[l][b][i];
                h[l + 1][b][o] = l < 2 ? 1 / (1 + exp(-z)) : z;
            }
    }
    memset(dW, 0, sizeof dW);
    memset(dB, 0, sizeof dB);
    for (int b = 0; b < B; b++) {
        double mx = fmax(h[3][b][0], h[3][b][1]), e0 = exp(h[3][b][0] - mx), e1 = exp(h[3][b][1] - mx);
        double dz[6] = {e0 / (e0 + e1) / B, e1 / (e0 + e1) / B};
        dz[y[b]] -= 1.0 / B;
        for (int l = 2; l >= 0; l--) {
            for (int o = 0; o < sz[l + 1]; o++) {
                dB[l][o] += dz[o];
                for (int i = 0; i < sz[l]; i++) dW[l][o * sz[l] + i] += dz[o] * h[l][b][i];
            }
            if (l == 0) break;
            double dh[6];
            for (int i = 0; i < sz[l]; i++) { /* through W (before its update) and the sigmoid */
                double s = 0;
                for (int o = 0; o < sz[l + 1]; o++) s += W[l][o * sz[l] + i] * dz[o];
                dh[i] = s * h[l][b][i] * (1 - h[l][b][i]);
            }
            memcpy(dz, dh, sizeof dh);
        }
    }
    float lr = 0.5f;
    adt_exec_set_lr_step(ex, lr, 1);
    adt_exec_run(ex);
    for (int l = 0; l < 3; l++) {
        const float *pw = adt_exec_f32(ex, wn[l]), *pb = adt_exec_f32(ex, bn[l]);
        double worst = 0;
        for (int i = 0; i < sz[l + 1] * sz[l]; i++) worst = fmax(worst, fabs(pw[i] - (W[l][i] - lr * dW[l][i])));
        for (int i = 0; i < sz[l + 1]; i++) worst = fmax(worst, fabs(pb[i] - (Bi[l][i] - lr * dB[l][i])));
        CHECK(worst < 1e-5, "layer %d after one step: off the reference by %.3g", l, worst);
    }
    adt_exec_free(ex);
    adt_graph_free(g);

    int64_t n = irand(1, 20);
    g = adt_graph_create();
    int w = adt_param(g, "w", adt_shape_1d(n), (adt_init){0});
    int c = adt_input(g, "c", ADT_F32, adt_shape_1d(n));
    adt_graph_backward(g, adt_reduce_sum(g, adt_mul(g, w, c), 0, 0));
    int seen = adt_scale(g, w, 1.0f); /* reads w after its gradient c is complete */
    adt_graph_mark_output(g, seen);
    adt_graph_optimizer(g, &oc);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1});
    float *pw = adt_exec_data(ex, w), *pc = adt_exec_data(ex, c), *w0 = malloc((size_t)n * sizeof *w0);
    for (int64_t i = 0; i < n; i++) w0[i] = pw[i] = urand(-1, 1), pc[i] = urand(-1, 1);
    adt_exec_set_lr_step(ex, lr, 1);
    adt_exec_run(ex);
    const float *ps = adt_exec_data(ex, seen);
    for (int64_t i = 0; i < n; i++) {
        CHECK(ps[i] == w0[i], "w[%lld] read as %g after the update, not %g before it", (long long)i, ps[i], w0[i]);
        CHECK_CLOSE(pw[i], w0[i] - lr * pc[i], 1e-6, 1e-6);
    }
    free(w0);
    adt_exec_free(ex);
    adt_graph_free(g);
}

/* SGD with momentum whose gradient comes straight from a matmul: the executor accumulates the
 * product into the momentum buffer (sgemm beta = momentum) and leaves w -= lr m to the update.
 * The weights must come out bitwise as without that fold, which a graph that keeps the weight
 * gradients as outputs forces. Without buffer reuse the gradient's own buffer shows which ran:
 * filled with a sentinel first, folded it still holds it, kept it does not (a sentinel, as a
 * gradient may be all zero: every ReLU unit dead on the batch, seed 1795318544). */
#define SENTINEL 1234.5f
static void test_momentum_fold(void) {
    const int B = irand(1, 40), n0 = irand(1, 30), n1 = irand(1, 30), n2 = irand(2, 6);
    adt_graph *gr[2];
    adt_exec *ex[2];
    adt_model_io io[2];
    const char *wn[2] = {"layers.0.weight", "layers.1.weight"};
    float *x = malloc((size_t)(B * n0) * sizeof *x);
    int32_t *y = malloc((size_t)B * sizeof *y);
    for (int i = 0; i < B * n0; i++) x[i] = urand(-2, 2);
    for (int i = 0; i < B; i++) y[i] = irand(0, n2 - 1);
    for (int k = 0; k < 2; k++) {
        adt_graph *g = gr[k] = adt_graph_create();
        adt_mlp_cfg m = {.n_sizes = 3, .sizes = {n0, n1, n2}, .activation = ADT_ACT_RELU};
        adt_model_mlp(g, &m, B, &io[k]);
        adt_graph_backward(g, io[k].loss);
        adt_optim_cfg oc = adt_optim_sgd(0.9f, 0.0f);
        adt_graph_optimizer(g, &oc);
        if (k == 1) /* kept gradients: no fold */
            for (int l = 0; l < 2; l++) adt_graph_mark_output(g, g->values[adt_graph_find_value(g, wn[l])].grad);
        CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
        adt_exec_create(&ex[k], g, &(adt_exec_opts){.threads = 1, .seed = g_seed, .no_reuse = 1});
        adt_exec_init_params(ex[k]);
        for (int l = 0; l < 2; l++) {
            int gv = g->values[adt_graph_find_value(g, wn[l])].grad;
            float *gd = adt_exec_data(ex[k], gv);
            for (int64_t i = 0; i < adt_value_numel(g, gv); i++) gd[i] = SENTINEL;
        }
        memcpy(adt_exec_data(ex[k], io[k].input), x, (size_t)(B * n0) * sizeof *x);
        memcpy(adt_exec_data(ex[k], io[k].label), y, (size_t)B * sizeof *y);
        for (int t = 1; t <= 4; t++) {
            adt_exec_set_lr_step(ex[k], 0.1f, t);
            adt_exec_run(ex[k]);
        }
    }
    for (int l = 0; l < 2; l++) {
        int64_t n = adt_value_numel(gr[0], adt_graph_find_value(gr[0], wn[l]));
        const float *w0 = adt_exec_f32(ex[0], wn[l]), *w1 = adt_exec_f32(ex[1], wn[l]);
        CHECK(memcmp(w0, w1, (size_t)n * sizeof *w0) == 0, "%s after 4 steps: folded and plain runs differ (B=%d)",
              wn[l], B);
        const float *gf = adt_exec_data(ex[0], gr[0]->values[adt_graph_find_value(gr[0], wn[l])].grad);
        const float *gp = adt_exec_data(ex[1], gr[1]->values[adt_graph_find_value(gr[1], wn[l])].grad);
        int untouched = 1, written = 1;
        for (int64_t i = 0; i < n; i++) untouched &= gf[i] == SENTINEL, written &= gp[i] != SENTINEL;
        /* the weight gradient [out, in] = dy^T x sums over the batch: folded exactly where the
         * GEMM backend adds a product with its own rounding */
        int64_t fan_out = l == 0 ? n1 : n2, fan_in = l == 0 ? n0 : n1;
        if (adt_gemm_acc_exact(fan_out, fan_in, B))
            CHECK(untouched, "%s: the gradient buffer was written, the fold did not happen", wn[l]);
        else
            CHECK(!untouched, "%s [%lld x %lld, K = %d]: folded, but %s's accumulation is not exact there", wn[l],
                  (long long)fan_out, (long long)fan_in, B, adt_gemm_backend_name());
        CHECK(written, "%s: the kept gradient was not (wholly) written", wn[l]);
        /* what the executor says of the weight gradient's product: accumulating where folded */
        int mm0 = gr[0]->values[gr[0]->values[adt_graph_find_value(gr[0], wn[l])].grad].producer;
        int mm1 = gr[1]->values[gr[1]->values[adt_graph_find_value(gr[1], wn[l])].grad].producer;
        CHECK(gr[0]->nodes[mm0].op == ADT_OP_MATMUL && adt_exec_matmul_accumulates(ex[0], mm0) == untouched,
              "%s: adt_exec_matmul_accumulates says %d, the fold %s", wn[l], adt_exec_matmul_accumulates(ex[0], mm0),
              untouched ? "happened" : "did not happen");
        CHECK(!adt_exec_matmul_accumulates(ex[1], mm1), "%s: kept gradient, but its product said accumulating", wn[l]);
    }
    /* the forward products add onto their folded biases; no other node is a product */
    int acc_fwd = 0, acc_other = 0;
    for (int i = 0; i < gr[1]->n_nodes; i++) {
        const adt_node *nd = &gr[1]->nodes[i];
        if (nd->op == ADT_OP_MATMUL && !nd->is_backward) acc_fwd += adt_exec_matmul_accumulates(ex[1], i);
        else if (nd->op != ADT_OP_MATMUL) acc_other += adt_exec_matmul_accumulates(ex[1], i);
    }
    CHECK(acc_fwd == 2 && acc_other == 0 && !adt_exec_matmul_accumulates(ex[1], -1) &&
              !adt_exec_matmul_accumulates(ex[1], gr[1]->n_nodes),
          "%d forward products accumulating (expected both, onto their biases), %d other nodes said so", acc_fwd,
          acc_other);
    for (int k = 0; k < 2; k++) {
        adt_exec_free(ex[k]);
        adt_graph_free(gr[k]);
    }
    free(x);
    free(y);
}

static void test_optimizers(void) {
    optim_closed_form(adt_optim_sgd(0.0f, 0.0f), "sgd");
    optim_closed_form(adt_optim_sgd(0.9f, 0.0f), "sgd momentum");
    optim_closed_form(adt_optim_sgd(0.9f, 0.01f), "sgd momentum wd");
    optim_closed_form(adt_optim_adamw(0.9f, 0.999f, 1e-8f, 0.0f), "adamw");
    optim_closed_form(adt_optim_adamw(0.8f, 0.95f, 1e-6f, 0.1f), "adamw wd");
}

/* ---- memory plan ------------------------------------------------------------------------ */

static void check_plan(const adt_graph *g, const char *what) {
    adt_memplan mp;
    adt_memplan_build(&mp, g, NULL, g->n_nodes, 0);
    int overlaps = 0, live = 0;
    for (int a = 0; a < g->n_values; a++) {
        if (mp.offset[a] < 0) continue;
        live++;
        for (int b = a + 1; b < g->n_values; b++) {
            if (mp.offset[b] < 0) continue;
            int t_overlap = mp.first[a] <= mp.last[b] && mp.first[b] <= mp.last[a];
            int64_t ea = mp.offset[a] + adt_value_bytes(g, a), eb = mp.offset[b] + adt_value_bytes(g, b);
            int m_overlap = mp.offset[a] < eb && mp.offset[b] < ea;
            if (t_overlap && m_overlap) overlaps++;
        }
        CHECK(mp.offset[a] + adt_value_bytes(g, a) <= mp.arena_bytes, "%s: value past the arena", what);
    }
    CHECK(live > 10, "%s: only %d planned values", what, live);
    CHECK(overlaps == 0, "%s: %d pairs of simultaneously live buffers overlap", what, overlaps);
    CHECK(mp.arena_bytes < mp.noreuse_bytes, "%s: peak %lld not below the no-reuse sum %lld", what,
          (long long)mp.arena_bytes, (long long)mp.noreuse_bytes);
    printf("memplan %s: peak %.2f MB, no-reuse %.2f MB (%.0f%%)\n", what, mp.arena_bytes / 1e6, mp.noreuse_bytes / 1e6,
           100.0 * (double)mp.arena_bytes / (double)mp.noreuse_bytes);
    adt_memplan_free(&mp);
}

static void test_memplan(void) {
    adt_graph *g = adt_graph_create();
    adt_gpt_cfg c = {.vocab_size = 65, .n_ctx = 32, .n_layer = 3, .n_embd = 48, .n_head = 4};
    adt_model_io io;
    adt_model_gpt(g, &c, 4, &io);
    adt_graph_backward(g, io.loss);
    adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.1f);
    adt_graph_optimizer(g, &oc);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    check_plan(g, "gpt");
    adt_graph_free(g);
    g = adt_graph_create();
    adt_mlp_cfg m = {.n_sizes = 4, .sizes = {784, 256, 256, 10}};
    adt_model_mlp(g, &m, 32, &io);
    adt_graph_backward(g, io.loss);
    oc = adt_optim_sgd(0.9f, 0);
    adt_graph_optimizer(g, &oc);
    check_plan(g, "mlp");
    adt_graph_free(g);
}

/* ---- errors --------------------------------------------------------------------------------- */

static void test_shape_errors(void) {
    adt_graph *g = adt_graph_create();
    int a = adt_param(g, "a", adt_shape_2d(3, 4), (adt_init){0});
    int b = adt_param(g, "b", adt_shape_2d(5, 6), (adt_init){0});
    int c = adt_matmul(g, a, b, 0, 0, 0);
    CHECK(c < 0 && adt_graph_error(g) == ADT_ERR_SHAPE, "mismatched matmul accepted");
    const char *msg = adt_graph_error_message(g);
    CHECK(strstr(msg, "input 1") && strstr(msg, "'b'") && strstr(msg, "[5,6]") && strstr(msg, "4"),
          "message does not name the input, its shape and the expected size: %s", msg);
    /* sticky: later calls fail at once and keep the first message */
    CHECK(adt_relu(g, a) < 0, "builder after an error returned a value");
    CHECK(strstr(adt_graph_error_message(g), "[5,6]") != NULL, "first error was overwritten");
    adt_graph_free(g);
    g = adt_graph_create();
    a = adt_param(g, "x", adt_shape_2d(3, 4), (adt_init){0});
    CHECK(adt_param(g, "x", adt_shape_1d(2), (adt_init){0}) < 0, "duplicate name accepted");
    CHECK(strstr(adt_graph_error_message(g), "already used") != NULL, "%s", adt_graph_error_message(g));
    adt_graph_free(g);
    g = adt_graph_create();
    a = adt_param(g, "q", adt_shape_4d(2, 3, 3, 30), (adt_init){0});
    CHECK(adt_attention(g, a, 4) < 0, "heads not dividing the width accepted");
    CHECK(strstr(adt_graph_error_message(g), "heads") != NULL, "%s", adt_graph_error_message(g));
    adt_graph_free(g);
    /* q | k | v must be an axis of its own */
    g = adt_graph_create();
    a = adt_param(g, "q", adt_shape_3d(2, 3, 96), (adt_init){0});
    CHECK(adt_attention(g, a, 4) < 0 && strstr(adt_graph_error_message(g), "[B,T,3,C]"), "qkv [B,T,3C]: %s",
          adt_graph_error_message(g));
    adt_graph_free(g);
    /* an attention node whose head size does not multiply out (a block that cuts a head) */
    g = adt_graph_create();
    a = adt_param(g, "q", adt_shape_4d(2, 3, 3, 12), (adt_init){0});
    CHECK(adt_graph_add_node(g, ADT_OP_ATTENTION, &a, 1, &(adt_attrs){.i = {1, 8}}) < 0 &&
              strstr(adt_graph_error_message(g), "whole heads"), "12 columns as 1 head of 8: %s",
          adt_graph_error_message(g));
    adt_graph_free(g);
    /* grouped matmul: contraction axes that do not match, and more column axes than the rank */
    g = adt_graph_create();
    a = adt_param(g, "x", adt_shape_2d(5, 8), (adt_init){0});
    b = adt_param(g, "w", adt_shape_3d(8, 3, 8), (adt_init){0});
    CHECK(adt_matmul_grouped(g, a, b, 0, 0, 1, 3) < 0 && strstr(adt_graph_error_message(g), "rank >= 4"), "%s",
          adt_graph_error_message(g));
    adt_graph_free(g);
    g = adt_graph_create();
    a = adt_param(g, "x", adt_shape_2d(5, 8), (adt_init){0});
    b = adt_param(g, "w", adt_shape_3d(8, 3, 8), (adt_init){0});
    CHECK(adt_matmul_grouped(g, a, b, 0, 1, 1, 2) < 0 && strstr(adt_graph_error_message(g), "inner dimension of 8"),
          "%s", adt_graph_error_message(g));
    adt_graph_free(g);
    /* a bias whose shape is not the last axes of x */
    g = adt_graph_create();
    a = adt_param(g, "x", adt_shape_4d(2, 3, 3, 8), (adt_init){0});
    b = adt_param(g, "b", adt_shape_2d(8, 3), (adt_init){0});
    CHECK(adt_bias_add(g, a, b) < 0 && strstr(adt_graph_error_message(g), "[3,8] (the last dims of input 0)"), "%s",
          adt_graph_error_message(g));
    adt_graph_free(g);
}

/* The grouped forms against plain loops in double: y = X[B,T,C] @ W[C,G,N] + b[G,N], its data
 * gradient form dY[B,T,G,N] @ W^T and weight gradient form X^T dY. Finite differences check the
 * gradients relative to the forward; this pins the forward itself (every index of the groups). */
static void test_grouped_forward(void) {
    int64_t B = irand(1, 3), T = irand(1, 4), C = irand(1, 5), G = irand(1, 4), N = irand(1, 5);
    adt_graph *g = adt_graph_create();
    int x = adt_input(g, "x", ADT_F32, adt_shape_3d(B, T, C));
    int w = adt_input(g, "w", ADT_F32, adt_shape_3d(C, G, N));
    int b = adt_input(g, "b", ADT_F32, adt_shape_2d(G, N));
    int dy = adt_input(g, "dy", ADT_F32, adt_shape_4d(B, T, G, N));
    int y = adt_bias_add(g, adt_matmul_grouped(g, x, w, 0, 0, 1, 2), b);
    int dx = adt_matmul_grouped(g, dy, w, 0, 1, 2, 2);
    int dw = adt_matmul_grouped(g, x, dy, 1, 0, 1, 2);
    int outs[3] = {y, dx, dw};
    for (int k = 0; k < 3; k++) adt_graph_mark_output(g, outs[k]);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    adt_exec *ex = NULL;
    adt_exec_opts o = {.threads = 1};
    if (adt_graph_error(g) || adt_exec_create(&ex, g, &o)) {
        CHECK(0, "executor: %s", adt_error_message());
        adt_graph_free(g);
        return;
    }
    int ins[4] = {x, w, b, dy};
    for (int k = 0; k < 4; k++) fill_default("", adt_exec_data(ex, ins[k]), adt_value_numel(g, ins[k]));
    adt_exec_run_forward_mode(ex, 0);
    const float *X = adt_exec_data(ex, x), *W = adt_exec_data(ex, w), *Bi = adt_exec_data(ex, b), *DY = adt_exec_data(ex, dy);
    const float *Y = adt_exec_data(ex, y), *DX = adt_exec_data(ex, dx), *DW = adt_exec_data(ex, dw);
    double worst = 0;
    for (int64_t r = 0; r < B * T; r++) /* y[r,j,n] = sum_c x[r,c] w[c,j,n] + b[j,n]; dx[r,c] = sum_jn dy[r,j,n] w[c,j,n] */
        for (int64_t c = 0; c < C; c++) {
            double sx = 0;
            for (int64_t jn = 0; jn < G * N; jn++) sx += (double)DY[r * G * N + jn] * W[c * G * N + jn];
            worst = fmax(worst, fabs(sx - DX[r * C + c]));
        }
    for (int64_t r = 0; r < B * T; r++)
        for (int64_t jn = 0; jn < G * N; jn++) {
            double sy = Bi[jn];
            for (int64_t c = 0; c < C; c++) sy += (double)X[r * C + c] * W[c * G * N + jn];
            worst = fmax(worst, fabs(sy - Y[r * G * N + jn]));
        }
    for (int64_t c = 0; c < C; c++) /* dw[c,j,n] = sum_r x[r,c] dy[r,j,n] */
        for (int64_t jn = 0; jn < G * N; jn++) {
            double sw = 0;
            for (int64_t r = 0; r < B * T; r++) sw += (double)X[r * C + c] * DY[r * G * N + jn];
            worst = fmax(worst, fabs(sw - DW[c * G * N + jn]));
        }
    CHECK(worst < 1e-5, "grouped products differ from the loops by %.3g (seed %llu)", worst, (unsigned long long)g_seed);
    adt_exec_free(ex);
    adt_graph_free(g);
}

/* File shapes: set on a parameter, inherited by its optimizer state, read back by
 * adt_value_file_shape; refused with the element counts or on a value that is not a parameter. */
static void test_file_shape(void) {
    adt_graph *g = adt_graph_create();
    int x = adt_input(g, "x", ADT_F32, adt_shape_3d(2, 4, 5));
    int w = adt_param(g, "w", adt_shape_3d(5, 3, 5), (adt_init){ADT_INIT_NORMAL, 0.1f, 0});
    int b = adt_param(g, "b", adt_shape_2d(3, 5), (adt_init){0});
    CHECK(adt_graph_set_file_shape(g, w, adt_shape_2d(5, 15)) == w, "%s", adt_graph_error_message(g));
    CHECK(adt_graph_set_file_shape(g, b, adt_shape_1d(15)) == b, "%s", adt_graph_error_message(g));
    int y = adt_bias_add(g, adt_matmul_grouped(g, x, w, 0, 0, 1, 2), b);
    adt_graph_backward(g, adt_reduce_sum(g, y, 0, 3));
    adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.99f, 1e-8f, 0.1f);
    oc.decay_1d = 0;
    adt_graph_optimizer(g, &oc);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    adt_shape fw = adt_value_file_shape(g, w), fx = adt_value_file_shape(g, x);
    CHECK(fw.ndim == 2 && fw.dim[0] == 5 && fw.dim[1] == 15, "file shape of w");
    CHECK(adt_shape_equal(&fx, &g->values[x].shape), "a value without a file shape: its shape");
    int states = 0;
    for (int v = 0; v < g->n_values; v++) {
        if (g->values[v].role != ADT_ROLE_OPT_STATE) continue;
        adt_shape fs = adt_value_file_shape(g, v), fp = adt_value_file_shape(g, g->values[v].param);
        CHECK(adt_shape_equal(&fs, &fp), "state '%s' lost its parameter's file shape", g->values[v].name);
        states++;
    }
    CHECK(states == 4, "%d optimizer states", states);
    /* weight decay follows the PyTorch rank: the [3,5] bias is 1-D there, so it is not decayed */
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (n->op != ADT_OP_ADAMW) continue;
        float want = n->in[0] == w ? 0.1f : 0.0f;
        CHECK(n->a.f[3] == want, "weight decay of '%s' is %g, expected %g", g->values[n->in[0]].name, (double)n->a.f[3],
              (double)want);
    }
    adt_graph_free(g);
    g = adt_graph_create();
    w = adt_param(g, "w", adt_shape_3d(5, 3, 5), (adt_init){0});
    CHECK(adt_graph_set_file_shape(g, w, adt_shape_2d(5, 16)) < 0 &&
              strstr(adt_graph_error_message(g), "expected a shape of the 75 elements of [5,3,5]"), "%s",
          adt_graph_error_message(g));
    adt_graph_free(g);
    g = adt_graph_create();
    x = adt_input(g, "x", ADT_F32, adt_shape_2d(2, 4));
    CHECK(adt_graph_set_file_shape(g, x, adt_shape_1d(8)) < 0 && strstr(adt_graph_error_message(g), "not a parameter"),
          "%s", adt_graph_error_message(g));
    adt_graph_free(g);
}

/* Every op's signatures parse, fit the node's arity and start with all-B, over the training
 * graphs of a GPT, a VGG-style CNN and a DLRM (between them every op kind but dropout's). */
static void check_sbp_signatures(adt_graph *g, adt_model_io io) {
    adt_graph_backward(g, io.loss);
    adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.1f);
    adt_graph_optimizer(g, &oc);
    CHECK(!adt_graph_error(g), "%s", adt_graph_error_message(g));
    adt_sbp_sig sigs[64];
    int total = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        int k = adt_node_sbp_signatures(g, n, sigs, 64);
        CHECK(k >= 1, "node %s has no signature", n->name);
        for (int j = 0; j < n->n_in; j++) CHECK(sigs[0].in[j].kind == ADT_SBP_B, "first signature is not all-B");
        for (int s = 1; s < k; s++) {
            for (int j = 0; j < n->n_in; j++)
                if (sigs[s].in[j].kind == ADT_SBP_S)
                    CHECK(sigs[s].in[j].axis >= 0 && sigs[s].in[j].axis < g->values[n->in[j]].shape.ndim,
                          "node %s signature %d: split axis out of range", n->name, s);
            for (int j = 0; j < n->n_out; j++)
                if (sigs[s].out[j].kind == ADT_SBP_S)
                    CHECK(sigs[s].out[j].axis >= 0 && sigs[s].out[j].axis < g->values[n->out[j]].shape.ndim,
                          "node %s signature %d: output split axis out of range", n->name, s);
        }
        total += k;
    }
    CHECK(total > 2 * g->n_nodes, "suspiciously few signatures: %d for %d nodes", total, g->n_nodes);
    adt_graph_free(g);
}

static void test_sbp_signatures(void) {
    adt_model_io io;
    adt_graph *g = adt_graph_create();
    adt_gpt_cfg gc = {.vocab_size = 17, .n_ctx = 8, .n_layer = 1, .n_embd = 16, .n_head = 2};
    adt_model_gpt(g, &gc, 2, &io);
    check_sbp_signatures(g, io);
    g = adt_graph_create();
    adt_vgg_cfg vc = {.in_channels = 2, .height = 8, .width = 6, .n_blocks = 2, .n_convs = {1, 2},
                      .channels = {{3}, {4, 5}}, .n_fc = 1, .fc = {7}, .classes = 3};
    adt_model_vgg(g, &vc, 2, &io);
    check_sbp_signatures(g, io);
    g = adt_graph_create();
    adt_dlrm_cfg dc = {.n_dense = 3, .n_tables = 3, .table_rows = {5, 3, 7}, .emb_dim = 4, .n_bottom = 2,
                       .bottom = {8, 4}, .n_top = 2, .top = {6, 1}};
    adt_model_dlrm(g, &dc, 4, &io);
    check_sbp_signatures(g, io);
}

int main(void) {
    const char *s = getenv("ADT_TEST_SEED");
    g_seed = s ? strtoull(s, NULL, 10) : (uint64_t)time(NULL);
    printf("seed %llu\n", (unsigned long long)g_seed);
    RUN(test_grad_matmul);
    RUN(test_grouped_forward);
    RUN(test_file_shape);
    RUN(test_grad_elementwise);
    RUN(test_grad_reduce_expand);
    RUN(test_grad_activations);
    RUN(test_grad_dropout);
    RUN(test_grad_attention);
    RUN(test_grad_embedding_losses);
    RUN(test_grad_sliced_embedding);
    RUN(test_slice_i32);
    RUN(test_grad_conv_pool);
    RUN(test_grad_shape_ops);
    RUN(test_every_op_covered);
    RUN(test_bias_fold);
    RUN(test_exec_bind);
    RUN(test_optimizers);
    RUN(test_update_schedule);
    RUN(test_momentum_fold);
    RUN(test_memplan);
    RUN(test_shape_errors);
    RUN(test_sbp_signatures);
    return check_finish();
}
