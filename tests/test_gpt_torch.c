/*
 * test_gpt_torch.c - the GPT-2 model and a GPT-2 block agree with PyTorch.
 *
 * The reference values come from the safetensors files in tests/fixtures, written by
 * scripts/gen_fixtures.py (`make fixtures`) from a float64 PyTorch computation on
 * float32-representable parameters and inputs, so the expected numbers carry one rounding to
 * float32 and nothing else.
 *
 *  - gpt_tiny: adt_model_gpt with the fixture's configuration and Hugging Face parameter names
 *    loads every fixture parameter by name (a parameter missing on either side fails the test),
 *    and one training step reproduces the logits, the mean loss and the gradient of every
 *    parameter. Then 10 steps of SGD (lr 0.1) and of AdamW (lr 1e-3, betas 0.9/0.999, eps 1e-8,
 *    weight decay 0.01 on every parameter, PyTorch's single-group default) reproduce the loss
 *    before each update, and AdamW the final wte.weight and h.0.attn.c_attn.weight.
 *  - gpt_block: one pre-LN block assembled from the public builder ops (layernorm, matmul,
 *    bias_add, attention, add, gelu) with L = sum(y * dout) reproduces y, dL/dx and the gradient
 *    of every block parameter. It pins the op-level conventions (Conv1D weight layout, q|k|v
 *    split and head order, 1/sqrt(D) scale, causal mask, tanh GELU, biased LayerNorm variance)
 *    independently of the model builder.
 *
 * Tolerances are relative, per tensor: max|a - b| / max|b|, the error relative to the tensor's
 * largest magnitude. A per-element relative error would be dominated by elements that are near
 * zero by cancellation, whose absolute float32 error is set by the tensor's scale. The worst
 * tensor of each part is printed, so a drift towards a limit shows before it fails.
 *  - One step and the block: 1e-4.
 *  - Trajectories: losses 1e-6, final weights 1e-5. 1e-4 would be too coarse to test AdamW: over
 *    10 updates at lr 1e-3 the weight decay moves the weights by 1 - (1 - 1e-5)^10 ~ 1e-4 of
 *    their size and the losses by ~7e-6, so AdamW without decay, or without decay on the 1-D
 *    parameters (3e-5, 3e-6), or SGD at lr 0.1001 (4.5e-5 on the last loss) would all pass.
 *    Float32 drift is far below the tighter limits: PyTorch itself, run in float32 from the same
 *    start, stays within 1.3e-7 of these float64 losses and within 2.5e-6 of the final weights
 *    (the larger figure is Adam's m / sqrt(v) amplifying rounding in near-zero gradients).
 *
 * A missing or unreadable fixture is a failure, not a skip: the comparison is the point.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/adtrain.h"
#include "adtrain/safetensors.h"
#include "check.h"

#define FIX_TINY "tests/fixtures/gpt_tiny.safetensors"
#define FIX_BLOCK "tests/fixtures/gpt_block.safetensors"
#define TOL 1e-4
#define TRAJ_LOSS_TOL 1e-6
#define TRAJ_WEIGHT_TOL 1e-5
#define TRAJ_STEPS 10

/* ---- fixture access ---------------------------------------------------------------------- */

static adt_st_file *open_fixture(const char *path) {
    adt_st_file *f = NULL;
    int rc = adt_st_open(&f, path);
    CHECK(rc == ADT_OK, "cannot read the PyTorch reference fixture: %s\n"
                        "    regenerate it from the repository root with `make fixtures`",
          adt_error_message());
    return rc == ADT_OK ? f : NULL;
}

/* An integer from the fixture's __metadata__; -1 (and a failure) if absent or malformed, so the
 * model is always built with the configuration the reference was computed with. */
