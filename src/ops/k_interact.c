/*
 * k_interact.c - the DLRM pairwise dot-product feature interaction.
 *
 * For each sample b the F feature vectors x_b[F,D] (the dense bottom-MLP output and the
 * embedding lookups) interact through all pairwise dots Z = x_b x_b^T; only the strict lower
 * triangle is kept, flattened row-major: (1,0), (2,0), (2,1), (3,0), ... so pair (i,j), j < i,
 * sits at i(i-1)/2 + j.
 *
 * F is small (tens) and D too (DLRM's tables are 8-64 wide), so a sample's dots are too short to
 * vectorise well: a dot per pair (16 partial sums, then their sum) spent most of its time adding
 * its lanes at D = 8, 0.55 ms of dlrm-small's 2.4 ms step. Both kernels therefore work on blocks
 * of IB samples transposed to [F*D][IB] in the scratch, with the samples as the vector axis, and
 * keep each element's sum in the order of the per-sample loops (d ascending; pairs i ascending,
 * j ascending), whatever the block.
 */
#include <string.h>

#include "ops/kernels.h"

#define IB 64 /* samples per block: its transposed inputs and outputs stay in cache */

int64_t adt_k_interaction_scratch_floats(int64_t F, int64_t D, int backward) {
    return (int64_t)IB * ((backward ? 2 : 1) * F * D + F * (F - 1) / 2);
}

/* rows[n][k] of a block -> t[k][IB] and back */
static void to_block(float *t, const float *rows, int64_t n, int64_t k) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t c = 0; c < k; c++) t[c * IB + b] = rows[b * k + c];
}
static void from_block(float *rows, const float *t, int64_t n, int64_t k) {
    for (int64_t b = 0; b < n; b++)
        for (int64_t c = 0; c < k; c++) rows[b * k + c] = t[c * IB + b];
}

/* out[B, F(F-1)/2] from x[B,F,D] */
void adt_k_interaction_forward(float *out, const float *x, float *scratch, int64_t B, int64_t F, int64_t D) {
    const int64_t npair = F * (F - 1) / 2, fd = F * D;
    float *xt = scratch, *zt = scratch + fd * IB;
    for (int64_t b0 = 0; b0 < B; b0 += IB) {
        const int64_t nb = B - b0 < IB ? B - b0 : IB;
        to_block(xt, x + b0 * fd, nb, fd);
        for (int64_t i = 1; i < F; i++)
            for (int64_t j = 0; j < i; j++) {
                float *restrict z = zt + (i * (i - 1) / 2 + j) * IB;
                for (int64_t b = 0; b < nb; b++) z[b] = 0.0f;
                for (int64_t d = 0; d < D; d++) {
                    const float *restrict xi = xt + (i * D + d) * IB, *restrict xj = xt + (j * D + d) * IB;
                    for (int64_t b = 0; b < nb; b++) z[b] += xi[b] * xj[b];
                }
            }
        from_block(out + b0 * npair, zt, nb, npair);
    }
}

/* dx[B,F,D] from dout[B, F(F-1)/2]. Z_ij = x_i . x_j for i > j, so dL/dx_i gets dZ_ij x_j and
 * dL/dx_j gets dZ_ij x_i: dx_b = (G + G^T) x_b with G the lower triangle holding dout. */
void adt_k_interaction_backward(float *dx, const float *dout, const float *x, float *scratch, int64_t B, int64_t F,
                                int64_t D) {
    const int64_t npair = F * (F - 1) / 2, fd = F * D;
    float *xt = scratch, *dt = scratch + fd * IB, *gt = scratch + 2 * fd * IB;
    for (int64_t b0 = 0; b0 < B; b0 += IB) {
        const int64_t nb = B - b0 < IB ? B - b0 : IB;
        to_block(xt, x + b0 * fd, nb, fd);
        to_block(gt, dout + b0 * npair, nb, npair);
        memset(dt, 0, (size_t)(fd * IB) * sizeof *dt);
        for (int64_t i = 1; i < F; i++)
            for (int64_t j = 0; j < i; j++) {
                const float *restrict g = gt + (i * (i - 1) / 2 + j) * IB;
                for (int64_t d = 0; d < D; d++) {
                    float *restrict di = dt + (i * D + d) * IB, *restrict dj = dt + (j * D + d) * IB;
                    const float *restrict xi = xt + (i * D + d) * IB, *restrict xj = xt + (j * D + d) * IB;
                    for (int64_t b = 0; b < nb; b++) {
                        di[b] += g[b] * xj[b];
                        dj[b] += g[b] * xi[b];
                    }
                }
            }
        from_block(dx + b0 * fd, dt, nb, fd);
    }
}
