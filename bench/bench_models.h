/*
 * bench_models.h - the benchmark models (GPT-S, the MLP, the VGG and the DLRM, as
 * bench/torch_peer.py defines them)
 * and the list of GEMM shapes one training step of a graph performs: shared by bench_core.c
 * (the step, and its GEMM floor) and bench_gemm.c (the GEMM backends on those shapes).
 */
#ifndef ADTRAIN_BENCH_MODELS_H
#define ADTRAIN_BENCH_MODELS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/adtrain.h"

/* A model as the peer defines it, plus what the step needs fed. */
typedef struct model_spec {
    const char *name;
    int batch;
    float lr;
    const char *optimizer; /* the peer's type(opt).__name__ */
    double peer_flops;     /* the peer's matmul_flops_per_step formula, for the cross-check */
} model_spec;

enum { GPT_V = 65, GPT_T = 128, GPT_L = 4, GPT_C = 256, GPT_H = 4, GPT_B = 8 };
static const int mlp_sizes[] = {784, 1024, 1024, 10};
enum { MLP_B = 128, MLP_N = (int)(sizeof mlp_sizes / sizeof mlp_sizes[0]) };
enum { VGG_B = 64, DLRM_B = 256 }; /* torch_peer.py VGG_BATCH, DLRM_BATCH */

/* torch_peer.py gpt_matmul_flops: 3 * (L * (24 N C^2 + 4 B T^2 C) + 2 N C V), N = B T. */
static inline double peer_gpt_flops(void) {
    double B = GPT_B, T = GPT_T, C = GPT_C, V = GPT_V, N = B * T;
    return 3.0 * (GPT_L * (24.0 * N * C * C + 4.0 * B * T * T * C) + 2.0 * N * C * V);
}

/* torch_peer.py mlp_matmul_flops: forward and weight gradient for every layer, the input
 * gradient for every layer but the first (its input is data). */
static inline double peer_mlp_flops(void) {
    double f = 0;
    for (int i = 0; i + 1 < MLP_N; i++) f += 2.0 * MLP_B * mlp_sizes[i] * mlp_sizes[i + 1] * (i > 0 ? 3 : 2);
    return f;
}

/* Appends model, loss, backward pass and optimizer to g, for `ranks` times the batch; *cfg gets
 * the model's config (what an expert plan is made for). */
static inline int build_model(adt_graph *g, const char *name, int ranks, model_spec *spec, adt_model_io *io,
                       adt_model_cfg *cfg) {
    memset(cfg, 0, sizeof *cfg);
    adt_optim_cfg oc;
    if (!strcmp(name, "gpt-s")) {
        cfg->type = ADT_MODEL_GPT;
        cfg->gpt = (adt_gpt_cfg){.vocab_size = GPT_V, .n_ctx = GPT_T, .n_layer = GPT_L, .n_embd = GPT_C,
                                 .n_head = GPT_H, .dropout = 0.0f};
        *spec = (model_spec){name, GPT_B, 3e-4f, "AdamW", peer_gpt_flops()};
        /* torch.optim.AdamW(model.parameters(), ...) is one group: every parameter decays. */
        oc = adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.1f);
        oc.decay_1d = 1;
    } else if (!strcmp(name, "mlp")) {
        cfg->type = ADT_MODEL_MLP;
        cfg->mlp = (adt_mlp_cfg){.n_sizes = MLP_N, .activation = ADT_ACT_RELU};
        for (int i = 0; i < MLP_N; i++) cfg->mlp.sizes[i] = mlp_sizes[i];
        *spec = (model_spec){name, MLP_B, 0.01f, "SGD", peer_mlp_flops()};
        oc = adt_optim_sgd(0.9f, 0.0f);
    } else {
        /* vgg and dlrm: the peer reads the same files; its GEMM count leaves convolutions and the
         * interaction out, so there is no closed form to check against (peer_flops < 0). */
        int vgg = !strcmp(name, "vgg");
        const char *path = vgg ? "configs/vgg-mnist.json" : "configs/dlrm-small.json";
        if (adt_model_cfg_load(cfg, path)) {
            fprintf(stderr, "%s (run from the repository root)\n", adt_error_message());
            return -1;
        }
        *spec = (model_spec){name, vgg ? VGG_B : DLRM_B, 0.01f, "SGD", -1};
        oc = adt_optim_sgd(0.9f, 0.0f);
    }
    adt_model_build(g, cfg, spec->batch * ranks, io);
    adt_graph_backward(g, io->loss);
    adt_graph_optimizer(g, &oc);
    if (adt_graph_error(g)) {
        fprintf(stderr, "building %s: %s\n", name, adt_graph_error_message(g));
        return -1;
    }
    return 0;
}