static int meta_int(const adt_st_file *f, const char *key) {
    const char *s = adt_st_metadata(f, key);
    char *end = NULL;
    long v = s ? strtol(s, &end, 10) : -1;
    int ok = s && end != s && *end == '\0' && v > 0 && v < 1000000;
    CHECK(ok, "%s: __metadata__ entry '%s' is %s%s%s, expected a positive integer", adt_st_name(f), key,
          s ? "'" : "", s ? s : "missing", s ? "'" : "");
    return ok ? (int)v : -1;
}

static int value_dims(const adt_graph *g, int v, int64_t *dims) {
    const adt_value *val = &g->values[v];
    for (int d = 0; d < val->shape.ndim; d++) dims[d] = val->shape.dim[d];
    return val->shape.ndim;
}

/* A fixture tensor as a fresh float array of the given shape; NULL (and a failure) if absent or
 * shaped differently. */
static float *read_expect(const adt_st_file *f, const char *name, int ndim, const int64_t *dims, int64_t n) {
    float *p = malloc((size_t)(n > 0 ? n : 1) * sizeof *p);
    int rc = adt_st_read_f32(f, name, p, ndim, dims);
    CHECK(rc == ADT_OK, "reference tensor: %s", adt_error_message());
    if (rc != ADT_OK) {
        free(p);
        return NULL;
    }
    return p;
}

/* A fed graph value and the fixture tensor that holds its contents. */
typedef struct feed_map {
    const char *value;   /* name in the graph   */
    const char *fixture; /* name in the fixture */
} feed_map;

/* Fixture names that hold results rather than model state. */
static int is_reference_name(const char *name) {
    return !strncmp(name, "expect.", 7) || !strncmp(name, "grad.", 5) || !strncmp(name, "traj.", 5);
}

/* Writes every parameter of g and every mapped fed value from the fixture into the executor,
 * and checks the correspondence both ways: each model parameter must be in the fixture with the
 * model's shape, and each fixture tensor that is not a reference result must be a model
 * parameter or a mapped input. A name mismatch would otherwise leave a weight at whatever the
 * state block held and the comparison would fail far from the cause. Returns 0 if all loaded. */
static int load_fixture(adt_exec *ex, const adt_graph *g, const adt_st_file *f, const feed_map *feeds, int nfeeds) {
    int bad = 0, nparams = 0;
    int64_t dims[ADT_MAX_DIMS];
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM) continue;
        nparams++;
        int nd = value_dims(g, v, dims);
        int rc = adt_st_read_f32(f, val->name, adt_exec_data(ex, v), nd, dims);
        CHECK(rc == ADT_OK, "model parameter '%s' could not be loaded: %s", val->name, adt_error_message());
        bad |= rc != ADT_OK;
    }
    CHECK(nparams > 0, "the graph has no parameters");
    for (int i = 0; i < nfeeds; i++) {
        int v = adt_graph_find_value(g, feeds[i].value);
        CHECK(v >= 0, "the graph has no value '%s'", feeds[i].value);
        if (v < 0) {
            bad = 1;
            continue;
        }
        int nd = value_dims(g, v, dims);
        int rc = g->values[v].dtype == ADT_I32
                     ? adt_st_read_i32(f, feeds[i].fixture, adt_exec_data(ex, v), nd, dims)
                     : adt_st_read_f32(f, feeds[i].fixture, adt_exec_data(ex, v), nd, dims);
        CHECK(rc == ADT_OK, "input '%s' could not be loaded: %s", feeds[i].value, adt_error_message());
        bad |= rc != ADT_OK;
    }
    for (int i = 0; i < adt_st_count(f); i++) {
        const char *name = adt_st_get(f, i)->name;
        if (is_reference_name(name)) continue;
        int known = 0;
        for (int k = 0; k < nfeeds; k++) known |= !strcmp(name, feeds[k].fixture);
        int v = adt_graph_find_value(g, name);
        known |= v >= 0 && g->values[v].role == ADT_ROLE_PARAM;
        CHECK(known, "%s holds tensor '%s', which is not a parameter of the model", adt_st_name(f), name);
        bad |= !known;
    }
    return bad;
}

