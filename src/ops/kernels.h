/*
 * kernels.h - the CPU compute kernels behind the op registry, as plain functions on float arrays.
 *
 * Conventions (llm.c style):
 *  - outputs first, then inputs, then parameters, then sizes; shapes are in the comments;
 *  - every kernel WRITES its outputs (=), it never accumulates into them: the graph sums
 *    gradients with explicit add nodes, and the memory planner may hand a kernel a dirty buffer;
 *  - sizes are int64_t, loops index with int64_t (no int overflow at large sizes);
 *  - no allocation inside a kernel: a kernel that needs scratch says how much through a
 *    *_scratch_floats() function and receives it from the executor;
 *  - single-threaded loops written so -O3 -march=native vectorises them; matrix products go to
 *    the GEMM layer, adt_gemm (its backend and thread count are set once, gemm.h).
 * Letters: N rows (tokens or samples), C channels, V vocabulary/classes, B batch, T time, H heads.
 */
#ifndef ADTRAIN_OPS_KERNELS_H
#define ADTRAIN_OPS_KERNELS_H

#include <stdint.h>

/* ---- matrix product (k_matmul.c) ----------------------------------------------------------
 * C[M,N] = op(A) op(B), op = transpose when the flag is set; A is [M,K] (or [K,M] if transA),
 * B is [K,N] (or [N,K] if transB). Batched: `batch` independent products with strides
 * sA, sB, sC (elements); a stride of 0 broadcasts that operand. */
void adt_k_matmul(float *C, const float *A, const float *B, int64_t M, int64_t N, int64_t K,
                  int transA, int transB);
/* C[M,N] = op(A) op(B) + bias[N] added to every row (a linear layer): one pass over C fewer
 * than a product followed by a bias add. */
void adt_k_matmul_bias(float *C, const float *A, const float *B, const float *bias, int64_t M,
                       int64_t N, int64_t K, int transA, int transB);
/* C[M,N] = op(A) op(B) + beta C; with beta = 0, C is only written (may hold anything). */
void adt_k_matmul_acc(float *C, const float *A, const float *B, float beta, int64_t M, int64_t N,
                      int64_t K, int transA, int transB);
void adt_k_matmul_batched(float *C, const float *A, const float *B, int64_t batch, int64_t M,
                          int64_t N, int64_t K, int transA, int transB, int64_t sA, int64_t sB,
                          int64_t sC);

/* ---- pointwise activations (k_act.c) ------------------------------------------------------ */
void adt_k_relu_forward(float *out, const float *x, int64_t n);
/* dx = dout where x > 0, else 0; x may be relu's input or its output (positive at the same
 * places) */
void adt_k_relu_backward(float *dx, const float *dout, const float *x, int64_t n);
/* GELU, tanh approximation (PyTorch approximate='tanh'):
 * 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as x sigmoid(2u), which is the
 * same function without the cancellation of 1 + tanh(u) for negative x; vectorises. */
void adt_k_gelu_forward(float *out, const float *x, int64_t n);
void adt_k_gelu_backward(float *dx, const float *dout, const float *x, int64_t n);
void adt_k_sigmoid_forward(float *out, const float *x, int64_t n);
void adt_k_sigmoid_backward(float *dx, const float *dout, const float *out, int64_t n);
/* tanh and exp accurate to a few ulp, written as branch-free float arithmetic so that loops
 * calling them vectorise (glibc's tanhf/expf do not). */
float adt_k_tanhf(float x);
float adt_k_expf(float x);

/* ---- normalisation and softmax (k_norm.c) -------------------------------------------------- */
/* LayerNorm over the last axis C of x[N,C]: out = (x - mean) * rstd * w + b, biased variance.
 * mean[N], rstd[N] are saved for backward. */
void adt_k_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                             const float *w, const float *b, int64_t N, int64_t C, float eps);
/* dx[N,C], dw[C], db[C] (all written) */
void adt_k_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                              const float *w, const float *mean, const float *rstd, int64_t N,
                              int64_t C);
