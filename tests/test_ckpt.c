/*
 * test_ckpt.c - training checkpoints: the library round trip and its refusals, `adtrain train`
 * --save/--resume reproducing an uninterrupted run bit for bit, and the PyTorch side: an adtrain
 * checkpoint gives the same logits in PyTorch, and a PyTorch-initialised GPT-2 in Hugging Face's
 * layout trains in adtrain along PyTorch's own loss trajectory.
 *
 * The PyTorch cases run scripts/torch_ckpt.py with Debian's /usr/bin/python3 (python3-torch is a
 * test dependency installed by scripts/install-deps.sh).
 */
#include "check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "adtrain/exec.h"
#include "adtrain/models.h"
#include "adtrain/safetensors.h"
#include "cli_run.h"

#define PYTHON "/usr/bin/python3"

static void *exec_data(void *ctx, int v) { return adt_exec_data(ctx, v); }

/* An MLP training graph with AdamW (so there is optimizer state), parameters initialised by seed. */
static adt_exec *mlp_exec(adt_graph **gout, int hidden, uint64_t seed) {
    adt_mlp_cfg c = {.n_sizes = 3, .sizes = {6, hidden, 3}, .activation = ADT_ACT_RELU};
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    adt_model_mlp(g, &c, 4, &io);
    adt_graph_backward(g, io.loss);
    adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.999f, 1e-8f, 0.01f);
    adt_graph_optimizer(g, &oc);
    adt_exec *ex = NULL;
    adt_exec_opts eo = {.seed = seed};
    if (adt_graph_error(g) || adt_exec_create(&ex, g, &eo)) {
        CHECK(0, "building the MLP: %s %s", adt_graph_error_message(g), adt_error_message());
        adt_graph_free(g);
        return NULL;
    }
    adt_exec_init_params(ex);
    *gout = g;
    return ex;
}

/* Every persistent f32 value of `role` equal, byte for byte, between two executors of one graph shape. */
static int same_values(adt_graph *g, adt_exec *a, adt_exec *b, adt_role role) {
    int n = 0;
    for (int i = 0; i < g->n_values; i++) {
        const adt_value *v = &g->values[i];
        if (v->role != role || v->alias_of >= 0) continue;
        size_t bytes = (size_t)adt_shape_prod(&v->shape, 0, v->shape.ndim) * sizeof(float);
        if (memcmp(adt_exec_data(a, i), adt_exec_data(b, i), bytes)) return -1;
        n++;
    }
    return n;
}

/* Fills every optimizer state with a pattern, as after some steps. */
static void fill_state(adt_graph *g, adt_exec *ex) {
    for (int i = 0; i < g->n_values; i++) {
        const adt_value *v = &g->values[i];
        if (v->role != ADT_ROLE_OPT_STATE || v->alias_of >= 0) continue;
        float *p = adt_exec_data(ex, i);
        for (int64_t k = 0; k < adt_shape_prod(&v->shape, 0, v->shape.ndim); k++) p[k] = 0.001f * (float)(k % 97) + (float)i;
    }
}

