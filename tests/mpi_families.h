/*
 * mpi_families.h - the four model families the distributed tests train (a tiny GPT with dropout
 * and its LM head tied to the embedding, an MLP, a small VGG, a small DLRM), their training graphs
 * and their data: every fed value a pure function of (seed, step, name), so every rank makes the
 * same whole batch. Include after check.h.
 */
#ifndef ADTRAIN_TESTS_MPI_FAMILIES_H
#define ADTRAIN_TESTS_MPI_FAMILIES_H

#include <string.h>

#include "adtrain/adtrain.h"

typedef struct family {
    const char *name;
    adt_model_cfg cfg;
    adt_optim_cfg oc;
    int id_hi, label_hi; /* i32 inputs in [0, id_hi), labels in [0, label_hi) (0: f32 0/1) */
} family;

static inline family family_of(const char *name) {
    family f = {.name = name};
    adt_model_cfg *c = &f.cfg;
    if (!strcmp(name, "gpt")) {
        c->type = ADT_MODEL_GPT;
        c->gpt = (adt_gpt_cfg){.vocab_size = 11, .n_ctx = 5, .n_layer = 2, .n_embd = 12, .n_head = 2, .dropout = 0.1f};
        f.id_hi = f.label_hi = 11;
        f.oc = adt_optim_adamw(0.9f, 0.95f, 1e-2f, 0.01f);
    } else if (!strcmp(name, "mlp")) {
        c->type = ADT_MODEL_MLP;
        c->mlp = (adt_mlp_cfg){.n_sizes = 5, .sizes = {9, 16, 12, 10, 5}, .activation = ADT_ACT_GELU};
        f.label_hi = 5;
        f.oc = adt_optim_sgd(0.9f, 0.01f);
    } else if (!strcmp(name, "vgg")) {
        c->type = ADT_MODEL_VGG;
        c->vgg = (adt_vgg_cfg){.in_channels = 2, .height = 6, .width = 6, .n_blocks = 2, .n_convs = {1, 1},
                               .channels = {{4}, {6}}, .n_fc = 1, .fc = {8}, .classes = 3};
        f.label_hi = 3;
        f.oc = adt_optim_sgd(0.9f, 0.0f);
    } else {
        c->type = ADT_MODEL_DLRM;
        c->dlrm = (adt_dlrm_cfg){.n_dense = 3, .n_tables = 2, .table_rows = {5, 7}, .emb_dim = 4, .n_bottom = 2,
                                 .bottom = {6, 4}, .n_top = 2, .top = {5, 1}};
        f.id_hi = 5;
        f.oc = adt_optim_adamw(0.9f, 0.95f, 1e-2f, 0.0f);
    }
    return f;
}

static inline adt_graph *family_graph(const family *f, int batch, adt_model_io *io) {
    adt_graph *g = adt_graph_create();
    adt_model_build(g, &f->cfg, batch, io);
    adt_graph_backward(g, io->loss);
    adt_graph_optimizer(g, &f->oc);
    return g;
}

/* The whole batch's data of fed value v (of the whole-batch graph g) at a step. */
static inline void family_feed(const family *f, uint64_t seed, const adt_graph *g, const adt_model_io *io, int v,
                               int step, void *buf) {
    const adt_value *val = &g->values[v];
    uint64_t key = adt_rng_key(seed + (uint64_t)step * 7919u, val->name);
    int64_t n = adt_shape_numel(&val->shape);
    for (int64_t i = 0; i < n; i++) {
        uint32_t u = adt_rng_u32(key, (uint64_t)i);
        if (val->dtype == ADT_I32) ((int32_t *)buf)[i] = (int32_t)(u % (uint32_t)(v == io->label ? f->label_hi : f->id_hi));
        else if (v == io->label) ((float *)buf)[i] = (float)(u & 1);
        else ((float *)buf)[i] = 2.0f * adt_rng_uniform(key, (uint64_t)i) - 1.0f;
    }
}

#endif
