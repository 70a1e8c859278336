/*
 * test_kernels_nn.c - the neural-network kernels of k_act.c, k_norm.c, k_attn.c and k_loss.c
 * against plain double-precision references.
 *
 * Every forward is compared with a straightforward double loop; every backward with central
 * finite differences of that double reference on L = sum(out * R), R random, so the check is
 * tight and independent of the kernel's own forward. Shapes and values are fresh each run: the
 * seed comes from the clock unless ADT_TEST_SEED is set, and a failing run prints it.
 * Kernel outputs are pre-filled with NaN so a kernel that leaves part of an output unwritten
 * (or accumulates into it) fails.
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/base.h"
#include "check.h"
#include "ops/kernels.h"

/* ---- random inputs -------------------------------------------------------------------------- */

static uint64_t g_seed, g_state;

static uint64_t rnd_u64(void) {
    uint64_t z = (g_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rnd_unit(void) { return (double)(rnd_u64() >> 11) * (1.0 / 9007199254740992.0); }
static float rnd_uni(double lo, double hi) { return (float)(lo + (hi - lo) * rnd_unit()); }
static int64_t rnd_int(int64_t lo, int64_t hi) { /* inclusive */
    return lo + (int64_t)(rnd_u64() % (uint64_t)(hi - lo + 1));
}
static float rnd_normal(void) {
    double u1 = rnd_unit() + 1e-300, u2 = rnd_unit();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

static float *falloc(int64_t n) { return adt_malloc((size_t)(n > 0 ? n : 1) * sizeof(float)); }
static double *dalloc(int64_t n) { return adt_malloc((size_t)(n > 0 ? n : 1) * sizeof(double)); }
static void fill_uni(float *x, int64_t n, double lo, double hi) {
    for (int64_t i = 0; i < n; i++) x[i] = rnd_uni(lo, hi);
}
static void fill_normal(float *x, int64_t n, float scale) {
    for (int64_t i = 0; i < n; i++) x[i] = scale * rnd_normal();
}
static void fill_nan(float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] = NAN;
}
static void to_double(double *d, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) d[i] = x[i];
}

/* ---- error metrics -------------------------------------------------------------------------- */

/* Norm-wise relative error: max |a - b| / max |b| (floored). Scale-free, and not thrown by an
 * element whose reference happens to be near 0. NaN anywhere counts as infinite. */
static double nrm_err_floor(const float *a, const double *b, int64_t n, double floor_) {
    double d = 0, s = floor_;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e; /* also catches NaN */
        if (fabs(b[i]) > s) s = fabs(b[i]);
    }
    return d != d ? INFINITY : d / s;
}
static double nrm_err(const float *a, const double *b, int64_t n) {
    return nrm_err_floor(a, b, n, 1e-30);
}

/* Element-wise relative error with a floor on |b|. */
static double elt_err(const float *a, const double *b, int64_t n, double floor_) {
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double s = fabs(b[i]) > floor_ ? fabs(b[i]) : floor_;
        double e = fabs((double)a[i] - b[i]) / s;
        if (!(e <= w)) w = e;
    }
    return w != w ? INFINITY : w;
}

static int all_finite(const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return 0;
    return 1;
}

/* ---- finite differences ----------------------------------------------------------------------
 * objective(ctx) evaluates the double reference L at the current contents of p (which ctx
 * points into). fd_err perturbs p[i] by +-h for all i, or for max_points random i when n is
 * larger, and returns the norm-wise error of the analytic gradient over the checked points.
 * The step is absolute, not relative to |p[i]|: the shift-invariant softmaxes are tested at
 * offsets of 1e3..1e4, where a relative step would be far too coarse. */
typedef double (*objective_fn)(void *ctx);

static double fd_err_floor(const float *analytic, double *p, int64_t n, objective_fn f,
                           void *ctx, int64_t max_points, double floor_) {
    int64_t m = n < max_points ? n : max_points;
    float *a = falloc(m);
    double *fd = dalloc(m);
    for (int64_t k = 0; k < m; k++) {
        int64_t i = m == n ? k : rnd_int(0, n - 1);
        double keep = p[i], h = 1e-4;
        p[i] = keep + h;
        double lp = f(ctx);
        p[i] = keep - h;
        double lm = f(ctx);
        p[i] = keep;
        fd[k] = (lp - lm) / (2 * h);
        a[k] = analytic[i];
    }
    double e = nrm_err_floor(a, fd, m, floor_);
    free(a);
    free(fd);
    return e;
}
static double fd_err(const float *analytic, double *p, int64_t n, objective_fn f, void *ctx,
                     int64_t max_points) {
    return fd_err_floor(analytic, p, n, f, ctx, max_points, 1e-30);
}

