/*
 * test_models_torch.c - the VGG-style CNN and DLRM agree with PyTorch.
 *
 * The references are torch.nn modules (scripts/gen_fixtures.py: nn.Conv2d, nn.Linear,
 * nn.Embedding, F.max_pool2d, DLRM's own interaction code) whose state_dict names are adtrain's,
 * run in float64 on float32-representable parameters and inputs (`make fixtures`).
 *
 *  - vgg_tiny: 2x8x6 images (odd widths floor in the pool: 6 -> 3 -> 1), blocks [[3],[4,5]],
 *    fc [7], 3 classes, batch 4.
 *  - dlrm_tiny: 3 dense features, tables of 5/3/7/4 rows, emb_dim 4, bottom [8,4], top [6,1],
 *    batch 6 (ids repeat, so the embedding gradient must add up).
 *  - dlrm_wide: 40 tables: 41 feature vectors, more than one concatenation takes.
 *
 * Each model is built through the config path (a JSON config made from the fixture's metadata,
 * adt_model_cfg_parse, adt_model_build), so the parameter count is checked three ways: the
 * graph's, the closed form adt_model_cfg_param_count and the PyTorch module's own count. Every
 * fixture parameter loads by name and shape (a name missing on either side fails). One step
 * reproduces logits, loss and every parameter gradient within 1e-5 of each tensor's largest
 * magnitude; 8 steps of SGD (lr 0.05, momentum 0.9) reproduce the loss before each update within
 * 1e-6 and two parameters after the last update within 1e-5. PyTorch itself, run in float32
 * from the same start, drifts by at most 1.1e-7 on these losses (gen_fixtures.py prints it).
 */
#include "torch_fixture.h"

#define STEP_TOL 1e-5
#define TRAJ_LOSS_TOL 1e-6
#define TRAJ_WEIGHT_TOL 1e-5
#define SGD_LR 0.05f
#define SGD_MOMENTUM 0.9f

/* The JSON config of the fixture's model, built from its __metadata__ and handed to the same
 * parser a config file goes through. */
static int fixture_config(const adt_st_file *f, adt_model_cfg *c) {
    const char *model = meta_str(f, "model");
    char json[2048];
    if (!model) return -1;
    if (!strcmp(model, "vgg")) {
        const char *blocks = meta_str(f, "blocks"), *fc = meta_str(f, "fc");
        int C = meta_int(f, "in_channels"), H = meta_int(f, "height"), W = meta_int(f, "width");
        int K = meta_int(f, "classes");
        if (!blocks || !fc || C < 0 || H < 0 || W < 0 || K < 0) return -1;
        snprintf(json, sizeof json,
                 "{\"type\":\"vgg\",\"in_channels\":%d,\"height\":%d,\"width\":%d,\"blocks\":%s,\"fc\":%s,"
                 "\"classes\":%d}", C, H, W, blocks, fc, K);
    } else if (!strcmp(model, "dlrm")) {
        const char *rows = meta_str(f, "table_rows"), *bottom = meta_str(f, "bottom"), *top = meta_str(f, "top");
        int nd = meta_int(f, "n_dense"), D = meta_int(f, "emb_dim");
        if (!rows || !bottom || !top || nd < 0 || D < 0) return -1;
        snprintf(json, sizeof json,
                 "{\"type\":\"dlrm\",\"n_dense\":%d,\"table_rows\":[%s],\"emb_dim\":%d,\"bottom\":%s,\"top\":%s}", nd,
                 rows, D, bottom, top);
    } else {
        CHECK(0, "%s: unknown model '%s'", adt_st_name(f), model);
        return -1;
    }
    int rc = adt_model_cfg_parse(c, json, adt_st_name(f));
    CHECK(rc == ADT_OK, "config %s: %s", json, adt_error_message());
    return rc;
}

static int model_build(adt_graph *g, const adt_st_file *f, adt_model_io *io, void *ctx) {
    (void)ctx;
    adt_model_cfg c;
    int B = meta_int(f, "batch");
    if (B < 0 || fixture_config(f, &c)) return -1;
    int rc = adt_model_build(g, &c, B, io);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    return rc;
}

static const feed_map vgg_feeds[] = {{"x", "input.x"}, {"labels", "input.labels"}};
static const feed_map dlrm_feeds[] = {{"dense", "input.dense"}, {"ids", "input.ids"}, {"labels", "input.labels"}};

static const fixture_model vgg_tiny = {"vgg_tiny", "tests/fixtures/vgg_tiny.safetensors", model_build, NULL,
                                       vgg_feeds, 2};
static const fixture_model dlrm_tiny = {"dlrm_tiny", "tests/fixtures/dlrm_tiny.safetensors", model_build, NULL,
                                        dlrm_feeds, 3};
static const fixture_model dlrm_wide = {"dlrm_wide", "tests/fixtures/dlrm_wide.safetensors", model_build, NULL,
                                        dlrm_feeds, 3};

/* Graph, closed form and PyTorch agree on the number of parameters. */
static void check_param_count(const fixture_model *m) {
    adt_st_file *f = open_fixture(m->path);
    if (!f) return;
    adt_model_cfg c;
    int torch_count = meta_int(f, "param_count");
    if (torch_count > 0 && !fixture_config(f, &c)) {
        adt_graph *g = adt_graph_create();
        adt_model_io io;
        CHECK(adt_model_build(g, &c, 1, &io) == ADT_OK, "%s", adt_error_message());
        CHECK(adt_graph_param_count(g) == torch_count, "%s: the graph has %lld parameters, the PyTorch module %d",
              m->label, (long long)adt_graph_param_count(g), torch_count);
        CHECK(adt_model_cfg_param_count(&c) == torch_count, "%s: the closed form says %lld parameters, PyTorch %d",
              m->label, (long long)adt_model_cfg_param_count(&c), torch_count);
        adt_graph_free(g);
    }
    adt_st_close(f);
}

static void run_model(const fixture_model *m) {
    check_param_count(m);
    fixture_check_step(m, STEP_TOL);
    adt_optim_cfg opt = adt_optim_sgd(SGD_MOMENTUM, 0.0f);
    fixture_check_trajectory(m, "sgd", &opt, SGD_LR, "traj.sgd.loss", TRAJ_LOSS_TOL, "traj.sgd.final.", TRAJ_WEIGHT_TOL);
}

static void test_vgg_tiny(void) { run_model(&vgg_tiny); }
static void test_dlrm_tiny(void) { run_model(&dlrm_tiny); }
static void test_dlrm_wide(void) { run_model(&dlrm_wide); }

int main(void) {
    RUN(test_vgg_tiny);
    RUN(test_dlrm_tiny);
    RUN(test_dlrm_wide);
    return check_finish();
}
