/*
 * test_models_cfg.c - JSON model configs and what the builders make of them: the shipped
 * configs, good configs of every family, one clear error naming the file and the field for each
 * kind of bad input, checks of configs built in code, and for VGG and DLRM the graph itself:
 * parameter counts against hand-derived closed forms (and VGG-16's published 138,357,544), the
 * fed values' shapes and dtypes, parameter names and shapes, layer tags and the initialisation
 * ranges of nn.Conv2d / nn.Linear / DLRM's embeddings.
 */
#include "adtrain/adtrain.h"

#include "check.h"

#include <math.h>
#include <stdint.h>
#include <unistd.h>

static int contains(const char *hay, const char *needle) { return strstr(hay, needle) != NULL; }

/* ---- GPT and MLP ------------------------------------------------------------------------- */

static void test_cfg_shipped(void) {
    adt_model_cfg c, d;
    CHECK(adt_model_cfg_load(&c, "configs/gpt-tiny.json") == ADT_OK, "%s", adt_error_message());
    adt_model_cfg_default(&d);
    CHECK(c.type == ADT_MODEL_GPT && !memcmp(&c.gpt, &d.gpt, sizeof c.gpt), "gpt-tiny.json is the built-in default");
    CHECK(adt_model_cfg_load(&c, "configs/gpt-s.json") == ADT_OK, "%s", adt_error_message());
    CHECK(c.type == ADT_MODEL_GPT && c.gpt.vocab_size == 65 && c.gpt.n_ctx == 128 && c.gpt.n_layer == 4 &&
              c.gpt.n_embd == 256 && c.gpt.n_head == 4 && c.gpt.dropout == 0.0f,
          "gpt-s");
    CHECK(adt_model_cfg_load(&c, "configs/mlp-mnist.json") == ADT_OK, "%s", adt_error_message());
    CHECK(c.type == ADT_MODEL_MLP && c.mlp.n_sizes == 4 && c.mlp.sizes[0] == 784 && c.mlp.sizes[1] == 1024 &&
              c.mlp.sizes[2] == 1024 && c.mlp.sizes[3] == 10 && c.mlp.activation == ADT_ACT_RELU,
          "mlp-mnist");
}

/* to_json gives text that parses back to the same model: same JSON again, same parameter count,
 * same fields. */
static void test_cfg_to_json(void) {
    static const char *const files[] = {"configs/gpt-tiny.json", "configs/gpt-s.json", "configs/mlp-mnist.json",
                                        "configs/vgg16.json", "configs/vgg-mnist.json", "configs/dlrm-criteo.json",
                                        "configs/dlrm-small.json"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        adt_model_cfg c, d;
        memset(&c, 0, sizeof c), memset(&d, 0, sizeof d);
        CHECK(adt_model_cfg_load(&c, files[i]) == ADT_OK, "%s", adt_error_message());
        char *j1 = adt_model_cfg_to_json(&c);
        CHECK(adt_model_cfg_parse(&d, j1, files[i]) == ADT_OK, "%s: %s", j1, adt_error_message());
        char *j2 = adt_model_cfg_to_json(&d);
        CHECK(!strcmp(j1, j2), "%s: %s then %s", files[i], j1, j2);
        CHECK(adt_model_cfg_param_count(&c) == adt_model_cfg_param_count(&d) && adt_model_cfg_param_count(&c) > 0,
              "%s: parameter count", files[i]);
        CHECK(c.type == d.type && !memcmp(&c.gpt, &d.gpt, sizeof c.gpt) && !memcmp(&c.mlp, &d.mlp, sizeof c.mlp) &&
                  !memcmp(&c.vgg, &d.vgg, sizeof c.vgg) && !memcmp(&c.dlrm, &d.dlrm, sizeof c.dlrm),
              "%s: fields differ after the round trip", files[i]);
        free(j1), free(j2);
    }
}

