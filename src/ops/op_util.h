/*
 * op_util.h - helpers shared by the op definitions (src/ops/op_*.c): value access, shape-rule
 * error messages, SBP signature templates, and small node-building shorthands for backward rules.
 */
#ifndef ADTRAIN_OPS_OP_UTIL_H
#define ADTRAIN_OPS_OP_UTIL_H

#include <stdio.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ops.h"
#include "kernels.h"

#define OP_VAL(g, id) (&(g)->values[(id)])
#define OP_IN(g, n, i) (&(g)->values[(n)->in[(i)]])
#define OP_OUT(g, n, i) (&(g)->values[(n)->out[(i)]])
#define OP_NUMEL(g, id) adt_shape_numel(&(g)->values[(id)].shape)
#define K_IN(k, i) ((const float *)(k)->in[(i)])
#define K_OUT(k, i) ((float *)(k)->out[(i)])
#define K_NUMEL_IN(k, i) adt_shape_numel(&(k)->g->values[(k)->n->in[(i)]].shape)
#define K_NUMEL_OUT(k, i) adt_shape_numel(&(k)->g->values[(k)->n->out[(i)]].shape)
#define K_SHAPE_IN(k, i) (&(k)->g->values[(k)->n->in[(i)]].shape)
#define K_SHAPE_OUT(k, i) (&(k)->g->values[(k)->n->out[(i)]].shape)

/* Shape-rule failure naming the node, the input and what was expected. */
int op_fail_shape(adt_graph *g, const adt_node *n, int input, const char *expected);
/* Requires an f32 (or i32) input; returns -1 after recording the error. */
int op_need_dtype(adt_graph *g, const adt_node *n, int input, adt_dtype dt);
/* Requires input `input` to have exactly shape `want`; `what` says where that shape comes from
 * ("the shape of dy"). Backward ops check every input this way: a local (sharded) copy of a node
 * is only as safe as its shape rule, which must refuse blocks the kernel would read past. */
int op_need_shape(adt_graph *g, const adt_node *n, int input, const adt_shape *want, const char *what);

/* Adds a node and returns its output k (or -1). */
int op_node_out(adt_graph *g, int op, const int *in, int n_in, const adt_attrs *a, int k);
/* Adds a node and copies all its outputs to outs[]; returns the node id or -1. */
int op_node(adt_graph *g, int op, const int *in, int n_in, const adt_attrs *a, int *outs);

/* SBP signature templates: "S0 B -> S0", tokens B, P, S<k>; a negative k counts from the end
 * of that operand's rank. Appends if it fits and every split axis exists. */
void op_sig(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int *count, int max,
            const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* Emits "S(i) ... -> S(i) ..." on every operand for each axis i < limit (same-rank operands). */
void op_sig_each_axis(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int *count, int max,
                      int limit);
/* Emits "P ... -> P ..." (a linear op passes partial sums through). */
void op_sig_partial(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int *count, int max);

/* Shape rule of ops whose inputs are f32 of one shape and whose single output has it too. */
int op_infer_same_shape(adt_graph *g, const adt_node *n, adt_shape *os, adt_dtype *od);

/* Default FLOP estimate: one per output element. */
double op_flops_per_out(const adt_graph *g, const adt_node *n);

#endif
