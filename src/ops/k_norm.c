/*
 * k_norm.c - LayerNorm and softmax over the last axis, forward and backward.
 *
 * Both work row by row on x[N,C]. Row reductions go through the multi-lane helpers of k_math.h
 * so they vectorise. LayerNorm takes mean and variance in two passes (sum, then sums of the
 * deviations), which avoids the cancellation of E[x^2] - E[x]^2 when |mean| >> std.
 */
#include "ops/kernels.h"

#include <math.h>

#include "ops/k_math.h"

/* Second pass over a row: with d = x - m, returns sum d in *sd and sum d^2 in *sdd. */
static inline void sum_dev(const float *x, float m, int64_t n, double *sd, double *sdd) {
    float s1[ADT_K_LANES] = {0}, s2[ADT_K_LANES] = {0};
    int64_t i = 0;
    for (; i + ADT_K_LANES <= n; i += ADT_K_LANES)
        for (int l = 0; l < ADT_K_LANES; l++) {
            float d = x[i + l] - m;
            s1[l] += d;
            s2[l] += d * d;
        }
    double r1 = 0.0, r2 = 0.0;
    for (int l = 0; l < ADT_K_LANES; l++) {
        r1 += s1[l];
        r2 += s2[l];
    }
    for (; i < n; i++) {
        double d = (double)(x[i] - m);
        r1 += d;
        r2 += d * d;
    }
    *sd = r1;
    *sdd = r2;
}

/* dx row and the dw, db accumulation. dw and db are parameter gradients, never views of an
 * input: saying so (restrict) keeps the run-time alias checks within what the vectoriser is
 * willing to emit, so this loop vectorises. */
static inline void layernorm_backward_row(float *dx, float *restrict dw, float *restrict db,
                                          const float *dout, const float *x, const float *w,
                                          float m, float s, float mg, float mgx, int64_t C) {
    for (int64_t j = 0; j < C; j++) {
        float xhat = (x[j] - m) * s;
        float g = dout[j] * w[j];
        dx[j] = (g - mg - xhat * mgx) * s;
        dw[j] += dout[j] * xhat;
        db[j] += dout[j];
    }
}

void adt_k_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                             const float *w, const float *b, int64_t N, int64_t C, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * C; // (C)
        float *outr = out + r * C;   // (C)
        /* Corrected two-pass: the first-pass mean m0 carries the rounding error of a float sum
         * of C values; the residuals d = x - m0 are of the size of the spread, so their mean
         * (which would be 0 in exact arithmetic) is accurate and removes that error, and
         * sum d^2 - (sum d)^2 / C is the variance about the corrected mean. */
        float m0 = adt_k_sum_inl(xr, C) / (float)C;
        double sd, sdd;
        sum_dev(xr, m0, C, &sd, &sdd);
        float m = (float)((double)m0 + sd / (double)C);
        double var = (sdd - sd * sd / (double)C) / (double)C; // biased, as torch.nn.LayerNorm
        if (var < 0.0) var = 0.0;
        float s = (float)(1.0 / sqrt(var + (double)eps));
        for (int64_t i = 0; i < C; i++) outr[i] = (xr[i] - m) * s * w[i] + b[i];
        mean[r] = m;
        rstd[r] = s;
    }
}

/* With xhat = (x - mean) rstd and g = dout * w:
 *   dx = rstd (g - mean(g) - xhat mean(g xhat)),  dw = sum_rows dout xhat,  db = sum_rows dout. */
void adt_k_layernorm_backward(float *dx, float *dw, float *db, const float *dout, const float *x,
                              const float *w, const float *mean, const float *rstd, int64_t N,
                              int64_t C) {
    for (int64_t i = 0; i < C; i++) dw[i] = db[i] = 0.0f;
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * C;    // (C)
        const float *dor = dout + r * C; // (C)
        float *dxr = dx + r * C;         // (C)
        const float m = mean[r], s = rstd[r];
        float sg[ADT_K_LANES] = {0}, sgx[ADT_K_LANES] = {0};
        int64_t i = 0;
        for (; i + ADT_K_LANES <= C; i += ADT_K_LANES)
            for (int l = 0; l < ADT_K_LANES; l++) {
                float g = dor[i + l] * w[i + l];
                float xhat = (xr[i + l] - m) * s;
                sg[l] += g;
                sgx[l] += g * xhat;
            }
        double tg = 0.0, tgx = 0.0;
        for (int l = 0; l < ADT_K_LANES; l++) {
            tg += sg[l];
            tgx += sgx[l];
        }
        for (; i < C; i++) {
            float g = dor[i] * w[i];
            tg += g;
            tgx += (double)g * ((xr[i] - m) * s);
        }
        const float mg = (float)(tg / (double)C), mgx = (float)(tgx / (double)C);
        layernorm_backward_row(dxr, dw, db, dor, xr, w, m, s, mg, mgx, C);
    }
}

void adt_k_softmax_forward(float *out, const float *x, int64_t N, int64_t C) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * C; // (C)
        float *outr = out + r * C;   // (C)
        /* Subtracting the row max makes every exponent <= 0: no overflow, and the sum >= 1. */
        float mx = adt_k_max_inl(xr, C);
        for (int64_t i = 0; i < C; i++) outr[i] = adt_k_expf_inl(xr[i] - mx);
        float inv = 1.0f / adt_k_sum_inl(outr, C);
        for (int64_t i = 0; i < C; i++) outr[i] *= inv;
    }
}

/* dx = out * (dout - sum(dout * out)) per row. */
void adt_k_softmax_backward(float *dx, const float *dout, const float *out, int64_t N, int64_t C) {
    for (int64_t r = 0; r < N; r++) {
        const float *dor = dout + r * C; // (C)
        const float *outr = out + r * C; // (C)
        float *dxr = dx + r * C;         // (C)
        float dot = adt_k_dot_inl(dor, outr, C);
        for (int64_t i = 0; i < C; i++) dxr[i] = outr[i] * (dor[i] - dot);
    }
}