static void test_cfg_good_and_build(void) {
    adt_model_cfg c;
    const char *gpt = "{\n  \"type\": \"gpt\", \"vocab_size\": 50, \"n_ctx\": 16, \"n_layer\": 2,\n"
                      "  \"n_embd\": 24, \"n_head\": 3, \"dropout\": 0.1\n}\n";
    CHECK(adt_model_cfg_parse(&c, gpt, "g.json") == ADT_OK, "%s", adt_error_message());
    CHECK(c.gpt.vocab_size == 50 && c.gpt.n_head == 3 && fabsf(c.gpt.dropout - 0.1f) < 1e-7f, "gpt fields");
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    CHECK(adt_model_build(g, &c, 4, &io) == ADT_OK, "%s", adt_error_message());
    /* wte + wpe + per layer (2 LN + attn + proj + fc + proj) + ln_f */
    int64_t C = 24, V = 50, T = 16, L = 2;
    int64_t expect = V * C + T * C + L * (4 * C + C * 3 * C + 3 * C + C * C + C + C * 4 * C + 4 * C + 4 * C * C + C) + 2 * C;
    CHECK(adt_graph_param_count(g) == expect, "params %lld want %lld", (long long)adt_graph_param_count(g),
          (long long)expect);
    CHECK(io.input >= 0 && io.label >= 0 && io.loss >= 0, "io");
    adt_graph_free(g);

    CHECK(adt_model_cfg_parse(&c, "{\"type\":\"mlp\",\"sizes\":[8,5,3],\"activation\":\"gelu\"}", "m.json") == ADT_OK,
          "%s", adt_error_message());
    CHECK(c.mlp.n_sizes == 3 && c.mlp.activation == ADT_ACT_GELU, "mlp fields");
    g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 2, &io) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_graph_param_count(g) == 8 * 5 + 5 + 5 * 3 + 3, "mlp params %lld", (long long)adt_graph_param_count(g));
    adt_graph_free(g);

    c.gpt = (adt_gpt_cfg){65, 8, 1, 10, 4, 0}; /* built in code: 10 % 4 != 0 */
    c.type = ADT_MODEL_GPT;
    g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 2, &io) == ADT_ERR_ARG && contains(adt_error_message(), "divisible"), "%s",
          adt_error_message());
    adt_graph_free(g);
}

/* Each bad config: parse fails with ADT_ERR_ARG or ADT_ERR_FORMAT and the message holds every
 * listed fragment. */
typedef struct bad_cfg {
    const char *json;
    const char *frag[4];
} bad_cfg;

static void check_bad_cfgs(const bad_cfg *cases, size_t n) {
    for (size_t i = 0; i < n; i++) {
        adt_model_cfg c;
        adt_error_clear();
        int rc = adt_model_cfg_parse(&c, cases[i].json, "bad.json");
        const char *m = adt_error_message();
        CHECK(rc == ADT_ERR_ARG || rc == ADT_ERR_FORMAT, "case %zu: rc %d for %s", i, rc, cases[i].json);
        CHECK(!strncmp(m, "bad.json: ", 10), "case %zu: message does not start with the name: %s", i, m);
        for (int k = 0; k < 4 && cases[i].frag[k]; k++)
            CHECK(contains(m, cases[i].frag[k]), "case %zu: '%s' not in: %s", i, cases[i].frag[k], m);
    }
}

static void test_cfg_bad(void) {
    static const bad_cfg cases[] = {
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":2,\"n_embd\":64}", {"missing", "\"n_head\""}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":\"2\",\"n_embd\":64,\"n_head\":4}",
         {"\"n_layer\"", "a string", "integer"}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":2.5,\"n_embd\":64,\"n_head\":4}",
         {"\"n_layer\"", "2.5", "integer"}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":0,\"n_layer\":2,\"n_embd\":64,\"n_head\":4}",
         {"\"n_ctx\"", "is 0", "[1, "}},
        {"{\"type\":\"gpt\",\"vocab_size\":-3,\"n_ctx\":8,\"n_layer\":2,\"n_embd\":64,\"n_head\":4}", {"\"vocab_size\"", "-3"}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":2,\"n_embd\":250,\"n_head\":4}",
         {"\"n_embd\" (250)", "divisible", "\"n_head\" (4)"}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":2,\"n_embed\":64,\"n_head\":4}",
         {"unknown field \"n_embed\"", "did you mean \"n_embd\"", "\"gpt\""}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":2,\"n_embd\":64,\"n_head\":4,\"lr\":1}",
         {"unknown field \"lr\""}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":2,\"n_embd\":64,\"n_head\":4,\"dropout\":1}",
         {"\"dropout\"", "[0, 1)"}},
        {"{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":64,\"n_layer\":2,\"n_embd\":64,\"n_head\":4,\"n_head\":4}",
         {"\"n_head\"", "more than once"}},
        {"{\"type\":\"resnet\"}", {"\"type\"", "\"resnet\"", "\"vgg\"", "\"dlrm\""}},
        {"{\"vocab_size\":65}", {"missing field \"type\"", "\"gpt\""}},
        {"{\"type\":3}", {"\"type\"", "a number"}},
        {"[1,2]", {"JSON object", "an array"}},
        {"{\"type\":\"mlp\",\"sizes\":[784],\"activation\":\"relu\"}", {"\"sizes\"", "1 entries", "2 to"}},
        {"{\"type\":\"mlp\",\"sizes\":[784,0,10],\"activation\":\"relu\"}", {"\"sizes[1]\"", "is 0"}},
        {"{\"type\":\"mlp\",\"sizes\":[784,\"x\",10],\"activation\":\"relu\"}", {"\"sizes[1]\"", "a string"}},
        {"{\"type\":\"mlp\",\"sizes\":784,\"activation\":\"relu\"}", {"\"sizes\"", "a number", "array"}},
        {"{\"type\":\"mlp\",\"sizes\":[784,10],\"activation\":\"tanh\"}", {"\"activation\"", "\"tanh\"", "\"relu\""}},
        {"{\"type\":\"mlp\",\"sizes\":[784,10]}", {"missing field \"activation\""}},
        {"{\"type\":\"mlp\",\"sizes\":[784,10],\"activation\":\"relu\",\"n_head\":4}",
         {"unknown field \"n_head\"", "\"mlp\""}},
        {"{\"type\":\"gpt\",\n \"vocab_size\": 65,\n \"n_ctx\" 64}", {"invalid JSON", "line 3, column 10"}},
        {"{\"type\":\"gpt\", \"vocab_size\": 65", {"invalid JSON", "end"}},
        {"  \n ", {"empty"}},
        {"{\"type\":\"gpt\"} trailing", {"invalid JSON", "line 1"}},
    };
    check_bad_cfgs(cases, sizeof cases / sizeof cases[0]);
}

