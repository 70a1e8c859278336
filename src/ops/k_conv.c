/*
 * k_conv.c - 2-D convolution (NCHW, im2col + sgemm) and max pooling, forward and backward.
 *
 * The im2col matrix of one image is cols[C*R*S, P*Q]: row (c,r,s) holds, for every output
 * position (p,q), the input value x[c, p*stride - pad + r, q*stride - pad + s], or 0 where that
 * falls in the padding. With it the convolution of image n is one product
 *     out_n[K, P*Q] = w[K, C*R*S] cols[C*R*S, P*Q],
 * and both gradients are products with the same matrix:
 *     dcols[C*R*S, P*Q] = w^T dout_n   (then col2im scatters it back to dx_n),
 *     dw[K, C*R*S]     += dout_n cols^T.
 * The columns are built one image at a time so the scratch does not grow with the batch.
 * A 1x1 kernel with stride 1 and no padding has cols == x_n, so those skip im2col entirely.
 */
#include <string.h>

#include "adtrain/gemm.h"

#include "ops/kernels.h"

static int64_t conv_out_size(int64_t in, int64_t k, int64_t stride, int64_t pad) {
    return (in + 2 * pad - k) / stride + 1;
}

static int conv_is_direct(int64_t R, int64_t S, int64_t stride, int64_t pad) {
    return R == 1 && S == 1 && stride == 1 && pad == 0;
}

/* Output columns q in [*q0, *q1) read an in-bounds input column q*stride - pad + s; the ones
 * outside read padding. */
static void valid_range(int64_t *q0, int64_t *q1, int64_t Q, int64_t W, int64_t s, int64_t stride,
                        int64_t pad) {
    int64_t lo = pad - s; /* need q*stride >= lo */
    int64_t a = lo <= 0 ? 0 : (lo + stride - 1) / stride;
    int64_t hi = W - 1 + pad - s; /* need q*stride <= hi */
    int64_t b = hi < 0 ? 0 : hi / stride + 1;
    if (a > Q) a = Q;
    if (b > Q) b = Q;
    if (b < a) b = a;
    *q0 = a;
    *q1 = b;
}

/* cols[C*R*S, P*Q] from x[C,H,W] (one image). */
static void im2col(float *cols, const float *x, int64_t C, int64_t H, int64_t W, int64_t R,
                   int64_t S, int64_t stride, int64_t pad, int64_t P, int64_t Q) {
    for (int64_t c = 0; c < C; c++) {
        const float *xc = x + c * H * W;
        for (int64_t r = 0; r < R; r++) {
            for (int64_t s = 0; s < S; s++) {
                float *dst = cols + ((c * R + r) * S + s) * P * Q;
                int64_t q0, q1;
                valid_range(&q0, &q1, Q, W, s, stride, pad);
                for (int64_t p = 0; p < P; p++) {
                    float *row = dst + p * Q;
                    int64_t ih = p * stride - pad + r;
                    if (ih < 0 || ih >= H || q1 == q0) {
                        memset(row, 0, (size_t)Q * sizeof(float));
                        continue;
                    }
                    for (int64_t q = 0; q < q0; q++) row[q] = 0.0f;
                    for (int64_t q = q1; q < Q; q++) row[q] = 0.0f;
                    const float *src = xc + ih * W + (q0 * stride - pad + s);
                    if (stride == 1) {
                        memcpy(row + q0, src, (size_t)(q1 - q0) * sizeof(float));
                    } else {
                        for (int64_t q = q0; q < q1; q++) row[q] = src[(q - q0) * stride];
                    }
                }
            }
        }
    }
}

/* dx[C,H,W] = col2im(cols): every column entry is added back to the input pixel it was read
 * from (pixels under several windows collect several terms); padding entries are dropped. */
static void col2im(float *dx, const float *cols, int64_t C, int64_t H, int64_t W, int64_t R,
                   int64_t S, int64_t stride, int64_t pad, int64_t P, int64_t Q) {
    memset(dx, 0, (size_t)(C * H * W) * sizeof(float));
    for (int64_t c = 0; c < C; c++) {
        float *dxc = dx + c * H * W;
        for (int64_t r = 0; r < R; r++) {
            for (int64_t s = 0; s < S; s++) {
                const float *src = cols + ((c * R + r) * S + s) * P * Q;
                int64_t q0, q1;
                valid_range(&q0, &q1, Q, W, s, stride, pad);
                for (int64_t p = 0; p < P; p++) {
                    int64_t ih = p * stride - pad + r;
                    if (ih < 0 || ih >= H) continue;
                    const float *row = src + p * Q;
                    float *dst = dxc + ih * W + (q0 * stride - pad + s);
                    if (stride == 1) {
                        for (int64_t q = q0; q < q1; q++) dst[q - q0] += row[q];
                    } else {
                        for (int64_t q = q0; q < q1; q++) dst[(q - q0) * stride] += row[q];
                    }
                }
            }
        }
    }
}