/* L = sum(out * R) for a reference that writes n doubles. */
static double dot_d(const double *a, const double *b, int64_t n) {
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- pointwise activations -------------------------------------------------------------------- */

static double gelu_ref(double x) {
    /* 0.5 x (1 + tanh(u)) written as x / (1 + e^(-2u)): the same function, but 1 + tanh(u)
     * cancels in double too for x < -6, which would make the reference the least accurate
     * party in the comparison. */
    double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    return x / (1.0 + exp(-2.0 * u));
}
static double sigmoid_ref(double x) { return 1.0 / (1.0 + exp(-x)); }

typedef struct {
    double *x, *r;
    int64_t n;
    double (*fn)(double);
} pointwise_ctx;

static double pointwise_obj(void *vctx) {
    pointwise_ctx *c = vctx;
    double s = 0;
    for (int64_t i = 0; i < c->n; i++) s += c->fn(c->x[i]) * c->r[i];
    return s;
}
static double relu_ref(double x) { return x > 0 ? x : 0; }

static void test_relu(void) {
    int64_t n = rnd_int(1, 3000);
    float *x = falloc(n), *out = falloc(n), *dout = falloc(n), *dx = falloc(n);
    fill_uni(x, n, -3, 3);
    for (int64_t i = 0; i < n; i += 7) x[i] = 0.0f; /* the kink: subgradient 0 */
    fill_nan(out, n);
    adt_k_relu_forward(out, x, n);
    for (int64_t i = 0; i < n; i++) CHECK(out[i] == (x[i] > 0 ? x[i] : 0.0f), "i=%ld", (long)i);
    fill_normal(dout, n, 1);
    fill_nan(dx, n);
    adt_k_relu_backward(dx, dout, x, n);
    for (int64_t i = 0; i < n; i += 7) CHECK(dx[i] == 0.0f, "dx at x=0 is %g", dx[i]);

    /* finite differences away from the kink (|x| >= 0.1 >> h) */
    int64_t m = rnd_int(1, n < 200 ? n : 200);
    double *xd = dalloc(m), *rd = dalloc(m);
    for (int64_t i = 0; i < m; i++) {
        x[i] = rnd_uni(0.1, 3) * (rnd_u64() & 1 ? 1 : -1);
        dout[i] = rnd_normal();
    }
    adt_k_relu_backward(dx, dout, x, m);
    to_double(xd, x, m);
    to_double(rd, dout, m);
    pointwise_ctx c = {xd, rd, m, relu_ref};
    double e = fd_err(dx, xd, m, pointwise_obj, &c, m);
    CHECK(e < 1e-6, "relu backward vs FD: %g", e);
    free(x), free(out), free(dout), free(dx), free(xd), free(rd);
}

/* A pointwise kernel pair (backward taking x, or out when backward_takes_out) vs a double
 * reference. */
static void check_pointwise(const char *name, void (*fwd)(float *, const float *, int64_t),
                            double (*ref)(double), int backward_takes_out,
                            void (*bwd)(float *, const float *, const float *, int64_t),
                            double fwd_tol, double bwd_tol) {
    int64_t n = rnd_int(1, 3000);
    float *x = falloc(n), *out = falloc(n), *dout = falloc(n), *dx = falloc(n);
    double *ref_out = dalloc(n);
    /* mostly the interesting range, some far tails and exact extremes */
    for (int64_t i = 0; i < n; i++) {
        int64_t kind = rnd_int(0, 9);
        x[i] = kind < 8 ? rnd_uni(-8, 8) : kind == 8 ? rnd_uni(-60, 60) : rnd_normal() * 1e-3f;
    }
    const float extremes[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 20, -20, 100, -100, 1e6f, -1e6f,
                              1e30f, -1e30f, 3.4e38f, -3.4e38f};
    for (size_t k = 0; k < sizeof extremes / sizeof *extremes && (int64_t)k < n; k++)
        x[k] = extremes[k];
    fill_nan(out, n);
    fwd(out, x, n);
    for (int64_t i = 0; i < n; i++) ref_out[i] = ref(x[i]);
    CHECK(all_finite(out, n), "%s forward produced inf/NaN", name);
    /* Relative per element, in units of the problem's own sensitivity: a float kernel rounds
     * its intermediates (e.g. u for GELU) to ~1 ulp, which moves the result by cond(x) ulp,
     * cond = |x f'(x) / f(x)|; in the far tails that is tens of ulp for any float code. The
     * floor skips results so small (below 1e-30) that only their absolute error matters. */
    double worst = 0;
    float worst_x = 0;
    for (int64_t i = 0; i < n; i++) {
        double r = ref_out[i], xi = x[i], h = 1e-6 * (fabs(xi) > 1e-30 ? fabs(xi) : 1e-30);
        double cond = fabs(r) > 0 ? fabs(xi * (ref(xi + h) - ref(xi - h)) / (2 * h) / r) : 0;
        if (!(cond < 1e6)) cond = 1e6; /* +-huge x: the difference overflows */
        double e = fabs((double)out[i] - r) / (fabs(r) > 1e-30 ? fabs(r) : 1e-30) / (1 + cond);
        if (!(e <= worst)) worst = e, worst_x = x[i];
    }
    CHECK(worst < fwd_tol, "%s forward rel err / (1 + cond) %g at x=%.9g (n=%ld)", name, worst,
          worst_x, (long)n);

    fill_normal(dout, n, 1);
    fill_nan(dx, n);
    bwd(dx, dout, backward_takes_out ? out : x, n);
    CHECK(all_finite(dx, n), "%s backward produced inf/NaN", name);

    int64_t m = rnd_int(1, n < 300 ? n : 300);
    for (int64_t i = 0; i < m; i++) x[i] = rnd_uni(-7, 7);
    fwd(out, x, m);
    bwd(dx, dout, backward_takes_out ? out : x, m);
    double *xd = dalloc(m), *rd = dalloc(m);
    to_double(xd, x, m);
    to_double(rd, dout, m);
    /* floor: a tenth of the natural scale max |dout| (|f'| is O(1) for both), so a lone point
     * where f' is small by cancellation (sigmoid's out (1 - out) near out = 1) does not
     * dominate when m is small */
    double scale = 0;
    for (int64_t i = 0; i < m; i++) scale = fabs(rd[i]) > scale ? fabs(rd[i]) : scale;
    pointwise_ctx c = {xd, rd, m, ref};
    double e = fd_err_floor(dx, xd, m, pointwise_obj, &c, m, 0.1 * scale);
    CHECK(e < bwd_tol, "%s backward vs FD: %g (m=%ld)", name, e, (long)m);
    free(x), free(out), free(dout), free(dx), free(ref_out), free(xd), free(rd);
}

static void test_gelu(void) {
    check_pointwise("gelu", adt_k_gelu_forward, gelu_ref, 0, adt_k_gelu_backward, 5e-7, 4e-6);
    /* the reference written the PyTorch way agrees where that form is accurate */
    for (double x = -3; x <= 3; x += 0.01) {
        double t = 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
        CHECK(fabs(t - gelu_ref(x)) <= 1e-12, "x=%g", x);
    }
}

static void test_sigmoid(void) {
    check_pointwise("sigmoid", adt_k_sigmoid_forward, sigmoid_ref, 1, adt_k_sigmoid_backward,
                    5e-7, 4e-6);
}

/* ---- expf / tanhf over the whole float range ------------------------------------------------- */

static float bits_to_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_expf_tanhf_sweep(void) {
    double worst_exp = 0, worst_tanh = 0;
    float at_exp = 0, at_tanh = 0;
    int bad_sub = 0, bad_over = 0, bad_nan = 0;
    /* every 613th bit pattern of the 2^32 (both signs, all exponents incl. subnormals, inf,
     * NaN), a random start so runs cover different points, then a dense grid of the range
     * that matters */
    uint32_t start = (uint32_t)rnd_int(0, 612);
    int64_t count = 0;
    for (uint64_t u = start; u <= 0xffffffffull; u += 613) {
        float x = bits_to_float((uint32_t)u);
        float ex = adt_k_expf(x), th = adt_k_tanhf(x);
        count++;
        if (isnan(x)) {
            bad_nan += !isnan(ex) || !isnan(th);
            continue;
        }
        double re = exp((double)x), rt = tanh((double)x);
        if (re > 3.4028234663852886e38) {
            bad_over += !(isfinite(ex) && ex >= 3.4e38f);
        } else if (re < 1.1754943508222875e-38) {
            /* subnormal or underflowing result: within one subnormal step */
            bad_sub += !(fabs((double)ex - re) <= 1.401298464324817e-45);
        } else {
            double e = fabs((double)ex - re) / re;
            if (e > worst_exp) worst_exp = e, at_exp = x;
        }
        double et = rt == 0 ? fabs((double)th) : fabs((double)th - rt) / fabs(rt);
        if (et > worst_tanh) worst_tanh = et, at_tanh = x;
    }
    for (double x = -105; x <= 90; x += 1.0 / 4096) {
        float xf = (float)x;
        double re = exp((double)xf), rt = tanh((double)xf);
        float ex = adt_k_expf(xf), th = adt_k_tanhf(xf);
        if (re >= 1.1754943508222875e-38 && re <= 3.4e38) {
            double e = fabs((double)ex - re) / re;
            if (e > worst_exp) worst_exp = e, at_exp = xf;
        }
        double et = rt == 0 ? fabs((double)th) : fabs((double)th - rt) / fabs(rt);
        if (et > worst_tanh) worst_tanh = et, at_tanh = xf;
    }
    CHECK(bad_nan == 0, "%d NaN inputs did not give NaN", bad_nan);
    CHECK(bad_over == 0, "%d overflowing inputs did not saturate to a finite max", bad_over);
    CHECK(bad_sub == 0, "%d subnormal-range results off by more than one step", bad_sub);
    CHECK(worst_exp < 1e-6, "expf max rel err %g at x=%.9g", worst_exp, at_exp);
    CHECK(worst_tanh < 1e-6, "tanhf max rel err %g at x=%.9g", worst_tanh, at_tanh);
    CHECK(adt_k_expf(INFINITY) >= 3.4e38f && isfinite(adt_k_expf(INFINITY)), "exp(inf)");
    CHECK(adt_k_expf(-INFINITY) == 0.0f, "exp(-inf)=%g", adt_k_expf(-INFINITY));
    CHECK(adt_k_tanhf(INFINITY) == 1.0f && adt_k_tanhf(-INFINITY) == -1.0f, "tanh(+-inf)");
    CHECK(adt_k_tanhf(1e-40f) == 1e-40f, "tanh(subnormal) = %g", adt_k_tanhf(1e-40f));
    CHECK(adt_k_expf(0.0f) == 1.0f, "exp(0) = %.9g", adt_k_expf(0.0f));
    if (getenv("CHECK_VERBOSE"))
        fprintf(stderr, "  expf max rel err %.3g (%.2f ulp of 2^-23) at %.9g; tanhf %.3g at %.9g;"
                " %ld sweep points\n",
                worst_exp, worst_exp / 1.1920929e-7, at_exp, worst_tanh, at_tanh, (long)count);
}

/* ---- dropout ---------------------------------------------------------------------------------- */

static void test_dropout_fraction_and_backward(void) {
    int64_t n = rnd_int(50000, 150000);
    float p = rnd_uni(0.05, 0.9);
    uint64_t key = rnd_u64();
    float *x = falloc(n), *out = falloc(n), *dout = falloc(n), *dx = falloc(n);
    fill_uni(x, n, 0.5, 2); /* nonzero, so out == 0 identifies a dropped element */
    fill_normal(dout, n, 1);
    int64_t dims[1] = {n}, zero[1] = {0};
    fill_nan(out, n);
    adt_k_dropout_forward(out, x, p, key, 1, dims, dims, zero);
    fill_nan(dx, n);
    adt_k_dropout_backward(dx, dout, p, key, 1, dims, dims, zero);
    const float scale = 1.0f / (1.0f - p);
    int64_t kept = 0, bad = 0, bad_bwd = 0;
    for (int64_t i = 0; i < n; i++) {
        int keep = adt_rng_uniform(key, (uint64_t)i) >= p;
        kept += keep;
        bad += out[i] != (keep ? x[i] * scale : 0.0f);
        bad_bwd += dx[i] != (out[i] != 0.0f ? dout[i] * scale : 0.0f);
    }
    double frac = (double)kept / (double)n, want = 1.0 - p;
    double sigma = sqrt(p * (1.0 - p) / (double)n);
    CHECK(fabs(frac - want) < 6 * sigma, "kept fraction %g, want %g (p=%g, n=%ld)", frac, want,
          p, (long)n);
    CHECK(bad == 0, "%ld forward elements differ from the rng mask", (long)bad);
    CHECK(bad_bwd == 0, "%ld backward elements do not follow the forward mask", (long)bad_bwd);

    /* p == 0 copies */
    adt_k_dropout_forward(out, x, 0.0f, key, 1, dims, dims, zero);
    CHECK(memcmp(out, x, (size_t)n * sizeof *x) == 0, "p=0 must copy");
    adt_k_dropout_backward(dx, dout, 0.0f, key, 1, dims, dims, zero);
    CHECK(memcmp(dx, dout, (size_t)n * sizeof *x) == 0, "p=0 backward must copy");

    /* a 0-d tensor is element 0 */
    float xs = 1.5f, os = NAN;
    adt_k_dropout_forward(&os, &xs, 0.5f, key, 0, NULL, NULL, NULL);
    CHECK(os == (adt_rng_uniform(key, 0) >= 0.5f ? 3.0f : 0.0f), "0-d dropout gave %g", os);
    free(x), free(out), free(dout), free(dx);
}

/* A box of a global tensor draws the same mask as the matching slice of the whole tensor. */
static void test_dropout_box(void) {
    for (int rep = 0; rep < 20; rep++) {
        int ndim = (int)rnd_int(1, 4);
        int64_t gdim[4], ldim[4], off[4], gn = 1, ln = 1;
        for (int a = 0; a < ndim; a++) {
            gdim[a] = rnd_int(1, 9);
            ldim[a] = rnd_int(1, gdim[a]);
            off[a] = rnd_int(0, gdim[a] - ldim[a]);
            gn *= gdim[a];
            ln *= ldim[a];
        }
        float p = rnd_uni(0.1, 0.8);
        uint64_t key = rnd_u64();
        int64_t zero[4] = {0, 0, 0, 0};
        float *gx = falloc(gn), *gout = falloc(gn), *gd = falloc(gn), *lx = falloc(ln);
        float *lout = falloc(ln), *ld = falloc(ln), *want = falloc(ln), *want_d = falloc(ln);
        fill_uni(gx, gn, -2, 2);
        adt_k_dropout_forward(gout, gx, p, key, ndim, gdim, gdim, zero);
        adt_k_dropout_backward(gd, gx, p, key, ndim, gdim, gdim, zero);
        /* gather the box: local i <-> global multi-index (off + local multi-index) */
        for (int64_t i = 0; i < ln; i++) {
            int64_t rest = i, g = 0, stride = 1;
            for (int a = ndim - 1; a >= 0; a--) {
                g += (off[a] + rest % ldim[a]) * stride;
                rest /= ldim[a];
                stride *= gdim[a];
            }
            lx[i] = gx[g];
            want[i] = gout[g];
            want_d[i] = gd[g];
        }
        fill_nan(lout, ln);
        fill_nan(ld, ln);
        adt_k_dropout_forward(lout, lx, p, key, ndim, ldim, gdim, off);
        adt_k_dropout_backward(ld, lx, p, key, ndim, ldim, gdim, off);
        CHECK(memcmp(lout, want, (size_t)ln * sizeof *lout) == 0,
              "box forward differs from the global slice (ndim=%d, rep %d)", ndim, rep);
        CHECK(memcmp(ld, want_d, (size_t)ln * sizeof *ld) == 0,
              "box backward differs from the global slice (ndim=%d, rep %d)", ndim, rep);
        free(gx), free(gout), free(gd), free(lx), free(lout), free(ld), free(want), free(want_d);
    }
}

/* ---- layernorm --------------------------------------------------------------------------------- */

static void layernorm_ref(double *out, double *mean, double *rstd, const double *x,
                          const double *w, const double *b, int64_t N, int64_t C, double eps) {
    for (int64_t r = 0; r < N; r++) {
        const double *xr = x + r * C;
        double m = 0, v = 0;
        for (int64_t i = 0; i < C; i++) m += xr[i];
        m /= (double)C;
        for (int64_t i = 0; i < C; i++) v += (xr[i] - m) * (xr[i] - m);
        v /= (double)C;
        double s = 1.0 / sqrt(v + eps);
        for (int64_t i = 0; i < C; i++) out[r * C + i] = (xr[i] - m) * s * w[i] + b[i];
        if (mean) mean[r] = m;
        if (rstd) rstd[r] = s;
    }
}

typedef struct {
    double *x, *w, *b, *r, *out;
    int64_t N, C;
    double eps;
} ln_ctx;

static double ln_obj(void *vctx) {
    ln_ctx *c = vctx;
    layernorm_ref(c->out, NULL, NULL, c->x, c->w, c->b, c->N, c->C, c->eps);
    return dot_d(c->out, c->r, c->N * c->C);
}

/* Sentinels just past an output: a kernel must not write beyond its n elements (a masked
 * vector tail that is wrong would). */
#define GUARD 17
static void guard_set(float *x, int64_t n) {
    for (int64_t i = n; i < n + GUARD; i++) x[i] = 4321.0f;
}
static int guard_ok(const float *x, int64_t n) {
    for (int64_t i = n; i < n + GUARD; i++)
        if (x[i] != 4321.0f) return 0;
    return 1;
}

/* One LayerNorm case: forward against the double reference, backward against finite
 * differences of it. `offset` rows (|mean| >> spread) get the looser tolerances. */
static void layernorm_case(int64_t N, int64_t C, float offset, int big_offset) {
    int64_t NC = N * C;
    float eps = 1e-5f;
    float *x = falloc(NC), *w = falloc(C), *b = falloc(C), *out = falloc(NC + GUARD);
    float *mean = falloc(N), *rstd = falloc(N), *dout = falloc(NC), *dx = falloc(NC + GUARD);
    float *dw = falloc(C + GUARD), *db = falloc(C + GUARD);
    double *xd = dalloc(NC), *wd = dalloc(C), *bd = dalloc(C), *rd = dalloc(NC);
    double *ref = dalloc(NC), *ref_mean = dalloc(N), *ref_rstd = dalloc(N);
    for (int64_t i = 0; i < NC; i++) x[i] = offset + rnd_uni(0.2, 3) * rnd_normal();
    fill_uni(w, C, -2, 2);
    fill_uni(b, C, -1, 1);
    fill_nan(out, NC), fill_nan(mean, N), fill_nan(rstd, N);
    guard_set(out, NC);
    adt_k_layernorm_forward(out, mean, rstd, x, w, b, N, C, eps);
    to_double(xd, x, NC), to_double(wd, w, C), to_double(bd, b, C);
    layernorm_ref(ref, ref_mean, ref_rstd, xd, wd, bd, N, C, eps);
    double e = nrm_err(out, ref, NC);
    CHECK(e < (big_offset ? 2e-5 : 2e-6), "layernorm out err %g (N=%ld C=%ld offset %g)", e,
          (long)N, (long)C, offset);
    CHECK(guard_ok(out, NC), "layernorm forward wrote past its output (C=%ld)", (long)C);
    CHECK(elt_err(mean, ref_mean, N, 1) < 1e-6, "mean");
    CHECK(elt_err(rstd, ref_rstd, N, 1e-30) < 2e-6, "rstd");

    fill_normal(dout, NC, 1);
    fill_nan(dx, NC), fill_nan(dw, C), fill_nan(db, C);
    guard_set(dx, NC), guard_set(dw, C), guard_set(db, C);
    adt_k_layernorm_backward(dx, dw, db, dout, x, w, mean, rstd, N, C);
    CHECK(guard_ok(dx, NC) && guard_ok(dw, C) && guard_ok(db, C),
          "layernorm backward wrote past its outputs (C=%ld)", (long)C);
    to_double(rd, dout, NC);
    /* dx floor: a tenth of its natural scale rstd |dout w|. With few channels dx can be
     * small by cancellation (dout w nearly in the span of 1 and xhat, which for C = 3 is a
     * plane), and then float rounding of order rstd |dout w| ulp would dominate. */
    double dx_scale = 0;
    for (int64_t r = 0; r < N; r++)
        for (int64_t i = 0; i < C; i++) {
            double g = fabs((double)rstd[r] * dout[r * C + i] * w[i]);
            dx_scale = g > dx_scale ? g : dx_scale;
        }
    ln_ctx c = {xd, wd, bd, rd, ref, N, C, eps};
    double ex = fd_err_floor(dx, xd, NC, ln_obj, &c, 400, 0.1 * dx_scale);
    double ew = fd_err(dw, wd, C, ln_obj, &c, 400);
    double eb = fd_err(db, bd, C, ln_obj, &c, 400);
    /* the offset rows amplify float rounding of x - mean by offset / spread */
    double tol = big_offset ? 1e-4 : 1e-5;
    CHECK(ex < tol, "layernorm dx vs FD %g (N=%ld C=%ld offset %g)", ex, (long)N, (long)C,
          offset);
    CHECK(ew < tol, "layernorm dw vs FD %g (N=%ld C=%ld)", ew, (long)N, (long)C);
    CHECK(eb < tol, "layernorm db vs FD %g (N=%ld C=%ld)", eb, (long)N, (long)C);
    free(x), free(w), free(b), free(out), free(mean), free(rstd), free(dout), free(dx);
    free(dw), free(db), free(xd), free(wd), free(bd), free(rd), free(ref), free(ref_mean);
    free(ref_rstd);
}

static void test_layernorm(void) {
    for (int rep = 0; rep < 4; rep++) {
        /* C = 2 is left out: there dx = +-rstd (g1 - g2)/2 (1 - xhat^2) always, and 1 - xhat^2
         * = eps / (var + eps) is formed by cancellation in the float formula (as in PyTorch). */
        int64_t C = rep == 3 ? rnd_int(16, 300) : rep == 2 ? 1 : rnd_int(3, 70);
        /* rows with an offset far above their spread: a one-pass variance would cancel */
        layernorm_case(rnd_int(1, 6), C, rep == 3 ? 100.0f : rnd_uni(-2, 2), rep == 3);
    }
}

/* Row widths around the vector sizes (16 and 32 floats): the full-vector bodies and every kind
 * of masked or scalar tail, and the widths a transformer uses. */
static const int64_t vec_widths[] = {1, 3, 7, 15, 16, 17, 31, 32, 33, 47, 48, 49,
                                     63, 64, 65, 127, 128, 129, 255, 256, 257};
#define N_VEC_WIDTHS (int)(sizeof vec_widths / sizeof *vec_widths)

static void test_layernorm_widths(void) {
    for (int k = 0; k < N_VEC_WIDTHS; k++) layernorm_case(2, vec_widths[k], rnd_uni(-2, 2), 0);
}

/* Pointwise kernels on every length up to a few vectors: element i must come out the same
 * whether it sits in a full vector or in the tail of a shorter call, and nothing past n may be
 * written. Values from the whole range, both tails included. */
static void test_pointwise_lengths(void) {
    const int64_t L = 80;
    float *x = falloc(L), *dout = falloc(L), *full = falloc(L), *dfull = falloc(L);
    float *out = falloc(L + GUARD), *dx = falloc(L + GUARD);
    for (int64_t i = 0; i < L; i++) x[i] = i % 5 == 4 ? rnd_uni(-30, 30) : rnd_uni(-6, 6);
    fill_normal(dout, L, 1);
    struct {
        const char *name;
        void (*fwd)(float *, const float *, int64_t);
        void (*bwd)(float *, const float *, const float *, int64_t);
        int bwd_takes_out;
    } k[] = {{"gelu", adt_k_gelu_forward, adt_k_gelu_backward, 0},
             {"relu", adt_k_relu_forward, adt_k_relu_backward, 0},
             {"sigmoid", adt_k_sigmoid_forward, adt_k_sigmoid_backward, 1}};
    for (size_t j = 0; j < sizeof k / sizeof *k; j++) {
        k[j].fwd(full, x, L);
        k[j].bwd(dfull, dout, k[j].bwd_takes_out ? full : x, L);
        for (int64_t n = 0; n <= L; n++) {
            fill_nan(out, n), fill_nan(dx, n);
            guard_set(out, n), guard_set(dx, n);
            k[j].fwd(out, x, n);
            k[j].bwd(dx, dout, k[j].bwd_takes_out ? full : x, n);
            CHECK(memcmp(out, full, (size_t)n * sizeof *out) == 0,
                  "%s forward at n=%ld differs from the same elements of a longer call",
                  k[j].name, (long)n);
            CHECK(memcmp(dx, dfull, (size_t)n * sizeof *dx) == 0,
                  "%s backward at n=%ld differs from the same elements of a longer call",
                  k[j].name, (long)n);
            CHECK(guard_ok(out, n) && guard_ok(dx, n), "%s wrote past n=%ld", k[j].name, (long)n);
        }
    }
    free(x), free(dout), free(full), free(dfull), free(out), free(dx);
}

/* ---- softmax ------------------------------------------------------------------------------------ */

static void softmax_ref(double *out, const double *x, int64_t N, int64_t C) {
    for (int64_t r = 0; r < N; r++) {
        double m = -INFINITY, s = 0;
        for (int64_t i = 0; i < C; i++) m = x[r * C + i] > m ? x[r * C + i] : m;
        for (int64_t i = 0; i < C; i++) s += exp(x[r * C + i] - m);
        for (int64_t i = 0; i < C; i++) out[r * C + i] = exp(x[r * C + i] - m) / s;
    }
}

typedef struct {
    double *x, *r, *out;
    int64_t N, C;
} sm_ctx;

static double sm_obj(void *vctx) {
    sm_ctx *c = vctx;
    softmax_ref(c->out, c->x, c->N, c->C);
    return dot_d(c->out, c->r, c->N * c->C);
}

static void test_softmax(void) {
    for (int rep = 0; rep < 4; rep++) {
        int64_t N = rnd_int(1, 6), C = rnd_int(1, 100), NC = N * C;
        float *x = falloc(NC), *out = falloc(NC), *dout = falloc(NC), *dx = falloc(NC);
        double *xd = dalloc(NC), *ref = dalloc(NC), *rd = dalloc(NC);
        fill_normal(x, NC, 3);
        if (rep == 3) /* a large common offset: only the max-subtracted form survives */
            for (int64_t i = 0; i < NC; i++) x[i] += 1000.0f;
        fill_nan(out, NC);
        adt_k_softmax_forward(out, x, N, C);
        to_double(xd, x, NC);
        softmax_ref(ref, xd, N, C);
        double e = nrm_err(out, ref, NC);
        CHECK(e < 2e-6, "softmax forward err %g (N=%ld C=%ld)", e, (long)N, (long)C);
        fill_normal(dout, NC, 1);
        fill_nan(dx, NC);
        adt_k_softmax_backward(dx, dout, out, N, C);
        to_double(rd, dout, NC);
        /* floor: the gradient's natural scale max |dout|; when one probability dominates every
         * entry is small by cancellation in out (dout - sum(dout out)), as in any float code */
        double scale = 0;
        for (int64_t i = 0; i < NC; i++) scale = fabs(rd[i]) > scale ? fabs(rd[i]) : scale;
        sm_ctx c = {xd, rd, ref, N, C};
        e = fd_err_floor(dx, xd, NC, sm_obj, &c, 400, scale);
        CHECK(e < 1e-5, "softmax backward vs FD %g (N=%ld C=%ld)", e, (long)N, (long)C);
        free(x), free(out), free(dout), free(dx), free(xd), free(ref), free(rd);
    }
}

/* ---- attention -------------------------------------------------------------------------------- */

static void attention_ref(double *out, double *att, const double *qkv, int64_t B, int64_t T,
                          int64_t C, int64_t H) {
    int64_t D = C / H;
    double scale = 1.0 / sqrt((double)D);
    double *s = dalloc(T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < T; i++) {
                const double *q = qkv + (b * T + i) * 3 * C + h * D;
                double m = -INFINITY, sum = 0;
                for (int64_t j = 0; j <= i; j++) {
                    const double *k = qkv + (b * T + j) * 3 * C + C + h * D;
                    double d = 0;
                    for (int64_t c = 0; c < D; c++) d += q[c] * k[c];
                    s[j] = d * scale;
                    m = s[j] > m ? s[j] : m;
                }
                for (int64_t j = 0; j <= i; j++) sum += (s[j] = exp(s[j] - m));
                for (int64_t j = 0; j < T; j++) {
                    double a = j <= i ? s[j] / sum : 0.0;
                    if (att) att[((b * H + h) * T + i) * T + j] = a;
                    s[j] = a;
                }
                for (int64_t c = 0; c < D; c++) {
                    double o = 0;
                    for (int64_t j = 0; j <= i; j++)
                        o += s[j] * qkv[(b * T + j) * 3 * C + 2 * C + h * D + c];
                    out[(b * T + i) * C + h * D + c] = o;
                }
            }
    free(s);
}

typedef struct {
    double *qkv, *r, *out;
    int64_t B, T, C, H;
} attn_ctx;

static double attn_obj(void *vctx) {
    attn_ctx *c = vctx;
    attention_ref(c->out, NULL, c->qkv, c->B, c->T, c->C, c->H);
    return dot_d(c->out, c->r, c->B * c->T * c->C);
}

static void check_attention(int64_t B, int64_t T, int64_t H, int64_t D, int64_t fd_points) {
    int64_t C = H * D, nqkv = B * T * 3 * C, nout = B * T * C, natt = B * H * T * T;
    int64_t ns = adt_k_attention_scratch_floats(B, T, C, H);
    float *qkv = falloc(nqkv), *out = falloc(nout), *att = falloc(natt), *scratch = falloc(ns);
    float *dout = falloc(nout), *dqkv = falloc(nqkv);
    double *qkvd = dalloc(nqkv), *ref = dalloc(nout), *ref_att = dalloc(natt), *rd = dalloc(nout);
    fill_normal(qkv, nqkv, 1.0f);
    fill_nan(out, nout), fill_nan(att, natt), fill_nan(scratch, ns);
    adt_k_attention_forward(out, att, qkv, scratch, B, T, C, H);
    to_double(qkvd, qkv, nqkv);
    attention_ref(ref, ref_att, qkvd, B, T, C, H);
    double e = nrm_err(out, ref, nout), ea = nrm_err(att, ref_att, natt);
    CHECK(e < 1e-5, "attention out err %g (B=%ld T=%ld H=%ld D=%ld)", e, (long)B, (long)T,
          (long)H, (long)D);
    CHECK(ea < 1e-5, "attention att err %g (B=%ld T=%ld H=%ld D=%ld)", ea, (long)B, (long)T,
          (long)H, (long)D);
    int64_t upper_bad = 0;
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = 0; i < T; i++)
            for (int64_t j = i + 1; j < T; j++) upper_bad += att[(bh * T + i) * T + j] != 0.0f;
    CHECK(upper_bad == 0, "%ld att entries above the diagonal are not 0", (long)upper_bad);

    fill_normal(dout, nout, 1.0f);
    fill_nan(dqkv, nqkv), fill_nan(scratch, ns);
    adt_k_attention_backward(dqkv, dout, qkv, att, scratch, B, T, C, H);
    CHECK(all_finite(dqkv, nqkv), "dqkv not fully written (B=%ld T=%ld H=%ld D=%ld)", (long)B,
          (long)T, (long)H, (long)D);
    if (fd_points > 0) {
        to_double(rd, dout, nout);
        attn_ctx c = {qkvd, rd, ref, B, T, C, H};
        e = fd_err(dqkv, qkvd, nqkv, attn_obj, &c, fd_points);
        CHECK(e < 2e-5, "attention backward vs FD %g (B=%ld T=%ld H=%ld D=%ld)", e, (long)B,
              (long)T, (long)H, (long)D);
    }
    free(qkv), free(out), free(att), free(scratch), free(dout), free(dqkv), free(qkvd), free(ref);
    free(ref_att), free(rd);
}