static void test_cfg_files(void) {
    adt_model_cfg c;
    const char *missing = check_tmp_path("missing.json");
    int rc = adt_model_cfg_load(&c, missing);
    CHECK(rc == ADT_ERR_IO && contains(adt_error_message(), missing) && contains(adt_error_message(), "No such file"),
          "%d %s", rc, adt_error_message());
    rc = adt_model_cfg_load(&c, check_tmpdir());
    CHECK(rc == ADT_ERR_IO && contains(adt_error_message(), "not a regular file"), "%d %s", rc, adt_error_message());
    const char *nul = check_tmp_path("nul.json");
    check_write_file(nul, "{\"type\":\0\"gpt\"}", 15);
    rc = adt_model_cfg_load(&c, nul);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), "NUL") && contains(adt_error_message(), nul), "%d %s", rc,
          adt_error_message());
    const char *bad = check_tmp_path("bad.json");
    const char *text = "{\"type\": \"gpt\",\n\"vocab_size\": 65,, \"n_ctx\": 64}";
    check_write_file(bad, text, strlen(text));
    rc = adt_model_cfg_load(&c, bad);
    CHECK(rc == ADT_ERR_FORMAT && contains(adt_error_message(), bad) && contains(adt_error_message(), "line 2"), "%d %s",
          rc, adt_error_message());
    unlink(nul);
    unlink(bad);
}


/* ---- VGG and DLRM: shipped configs and counts ----------------------------------------------- */

/* Loads a config file, builds its graph (no executor: nothing is allocated but the graph) and
 * checks the graph's parameter count and the closed form against `want`. NULL on failure. */
static adt_graph *build_file(const char *path, adt_model_cfg *c, int batch, adt_model_io *io, int64_t want) {
    int rc = adt_model_cfg_load(c, path);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (rc) return NULL;
    adt_graph *g = adt_graph_create();
    rc = adt_model_build(g, c, batch, io);
    CHECK(rc == ADT_OK, "%s: %s", path, adt_error_message());
    if (rc) {
        adt_graph_free(g);
        return NULL;
    }
    CHECK(adt_graph_param_count(g) == want, "%s: the graph has %lld parameters, expected %lld", path,
          (long long)adt_graph_param_count(g), (long long)want);
    CHECK(adt_model_cfg_param_count(c) == want, "%s: the closed form says %lld parameters, expected %lld", path,
          (long long)adt_model_cfg_param_count(c), (long long)want);
    return g;
}

/* The value `name` exists, is a parameter and has shape dims[0..nd). */
static void check_param_shape(const adt_graph *g, const char *name, int nd, const int64_t *dims) {
    int v = adt_graph_find_value(g, name);
    CHECK(v >= 0 && g->values[v].role == ADT_ROLE_PARAM, "no parameter '%s'", name);
    if (v < 0) return;
    adt_shape want = adt_shape_make(nd, dims);
    char a[64], b[64];
    CHECK(adt_shape_equal(&g->values[v].shape, &want), "'%s' is %s, expected %s", name,
          adt_shape_str(&g->values[v].shape, a, sizeof a), adt_shape_str(&want, b, sizeof b));
}

static void check_fed(const adt_graph *g, int v, const char *what, adt_dtype dt, int nd, const int64_t *dims) {
    CHECK(v >= 0, "%s: no value", what);
    if (v < 0) return;
    adt_shape want = adt_shape_make(nd, dims);
    char a[64], b[64];
    CHECK(g->values[v].dtype == dt && adt_shape_equal(&g->values[v].shape, &want), "%s is %s %s, expected %s %s", what,
          adt_dtype_name(g->values[v].dtype), adt_shape_str(&g->values[v].shape, a, sizeof a), adt_dtype_name(dt),
          adt_shape_str(&want, b, sizeof b));
}