/* One GEMM shape of the step: C[M,N] = op(A) op(B) over K, performed `count` times per step. */
typedef struct gemm_shape {
    int64_t M, N, K;
    int ta, tb;
    int phase; /* 0 forward, 1 backward (for the profile's shape table) */
    int acc;   /* 1: the step accumulates the product onto C (adt_gemm's beta = 1), 0: plain */
    int64_t count;
    double med_s; /* replay: median seconds for all `count` calls */
} gemm_shape;

typedef struct gemm_list {
    gemm_shape *s;
    int n, cap;
} gemm_list;

static inline void gemm_add(gemm_list *l, int64_t M, int64_t N, int64_t K, int ta, int tb, int phase, int acc,
                            int64_t count) {
    for (int i = 0; i < l->n; i++) {
        gemm_shape *s = &l->s[i];
        if (s->M == M && s->N == N && s->K == K && s->ta == ta && s->tb == tb && s->phase == phase &&
            s->acc == acc) {
            s->count += count;
            return;
        }
    }
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->s = realloc(l->s, (size_t)l->cap * sizeof *l->s);
        if (!l->s) abort();
    }
    l->s[l->n++] = (gemm_shape){M, N, K, ta, tb, phase, acc, count, 0};
}

/* Collects every GEMM of the step. The fused attention ops become their per-(batch, head)
 * products at the full T x T size, which is what their FLOP count (and the peer's) assumes;
 * the kernel itself skips the masked blocks, so it does somewhat less work than that. With an
 * executor (else NULL: every product plain) each matmul is taken in the form that executor runs
 * it, plain or accumulating (adt_exec_matmul_accumulates). Returns the FLOPs of the collected
 * GEMMs, which should equal adt_graph_matmul_flops. */
static inline double collect_gemms(const adt_graph *g, const adt_exec *ex, gemm_list *l) {
    double flops = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        int phase = n->is_backward ? 1 : 0;
        if (n->op == ADT_OP_MATMUL) {
            int64_t M, N, K, batch;
            adt_matmul_dims(g, n, &M, &N, &K, &batch);
            int acc = ex ? adt_exec_matmul_accumulates(ex, i) : 0;
            gemm_add(l, M, N, K, (int)n->a.i[0], (int)n->a.i[1], phase, acc, batch);
            flops += 2.0 * (double)(batch * M * N * K);
        } else if (n->op == ADT_OP_ATTENTION || n->op == ADT_OP_ATTENTION_BWD) {
            const adt_shape *q = &g->values[n->in[n->op == ADT_OP_ATTENTION ? 0 : 1]].shape;
            int64_t B = q->dim[0], T = q->dim[1], C = q->dim[3], H = n->a.i[0], D = C / H; /* qkv [B,T,3,C] */
            int64_t bh = B * H;
            gemm_add(l, T, T, D, 0, 1, phase, 0, bh); /* q k^T, or dout v^T */
            gemm_add(l, T, D, T, 0, 0, phase, 0, bh); /* P v, or dS k        */
            if (n->op == ADT_OP_ATTENTION_BWD) gemm_add(l, T, D, T, 1, 0, phase, 0, 2 * bh); /* dS^T q, P^T dout */
            flops += (n->op == ADT_OP_ATTENTION ? 4.0 : 8.0) * (double)(bh * T * T * D);
        } else if (adt_op_get(n->op)->is_matmul) {
            fprintf(stderr, "note: GEMM op %s (node %s) is not replayed\n", adt_op_name(n->op), n->name);
        }
    }
    return flops;
}

#endif
