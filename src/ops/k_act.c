/*
 * k_act.c - pointwise activation kernels (ReLU, GELU, sigmoid), the exported fast exp/tanh, and
 * dropout with a mask drawn from the counter-based RNG by global element index.
 *
 * Every loop here is a flat pass over n elements with no calls out of line, so -O3
 * -march=native vectorises it (the exp/tanh bodies come from k_math.h and inline).
 */
#include "ops/kernels.h"

#include <math.h>
#include <string.h>

#include "adtrain/base.h"
#include "ops/k_math.h"

float adt_k_expf(float x) { return adt_k_expf_inl(x); }
float adt_k_tanhf(float x) { return adt_k_tanhf_inl(x); }

void adt_k_relu_forward(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

/* The subgradient at 0 is taken as 0, like PyTorch. */
void adt_k_relu_backward(float *dx, const float *dout, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float d = dout[i]; /* loaded unconditionally: a load inside the select could trap,
                            * which keeps pre-AVX-512 targets from vectorising the loop */
        dx[i] = x[i] > 0.0f ? d : 0.0f;
    }
}

/* GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
 * Evaluated through the identity 0.5 (1 + tanh(u)) = sigmoid(2u): the same function, but for
 * negative x the tanh form loses most of its digits to the cancellation in 1 + tanh(u) (at
 * x = -5 only ~4 are left), while the sigmoid form, taken as in adt_k_sigmoidf_inl with
 * e = exp(-2|u|) <= 1, keeps full relative accuracy in both tails, for one exp and one divide. */
#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

/* x^2 is capped at 144 (|x| = 12): beyond that e = exp(-2|u|) is 0 in float anyway, and the cap
 * keeps x^2 and u' finite for absurd |x|, where e u' would otherwise be 0 * inf. The cap is an
 * integer min on the bits (for x^2 >= 0 their order is the order of the values): a float select
 * "x2 > 144 ? 144 : x2" is a branch to the compiler (NaN semantics keep it from being a min),
 * it folds the constant side and leaves arithmetic on one side only, and that stops
 * if-conversion and vectorisation below AVX-512 (gelu_sq; the intrinsics take a vector min).
 * A NaN x still gives NaN through u. */

#if defined(__AVX512F__)
/* The arithmetic of the portable loops below, 16 lanes at a time, with the factor 2 of 2u (and
 * of 2 u' in the derivative) folded into the constants: scaling by 2 is exact, so the results
 * are those of the portable form up to the fused multiply-adds. */
static inline __m512 gelu_2u_v16(__m512 x, __m512 *x2) {
    *x2 = _mm512_min_ps(_mm512_mul_ps(x, x), _mm512_set1_ps(144.0f));
    return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(2.0f * GELU_K0), x),
                         _mm512_fmadd_ps(_mm512_set1_ps(GELU_K1), *x2, _mm512_set1_ps(1.0f)));
}

/* e = exp(-|2u|) and the numerator of s = sigmoid(2u) = num / (1 + e) */
static inline __m512 gelu_exp_v16(__m512 u2, __m512 *num) {
    const __m512i sign = _mm512_set1_epi32((int)0x80000000u);
    __m512 e = adt_k_exp_v16(_mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(u2), sign)));
    *num = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(u2, _mm512_setzero_ps(), _CMP_GE_OQ), e,
                                _mm512_set1_ps(1.0f));
    return e;
}

static inline __m512 gelu_forward_v16(__m512 x) {
    __m512 x2, num, u2 = gelu_2u_v16(x, &x2);
    __m512 e = gelu_exp_v16(u2, &num);
    return _mm512_mul_ps(x, _mm512_div_ps(num, _mm512_add_ps(_mm512_set1_ps(1.0f), e)));
}

static inline __m512 gelu_backward_v16(__m512 x, __m512 dout) {
    const __m512 one = _mm512_set1_ps(1.0f);
    __m512 x2, num, u2 = gelu_2u_v16(x, &x2);
    __m512 du2 = _mm512_mul_ps(_mm512_set1_ps(2.0f * GELU_K0),
                               _mm512_fmadd_ps(_mm512_set1_ps(3.0f * GELU_K1), x2, one));
    __m512 e = gelu_exp_v16(u2, &num);
    __m512 inv = _mm512_div_ps(one, _mm512_add_ps(one, e));
    __m512 s = _mm512_mul_ps(num, inv);
    __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(e, inv), inv), du2);
    return _mm512_mul_ps(dout, _mm512_fmadd_ps(x, t, s));
}

void adt_k_gelu_forward(float *out, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, gelu_forward_v16(_mm512_loadu_ps(x + i)));
    if (i < n) {
        const __mmask16 k = adt_k_mask_v16(n - i);
        _mm512_mask_storeu_ps(out + i, k, gelu_forward_v16(_mm512_maskz_loadu_ps(k, x + i)));
    }
}

