/*
 * adtrain/ops.h - the op registry: per op kind its shape rule, CPU kernel, backward rule,
 * FLOP and byte counts, scratch size and 1-D SBP signatures.
 *
 * Adding an op means: an enum entry here, an adt_op_def in src/ops/op_*.c registered in
 * registry.c, a builder in graph.h, and a case in the op tests (finite differences in
 * tests/test_graph.c, and the virtual-mesh check of each signature in tests/test_dist_vmesh.c).
 * An op whose attributes carry sizes or positions (the output shape of a reshape, the first
 * row of a vocabulary shard) also gets a `localize` rule that rewrites them for a block.
 *
 * Attributes per op (adt_attrs.i[] / .f[]):
 *   MATMUL          i0 trans_a, i1 trans_b, i2 batched, i3 / i4 how many trailing axes of A / B
 *                   form a non-batched operand's matrix columns (0 or 1: the last axis; more keep
 *                   an axis grouping through the product: adt_matmul_grouped); i5 = 1 only in
                   the executor's fused form (accumulate into the output, op_math.c)
 *   SCALE           f0 factor
 *   REDUCE_SUM      i0 first axis, i1 last axis (inclusive)
 *   EXPAND          i0 first axis, i1 last axis, i2.. the sizes of those axes; f0 = 1 when
 *                   the input is the [1] of a reduction over every axis. The inverse of
 *                   REDUCE_SUM: broadcasts a reduced tensor back
 *   LAYERNORM       f0 eps                      outputs: y, mean[..], rstd[..]
 *   ATTENTION       i0 heads, i1 head size D (0: C / heads); input qkv[B,T,3,C]
 *                   outputs: y[B,T,C], att[B,H,T,T]. A block of whole heads holds
 *                   C_local / D of them (the localize rule); a block that cuts a head is refused
 *   EMBEDDING       i0 row0 (first vocabulary row held locally; 0 serially)
 *   SOFTMAX_XENT    f0 denominator (number of label positions in the GLOBAL batch)
 *                   outputs: loss[1], probs[..,V]
 *   BCE_LOGITS      f0 denominator (global)
 *   CONV2D          i0 stride, i1 pad, i2 has_bias
 *   MAXPOOL2D       i0 window, i1 stride         outputs: y, argmax (i32)
 *   RESHAPE         the output shape is the value's shape (a view of the input)
 *   PERMUTE         i0..i5 the permutation
 *   CONCAT          i0 axis
 *   SLICE           i0 axis, i1 start, i2 len; f32 or i32 (the output keeps the dtype)
 *   SLICE_GRAD      i0 axis, i1 start, i2 full length (zero-pads a slice back into place)
 *   DROPOUT         f0 p, i0 stream; input 1 is the step (i32 scalar)
 *   FILL            f0 value (used for d loss / d loss = 1)
 *   BOXING          one step of an SBP conversion in a rank's local graph (made by the
 *                   partitioner, run by the executor's communicator): i0 kind | mesh axis << 8,
 *                   i1 the nd-SBP before | after << 32 (packed by dist/), i2..i7 the output's
 *                   local shape (rank of the input)
 *   SGD             f0 momentum, f1 weight decay; inputs w, g, [m], lr, step; outputs w, [m]
 *   ADAMW           f0 beta1, f1 beta2, f2 eps, f3 weight decay; inputs w, g, m, v, lr, step
 *                   outputs w, m, v (in place: outputs alias the state)
 * Backward ops (appended by autodiff only) carry the forward op's attributes.
 */
#ifndef ADTRAIN_OPS_H
#define ADTRAIN_OPS_H

#include <stdint.h>

#include "adtrain/graph.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum adt_op_kind {
    ADT_OP_MATMUL = 0,
    ADT_OP_ADD,
    ADT_OP_SUB,
    ADT_OP_MUL,
    ADT_OP_SCALE,
    ADT_OP_BIAS_ADD,
    ADT_OP_REDUCE_SUM,
    ADT_OP_EXPAND,
    ADT_OP_RELU,
    ADT_OP_RELU_BWD,
    ADT_OP_GELU,
    ADT_OP_GELU_BWD,
    ADT_OP_SIGMOID,
    ADT_OP_SIGMOID_BWD,
    ADT_OP_LAYERNORM,
    ADT_OP_LAYERNORM_BWD,
    ADT_OP_SOFTMAX,
    ADT_OP_SOFTMAX_BWD,
    ADT_OP_ATTENTION,
    ADT_OP_ATTENTION_BWD,
    ADT_OP_EMBEDDING,
    ADT_OP_EMBEDDING_BWD,
    ADT_OP_SOFTMAX_XENT,
    ADT_OP_SOFTMAX_XENT_BWD,
    ADT_OP_BCE_LOGITS,
    ADT_OP_BCE_LOGITS_BWD,
    ADT_OP_CONV2D,
    ADT_OP_CONV2D_BWD_DATA,
    ADT_OP_CONV2D_BWD_WEIGHT,
    ADT_OP_MAXPOOL2D,
    ADT_OP_MAXPOOL2D_BWD,
    ADT_OP_RESHAPE,
    ADT_OP_PERMUTE,
    ADT_OP_CONCAT,
    ADT_OP_SLICE,
    ADT_OP_SLICE_GRAD,
    ADT_OP_INTERACTION,
    ADT_OP_INTERACTION_BWD,
    ADT_OP_DROPOUT,
    ADT_OP_DROPOUT_BWD,
    ADT_OP_FILL,
    ADT_OP_SGD,
    ADT_OP_ADAMW,
    ADT_OP_BOXING,
    ADT_OP_COUNT
} adt_op_kind;