static void test_roundtrip(void) {
    adt_graph *g1, *g2;
    adt_exec *a = mlp_exec(&g1, 5, 1), *b = mlp_exec(&g2, 5, 2);
    if (!a || !b) return;
    fill_state(g1, a);
    CHECK(same_values(g1, a, b, ADT_ROLE_PARAM) < 0, "different seeds must give different weights");
    const char *path = check_tmp_path("rt.safetensors");
    const char *meta[] = {"k1", "v1", "k2", "v2"};
    CHECK(adt_ckpt_save(path, g1, exec_data, a, 1, meta, 2) == ADT_OK, "%s", adt_error_message());
    adt_st_file *f = NULL;
    CHECK(adt_st_open(&f, path) == ADT_OK, "%s", adt_error_message());
    if (!f) return;
    CHECK(adt_st_metadata(f, "k2") && !strcmp(adt_st_metadata(f, "k2"), "v2"), "metadata lost");
    CHECK(adt_st_find(f, "layers.0.weight") && adt_st_find(f, "opt.v.layers.1.bias"), "names are the graph's");
    CHECK(adt_ckpt_load(f, g2, exec_data, b, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(same_values(g1, a, b, ADT_ROLE_PARAM) == 4, "weights differ after load");
    CHECK(same_values(g1, a, b, ADT_ROLE_OPT_STATE) == 8, "optimizer state differs after load");
    adt_st_close(f);
    adt_exec_free(a), adt_exec_free(b), adt_graph_free(g1), adt_graph_free(g2);
}

/* Writes the tensors of `src` except `skip` (NULL: none), each under prefix+name, plus extras. */
static void write_variant(const char *path, const adt_st_file *src, const char *skip, const char *prefix,
                          const char *extra_name) {
    adt_st_writer *w = adt_st_writer_create();
    for (int i = 0; i < adt_st_count(src); i++) {
        const adt_st_tensor *t = adt_st_get(src, i);
        if (skip && !strcmp(t->name, skip)) continue;
        char name[256];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        adt_st_writer_add(w, name, t->dtype, t->ndim, t->shape, t->data);
    }
    if (extra_name) {
        static const float one[1] = {1};
        int64_t d1 = 1;
        adt_st_writer_add(w, extra_name, ADT_ST_F32, 1, &d1, one);
    }
    CHECK(adt_st_writer_save(w, path) == ADT_OK, "%s", adt_error_message());
    adt_st_writer_free(w);
}

/* Loads `path` into an MLP of width `hidden`; returns the status and keeps the message. */
static int load_into(const char *path, int hidden, int with_state, char *msg, size_t n) {
    adt_graph *g;
    adt_exec *ex = mlp_exec(&g, hidden, 3);
    adt_st_file *f = NULL;
    int rc = adt_st_open(&f, path);
    if (!rc) rc = adt_ckpt_load(f, g, exec_data, ex, with_state);
    snprintf(msg, n, "%s", rc ? adt_error_message() : "");
    adt_st_close(f);
    adt_exec_free(ex), adt_graph_free(g);
    return rc;
}

static void test_load_refusals(void) {
    adt_graph *g;
    adt_exec *ex = mlp_exec(&g, 5, 1);
    if (!ex) return;
    const char *full = check_tmp_path("full.safetensors"), *weights = check_tmp_path("w.safetensors");
    CHECK(adt_ckpt_save(full, g, exec_data, ex, 1, NULL, 0) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_ckpt_save(weights, g, exec_data, ex, 0, NULL, 0) == ADT_OK, "%s", adt_error_message());
    adt_exec_free(ex), adt_graph_free(g);
    char msg[1024];

    /* Weights only: fine for --init, refused for a resume that needs the optimizer state. */
    CHECK(load_into(weights, 5, 0, msg, sizeof msg) == ADT_OK, "%s", msg);
    CHECK(load_into(full, 5, 0, msg, sizeof msg) == ADT_OK, "optimizer state is ignored by --init: %s", msg);
    CHECK(load_into(weights, 5, 1, msg, sizeof msg) != ADT_OK && strstr(msg, "opt.m.layers.0.weight") &&
              strstr(msg, "--init"), "%s", msg);
    /* Same names, other shapes. */
    CHECK(load_into(full, 7, 1, msg, sizeof msg) != ADT_OK && strstr(msg, "layers.0.weight") && strstr(msg, "shape"),
          "%s", msg);

    adt_st_file *src = NULL;
    CHECK(adt_st_open(&src, weights) == ADT_OK, "%s", adt_error_message());
    if (!src) return;
    const char *v = check_tmp_path("variant.safetensors");
    write_variant(v, src, "layers.1.bias", "", NULL);
    CHECK(load_into(v, 5, 0, msg, sizeof msg) != ADT_OK && strstr(msg, "'layers.1.bias' is missing") &&
              strstr(msg, "variant.safetensors"), "%s", msg);
    write_variant(v, src, NULL, "", "layers.9.weight");
    CHECK(load_into(v, 5, 0, msg, sizeof msg) != ADT_OK && strstr(msg, "layers.9.weight"), "%s", msg);
    write_variant(v, src, NULL, "net.", NULL);
    CHECK(load_into(v, 5, 0, msg, sizeof msg) != ADT_OK && strstr(msg, "not a checkpoint of this model") &&
              strstr(msg, "net.layers.0.weight"), "%s", msg);
    /* Hugging Face's prefix and buffers are accepted. */
    write_variant(v, src, NULL, "transformer.", "lm_head.weight");
    CHECK(load_into(v, 5, 0, msg, sizeof msg) == ADT_OK, "%s", msg);
    adt_st_close(src);
}

/* GPT holds c_attn as weight [C,3,C] and bias [3,C]; its checkpoints hold Hugging Face's [C,3C]
 * and [3C] (optimizer state too), every other tensor in its graph shape, and load back byte for
 * byte. A file with the graph's own [C,3,C] is refused, naming both shapes. */
static void test_gpt_file_shapes(void) {
    const int C = 8, L = 2;
    adt_gpt_cfg c = {.vocab_size = 11, .n_ctx = 5, .n_layer = L, .n_embd = C, .n_head = 2};
    adt_graph *g[2];
    adt_exec *ex[2] = {NULL, NULL};
    for (int k = 0; k < 2; k++) {
        adt_model_io io;
        g[k] = adt_graph_create();
        adt_model_gpt(g[k], &c, 2, &io);
        adt_graph_backward(g[k], io.loss);
        adt_optim_cfg oc = adt_optim_adamw(0.9f, 0.999f, 1e-8f, 0.01f);
        adt_graph_optimizer(g[k], &oc);
        adt_exec_opts eo = {.seed = 7 + (uint64_t)k};
        CHECK(!adt_graph_error(g[k]) && adt_exec_create(&ex[k], g[k], &eo) == ADT_OK, "building GPT: %s %s",
              adt_graph_error_message(g[k]), adt_error_message());
        if (!ex[k]) return;
        adt_exec_init_params(ex[k]);
    }
    fill_state(g[0], ex[0]);
    const char *path = check_tmp_path("gpt.safetensors");
    CHECK(adt_ckpt_save(path, g[0], exec_data, ex[0], 1, NULL, 0) == ADT_OK, "%s", adt_error_message());
    adt_st_file *f = NULL;
    CHECK(adt_st_open(&f, path) == ADT_OK, "%s", adt_error_message());
    if (!f) return;
    int checked = 0;
    for (int i = 0; i < g[0]->n_values; i++) {
        const adt_value *v = &g[0]->values[i];
        if (v->role != ADT_ROLE_PARAM && v->role != ADT_ROLE_OPT_STATE) continue;
        const adt_st_tensor *t = adt_st_find(f, v->name);
        CHECK(t != NULL, "'%s' not in the checkpoint", v->name);
        if (!t) continue;
        /* the PyTorch shape, independently of the graph: c_attn flattens its (3, C) */
        int is_w = strstr(v->name, "attn.c_attn.weight") != NULL, is_b = strstr(v->name, "attn.c_attn.bias") != NULL;
        adt_shape want = v->shape;
        if (is_w) want = adt_shape_2d(C, 3 * C);
        if (is_b) want = adt_shape_1d(3 * C);
        int same = t->ndim == want.ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == want.dim[d];
        char ws[64];
        CHECK(same, "'%s' stored with rank %d, expected %s", v->name, t->ndim, adt_shape_str(&want, ws, sizeof ws));
        checked += is_w || is_b;
    }
    CHECK(checked == 3 * 2 * L, "%d c_attn tensors (weight, bias, two moments each per layer) seen", checked);
    CHECK(adt_ckpt_load(f, g[1], exec_data, ex[1], 1) == ADT_OK, "%s", adt_error_message());
    CHECK(same_values(g[0], ex[0], ex[1], ADT_ROLE_PARAM) == 4 + 12 * L, "GPT weights differ after load");
    CHECK(same_values(g[0], ex[0], ex[1], ADT_ROLE_OPT_STATE) == 2 * (4 + 12 * L), "GPT state differs after load");
    /* the graph's [C,3,C] in a file is not PyTorch's shape: refused */
    adt_st_writer *w = adt_st_writer_create();
    for (int i = 0; i < adt_st_count(f); i++) {
        const adt_st_tensor *t = adt_st_get(f, i);
        int v = adt_graph_find_value(g[0], t->name);
        const adt_shape *gs = &g[0]->values[v].shape;
        adt_st_writer_add(w, t->name, t->dtype, gs->ndim, gs->dim, t->data);
    }
    const char *bad = check_tmp_path("gpt_graph_shapes.safetensors");
    CHECK(adt_st_writer_save(w, bad) == ADT_OK, "%s", adt_error_message());
    adt_st_writer_free(w);
    adt_st_close(f);
    CHECK(adt_st_open(&f, bad) == ADT_OK, "%s", adt_error_message());
    int rc = f ? adt_ckpt_load(f, g[1], exec_data, ex[1], 1) : ADT_OK;
    CHECK(rc != ADT_OK && strstr(adt_error_message(), "h.0.attn.c_attn.weight") &&
              strstr(adt_error_message(), "[8,3,8]") && strstr(adt_error_message(), "[8,24]"),
          "a [C,3,C] c_attn.weight loaded: %s", adt_error_message());
    adt_st_close(f);
    for (int k = 0; k < 2; k++) adt_exec_free(ex[k]), adt_graph_free(g[k]);
}

/* ---- through the binary ------------------------------------------------------------------- */

/* A small text with some structure (vocabulary 27 symbols), written to the temp dir; the path
 * goes into path[512] (check_tmp_path's own buffers rotate). */
static const char *write_corpus(char *path, const char *leaf, int bytes) {
    static const char *words[] = {"the ", "quick ", "brown ", "fox ", "jumps ", "over ", "lazy ", "dogs ", "and ", "cats "};
    snprintf(path, 512, "%s", check_tmp_path(leaf));
    FILE *f = fopen(path, "w");
    uint32_t s = 12345;
    for (int n = 0; n < bytes;) {
        s = s * 1103515245u + 12345u;
        const char *w = words[(s >> 16) % 10];
        n += fprintf(f, "%s", w);
        if ((s >> 8) % 7 == 0) n += fprintf(f, "\n");
    }
    fclose(f);
    return path;
}

static int distinct_bytes(const char *path) {
    int seen[256] = {0}, n = 0, c;
    FILE *f = fopen(path, "r");
    while (f && (c = fgetc(f)) != EOF) n += !seen[c]++;
    if (f) fclose(f);
    return n;
}

/* The step lines of a JSONL log without the timing fields: what a bit-exact resume must repeat. */
static int read_step_lines(const char *path, char lines[][128], int cap) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f) && n < cap) {
        char *ms = strstr(line, ",\"ms\":");
        if (!ms || !strstr(line, "\"loss\":")) continue;
        *ms = 0;
        snprintf(lines[n++], 128, "%.127s", line);
    }
    fclose(f);
    return n;
}

