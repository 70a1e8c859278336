/*
 * ps_ref.h - the one-process references of the parameter-server tests: a batch as a pure
 * function of (seed, step); the plain DLRM (tables as parameters, the graph's optimizer) run on
 * the whole batch; and the parameter-server semantics in one process (a local store, the batch's
 * rows deduplicated and their gradients summed here, independently of src/ps/worker.c).
 * Include after check.h.
 */
#ifndef ADTRAIN_TESTS_PS_REF_H
#define ADTRAIN_TESTS_PS_REF_H

#include <stdlib.h>
#include <string.h>

#include "adtrain/adtrain.h"
#include "adtrain/ps.h"

#define PS_REF_MAX_STEPS 32 /* loss arrays hold steps + 1: the last an evaluation after training */

/* Step `step`'s global batch: dense features in [-1, 1), ids skewed to small rows (repeats within
 * and across workers' parts), labels 0/1. */
static inline void ps_batch(const adt_dlrm_cfg *c, uint64_t seed, int step, int B, float *dense, int32_t *ids,
                            float *labels) {
    uint64_t k = adt_rng_key(seed + (uint64_t)step * 7919u, "ps.batch");
    for (int i = 0; i < B * c->n_dense; i++) dense[i] = 2.0f * adt_rng_uniform(k, (uint64_t)i) - 1.0f;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < c->n_tables; t++) {
            float u = adt_rng_uniform(k ^ 0x1d, (uint64_t)(b * c->n_tables + t));
            ids[b * c->n_tables + t] = (int32_t)((float)c->table_rows[t] * u * u);
        }
    for (int b = 0; b < B; b++) labels[b] = (float)(adt_rng_u32(k ^ 0x2e, (uint64_t)b) & 1);
}

/* The plain DLRM, whole batch, one process: the loss of each step and the tables at the end
 * (tables[t] malloc'd, [rows_t, emb_dim]). oc: the graph's optimizer (weight decay 0). */
static inline int ps_ref_dlrm(const adt_dlrm_cfg *c, int B, int steps, uint64_t seed, adt_optim_cfg oc, float lr,
                              float *losses, float **tables) {
    /* losses[steps]: the loss of batch `steps` after training, forward only */
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    adt_model_dlrm(g, c, B, &io);
    adt_graph_backward(g, io.loss);
    adt_graph_optimizer(g, &oc);
    adt_exec *ex;
    if (adt_graph_error(g) || adt_exec_create(&ex, g, &(adt_exec_opts){.threads = 1, .seed = seed})) {
        adt_graph_free(g);
        return -1;
    }
    adt_exec_init_params(ex);
    float *dense = malloc(sizeof(float) * (size_t)(B * c->n_dense)), *labels = malloc(sizeof(float) * (size_t)B);
    for (int s = 0; s < steps; s++) {
        ps_batch(c, seed, s, B, dense, adt_exec_data(ex, io.input2), labels);
        memcpy(adt_exec_data(ex, io.input), dense, sizeof(float) * (size_t)(B * c->n_dense));
        memcpy(adt_exec_data(ex, io.label), labels, sizeof(float) * (size_t)B);
        adt_exec_set_lr_step(ex, lr, s + 1);
        adt_exec_run(ex);
        losses[s] = *(float *)adt_exec_data(ex, io.loss);
    }
    ps_batch(c, seed, steps, B, dense, adt_exec_data(ex, io.input2), labels);
    memcpy(adt_exec_data(ex, io.input), dense, sizeof(float) * (size_t)(B * c->n_dense));
    memcpy(adt_exec_data(ex, io.label), labels, sizeof(float) * (size_t)B);
    adt_exec_run_forward(ex);
    losses[steps] = *(float *)adt_exec_data(ex, io.loss);
    for (int t = 0; tables && t < c->n_tables; t++) {
        char name[64];
        snprintf(name, sizeof name, "emb.%d.weight", t);
        size_t n = (size_t)c->table_rows[t] * (size_t)c->emb_dim;
        tables[t] = malloc(n * sizeof(float));
        memcpy(tables[t], adt_exec_f32(ex, name), n * sizeof(float));
    }
    free(dense), free(labels);
    adt_exec_free(ex);
    adt_graph_free(g);
    return 0;
}

/* The parameter-server semantics on one process: a store of every table, the whole batch pulled
 * (distinct ids found by a quadratic scan), gradients summed per distinct row and pushed, the
 * dense update after. *store_out (if not NULL) gets the store; free it. */
static inline int ps_ref_local(const adt_dlrm_cfg *c, int B, int steps, uint64_t seed, const adt_ps_optim *sparse,
                               const adt_ps_optim *dense_opt, float *losses, adt_ps_store **store_out) {
    adt_ps_cfg pc = {0};
    adt_ps_tables_dlrm(&pc, c, 0, ADT_PS_REFUSE);
    adt_ps_store *st;
    if (adt_ps_store_create(&st, pc.tables, pc.n_tables, sparse, seed)) return -1;
    adt_ps_dlrm *d;
    if (adt_ps_dlrm_create(&d, c, B, dense_opt, &(adt_exec_opts){.threads = 1, .seed = seed})) {
        adt_ps_store_free(st);
        return -1;
    }
    int T = c->n_tables, D = c->emb_dim, rc = 0;
    float *dense = malloc(sizeof(float) * (size_t)(B * c->n_dense)), *labels = malloc(sizeof(float) * (size_t)B);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(B * T));
    uint64_t *uniq = malloc(sizeof(uint64_t) * (size_t)B);
    float *buf = malloc(sizeof(float) * (size_t)(B * D));
    for (int s = 0; s <= steps && !rc; s++) { /* the last: batch `steps` evaluated, no update */
        ps_batch(c, seed, s, B, dense, ids, labels);
        for (int t = 0; t < T && !rc; t++) {
            float *rows = adt_ps_dlrm_rows(d, t);
            for (int b = 0; b < B && !rc; b++) rc = adt_ps_store_pull(st, t, (uint64_t[]){(uint64_t)ids[b * T + t]}, 1,
                                                                      rows + b * D, s);
        }
        if (!rc) rc = adt_ps_dlrm_compute(d, dense, labels, &losses[s]);
        if (s == steps) break;
        for (int t = 0; t < T && !rc; t++) {
            const float *gr = adt_ps_dlrm_row_grad(d, t);
            int n = 0;
            for (int b = 0; b < B; b++) {
                uint64_t id = (uint64_t)ids[b * T + t];
                int u = 0;
                while (u < n && uniq[u] != id) u++;
                if (u == n) uniq[n++] = id, memset(buf + u * D, 0, sizeof(float) * (size_t)D);
                for (int j = 0; j < D; j++) buf[u * D + j] += gr[b * D + j];
            }
            rc = adt_ps_store_push(st, t, uniq, n, buf, s + 1, s);
        }
        if (!rc) rc = adt_ps_dlrm_update_dense(d, NULL, 1.0f, s + 1);
    }
    free(dense), free(labels), free(ids), free(uniq), free(buf);
    adt_ps_dlrm_free(d);
    if (store_out && !rc) *store_out = st;
    else adt_ps_store_free(st);
    return rc;
}

#endif
