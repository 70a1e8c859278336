/*
 * gpt.c - the GPT-2 architecture as a graph, with Hugging Face GPT-2 names and Conv1D layouts
 * (y = x W + b, W [in, out]), so checkpoints move to and from PyTorch unchanged.
 *
 * c_attn is held as weight [C,3,C] and bias [3,C] (file shapes [C,3C] and [3C]: the same bytes),
 * its output as qkv [B,T,3,C]: q, k and v on an axis of their own, so a split of the last axis
 * gives a device the same heads of all three (tensor parallelism by heads).
 */
#include <math.h>
#include <stdio.h>

#include "adtrain/base.h"
#include "adtrain/models.h"

static int pname(adt_graph *g, const char *fmt, int layer, const char *leaf, adt_shape s, adt_init in) {
    char name[ADT_NAME_LEN];
    snprintf(name, sizeof name, fmt, layer, leaf);
    return adt_param(g, name, s, in);
}

/* x [B,T,in] @ W [in,out] + b [out] */
static int conv1d(adt_graph *g, int x, int layer, const char *w_leaf, const char *b_leaf, int in, int out,
                  float std) {
    int w = pname(g, "h.%d.%s", layer, w_leaf, adt_shape_2d(in, out), (adt_init){ADT_INIT_NORMAL, std, 0});
    int b = pname(g, "h.%d.%s", layer, b_leaf, adt_shape_1d(out), (adt_init){ADT_INIT_ZEROS, 0, 0});
    return adt_bias_add(g, adt_matmul(g, x, w, 0, 0, 0), b);
}

/* x [B,T,C] @ W [C,3,C] + b [3,C] -> qkv [B,T,3,C]; files see W [C,3C], b [3C] */
static int c_attn(adt_graph *g, int x, int layer, int C, float std) {
    int w = pname(g, "h.%d.%s", layer, "attn.c_attn.weight", adt_shape_3d(C, 3, C), (adt_init){ADT_INIT_NORMAL, std, 0});
    int b = pname(g, "h.%d.%s", layer, "attn.c_attn.bias", adt_shape_2d(3, C), (adt_init){ADT_INIT_ZEROS, 0, 0});
    adt_graph_set_file_shape(g, w, adt_shape_2d(C, 3 * C));
    adt_graph_set_file_shape(g, b, adt_shape_1d(3 * C));
    return adt_bias_add(g, adt_matmul_grouped(g, x, w, 0, 0, 1, 2), b);
}

static int layernorm(adt_graph *g, int x, int layer, const char *prefix, int C) {
    char wn[ADT_NAME_LEN], bn[ADT_NAME_LEN];
    if (layer >= 0) {
        snprintf(wn, sizeof wn, "h.%d.%s.weight", layer, prefix);
        snprintf(bn, sizeof bn, "h.%d.%s.bias", layer, prefix);
    } else {
        snprintf(wn, sizeof wn, "%s.weight", prefix);
        snprintf(bn, sizeof bn, "%s.bias", prefix);
    }
    int w = adt_param(g, wn, adt_shape_1d(C), (adt_init){ADT_INIT_ONES, 0, 0});
    int b = adt_param(g, bn, adt_shape_1d(C), (adt_init){ADT_INIT_ZEROS, 0, 0});
    return adt_layernorm(g, x, w, b, 1e-5f);
}

int adt_model_gpt(adt_graph *g, const adt_gpt_cfg *c, int batch, adt_model_io *io) {
    int V = c->vocab_size, T = c->n_ctx, L = c->n_layer, C = c->n_embd, H = c->n_head, B = batch;
    if (V < 1 || T < 1 || L < 1 || C < 1 || H < 1 || B < 1)
        return adt_graph_fail(g, ADT_ERR_ARG, "gpt: vocab_size, n_ctx, n_layer, n_embd, n_head and batch must be >= 1"),
               g->status;
    if (C % H)
        return adt_graph_fail(g, ADT_ERR_ARG, "gpt: n_embd (%d) must be divisible by n_head (%d)", C, H), g->status;
    float std = 0.02f, proj_std = 0.02f / sqrtf(2.0f * (float)L);
    adt_graph_set_layer_tag(g, 0);
    io->input = adt_input(g, "ids", ADT_I32, adt_shape_2d(B, T));
    io->input2 = -1;
    io->label = adt_label(g, "targets", ADT_I32, adt_shape_2d(B, T));
    int wte = adt_param(g, "wte.weight", adt_shape_2d(V, C), (adt_init){ADT_INIT_NORMAL, std, 0});
    int wpe = adt_param(g, "wpe.weight", adt_shape_2d(T, C), (adt_init){ADT_INIT_NORMAL, std, 0});
    int tok = adt_embedding(g, io->input, wte); /* [B,T,C] */
    /* positions broadcast over the batch: [B, T*C] + [T*C] */
    int x = adt_bias_add(g, adt_reshape(g, tok, adt_shape_2d(B, (int64_t)T * C)),
                         adt_reshape(g, wpe, adt_shape_1d((int64_t)T * C)));
    x = adt_reshape(g, x, adt_shape_3d(B, T, C));
    x = adt_dropout(g, x, c->dropout, 0);
    for (int l = 0; l < L; l++) {
        adt_graph_set_layer_tag(g, l + 1);
        int h = layernorm(g, x, l, "ln_1", C);
        int qkv = c_attn(g, h, l, C, std);  /* [B,T,3,C] */
        int a = adt_attention(g, qkv, H);   /* [B,T,C] */
        a = conv1d(g, a, l, "attn.c_proj.weight", "attn.c_proj.bias", C, C, proj_std);
        a = adt_dropout(g, a, c->dropout, 2 * l + 1);
        x = adt_add(g, x, a);
        h = layernorm(g, x, l, "ln_2", C);
        h = conv1d(g, h, l, "mlp.c_fc.weight", "mlp.c_fc.bias", C, 4 * C, std); /* [B,T,4C] */
        h = adt_gelu(g, h);
        h = conv1d(g, h, l, "mlp.c_proj.weight", "mlp.c_proj.bias", 4 * C, C, proj_std);
        h = adt_dropout(g, h, c->dropout, 2 * l + 2);
        x = adt_add(g, x, h);
    }
    adt_graph_set_layer_tag(g, L + 1);
    x = layernorm(g, x, -1, "ln_f", C);
    io->logits = adt_matmul(g, x, wte, 0, 1, 0); /* [B,T,V], tied to the token embedding */
    io->loss = adt_softmax_xent(g, io->logits, io->label);
    adt_graph_set_layer_tag(g, 0);
    return g->status;
}
