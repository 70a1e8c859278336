/*
 * test_plan_file.c - plan files: expert plans of every model family and strategy written, read
 * back (parse, build the graph the plan names, bind) and compared field by field with the
 * original, and written again to the same text; layers of equal structure and layouts share
 * one entry; and every malformed file (bad JSON, wrong types, ranges, names, structure, layouts
 * that do not fit the graph) is refused with a message naming the file, the field and what was
 * expected.
 */
#include <cJSON.h>
#include <stdint.h>

#include "adtrain/adtrain.h"
#include "check.h"

#define BATCH 6

static const char *const configs[] = {
    "{\"type\":\"gpt\",\"vocab_size\":65,\"n_ctx\":16,\"n_layer\":4,\"n_embd\":32,\"n_head\":4}",
    "{\"type\":\"mlp\",\"sizes\":[9,11,13,5],\"activation\":\"relu\"}",
    "{\"type\":\"vgg\",\"in_channels\":2,\"height\":8,\"width\":8,\"blocks\":[[4],[6]],\"fc\":[10],\"classes\":5}",
    "{\"type\":\"dlrm\",\"n_dense\":5,\"table_rows\":[7,9,11],\"emb_dim\":4,\"bottom\":[6,4],\"top\":[8,1]}",
};

/* The expert plan of `strategy` for config c at BATCH * micro; the graph in *g. */
static int expert(const char *cfg, const char *strategy, int devices, int micro, adt_optim_cfg oc, adt_graph **g,
                  adt_plan *p) {
    adt_model_cfg m;
    CHECK(adt_model_cfg_parse(&m, cfg, "cfg") == ADT_OK, "%s", adt_error_message());
    *g = adt_graph_create();
    adt_model_io io;
    adt_model_build(*g, &m, BATCH, &io);
    adt_graph_backward(*g, io.loss);
    adt_graph_optimizer(*g, &oc);
    adt_expert_opts o = {.strategy = strategy, .devices = devices, .batch = BATCH * micro, .microbatches = micro};
    int rc = adt_expert_plan(*g, &m, &o, p);
    CHECK(rc == ADT_OK, "%s on %d: %s", strategy, devices, adt_error_message());
    return rc;
}

static int sig_equal(const adt_nd_sig *a, const adt_nd_sig *b, const adt_node *n) {
    for (int i = 0; i < n->n_in; i++)
        if (!adt_ndsbp_equal(&a->in[i], &b->in[i])) return 0;
    for (int k = 0; k < n->n_out; k++)
        if (!adt_ndsbp_equal(&a->out[k], &b->out[k])) return 0;
    return 1;
}

/* ---- round trips ------------------------------------------------------------------------------- */