/* VGG-16 (configuration D of Simonyan & Zisserman) on 3x224x224 with 1000 classes has
 * 138,357,544 parameters, the count torchvision's vgg16 reports. */
static void test_vgg16(void) {
    adt_model_cfg c;
    adt_model_io io;
    adt_graph *g = build_file("configs/vgg16.json", &c, 1, &io, 138357544);
    if (!g) return;
    CHECK(c.type == ADT_MODEL_VGG && c.vgg.n_blocks == 5 && c.vgg.n_fc == 2 && c.vgg.classes == 1000, "vgg16 fields");
    check_param_shape(g, "conv0.weight", 4, (int64_t[]){64, 3, 3, 3});
    check_param_shape(g, "conv12.weight", 4, (int64_t[]){512, 512, 3, 3});
    check_param_shape(g, "conv12.bias", 1, (int64_t[]){512});
    check_param_shape(g, "fc0.weight", 2, (int64_t[]){4096, 512 * 7 * 7});
    check_param_shape(g, "fc2.weight", 2, (int64_t[]){1000, 4096});
    CHECK(adt_graph_find_value(g, "conv13.weight") < 0 && adt_graph_find_value(g, "fc3.weight") < 0,
          "more layers than VGG-16's 13 convolutions and 3 fully connected layers");
    adt_graph_free(g);
}

static void test_vgg_mnist(void) {
    adt_model_cfg c;
    adt_model_io io;
    /* conv0 1->16 and conv1 16->32 (3x3 + bias), 28 -> 14 -> 7, fc0 32*7*7 -> 128, fc1 128 -> 10 */
    int64_t want = (1 * 9 + 1) * 16 + (16 * 9 + 1) * 32 + (32 * 7 * 7 + 1) * 128 + (128 + 1) * 10;
    int B = 3;
    adt_graph *g = build_file("configs/vgg-mnist.json", &c, B, &io, want);
    if (!g) return;
    check_fed(g, io.input, "vgg input", ADT_F32, 4, (int64_t[]){B, 1, 28, 28});
    check_fed(g, io.label, "vgg labels", ADT_I32, 1, (int64_t[]){B});
    check_fed(g, io.logits, "vgg logits", ADT_F32, 2, (int64_t[]){B, 10});
    CHECK(io.input2 == -1, "vgg has a second input");
    check_param_shape(g, "conv1.weight", 4, (int64_t[]){32, 16, 3, 3});
    check_param_shape(g, "fc0.weight", 2, (int64_t[]){128, 32 * 7 * 7});
    check_param_shape(g, "fc1.bias", 1, (int64_t[]){10});
    adt_graph_free(g);
}

/* The Criteo Kaggle cardinalities, capped at 100,000 rows. */
static void test_dlrm_criteo(void) {
    static const int kaggle[26] = {1460,  583,   10131227, 2202608, 305, 24,      12517, 633, 3,
                                   93145, 5683,  8351593,  3194,    27,  14992,   5461306, 10, 5652,
                                   2173,  4,     7046547,  18,      15,  286181,  105,   142572};
    adt_model_cfg c;
    adt_model_io io;
    int64_t rows = 0;
    for (int t = 0; t < 26; t++) rows += kaggle[t] < 100000 ? kaggle[t] : 100000;
    /* bottom 13-512-256-64-16, 26 tables of width 16, top (16 + 27*26/2)-512-256-1 */
    int64_t want = (13 + 1) * 512 + (512 + 1) * 256 + (256 + 1) * 64 + (64 + 1) * 16 + rows * 16 +
                   (16 + 27 * 26 / 2 + 1) * 512 + (512 + 1) * 256 + (256 + 1) * 1;
    adt_graph *g = build_file("configs/dlrm-criteo.json", &c, 2, &io, want);
    if (!g) return;
    for (int t = 0; t < 26; t++) {
        char name[32];
        snprintf(name, sizeof name, "emb.%d.weight", t);
        check_param_shape(g, name, 2, (int64_t[]){kaggle[t] < 100000 ? kaggle[t] : 100000, 16});
    }
    adt_graph_free(g);
}

