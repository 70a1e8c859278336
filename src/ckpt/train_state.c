/*
 * train_state.c - a model's parameters and optimizer state to and from one safetensors file
 * (include/adtrain/ckpt.h), whole or into one rank's share of a partitioned model.
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
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ckpt.h"
#include "ckpt_internal.h"

int ckpt_is_saved(const adt_value *v, int with_state) {
    if (v->alias_of >= 0 || v->dtype != ADT_F32) return 0;
    return v->role == ADT_ROLE_PARAM || (with_state && v->role == ADT_ROLE_OPT_STATE);
}

int ckpt_is_opt_state_name(const char *name) { return !strncmp(name, "opt.m.", 6) || !strncmp(name, "opt.v.", 6); }

int ckpt_view_index(const adt_ckpt_view *vw, int v) { return vw->local_of ? vw->local_of[v] : v; }

int ckpt_view_block(const adt_ckpt_view *vw, int v, adt_box *box) {
    const adt_graph *g = vw->g;
    int i = ckpt_view_index(vw, v);
    int lv = !vw->local ? v : i >= 0 ? vw->local->value[i] : -1;
    if (lv < 0) return -1;
    const adt_value *x = vw->local ? &vw->local->g->values[lv] : &g->values[v];
    memset(box, 0, sizeof *box);
    box->global = x->global_shape;
    box->shape = x->shape;
    if (vw->local) memcpy(box->offset, x->offset, sizeof box->offset);
    else box->global = x->shape; /* a serial graph: the whole tensor */
    return lv;
}

void adt_ckpt_view_stage(adt_ckpt_view *vw, const adt_pipe_stage *st, int world, char *elsewhere) {
    const adt_graph *g = vw->g;
    memset(elsewhere, 0, (size_t)g->n_values);
    uint64_t earlier = ((uint64_t)1 << st->stage) - 1;
    for (int k = 0; k < st->n_tied; k++)
        if (st->tied[k].holders & earlier) elsewhere[st->tied[k].param] = 1;
    for (int v = 0; v < g->n_values; v++) /* a tied parameter's state goes with it: every holder updates */
        if (g->values[v].role == ADT_ROLE_OPT_STATE && g->values[v].param >= 0 && elsewhere[g->values[v].param])
            elsewhere[v] = 1;
    vw->local_of = st->local_of;
    vw->elsewhere = elsewhere;
    vw->world = world;
}

int adt_ckpt_save(const char *path, const adt_graph *g, adt_ckpt_data_fn data, void *ctx, int with_state,
                  const char *const *meta, int n_meta) {
    adt_st_writer *w = adt_st_writer_create();
    int rc = ADT_OK;
    for (int i = 0; i < g->n_values && !rc; i++) {
        const adt_value *v = &g->values[i];
        if (!ckpt_is_saved(v, with_state)) continue;
        adt_shape fs = adt_value_file_shape(g, i); /* Hugging Face's shape where the graph regroups axes */
        rc = adt_st_writer_add(w, v->name, ADT_ST_F32, fs.ndim, fs.dim, data(ctx, i));
    }
    for (int i = 0; i < n_meta && !rc; i++) rc = adt_st_writer_set_metadata(w, meta[2 * i], meta[2 * i + 1]);
    if (!rc) rc = adt_st_writer_save(w, path);
    adt_st_writer_free(w);
    if (rc) return adt_error_prefix(rc, "saving checkpoint %s: ", path);
    return ADT_OK;
}

/* Tensors that PyTorch GPT-2 checkpoints hold and a model rebuilds itself: the causal-mask
 * buffers "h.{i}.attn.bias" / "h.{i}.attn.masked_bias" and the LM head tied to wte. */
static int is_known_buffer(const char *name) {
    if (!strcmp(name, "lm_head.weight")) return 1;
    if (strncmp(name, "h.", 2)) return 0;
    const char *dot = strchr(name + 2, '.');
    return dot && (!strcmp(dot, ".attn.bias") || !strcmp(dot, ".attn.masked_bias"));
}

static const char hf_prefix[] = "transformer.";