static void test_round_trip(void) {
    static const struct { const char *strategy; int devices, micro; } st[] = {
        {"dp", 2, 1}, {"zero", 3, 1}, {"tp", 2, 1}, {"dp=2,tp=2,zero", 4, 1}, {"dp=2,pp=2", 4, 2}, {"pp=2,tp=2", 4, 3},
    };
    int trips = 0;
    size_t bytes = 0;
    check_tmpdir_make("plan");
    for (int c = 0; c < 4; c++)
        for (size_t s = 0; s < sizeof st / sizeof st[0]; s++) {
            adt_graph *g;
            adt_plan p;
            adt_optim_cfg oc = c == 1 ? adt_optim_sgd(0.9f, 0) : c == 2 ? adt_optim_sgd(0, 0) : adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0);
            if (expert(configs[c], st[s].strategy, st[s].devices, st[s].micro, oc, &g, &p)) {
                adt_graph_free(g);
                continue;
            }
            const char *path = check_tmp_path("plan.json");
            CHECK(adt_plan_save(&p, g, path) == ADT_OK, "%s", adt_error_message());
            char *text = adt_plan_to_json(&p, g);
            bytes += strlen(text);
            adt_plan q;
            int rc = adt_plan_load(&q, path);
            CHECK(rc == ADT_OK, "%s %s: %s", configs[c], st[s].strategy, adt_error_message());
            adt_graph *g2 = NULL;
            if (!rc) rc = adt_plan_build_graph(&q, NULL, &g2);
            CHECK(rc == ADT_OK, "%s", adt_error_message());
            if (!rc) rc = adt_plan_bind(&q, g2);
            CHECK(rc == ADT_OK, "%s %s: bind: %s", configs[c], st[s].strategy, adt_error_message());
            if (!rc) {
                char *m1 = adt_model_cfg_to_json(&p.model), *m2 = adt_model_cfg_to_json(&q.model);
                CHECK(!strcmp(m1, m2) && p.batch == q.batch && p.microbatches == q.microbatches && p.optim == q.optim &&
                          p.momentum == q.momentum && !strcmp(p.strategy, q.strategy),
                      "%s: what the plan is for differs after the round trip", st[s].strategy);
                free(m1);
                free(m2);
                CHECK(p.mesh.ndim == q.mesh.ndim && p.mesh.nranks == q.mesh.nranks && p.mesh.intra_axis == q.mesh.intra_axis &&
                          p.pp_axis == q.pp_axis && p.n_stages == q.n_stages,
                      "%s: mesh or stages differ", st[s].strategy);
                for (int a = 0; a < p.mesh.ndim; a++)
                    CHECK(p.mesh.dim[a] == q.mesh.dim[a] && !strcmp(p.axis[a], q.axis[a]), "%s: axis %d", st[s].strategy, a);
                for (int i = 0; i < p.mesh.nranks; i++) CHECK(p.mesh.ranks[i] == q.mesh.ranks[i], "rank %d", i);
                for (int k = 0; k < p.n_stages; k++)
                    CHECK(p.stage_first[k] == q.stage_first[k] && p.stage_last[k] == q.stage_last[k], "stage %d", k);
                for (int a = 0; a < ADT_MAX_MESH_DIMS; a++)
                    CHECK(p.cost.alpha[a] == q.cost.alpha[a] || a >= p.mesh.ndim - (p.pp_axis >= 0), "cost alpha %d", a);
                int diff = 0;
                for (int i = 0; i < g->n_nodes; i++) diff += !sig_equal(&p.node_sig[i], &q.node_sig[i], &g->nodes[i]);
                for (int v = 0; v < g->n_values; v++) diff += !adt_ndsbp_equal(&p.leaf_sbp[v], &q.leaf_sbp[v]);
                CHECK(diff == 0, "%s %s: %d layouts differ after the round trip", configs[c], st[s].strategy, diff);
                char *again = adt_plan_to_json(&q, g2);
                CHECK(!strcmp(text, again), "%s %s: written again, the text differs", configs[c], st[s].strategy);
                free(again);
                trips++;
            }
            free(text);
            adt_graph_free(g2);
            adt_plan_free(&q);
            adt_plan_free(&p);
            adt_graph_free(g);
        }
    check_tmpdir_remove((const char *[]){"plan.json"}, 1);
    printf("plan files: %d round trips (4 families x 6 strategies), %zu bytes of JSON in all\n", trips, bytes);
    CHECK(trips == 24, "%d round trips", trips);
}

/* Layers of one structure and one layout share an entry: a 4-block GPT's blocks 1-3 are one
 * entry (block 4 has one node less: its output has a single reader, so no gradient sum). */