static void test_attention(void) {
    check_attention(1, 1, 1, 4, 1000);  /* T = 1: att = [1], out = v */
    check_attention(1, 7, 1, 6, 1000);  /* H = 1 */
    check_attention(2, 5, 2, 4, 1000);
    check_attention(3, 9, 3, 4, 1000);
    check_attention(rnd_int(1, 3), rnd_int(1, 12), rnd_int(1, 3), rnd_int(1, 8), 1000);
    /* longer than one row block (64), with a ragged last block: FD on a random subset */
    check_attention(1, rnd_int(65, 80), 2, 4, 200);
    check_attention(2, 129, 2, 8, 60);
}

/* ---- embedding ---------------------------------------------------------------------------------- */

static void test_embedding(void) {
    int64_t N = rnd_int(1, 40), V = rnd_int(1, 20), C = rnd_int(1, 16);
    float *table = falloc(V * C), *out = falloc(N * C), *dout = falloc(N * C);
    float *dtable = falloc(V * C);
    double *want = dalloc(V * C);
    int32_t *ids = adt_malloc((size_t)N * sizeof *ids);
    fill_normal(table, V * C, 1);
    for (int64_t n = 0; n < N; n++) ids[n] = (int32_t)rnd_int(0, V - 1);
    fill_nan(out, N * C);
    adt_k_embedding_forward(out, ids, table, N, V, C, 0);
    int64_t bad = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) bad += out[n * C + c] != table[ids[n] * C + c];
    CHECK(bad == 0, "embedding forward: %ld elements differ", (long)bad);

    /* the gradient of sum(out * R) wrt table is the scatter-add of R */
    fill_normal(dout, N * C, 1);
    fill_nan(dtable, V * C);
    adt_k_embedding_backward(dtable, dout, ids, N, V, C, 0);
    for (int64_t i = 0; i < V * C; i++) want[i] = 0;
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++) want[ids[n] * C + c] += dout[n * C + c];
    /* floor: the scale of dout (repeated ids may sum to a near-cancelling small total) */
    double scale = 0;
    for (int64_t i = 0; i < N * C; i++) scale = fabs(dout[i]) > scale ? fabs(dout[i]) : scale;
    double e = nrm_err_floor(dtable, want, V * C, scale);
    CHECK(e < 1e-6, "embedding backward err %g", e);

    /* a vocabulary shard [row0, row0 + Vs) gets exactly those rows of the full gradient */
    int64_t row0 = rnd_int(0, V - 1), Vs = rnd_int(1, V - row0);
    float *dshard = falloc(Vs * C);
    fill_nan(dshard, Vs * C);
    adt_k_embedding_backward(dshard, dout, ids, N, Vs, C, row0);
    CHECK(memcmp(dshard, dtable + row0 * C, (size_t)(Vs * C) * sizeof(float)) == 0,
          "vocab shard row0=%ld V=%ld differs from the full gradient's rows", (long)row0,
          (long)Vs);
    /* forward on that shard: the owned rows' embeddings, zeros for every other token */
    float *oshard = falloc(N * C);
    fill_nan(oshard, N * C);
    adt_k_embedding_forward(oshard, ids, table + row0 * C, N, Vs, C, row0);
    bad = 0;
    for (int64_t n = 0; n < N; n++) {
        int own = ids[n] >= row0 && ids[n] < row0 + Vs;
        for (int64_t c = 0; c < C; c++) bad += oshard[n * C + c] != (own ? table[ids[n] * C + c] : 0.0f);
    }
    CHECK(bad == 0, "embedding forward on rows [%ld, +%ld): %ld elements differ", (long)row0, (long)Vs, (long)bad);
    free(oshard);
    free(table), free(out), free(dout), free(dtable), free(want), free(ids), free(dshard);
}