static void test_dlrm_small(void) {
    adt_model_cfg c;
    adt_model_io io;
    int B = 5;
    int64_t want = (13 + 1) * 64 + (64 + 1) * 8 + 26 * 1000 * 8 + (8 + 27 * 26 / 2 + 1) * 64 + (64 + 1) * 1;
    adt_graph *g = build_file("configs/dlrm-small.json", &c, B, &io, want);
    if (!g) return;
    CHECK(c.dlrm.n_tables == 26 && c.dlrm.table_rows[0] == 1000 && c.dlrm.table_rows[25] == 1000, "one size for all");
    check_fed(g, io.input, "dlrm dense", ADT_F32, 2, (int64_t[]){B, 13});
    check_fed(g, io.input2, "dlrm ids", ADT_I32, 2, (int64_t[]){B, 26});
    check_fed(g, io.label, "dlrm labels", ADT_F32, 1, (int64_t[]){B});
    check_fed(g, io.logits, "dlrm logits", ADT_F32, 1, (int64_t[]){B});
    check_param_shape(g, "bot.0.weight", 2, (int64_t[]){64, 13});
    check_param_shape(g, "bot.1.bias", 1, (int64_t[]){8});
    check_param_shape(g, "emb.25.weight", 2, (int64_t[]){1000, 8});
    check_param_shape(g, "top.0.weight", 2, (int64_t[]){64, 8 + 27 * 26 / 2});
    check_param_shape(g, "top.1.weight", 2, (int64_t[]){1, 64});
    adt_graph_free(g);
}

static void test_cfg_good_vgg_dlrm(void) {
    adt_model_cfg c;
    /* no hidden fully connected layer, non-square image with odd sizes (7x5 -> 3x2) */
    const char *vgg = "{\"type\":\"vgg\",\"in_channels\":3,\"height\":7,\"width\":5,\"blocks\":[[4,6]],\"fc\":[],"
                      "\"classes\":2}";
    CHECK(adt_model_cfg_parse(&c, vgg, "v.json") == ADT_OK, "%s", adt_error_message());
    CHECK(c.type == ADT_MODEL_VGG && c.vgg.n_blocks == 1 && c.vgg.n_convs[0] == 2 && c.vgg.channels[0][1] == 6 &&
              c.vgg.n_fc == 0,
          "vgg fields");
    CHECK(adt_model_cfg_param_count(&c) == (3 * 9 + 1) * 4 + (4 * 9 + 1) * 6 + (6 * 3 * 2 + 1) * 2, "vgg count %lld",
          (long long)adt_model_cfg_param_count(&c));
    /* table_rows as a list with a matching n_tables */
    const char *dlrm = "{\"type\":\"dlrm\",\"n_dense\":2,\"n_tables\":3,\"table_rows\":[4,5,6],\"emb_dim\":3,"
                       "\"bottom\":[3],\"top\":[1]}";
    CHECK(adt_model_cfg_parse(&c, dlrm, "d.json") == ADT_OK, "%s", adt_error_message());
    CHECK(c.type == ADT_MODEL_DLRM && c.dlrm.n_tables == 3 && c.dlrm.table_rows[2] == 6 && c.dlrm.n_top == 1, "dlrm");
    CHECK(adt_model_cfg_param_count(&c) == (2 + 1) * 3 + (4 + 5 + 6) * 3 + (3 + 4 * 3 / 2 + 1) * 1, "dlrm count %lld",
          (long long)adt_model_cfg_param_count(&c));
    CHECK(!strcmp(adt_model_type_name(ADT_MODEL_VGG), "vgg") && !strcmp(adt_model_type_name(ADT_MODEL_DLRM), "dlrm"),
          "type names");
}