static void test_tied_layers(void) {
    adt_graph *g;
    adt_plan p;
    if (expert(configs[0], "dp=2,tp=2", 4, 1, adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0), &g, &p)) return;
    char *text = adt_plan_to_json(&p, g);
    cJSON *j = cJSON_Parse(text);
    const cJSON *lay = cJSON_GetObjectItem(j, "layouts");
    int entries = cJSON_GetArraySize(lay), listed = 0, tied = 0;
    for (const cJSON *e = lay->child; e; e = e->next) {
        int n = cJSON_GetArraySize(cJSON_GetObjectItem(e, "layers"));
        listed += n;
        if (n > 1) tied = n;
    }
    int groups[64];
    adt_plan_layer_groups(&p, g, groups);
    CHECK(listed == p.n_layers && entries < p.n_layers && tied == 3 && groups[2] == 1 && groups[3] == 1 && groups[4] == 4,
          "%d entries for %d layers, %d tied (groups %d %d %d)", entries, p.n_layers, tied, groups[2], groups[3], groups[4]);
    printf("plan files: gpt of 4 blocks, dp=2,tp=2: %d layout entries for %d layers, %zu bytes\n", entries, p.n_layers,
           strlen(text));
    cJSON_Delete(j);
    free(text);
    adt_plan_free(&p);
    adt_graph_free(g);
}

/* ---- malformed files ---------------------------------------------------------------------------- */

/* The object at a dotted path ("mesh", "layouts.1.nodes"); numbers index arrays. */
static cJSON *at(cJSON *root, const char *path) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    cJSON *j = root;
    for (char *save = NULL, *tok = strtok_r(buf, ".", &save); tok && j; tok = strtok_r(NULL, ".", &save))
        j = (tok[0] >= '0' && tok[0] <= '9') ? cJSON_GetArrayItem(j, atoi(tok)) : cJSON_GetObjectItem(j, tok);
    return j;
}

/* Sets field `key` of the object at `path` to JSON `value` (NULL deletes it). */
static void set(cJSON *root, const char *path, const char *key, const char *value) {
    cJSON *o = path[0] ? at(root, path) : root;
    if (!o) return;
    if (cJSON_IsArray(o)) {
        cJSON_ReplaceItemInArray(o, atoi(key), cJSON_Parse(value));
        return;
    }
    cJSON_DeleteItemFromObject(o, key);
    if (value) cJSON_AddItemToObject(o, key, cJSON_Parse(value));
}

/* Renames the first (k = 0) or k-th entry of an object. */
static void rename_entry(cJSON *root, const char *path, int k, const char *name) {
    cJSON *o = at(root, path), *e = o ? cJSON_GetArrayItem(o, k) : NULL;
    if (!e) return;
    cJSON *copy = cJSON_Duplicate(e, 1);
    cJSON_DeleteItemFromObject(o, e->string);
    cJSON_AddItemToObject(o, name, copy);
}

/* The name of the first node entry of layouts[gi] whose op name starts with `op`. */
static const char *node_named(cJSON *root, int gi, const char *op) {
    char path[64];
    snprintf(path, sizeof path, "layouts.%d.nodes", gi);
    for (cJSON *e = at(root, path)->child; e; e = e->next)
        if (!strncmp(e->string, op, strlen(op))) return e->string;
    return "?";
}

typedef void (*mutate_fn)(cJSON *root);

