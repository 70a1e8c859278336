/*
 * autodiff.c - reverse-mode differentiation of the training graph, and optimizer attachment.
 *
 * Walks the forward nodes in reverse and asks each op's backward rule to append the nodes that
 * compute its input gradients. A value read by several nodes gets one gradient contribution from
 * each; they are summed by one n-ary add, just before the value's producer is differentiated
 * (by then every consumer, which comes later in the order, has contributed).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ops.h"
#include "graph_internal.h"

typedef struct contrib_list {
    int *v;
    int n, cap;
} contrib_list;

static void contrib_push(contrib_list *l, int v) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 4;
        l->v = adt_realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n++] = v;
}

/* One gradient value from all contributions (-1 if none). */
static int contrib_sum(adt_graph *g, contrib_list *l) {
    if (l->n == 0) return -1;
    int acc = l->v[0];
    int i = 1;
    while (i < l->n) { /* n-ary adds of at most ADT_MAX_INPUTS operands */
        int batch[ADT_MAX_INPUTS], k = 0;
        batch[k++] = acc;
        while (i < l->n && k < ADT_MAX_INPUTS) batch[k++] = l->v[i++];
        acc = adt_add_n(g, batch, k);
    }
    return acc;
}

int adt_graph_backward(adt_graph *g, int loss) {
    if (g->status) return g->status;
    if (g->loss >= 0) return adt_graph_fail(g, ADT_ERR_STATE, "backward: the graph already has a backward pass"), g->status;
    if (loss < 0 || loss >= g->n_values) return adt_graph_fail(g, ADT_ERR_ARG, "backward: bad loss value"), g->status;
    const adt_value *L = &g->values[loss];
    if (L->dtype != ADT_F32 || adt_shape_numel(&L->shape) != 1)
        return adt_graph_fail(g, ADT_ERR_SHAPE, "backward: the loss '%s' must be one f32 number", L->name), g->status;
    if (!L->requires_grad)
        return adt_graph_fail(g, ADT_ERR_ARG, "backward: the loss '%s' does not depend on any parameter", L->name),
               g->status;

    int n_fwd = g->n_nodes;
    g->n_forward_nodes = n_fwd;
    g->loss = loss;
    g->values[loss].is_output = 1;
    int nv0 = g->n_values;
    contrib_list *cl = adt_calloc((size_t)nv0, sizeof *cl);
    int saved_tag = g->cur_layer_tag, saved_stage = g->cur_stage;

    g->in_backward = 1;
    g->cur_fwd_node = g->values[loss].producer;
    g->cur_layer_tag = g->values[loss].layer_tag;
    adt_attrs one = {.f = {1.0f}};
    int seed_node = adt_graph_add_node(g, ADT_OP_FILL, NULL, 0, &one);
    int seed = seed_node >= 0 ? g->nodes[seed_node].out[0] : -1;
    if (seed >= 0) {
        adt_graph_rename_value(g, seed, "grad.loss");
        contrib_push(&cl[loss], seed);
    }

    for (int i = n_fwd - 1; i >= 0 && !g->status; i--) {
        const adt_node n = g->nodes[i]; /* a copy: adding nodes may move the array */
        const adt_op_def *def = adt_op_get(n.op);
        int dout[ADT_MAX_OUTPUTS], need[ADT_MAX_INPUTS], din[ADT_MAX_INPUTS], any_need = 0;
        g->cur_fwd_node = i;
        g->cur_layer_tag = n.layer_tag;
        g->cur_stage = n.stage;
        for (int k = 0; k < n.n_out; k++) dout[k] = contrib_sum(g, &cl[n.out[k]]);
        if (dout[0] < 0) continue; /* only auxiliary outputs (saved statistics) reached */
        for (int j = 0; j < n.n_in; j++) {
            need[j] = g->values[n.in[j]].requires_grad;
            din[j] = -1;
            any_need |= need[j];
        }
        if (!any_need) continue;
        if (!def->backward) {
            adt_graph_fail(g, ADT_ERR_UNSUPPORTED, "backward: op %s (node %s) has no backward rule", def->name, n.name);
            break;
        }
        if (def->backward(g, i, dout, need, din) < 0 || g->status) break;
        for (int j = 0; j < n.n_in; j++)
            if (need[j] && din[j] >= 0) contrib_push(&cl[n.in[j]], din[j]);
    }

    for (int v = 0; v < nv0 && !g->status; v++) {
        if (g->values[v].role != ADT_ROLE_PARAM) continue;
        g->cur_layer_tag = g->values[v].layer_tag;
        int gv = contrib_sum(g, &cl[v]);
        g->values[v].grad = gv;
        if (gv >= 0 && gv != v && !strncmp(g->values[gv].name, "bwd.", 4)) {
            char name[ADT_NAME_LEN];
            snprintf(name, sizeof name, "grad.%.*s", ADT_NAME_LEN - 6, g->values[v].name);
            adt_graph_rename_value(g, gv, name);
        }
    }
    g->in_backward = 0;
    g->cur_fwd_node = -1;
    g->cur_layer_tag = saved_tag;
    g->cur_stage = saved_stage;
    for (int v = 0; v < nv0; v++) free(cl[v].v);
    free(cl);
    return g->status;
}

