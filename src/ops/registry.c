/*
 * registry.c - the table of op definitions and the helpers every op uses.
 */
#include <stdarg.h>
#include <stdlib.h>

#include "op_util.h"

extern const adt_op_def adt_opdef_matmul, adt_opdef_add, adt_opdef_sub, adt_opdef_mul,
    adt_opdef_scale, adt_opdef_bias_add, adt_opdef_reduce_sum, adt_opdef_expand, adt_opdef_fill,
    adt_opdef_relu, adt_opdef_relu_bwd, adt_opdef_gelu, adt_opdef_gelu_bwd, adt_opdef_sigmoid,
    adt_opdef_sigmoid_bwd, adt_opdef_layernorm, adt_opdef_layernorm_bwd, adt_opdef_softmax,
    adt_opdef_softmax_bwd, adt_opdef_attention, adt_opdef_attention_bwd, adt_opdef_embedding,
    adt_opdef_embedding_bwd, adt_opdef_softmax_xent, adt_opdef_softmax_xent_bwd,
    adt_opdef_bce_logits, adt_opdef_bce_logits_bwd, adt_opdef_conv2d, adt_opdef_conv2d_bwd_data,
    adt_opdef_conv2d_bwd_weight, adt_opdef_maxpool2d, adt_opdef_maxpool2d_bwd, adt_opdef_reshape,
    adt_opdef_permute, adt_opdef_concat, adt_opdef_slice, adt_opdef_slice_grad,
    adt_opdef_interaction, adt_opdef_interaction_bwd, adt_opdef_dropout, adt_opdef_dropout_bwd,
    adt_opdef_sgd, adt_opdef_adamw, adt_opdef_boxing;

static const adt_op_def *const table[ADT_OP_COUNT] = {
    [ADT_OP_MATMUL] = &adt_opdef_matmul,
    [ADT_OP_ADD] = &adt_opdef_add,
    [ADT_OP_SUB] = &adt_opdef_sub,
    [ADT_OP_MUL] = &adt_opdef_mul,
    [ADT_OP_SCALE] = &adt_opdef_scale,
    [ADT_OP_BIAS_ADD] = &adt_opdef_bias_add,
    [ADT_OP_REDUCE_SUM] = &adt_opdef_reduce_sum,
    [ADT_OP_EXPAND] = &adt_opdef_expand,
    [ADT_OP_RELU] = &adt_opdef_relu,
    [ADT_OP_RELU_BWD] = &adt_opdef_relu_bwd,
    [ADT_OP_GELU] = &adt_opdef_gelu,
    [ADT_OP_GELU_BWD] = &adt_opdef_gelu_bwd,
    [ADT_OP_SIGMOID] = &adt_opdef_sigmoid,
    [ADT_OP_SIGMOID_BWD] = &adt_opdef_sigmoid_bwd,
    [ADT_OP_LAYERNORM] = &adt_opdef_layernorm,
    [ADT_OP_LAYERNORM_BWD] = &adt_opdef_layernorm_bwd,
    [ADT_OP_SOFTMAX] = &adt_opdef_softmax,
    [ADT_OP_SOFTMAX_BWD] = &adt_opdef_softmax_bwd,
    [ADT_OP_ATTENTION] = &adt_opdef_attention,
    [ADT_OP_ATTENTION_BWD] = &adt_opdef_attention_bwd,
    [ADT_OP_EMBEDDING] = &adt_opdef_embedding,
    [ADT_OP_EMBEDDING_BWD] = &adt_opdef_embedding_bwd,
    [ADT_OP_SOFTMAX_XENT] = &adt_opdef_softmax_xent,
    [ADT_OP_SOFTMAX_XENT_BWD] = &adt_opdef_softmax_xent_bwd,
    [ADT_OP_BCE_LOGITS] = &adt_opdef_bce_logits,
    [ADT_OP_BCE_LOGITS_BWD] = &adt_opdef_bce_logits_bwd,
    [ADT_OP_CONV2D] = &adt_opdef_conv2d,
    [ADT_OP_CONV2D_BWD_DATA] = &adt_opdef_conv2d_bwd_data,
    [ADT_OP_CONV2D_BWD_WEIGHT] = &adt_opdef_conv2d_bwd_weight,
    [ADT_OP_MAXPOOL2D] = &adt_opdef_maxpool2d,
    [ADT_OP_MAXPOOL2D_BWD] = &adt_opdef_maxpool2d_bwd,
    [ADT_OP_RESHAPE] = &adt_opdef_reshape,
    [ADT_OP_PERMUTE] = &adt_opdef_permute,
    [ADT_OP_CONCAT] = &adt_opdef_concat,
    [ADT_OP_SLICE] = &adt_opdef_slice,
    [ADT_OP_SLICE_GRAD] = &adt_opdef_slice_grad,
    [ADT_OP_INTERACTION] = &adt_opdef_interaction,
    [ADT_OP_INTERACTION_BWD] = &adt_opdef_interaction_bwd,
    [ADT_OP_DROPOUT] = &adt_opdef_dropout,
    [ADT_OP_DROPOUT_BWD] = &adt_opdef_dropout_bwd,
    [ADT_OP_FILL] = &adt_opdef_fill,
    [ADT_OP_SGD] = &adt_opdef_sgd,
    [ADT_OP_ADAMW] = &adt_opdef_adamw,
    [ADT_OP_BOXING] = &adt_opdef_boxing,
};