static void m_format(cJSON *r) { set(r, "", "format", "\"adtrain-plan2\""); }
static void m_version(cJSON *r) { set(r, "", "version", "2"); }
static void m_unknown(cJSON *r) { set(r, "", "meshes", "{}"); }
static void m_no_mesh(cJSON *r) { set(r, "", "mesh", NULL); }
static void m_model_type(cJSON *r) { set(r, "model", "n_head", "\"4\""); }
static void m_model_layers(cJSON *r) { set(r, "model", "n_layer", "3"); }
static void m_batch(cJSON *r) { set(r, "", "batch", "0"); }
static void m_micro(cJSON *r) { set(r, "", "microbatches", "4"); }
static void m_optim(cJSON *r) { set(r, "", "optimizer", "\"adam\""); }
static void m_optim_kind(cJSON *r) { set(r, "", "optimizer", "\"sgd\""); }
static void m_shape(cJSON *r) { set(r, "mesh", "shape", "[2,3]"); }
static void m_shape0(cJSON *r) { set(r, "mesh", "shape", "[0,2]"); }
static void m_axes(cJSON *r) { set(r, "mesh", "axes", "[\"dp\",\"dp\"]"); }
static void m_axes_n(cJSON *r) { set(r, "mesh", "axes", "[\"dp\"]"); }
static void m_ranks(cJSON *r) { set(r, "mesh", "ranks", "[0,1,1,3]"); }
static void m_ranks_big(cJSON *r) { set(r, "mesh", "ranks", "[0,1,2,7]"); }
static void m_intra(cJSON *r) { set(r, "mesh", "intra_axis", "\"xx\""); }
static void m_pipe_axis(cJSON *r) { set(r, "", "pipeline", "{\"axis\":\"pp\",\"stages\":[[0,2],[3,5]]}"); }
static void m_stage_gap(cJSON *r) { set(r, "", "pipeline", "{\"axis\":\"dp\",\"stages\":[[0,1],[3,5]]}"); }
static void m_stage_short(cJSON *r) { set(r, "", "pipeline", "{\"axis\":\"dp\",\"stages\":[[0,1],[2,4]]}"); }
static void m_checksum(cJSON *r) { set(r, "graph", "checksum", "\"xyz\""); }
static void m_checksum_val(cJSON *r) { set(r, "graph", "checksum", "\"00000000\""); }
static void m_nodes(cJSON *r) { set(r, "graph", "nodes", "17"); }
static void m_alpha(cJSON *r) { set(r, "cost", "alpha", "[1e-5]"); }
static void m_beta(cJSON *r) { set(r, "cost", "beta", "[1e-9,\"x\"]"); }
static void m_layouts(cJSON *r) { set(r, "", "layouts", "{}"); }
static void m_layer_range(cJSON *r) { set(r, "layouts.0", "layers", "[99]"); }
static void m_layer_twice(cJSON *r) { set(r, "layouts.2", "layers", "[3]"); }
static void m_layer_shape(cJSON *r) { set(r, "layouts.1", "layers", "[1,2,3,4]"); }
static void m_node_name(cJSON *r) { rename_entry(r, "layouts.1.nodes", 0, "matmul_999"); }
static void m_node_missing(cJSON *r) {
    cJSON *o = at(r, "layouts.1.nodes");
    cJSON_DeleteItemFromObject(o, node_named(r, 1, "matmul"));
}
/* Sets the signature of layer 1's first matmul. */
static void set_matmul(cJSON *r, const char *value) {
    char key[96];
    snprintf(key, sizeof key, "%s", node_named(r, 1, "matmul"));
    set(r, "layouts.1.nodes", key, value);
}
static void m_sig_arity(cJSON *r) { set_matmul(r, "\"(B,B)\""); }
static void m_sig_token(cJSON *r) { set_matmul(r, "\"(Q,B) (B,B) -> (B,B)\""); }
/* a matmul whose row split claims a whole output */
static void m_sig_unregistered(cJSON *r) { set_matmul(r, "\"(B,S(2)) (B,S(0)) -> (B,B)\""); }
static void m_sig_type(cJSON *r) { set_matmul(r, "7"); }
static void m_leaf_name(cJSON *r) { rename_entry(r, "layouts.1.leaves", 0, "h.0.nope"); }
static void m_leaf_axis(cJSON *r) { set(r, "layouts.1.leaves", "h.0.attn.c_attn.weight", "\"(B,S(5))\""); }
static void m_leaf_partial(cJSON *r) { set(r, "layouts.1.leaves", "h.0.ln_1.weight", "\"(P,B)\""); }
static void m_leaf_inplace(cJSON *r) { set(r, "layouts.1.leaves", "h.0.ln_1.weight", "\"(B,S(0))\""); }
static void m_strategy(cJSON *r) { set(r, "", "strategy", "7"); }

typedef struct bad_case {
    const char *what;
    mutate_fn fn;
    const char *want; /* in the message, after "plan.json: " */
} bad_case;

