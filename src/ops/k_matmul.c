/*
 * k_matmul.c - dense matrix products: the single and batched C = op(A) op(B) kernels that
 * linear layers, attention-free bmm ops and their gradients lower to, the linear layer's
 * C = op(A) op(B) + bias, and the accumulating C = op(A) op(B) + beta C. Everything of useful
 * size goes to the GEMM layer (adt_gemm, row-major); only degenerate shapes are handled here.
 */
#include <string.h>

#include "adtrain/gemm.h"

#include "ops/kernels.h"

/* C[M,N] = op(A) op(B) + beta C. A row-major [M,K] has leading dimension K; stored transposed
 * ([K,M]) its leading dimension is M. Likewise B: [K,N] -> N, [N,K] -> K. */
static void gemm(float *C, const float *A, const float *B, float beta, int64_t M, int64_t N,
                 int64_t K, int transA, int transB) {
    adt_gemm(transA, transB, M, N, K, 1.0f, A, transA ? M : K, B, transB ? K : N, beta, C, N);
}

static void matmul_one(float *C, const float *A, const float *B, int64_t M, int64_t N, int64_t K,
                       int transA, int transB) {
    if (M <= 0 || N <= 0) return;
    if (K <= 0) {
        /* An empty sum is zero; BLAS would reject the zero leading dimensions. */
        memset(C, 0, (size_t)(M * N) * sizeof(float));
        return;
    }
    /* beta = 0: no backend reads C then (adt_gemm promises it, its check holds each to it), so a
     * dirty (even NaN-filled) buffer is fine. */
    gemm(C, A, B, 0.0f, M, N, K, transA, transB);
}

void adt_k_matmul(float *C, const float *A, const float *B, int64_t M, int64_t N, int64_t K,
                  int transA, int transB) {
    matmul_one(C, A, B, M, N, K, transA, transB);
}

void adt_k_matmul_batched(float *C, const float *A, const float *B, int64_t batch, int64_t M,
                          int64_t N, int64_t K, int transA, int transB, int64_t sA, int64_t sB,
                          int64_t sC) {
    for (int64_t i = 0; i < batch; i++)
        matmul_one(C + i * sC, A + i * sA, B + i * sB, M, N, K, transA, transB);
}

/* The bias rows are written first and the product accumulated onto them (beta = 1), as
 * PyTorch's addmm does. With beta = 0 OpenBLAS would clear C in a pass of its own before
 * accumulating, so the bias takes the place of that pass instead of adding one. */
void adt_k_matmul_bias(float *C, const float *A, const float *B, const float *bias, int64_t M,
                       int64_t N, int64_t K, int transA, int transB) {
    if (M <= 0 || N <= 0) return;
    for (int64_t r = 0; r < M; r++) memcpy(C + r * N, bias, (size_t)N * sizeof(float));
    if (K <= 0) return; /* the empty product adds nothing */
    gemm(C, A, B, 1.0f, M, N, K, transA, transB);
}

/* C = beta C rounded first, then the product added onto it (each block of the inner dimension's
 * product in turn), as PyTorch's buf.mul_(momentum).add_(grad) rounds. The scaling is done here:
 * OpenBLAS does it in a pass of its own for large matrices, but its small-matrix kernels
 * (SkylakeX and Cooperlake, OpenBLAS 0.3.21) compute beta C + A B with one rounding, which is
 * not the unfused update's result. beta = 1 needs no pass; beta = 0 (the first step) zeroes C
 * and adds the product all the same (0 + x is x), so that every step hands the GEMM layer the
 * same accumulating product, the form its per-shape choice times on the first call. */
void adt_k_matmul_acc(float *C, const float *A, const float *B, float beta, int64_t M, int64_t N,
                      int64_t K, int transA, int transB) {
    if (M <= 0 || N <= 0) return;
    if (beta == 0.0f) memset(C, 0, (size_t)(M * N) * sizeof(float));
    else if (beta != 1.0f)
        for (int64_t i = 0; i < M * N; i++) C[i] *= beta;
    if (K > 0) gemm(C, A, B, 1.0f, M, N, K, transA, transB);
}