static void test_resume_bit_exact(void) {
    char text[512];
    write_corpus(text, "corpus.txt", 3000);
    char cfg[512];
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("gpt.json"));
    char json[256];
    snprintf(json, sizeof json, "{\"type\":\"gpt\",\"vocab_size\":%d,\"n_ctx\":16,\"n_layer\":2,\"n_embd\":32,"
             "\"n_head\":4,\"dropout\":0.1}\n", distinct_bytes(text));
    write_text(cfg, json);
    char common[2048], args[4096], out[16384];
    /* 3000 bytes / 16 = 187 samples, 168 after the holdout: 21 steps an epoch at batch 8, so the
     * resumed half crosses into the second epoch's shuffled order. */
    snprintf(common, sizeof common, "train --model '%s' --data 'text:%s' --steps 30 --batch 8 --lr 3e-3 --warmup 5 "
             "--seed 7", cfg, text);
    snprintf(args, sizeof args, "%s --log '%s' --save-every 12 --save '%s'", common, check_tmp_path("full.jsonl"),
             check_tmp_path("ck-{step}.safetensors"));
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "exit %d:\n%s", rc, out);
    CHECK(access(check_tmp_path("ck-12.safetensors"), R_OK) == 0 && access(check_tmp_path("ck-24.safetensors"), R_OK) == 0
          && access(check_tmp_path("ck-30.safetensors"), R_OK) == 0, "checkpoints at 12, 24 and the end:\n%s", out);
    snprintf(args, sizeof args, "%s --log '%s' --resume '%s'", common, check_tmp_path("resumed.jsonl"),
             check_tmp_path("ck-12.safetensors"));
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "continuing after step 12"), "exit %d:\n%s", rc, out);
    static char full[40][128], resumed[40][128];
    int nf = read_step_lines(check_tmp_path("full.jsonl"), full, 40);
    int nr = read_step_lines(check_tmp_path("resumed.jsonl"), resumed, 40);
    CHECK(nf == 30 && nr == 18, "%d and %d step lines, expected 30 and 18", nf, nr);
    for (int i = 0; i < nr && nf == 30; i++)
        CHECK(!strcmp(full[12 + i], resumed[i]), "step %d differs:\n  %s\n  %s", 13 + i, full[12 + i], resumed[i]);

    /* Resuming under other flags is refused, naming the flag. */
    char ck[512];
    snprintf(ck, sizeof ck, "%s", check_tmp_path("ck-12.safetensors"));
    snprintf(args, sizeof args, "train --model '%s' --data 'text:%s' --steps 30 --batch 4 --seed 7 --resume '%s'", cfg, text,
             ck);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--batch 8") && strstr(out, "this one has 4"), "exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "%s --resume '%s' --steps 10", common, ck);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2, "exit %d:\n%s", rc, out); /* two --steps: the last wins, 10 < 12 */
    CHECK(strstr(out, "at step 12 already"), "%s", out);
    snprintf(args, sizeof args, "%s --resume '%s' --optimizer sgd", common, ck);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--optimizer adamw"), "exit %d:\n%s", rc, out);
    /* Another text: another vocabulary. */
    const char *other = check_tmp_path("other.txt");
    write_text(other, "ABCDEFGHIJKLMNOPQRSTUVWXYZabc\n ABCDEFGHIJKLMNOPQRSTUVWXYZabc\n ABCDEFGHIJKLMNOPQRSTUVWXYZabc");
    snprintf(args, sizeof args, "train --model '%s' --data 'text:%s' --steps 3 --batch 1 --init '%s'", cfg, other, ck);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "vocabulary mismatch"), "exit %d:\n%s", rc, out);
    /* A truncated checkpoint. */
    const char *cut = check_tmp_path("cut.safetensors");
    FILE *in = fopen(ck, "rb"), *o = fopen(cut, "wb");
    char buf[4096];
    size_t got = in ? fread(buf, 1, sizeof buf, in) : 0;
    if (o) fwrite(buf, 1, got / 2, o), fclose(o);
    if (in) fclose(in);
    snprintf(args, sizeof args, "%s --resume '%s'", common, cut);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "cut.safetensors"), "exit %d:\n%s", rc, out);
    snprintf(args, sizeof args, "%s --resume '%s' --init '%s'", common, ck, ck);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 2 && strstr(out, "--init and --resume"), "exit %d:\n%s", rc, out);
}