static const bad_case bad[] = {
    {"format", m_format, "field \"format\" is \"adtrain-plan2\", expected \"adtrain-plan\""},
    {"version", m_version, "field \"version\" is 2, expected an integer in [1, 1]"},
    {"unknown field", m_unknown, "unknown field \"meshes\" for type \"plan\" (did you mean \"mesh\"?)"},
    {"no mesh", m_no_mesh, "missing field \"mesh\" (expected an object)"},
    {"model field type", m_model_type, "plan.json: model: field \"n_head\" is a string, expected an integer"},
    {"model differs", m_model_layers, "field \"graph\": the plan is for a graph of"},
    {"batch", m_batch, "field \"batch\" is 0, expected an integer in [1, 16777216]"},
    {"microbatches", m_micro, "field \"microbatches\" is 4, expected a divisor of \"batch\" (6)"},
    {"optimizer", m_optim, "field \"optimizer\" is \"adam\", expected \"adamw\", \"sgd\" or \"sgd-momentum\""},
    {"optimizer kind", m_optim_kind, "field \"graph\": the plan is for a graph of"},
    {"mesh shape", m_shape, "field \"mesh.ranks\" is an array, expected an array of 6 global ranks"},
    {"mesh shape 0", m_shape0, "field \"mesh.shape[0]\" is 0, expected an integer in [1, 1048576]"},
    {"mesh axes repeated", m_axes, "field \"mesh.axes[1]\" is invalid or repeated, expected a new name"},
    {"mesh axes count", m_axes_n, "field \"mesh.axes\" is an array, expected an array of 2 axis names"},
    {"mesh ranks repeated", m_ranks, "field \"mesh.ranks[2]\" is 1, expected each of 0..3 exactly once"},
    {"mesh ranks range", m_ranks_big, "field \"mesh.ranks[3]\" is 7, expected an integer in [0, 3]"},
    {"intra axis", m_intra, "field \"mesh.intra_axis\" is \"xx\", expected the name of a mesh axis (\"dp\", \"tp\")"},
    {"pipeline axis", m_pipe_axis, "field \"pipeline.axis\" is \"pp\", expected the name of a mesh axis"},
    {"stage gap", m_stage_gap, "field \"pipeline.stages[1]\" is layers [3, 5], expected a non-empty range starting at 2"},
    {"stage short", m_stage_short, "field \"pipeline.stages[1]\" is layers [2, 4], expected a non-empty range starting at "
                                   "2 and ending at the last layer"},
    {"checksum form", m_checksum, "field \"graph.checksum\" is \"xyz\", expected 8 hex digits"},
    {"checksum value", m_checksum_val, "field \"graph.checksum\" is 00000000, this graph's is"},
    {"node count", m_nodes, "field \"graph\": the plan is for a graph of 17 nodes"},
    {"cost alpha", m_alpha, "field \"cost.alpha\" has 1 entries, expected 2 to 2"},
    {"cost beta", m_beta, "field \"cost.beta[1]\" is a string, expected a number in [0, 1000]"},
    {"layouts", m_layouts, "field \"layouts\" is an object, expected a non-empty array"},
    {"layer range", m_layer_range, "field \"layouts[0].layers[0]\" is 99, expected an integer in [0, 5]"},
    {"layer twice", m_layer_twice, "field \"layouts[2].layers\": layer 3 has layouts already"},
    {"layer structure", m_layer_shape, "field \"layouts[1].layers\": layer 4 cannot share layer 1's layouts: layer 4 has"},
    {"node name", m_node_name, "field \"layouts[1].nodes.matmul_999\": no node of that name in layer 1"},
    {"node missing", m_node_missing, "field \"layouts\": no signature for node matmul_"},
    {"signature arity", m_sig_arity, "1 input and 0 output nd-SBP(s) and no '->', expected 2 input nd-SBP(s), '->', "
                                     "then 1 output"},
    {"signature token", m_sig_token, "input 0 ('"},
    {"signature unregistered", m_sig_unregistered, "mesh axis 1 is not a signature of op matmul"},
    {"signature type", m_sig_type, "is a number, expected a signature string"},
    {"leaf name", m_leaf_name, "field \"layouts[1].leaves.h.0.nope\": no leaf of that name in layer 1"},
    {"leaf axis", m_leaf_axis, "field \"layouts[1].leaves.h.0.attn.c_attn.weight\": nd-SBP '(B,S(5))': entry 1 splits axis "
                               "5 of a rank-3 tensor"}, /* held as [C,3,C] */
    {"leaf partial", m_leaf_partial, "leaf 'h.0.ln_1.weight' [32] cannot be held as (P,B)"},
    {"leaf in place", m_leaf_inplace, "updates 'h.0.ln_1.weight' in place as (B,B), but the plan holds it as (B,S(0))"},
    {"strategy", m_strategy, "field \"strategy\" is a number, expected a string"},
};