/* Sum of x[n] with 16 independent partial sums, so the loop vectorises without reassociation
 * flags (and rounds better than one serial chain). */
static float sum_lanes(const float *x, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[i + l];
    float t = 0.0f;
    for (; i < n; i++) t += x[i];
    for (int l = 0; l < 16; l++) t += acc[l];
    return t;
}

int64_t adt_k_conv2d_scratch_floats(int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                                    int64_t S, int64_t stride, int64_t pad) {
    int64_t P = conv_out_size(H, R, stride, pad), Q = conv_out_size(W, S, stride, pad);
    return C * R * S * P * Q;
}

/* out[N,K,P,Q] = conv(x[N,C,H,W], w[K,C,R,S]) + bias[K] */
void adt_k_conv2d_forward(float *out, const float *x, const float *w, const float *bias,
                          float *scratch, int64_t N, int64_t C, int64_t H, int64_t W, int64_t K,
                          int64_t R, int64_t S, int64_t stride, int64_t pad) {
    const int64_t P = conv_out_size(H, R, stride, pad), Q = conv_out_size(W, S, stride, pad);
    const int64_t PQ = P * Q, CRS = C * R * S;
    const int direct = conv_is_direct(R, S, stride, pad);
    if (PQ <= 0 || K <= 0) return;
    for (int64_t n = 0; n < N; n++) {
        const float *xn = x + n * C * H * W;
        float *on = out + n * K * PQ;
        /* The bias is laid down first and the product added onto it (beta = 1): one pass over
         * the output instead of two. */
        if (bias) {
            for (int64_t k = 0; k < K; k++) {
                float b = bias[k];
                float *row = on + k * PQ;
                for (int64_t i = 0; i < PQ; i++) row[i] = b;
            }
        } else if (CRS == 0) {
            memset(on, 0, (size_t)(K * PQ) * sizeof(float));
        }
        if (CRS == 0) continue;
        const float *cols = xn;
        if (!direct) {
            im2col(scratch, xn, C, H, W, R, S, stride, pad, P, Q);
            cols = scratch;
        }
        adt_gemm(0, 0, K, PQ, CRS, 1.0f, w, CRS, cols, PQ, bias ? 1.0f : 0.0f, on, PQ);
    }
}

/* dx[N,C,H,W] from dout[N,K,P,Q] and w[K,C,R,S] */
void adt_k_conv2d_backward_data(float *dx, const float *dout, const float *w, float *scratch,
                                int64_t N, int64_t C, int64_t H, int64_t W, int64_t K, int64_t R,
                                int64_t S, int64_t stride, int64_t pad) {
    const int64_t P = conv_out_size(H, R, stride, pad), Q = conv_out_size(W, S, stride, pad);
    const int64_t PQ = P * Q, CRS = C * R * S;
    const int direct = conv_is_direct(R, S, stride, pad);
    if (C * H * W <= 0) return;
    if (PQ <= 0 || K <= 0) {
        memset(dx, 0, (size_t)(N * C * H * W) * sizeof(float));
        return;
    }
    for (int64_t n = 0; n < N; n++) {
        float *dxn = dx + n * C * H * W;
        const float *don = dout + n * K * PQ;
        /* In the direct case dcols is dx_n itself and the product writes it in place. */
        float *dcols = direct ? dxn : scratch;
        adt_gemm(1, 0, CRS, PQ, K, 1.0f, w, CRS, don, PQ, 0.0f, dcols, PQ);
        if (!direct) col2im(dxn, scratch, C, H, W, R, S, stride, pad, P, Q);
    }
}

/* dw[K,C,R,S] = sum_n dout_n cols_n^T; dbias[K] = sum over n, p, q of dout */
void adt_k_conv2d_backward_weight(float *dw, float *dbias, const float *dout, const float *x,
                                  float *scratch, int64_t N, int64_t C, int64_t H, int64_t W,
                                  int64_t K, int64_t R, int64_t S, int64_t stride, int64_t pad) {
    const int64_t P = conv_out_size(H, R, stride, pad), Q = conv_out_size(W, S, stride, pad);
    const int64_t PQ = P * Q, CRS = C * R * S;
    const int direct = conv_is_direct(R, S, stride, pad);
    if (K <= 0) return;
    if (dbias) {
        for (int64_t k = 0; k < K; k++) {
            float t = 0.0f;
            for (int64_t n = 0; n < N; n++) t += sum_lanes(dout + (n * K + k) * PQ, PQ);
            dbias[k] = t;
        }
    }
    if (CRS <= 0) return;
    if (N <= 0 || PQ <= 0) {
        memset(dw, 0, (size_t)(K * CRS) * sizeof(float));
        return;
    }
    for (int64_t n = 0; n < N; n++) {
        const float *xn = x + n * C * H * W;
        const float *cols = xn;
        if (!direct) {
            im2col(scratch, xn, C, H, W, R, S, stride, pad, P, Q);
            cols = scratch;
        }
        /* The first image writes dw (beta = 0, so a dirty buffer is fine), the rest add to it:
         * the sum over the batch stays inside this call. */
        adt_gemm(0, 1, K, CRS, PQ, 1.0f, dout + n * K * PQ, PQ, cols, PQ, n == 0 ? 0.0f : 1.0f, dw, CRS);
    }
}