/* ---- softmax cross-entropy ---------------------------------------------------------------------- */

typedef struct {
    double *x;
    const int32_t *labels;
    int64_t N, V;
    double denom, dloss;
} xent_ctx;

static double xent_ref(const double *x, const int32_t *labels, int64_t N, int64_t V,
                       double denom, double *probs) {
    double total = 0;
    for (int64_t n = 0; n < N; n++) {
        const double *xr = x + n * V;
        double m = -INFINITY, s = 0;
        for (int64_t j = 0; j < V; j++) m = xr[j] > m ? xr[j] : m;
        for (int64_t j = 0; j < V; j++) s += exp(xr[j] - m);
        if (probs)
            for (int64_t j = 0; j < V; j++) probs[n * V + j] = exp(xr[j] - m) / s;
        if (labels[n] >= 0) total += -(xr[labels[n]] - m - log(s));
    }
    return total / denom;
}

static double xent_obj(void *vctx) {
    xent_ctx *c = vctx;
    return c->dloss * xent_ref(c->x, c->labels, c->N, c->V, c->denom, NULL);
}

static void test_softmax_xent(void) {
    for (int rep = 0; rep < 4; rep++) {
        int64_t N = rnd_int(1, 10), V = rnd_int(2, 40), NV = N * V, counted = 0;
        float *x = falloc(NV), *probs = falloc(NV), *dx = falloc(NV), loss = NAN;
        double *xd = dalloc(NV), *ref_probs = dalloc(NV);
        int32_t *labels = adt_malloc((size_t)N * sizeof *labels);
        fill_normal(x, NV, rep == 3 ? 30.0f : 2.0f);
        if (rep == 3)
            for (int64_t i = 0; i < NV; i++) x[i] += 1e4f;
        for (int64_t n = 0; n < N; n++) {
            labels[n] = rnd_int(0, 3) == 0 ? (int32_t)-rnd_int(1, 100) : (int32_t)rnd_int(0, V - 1);
            counted += labels[n] >= 0;
        }
        /* the global batch may count more tokens than this shard */
        float denom = (float)(counted + rnd_int(counted ? 0 : 1, 5));
        fill_nan(probs, NV);
        adt_k_softmax_xent_forward(&loss, probs, x, labels, N, V, denom);
        to_double(xd, x, NV);
        double ref = xent_ref(xd, labels, N, V, denom, ref_probs);
        CHECK(fabs(loss - ref) <= 1e-6 * fabs(ref) + 1e-7, "xent loss %.9g ref %.9g", loss, ref);
        double e = nrm_err(probs, ref_probs, NV);
        CHECK(e < 2e-6, "xent probs err %g", e);

        float dloss = rnd_uni(0.5, 2);
        fill_nan(dx, NV);
        adt_k_softmax_xent_backward(dx, &dloss, probs, labels, N, V, denom);
        int64_t ignored_bad = 0;
        for (int64_t n = 0; n < N; n++)
            for (int64_t j = 0; j < V && labels[n] < 0; j++) ignored_bad += dx[n * V + j] != 0.0f;
        CHECK(ignored_bad == 0, "%ld gradient entries of ignored rows are not 0",
              (long)ignored_bad);
        /* Measured against the gradient's natural scale dloss / denom: when one logit dominates,
         * every entry is tiny (p_y - 1 ~ -sum of the rest) and float p_y = 1 cannot show it. */
        xent_ctx c = {xd, labels, N, V, denom, dloss};
        e = fd_err_floor(dx, xd, NV, xent_obj, &c, 400, dloss / denom);
        CHECK(e < 1e-5, "xent backward vs FD %g (N=%ld V=%ld counted=%ld)", e, (long)N, (long)V,
              (long)counted);
        free(x), free(probs), free(dx), free(xd), free(ref_probs), free(labels);
    }
}