int ckpt_match_names(const char *file, const char *const *names, int n, const adt_graph *g, int with_state,
                     int lenient, int *value_of) {
    char *claimed = calloc((size_t)g->n_values + 1, 1);
    char extra[512];
    int n_extra = 0;
    size_t used = 0;
    extra[0] = 0;
    /* exact names first, so that "x" wins over a "transformer.x" beside it */
    for (int pass = 0; pass < (lenient ? 2 : 1); pass++)
        for (int i = 0; i < n; i++) {
            int prefixed = lenient && !strncmp(names[i], hf_prefix, sizeof hf_prefix - 1);
            if (prefixed != pass) continue;
            const char *name = names[i] + (prefixed ? sizeof hf_prefix - 1 : 0);
            int v = adt_graph_find_value(g, name);
            value_of[i] = -1;
            if (v >= 0 && ckpt_is_saved(&g->values[v], with_state)) {
                if (!claimed[v]) value_of[i] = v;
                claimed[v] = 1;
                continue;
            }
            if ((lenient && is_known_buffer(name)) || (!with_state && ckpt_is_opt_state_name(name))) continue;
            if (n_extra++ < 4 && used < sizeof extra)
                used += (size_t)snprintf(extra + used, sizeof extra - used, "%s'%s'", n_extra > 1 ? ", " : "", name);
        }
    int n_missing = 0;
    const char *first_missing = NULL;
    for (int v = 0; v < g->n_values; v++) {
        if (!ckpt_is_saved(&g->values[v], with_state) || claimed[v]) continue;
        if (!n_missing++) first_missing = g->values[v].name;
    }
    free(claimed);
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
    return ADT_OK;
}

/* Block `box` of file tensor t into dst. The file holds value v whole, in its file shape fs
 * (the same row-major bytes as the graph's shape). F32 is cut straight from the file; BF16 and
 * F16 are widened whole first. */
static int read_block(const adt_st_file *f, const adt_st_tensor *t, const adt_value *v, adt_shape fs,
                      const adt_box *box, float *dst) {
    const adt_shape *gs = &v->shape;
    if (adt_shape_equal(&box->shape, gs)) return adt_st_read_f32(f, t->name, dst, fs.ndim, fs.dim);
    int same = t->ndim == fs.ndim;
    for (int d = 0; same && d < fs.ndim; d++) same = t->shape[d] == fs.dim[d];
    adt_box whole = {.global = *gs, .shape = *gs};
    if (same && t->dtype == ADT_ST_F32) {
        adt_box_transfer(dst, box, t->data, &whole, 4, 0);
        return ADT_OK;
    }
    float *tmp = adt_malloc((size_t)adt_shape_numel(gs) * sizeof *tmp + 1);
    int rc = adt_st_read_f32(f, t->name, tmp, fs.ndim, fs.dim); /* checks the shape and dtype */
    if (!rc) adt_box_transfer(dst, box, tmp, &whole, 4, 0);
    free(tmp);
    return rc;
}

int adt_ckpt_load_local(const adt_st_file *f, const adt_ckpt_view *vw, int with_state) {
    int n = adt_st_count(f);
    const char **names = adt_malloc((size_t)n * sizeof *names + 1);
    int *value_of = adt_malloc((size_t)n * sizeof *value_of + 1);
    for (int i = 0; i < n; i++) names[i] = adt_st_get(f, i)->name;
    int rc = ckpt_match_names(adt_st_name(f), names, n, vw->g, with_state, 1, value_of);
    for (int i = 0; i < n && !rc; i++) {
        int v = value_of[i];
        adt_box box;
        int lv = v < 0 ? -1 : ckpt_view_block(vw, v, &box);
        if (lv >= 0)
            rc = read_block(f, adt_st_get(f, i), &vw->g->values[v], adt_value_file_shape(vw->g, v), &box,
                            vw->data(vw->ctx, lv));
    }
    free(names);
    free(value_of);
    return rc;
}

int adt_ckpt_load(const adt_st_file *f, const adt_graph *g, adt_ckpt_data_fn data, void *ctx, int with_state) {
    adt_ckpt_view vw = {.g = g, .data = data, .ctx = ctx};
    return adt_ckpt_load_local(f, &vw, with_state);
}
