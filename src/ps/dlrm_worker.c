/*
 * dlrm_worker.c - a DLRM on a parameter-server worker: the dense part through the executor, the
 * embedding rows fed in and their gradients read out, the dense update after a sum over workers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/models.h"
#include "adtrain/ps.h"
#include "adtrain/safetensors.h"

struct adt_ps_dlrm {
    adt_dlrm_cfg cfg;
    int batch;
    adt_graph *g;
    adt_exec *ex;
    adt_model_io io;
    int rows[ADT_DLRM_MAX_TABLES];
    int n_dense_params;
    int *dense_params;  /* value ids */
    int64_t dense_numel;
    float *flat;        /* [dense_numel]: the dense gradients packed for one all-reduce */
    float **state;      /* per dense parameter: its optimizer state */
    adt_ps_optim optim;
    float *stage; /* dense on servers: a parameter's rows, then its gradient (padded) */
    double sync_s; /* seconds in the dense gradients' all-reduce (waiting for the other workers) */
};

int adt_ps_tables_dlrm(adt_ps_cfg *cfg, const adt_dlrm_cfg *c, int64_t capacity, adt_ps_full_rule full) {
    adt_model_cfg mc = {.type = ADT_MODEL_DLRM, .dlrm = *c};
    int rc = adt_model_cfg_validate(&mc, "dlrm");
    if (rc) return rc;
    cfg->n_tables = c->n_tables;
    for (int t = 0; t < c->n_tables; t++) {
        adt_ps_table *tb = &cfg->tables[t];
        memset(tb, 0, sizeof *tb);
        snprintf(tb->name, sizeof tb->name, "emb.%d.weight", t);
        tb->dim = c->emb_dim;
        tb->rows = c->table_rows[t];
        float bound = sqrtf(1.0f / (float)c->table_rows[t]);
        tb->init_lo = -bound, tb->init_hi = bound;
        tb->capacity = capacity > 0 ? capacity : c->table_rows[t];
        tb->full = full;
    }
    return ADT_OK;
}

int adt_ps_tables_dlrm_dense(adt_ps_cfg *cfg, const adt_dlrm_cfg *c, const adt_ps_optim *dense) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    int rows[ADT_DLRM_MAX_TABLES], rc = adt_model_dlrm_ps(g, c, 1, &io, rows);
    if (rc) rc = adt_error(rc, "ps dlrm: %s", adt_graph_error_message(g));
    for (int v = 0; v < g->n_values && !rc; v++) {
        const adt_value *val = &g->values[v];
        if (val->role != ADT_ROLE_PARAM || !strncmp(val->name, "ps.rows.", 8)) continue;
        if (cfg->n_tables >= ADT_PS_MAX_TABLES) {
            rc = adt_error(ADT_ERR_ARG, "ps dlrm: more than %d tables with the dense parameters", ADT_PS_MAX_TABLES);
            break;
        }
        if (val->init.kind != ADT_INIT_UNIFORM && val->init.kind != ADT_INIT_ZEROS) {
            rc = adt_error(ADT_ERR_UNSUPPORTED, "ps dlrm: parameter %s's initialisation is neither uniform nor zeros, "
                           "which a server's rows cannot reproduce", val->name);
            break;
        }
        adt_ps_table *tb = &cfg->tables[cfg->n_tables++];
        memset(tb, 0, sizeof *tb);
        snprintf(tb->name, sizeof tb->name, "%s", val->name);
        int64_t n = adt_value_numel(g, v);
        tb->dim = ADT_PS_DENSE_ROW;
        tb->rows = tb->capacity = (n + ADT_PS_DENSE_ROW - 1) / ADT_PS_DENSE_ROW;
        if (val->init.kind == ADT_INIT_UNIFORM) tb->init_lo = val->init.a, tb->init_hi = val->init.b;
        tb->full = ADT_PS_REFUSE;
        tb->whole = 1;
        tb->optim = *dense;
    }
    adt_graph_free(g);
    return rc;
}

