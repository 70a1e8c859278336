/*
 * k_interact.c - the DLRM pairwise dot-product feature interaction.
 *
 * For each sample b the F feature vectors x_b[F,D] (the dense bottom-MLP output and the
 * embedding lookups) interact through all pairwise dots Z = x_b x_b^T; only the strict lower
 * triangle is kept, flattened row-major: (1,0), (2,0), (2,1), (3,0), ... so pair (i,j), j < i,
 * sits at i(i-1)/2 + j. F is small (tens) and D moderate, so per-pair dots beat an sgemm per
 * sample that would also need an F x F scratch.
 */
#include <string.h>

#include "ops/kernels.h"

/* Dot product with 16 independent partial sums: vectorises without reassociation flags. */
static float dot_lanes(const float *a, const float *b, int64_t n) {
    float acc[16] = {0};
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    float t = 0.0f;
    for (; i < n; i++) t += a[i] * b[i];
    for (int l = 0; l < 16; l++) t += acc[l];
    return t;
}

/* out[B, F(F-1)/2] from x[B,F,D] */
void adt_k_interaction_forward(float *out, const float *x, int64_t B, int64_t F, int64_t D) {
    const int64_t npair = F * (F - 1) / 2;
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * F * D;
        float *ob = out + b * npair;
        for (int64_t i = 1; i < F; i++)
            for (int64_t j = 0; j < i; j++)
                ob[i * (i - 1) / 2 + j] = dot_lanes(xb + i * D, xb + j * D, D);
    }
}

/* dx[B,F,D] from dout[B, F(F-1)/2]. Z_ij = x_i . x_j for i > j, so dL/dx_i gets dZ_ij x_j and
 * dL/dx_j gets dZ_ij x_i: dx_b = (G + G^T) x_b with G the lower triangle holding dout. */
void adt_k_interaction_backward(float *dx, const float *dout, const float *x, int64_t B,
                                int64_t F, int64_t D) {
    const int64_t npair = F * (F - 1) / 2;
    if (B * F * D <= 0) return;
    memset(dx, 0, (size_t)(B * F * D) * sizeof(float));
    for (int64_t b = 0; b < B; b++) {
        const float *xb = x + b * F * D;
        const float *gb = dout + b * npair;
        float *db = dx + b * F * D;
        for (int64_t i = 1; i < F; i++) {
            const float *restrict xi = xb + i * D;
            float *restrict di = db + i * D;
            for (int64_t j = 0; j < i; j++) {
                const float g = gb[i * (i - 1) / 2 + j];
                const float *restrict xj = xb + j * D;
                float *restrict dj = db + j * D; /* j != i: the two rows never overlap */
                for (int64_t d = 0; d < D; d++) {
                    di[d] += g * xj[d];
                    dj[d] += g * xi[d];
                }
            }
        }
    }
}