void adt_k_gelu_backward(float *dx, const float *dout, const float *x, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dx + i, gelu_backward_v16(_mm512_loadu_ps(x + i), _mm512_loadu_ps(dout + i)));
    if (i < n) {
        const __mmask16 k = adt_k_mask_v16(n - i);
        _mm512_mask_storeu_ps(dx + i, k, gelu_backward_v16(_mm512_maskz_loadu_ps(k, x + i),
                                                           _mm512_maskz_loadu_ps(k, dout + i)));
    }
}
#else
static inline float gelu_sq(float x) {
    const uint32_t cap = 0x43100000u; /* 144.0f */
    uint32_t b = adt_k_float_to_bits(x * x);
    return adt_k_bits_to_float(b < cap ? b : cap);
}

void adt_k_gelu_forward(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float u = GELU_K0 * xi * (1.0f + GELU_K1 * gelu_sq(xi));
        float e = adt_k_expf_inl(-2.0f * fabsf(u));
        float num = u >= 0.0f ? 1.0f : e; /* a select of values, not of operations */
        out[i] = xi * (num / (1.0f + e));
    }
}

/* d/dx [x s(2u)] = s + 2 x s (1 - s) u',  u' = sqrt(2/pi) (1 + 3 * 0.044715 x^2);
 * this is PyTorch's 0.5 (1 + t) + 0.5 x (1 - t^2) u' with t = 2s - 1. With e = exp(-2|u|),
 * s (1 - s) = e / (1 + e)^2 for either sign of u, with no cancellation. */
void adt_k_gelu_backward(float *dx, const float *dout, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float x2 = gelu_sq(xi);
        float u = GELU_K0 * xi * (1.0f + GELU_K1 * x2);
        float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x2);
        float e = adt_k_expf_inl(-2.0f * fabsf(u));
        float inv = 1.0f / (1.0f + e);
        float s = (u >= 0.0f ? 1.0f : e) * inv;
        /* e first: for huge |x| it is 0 and must zero the term before x can overflow it */
        float t = 2.0f * (e * inv * inv) * du;
        dx[i] = dout[i] * (s + xi * t);
    }
}
#endif

void adt_k_sigmoid_forward(float *out, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = adt_k_sigmoidf_inl(x[i]);
}

void adt_k_sigmoid_backward(float *dx, const float *dout, const float *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) dx[i] = dout[i] * out[i] * (1.0f - out[i]);
}

/* ---- dropout ------------------------------------------------------------------------------
 * The mask is a pure function of (key, global index), so every rank holding a box of the tensor
 * draws its part of the one serial mask, and backward regenerates it instead of storing it.
 * The box is walked one row of the last axis at a time: inside a row the global index runs
 * contiguously, so only the row's starting index needs the div/mod walk over the outer axes. */
static void dropout_apply(float *out, const float *in, float p, uint64_t key, int ndim,
                          const int64_t *ldim, const int64_t *gdim, const int64_t *off) {
    ADT_ASSERT(p >= 0.0f && p < 1.0f);
    ADT_ASSERT(ndim >= 0);
    int64_t n = 1;
    for (int a = 0; a < ndim; a++) n *= ldim[a];
    if (p == 0.0f) {
        if (out != in) memmove(out, in, (size_t)n * sizeof *out);
        return;
    }
    if (n == 0) return;
    const float scale = 1.0f / (1.0f - p);
    /* A 0-d tensor is one row of one element at global index 0. */
    int64_t inner = ndim > 0 ? ldim[ndim - 1] : 1;
    int64_t inner_off = ndim > 0 ? off[ndim - 1] : 0;
    int64_t rows = n / inner;
    for (int64_t r = 0; r < rows; r++) {
        /* global index of (r's outer coordinates, inner_off) */
        int64_t g = 0, rest = r, gstride = ndim > 0 ? gdim[ndim - 1] : 1;
        for (int a = ndim - 2; a >= 0; a--) {
            int64_t coord = rest % ldim[a];
            rest /= ldim[a];
            g += (coord + off[a]) * gstride;
            gstride *= gdim[a];
        }
        g += inner_off;
        const float *src = in + r * inner;
        float *dst = out + r * inner;
        for (int64_t j = 0; j < inner; j++) {
            float keep = adt_rng_uniform(key, (uint64_t)(g + j)) >= p ? scale : 0.0f;
            dst[j] = src[j] * keep;
        }
    }
}

void adt_k_dropout_forward(float *out, const float *x, float p, uint64_t key, int ndim,
                           const int64_t *ldim, const int64_t *gdim, const int64_t *off) {
    dropout_apply(out, x, p, key, ndim, ldim, gdim, off);
}

/* Same mask and scale as forward: dx = dout * mask / (1 - p). */
void adt_k_dropout_backward(float *dx, const float *dout, float p, uint64_t key, int ndim,
                            const int64_t *ldim, const int64_t *gdim, const int64_t *off) {
    dropout_apply(dx, dout, p, key, ndim, ldim, gdim, off);
}