struct adt_kctx;

/* How a communication op (BOXING) reaches the ranks' communicator: the executor calls the hook
 * it was given (adt_exec_opts.comm) for every communication node. run() performs node k->n on
 * k->in / k->out with the other ranks and returns ADT_OK or an error code (the message set
 * with adt_error, or left in ctx).
 *
 * A hook may also offer the split form, all three of start / test / finish or none: start()
 * posts the node's communication and returns at once; test() polls it without blocking (*done
 * = 1 once it completed); finish() completes it (a bounded wait) and leaves the result in
 * k->out. Between start and finish the executor keeps k->in and k->out alive and unwritten by
 * anything else, so a hook may send from and receive into them directly. With the split form
 * the executor overlaps communication with computation (exec.h). */
typedef struct adt_comm_hook {
    int (*run)(void *ctx, const struct adt_kctx *k);
    void *ctx;
    int (*start)(void *ctx, const struct adt_kctx *k);
    int (*test)(void *ctx, const struct adt_kctx *k, int *done);
    int (*finish)(void *ctx, const struct adt_kctx *k);
    /* 1: an all-reduce step may be given its input's buffer as its output (k->out[0] ==
     * k->in[0]); the executor then does so when nothing else reads the input, saving a copy and
     * a buffer per gradient. */
    int inplace_allreduce;
} adt_comm_hook;

/* What a kernel sees: the node, its values, and the buffers the executor assigned. */
typedef struct adt_kctx {
    const adt_graph *g;
    const adt_node *n;
    void *const *in;  /* [n->n_in]  */
    void *const *out; /* [n->n_out] */
    float *scratch;   /* adt_op_def.scratch floats, 64-byte aligned */
    uint64_t seed;    /* the run's seed (dropout) */
    int training;     /* 0 in evaluation runs: dropout is the identity */
    const adt_comm_hook *comm; /* communication ops only; NULL otherwise */
    int microbatch;   /* the run is microbatch m of a step: axis 0 (the batch) of every tensor is
                         rows [m B, (m+1) B) of the whole batch's (dropout draws by those rows) */
} adt_kctx;

/* A concrete 1-D SBP signature of one node: an SBP for each input and each output. */
typedef struct adt_sbp_sig {
    adt_sbp in[ADT_MAX_INPUTS];
    adt_sbp out[ADT_MAX_OUTPUTS];
} adt_sbp_sig;

typedef struct adt_op_def {
    const char *name;
    int n_in_min, n_in_max; /* inputs accepted                                    */
    int n_out;              /* outputs created                                     */
    int (*count_out)(const adt_node *n); /* overrides n_out when set (optional state) */
    int view_of;            /* output 0 is a view of this input (reshape), or -1   */
    int inplace;            /* outputs alias inputs (optimizer updates)            */
    /* Shape rule: fill the output shapes and dtypes, or return adt_graph_fail(...) naming the
     * input and the expected shape. */
    int (*infer)(adt_graph *g, const adt_node *n, adt_shape *out_shape, adt_dtype *out_dtype);
    void (*forward)(const adt_kctx *k);
    /* Backward rule: given the gradient value of each output (-1 if none) and which inputs need
     * a gradient, build backward nodes and set din[i] (or leave -1). NULL: not differentiable. */
    int (*backward)(adt_graph *g, int node, const int *dout, const int *need, int *din);
    double (*flops)(const adt_graph *g, const adt_node *n);
    int64_t (*scratch)(const adt_graph *g, const adt_node *n); /* floats; NULL: none */
    /* Emits the node's valid 1-D SBP signatures (the all-B one included), up to max; returns
     * the count. Written as format templates over the node's axes (registry.c). */
    int (*sbp)(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max);
    /* Attributes of a local copy of node n whose inputs and outputs are the blocks in[] and
     * out[] of the global values (dist/ partitions a graph with it). `a` starts as n->a. NULL:
     * the attributes hold for any block (shapes come from the inputs). */
    void (*localize)(const adt_node *n, const adt_box *in, const adt_box *out, adt_attrs *a);
    int is_matmul; /* counts toward the GEMM-bound floor */
    int is_comm;   /* communicates: runs through adt_kctx.comm, exists only in local graphs */
} adt_op_def;

const adt_op_def *adt_op_get(int kind);
const char *adt_op_name(int kind);
int adt_op_find(const char *name); /* -1 if unknown */

/* Generic node creation used by every builder: checks the inputs, runs the shape rule, creates
 * the outputs (role ACT, or GRAD inside autodiff) and returns the node id, or -1. */
int adt_graph_add_node(adt_graph *g, int op, const int *in, int n_in, const adt_attrs *a);
/* The GEMM a MATMUL node runs: C[M,N] = op(A)[M,K] op(B)[K,N], batch of them (1 unless batched),
 * from its input shapes and column groups. */
void adt_matmul_dims(const adt_graph *g, const adt_node *n, int64_t *M, int64_t *N, int64_t *K, int64_t *batch);
/* FLOPs and bytes moved of one node. */
double adt_node_flops(const adt_graph *g, const adt_node *n);
double adt_node_bytes(const adt_graph *g, const adt_node *n);
/* The node's 1-D SBP signatures (the all-B signature always first). */
int adt_node_sbp_signatures(const adt_graph *g, const adt_node *n, adt_sbp_sig *out, int max);

#ifdef __cplusplus
}
#endif
#endif
