/*
 * dlrm.c - the DLRM recommender (facebookresearch/dlrm, dlrm_s_pytorch.py): its JSON config
 * (fields, checks, parameter count) and its builder.
 *
 * Dense features go through the bottom MLP (ReLU after every layer, DLRM's create_mlp with no
 * sigmoid layer), each categorical feature through its own embedding table. The F = 1 + tables
 * vectors of width emb_dim interact by pairwise dot products (DLRM's "dot" interaction without
 * self-interaction: the strict lower triangle of T T^T, T = [bottom output; embeddings]); the top
 * MLP sees the bottom output followed by those F(F-1)/2 dots and ends in one logit. DLRM's final
 * sigmoid is folded into binary cross-entropy with logits, which is the same loss computed
 * without overflow.
 */
#include <math.h>
#include <stdio.h>

#include "adtrain/base.h"
#include "adtrain/models.h"
#include "models/cfg_internal.h"

static const char *const dlrm_fields[] = {"type", "n_dense", "n_tables", "table_rows", "emb_dim", "bottom", "top",
                                          NULL};

/* ---- config ------------------------------------------------------------------------------- */

/* "table_rows": [r0, r1, ...] (one per table; "n_tables" optional and then equal to its length)
 * or one number R for every table, with "n_tables" required. */
static int parse_tables(adt_dlrm_cfg *c, const cJSON *root, const char *name) {
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "table_rows");
    const cJSON *nt = cJSON_GetObjectItemCaseSensitive(root, "n_tables");
    int rc;
    if (!rows)
        return adt_error(ADT_ERR_ARG, "%s: missing field \"table_rows\" (expected an array of 1 to %d embedding table "
                         "sizes, or one size for every table together with \"n_tables\")", name, ADT_DLRM_MAX_TABLES);
    if (cJSON_IsArray(rows)) {
        if ((rc = adt_cfg_to_int_array(rows, "table_rows", 1, ADT_DLRM_MAX_TABLES, 1, CFG_MAX_ROWS,
                                       "embedding table sizes (rows)", name, c->table_rows, &c->n_tables)))
            return rc;
        if (!nt) return ADT_OK;
        int n;
        if ((rc = adt_cfg_to_int(nt, "n_tables", 1, ADT_DLRM_MAX_TABLES, name, &n))) return rc;
        if (n != c->n_tables)
            return adt_error(ADT_ERR_ARG, "%s: field \"n_tables\" is %d but \"table_rows\" lists %d tables, expected "
                             "them to agree (or no \"n_tables\")", name, n, c->n_tables);
        return ADT_OK;
    }
    if (!cJSON_IsNumber(rows))
        return adt_error(ADT_ERR_ARG, "%s: field \"table_rows\" is %s, expected an array of embedding table sizes or "
                         "one size for every table", name, adt_cfg_json_kind(rows));
    int r;
    if ((rc = adt_cfg_to_int(rows, "table_rows", 1, CFG_MAX_ROWS, name, &r))) return rc;
    if (!nt)
        return adt_error(ADT_ERR_ARG, "%s: missing field \"n_tables\" (\"table_rows\" is one size for every table, so "
                         "expected the number of tables, an integer in [1, %d])", name, ADT_DLRM_MAX_TABLES);
    if ((rc = adt_cfg_to_int(nt, "n_tables", 1, ADT_DLRM_MAX_TABLES, name, &c->n_tables))) return rc;
    for (int t = 0; t < c->n_tables; t++) c->table_rows[t] = r;
    return ADT_OK;
}

int adt_cfg_parse_dlrm(adt_dlrm_cfg *c, const cJSON *root, const char *name) {
    int rc;
    if ((rc = adt_cfg_check_fields(root, dlrm_fields, "dlrm", name))) return rc;
    if ((rc = adt_cfg_get_int(root, "n_dense", 1, CFG_MAX_WIDTH, name, &c->n_dense))) return rc;
    if ((rc = parse_tables(c, root, name))) return rc;
    if ((rc = adt_cfg_get_int(root, "emb_dim", 1, CFG_MAX_EMBD, name, &c->emb_dim))) return rc;
    if ((rc = adt_cfg_get_int_array(root, "bottom", 1, ADT_DLRM_MAX_LAYERS, 1, CFG_MAX_WIDTH,
                                    "bottom MLP widths ending with emb_dim, e.g. [512, 256, 64, 16]", name, c->bottom,
                                    &c->n_bottom)))
        return rc;
    return adt_cfg_get_int_array(root, "top", 1, ADT_DLRM_MAX_LAYERS, 1, CFG_MAX_WIDTH,
                                 "top MLP widths ending with 1, e.g. [512, 256, 1]", name, c->top, &c->n_top);
}