adt_optim_cfg adt_optim_sgd(float momentum, float weight_decay) {
    adt_optim_cfg c = {.kind = ADT_OPTIM_SGD, .momentum = momentum, .weight_decay = weight_decay, .decay_1d = 1};
    return c;
}

adt_optim_cfg adt_optim_adamw(float beta1, float beta2, float eps, float weight_decay) {
    adt_optim_cfg c = {.kind = ADT_OPTIM_ADAMW, .beta1 = beta1, .beta2 = beta2, .eps = eps,
                       .weight_decay = weight_decay, .decay_1d = 1};
    return c;
}

int adt_graph_optimizer(adt_graph *g, const adt_optim_cfg *cfg) {
    if (g->status) return g->status;
    if (g->loss < 0) return adt_graph_fail(g, ADT_ERR_STATE, "optimizer: run adt_graph_backward first"), g->status;
    if (g->lr_input >= 0) return adt_graph_fail(g, ADT_ERR_STATE, "optimizer: the graph already has one"), g->status;
    if (cfg->kind == ADT_OPTIM_ADAMW && !(cfg->beta1 >= 0 && cfg->beta1 < 1 && cfg->beta2 >= 0 && cfg->beta2 < 1 && cfg->eps > 0))
        return adt_graph_fail(g, ADT_ERR_ARG, "optimizer: AdamW needs 0 <= beta1, beta2 < 1 and eps > 0"), g->status;
    if (cfg->momentum < 0 || cfg->weight_decay < 0)
        return adt_graph_fail(g, ADT_ERR_ARG, "optimizer: momentum and weight decay must be >= 0"), g->status;
    g->lr_input = adt_input(g, "lr", ADT_F32, adt_shape_1d(1));
    if (g->step_input < 0) g->step_input = adt_input(g, "step", ADT_I32, adt_shape_1d(1));
    int saved_tag = g->cur_layer_tag;
    g->in_optimizer = 1;
    int nv = g->n_values;
    for (int p = 0; p < nv && !g->status; p++) {
        const adt_value w = g->values[p];
        if (w.role != ADT_ROLE_PARAM || w.grad < 0) continue;
        g->cur_layer_tag = w.layer_tag;
        /* the rank the parameter has in PyTorch (its file shape): a bias held as [3,C] is 1-D */
        float wd = (adt_value_file_shape(g, p).ndim >= 2 || cfg->decay_1d) ? cfg->weight_decay : 0.0f;
        char name[ADT_NAME_LEN + 8];
        if (cfg->kind == ADT_OPTIM_SGD) {
            adt_attrs at = {.f = {cfg->momentum, wd}};
            if (cfg->momentum > 0) {
                snprintf(name, sizeof name, "opt.m.%s", w.name);
                int m = adt_graph_new_state(g, name, w.shape, p);
                adt_graph_add_node(g, ADT_OP_SGD, (int[]){p, w.grad, m, g->lr_input, g->step_input}, 5, &at);
            } else {
                adt_graph_add_node(g, ADT_OP_SGD, (int[]){p, w.grad, g->lr_input, g->step_input}, 4, &at);
            }
        } else {
            adt_attrs at = {.f = {cfg->beta1, cfg->beta2, cfg->eps, wd}};
            snprintf(name, sizeof name, "opt.m.%s", w.name);
            int m = adt_graph_new_state(g, name, w.shape, p);
            snprintf(name, sizeof name, "opt.v.%s", w.name);
            int v = adt_graph_new_state(g, name, w.shape, p);
            adt_graph_add_node(g, ADT_OP_ADAMW, (int[]){p, w.grad, m, v, g->lr_input, g->step_input}, 6, &at);
        }
    }
    g->in_optimizer = 0;
    g->cur_layer_tag = saved_tag;
    return g->status;
}
