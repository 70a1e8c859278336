/*
 * adtrain/graph.h - the training graph: values, nodes, the builder API, autodiff, optimizers.
 *
 * One graph holds the whole training step in the global (logical) view: forward ops, the
 * backward ops appended by adt_graph_backward(), and the optimizer update ops appended by
 * adt_graph_optimizer(). Gradients are ordinary values, so a later partitioner sees gradient
 * synchronisation as a plain SBP conversion (P -> B or P -> S) on an edge.
 *
 * Builder calls return a value id (>= 0), or -1 once the graph has an error. The error is
 * sticky: after the first failure every builder call returns -1 at once, and
 * adt_graph_error() says which node, which input and what shape was expected. So a model builder
 * makes all its calls and checks once at the end, like a cairo context.
 *
 * The structures are transparent on purpose: the partitioner, the planner and the tests walk
 * them directly. Treat them as read-only outside graph/ and the builders.
 */
#ifndef ADTRAIN_GRAPH_H
#define ADTRAIN_GRAPH_H

#include <stdint.h>

#include "adtrain/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define ADT_MAX_INPUTS 32
#define ADT_MAX_OUTPUTS 4
#define ADT_NAME_LEN 96

typedef enum adt_role {
    ADT_ROLE_INPUT = 0, /* fed each step (ids, images, dense features, lr, step)            */
    ADT_ROLE_ACT,       /* an activation produced by a forward op                            */
    ADT_ROLE_PARAM,     /* a trained weight: persistent                                      */
    ADT_ROLE_GRAD,      /* produced by a backward op                                         */
    ADT_ROLE_OPT_STATE, /* optimizer moments: persistent                                     */
    ADT_ROLE_LABEL,     /* targets, fed each step                                            */
} adt_role;
const char *adt_role_name(adt_role r);
/* Persistent values keep their storage across steps (and are what a checkpoint holds). */
int adt_role_is_persistent(adt_role r);
/* Fed values are written by the caller before each step. */
int adt_role_is_fed(adt_role r);

/* How a parameter (or optimizer state) is initialised. Element g of the tensor is a pure
 * function of (seed, name, g), so a sharded initialisation equals the serial one. */
typedef enum adt_init_kind {
    ADT_INIT_ZEROS = 0,
    ADT_INIT_ONES,
    ADT_INIT_CONST,   /* a                        */
    ADT_INIT_NORMAL,  /* mean 0, std a            */
    ADT_INIT_UNIFORM, /* uniform in [a, b)        */
} adt_init_kind;

typedef struct adt_init {
    adt_init_kind kind;
    float a, b;
} adt_init;

typedef struct adt_value {
    char name[ADT_NAME_LEN];
    adt_dtype dtype;
    adt_shape shape; /* the local shape: equal to the logical shape in a global graph */
    adt_role role;
    int producer;  /* node that writes it; -1 for leaves (inputs, labels, params, states)     */
    int out_index; /* which output of the producer                                            */
    int alias_of;  /* value whose storage this one shares (a reshape view or an in-place
                      optimizer update), -1 if it owns its storage                           */
    int grad;      /* the value holding d(loss)/d(this) once autodiff ran, else -1            */
    int param;     /* for OPT_STATE values: the parameter they belong to, else -1             */
    int layer_tag; /* repeated blocks share one tag (the planner ties their choices)          */
    int requires_grad; /* depends on a parameter                                              */
    int is_output;     /* kept alive to the end of the step (the loss, logits for eval)        */
    adt_init init;
    /* Where this local tensor sits inside the logical one: a box [offset, offset+shape) of
     * global_shape. A serial graph has offset 0 and global_shape == shape. Kernels that must
     * agree with the serial run element by element (dropout) use it. */
    adt_shape global_shape;
    int64_t offset[ADT_MAX_DIMS];
    /* Persistent values: the shape a checkpoint stores the value in when it differs from the
     * graph's (same elements, same row-major order), e.g. Hugging Face's c_attn.weight [C,3C]
     * held as [C,3,C]; ndim 0 when the two agree. Read it with adt_value_file_shape(). */
    adt_shape file_shape;
} adt_value;

/* Op attributes: small fixed arrays whose meaning each op documents (ops.h). */
typedef struct adt_attrs {
    int64_t i[8];
    float f[6];
} adt_attrs;