int adt_ps_dlrm_create(adt_ps_dlrm **out, const adt_dlrm_cfg *c, int batch, const adt_ps_optim *dense,
                       const adt_exec_opts *eo) {
    *out = NULL;
    if (dense->kind == ADT_PS_ADAGRAD)
        return adt_error(ADT_ERR_UNSUPPORTED, "ps dlrm: adagrad for the dense parameters, expected sgd or adam (the "
                         "graph's optimizers, so that a one-process run is the reference)");
    adt_ps_dlrm *d = adt_calloc(1, sizeof *d);
    d->cfg = *c;
    d->batch = batch;
    d->optim = *dense;
    d->g = adt_graph_create();
    int rc = adt_model_dlrm_ps(d->g, c, batch, &d->io, d->rows);
    if (!rc) rc = adt_graph_backward(d->g, d->io.loss);
    if (rc) {
        rc = adt_error(rc, "ps dlrm: %s", adt_graph_error_message(d->g));
        adt_ps_dlrm_free(d);
        return rc;
    }
    d->dense_params = adt_malloc((size_t)d->g->n_values * sizeof *d->dense_params);
    adt_graph_mark_output(d->g, d->io.logits);
    for (int v = 0; v < d->g->n_values; v++) {
        const adt_value *val = &d->g->values[v];
        if (val->role != ADT_ROLE_PARAM || val->grad < 0) continue;
        adt_graph_mark_output(d->g, val->grad);
        if (!strncmp(val->name, "ps.rows.", 8)) continue;
        d->dense_params[d->n_dense_params++] = v;
        d->dense_numel += adt_value_numel(d->g, v);
    }
    d->flat = adt_malloc((size_t)(d->dense_numel ? d->dense_numel : 1) * sizeof *d->flat);
    d->state = adt_calloc((size_t)(d->n_dense_params ? d->n_dense_params : 1), sizeof *d->state);
    int k = adt_ps_optim_states(dense->kind);
    for (int i = 0; i < d->n_dense_params && k; i++)
        d->state[i] = adt_calloc((size_t)(k * adt_value_numel(d->g, d->dense_params[i])), sizeof(float));
    if ((rc = adt_exec_create(&d->ex, d->g, eo)) || (rc = adt_exec_init_params(d->ex))) {
        adt_ps_dlrm_free(d);
        return rc;
    }
    *out = d;
    return ADT_OK;
}

int adt_ps_dlrm_resize(adt_ps_dlrm *d, int batch, const adt_exec_opts *eo) {
    if (batch == d->batch) return ADT_OK;
    adt_ps_dlrm *n;
    int rc = adt_ps_dlrm_create(&n, &d->cfg, batch, &d->optim, eo);
    if (rc) return rc;
    /* the same model at another batch: the same dense parameters in the same order */
    for (int i = 0; i < d->n_dense_params && !rc; i++)
        if (n->n_dense_params != d->n_dense_params ||
            adt_value_numel(n->g, n->dense_params[i]) != adt_value_numel(d->g, d->dense_params[i]))
            rc = adt_error(ADT_ERR_STATE, "ps dlrm: the graph at batch %d has other dense parameters than at %d", batch,
                           d->batch);
    if (rc) {
        adt_ps_dlrm_free(n);
        return rc;
    }
    for (int i = 0; i < d->n_dense_params; i++) {
        memcpy(adt_exec_data(n->ex, n->dense_params[i]), adt_exec_data(d->ex, d->dense_params[i]),
               (size_t)adt_value_numel(d->g, d->dense_params[i]) * sizeof(float));
        float *st = n->state[i];
        n->state[i] = d->state[i], d->state[i] = st;
    }
    float *stage = n->stage;
    n->stage = d->stage, d->stage = stage;
    n->sync_s = d->sync_s;
    adt_ps_dlrm old = *d;
    *d = *n, *n = old;
    adt_ps_dlrm_free(n); /* the old graph, executor and the new one's unused state */
    return ADT_OK;
}

void adt_ps_dlrm_free(adt_ps_dlrm *d) {
    if (!d) return;
    adt_exec_free(d->ex);
    adt_graph_free(d->g);
    for (int i = 0; i < d->n_dense_params; i++) free(d->state[i]);
    free(d->state), free(d->dense_params), free(d->flat), free(d->stage);
    free(d);
}

adt_exec *adt_ps_dlrm_exec(adt_ps_dlrm *d) { return d->ex; }

double adt_ps_dlrm_sync_s(const adt_ps_dlrm *d) { return d->sync_s; }