/* ---- comparison -------------------------------------------------------------------------- */

/* The worst tensor of a part, for the summary line. */
typedef struct worst {
    double err;
    char what[ADT_NAME_LEN + 32];
} worst;

/* max|a - b| / max|b| over the tensor (a NaN anywhere counts as infinite); *at gets the index of
 * the largest difference. */
static double tensor_rel_err(const float *a, const float *b, int64_t n, int64_t *at) {
    double dmax = 0, bmax = 0;
    *at = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d != d) {
            *at = i;
            return INFINITY;
        }
        if (d > dmax) {
            dmax = d;
            *at = i;
        }
        bmax = fmax(bmax, fabs((double)b[i]));
    }
    return dmax / fmax(bmax, 1e-30);
}

static void compare(worst *w, const char *what, const float *got, const float *want, int64_t n, double tol) {
    int64_t at;
    double err = tensor_rel_err(got, want, n, &at);
    if (err > w->err || w->what[0] == '\0') {
        w->err = err;
        snprintf(w->what, sizeof w->what, "%s", what);
    }
    CHECK(err <= tol, "%s: max|adtrain - torch| / max|torch| = %.3e > %.0e (element %lld: adtrain %.9g, torch %.9g)",
          what, err, tol, (long long)at, got[at], want[at]);
}

/* Compares value v (read from the executor) with fixture tensor `ref`. */
static void compare_value(worst *w, adt_exec *ex, const adt_graph *g, int v, const adt_st_file *f, const char *ref,
                          double tol) {
    int64_t dims[ADT_MAX_DIMS];
    int nd = value_dims(g, v, dims);
    int64_t n = adt_value_numel(g, v);
    /* the loss is [1] in the graph and a 0-d tensor in PyTorch */
    if (n == 1 && adt_st_find(f, ref) && adt_st_find(f, ref)->ndim == 0) nd = 0;
    float *want = read_expect(f, ref, nd, dims, n);
    if (!want) return;
    compare(w, ref, adt_exec_data(ex, v), want, n, tol);
    free(want);
}

/* Compares the gradient of every parameter with "grad.<name>", and checks that every reference
 * gradient belongs to a parameter of the graph. Returns the number of parameters. */
static int compare_gradients(worst *w, adt_exec *ex, const adt_graph *g, const adt_st_file *f) {
    int nparams = 0;
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM) continue;
        nparams++;
        CHECK(val->grad >= 0, "parameter '%s' got no gradient", val->name);
        if (val->grad < 0) continue;
        char ref[ADT_NAME_LEN + 8];
        snprintf(ref, sizeof ref, "grad.%s", val->name);
        compare_value(w, ex, g, val->grad, f, ref, TOL);
    }
    for (int i = 0; i < adt_st_count(f); i++) {
        const char *name = adt_st_get(f, i)->name;
        if (strncmp(name, "grad.", 5)) continue;
        int v = adt_graph_find_value(g, name + 5);
        CHECK(v >= 0 && g->values[v].role == ADT_ROLE_PARAM,
              "%s holds gradient '%s' of a tensor that is not a parameter of the graph", adt_st_name(f), name);
    }
    return nparams;
}

/* ---- tiny GPT ---------------------------------------------------------------------------- */

static const feed_map gpt_feeds[] = {{"ids", "input.ids"}, {"targets", "input.targets"}};

static int gpt_cfg_from_fixture(const adt_st_file *f, adt_gpt_cfg *c, int *batch) {
    memset(c, 0, sizeof *c);
    c->vocab_size = meta_int(f, "vocab_size");
    c->n_ctx = meta_int(f, "n_ctx");
    c->n_layer = meta_int(f, "n_layer");
    c->n_embd = meta_int(f, "n_embd");
    c->n_head = meta_int(f, "n_head");
    c->dropout = 0.0f; /* the reference has no dropout */
    *batch = meta_int(f, "batch");
    return c->vocab_size < 0 || c->n_ctx < 0 || c->n_layer < 0 || c->n_embd < 0 || c->n_head < 0 || *batch < 0;
}