static void test_cfg_bad_vgg_dlrm(void) {
#define VGG_(rest) "{\"type\":\"vgg\",\"in_channels\":1,\"height\":28,\"width\":28," rest "}"
#define DLRM_(rest) "{\"type\":\"dlrm\",\"n_dense\":13," rest "}"
    static const bad_cfg cases[] = {
        {VGG_("\"fc\":[128],\"classes\":10"), {"missing field \"blocks\"", "[[64, 64]"}},
        {VGG_("\"blocks\":3,\"fc\":[128],\"classes\":10"), {"\"blocks\"", "a number", "array"}},
        {VGG_("\"blocks\":[],\"fc\":[128],\"classes\":10"), {"\"blocks\"", "0 entries", "1 to 16"}},
        {VGG_("\"blocks\":[[16],32],\"fc\":[128],\"classes\":10"), {"\"blocks[1]\"", "a number", "array"}},
        {VGG_("\"blocks\":[[16],[]],\"fc\":[128],\"classes\":10"), {"\"blocks[1]\"", "0 entries", "1 to 16"}},
        {VGG_("\"blocks\":[[16],[32,0]],\"fc\":[128],\"classes\":10"), {"\"blocks[1][1]\"", "is 0", "[1, 65536]"}},
        {VGG_("\"blocks\":[[16],[32.5]],\"fc\":[128],\"classes\":10"), {"\"blocks[1][0]\"", "32.5", "integer"}},
        {VGG_("\"blocks\":[[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1],[1]],\"fc\":[],"
              "\"classes\":10"),
         {"\"blocks\"", "17 entries"}},
        {VGG_("\"blocks\":[[8],[8],[8],[8],[8]],\"fc\":[128],\"classes\":10"),
         {"\"height\" is 28", "5 blocks", "at least 32"}},
        {"{\"type\":\"vgg\",\"in_channels\":1,\"height\":8,\"width\":3,\"blocks\":[[8],[8]],\"fc\":[],\"classes\":10}",
         {"\"width\" is 3", "at least 4"}},
        {VGG_("\"blocks\":[[16]],\"fc\":[128],\"classes\":1"), {"\"classes\"", "is 1", "[2, "}},
        {VGG_("\"blocks\":[[16]],\"fc\":[128,\"x\"],\"classes\":10"), {"\"fc[1]\"", "a string"}},
        {VGG_("\"blocks\":[[16]],\"classes\":10"), {"missing field \"fc\""}},
        {VGG_("\"blocks\":[[16]],\"fc\":[128],\"clases\":10"), {"unknown field \"clases\"", "did you mean \"classes\""}},
        {"{\"type\":\"vgg\",\"in_channels\":0,\"height\":28,\"width\":28,\"blocks\":[[16]],\"fc\":[],\"classes\":10}",
         {"\"in_channels\"", "is 0"}},
        {"{\"type\":\"vgg\",\"in_channels\":1,\"height\":520,\"width\":520,\"blocks\":[[256]],\"fc\":[],\"classes\":10}",
         {"flattened feature map", "17305600", "fc0"}},
        {"{\"type\":\"vgg\",\"in_channels\":1,\"height\":512,\"width\":512,\"blocks\":[[65536]],\"fc\":[],\"classes\":2}",
         {"\"blocks[0][0]\"", "values per sample"}},
        {DLRM_("\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"), {"missing field \"table_rows\"", "\"n_tables\""}},
        {DLRM_("\"table_rows\":\"10\",\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"), {"\"table_rows\"", "a string"}},
        {DLRM_("\"table_rows\":[],\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"), {"\"table_rows\"", "0 entries"}},
        {DLRM_("\"table_rows\":[10,0],\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"), {"\"table_rows[1]\"", "is 0"}},
        {DLRM_("\"n_tables\":2,\"table_rows\":1073741825,\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"),
         {"\"table_rows\"", "1073741825", "1073741824"}},
        {DLRM_("\"table_rows\":100,\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"),
         {"missing field \"n_tables\"", "one size for every table"}},
        {DLRM_("\"n_tables\":3,\"table_rows\":[10,20],\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"),
         {"\"n_tables\" is 3", "lists 2 tables"}},
        {DLRM_("\"n_tables\":300,\"table_rows\":10,\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"),
         {"\"n_tables\"", "is 300", "[1, 256]"}},
        {DLRM_("\"n_tables\":2.5,\"table_rows\":10,\"emb_dim\":16,\"bottom\":[16],\"top\":[1]"),
         {"\"n_tables\"", "2.5"}},
        {DLRM_("\"table_rows\":[10],\"emb_dim\":16,\"bottom\":[64,32],\"top\":[1]"),
         {"\"bottom\" ends with 32", "\"emb_dim\" (16)"}},
        {DLRM_("\"table_rows\":[10],\"emb_dim\":16,\"bottom\":[16],\"top\":[8,2]"), {"\"top\" ends with 2", "expected 1"}},
        {DLRM_("\"table_rows\":[10],\"emb_dim\":16,\"top\":[1]"), {"missing field \"bottom\"", "emb_dim"}},
        {DLRM_("\"table_rows\":[10],\"emb_dim\":16,\"bottom\":[16],\"top\":[]"), {"\"top\"", "0 entries"}},
        {DLRM_("\"table_rows\":[10],\"emb_dim\":0,\"bottom\":[16],\"top\":[1]"), {"\"emb_dim\"", "is 0"}},
        {"{\"type\":\"dlrm\",\"n_dense\":-1,\"table_rows\":[10],\"emb_dim\":16,\"bottom\":[16],\"top\":[1]}",
         {"\"n_dense\"", "-1"}},
        {DLRM_("\"table_rows\":[10],\"embdim\":16,\"bottom\":[16],\"top\":[1]"),
         {"unknown field \"embdim\"", "did you mean \"emb_dim\"", "\"dlrm\""}},
        {DLRM_("\"table_rows\":[10],\"emb_dim\":16,\"bottom\":[16],\"top\":[1],\"top\":[1]"),
         {"\"top\"", "more than once"}},
    };
#undef VGG_
#undef DLRM_
    check_bad_cfgs(cases, sizeof cases / sizeof cases[0]);
}

