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
 *    grouped matmul, bias_add, attention, add, gelu) with L = sum(y * dout) reproduces y, dL/dx
 *    and the gradient of every block parameter. It pins the op-level conventions (Conv1D weight
 *    layout, c_attn held as [C,3,C] over PyTorch's [C,3C], q|k|v split and head order, 1/sqrt(D)
 *    scale, causal mask, tanh GELU, biased LayerNorm variance) independently of the model builder.
 *
 * Tolerances (relative to each tensor's largest magnitude, see torch_fixture.h):
 *  - One step and the block: 1e-4.
 *  - Trajectories: losses 1e-6, final weights 1e-5. 1e-4 would be too coarse to test AdamW: over
 *    10 updates at lr 1e-3 the weight decay moves the weights by 1 - (1 - 1e-5)^10 ~ 1e-4 of
 *    their size and the losses by ~7e-6, so AdamW without decay, or without decay on the 1-D
 *    parameters (3e-5, 3e-6), or SGD at lr 0.1001 (4.5e-5 on the last loss) would all pass.
 *    Float32 drift is far below the tighter limits: PyTorch itself, run in float32 from the same
 *    start, stays within 1.3e-7 of these float64 losses and within 2.5e-6 of the final weights
 *    (the larger figure is Adam's m / sqrt(v) amplifying rounding in near-zero gradients).
 */
#include "torch_fixture.h"

#define FIX_TINY "tests/fixtures/gpt_tiny.safetensors"
#define FIX_BLOCK "tests/fixtures/gpt_block.safetensors"
#define TOL 1e-4
#define TRAJ_LOSS_TOL 1e-6
#define TRAJ_WEIGHT_TOL 1e-5

/* ---- tiny GPT ---------------------------------------------------------------------------- */

static const feed_map gpt_feeds[] = {{"ids", "input.ids"}, {"targets", "input.targets"}};

static int gpt_build(adt_graph *g, const adt_st_file *f, adt_model_io *io, void *ctx) {
    (void)ctx;
    adt_gpt_cfg c = {0};
    c.vocab_size = meta_int(f, "vocab_size");
    c.n_ctx = meta_int(f, "n_ctx");
    c.n_layer = meta_int(f, "n_layer");
    c.n_embd = meta_int(f, "n_embd");
    c.n_head = meta_int(f, "n_head");
    c.dropout = 0.0f; /* the reference has no dropout */
    int B = meta_int(f, "batch");
    if (c.vocab_size < 0 || c.n_ctx < 0 || c.n_layer < 0 || c.n_embd < 0 || c.n_head < 0 || B < 0) return -1;
    return adt_model_gpt(g, &c, B, io);
}

static const fixture_model gpt_tiny = {"gpt_tiny", FIX_TINY, gpt_build, NULL, gpt_feeds, 2};

/* One step: logits, loss and the gradient of every parameter. */
static void test_gpt_tiny_step(void) { fixture_check_step(&gpt_tiny, TOL); }

static void test_gpt_tiny_sgd(void) {
    adt_optim_cfg opt = adt_optim_sgd(0.0f, 0.0f);
    fixture_check_trajectory(&gpt_tiny, "sgd", &opt, 0.1f, "traj.sgd.loss", TRAJ_LOSS_TOL, NULL, 0);
}

/* final weights: wte.weight and h.0.attn.c_attn.weight */
static void test_gpt_tiny_adamw(void) {
    adt_optim_cfg opt = adt_optim_adamw(0.9f, 0.999f, 1e-8f, 0.01f);
    opt.decay_1d = 1; /* PyTorch's single parameter group decays biases and LayerNorms too */
    fixture_check_trajectory(&gpt_tiny, "adamw", &opt, 1e-3f, "traj.adamw.loss", TRAJ_LOSS_TOL, "traj.adamw.final.",
                             TRAJ_WEIGHT_TOL);
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

/* x [B,T,C] @ W [C,3,C] + b [3,C] -> qkv [B,T,3,C]: c_attn with q | k | v on an axis of their
 * own, loaded from the fixture's [C,3C] and [3C] through the file shapes */
static int blk_c_attn(adt_graph *g, int x, int C) {
    int w = blk_param(g, "attn.c_attn.weight", adt_shape_3d(C, 3, C));
    int b = blk_param(g, "attn.c_attn.bias", adt_shape_2d(3, C));
    adt_graph_set_file_shape(g, w, adt_shape_2d(C, 3 * C));
    adt_graph_set_file_shape(g, b, adt_shape_1d(3 * C));
    return adt_bias_add(g, adt_matmul_grouped(g, x, w, 0, 0, 1, 2), b);
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
    h = blk_c_attn(g, h, C);
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
        int nparams = compare_gradients(&wg, ex, g, f, TOL);
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