const adt_op_def *adt_op_get(int kind) {
    return kind >= 0 && kind < ADT_OP_COUNT ? table[kind] : NULL;
}

const char *adt_op_name(int kind) {
    const adt_op_def *d = adt_op_get(kind);
    return d ? d->name : "?";
}

int adt_op_find(const char *name) {
    for (int k = 0; k < ADT_OP_COUNT; k++)
        if (table[k] && !strcmp(table[k]->name, name)) return k;
    return -1;
}

double adt_node_flops(const adt_graph *g, const adt_node *n) {
    const adt_op_def *d = adt_op_get(n->op);
    return d->flops ? d->flops(g, n) : 0.0;
}

double adt_node_bytes(const adt_graph *g, const adt_node *n) {
    double b = 0;
    for (int i = 0; i < n->n_in; i++) b += (double)adt_value_bytes(g, n->in[i]);
    for (int k = 0; k < n->n_out; k++) b += (double)adt_value_bytes(g, n->out[k]);
    return b;
}

int adt_node_sbp_signatures(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max) {
    int count = 0;
    if (max < 1) return 0;
    memset(&out[0], 0, sizeof out[0]); /* all-B: always valid */
    count = 1;
    const adt_op_def *d = adt_op_get(n->op);
    if (d->sbp) count += d->sbp(g, n, out + 1, max - 1);
    return count;
}

/* ---- helpers ------------------------------------------------------------------------------ */

int op_fail_shape(adt_graph *g, const adt_node *n, int input, const char *expected) {
    char buf[64];
    const adt_value *v = OP_IN(g, n, input);
    return adt_graph_fail(g, ADT_ERR_SHAPE, "node %s: input %d ('%s') has shape %s %s, expected %s",
                          n->name, input, v->name, adt_shape_str(&v->shape, buf, sizeof buf),
                          adt_dtype_name(v->dtype), expected);
}

int op_need_dtype(adt_graph *g, const adt_node *n, int input, adt_dtype dt) {
    const adt_value *v = OP_IN(g, n, input);
    if (v->dtype == dt) return 0;
    return adt_graph_fail(g, ADT_ERR_SHAPE, "node %s: input %d ('%s') has dtype %s, expected %s",
                          n->name, input, v->name, adt_dtype_name(v->dtype), adt_dtype_name(dt));
}