/* Builds GPT-2 with autodiff (and an optimizer if `opt`), the executor, and loads the fixture.
 * Logits, loss and every gradient are marked as outputs first: the arena would otherwise reuse
 * their buffers before the step ends. Returns NULL (after reporting) on any failure. */
static adt_exec *gpt_setup(const adt_st_file *f, const adt_optim_cfg *opt, adt_graph **gout, adt_model_io *io) {
    *gout = NULL;
    adt_gpt_cfg c;
    int B;
    if (gpt_cfg_from_fixture(f, &c, &B)) return NULL;
    adt_graph *g = adt_graph_create();
    adt_model_gpt(g, &c, B, io);
    if (!adt_graph_error(g)) adt_graph_backward(g, io->loss);
    if (!adt_graph_error(g)) {
        adt_graph_mark_output(g, io->logits);
        adt_graph_mark_output(g, io->loss);
        for (int v = 0; v < g->n_values; v++)
            if (g->values[v].role == ADT_ROLE_PARAM && g->values[v].grad >= 0) adt_graph_mark_output(g, g->values[v].grad);
    }
    if (opt && !adt_graph_error(g)) adt_graph_optimizer(g, opt);
    CHECK(!adt_graph_error(g), "building GPT-2: %s", adt_graph_error_message(g));
    adt_exec *ex = NULL;
    if (!adt_graph_error(g)) {
        adt_exec_opts eo = {.threads = 1};
        int rc = adt_exec_create(&ex, g, &eo);
        CHECK(rc == ADT_OK, "executor: %s", adt_error_message());
    }
    if (ex && load_fixture(ex, g, f, gpt_feeds, 2)) {
        adt_exec_free(ex);
        ex = NULL;
    }
    if (!ex) {
        adt_graph_free(g);
        return NULL;
    }
    *gout = g;
    return ex;
}

/* One step: logits, loss and the gradient of every parameter. */
static void test_gpt_tiny_step(void) {
    adt_st_file *f = open_fixture(FIX_TINY);
    if (!f) return;
    adt_graph *g;
    adt_model_io io;
    adt_exec *ex = gpt_setup(f, NULL, &g, &io);
    if (!ex) {
        adt_st_close(f);
        return;
    }
    adt_exec_run(ex); /* no optimizer in this graph: forward and backward only */

    worst w = {0, ""};
    compare_value(&w, ex, g, io.logits, f, "expect.logits", TOL);
    compare_value(&w, ex, g, io.loss, f, "expect.loss", TOL);
    worst wg = {0, ""};
    int nparams = compare_gradients(&wg, ex, g, f);
    printf("gpt_tiny step: logits/loss worst %.2e (%s); gradients of %d parameters worst %.2e (%s)\n", w.err,
           w.what, nparams, wg.err, wg.what);
    adt_exec_free(ex);
    adt_graph_free(g);
    adt_st_close(f);
}

/* TRAJ_STEPS steps with optimizer `opt` at learning rate lr; compares the loss before each
 * update with `ref_loss` and, after the last, the parameters named in `finals` with
 * "<final_prefix><name>". */