/* Width of the top MLP's input: the bottom output and one dot per pair of the F vectors. */
static int64_t dlrm_top_in(const adt_dlrm_cfg *c) {
    int64_t F = (int64_t)c->n_tables + 1;
    return c->emb_dim + F * (F - 1) / 2;
}

static int check_widths(const int *w, int n, const char *field, const char *name) {
    if (n < 1 || n > ADT_DLRM_MAX_LAYERS)
        return adt_error(ADT_ERR_ARG, "%s: field \"%s\" has %d entries, expected 1 to %d layer widths", name, field, n,
                         ADT_DLRM_MAX_LAYERS);
    for (int i = 0; i < n; i++) {
        char what[32];
        snprintf(what, sizeof what, "%s[%d]", field, i);
        if (adt_cfg_check_range(w[i], what, 1, CFG_MAX_WIDTH, name)) return ADT_ERR_ARG;
    }
    return ADT_OK;
}

int adt_cfg_validate_dlrm(const adt_dlrm_cfg *c, const char *name) {
    if (adt_cfg_check_range(c->n_dense, "n_dense", 1, CFG_MAX_WIDTH, name) ||
        adt_cfg_check_range(c->n_tables, "n_tables", 1, ADT_DLRM_MAX_TABLES, name) ||
        adt_cfg_check_range(c->emb_dim, "emb_dim", 1, CFG_MAX_EMBD, name))
        return ADT_ERR_ARG;
    for (int t = 0; t < c->n_tables; t++) {
        char what[32];
        snprintf(what, sizeof what, "table_rows[%d]", t);
        if (adt_cfg_check_range(c->table_rows[t], what, 1, CFG_MAX_ROWS, name)) return ADT_ERR_ARG;
    }
    if (check_widths(c->bottom, c->n_bottom, "bottom", name) || check_widths(c->top, c->n_top, "top", name))
        return ADT_ERR_ARG;
    if (c->bottom[c->n_bottom - 1] != c->emb_dim)
        return adt_error(ADT_ERR_ARG, "%s: field \"bottom\" ends with %d, expected its last width to equal \"emb_dim\" "
                         "(%d): the bottom MLP's output joins the embedding vectors in the dot interaction", name,
                         c->bottom[c->n_bottom - 1], c->emb_dim);
    if (c->top[c->n_top - 1] != 1)
        return adt_error(ADT_ERR_ARG, "%s: field \"top\" ends with %d, expected 1: the top MLP's last layer gives the "
                         "click logit", name, c->top[c->n_top - 1]);
    return ADT_OK;
}

int64_t adt_cfg_params_dlrm(const adt_dlrm_cfg *c) {
    int64_t n = 0, in = c->n_dense;
    for (int i = 0; i < c->n_bottom; i++) {
        n += (in + 1) * c->bottom[i];
        in = c->bottom[i];
    }
    for (int t = 0; t < c->n_tables; t++) n += (int64_t)c->table_rows[t] * c->emb_dim;
    in = dlrm_top_in(c);
    for (int i = 0; i < c->n_top; i++) {
        n += (in + 1) * c->top[i];
        in = c->top[i];
    }
    return n;
}

/* ---- builder ------------------------------------------------------------------------------ */

/* adt_concat takes at most ADT_MAX_INPUTS values: a longer list is joined in groups, then the
 * groups. xs is overwritten. */
static int concat_many(adt_graph *g, int *xs, int n, int axis) {
    while (n > ADT_MAX_INPUTS) {
        int m = 0;
        for (int i = 0; i < n; i += ADT_MAX_INPUTS) {
            int k = n - i < ADT_MAX_INPUTS ? n - i : ADT_MAX_INPUTS;
            xs[m++] = k == 1 ? xs[i] : adt_concat(g, xs + i, k, axis); /* m <= i: read before written */
        }
        n = m;
    }
    return adt_concat(g, xs, n, axis);
}