/* ---- PyTorch ------------------------------------------------------------------------------ */

/* Runs a command, output into out; returns the exit status. */
static int run_cmd(const char *cmd, char *out, size_t n) {
    char full[4096];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p) return -1;
    size_t k = 0, got;
    while (k + 1 < n && (got = fread(out + k, 1, n - 1 - k, p)) > 0) k += got;
    out[k] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Loads an adtrain checkpoint of `cfg` in C, runs the forward on `n_in` input values and writes
 * REF (inputs and logits) for scripts/torch_ckpt.py. */
static int write_reference(const char *ckpt, const char *ref, const adt_model_cfg *cfg, int batch) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    if (adt_model_build(g, cfg, batch, &io)) return -1;
    adt_graph_mark_output(g, io.logits);
    adt_exec *ex = NULL;
    adt_exec_opts eo = {.seed = 99};
    if (adt_exec_create(&ex, g, &eo)) return -1;
    adt_st_file *f = NULL;
    int rc = adt_st_open(&f, ckpt);
    if (!rc) rc = adt_ckpt_load(f, g, exec_data, ex, 0);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    adt_st_close(f);
    const adt_value *in = &g->values[io.input];
    int64_t n_in = adt_shape_prod(&in->shape, 0, in->shape.ndim);
    int dlrm = cfg->type == ADT_MODEL_DLRM;
    if (in->dtype == ADT_I32) {
        int32_t *ids = adt_exec_data(ex, io.input);
        for (int64_t i = 0; i < n_in; i++) ids[i] = (int32_t)((i * 7 + 3) % cfg->gpt.vocab_size);
    } else {
        float *x = adt_exec_data(ex, io.input);
        for (int64_t i = 0; i < n_in; i++) x[i] = adt_rng_normal(adt_rng_key(5, "ref"), (uint64_t)i);
    }
    if (dlrm) { /* column t: rows of table t */
        int32_t *ids = adt_exec_data(ex, io.input2);
        int T = cfg->dlrm.n_tables;
        for (int b = 0; b < batch; b++)
            for (int t = 0; t < T; t++) ids[b * T + t] = (b * 31 + t * 7 + 1) % cfg->dlrm.table_rows[t];
    }
    memset(adt_exec_data(ex, io.label), 0, 4); /* labels do not change logits */
    if (!rc) rc = adt_exec_run_forward(ex);
    const adt_value *lg = &g->values[io.logits];
    adt_st_writer *w = adt_st_writer_create();
    const char *in_name = in->dtype == ADT_I32 ? "input.ids" : dlrm ? "input.dense" : "input.x";
    adt_st_writer_add(w, in_name, in->dtype == ADT_I32 ? ADT_ST_I32 : ADT_ST_F32, in->shape.ndim, in->shape.dim,
                      adt_exec_data(ex, io.input));
    if (dlrm) {
        const adt_value *in2 = &g->values[io.input2];
        adt_st_writer_add(w, "input.ids", ADT_ST_I32, in2->shape.ndim, in2->shape.dim, adt_exec_data(ex, io.input2));
    }
    adt_st_writer_add(w, "expect.logits", ADT_ST_F32, lg->shape.ndim, lg->shape.dim, adt_exec_data(ex, io.logits));
    if (!rc) rc = adt_st_writer_save(w, ref);
    adt_st_writer_free(w);
    adt_exec_free(ex);
    adt_graph_free(g);
    return rc;
}