static void gpt_trajectory(const char *label, const adt_optim_cfg *opt, float lr, const char *ref_loss,
                           const char *final_prefix, const char *const *finals, int nfinals) {
    adt_st_file *f = open_fixture(FIX_TINY);
    if (!f) return;
    adt_graph *g;
    adt_model_io io;
    adt_exec *ex = gpt_setup(f, opt, &g, &io);
    if (!ex) {
        adt_st_close(f);
        return;
    }
    float want[TRAJ_STEPS], got[TRAJ_STEPS];
    int64_t dims[1] = {TRAJ_STEPS};
    int rc = adt_st_read_f32(f, ref_loss, want, 1, dims);
    CHECK(rc == ADT_OK, "reference trajectory: %s", adt_error_message());
    for (int k = 0; k < TRAJ_STEPS; k++) {
        adt_exec_set_lr_step(ex, lr, k + 1);
        adt_exec_run(ex);
        got[k] = *(const float *)adt_exec_data(ex, io.loss); /* computed before this step's update */
    }
    double worst_loss = 0;
    int worst_k = 0;
    for (int k = 0; rc == ADT_OK && k < TRAJ_STEPS; k++) {
        double err = fabs((double)got[k] - (double)want[k]) / fabs((double)want[k]);
        if (err != err) err = INFINITY; /* a NaN loss is the worst possible and must fail */
        if (err > worst_loss) {
            worst_loss = err;
            worst_k = k;
        }
        CHECK(err <= TRAJ_LOSS_TOL, "%s: loss before update %d: adtrain %.9g, torch %.9g, rel err %.3e > %.0e", label,
              k + 1, got[k], want[k], err, TRAJ_LOSS_TOL);
    }
    CHECK(rc != ADT_OK || got[TRAJ_STEPS - 1] < got[0], "%s: the loss did not decrease (%.6f -> %.6f)", label, got[0],
          got[TRAJ_STEPS - 1]);
    worst wf = {0, ""};
    for (int i = 0; i < nfinals; i++) {
        int v = adt_graph_find_value(g, finals[i]);
        CHECK(v >= 0, "the model has no parameter '%s'", finals[i]);
        if (v < 0) continue;
        char ref[ADT_NAME_LEN + 32];
        snprintf(ref, sizeof ref, "%s%s", final_prefix, finals[i]);
        compare_value(&wf, ex, g, v, f, ref, TRAJ_WEIGHT_TOL); /* persistent: updated in place */
    }
    printf("gpt_tiny %s: %d losses %.6f -> %.6f, worst rel err %.2e (update %d)", label, TRAJ_STEPS, got[0],
           got[TRAJ_STEPS - 1], worst_loss, worst_k + 1);
    if (nfinals) printf("; final weights worst %.2e (%s)", wf.err, wf.what);
    printf("\n");
    adt_exec_free(ex);
    adt_graph_free(g);
    adt_st_close(f);
}

static void test_gpt_tiny_sgd(void) {
    adt_optim_cfg opt = adt_optim_sgd(0.0f, 0.0f);
    gpt_trajectory("sgd", &opt, 0.1f, "traj.sgd.loss", NULL, NULL, 0);
}

static void test_gpt_tiny_adamw(void) {
    adt_optim_cfg opt = adt_optim_adamw(0.9f, 0.999f, 1e-8f, 0.01f);
    opt.decay_1d = 1; /* PyTorch's single parameter group decays biases and LayerNorms too */
    static const char *const finals[] = {"wte.weight", "h.0.attn.c_attn.weight"};
    gpt_trajectory("adamw", &opt, 1e-3f, "traj.adamw.loss", "traj.adamw.final.", finals, 2);
}

/* ---- one GPT-2 block from builder ops ------------------------------------------------------ */

static int blk_param(adt_graph *g, const char *leaf, adt_shape s) {
    char name[ADT_NAME_LEN];
    snprintf(name, sizeof name, "blk.%s", leaf);
    return adt_param(g, name, s, (adt_init){ADT_INIT_ZEROS, 0, 0}); /* loaded from the fixture */
}

/* x [B,T,in] @ W [in,out] + b [out], Hugging Face Conv1D layout */
static int blk_conv1d(adt_graph *g, int x, const char *w_leaf, const char *b_leaf, int in, int out) {
    int w = blk_param(g, w_leaf, adt_shape_2d(in, out));
    int b = blk_param(g, b_leaf, adt_shape_1d(out));
    return adt_bias_add(g, adt_matmul(g, x, w, 0, 0, 0), b);
}

