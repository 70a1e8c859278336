/*
 * k_loss.c - embedding lookup and its scatter-add gradient, fused softmax cross-entropy, and
 * binary cross-entropy with logits.
 *
 * Losses are sums divided by a caller-given denominator (the count over the GLOBAL batch), so a
 * rank holding part of the batch produces its share of the serial loss, and the shares add up.
 * Loss sums are accumulated in double: they run over every token of the batch.
 */
#include "ops/kernels.h"

#include <math.h>
#include <string.h>

#include "adtrain/base.h"
#include "ops/k_math.h"

/* A vocabulary-split table holds rows [row0, row0 + V) of the full one: a token whose row lives
 * on another rank gets zeros here, so the ranks' outputs are partial sums of the serial one. */
void adt_k_embedding_forward(float *out, const int32_t *ids, const float *table, int64_t N,
                             int64_t V, int64_t C, int64_t row0) {
    for (int64_t n = 0; n < N; n++) {
        int64_t r = (int64_t)ids[n] - row0;
        if (r >= 0 && r < V) memcpy(out + n * C, table + r * C, (size_t)C * sizeof *out);
        else memset(out + n * C, 0, (size_t)C * sizeof *out);
    }
}

/* A vocabulary-split table holds rows [row0, row0 + V) of the full one; tokens whose row lives
 * on another rank contribute nothing here. */
void adt_k_embedding_backward(float *dtable, const float *dout, const int32_t *ids, int64_t N,
                              int64_t V, int64_t C, int64_t row0) {
    memset(dtable, 0, (size_t)(V * C) * sizeof *dtable);
    for (int64_t n = 0; n < N; n++) {
        int64_t r = (int64_t)ids[n] - row0;
        if (r < 0 || r >= V) continue;
        float *dst = dtable + r * C;      // (C)
        const float *src = dout + n * C; // (C)
        for (int64_t c = 0; c < C; c++) dst[c] += src[c];
    }
}

/* -log softmax(x)[y] = log(sum_j exp(x_j - max)) + max - x_y: the shifted exponents are <= 0, so
 * the sum neither overflows nor loses the largest term. */
void adt_k_softmax_xent_forward(float *loss, float *probs, const float *logits,
                                const int32_t *labels, int64_t N, int64_t V, float denom) {
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        const float *x = logits + n * V; // (V)
        float *p = probs + n * V;        // (V)
        float mx = adt_k_max_inl(x, V);
        float sum = adt_k_exp_shift_sum_inl(p, x, mx, V);
        float inv = 1.0f / sum;
        for (int64_t j = 0; j < V; j++) p[j] *= inv;
        int32_t y = labels[n];
        if (y < 0) continue;
        ADT_ASSERT(y < V);
        total += log((double)sum) + (double)mx - (double)x[y];
    }
    loss[0] = (float)(total / (double)denom);
}

void adt_k_softmax_xent_backward(float *dlogits, const float *dloss, const float *probs,
                                 const int32_t *labels, int64_t N, int64_t V, float denom) {
    const float g = dloss[0] / denom;
    for (int64_t n = 0; n < N; n++) {
        float *d = dlogits + n * V;     // (V)
        const float *p = probs + n * V; // (V)
        int32_t y = labels[n];
        if (y < 0) {
            memset(d, 0, (size_t)V * sizeof *d);
            continue;
        }
        ADT_ASSERT(y < V);
        for (int64_t j = 0; j < V; j++) d[j] = g * p[j];
        d[y] -= g;
    }
}

/* max(x, 0) - x y + log(1 + exp(-|x|)): exp never overflows, and log1p keeps the small tail. */
void adt_k_bce_logits_forward(float *loss, const float *x, const float *y, int64_t N,
                              float denom) {
    double total = 0.0;
    for (int64_t n = 0; n < N; n++) {
        double xn = x[n], yn = y[n];
        total += (xn > 0.0 ? xn : 0.0) - xn * yn + log1p(exp(-fabs(xn)));
    }
    loss[0] = (float)(total / (double)denom);
}

/* d/dx = sigmoid(x) - y */
void adt_k_bce_logits_backward(float *dx, const float *dloss, const float *x, const float *y,
                               int64_t N, float denom) {
    const float g = dloss[0] / denom;
    for (int64_t n = 0; n < N; n++) dx[n] = g * (adt_k_sigmoidf_inl(x[n]) - y[n]);
}