/* ---- BCE with logits ---------------------------------------------------------------------------- */

/* softplus(z) = log(1 + e^z), written per sign so neither branch overflows or cancels */
static double softplus(double z) { return z > 0 ? z + log1p(exp(-z)) : log1p(exp(z)); }

/* -(y log s + (1 - y) log(1 - s)), s = sigmoid(x), via log s = -softplus(-x) and
 * log(1 - s) = -softplus(x): the textbook form, not the kernel's max(x,0) - x y + ... one. */
static double bce_ref(const double *x, const float *y, int64_t N, double denom) {
    double t = 0;
    for (int64_t n = 0; n < N; n++) t += y[n] * softplus(-x[n]) + (1.0 - y[n]) * softplus(x[n]);
    return t / denom;
}

typedef struct {
    double *x;
    const float *y;
    int64_t N;
    double denom, dloss;
} bce_ctx;

static double bce_obj(void *vctx) {
    bce_ctx *c = vctx;
    return c->dloss * bce_ref(c->x, c->y, c->N, c->denom);
}

static void test_bce_logits(void) {
    int64_t N = rnd_int(1, 60);
    float *x = falloc(N), *y = falloc(N), *dx = falloc(N), loss = NAN;
    double *xd = dalloc(N);
    for (int64_t n = 0; n < N; n++) {
        x[n] = rnd_int(0, 9) == 0 ? rnd_uni(-60, 60) : rnd_uni(-8, 8);
        y[n] = rnd_int(0, 1) ? (float)rnd_int(0, 1) : rnd_uni(0, 1);
    }
    float denom = (float)(N + rnd_int(0, 3));
    adt_k_bce_logits_forward(&loss, x, y, N, denom);
    to_double(xd, x, N);
    double ref = bce_ref(xd, y, N, denom);
    CHECK(isfinite(loss) && fabs(loss - ref) <= 1e-6 * fabs(ref) + 1e-7, "bce %.9g ref %.9g",
          loss, ref);
    float dloss = rnd_uni(0.5, 2);
    fill_nan(dx, N);
    adt_k_bce_logits_backward(dx, &dloss, x, y, N, denom);
    bce_ctx c = {xd, y, N, denom, dloss};
    /* floor: the natural scale dloss / denom (sigmoid(x) - y cancels when the label fits) */
    double e = fd_err_floor(dx, xd, N, bce_obj, &c, N, dloss / denom);
    CHECK(e < 1e-5, "bce backward vs FD %g (N=%ld)", e, (long)N);
    free(x), free(y), free(dx), free(xd);
}

int main(void) {
    const char *env = getenv("ADT_TEST_SEED");
    uint64_t local = 0;
    g_seed = env ? strtoull(env, NULL, 0)
                 : ((uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull) ^ (uint64_t)(uintptr_t)&local ^
                       (uint64_t)clock();
    g_state = g_seed;
    if (getenv("CHECK_VERBOSE")) fprintf(stderr, "seed %llu\n", (unsigned long long)g_seed);
    RUN(test_relu);
    RUN(test_gelu);
    RUN(test_sigmoid);
    RUN(test_expf_tanhf_sweep);
    RUN(test_dropout_fraction_and_backward);
    RUN(test_dropout_box);
    RUN(test_layernorm);
    RUN(test_layernorm_widths);
    RUN(test_pointwise_lengths);
    RUN(test_softmax);
    RUN(test_attention);
    RUN(test_embedding);
    RUN(test_softmax_xent);
    RUN(test_bce_logits);
    if (check_n_failed)
        fprintf(stderr, "FAILED with seed: rerun with ADT_TEST_SEED=%llu\n",
                (unsigned long long)g_seed);
    return check_finish();
}