typedef struct adt_node {
    int op; /* adt_op_kind (ops.h) */
    int n_in, n_out;
    int in[ADT_MAX_INPUTS];
    int out[ADT_MAX_OUTPUTS];
    adt_attrs a;
    int layer_tag;
    int stage;        /* pipeline stage, 0 when not pipelined                   */
    int is_backward;  /* appended by autodiff                                   */
    int is_optimizer; /* appended by adt_graph_optimizer                        */
    int fwd_node;     /* for backward nodes: the forward node they differentiate */
    char name[ADT_NAME_LEN];
} adt_node;

typedef struct adt_graph {
    adt_value *values;
    int n_values, cap_values;
    adt_node *nodes;
    int n_nodes, cap_nodes;
    int status;    /* ADT_OK or the first error's code */
    char err[768]; /* the first error's message        */
    int cur_layer_tag;
    int cur_stage;
    int in_backward, in_optimizer; /* set while autodiff / optimizer append nodes */
    int cur_fwd_node;
    int loss;             /* the scalar loss, once adt_graph_backward ran, else -1 */
    int lr_input;         /* scalar input "lr" once an optimizer is attached, else -1 */
    int step_input;       /* scalar i32 input "step" (1-based), else -1 */
    int n_forward_nodes;  /* nodes [0, n_forward_nodes) are the forward pass */
    int *name_index;      /* value ids by name, open addressing (-1: empty), or NULL: built by the
                           * next adt_graph_find_value; a rename drops it */
    int name_cap;         /* its slots, a power of two above twice n_values */
} adt_graph;

