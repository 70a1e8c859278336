/*
 * k_math.h - private inline exp, tanh and row reductions for the CPU kernels (k_act.c,
 * k_norm.c, k_attn.c, k_loss.c).
 *
 * glibc's expf/tanhf are opaque calls with special-case branches, so a loop that calls them
 * stays scalar. These versions are straight-line float arithmetic: clamps and selects are
 * written as ternaries that the compiler turns into min/max/blend, the power of two is built by
 * integer arithmetic on the exponent bits, and so a loop that calls them vectorises at -O3.
 * Accuracy is a couple of ulp over the whole float range (tests/test_kernels_nn.c sweeps it).
 * The exported adt_k_expf / adt_k_tanhf (k_act.c) are thin wrappers around these.
 * Also here: the row reductions (max, sum, dot) the softmax-like kernels share.
 *
 * With AVX-512 (-march=native on a CPU that has it) the same algorithms are also written with
 * intrinsics, 16 floats at a time, and row lengths that are not a multiple of 16 finish with one
 * masked vector step instead of a scalar loop. The compiler's own vectorisation of the portable
 * code loses most of its speed on the short rows these kernels see (a few hundred elements):
 * lane sums are combined one by one in double, tails run scalar, and each loop carries versioning
 * for aliasing. The portable versions stay as the fallback (NATIVE=0, other CPUs).
 */
#ifndef ADTRAIN_OPS_K_MATH_H
#define ADTRAIN_OPS_K_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* A fused multiply-add where the hardware has one: one rounding instead of two in the
 * polynomials. Without it fmaf would be a library call and stop vectorisation. */
#if defined(__FMA__) || defined(__FMA4__) || defined(__aarch64__)
#define ADT_K_FMA(a, b, c) fmaf((a), (b), (c))
#else
#define ADT_K_FMA(a, b, c) ((a) * (b) + (c))
#endif

/* Bit casts through memcpy (no aliasing trouble; compiles to nothing). Unsigned, so that the
 * exponent arithmetic below cannot overflow even on a NaN input. */
static inline float adt_k_bits_to_float(uint32_t i) {
    float f;
    memcpy(&f, &i, sizeof f);
    return f;
}

static inline uint32_t adt_k_float_to_bits(float f) {
    uint32_t i;
    memcpy(&i, &f, sizeof i);
    return i;
}

/* exp(x) = 2^n exp(r), x = n ln2 + r, |r| <= ln2/2 (Cephes expf). */
static inline float adt_k_expf_inl(float x) {
    /* Above ln(FLT_MAX) the result would be inf: saturate at the largest finite value instead.
     * Below -104 the result rounds to 0 anyway. Written as "x > hi ? hi : x" so NaN passes. */
    x = x > 88.72283f ? 88.72283f : x;
    x = x < -104.0f ? -104.0f : x;
    /* n = round(x / ln2) without a float->int conversion: adding 1.5 * 2^23 leaves n in the low
     * mantissa bits (round to nearest), and the bits then read as an integer offset. */
    const float magic = 12582912.0f; /* 0x1.8p23 */
    float t = ADT_K_FMA(x, 1.44269504088896341f, magic);
    float nf = t - magic;
    int32_t n = (int32_t)(adt_k_float_to_bits(t) - 0x4B400000u);
    /* Cody-Waite: ln2 = c1 + c2 with c1 short enough that nf * c1 is exact. */
    float r = ADT_K_FMA(nf, -0.693359375f, x);
    r = ADT_K_FMA(nf, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = ADT_K_FMA(p, r, 1.3981999507e-3f);
    p = ADT_K_FMA(p, r, 8.3334519073e-3f);
    p = ADT_K_FMA(p, r, 4.1665795894e-2f);
    p = ADT_K_FMA(p, r, 1.6666665459e-1f);
    p = ADT_K_FMA(p, r, 5.0000001201e-1f);
    float y = ADT_K_FMA(p, r * r, r) + 1.0f;
    /* n is in [-150, 128]: 2^n alone may be subnormal or overflow, so scale by two halves, each a
     * normal power of two; a subnormal result is then rounded once, by the last multiply. */
    int32_t n1 = n / 2;
    int32_t n2 = n - n1;
    float s1 = adt_k_bits_to_float(((uint32_t)n1 + 127u) << 23);
    float s2 = adt_k_bits_to_float(((uint32_t)n2 + 127u) << 23);
    return y * s1 * s2;
}

#if defined(__AVX512F__)
/* adt_k_expf_inl on 16 lanes: the same clamps, reduction and polynomial, with fused multiply-adds
 * throughout. scalef multiplies by 2^n with a single rounding, which is what the two half-scales
 * of the scalar version achieve for subnormal results. NaN lanes stay NaN (min/max return their
 * second operand when either is NaN). */
static inline __m512 adt_k_exp_v16(__m512 x) {
    x = _mm512_min_ps(_mm512_set1_ps(88.72283f), x);
    x = _mm512_max_ps(_mm512_set1_ps(-104.0f), x);
    const __m512 magic = _mm512_set1_ps(12582912.0f);
    __m512 t = _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), magic);
    __m512 nf = _mm512_sub_ps(t, magic);
    __m512 r = _mm512_fmadd_ps(nf, _mm512_set1_ps(-0.693359375f), x);
    r = _mm512_fmadd_ps(nf, _mm512_set1_ps(2.12194440e-4f), r);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(y, nf);
}