/* rows == NULL: the tables are parameters and the ids an input; else each table's looked-up rows
 * are a parameter "ps.rows.<t>" [B,D] of their own, whose id goes to rows[t]. */
static int build_dlrm(adt_graph *g, const adt_dlrm_cfg *c, int batch, adt_model_io *io, int *rows) {
    if (g->status) return g->status;
    if (adt_cfg_validate_dlrm(c, "dlrm")) return adt_graph_fail(g, ADT_ERR_ARG, "%s", adt_error_message()), g->status;
    if (batch < 1) return adt_graph_fail(g, ADT_ERR_ARG, "dlrm: batch is %d, expected >= 1", batch), g->status;
    int B = batch, D = c->emb_dim, T = c->n_tables, tag = 1;
    adt_graph_set_layer_tag(g, 0);
    io->input = adt_input(g, "dense", ADT_F32, adt_shape_2d(B, c->n_dense));
    io->input2 = rows ? -1 : adt_input(g, "ids", ADT_I32, adt_shape_2d(B, T));
    io->label = adt_label(g, "labels", ADT_F32, adt_shape_1d(B));

    int h = io->input, in = c->n_dense;
    for (int i = 0; i < c->n_bottom; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "bot.%d", i);
        adt_graph_set_layer_tag(g, tag++);
        h = adt_relu(g, adt_layer_linear(g, h, prefix, in, c->bottom[i]));
        in = c->bottom[i];
    }
    /* [B,D] bottom output */

    int feats[ADT_DLRM_MAX_TABLES + 1];
    feats[0] = adt_reshape(g, h, adt_shape_3d(B, 1, D));
    for (int t = 0; t < T; t++) {
        char name[ADT_NAME_LEN];
        adt_graph_set_layer_tag(g, tag++); /* one tag per table: tables differ in size */
        if (rows) {
            snprintf(name, sizeof name, "ps.rows.%d", t);
            rows[t] = adt_param(g, name, adt_shape_2d(B, D), (adt_init){ADT_INIT_ZEROS, 0, 0});
            feats[t + 1] = adt_reshape(g, rows[t], adt_shape_3d(B, 1, D));
            continue;
        }
        snprintf(name, sizeof name, "emb.%d.weight", t);
        float bound = sqrtf(1.0f / (float)c->table_rows[t]);
        int table = adt_param(g, name, adt_shape_2d(c->table_rows[t], D), (adt_init){ADT_INIT_UNIFORM, -bound, bound});
        int ids = adt_slice(g, io->input2, 1, t, 1);  /* [B,1] i32: column t */
        feats[t + 1] = adt_embedding(g, ids, table); /* [B,1,D] */
    }
    adt_graph_set_layer_tag(g, tag++);
    int x = concat_many(g, feats, T + 1, 1);  /* [B,F,D] */
    int z = adt_interaction(g, x);            /* [B,F(F-1)/2] */
    h = adt_concat(g, (int[]){h, z}, 2, 1); /* [B, D + F(F-1)/2] */

    in = (int)dlrm_top_in(c);
    for (int i = 0; i < c->n_top; i++) {
        char prefix[32];
        snprintf(prefix, sizeof prefix, "top.%d", i);
        adt_graph_set_layer_tag(g, tag++);
        h = adt_layer_linear(g, h, prefix, in, c->top[i]);
        if (i + 1 < c->n_top) h = adt_relu(g, h);
        in = c->top[i];
    }
    io->logits = adt_reshape(g, h, adt_shape_1d(B)); /* [B,1] -> [B], the labels' shape */
    io->loss = adt_bce_logits(g, io->logits, io->label);
    adt_graph_set_layer_tag(g, 0);
    return g->status;
}

int adt_model_dlrm(adt_graph *g, const adt_dlrm_cfg *c, int batch, adt_model_io *io) {
    return build_dlrm(g, c, batch, io, NULL);
}

int adt_model_dlrm_ps(adt_graph *g, const adt_dlrm_cfg *c, int batch, adt_model_io *io, int *rows) {
    return build_dlrm(g, c, batch, io, rows);
}