adt_graph *adt_graph_create(void);
void adt_graph_free(adt_graph *g);
int adt_graph_error(const adt_graph *g); /* ADT_OK or the sticky error code */
const char *adt_graph_error_message(const adt_graph *g);
/* Records an error on the graph (first one wins); returns -1 for use as a builder result. */
int adt_graph_fail(adt_graph *g, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Subsequent nodes and parameters get this layer tag / stage. */
void adt_graph_set_layer_tag(adt_graph *g, int tag);
void adt_graph_set_stage(adt_graph *g, int stage);

int adt_graph_find_value(const adt_graph *g, const char *name); /* -1 if absent */
/* Renames value v (the caller keeps names unique). */
void adt_graph_rename_value(adt_graph *g, int v, const char *name);
/* Keeps the value alive to the end of a step so the caller can read it. */
void adt_graph_mark_output(adt_graph *g, int v);

/* ---- leaves ----------------------------------------------------------------------------- */
int adt_input(adt_graph *g, const char *name, adt_dtype dt, adt_shape shape);
int adt_label(adt_graph *g, const char *name, adt_dtype dt, adt_shape shape);
int adt_param(adt_graph *g, const char *name, adt_shape shape, adt_init init);
/* Declares the shape parameter v has in checkpoint files, when the graph holds it in another
 * shape of the same elements (a regrouping of axes: row-major, the bytes are the same). Its
 * optimizer state inherits it. Returns v, or -1 (the graph's error) when v is not a parameter or
 * the element counts differ. */
int adt_graph_set_file_shape(adt_graph *g, int v, adt_shape file_shape);
/* The shape value v has in checkpoint files: its file shape if one was declared, else its shape. */
adt_shape adt_value_file_shape(const adt_graph *g, int v);

/* ---- ops (shapes in the comments; see ops.h for attributes and SBP signatures) ----------- */
/* C = op(A) op(B). batched=0: each operand is viewed as a matrix [prod(leading), last] and a
 * non-transposed A keeps its leading dims in C (X[..,K] @ W[K,N] -> [..,N]); batched=1: both
 * have the same leading dims and each batch is multiplied. */
int adt_matmul(adt_graph *g, int a, int b, int trans_a, int trans_b, int batched);
/* A non-batched product that keeps an axis grouping: operand A (B) is viewed as a matrix whose
 * columns are its last a_cols (b_cols) axes and whose rows are the others; op() swaps the two
 * groups; the result has op(A)'s row axes then op(B)'s column axes. X[..,C] @ W[C,3,C] with
 * b_cols 2 gives [..,3,C]: the same numbers as X @ W viewed [C,3C], with q | k | v on an axis of
 * their own, so a split of the last axis cuts each of them alike. adt_matmul is a_cols = b_cols = 1. */
int adt_matmul_grouped(adt_graph *g, int a, int b, int trans_a, int trans_b, int a_cols, int b_cols);
int adt_add(adt_graph *g, int a, int b);               /* same shapes */
int adt_add_n(adt_graph *g, const int *xs, int n);      /* sum of n same-shape values */
int adt_sub(adt_graph *g, int a, int b);
int adt_mul(adt_graph *g, int a, int b);
int adt_scale(adt_graph *g, int x, float s);
int adt_bias_add(adt_graph *g, int x, int b);           /* x[..,N] + b[N]; x[..,3,C] + b[3,C] */
/* sum over the contiguous axes [first, last]; all axes gives a [1] tensor */
int adt_reduce_sum(adt_graph *g, int x, int first_axis, int last_axis);
int adt_relu(adt_graph *g, int x);
int adt_gelu(adt_graph *g, int x); /* tanh approximation */
int adt_sigmoid(adt_graph *g, int x);
int adt_layernorm(adt_graph *g, int x, int w, int b, float eps); /* over the last axis */
int adt_softmax(adt_graph *g, int x);                              /* over the last axis */
/* Causal multi-head self-attention: qkv[B,T,3,C] (q | k | v, each C = n_head heads of C/n_head)
 * -> [B,T,C], heads concatenated. */
int adt_attention(adt_graph *g, int qkv, int n_head);
int adt_embedding(adt_graph *g, int ids, int table);  /* ids[...] i32, table[V,C] -> [...,C] */
/* logits[..,V], labels[..] i32 -> loss[1] = mean over all label positions */
int adt_softmax_xent(adt_graph *g, int logits, int labels);
/* x[N] (or [N,1]), y same shape f32 in [0,1] -> loss[1], mean */
int adt_bce_logits(adt_graph *g, int x, int y);
/* x[N,C,H,W], w[K,C,R,S], bias[K] or -1 -> [N,K,P,Q] */
int adt_conv2d(adt_graph *g, int x, int w, int bias, int stride, int pad);
int adt_maxpool2d(adt_graph *g, int x, int k, int stride);
int adt_reshape(adt_graph *g, int x, adt_shape shape); /* a view: no copy */
int adt_flatten(adt_graph *g, int x);                  /* [N, ...] -> [N, prod(...)] */
int adt_permute(adt_graph *g, int x, const int *perm);
int adt_concat(adt_graph *g, const int *xs, int n, int axis);
int adt_slice(adt_graph *g, int x, int axis, int64_t start, int64_t len); /* f32 or i32 */
int adt_interaction(adt_graph *g, int x); /* x[B,F,D] -> [B, F(F-1)/2] */
/* Dropout with probability p. `stream` distinguishes dropout sites; the mask also depends on
 * the step input, so every step draws a fresh mask. p == 0 is the identity (no node). */
int adt_dropout(adt_graph *g, int x, float p, int stream);

/* ---- autodiff and optimizers -------------------------------------------------------------- */
/* Appends the backward pass of the scalar `loss` (shape [1]) and sets values[p].grad for every
 * parameter that the loss depends on. Parameters the loss does not reach get no gradient. */
int adt_graph_backward(adt_graph *g, int loss);

typedef enum adt_optim_kind { ADT_OPTIM_SGD = 0, ADT_OPTIM_ADAMW = 1 } adt_optim_kind;

typedef struct adt_optim_cfg {
    adt_optim_kind kind;
    float momentum;     /* SGD */
    float beta1, beta2; /* AdamW */
    float eps;          /* AdamW */
    float weight_decay;
    int decay_1d;       /* also decay 1-D parameters (biases, norms; by file shape); PyTorch's default is yes */
} adt_optim_cfg;

adt_optim_cfg adt_optim_sgd(float momentum, float weight_decay);
adt_optim_cfg adt_optim_adamw(float beta1, float beta2, float eps, float weight_decay);

/* Appends one update node per parameter with a gradient, creates the optimizer state
 * (zero-initialised OPT_STATE values named "opt.m.<param>", "opt.v.<param>") and the scalar
 * inputs "lr" (f32) and "step" (i32, 1-based), so a learning-rate schedule needs no rebuild. */
int adt_graph_optimizer(adt_graph *g, const adt_optim_cfg *cfg);

/* ---- inspection --------------------------------------------------------------------------- */
int64_t adt_value_numel(const adt_graph *g, int v);
int64_t adt_value_bytes(const adt_graph *g, int v);
/* Sum of numel over PARAM values. */
int64_t adt_graph_param_count(const adt_graph *g);
/* FLOPs of one step (all nodes), and of the matrix products only. */
double adt_graph_flops(const adt_graph *g);
double adt_graph_matmul_flops(const adt_graph *g);
/* Writes the graph as JSON (values, nodes, attributes, FLOPs) or Graphviz DOT. */
int adt_graph_dump_json(const adt_graph *g, const char *path);
int adt_graph_dump_dot(const adt_graph *g, const char *path);

#ifdef __cplusplus
}
#endif
#endif