static void check_torch_logits(const char *label, const char *train_args, const char *cfg_json, int batch) {
    char args[2048], out[16384], cmd[2048];
    const char *ck = check_tmp_path("torch.safetensors");
    snprintf(args, sizeof args, "%s --save '%s'", train_args, ck);
    int rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "%s: exit %d:\n%s", label, rc, out);
    adt_model_cfg cfg;
    CHECK(adt_model_cfg_parse(&cfg, cfg_json, label) == ADT_OK, "%s", adt_error_message());
    const char *ref = check_tmp_path("ref.safetensors");
    CHECK(write_reference(ck, ref, &cfg, batch) == 0, "%s: reference: %s", label, adt_error_message());
    snprintf(cmd, sizeof cmd, PYTHON " scripts/torch_ckpt.py logits '%s' '%s' --tol 2e-6", ck, ref);
    rc = run_cmd(cmd, out, sizeof out);
    CHECK(rc == 0 && strstr(out, "max_rel_err"), "%s: PyTorch disagrees (exit %d): %s", label, rc, out);
    if (getenv("CHECK_VERBOSE")) fprintf(stderr, "  %s: %s", label, out);
}

static void test_torch_loads_checkpoint(void) {
    char text[512];
    write_corpus(text, "t.txt", 4000);
    char cfg[256], json[256], args[1024];
    snprintf(json, sizeof json, "{\"type\":\"gpt\",\"vocab_size\":%d,\"n_ctx\":16,\"n_layer\":2,\"n_embd\":32,"
             "\"n_head\":4}", distinct_bytes(text));
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("g.json"));
    write_text(cfg, json);
    snprintf(args, sizeof args, "train --model '%s' --data 'text:%s' --steps 5 --batch 4", cfg, text);
    check_torch_logits("gpt", args, json, 3);
    const char *mjson = "{\"type\":\"mlp\",\"sizes\":[784,64,32,10],\"activation\":\"gelu\"}";
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("m.json"));
    write_text(cfg, mjson);
    snprintf(args, sizeof args, "train --model '%s' --data synthetic:mlp --steps 5 --batch 8", cfg);
    check_torch_logits("mlp", args, mjson, 5);
    const char *vjson = "{\"type\":\"vgg\",\"in_channels\":3,\"height\":12,\"width\":10,\"blocks\":[[4,6],[8]],"
                        "\"fc\":[16],\"classes\":5}";
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("v.json"));
    write_text(cfg, vjson);
    snprintf(args, sizeof args, "train --model '%s' --data synthetic:vgg --steps 3 --batch 4", cfg);
    check_torch_logits("vgg", args, vjson, 3);
    const char *djson = "{\"type\":\"dlrm\",\"n_dense\":13,\"n_tables\":26,\"table_rows\":50,\"emb_dim\":4,"
                        "\"bottom\":[16,4],\"top\":[16,1]}";
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("d.json"));
    write_text(cfg, djson);
    snprintf(args, sizeof args, "train --model '%s' --data synthetic:dlrm --steps 5 --batch 16", cfg);
    check_torch_logits("dlrm", args, djson, 6);
}