static int blk_layernorm(adt_graph *g, int x, const char *w_leaf, const char *b_leaf, int C) {
    return adt_layernorm(g, x, blk_param(g, w_leaf, adt_shape_1d(C)), blk_param(g, b_leaf, adt_shape_1d(C)), 1e-5f);
}

static void test_gpt_block(void) {
    adt_st_file *f = open_fixture(FIX_BLOCK);
    if (!f) return;
    int C = meta_int(f, "n_embd"), H = meta_int(f, "n_head"), B = meta_int(f, "batch"), T = meta_int(f, "seq");
    if (C < 0 || H < 0 || B < 0 || T < 0) {
        adt_st_close(f);
        return;
    }
    adt_graph *g = adt_graph_create();
    /* x is a parameter so that autodiff hands back dL/dx like any weight gradient; its name is
     * the fixture's, so it loads and compares like one */
    int x = adt_param(g, "input.x", adt_shape_3d(B, T, C), (adt_init){ADT_INIT_ZEROS, 0, 0});
    int dout = adt_input(g, "input.dout", ADT_F32, adt_shape_3d(B, T, C));
    int h = blk_layernorm(g, x, "ln_1.weight", "ln_1.bias", C);
    h = blk_conv1d(g, h, "attn.c_attn.weight", "attn.c_attn.bias", C, 3 * C);
    h = adt_attention(g, h, H);
    h = blk_conv1d(g, h, "attn.c_proj.weight", "attn.c_proj.bias", C, C);
    int x1 = adt_add(g, x, h);
    h = blk_layernorm(g, x1, "ln_2.weight", "ln_2.bias", C);
    h = blk_conv1d(g, h, "mlp.c_fc.weight", "mlp.c_fc.bias", C, 4 * C);
    h = adt_gelu(g, h);
    h = blk_conv1d(g, h, "mlp.c_proj.weight", "mlp.c_proj.bias", 4 * C, C);
    int y = adt_add(g, x1, h);
    /* L = sum(y * dout): its gradient with respect to y is dout, so backward propagates exactly
     * the cotangent PyTorch's (y * dout).sum().backward() did */
    int L = adt_reduce_sum(g, adt_mul(g, y, dout), 0, 2);
    if (!adt_graph_error(g)) adt_graph_backward(g, L);
    if (!adt_graph_error(g)) {
        adt_graph_mark_output(g, y);
        for (int v = 0; v < g->n_values; v++)
            if (g->values[v].role == ADT_ROLE_PARAM && g->values[v].grad >= 0) adt_graph_mark_output(g, g->values[v].grad);
    }
    CHECK(!adt_graph_error(g), "building the block: %s", adt_graph_error_message(g));
    adt_exec *ex = NULL;
    if (!adt_graph_error(g)) {
        adt_exec_opts eo = {.threads = 1};
        int rc = adt_exec_create(&ex, g, &eo);
        CHECK(rc == ADT_OK, "executor: %s", adt_error_message());
    }
    static const feed_map feeds[] = {{"input.dout", "input.dout"}};
    if (ex && !load_fixture(ex, g, f, feeds, 1)) {
        adt_exec_run(ex);
        worst wy = {0, ""}, wg = {0, ""};
        compare_value(&wy, ex, g, y, f, "expect.y", TOL);
        int nparams = compare_gradients(&wg, ex, g, f);
        printf("gpt_block: y %.2e; dL/dx and %d parameter gradients worst %.2e (%s)\n", wy.err, nparams - 1, wg.err,
               wg.what);
    }
    adt_exec_free(ex);
    adt_graph_free(g);
    adt_st_close(f);
}

int main(void) {
    RUN(test_gpt_tiny_step);
    RUN(test_gpt_tiny_sgd);
    RUN(test_gpt_tiny_adamw);
    RUN(test_gpt_block);
    return check_finish();
}