/* The first `rem` lanes (0 <= rem <= 16): the tail of a row. */
static inline __mmask16 adt_k_mask_v16(int64_t rem) {
    return (__mmask16)(rem >= 16 ? 0xFFFFu : (1u << rem) - 1u);
}

/* Sum of the 16 lanes, in double (exact for lanes within 2^29 of each other in magnitude). */
static inline double adt_k_hsum_v16(__m512 v) {
    __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
    __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm512_reduce_add_pd(_mm512_add_pd(lo, hi));
}
#endif

/* tanh: an odd polynomial for |x| < 0.625 (keeps relative accuracy for tiny x, where
 * 1 - 2/(e^2x + 1) would cancel), and sign(x) (1 - 2/(e^2|x| + 1)) beyond (Cephes tanhf). */
static inline float adt_k_tanhf_inl(float x) {
    float ax = fabsf(x);
    float z = x * x;
    float p = -5.70498872745e-3f;
    p = ADT_K_FMA(p, z, 2.06390887954e-2f);
    p = ADT_K_FMA(p, z, -5.37397155531e-2f);
    p = ADT_K_FMA(p, z, 1.33314422036e-1f);
    p = ADT_K_FMA(p, z, -3.33332819422e-1f);
    float small = ADT_K_FMA(p * z, x, x);
    /* e^(2|x|) saturates at FLT_MAX inside adt_k_expf_inl, so the quotient stays finite. */
    float e = adt_k_expf_inl(2.0f * ax);
    float big = copysignf(1.0f - 2.0f / (e + 1.0f), x);
    return ax < 0.625f ? small : big;
}

/* Logistic sigmoid, accurate in both tails: with e = exp(-|x|) <= 1, sigmoid(|x|) = 1/(1+e) and
 * sigmoid(-|x|) = e/(1+e), neither of which cancels. */
static inline float adt_k_sigmoidf_inl(float x) {
    float e = adt_k_expf_inl(-fabsf(x));
    /* select the numerator, then multiply: "x >= 0 ? s : e * s" would leave the multiply on
     * one side of a branch, which blocks if-conversion (and vectorisation) below AVX-512 */
    float num = x >= 0.0f ? 1.0f : e;
    return num / (1.0f + e);
}

/* ---- row reductions ------------------------------------------------------------------------
 * A plain "s += x[i]" loop is not vectorised without -ffast-math: the compiler may not reorder
 * float additions. Writing the reorder out, as ADT_K_LANES independent partial sums combined at
 * the end, lets it use full vectors, and is also more accurate than one running sum (each
 * partial sum sees only n / ADT_K_LANES terms). Plain multiply-add here, not ADT_K_FMA: gcc
 * does not vectorise fmaf inside these lane groups. The max stays scalar (a float max is not a
 * reduction gcc will reorder), but its 16 independent chains still run at full issue rate. */