/* softmax over the last axis of x[N,C] */
void adt_k_softmax_forward(float *out, const float *x, int64_t N, int64_t C);
void adt_k_softmax_backward(float *dx, const float *dout, const float *out, int64_t N, int64_t C);

/* ---- attention (k_attn.c) ------------------------------------------------------------------
 * Fused causal multi-head self-attention, GPT-2 layout:
 *   qkv[B,T,3C] holds q | k | v along the last axis, each [B,T,C] viewed as H heads of D=C/H
 *   (the graph's qkv [B,T,3,C] is these bytes; a block of whole heads, [B,T,3,C_local], is again
 *   such a tensor with C = C_local and H = C_local / D);
 *   att[B,H,T,T] = softmax(q k^T / sqrt(D) + causal mask) (saved for backward; entries above
 *   the diagonal are written as 0); out[B,T,C] = att v, heads concatenated.
 * Uses sgemm per (b,h). Scratch: adt_k_attention_scratch_floats(). */
int64_t adt_k_attention_scratch_floats(int64_t B, int64_t T, int64_t C, int64_t H);
void adt_k_attention_forward(float *out, float *att, const float *qkv, float *scratch, int64_t B,
                             int64_t T, int64_t C, int64_t H);
void adt_k_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                              float *scratch, int64_t B, int64_t T, int64_t C, int64_t H);

/* ---- embeddings and losses (k_loss.c) ------------------------------------------------------ */
/* out[N,C] = table[ids[n] - row0, :] for a table holding rows [row0, row0+V) of the full one
 * (row0 = 0 serially); tokens outside those rows get zeros (a vocabulary shard's share). */
void adt_k_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t N,
                             int64_t V, int64_t C, int64_t row0);
/* dtable[V,C] = scatter-add of dout[N,C] by ids (zeroes dtable first). For a vocabulary-split
 * table the rows outside [row0, row0+V) are skipped: pass row0 = 0 in the serial case. */
void adt_k_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t N,
                              int64_t V, int64_t C, int64_t row0);
/* Softmax cross-entropy, fused. logits[N,V], labels[N] (label < 0: ignored), probs[N,V] saved.
 * loss[0] = sum_n -log probs[n, labels[n]] / denom  (denom = number of counted tokens in the
 * GLOBAL batch, so a batch-split run produces partial sums of the serial loss). */
void adt_k_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                const int32_t *labels, int64_t N, int64_t V, float denom);
/* dlogits[N,V] = dloss[0] * (probs - onehot(label)) / denom; ignored rows get 0. */
void adt_k_softmax_xent_backward(float *dlogits, const float *dloss, const float *probs,
                                 const int32_t *labels, int64_t N, int64_t V, float denom);
/* Binary cross-entropy with logits, x[N], y[N] in [0,1]; numerically stable form
 * max(x,0) - x y + log(1 + exp(-|x|)). loss[0] = sum / denom. */
void adt_k_bce_logits_forward(float *loss, const float *x, const float *y, int64_t N, float denom);
void adt_k_bce_logits_backward(float *dx, const float *dloss, const float *x, const float *y,
                               int64_t N, float denom);

/* ---- dropout (k_act.c) ---------------------------------------------------------------------
 * Element with GLOBAL flat index g is kept iff adt_rng_uniform(key, g) >= p, and then scaled by
 * 1/(1-p). The local buffer x[n] holds a box of a larger global tensor: local element i sits at
 * global index gidx(i) computed from the box (ndim axes, local dims ldim, global dims gdim,
 * offsets off). Serial case: ldim == gdim, off == 0. Backward regenerates the same mask. */
void adt_k_dropout_forward(float *out, const float *x, float p, uint64_t key, int ndim,
                           const int64_t *ldim, const int64_t *gdim, const int64_t *off);
void adt_k_dropout_backward(float *dx, const float *dout, float p, uint64_t key, int ndim,
                            const int64_t *ldim, const int64_t *gdim, const int64_t *off);

