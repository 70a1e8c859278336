/*
 * train_state.c - a model's parameters and optimizer state to and from one safetensors file
 * (include/adtrain/ckpt.h).
 *
 * Loading is strict in both directions: every tensor the model needs must be there with its
 * exact shape, and every tensor in the file must be one the model knows (or one of the few that
 * PyTorch checkpoints carry and adtrain has no use for). A checkpoint of another model therefore
 * fails with the names that differ instead of half-loading.
 *
 * Shapes are file shapes (adt_value_file_shape): a value the graph holds with its axes regrouped
 * (GPT's c_attn.weight [C,3,C]) is written and expected in PyTorch's shape ([C,3C]); the bytes
 * are the same, row-major.
 */
#include <stdio.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"

static int is_saved(const adt_value *v, int with_state) {
    if (v->alias_of >= 0 || v->dtype != ADT_F32) return 0;
    return v->role == ADT_ROLE_PARAM || (with_state && v->role == ADT_ROLE_OPT_STATE);
}

int adt_ckpt_save(const char *path, const adt_graph *g, adt_ckpt_data_fn data, void *ctx, int with_state,
                  const char *const *meta, int n_meta) {
    adt_st_writer *w = adt_st_writer_create();
    int rc = ADT_OK;
    for (int i = 0; i < g->n_values && !rc; i++) {
        const adt_value *v = &g->values[i];
        if (!is_saved(v, with_state)) continue;
        adt_shape fs = adt_value_file_shape(g, i); /* Hugging Face's shape where the graph regroups axes */
        rc = adt_st_writer_add(w, v->name, ADT_ST_F32, fs.ndim, fs.dim, data(ctx, i));
    }
    for (int i = 0; i < n_meta && !rc; i++) rc = adt_st_writer_set_metadata(w, meta[2 * i], meta[2 * i + 1]);
    if (!rc) rc = adt_st_writer_save(w, path);
    adt_st_writer_free(w);
    if (rc) return adt_error_prefix(rc, "saving checkpoint %s: ", path);
    return ADT_OK;
}

/* The model's name for a file tensor name: without Hugging Face's "transformer." prefix. */
static const char *strip_prefix(const char *name) {
    static const char prefix[] = "transformer.";
    return strncmp(name, prefix, sizeof prefix - 1) ? name : name + sizeof prefix - 1;
}

/* Tensors that PyTorch GPT-2 checkpoints hold and a model rebuilds itself: the causal-mask
 * buffers "h.{i}.attn.bias" / "h.{i}.attn.masked_bias" and the LM head tied to wte. */
static int is_known_buffer(const char *name) {
    if (!strcmp(name, "lm_head.weight")) return 1;
    if (strncmp(name, "h.", 2)) return 0;
    const char *dot = strchr(name + 2, '.');
    return dot && (!strcmp(dot, ".attn.bias") || !strcmp(dot, ".attn.masked_bias"));
}

static int is_opt_state_name(const char *name) { return !strncmp(name, "opt.m.", 6) || !strncmp(name, "opt.v.", 6); }

/* The file tensor holding value v (with or without the prefix), or NULL. */
static const adt_st_tensor *find_tensor(const adt_st_file *f, const char *name) {
    const adt_st_tensor *t = adt_st_find(f, name);
    if (t) return t;
    char prefixed[ADT_NAME_LEN + 16];
    snprintf(prefixed, sizeof prefixed, "transformer.%s", name);
    return adt_st_find(f, prefixed);
}

/* Lists up to a few names of the file the model does not have; returns how many there are. */
static int unexpected_names(const adt_st_file *f, const adt_graph *g, int with_state, char *buf, size_t n) {
    int count = 0;
    size_t used = 0;
    buf[0] = 0;
    for (int i = 0; i < adt_st_count(f); i++) {
        const char *name = strip_prefix(adt_st_get(f, i)->name);
        int v = adt_graph_find_value(g, name);
        if (v >= 0 && is_saved(&g->values[v], with_state)) continue;
        if (is_known_buffer(name) || (!with_state && is_opt_state_name(name))) continue;
        if (count++ < 4 && used < n) used += (size_t)snprintf(buf + used, n - used, "%s'%s'", count > 1 ? ", " : "", name);
    }
    return count;
}

int adt_ckpt_load(const adt_st_file *f, const adt_graph *g, adt_ckpt_data_fn data, void *ctx, int with_state) {
    const char *file = adt_st_name(f);
    char extra[512];
    int n_extra = unexpected_names(f, g, with_state, extra, sizeof extra);
    int n_missing = 0;
    const char *first_missing = NULL;
    for (int i = 0; i < g->n_values; i++) {
        const adt_value *v = &g->values[i];
        if (!is_saved(v, with_state) || find_tensor(f, v->name)) continue;
        if (!n_missing++) first_missing = v->name;
    }
    if (n_extra && n_missing)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: not a checkpoint of this model: %d tensor(s) the model lacks (%s%s) and %d the model "
                         "needs are missing (first: '%s')",
                         file, n_extra, extra, n_extra > 4 ? ", ..." : "", n_missing, first_missing);
    if (n_missing)
        return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' is missing (%d of the model's %s missing)%s", file,
                         first_missing, n_missing, with_state ? "parameters and optimizer states" : "parameters",
                         with_state ? "; a checkpoint saved without optimizer state can be loaded with --init" : "");
    if (n_extra)
        return adt_error(ADT_ERR_FORMAT, "%s: %d tensor(s) the model does not have: %s%s", file, n_extra, extra,
                         n_extra > 4 ? ", ..." : "");
    for (int i = 0; i < g->n_values; i++) {
        const adt_value *v = &g->values[i];
        if (!is_saved(v, with_state)) continue;
        const adt_st_tensor *t = find_tensor(f, v->name);
        adt_shape fs = adt_value_file_shape(g, i);
        int rc = adt_st_read_f32(f, t->name, data(ctx, i), fs.ndim, fs.dim);
        if (rc) return rc;
    }
    return ADT_OK;
}