/* Configs changed in code are checked by the builders too: an error, never a crash. */
static void test_code_built(void) {
    adt_model_cfg c;
    adt_model_io io;
    CHECK(adt_model_cfg_load(&c, "configs/vgg-mnist.json") == ADT_OK, "%s", adt_error_message());
    c.vgg.n_blocks = 0;
    adt_graph *g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 2, &io) == ADT_ERR_ARG && contains(adt_error_message(), "\"blocks\""), "%s",
          adt_error_message());
    CHECK(adt_model_cfg_param_count(&c) == -1, "param count of an invalid config");
    adt_graph_free(g);
    c.vgg.n_blocks = 2;
    c.vgg.n_fc = ADT_VGG_MAX_FC + 1;
    g = adt_graph_create();
    CHECK(adt_model_vgg(g, &c.vgg, 2, &io) != ADT_OK && contains(adt_graph_error_message(g), "\"fc\""), "%s",
          adt_graph_error_message(g));
    adt_graph_free(g);

    CHECK(adt_model_cfg_load(&c, "configs/dlrm-small.json") == ADT_OK, "%s", adt_error_message());
    c.dlrm.emb_dim = 4; /* the bottom MLP still ends with 8 */
    g = adt_graph_create();
    CHECK(adt_model_dlrm(g, &c.dlrm, 2, &io) != ADT_OK && contains(adt_graph_error_message(g), "\"bottom\" ends with 8"),
          "%s", adt_graph_error_message(g));
    adt_graph_free(g);
    c.dlrm.emb_dim = 8;
    c.dlrm.table_rows[7] = 0;
    g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 2, &io) == ADT_ERR_ARG && contains(adt_error_message(), "\"table_rows[7]\""), "%s",
          adt_error_message());
    adt_graph_free(g);
    c.dlrm.table_rows[7] = 1000;
    g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 0, &io) == ADT_ERR_ARG && contains(adt_error_message(), "batch"), "%s",
          adt_error_message());
    adt_graph_free(g);
}

/* ---- layer tags and initialisation ------------------------------------------------------- */

/* The layer tag of parameter `name` (-1 if absent). */
static int param_tag(const adt_graph *g, const char *name) {
    int v = adt_graph_find_value(g, name);
    return v >= 0 ? g->values[v].layer_tag : -1;
}

/* Each layer its own tag, in order: VGG convolutions then fully connected layers; DLRM bottom
 * layers, tables, the interaction, top layers. Every forward node sits in some layer. */
static void test_layer_tags(void) {
    adt_model_cfg c;
    adt_model_io io;
    char name[32];
    CHECK(adt_model_cfg_load(&c, "configs/vgg16.json") == ADT_OK, "%s", adt_error_message());
    adt_graph *g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 1, &io) == ADT_OK, "%s", adt_error_message());
    for (int i = 0; i < 13; i++) {
        snprintf(name, sizeof name, "conv%d.weight", i);
        CHECK(param_tag(g, name) == i + 1, "%s has tag %d, expected %d", name, param_tag(g, name), i + 1);
    }
    for (int j = 0; j < 3; j++) {
        snprintf(name, sizeof name, "fc%d.bias", j);
        CHECK(param_tag(g, name) == 14 + j, "%s has tag %d, expected %d", name, param_tag(g, name), 14 + j);
    }
    for (int n = 0; n < g->n_nodes; n++) CHECK(g->nodes[n].layer_tag >= 1, "node %s has no layer", g->nodes[n].name);
    CHECK(g->cur_layer_tag == 0, "the builder left layer tag %d set", g->cur_layer_tag);
    adt_graph_free(g);

    CHECK(adt_model_cfg_load(&c, "configs/dlrm-small.json") == ADT_OK, "%s", adt_error_message());
    g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 2, &io) == ADT_OK, "%s", adt_error_message());
    CHECK(param_tag(g, "bot.0.weight") == 1 && param_tag(g, "bot.1.weight") == 2, "bottom tags");
    for (int t = 0; t < 26; t++) {
        snprintf(name, sizeof name, "emb.%d.weight", t);
        CHECK(param_tag(g, name) == 3 + t, "%s has tag %d, expected %d", name, param_tag(g, name), 3 + t);
    }
    int inter_tag = -1;
    for (int n = 0; n < g->n_nodes; n++) {
        CHECK(g->nodes[n].layer_tag >= 1, "node %s has no layer", g->nodes[n].name);
        if (g->nodes[n].op == ADT_OP_INTERACTION) inter_tag = g->nodes[n].layer_tag;
    }
    CHECK(inter_tag == 29, "the interaction has tag %d, expected 29", inter_tag);
    CHECK(param_tag(g, "top.0.weight") == 30 && param_tag(g, "top.1.bias") == 31, "top tags");
    adt_graph_free(g);
}

/* Parameter `name` drawn from U(-bound, bound): inside the bound, and for large tensors reaching
 * near it, with the uniform law's mean 0 and standard deviation bound/sqrt(3) (within 4-5
 * standard errors of the estimates). */