int adt_ps_dlrm_save(const adt_ps_dlrm *d, const char *path, const char *const *kv, int n_pairs) {
    adt_st_writer *wr = adt_st_writer_create();
    int rc = ADT_OK, k = adt_ps_optim_states(d->optim.kind);
    for (int i = 0; i < n_pairs && !rc; i++) rc = adt_st_writer_set_metadata(wr, kv[2 * i], kv[2 * i + 1]);
    for (int i = 0; i < d->n_dense_params && !rc; i++) {
        const adt_value *val = &d->g->values[d->dense_params[i]];
        int64_t n = adt_value_numel(d->g, d->dense_params[i]), kn = k * n;
        char name[160];
        rc = adt_st_writer_add(wr, val->name, ADT_ST_F32, 1, &n, adt_exec_data(d->ex, d->dense_params[i]));
        snprintf(name, sizeof name, "%s.state", val->name);
        if (!rc && k) rc = adt_st_writer_add(wr, name, ADT_ST_F32, 1, &kn, d->state[i]);
    }
    if (!rc) rc = adt_st_writer_save(wr, path);
    adt_st_writer_free(wr);
    return rc;
}

int adt_ps_dlrm_load(adt_ps_dlrm *d, const char *path) {
    adt_st_file *f;
    int rc = adt_st_open(&f, path), k = adt_ps_optim_states(d->optim.kind);
    if (rc) return rc;
    for (int i = 0; i < d->n_dense_params && !rc; i++) {
        const adt_value *val = &d->g->values[d->dense_params[i]];
        int64_t n = adt_value_numel(d->g, d->dense_params[i]), kn = k * n;
        char name[160];
        rc = adt_st_read_f32(f, val->name, adt_exec_data(d->ex, d->dense_params[i]), 1, &n);
        snprintf(name, sizeof name, "%s.state", val->name);
        if (!rc && k) rc = adt_st_read_f32(f, name, d->state[i], 1, &kn);
    }
    adt_st_close(f);
    return rc;
}

float *adt_ps_dlrm_rows(adt_ps_dlrm *d, int t) {
    return t >= 0 && t < d->cfg.n_tables ? adt_exec_data(d->ex, d->rows[t]) : NULL;
}

float *adt_ps_dlrm_row_grad(adt_ps_dlrm *d, int t) {
    return t >= 0 && t < d->cfg.n_tables ? adt_exec_data(d->ex, d->g->values[d->rows[t]].grad) : NULL;
}

int adt_ps_dlrm_compute(adt_ps_dlrm *d, const float *dense, const float *labels, float *loss) {
    memcpy(adt_exec_data(d->ex, d->io.input), dense, (size_t)d->batch * (size_t)d->cfg.n_dense * sizeof(float));
    memcpy(adt_exec_data(d->ex, d->io.label), labels, (size_t)d->batch * sizeof(float));
    int rc = adt_exec_run(d->ex);
    if (rc) return rc;
    if (loss) *loss = *(const float *)adt_exec_data(d->ex, d->io.loss);
    return ADT_OK;
}

void adt_ps_dlrm_set_lr(adt_ps_dlrm *d, float lr) { d->optim.lr = lr; }

int adt_ps_dlrm_update_dense(adt_ps_dlrm *d, adt_comm *workers, float scale, int64_t step) {
    int64_t off = 0;
    for (int i = 0; i < d->n_dense_params; i++) {
        int v = d->dense_params[i];
        int64_t n = adt_value_numel(d->g, v);
        const float *gr = adt_exec_data(d->ex, d->g->values[v].grad);
        for (int64_t j = 0; j < n; j++) d->flat[off + j] = gr[j] * scale;
        off += n;
    }
    if (workers && adt_comm_size(workers) > 1) {
        double t0 = adt_now_s();
        int rc = adt_comm_allreduce_f32(workers, d->flat, d->dense_numel);
        d->sync_s += adt_now_s() - t0;
        if (rc) return rc;
    }
    off = 0;
    for (int i = 0; i < d->n_dense_params; i++) {
        int v = d->dense_params[i];
        int64_t n = adt_value_numel(d->g, v);
        adt_ps_optim_apply(&d->optim, adt_exec_data(d->ex, v), d->state[i], d->flat + off, n, step);
        off += n;
    }
    return ADT_OK;
}

/* The whole tables of the worker's config after the embedding tables: the dense parameters, in
 * graph order, as adt_ps_tables_dlrm_dense made them; 0 when there are none. */
