/*
 * k_attn.c - fused causal multi-head self-attention, forward and backward (GPT-2 layout).
 *
 * Per (batch, head) everything is a handful of sgemm calls on strided views of qkv: head h's q,
 * k and v are the D-column slices at offsets h D, C + h D and 2C + h D of each 3C-wide row, so a
 * leading dimension of 3C reads them in place with no copies (the graph's [B,T,3,C] layout, whole
 * or a tensor-parallel block of whole heads). The causal mask is exploited by
 * splitting the T query rows into blocks of ATT_BLOCK: the rows of block [i0, i1) only see keys
 * [0, i1), so the products skip the all-zero upper-right blocks of the T x T matrices (3/8 of
 * the work at T = 128, approaching half for long sequences).
 */
#include "ops/kernels.h"

#include <math.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/gemm.h"
#include "ops/k_math.h"

/* Query rows per block. Smaller blocks skip more masked work but make more, smaller sgemm calls.
 * At B=8, T=128, C=256, H=4 on one thread, forward + backward took 3.4 ms with 32, 3.6 ms with 64
 * and 4.7 ms with no blocking (OpenBLAS SkylakeX kernels). */
#ifndef ATT_BLOCK
#define ATT_BLOCK 32
#endif

/* Row-major sgemm with int64_t sizes: C = alpha op(A) op(B) (beta = 0, C written). */
static inline void gemm(int trans_a, int trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float *Cm,
                        int64_t ldc) {
    adt_gemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, 0.0f, Cm, ldc);
}

/* Only the backward pass needs scratch: d(att) for one (b, h). */
int64_t adt_k_attention_scratch_floats(int64_t B, int64_t T, int64_t C, int64_t H) {
    (void)B, (void)C, (void)H;
    return T * T;
}

void adt_k_attention_forward(float *out, float *att, const float *qkv, float *scratch, int64_t B,
                             int64_t T, int64_t C, int64_t H) {
    (void)scratch;
    ADT_ASSERT(H > 0 && C % H == 0);
    const int64_t D = C / H, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)D);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = qkv + b * T * C3 + h * D; // (T, D), row stride 3C
            const float *k = q + C;                    // (T, D), row stride 3C
            const float *v = q + 2 * C;                // (T, D), row stride 3C
            float *a = att + (b * H + h) * T * T;      // (T, T)
            float *o = out + b * T * C + h * D;        // (T, D), row stride C

            /* scores: a[i0:i1, 0:i1] = q[i0:i1] k[0:i1]^T / sqrt(D) */
            for (int64_t i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                int64_t i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T;
                gemm(0, 1, i1 - i0, i1, D, scale, q + i0 * C3, C3, k, C3, a + i0 * T, T);
            }
            /* causal softmax: row i over j <= i, the rest (masked or never computed) set to 0 */
            for (int64_t i = 0; i < T; i++) {
                float *row = a + i * T; // (T)
                float mx = adt_k_max_inl(row, i + 1);
                float inv = 1.0f / adt_k_exp_shift_sum_inl(row, row, mx, i + 1);
                for (int64_t j = 0; j <= i; j++) row[j] *= inv;
                memset(row + i + 1, 0, (size_t)(T - i - 1) * sizeof *row);
            }
            /* out[i0:i1] = a[i0:i1, 0:i1] v[0:i1] */
            for (int64_t i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                int64_t i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T;
                gemm(0, 0, i1 - i0, D, i1, 1.0f, a + i0 * T, T, v, C3, o + i0 * C, C);
            }
        }
}

/* With P = att (lower triangular), dP = dout v^T, dS = P * (dP - rowsum(P * dP)):
 *   dq = dS k / sqrt(D),  dk = dS^T q / sqrt(D),  dv = P^T dout.
 * dk and dv for key rows [i0, i1) read columns [i0, i1) of dS and P, which are zero above row
 * i0, so their products run over query rows [i0, T) only. */
void adt_k_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att,
                              float *scratch, int64_t B, int64_t T, int64_t C, int64_t H) {
    ADT_ASSERT(H > 0 && C % H == 0);
    const int64_t D = C / H, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)D);
    float *ds = scratch; // (T, T): dP, then dS in place
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            const float *q = qkv + b * T * C3 + h * D;  // (T, D), row stride 3C
            const float *k = q + C;                     // (T, D), row stride 3C
            const float *v = q + 2 * C;                 // (T, D), row stride 3C
            const float *a = att + (b * H + h) * T * T; // (T, T)
            const float *dout_h = dout + b * T * C + h * D; // (T, D), row stride C
            float *dq = dqkv + b * T * C3 + h * D;          // (T, D), row stride 3C
            float *dk = dq + C;
            float *dv = dq + 2 * C;

            /* dP[i0:i1, 0:i1] = dout[i0:i1] v[0:i1]^T */
            for (int64_t i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                int64_t i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T;
                gemm(0, 1, i1 - i0, i1, D, 1.0f, dout_h + i0 * C, C, v, C3, ds + i0 * T, T);
            }
            /* softmax backward on the causal part; above the diagonal dS = 0 (P is 0 there, and
             * those dP entries were partly never computed) */
            for (int64_t i = 0; i < T; i++) {
                const float *prow = a + i * T; // (T)
                float *row = ds + i * T;       // (T)
                float dot = adt_k_dot_inl(prow, row, i + 1);
                for (int64_t j = 0; j <= i; j++) row[j] = prow[j] * (row[j] - dot);
                memset(row + i + 1, 0, (size_t)(T - i - 1) * sizeof *row);
            }
            for (int64_t i0 = 0; i0 < T; i0 += ATT_BLOCK) {
                int64_t i1 = i0 + ATT_BLOCK < T ? i0 + ATT_BLOCK : T;
                /* dq[i0:i1] = dS[i0:i1, 0:i1] k[0:i1] / sqrt(D) */
                gemm(0, 0, i1 - i0, D, i1, scale, ds + i0 * T, T, k, C3, dq + i0 * C3, C3);
                /* dk[i0:i1] = dS[i0:T, i0:i1]^T q[i0:T] / sqrt(D) */
                gemm(1, 0, i1 - i0, D, T - i0, scale, ds + i0 * T + i0, T, q + i0 * C3, C3,
                     dk + i0 * C3, C3);
                /* dv[i0:i1] = P[i0:T, i0:i1]^T dout[i0:T] */
                gemm(1, 0, i1 - i0, D, T - i0, 1.0f, a + i0 * T + i0, T, dout_h + i0 * C, C,
                     dv + i0 * C3, C3);
            }
        }
}
