/*
 * op_optim.c - optimizer update ops (SGD with momentum and weight decay, AdamW). They update the
 * parameter and its state in place: each output aliases the state it overwrites, so a step
 * needs no second copy of the weights.
 */
#include "op_util.h"

/* SGD inputs: w, g, [m], lr, step -> outputs w, [m] (m only with momentum) */
static int sgd_count_out(const adt_node *n) { return n->n_in == 5 ? 2 : 1; }

static int optim_infer(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    const adt_shape *w = &OP_IN(g, n, 0)->shape;
    int n_state = n->n_in - 2; /* w, g, states...; lr and step last */
    for (int i = 0; i < n_state; i++) {
        if (op_need_dtype(g, n, i, ADT_F32)) return -1;
        if (!adt_shape_equal(&OP_IN(g, n, i)->shape, w)) return op_fail_shape(g, n, i, "the parameter's shape");
    }
    if (op_need_dtype(g, n, n->n_in - 2, ADT_F32) || op_need_dtype(g, n, n->n_in - 1, ADT_I32)) return -1;
    for (int k = 0; k < n->n_out; k++) {
        os[k] = *w;
        od[k] = ADT_F32;
    }
    return 0;
}

static float opt_lr(const adt_kctx *k) { return *(const float *)k->in[k->n->n_in - 2]; }
static int64_t opt_step(const adt_kctx *k) { return *(const int32_t *)k->in[k->n->n_in - 1]; }

static void sgd_forward(const adt_kctx *k) {
    float *m = k->n->n_in == 5 ? (float *)k->in[2] : NULL;
    adt_k_sgd_update((float *)k->in[0], m, K_IN(k, 1), K_NUMEL_IN(k, 0), opt_lr(k), k->n->a.f[0],
                     k->n->a.f[1], opt_step(k));
}

static void adamw_forward(const adt_kctx *k) {
    const float *f = k->n->a.f;
    adt_k_adamw_update((float *)k->in[0], (float *)k->in[2], (float *)k->in[3], K_IN(k, 1),
                       K_NUMEL_IN(k, 0), opt_lr(k), f[0], f[1], f[2], f[3], opt_step(k));
}

/* All tensors B, or all split along the same axis (ZeRO-style sharded update); the gradient is
 * never P, which is what forces the all-reduce or reduce-scatter before the update. */
static int optim_sbp(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int c = 0, r = OP_IN(g, n, 0)->shape.ndim;
    for (int ax = 0; ax < r && c < max; ax++) {
        adt_sbp_sig sig;
        memset(&sig, 0, sizeof sig);
        for (int i = 0; i < n->n_in - 2; i++) sig.in[i] = (adt_sbp){ADT_SBP_S, (int8_t)ax};
        for (int k = 0; k < n->n_out; k++) sig.out[k] = (adt_sbp){ADT_SBP_S, (int8_t)ax};
        out[c++] = sig;
    }
    return c;
}

static double sgd_flops(const adt_graph *g, const adt_node *n) { return 4.0 * (double)OP_NUMEL(g, n->in[0]); }
static double adamw_flops(const adt_graph *g, const adt_node *n) { return 14.0 * (double)OP_NUMEL(g, n->in[0]); }

const adt_op_def adt_opdef_sgd = {
    .name = "sgd", .n_in_min = 4, .n_in_max = 5, .n_out = 1, .count_out = sgd_count_out,
    .view_of = -1, .inplace = 1, .infer = optim_infer, .forward = sgd_forward,
    .flops = sgd_flops, .sbp = optim_sbp,
};
const adt_op_def adt_opdef_adamw = {
    .name = "adamw", .n_in_min = 6, .n_in_max = 6, .n_out = 3, .view_of = -1, .inplace = 1,
    .infer = optim_infer, .forward = adamw_forward, .flops = adamw_flops, .sbp = optim_sbp,
};