/* Parse, build the plan's graph, bind: the first failure's code (ADT_OK when all pass). */
static int load_all(const char *text, adt_plan *p) {
    int rc = adt_plan_parse(p, text, "plan.json");
    adt_graph *g = NULL;
    if (!rc) rc = adt_plan_build_graph(p, NULL, &g);
    if (!rc) rc = adt_plan_bind(p, g);
    adt_graph_free(g);
    adt_plan_free(p);
    return rc;
}

static void test_malformed(void) {
    adt_graph *g;
    adt_plan p;
    if (expert(configs[0], "dp=2,tp=2", 4, 1, adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0), &g, &p)) return;
    char *good = adt_plan_to_json(&p, g);
    adt_plan q;
    CHECK(load_all(good, &q) == ADT_OK, "the unchanged file: %s", adt_error_message());
    int refused = 0;
    for (size_t c = 0; c < sizeof bad / sizeof bad[0]; c++) {
        cJSON *root = cJSON_Parse(good);
        bad[c].fn(root);
        char *text = cJSON_Print(root);
        cJSON_Delete(root);
        int rc = load_all(text, &q);
        const char *msg = adt_error_message();
        int ok = rc != ADT_OK && !strncmp(msg, "plan.json: ", 11) && strstr(msg, bad[c].want);
        CHECK(ok, "%s: rc %d, message '%s', expected it to contain '%s'", bad[c].what, rc, msg, bad[c].want);
        refused += ok;
        free(text);
    }
    /* not JSON, not an object, empty, a NUL inside, no such file */
    CHECK(load_all("{\"format\": ", &q) == ADT_ERR_FORMAT && strstr(adt_error_message(), "plan.json: invalid JSON"), "%s",
          adt_error_message());
    CHECK(load_all("[1,2]", &q) == ADT_ERR_FORMAT && strstr(adt_error_message(), "plan.json: expected a JSON object at the "
                                                                                "top level, got an array"),
          "%s", adt_error_message());
    CHECK(load_all("  ", &q) == ADT_ERR_FORMAT && strstr(adt_error_message(), "plan.json: empty"), "%s", adt_error_message());
    CHECK(adt_plan_load(&q, "/nonexistent/plan.json") == ADT_ERR_IO &&
              strstr(adt_error_message(), "/nonexistent/plan.json: cannot open plan file"),
          "%s", adt_error_message());
    check_tmpdir_make("plan_nul");
    const char *path = check_tmp_path("nul.json");
    FILE *f = fopen(path, "wb");
    fwrite("{\"a\":\0}", 1, 7, f);
    fclose(f);
    CHECK(adt_plan_load(&q, path) == ADT_ERR_FORMAT && strstr(adt_error_message(), "NUL byte at offset 5"), "%s",
          adt_error_message());
    check_tmpdir_remove((const char *[]){"nul.json"}, 1);
    /* a plan for another model or batch than the run's */
    CHECK(adt_plan_parse(&q, good, "plan.json") == ADT_OK, "%s", adt_error_message());
    adt_model_cfg other;
    adt_model_cfg_parse(&other, configs[1], "cfg");
    CHECK(adt_plan_check_model(&q, &q.model, BATCH) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_plan_check_model(&q, &other, BATCH) == ADT_ERR_ARG && strstr(adt_error_message(), "field \"model\": the plan "
                                                                                                "is for {\"type\":\"gpt\""),
          "%s", adt_error_message());
    CHECK(adt_plan_check_model(&q, &q.model, 2 * BATCH) == ADT_ERR_ARG &&
              strstr(adt_error_message(), "field \"batch\": the plan is for a global batch of 6, the run's is 12"),
          "%s", adt_error_message());
    adt_optim_cfg sgd = adt_optim_sgd(0, 0);
    adt_graph *g2;
    CHECK(adt_plan_build_graph(&q, &sgd, &g2) == ADT_ERR_ARG &&
              strstr(adt_error_message(), "field \"optimizer\": the plan is for adamw, the run uses sgd"),
          "%s", adt_error_message());
    adt_plan_free(&q);
    printf("plan files: %d of %zu malformed files refused with the field and what was expected\n", refused,
           sizeof bad / sizeof bad[0]);
    free(good);
    adt_plan_free(&p);
    adt_graph_free(g);
}