static void test_torch_init_trajectory(void) {
    char text[512], init[512];
    write_corpus(text, "traj.txt", 6000);
    char cfg[256], json[256], cmd[2048], out[16384];
    snprintf(json, sizeof json, "{\"type\":\"gpt\",\"vocab_size\":%d,\"n_ctx\":32,\"n_layer\":2,\"n_embd\":48,"
             "\"n_head\":4}", distinct_bytes(text));
    snprintf(cfg, sizeof cfg, "%s", check_tmp_path("traj.json"));
    write_text(cfg, json);
    snprintf(init, sizeof init, "%s", check_tmp_path("hf_init.safetensors"));
    snprintf(cmd, sizeof cmd, PYTHON " scripts/torch_ckpt.py init-traj '%s' '%s' '%s' --batch 4 --steps 10 --lr 0.1",
             cfg, text, init);
    int rc = run_cmd(cmd, out, sizeof out);
    CHECK(rc == 0 && out[0] == '[', "init-traj exit %d: %s", rc, out);
    double want[10];
    int n = 0;
    for (char *p = out + 1; n < 10 && *p && *p != ']'; n++) want[n] = strtod(p, &p), p += (*p == ',');
    CHECK(n == 10, "10 PyTorch losses, got %d: %s", n, out);
    char args[2048];
    const char *log = check_tmp_path("traj.jsonl");
    snprintf(args, sizeof args, "train --model '%s' --data 'text:%s' --init '%s' --optimizer sgd --lr 0.1 "
             "--schedule constant --shuffle off --steps 10 --batch 4 --log '%s'", cfg, text, init, log);
    rc = run_adtrain(args, out, sizeof out);
    CHECK(rc == 0, "exit %d:\n%s", rc, out);
    double got[16];
    int n_eval, m = read_losses(log, got, 16, &n_eval);
    CHECK(m == 10, "%d losses logged", m);
    double worst = 0;
    for (int i = 0; i < m && i < n; i++) {
        double r = fabs(got[i] - want[i]) / fabs(want[i]);
        if (r > worst) worst = r;
    }
    CHECK(worst <= 1e-4, "worst relative loss difference %.3g over 10 SGD steps (first %.7f vs %.7f)", worst, got[0],
          want[0]);
    CHECK(want[9] < want[0] - 0.1, "the run must learn: %.4f -> %.4f", want[0], want[9]);
    if (getenv("CHECK_VERBOSE")) fprintf(stderr, "  trajectory: worst relative difference %.3g\n", worst);
}

int main(void) {
    cli_find_binary();
    if (check_tmpdir_make("ckpt")) return 1;
    RUN(test_roundtrip);
    RUN(test_load_refusals);
    RUN(test_gpt_file_shapes);
    RUN(test_resume_bit_exact);
    RUN(test_torch_loads_checkpoint);
    RUN(test_torch_init_trajectory);
    char cmd[600];
    snprintf(cmd, sizeof cmd, getenv("KEEP_TMP") ? "true %s" : "rm -rf '%s'", check_tmpdir());
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", check_tmpdir());
    return check_finish();
}