static int dense_tables(adt_ps_dlrm *d, const adt_ps_cfg *cfg, int64_t *off) {
    int T = d->cfg.n_tables, k = cfg->n_tables - T;
    if (k <= 0) return 0;
    if (k != d->n_dense_params)
        return adt_error(ADT_ERR_ARG, "ps dlrm: the config has %d dense tables, the model %d dense parameters",
                         k, d->n_dense_params);
    int64_t o = 0;
    for (int i = 0; i < k; i++) {
        const adt_ps_table *tb = &cfg->tables[T + i];
        int64_t n = adt_value_numel(d->g, d->dense_params[i]);
        if (!tb->whole || strcmp(tb->name, d->g->values[d->dense_params[i]].name) || tb->rows * tb->dim < n)
            return adt_error(ADT_ERR_ARG, "ps dlrm: table %d is '%s', expected the whole table of dense parameter %s "
                             "(adt_ps_tables_dlrm_dense)", T + i, tb->name, d->g->values[d->dense_params[i]].name);
        off[i] = o;
        o += tb->rows * tb->dim;
    }
    if (!d->stage) d->stage = adt_malloc((size_t)o * sizeof *d->stage);
    return k;
}

/* The rows of step `step` (ids NULL: pulled before) or of a lookup of ids, into the executor,
 * with the dense parameters when the servers hold them; the number of dense tables, or an error. */
static int fetch(adt_ps_dlrm *d, adt_ps_worker *w, int64_t step, const int32_t *ids, int64_t *off) {
    int T = d->cfg.n_tables;
    int k = dense_tables(d, adt_ps_worker_cfg(w), off);
    if (k < 0) return k;
    float *rows[ADT_PS_MAX_TABLES];
    for (int t = 0; t < T; t++) rows[t] = adt_ps_dlrm_rows(d, t);
    for (int i = 0; i < k; i++) rows[T + i] = d->stage + off[i];
    int rc = ids ? adt_ps_worker_lookup(w, ids, d->batch, rows) : adt_ps_worker_rows(w, step, rows);
    if (rc) return rc;
    for (int i = 0; i < k; i++) {
        int v = d->dense_params[i];
        memcpy(adt_exec_data(d->ex, v), d->stage + off[i], (size_t)adt_value_numel(d->g, v) * sizeof(float));
    }
    return k;
}

int adt_ps_dlrm_step(adt_ps_dlrm *d, adt_ps_worker *w, adt_comm *workers, int64_t step, const float *dense,
                     const float *labels, float scale, float *loss) {
    const adt_ps_cfg *cfg = adt_ps_worker_cfg(w);
    int T = d->cfg.n_tables, D = d->cfg.emb_dim;
    int64_t off[ADT_PS_MAX_TABLES];
    int k = fetch(d, w, step, NULL, off), rc;
    if (k < 0) return k;
    if ((rc = adt_ps_dlrm_compute(d, dense, labels, loss))) return rc;
    /* the global loss is the share-weighted sum of the workers' means: so are its gradients */
    float *grads[ADT_PS_MAX_TABLES];
    for (int t = 0; t < T; t++) {
        grads[t] = adt_ps_dlrm_row_grad(d, t);
        if (scale != 1.0f)
            for (int64_t i = 0; i < (int64_t)d->batch * D; i++) grads[t][i] *= scale;
    }
    for (int i = 0; i < k; i++) {
        int v = d->dense_params[i];
        int64_t n = adt_value_numel(d->g, v), padded = cfg->tables[T + i].rows * cfg->tables[T + i].dim;
        const float *gr = adt_exec_data(d->ex, d->g->values[v].grad);
        float *st = grads[T + i] = d->stage + off[i];
        for (int64_t j = 0; j < n; j++) st[j] = gr[j] * scale;
        memset(st + n, 0, (size_t)(padded - n) * sizeof *st);
    }
    if ((rc = adt_ps_worker_push(w, step, (const float *const *)grads))) return rc;
    return k ? ADT_OK : adt_ps_dlrm_update_dense(d, workers, scale, step + 1);
}

int adt_ps_dlrm_eval(adt_ps_dlrm *d, adt_ps_worker *w, const int32_t *ids, const float *dense, const float *labels,
                     float *loss, float *logits) {
    int64_t off[ADT_PS_MAX_TABLES];
    int rc = fetch(d, w, 0, ids, off);
    if (rc < 0) return rc;
    memcpy(adt_exec_data(d->ex, d->io.input), dense, (size_t)d->batch * (size_t)d->cfg.n_dense * sizeof(float));
    memcpy(adt_exec_data(d->ex, d->io.label), labels, (size_t)d->batch * sizeof(float));
    if ((rc = adt_exec_run_forward(d->ex))) return rc;
    if (loss) *loss = *(const float *)adt_exec_data(d->ex, d->io.loss);
    if (logits) memcpy(logits, adt_exec_data(d->ex, d->io.logits), (size_t)d->batch * sizeof(float));
    return ADT_OK;
}