/* A hand-written plan: data parallel for the MLP in its most compact form (no cost, no
 * pipeline, leaves left to the partitioner's default), bound and run through the validator. */
static void test_hand_written(void) {
    adt_graph *g;
    adt_plan p;
    if (expert(configs[1], "dp", 2, 1, adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0), &g, &p)) return;
    char *text = adt_plan_to_json(&p, g);
    cJSON *root = cJSON_Parse(text);
    cJSON_DeleteItemFromObject(root, "cost");
    cJSON_DeleteItemFromObject(root, "strategy");
    cJSON_DeleteItemFromObject(root, "microbatches");
    for (cJSON *e = cJSON_GetObjectItem(root, "layouts")->child; e; e = e->next) cJSON_DeleteItemFromObject(e, "leaves");
    char *small = cJSON_Print(root);
    cJSON_Delete(root);
    adt_plan q;
    int rc = adt_plan_parse(&q, small, "hand.json");
    adt_graph *g2 = NULL;
    if (!rc) rc = adt_plan_build_graph(&q, NULL, &g2);
    if (!rc) rc = adt_plan_bind(&q, g2);
    CHECK(rc == ADT_OK, "%s", adt_error_message());
    if (!rc) {
        CHECK(q.microbatches == 1 && q.cost.alpha[0] > 0 && !q.strategy[0], "defaults");
        int ranks[8];
        adt_dist_plan dp = adt_plan_dist(&q, 0, ranks);
        adt_dist_local a, b;
        adt_dist_plan dp0 = adt_plan_dist(&p, 0, ranks);
        CHECK(adt_dist_partition(g2, &dp, (int[]){1}, &a) == ADT_OK, "%s", adt_error_message());
        CHECK(adt_dist_partition(g, &dp0, (int[]){1}, &b) == ADT_OK, "%s", adt_error_message());
        /* the partitioner's default leaf layouts are what the expert wrote out */
        int same = a.g && b.g && a.g->n_nodes == b.g->n_nodes;
        for (int v = 0; same && v < g->n_values; v++) same = adt_ndsbp_equal(&a.layout[v], &b.layout[v]);
        CHECK(same, "the hand-written plan partitions differently");
        adt_dist_local_free(&a);
        adt_dist_local_free(&b);
    }
    adt_graph_free(g2);
    adt_plan_free(&q);
    free(small);
    free(text);
    adt_plan_free(&p);
    adt_graph_free(g);
}

int main(void) {
    RUN(test_round_trip);
    RUN(test_tied_layers);
    RUN(test_malformed);
    RUN(test_hand_written);
    return check_finish();
}