int op_need_shape(adt_graph *g, const adt_node *n, int input, const adt_shape *want, const char *what) {
    if (adt_shape_equal(&OP_IN(g, n, input)->shape, want)) return 0;
    char exp[160], buf[64];
    snprintf(exp, sizeof exp, "%s (%s)", adt_shape_str(want, buf, sizeof buf), what);
    return op_fail_shape(g, n, input, exp);
}

int op_node(adt_graph *g, int op, const int *in, int n_in, const adt_attrs *a, int *outs) {
    int id = adt_graph_add_node(g, op, in, n_in, a);
    if (id < 0) return -1;
    for (int k = 0; k < g->nodes[id].n_out; k++) outs[k] = g->nodes[id].out[k];
    return id;
}

int op_node_out(adt_graph *g, int op, const int *in, int n_in, const adt_attrs *a, int k) {
    int outs[ADT_MAX_OUTPUTS];
    if (op_node(g, op, in, n_in, a, outs) < 0) return -1;
    return outs[k];
}

static int parse_sig_token(const char *tok, int rank, adt_sbp *s) {
    if (adt_sbp_parse(tok, s)) return -1;
    if (s->kind == ADT_SBP_S) {
        int ax = s->axis < 0 ? rank + s->axis : s->axis;
        if (ax < 0 || ax >= rank) return -1;
        s->axis = (int8_t)ax;
    }
    return 0;
}

void op_sig(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int *count, int max,
            const char *fmt, ...) {
    if (*count >= max) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    adt_sbp_sig sig;
    memset(&sig, 0, sizeof sig);
    int side = 0, idx = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, " ", &save); tok; tok = strtok_r(NULL, " ", &save)) {
        if (!strcmp(tok, "->")) { side = 1; idx = 0; continue; }
        int nv = side ? n->n_out : n->n_in;
        if (idx >= nv) return; /* template longer than the node: not for this arity */
        int vid = side ? n->out[idx] : n->in[idx];
        adt_sbp *dst = side ? &sig.out[idx] : &sig.in[idx];
        if (parse_sig_token(tok, g->values[vid].shape.ndim, dst)) return; /* axis absent */
        idx++;
    }
    out[(*count)++] = sig;
}

void op_sig_each_axis(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int *count, int max,
                      int limit) {
    for (int ax = 0; ax < limit && *count < max; ax++) {
        adt_sbp_sig sig;
        memset(&sig, 0, sizeof sig);
        for (int i = 0; i < n->n_in; i++) sig.in[i] = (adt_sbp){ADT_SBP_S, (int8_t)ax};
        for (int k = 0; k < n->n_out; k++) sig.out[k] = (adt_sbp){ADT_SBP_S, (int8_t)ax};
        out[(*count)++] = sig;
    }
}

void op_sig_partial(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int *count, int max) {
    if (*count >= max) return;
    adt_sbp_sig sig;
    memset(&sig, 0, sizeof sig);
    for (int i = 0; i < n->n_in; i++) sig.in[i] = (adt_sbp){ADT_SBP_P, 0};
    for (int k = 0; k < n->n_out; k++) sig.out[k] = (adt_sbp){ADT_SBP_P, 0};
    out[(*count)++] = sig;
}

int op_infer_same_shape(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od) {
    for (int i = 0; i < n->n_in; i++) {
        if (op_need_dtype(g, n, i, ADT_F32)) return -1;
        if (!adt_shape_equal(&OP_IN(g, n, i)->shape, &OP_IN(g, n, 0)->shape)) {
            char exp[96], buf[64];
            snprintf(exp, sizeof exp, "the shape of input 0, %s",
                     adt_shape_str(&OP_IN(g, n, 0)->shape, buf, sizeof buf));
            return op_fail_shape(g, n, i, exp);
        }
    }
    os[0] = OP_IN(g, n, 0)->shape;
    od[0] = ADT_F32;
    return 0;
}

double op_flops_per_out(const adt_graph *g, const adt_node *n) {
    double f = 0;
    for (int k = 0; k < n->n_out; k++) f += (double)OP_NUMEL(g, n->out[k]);
    return f;
}