static void check_uniform(adt_exec *ex, const adt_graph *g, const char *name, double bound) {
    int v = adt_graph_find_value(g, name);
    CHECK(v >= 0, "no parameter '%s'", name);
    if (v < 0) return;
    const float *p = adt_exec_data(ex, v);
    int64_t n = adt_value_numel(g, v);
    double mx = 0, s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        mx = fmax(mx, fabs(p[i]));
        s += p[i];
        s2 += (double)p[i] * p[i];
    }
    CHECK(mx <= bound * (1 + 1e-6), "%s: |w| reaches %.6g, beyond the bound %.6g", name, mx, bound);
    if (n < 1000) return;
    double mean = s / (double)n, sd = sqrt(s2 / (double)n - mean * mean), want = bound / sqrt(3.0);
    CHECK(mx >= 0.9 * bound, "%s: max |w| %.6g, expected near the bound %.6g", name, mx, bound);
    CHECK(fabs(mean) <= 5 * want / sqrt((double)n), "%s: mean %.3g, expected 0", name, mean);
    CHECK(fabs(sd / want - 1) <= 5 * sqrt(0.8 / (double)n), "%s: std %.6g, expected %.6g", name, sd, want);
}

static void test_init(void) {
    adt_model_cfg c;
    adt_model_io io;
    CHECK(adt_model_cfg_load(&c, "configs/vgg-mnist.json") == ADT_OK, "%s", adt_error_message());
    adt_graph *g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 1, &io) == ADT_OK, "%s", adt_error_message());
    adt_exec *ex = NULL;
    adt_exec_opts eo = {.threads = 1, .seed = 7};
    CHECK(adt_exec_create(&ex, g, &eo) == ADT_OK && adt_exec_init_params(ex) == ADT_OK, "%s", adt_error_message());
    if (ex) {
        /* nn.Conv2d / nn.Linear: weights and biases U(-1/sqrt(fan_in), 1/sqrt(fan_in)) */
        check_uniform(ex, g, "conv0.weight", 1 / sqrt(1 * 9.0));
        check_uniform(ex, g, "conv0.bias", 1 / sqrt(1 * 9.0));
        check_uniform(ex, g, "conv1.weight", 1 / sqrt(16 * 9.0));
        check_uniform(ex, g, "conv1.bias", 1 / sqrt(16 * 9.0));
        check_uniform(ex, g, "fc0.weight", 1 / sqrt(32 * 7 * 7.0));
        check_uniform(ex, g, "fc1.weight", 1 / sqrt(128.0));
        check_uniform(ex, g, "fc1.bias", 1 / sqrt(128.0));
    }
    adt_exec_free(ex);
    adt_graph_free(g);

    const char *dlrm = "{\"type\":\"dlrm\",\"n_dense\":13,\"table_rows\":[3,20000],\"emb_dim\":4,\"bottom\":[64,4],"
                       "\"top\":[16,1]}";
    CHECK(adt_model_cfg_parse(&c, dlrm, "init.json") == ADT_OK, "%s", adt_error_message());
    g = adt_graph_create();
    CHECK(adt_model_build(g, &c, 1, &io) == ADT_OK, "%s", adt_error_message());
    ex = NULL;
    CHECK(adt_exec_create(&ex, g, &eo) == ADT_OK && adt_exec_init_params(ex) == ADT_OK, "%s", adt_error_message());
    if (ex) {
        /* DLRM's tables: U(-sqrt(1/rows), sqrt(1/rows)) */
        check_uniform(ex, g, "emb.0.weight", sqrt(1 / 3.0));
        check_uniform(ex, g, "emb.1.weight", sqrt(1 / 20000.0));
        check_uniform(ex, g, "bot.0.weight", 1 / sqrt(13.0));
        check_uniform(ex, g, "bot.1.weight", 1 / sqrt(64.0));
        check_uniform(ex, g, "top.0.weight", 1 / sqrt(4 + 3.0));
        check_uniform(ex, g, "top.1.bias", 1 / sqrt(16.0));
    }
    adt_exec_free(ex);
    adt_graph_free(g);
}

static void cleanup(void) {
    const char *leaves[] = {"nul.json", "bad.json"};
    check_tmpdir_remove(leaves, sizeof leaves / sizeof leaves[0]);
}

int main(void) {
    if (check_tmpdir_make("models")) return 2;
    RUN(test_cfg_shipped);
    RUN(test_cfg_to_json);
    RUN(test_cfg_good_and_build);
    RUN(test_cfg_bad);
    RUN(test_cfg_files);
    RUN(test_vgg16);
    RUN(test_vgg_mnist);
    RUN(test_dlrm_criteo);
    RUN(test_dlrm_small);
    RUN(test_cfg_good_vgg_dlrm);
    RUN(test_cfg_bad_vgg_dlrm);
    RUN(test_code_built);
    RUN(test_layer_tags);
    RUN(test_init);
    cleanup();
    return check_finish();
}