#define ADT_K_LANES 16

#if defined(__AVX512F__)
/* Each lane of the accumulator is one of the ADT_K_LANES partial results of the portable code;
 * the tail goes into the lanes too (masked), and the lanes are combined in double. */
static inline float adt_k_max_inl(const float *x, int64_t n) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    __m512 m = ninf;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_loadu_ps(x + i), m); /* NaN x skipped */
    if (i < n) m = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, adt_k_mask_v16(n - i), x + i), m);
    return _mm512_reduce_max_ps(m);
}

static inline float adt_k_sum_inl(const float *x, int64_t n) {
    __m512 s = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) s = _mm512_add_ps(s, _mm512_loadu_ps(x + i));
    if (i < n) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(adt_k_mask_v16(n - i), x + i));
    return (float)adt_k_hsum_v16(s);
}

static inline float adt_k_dot_inl(const float *a, const float *b, int64_t n) {
    __m512 s = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) s = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), s);
    if (i < n) {
        __mmask16 k = adt_k_mask_v16(n - i);
        s = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(k, a + i), _mm512_maskz_loadu_ps(k, b + i), s);
    }
    return (float)adt_k_hsum_v16(s);
}

/* out[i] = exp(x[i] - shift) for i < n; returns the sum of the out[i] (out may be x). */
static inline float adt_k_exp_shift_sum_inl(float *out, const float *x, float shift, int64_t n) {
    const __m512 sh = _mm512_set1_ps(shift);
    __m512 s = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 e = adt_k_exp_v16(_mm512_sub_ps(_mm512_loadu_ps(x + i), sh));
        _mm512_storeu_ps(out + i, e);
        s = _mm512_add_ps(s, e);
    }
    if (i < n) {
        __mmask16 k = adt_k_mask_v16(n - i);
        __m512 e = _mm512_maskz_mov_ps(k, adt_k_exp_v16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), sh)));
        _mm512_mask_storeu_ps(out + i, k, e);
        s = _mm512_add_ps(s, e);
    }
    return (float)adt_k_hsum_v16(s);
}
#else
static inline float adt_k_max_inl(const float *x, int64_t n) {
    float m[ADT_K_LANES];
    for (int l = 0; l < ADT_K_LANES; l++) m[l] = -INFINITY;
    int64_t i = 0;
    for (; i + ADT_K_LANES <= n; i += ADT_K_LANES)
        for (int l = 0; l < ADT_K_LANES; l++) m[l] = x[i + l] > m[l] ? x[i + l] : m[l];
    float r = -INFINITY;
    for (int l = 0; l < ADT_K_LANES; l++) r = m[l] > r ? m[l] : r;
    for (; i < n; i++) r = x[i] > r ? x[i] : r;
    return r;
}

static inline float adt_k_sum_inl(const float *x, int64_t n) {
    float s[ADT_K_LANES] = {0};
    int64_t i = 0;
    for (; i + ADT_K_LANES <= n; i += ADT_K_LANES)
        for (int l = 0; l < ADT_K_LANES; l++) s[l] += x[i + l];
    double r = 0.0;
    for (int l = 0; l < ADT_K_LANES; l++) r += s[l];
    for (; i < n; i++) r += x[i];
    return (float)r;
}

static inline float adt_k_dot_inl(const float *a, const float *b, int64_t n) {
    float s[ADT_K_LANES] = {0};
    int64_t i = 0;
    for (; i + ADT_K_LANES <= n; i += ADT_K_LANES)
        for (int l = 0; l < ADT_K_LANES; l++) s[l] += a[i + l] * b[i + l];
    double r = 0.0;
    for (int l = 0; l < ADT_K_LANES; l++) r += s[l];
    for (; i < n; i++) r += (double)a[i] * b[i];
    return (float)r;
}


/* out[i] = exp(x[i] - shift) for i < n; returns the sum of the out[i] (out may be x). */
static inline float adt_k_exp_shift_sum_inl(float *out, const float *x, float shift, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = adt_k_expf_inl(x[i] - shift);
    return adt_k_sum_inl(out, n);
}
#endif

#endif