/* ---- convolution and pooling (k_conv.c) ----------------------------------------------------
 * conv2d NCHW: x[N,C,H,W], w[K,C,R,S] (K output channels, R x S kernel), bias[K] or NULL,
 * out[N,K,P,Q], P = (H + 2 pad - R)/stride + 1, Q likewise. im2col + sgemm per image.
 * Scratch: adt_k_conv2d_scratch_floats(). */
int64_t adt_k_conv2d_scratch_floats(int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                                    int64_t S, int64_t stride, int64_t pad);
void adt_k_conv2d_forward(float *out, const float *x, const float *w, const float *bias,
                          float *scratch, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                          int64_t R, int64_t S, int64_t stride, int64_t pad);
/* dx[N,C,H,W] (col2im) */
void adt_k_conv2d_backward_data(float *dx, const float *dout, const float *w, float *scratch,
                                int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                                int64_t S, int64_t stride, int64_t pad);
/* dw[K,C,R,S] and dbias[K] (dbias may be NULL) */
void adt_k_conv2d_backward_weight(float *dw, float *dbias, const float *dout, const float *x,
                                  float *scratch, int64_t N, int64_t C, int64_t H, int64_t W,
                                  int64_t K, int64_t R, int64_t S, int64_t stride, int64_t pad);
/* max-pool 2d NCHW, window k, stride s, no padding: out[N,C,P,Q], argmax[N,C,P,Q] holds the
 * flat index (h*W + w) inside the input plane of the winning element (first max wins). */
void adt_k_maxpool2d_forward(float *out, int32_t *argmax, const float *x, int64_t N, int64_t C,
                             int64_t H, int64_t W, int64_t k, int64_t s);
void adt_k_maxpool2d_backward(float *dx, const float *dout, const int32_t *argmax, int64_t N,
                              int64_t C, int64_t H, int64_t W, int64_t k, int64_t s);

/* ---- data movement (k_move.c) --------------------------------------------------------------
 * permute: out has dims in[perm[0]], in[perm[1]], ...; ndim <= 6. */
void adt_k_permute(float *out, const float *x, int ndim, const int64_t *dims, const int *perm);
/* concat / slice along an axis: view a tensor as [outer, axis, inner]. slice only copies: it
 * serves i32 tensors (ids) as well, whose 4-byte elements it moves unread. */
void adt_k_concat(float *out, const float *const *xs, const int64_t *axis_sizes, int n,
                  int64_t outer, int64_t inner);
void adt_k_slice(float *out, const float *x, int64_t outer, int64_t axis_total, int64_t start,
                 int64_t len, int64_t inner);

/* ---- DLRM pairwise dot interaction (k_interact.c) ------------------------------------------
 * x[B,F,D] -> out[B, F(F-1)/2]: for each b, Z = x_b x_b^T, out = strict lower triangle of Z in
 * row-major order: (1,0), (2,0), (2,1), (3,0), ... */
void adt_k_interaction_forward(float *out, const float *x, float *scratch, int64_t B, int64_t F, int64_t D);
void adt_k_interaction_backward(float *dx, const float *dout, const float *x, float *scratch, int64_t B,
                                int64_t F, int64_t D);
/* The scratch floats either takes (backward = 0 or 1): blocks of samples transposed. */
int64_t adt_k_interaction_scratch_floats(int64_t F, int64_t D, int backward);

/* ---- optimisers (k_optim.c): in place on the parameter and its state -----------------------
 * SGD as PyTorch: g' = g + wd w; m = momentum m + g' (m = g' on step 1); w -= lr m.
 * momentum == 0: w -= lr g' (m untouched, may be NULL). `step` counts from 1. */
void adt_k_sgd_update(float *w, float *m, const float *g, int64_t n, float lr, float momentum,
                      float wd, int64_t step);
/* AdamW as PyTorch (decoupled weight decay, bias correction):
 * w *= 1 - lr wd; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * w -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) */
void adt_k_adamw_update(float *w, float *m, float *v, const float *g, int64_t n, float lr,
                        float b1, float b2, float eps, float wd, int64_t step);

#endif
