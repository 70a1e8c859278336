/*
 * k_norm.c - LayerNorm and softmax over the last axis, forward and backward.
 *
 * Both work row by row on x[N,C]. LayerNorm takes mean and variance in two passes (sum, then
 * sums of the deviations), which avoids the cancellation of E[x^2] - E[x]^2 when |mean| >> std.
 * The per-row passes come in two versions: AVX-512 intrinsics (16 lanes, masked tail, lanes
 * combined in double) where the target has it, and portable loops written for the compiler's
 * vectoriser (the multi-lane partial sums of k_math.h). At the widths of a transformer (C of a
 * few hundred) a row is a handful of vectors, and the portable version spends most of its time
 * combining its lane sums one by one; the intrinsics version is 3-5x faster there.
 */
#include "ops/kernels.h"

#include <math.h>

#include "ops/k_math.h"

#if defined(__AVX512F__)

/* m0 = float mean of the row; with d = x - m0: *sd = sum d, *sdd = sum d^2. */
static inline void ln_row_moments(const float *x, int64_t C, float *m0, double *sd, double *sdd) {
    const __m512 z = _mm512_setzero_ps();
    const __mmask16 kt = adt_k_mask_v16(C & 15);
    __m512 a0 = z, a1 = z;
    int64_t i = 0;
    for (; i + 32 <= C; i += 32) {
        a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
        a1 = _mm512_add_ps(a1, _mm512_loadu_ps(x + i + 16));
    }
    for (; i + 16 <= C; i += 16) a0 = _mm512_add_ps(a0, _mm512_loadu_ps(x + i));
    if (i < C) a1 = _mm512_add_ps(a1, _mm512_maskz_loadu_ps(kt, x + i));
    const float m = (float)adt_k_hsum_v16(_mm512_add_ps(a0, a1)) / (float)C;
    const __m512 vm = _mm512_set1_ps(m);
    __m512 s1a = z, s1b = z, s2a = z, s2b = z;
    for (i = 0; i + 32 <= C; i += 32) {
        __m512 da = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
        __m512 db = _mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vm);
        s1a = _mm512_add_ps(s1a, da);
        s1b = _mm512_add_ps(s1b, db);
        s2a = _mm512_fmadd_ps(da, da, s2a);
        s2b = _mm512_fmadd_ps(db, db, s2b);
    }
    for (; i + 16 <= C; i += 16) {
        __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), vm);
        s1a = _mm512_add_ps(s1a, d);
        s2a = _mm512_fmadd_ps(d, d, s2a);
    }
    if (i < C) {
        __m512 d = _mm512_maskz_sub_ps(kt, _mm512_maskz_loadu_ps(kt, x + i), vm);
        s1b = _mm512_add_ps(s1b, d);
        s2b = _mm512_fmadd_ps(d, d, s2b);
    }
    *m0 = m;
    *sd = adt_k_hsum_v16(_mm512_add_ps(s1a, s1b));
    *sdd = adt_k_hsum_v16(_mm512_add_ps(s2a, s2b));
}

/* out = (x - m) s w + b */
static inline void ln_row_apply(float *out, const float *x, const float *w, const float *b,
                                float m, float s, int64_t C) {
    const __m512 vm = _mm512_set1_ps(m), vs = _mm512_set1_ps(s);
    int64_t i = 0;
    for (; i + 16 <= C; i += 16) {
        __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vs);
        _mm512_storeu_ps(out + i, _mm512_fmadd_ps(xhat, _mm512_loadu_ps(w + i), _mm512_loadu_ps(b + i)));
    }
    if (i < C) {
        const __mmask16 k = adt_k_mask_v16(C - i);
        __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm), vs);
        _mm512_mask_storeu_ps(out + i, k,
                              _mm512_fmadd_ps(xhat, _mm512_maskz_loadu_ps(k, w + i),
                                              _mm512_maskz_loadu_ps(k, b + i)));
    }
}

/* With g = dout w and xhat = (x - m) s: *tg = sum g, *tgx = sum g xhat. */
static inline void ln_row_grad_sums(const float *dout, const float *x, const float *w, float m,
                                    float s, int64_t C, double *tg, double *tgx) {
    const __m512 vm = _mm512_set1_ps(m), vs = _mm512_set1_ps(s), z = _mm512_setzero_ps();
    __m512 sga = z, sgb = z, sxa = z, sxb = z;
    int64_t i = 0;
    for (; i + 32 <= C; i += 32) {
        __m512 ga = _mm512_mul_ps(_mm512_loadu_ps(dout + i), _mm512_loadu_ps(w + i));
        __m512 gb = _mm512_mul_ps(_mm512_loadu_ps(dout + i + 16), _mm512_loadu_ps(w + i + 16));
        __m512 xa = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm), vs);
        __m512 xb = _mm512_mul_ps(_mm512_sub_ps(_mm512_loadu_ps(x + i + 16), vm), vs);
        sga = _mm512_add_ps(sga, ga);
        sgb = _mm512_add_ps(sgb, gb);
        sxa = _mm512_fmadd_ps(ga, xa, sxa);
        sxb = _mm512_fmadd_ps(gb, xb, sxb);
    }
    for (; i < C; i += 16) { /* at most one full vector, then the masked tail */
        const __mmask16 k = adt_k_mask_v16(C - i);
        __m512 g = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, dout + i), _mm512_maskz_loadu_ps(k, w + i));
        __m512 xh = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm), vs);
        sga = _mm512_add_ps(sga, g);
        sxa = _mm512_fmadd_ps(g, xh, sxa); /* g is 0 in the masked lanes */
    }
    *tg = adt_k_hsum_v16(_mm512_add_ps(sga, sgb));
    *tgx = adt_k_hsum_v16(_mm512_add_ps(sxa, sxb));
}