/* out[N,C,P,Q] = max over each k x k window (stride s) of x[N,C,H,W]; argmax[N,C,P,Q] = h*W+w
 * of the winner inside its plane. */
/* *best, *bi = v, i where v wins by the pooling rule below (strict >, a NaN over numbers), with
 * masks: on data a compare's outcome is random, and the branch the compiler makes of a ternary
 * mispredicts (a VGG's 2x2 pooling of 32 x 16 x 28 x 28 noise took 1.6 ms, 30% of its step). */
static inline void pool_take(float *best, int32_t *bi, float v, int32_t i) {
    uint32_t take = (uint32_t)((v > *best) | ((v != v) & (*best == *best))), m = 0u - take, vb, bb;
    memcpy(&vb, &v, 4), memcpy(&bb, best, 4);
    bb = (vb & m) | (bb & ~m);
    memcpy(best, &bb, 4);
    *bi = (int32_t)(((uint32_t)i & m) | ((uint32_t)*bi & ~m));
}

void adt_k_maxpool2d_forward(float *out, int32_t *argmax, const float *x, int64_t N, int64_t C,
                             int64_t H, int64_t W, int64_t k, int64_t s) {
    const int64_t P = (H - k) / s + 1, Q = (W - k) / s + 1;
    if (H < k || W < k) return;
    if (k == 2 && s == 2) { /* VGG's pooling */
        for (int64_t nc = 0; nc < N * C; nc++) {
            const float *xp = x + nc * H * W;
            float *op = out + nc * P * Q;
            int32_t *ap = argmax + nc * P * Q;
            for (int64_t p = 0; p < P; p++) {
                const float *r0 = xp + 2 * p * W, *r1 = r0 + W;
                for (int64_t q = 0; q < Q; q++) {
                    int32_t i0 = (int32_t)(2 * p * W + 2 * q), bi = i0;
                    float best = r0[2 * q];
                    pool_take(&best, &bi, r0[2 * q + 1], i0 + 1);
                    pool_take(&best, &bi, r1[2 * q], i0 + (int32_t)W);
                    pool_take(&best, &bi, r1[2 * q + 1], i0 + (int32_t)W + 1);
                    op[p * Q + q] = best;
                    ap[p * Q + q] = bi;
                }
            }
        }
        return;
    }
    for (int64_t nc = 0; nc < N * C; nc++) {
        const float *xp = x + nc * H * W;
        float *op = out + nc * P * Q;
        int32_t *ap = argmax + nc * P * Q;
        for (int64_t p = 0; p < P; p++) {
            for (int64_t q = 0; q < Q; q++) {
                int64_t best_i = p * s * W + q * s;
                float best = xp[best_i];
                for (int64_t i = 0; i < k; i++) {
                    const float *row = xp + (p * s + i) * W + q * s;
                    for (int64_t j = 0; j < k; j++) {
                        float v = row[j];
                        /* Strict > keeps the first of equal maxima. A NaN wins over numbers
                         * (as in PyTorch) so a diverging run shows NaN instead of hiding it. */
                        if (v > best || (v != v && best == best)) {
                            best = v;
                            best_i = (p * s + i) * W + q * s + j;
                        }
                    }
                }
                op[p * Q + q] = best;
                ap[p * Q + q] = (int32_t)best_i;
            }
        }
    }
}

/* dx[N,C,H,W]: each dout goes to its window's winner; with overlapping windows (s < k) a pixel
 * can win several and collects the sum. */
void adt_k_maxpool2d_backward(float *dx, const float *dout, const int32_t *argmax, int64_t N,
                              int64_t C, int64_t H, int64_t W, int64_t k, int64_t s) {
    if (N * C * H * W <= 0) return;
    memset(dx, 0, (size_t)(N * C * H * W) * sizeof(float));
    if (H < k || W < k) return;
    const int64_t PQ = ((H - k) / s + 1) * ((W - k) / s + 1);
    for (int64_t nc = 0; nc < N * C; nc++) {
        float *dxp = dx + nc * H * W;
        const float *dp = dout + nc * PQ;
        const int32_t *ap = argmax + nc * PQ;
        for (int64_t i = 0; i < PQ; i++) dxp[ap[i]] += dp[i];
    }
}