/* dx row, and dw += dout xhat, db += dout. */
static inline void layernorm_backward_row(float *dx, float *dw, float *db, const float *dout,
                                          const float *x, const float *w, float m, float s,
                                          float mg, float mgx, int64_t C) {
    const __m512 vm = _mm512_set1_ps(m), vs = _mm512_set1_ps(s);
    const __m512 vmg = _mm512_set1_ps(mg), vmgx = _mm512_set1_ps(mgx);
    for (int64_t i = 0; i < C; i += 16) {
        const __mmask16 k = adt_k_mask_v16(C - i);
        __m512 d = _mm512_maskz_loadu_ps(k, dout + i);
        __m512 xhat = _mm512_mul_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), vm), vs);
        __m512 g = _mm512_mul_ps(d, _mm512_maskz_loadu_ps(k, w + i));
        __m512 r = _mm512_fnmadd_ps(xhat, vmgx, _mm512_sub_ps(g, vmg));
        _mm512_mask_storeu_ps(dx + i, k, _mm512_mul_ps(r, vs));
        _mm512_mask_storeu_ps(dw + i, k, _mm512_fmadd_ps(d, xhat, _mm512_maskz_loadu_ps(k, dw + i)));
        _mm512_mask_storeu_ps(db + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, db + i), d));
    }
}

#else /* portable */

/* The two sets of lane partial sums, each combined in double. */
static inline void ln_lanes_sum(const float *a, const float *b, double *ra, double *rb) {
    double x = 0.0, y = 0.0;
    for (int l = 0; l < ADT_K_LANES; l++) {
        x += a[l];
        y += b[l];
    }
    *ra = x;
    *rb = y;
}

static inline void ln_row_moments(const float *x, int64_t C, float *m0, double *sd, double *sdd) {
    const float m = adt_k_sum_inl(x, C) / (float)C;
    float s1[ADT_K_LANES] = {0}, s2[ADT_K_LANES] = {0};
    int64_t i = 0;
    for (; i + ADT_K_LANES <= C; i += ADT_K_LANES)
        for (int l = 0; l < ADT_K_LANES; l++) {
            float d = x[i + l] - m;
            s1[l] += d;
            s2[l] += d * d;
        }
    double r1, r2;
    ln_lanes_sum(s1, s2, &r1, &r2);
    for (; i < C; i++) {
        double d = (double)(x[i] - m);
        r1 += d;
        r2 += d * d;
    }
    *m0 = m;
    *sd = r1;
    *sdd = r2;
}

static inline void ln_row_apply(float *out, const float *x, const float *w, const float *b,
                                float m, float s, int64_t C) {
    for (int64_t i = 0; i < C; i++) out[i] = (x[i] - m) * s * w[i] + b[i];
}

static inline void ln_row_grad_sums(const float *dout, const float *x, const float *w, float m,
                                    float s, int64_t C, double *tg, double *tgx) {
    float sg[ADT_K_LANES] = {0}, sgx[ADT_K_LANES] = {0};
    int64_t i = 0;
    for (; i + ADT_K_LANES <= C; i += ADT_K_LANES)
        for (int l = 0; l < ADT_K_LANES; l++) {
            float g = dout[i + l] * w[i + l];
            float xhat = (x[i + l] - m) * s;
            sg[l] += g;
            sgx[l] += g * xhat;
        }
    double r1, r2;
    ln_lanes_sum(sg, sgx, &r1, &r2);
    for (; i < C; i++) {
        float g = dout[i] * w[i];
        r1 += g;
        r2 += (double)g * ((x[i] - m) * s);
    }
    *tg = r1;
    *tgx = r2;
}

/* dw and db are parameter gradients, never views of an input: saying so (restrict) keeps the
 * run-time alias checks within what the vectoriser is willing to emit, so this loop
 * vectorises. */
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

#endif

void adt_k_layernorm_forward(float *out, float *mean, float *rstd, const float *x,
                             const float *w, const float *b, int64_t N, int64_t C, float eps) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * C; // (C)
        /* Corrected two-pass: the first-pass mean m0 carries the rounding error of a float sum
         * of C values; the residuals d = x - m0 are of the size of the spread, so their mean
         * (which would be 0 in exact arithmetic) is accurate and removes that error, and
         * sum d^2 - (sum d)^2 / C is the variance about the corrected mean. */
        float m0;
        double sd, sdd;
        ln_row_moments(xr, C, &m0, &sd, &sdd);
        float m = (float)((double)m0 + sd / (double)C);
        double var = (sdd - sd * sd / (double)C) / (double)C; // biased, as torch.nn.LayerNorm
        if (var < 0.0) var = 0.0;
        float s = (float)(1.0 / sqrt(var + (double)eps));
        ln_row_apply(out + r * C, xr, w, b, m, s, C);
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
        const float *xr = x + r * C;     // (C)
        const float *dor = dout + r * C; // (C)
        const float m = mean[r], s = rstd[r];
        double tg, tgx;
        ln_row_grad_sums(dor, xr, w, m, s, C, &tg, &tgx);
        const float mg = (float)(tg / (double)C), mgx = (float)(tgx / (double)C);
        layernorm_backward_row(dx + r * C, dw, db, dor, xr, w, m, s, mg, mgx, C);
    }
}

void adt_k_softmax_forward(float *out, const float *x, int64_t N, int64_t C) {
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * C; // (C)
        float *outr = out + r * C;   // (C)
        /* Subtracting the row max makes every exponent <= 0: no overflow, and the sum >= 1. */
        float mx = adt_k_max_inl(xr, C);
        float inv = 1.0f / adt_k_exp_shift_sum_inl(outr, xr, mx, C);
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
