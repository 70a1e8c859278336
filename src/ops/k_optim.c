/*
 * k_optim.c - parameter updates: SGD (with momentum and L2 weight decay) and AdamW, in place on
 * a parameter and its optimiser state.
 *
 * Both follow PyTorch 1.13's single-tensor CPU path (torch/optim/sgd.py, adamw.py) operation by
 * operation, so that a run can be compared with PyTorch to float rounding:
 *  - scalar hyperparameter arithmetic (1 - lr wd, bias corrections, lr / bc1) is done in double,
 *    as Python does, and cast to float where the tensor op receives it;
 *  - `t.add_(u, alpha=a)` is a fused multiply-add in PyTorch's AVX2/AVX-512 kernels
 *    (vec::fmadd), so it is fmaf here when the target has FMA; addcmul/addcdiv are not fused and
 *    evaluate left to right: self + (value * t1) * t2 and self + (value * t1) / t2.
 * The build uses ISO C (-std=c11), where GCC does not contract a*b+c on its own, so the unfused
 * expressions stay unfused.
 */
#include <math.h>

#include "ops/kernels.h"

/* sqrtf may set errno (on negative input), and the branch GCC adds for that keeps it from
 * vectorising any loop that calls it unless -fno-math-errno is given for the whole file, which a
 * function attribute does not achieve. So AdamW takes its square roots here, a block at a time,
 * with the SSE/AVX instructions (correctly rounded, like sqrtf and like PyTorch's vector sqrt). */
#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

static void sqrt_inplace(float *x, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#elif defined(__SSE2__)
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}

/* Elements per AdamW block: the block's square roots live on the stack (1 KiB). */
#define ADAMW_BLOCK 256

#ifdef __FMA__
#define FMADD(a, b, c) fmaf((a), (b), (c))
#else
/* PyTorch's default (non-AVX) vector kernels do not fuse either. */
#define FMADD(a, b, c) ((a) * (b) + (c))
#endif

/* PyTorch:  d_p = g + wd w            (d_p.add(param, alpha=wd), skipped when wd == 0)
 *           buf = d_p on the first step, else buf = momentum buf + d_p
 *           w  -= lr buf              (param.add_(buf, alpha=-lr); d_p instead when momentum 0) */
void adt_k_sgd_update(float *w, float *m, const float *g, int64_t n, float lr, float momentum,
                      float wd, int64_t step) {
    const float neg_lr = -lr;
    if (momentum == 0.0f) {
        if (wd != 0.0f) {
            for (int64_t i = 0; i < n; i++) w[i] = FMADD(FMADD(w[i], wd, g[i]), neg_lr, w[i]);
        } else {
            for (int64_t i = 0; i < n; i++) w[i] = FMADD(g[i], neg_lr, w[i]);
        }
        return;
    }
    if (step <= 1) {
        for (int64_t i = 0; i < n; i++) {
            float d = wd != 0.0f ? FMADD(w[i], wd, g[i]) : g[i];
            m[i] = d;
            w[i] = FMADD(d, neg_lr, w[i]);
        }
    } else {
        for (int64_t i = 0; i < n; i++) {
            float d = wd != 0.0f ? FMADD(w[i], wd, g[i]) : g[i];
            /* buf.mul_(momentum) rounds, then .add_(d_p, alpha=1) rounds once more */
            float b = m[i] * momentum + d;
            m[i] = b;
            w[i] = FMADD(b, neg_lr, w[i]);
        }
    }
}

/* PyTorch (_single_tensor_adamw, amsgrad off):
 *   w *= 1 - lr wd
 *   m = m b1 + (1 - b1) g                      (mul_, then add_ with alpha: fused)
 *   v = v b2 + ((1 - b2) g) g                  (mul_, then addcmul_)
 *   denom = sqrt(v) / sqrt(1 - b2^t) + eps
 *   w = w + ((-lr / (1 - b1^t)) m) / denom      (addcdiv_) */
void adt_k_adamw_update(float *w, float *m, float *v, const float *g, int64_t n, float lr,
                        float b1, float b2, float eps, float wd, int64_t step) {
    const double t = (double)step;
    const float decay = (float)(1.0 - (double)lr * (double)wd);
    const float one_m_b1 = (float)(1.0 - (double)b1);
    const float one_m_b2 = (float)(1.0 - (double)b2);
    const double bias_correction1 = 1.0 - pow((double)b1, t);
    const float neg_step_size = (float)(-((double)lr / bias_correction1));
    const float bias_correction2_sqrt = (float)sqrt(1.0 - pow((double)b2, t));
    float root[ADAMW_BLOCK];
    for (int64_t i0 = 0; i0 < n; i0 += ADAMW_BLOCK) {
        const int64_t len = n - i0 < ADAMW_BLOCK ? n - i0 : ADAMW_BLOCK;
        float *wb = w + i0, *mb = m + i0, *vb = v + i0;
        const float *gb = g + i0;
        for (int64_t i = 0; i < len; i++) {
            float gi = gb[i];
            mb[i] = FMADD(gi, one_m_b1, mb[i] * b1);
            float vi = FMADD(one_m_b2 * gi, gi, vb[i] * b2);
            vb[i] = vi;
            root[i] = vi;
        }
        sqrt_inplace(root, len);
        for (int64_t i = 0; i < len; i++) {
            float denom = root[i] / bias_correction2_sqrt + eps;
            wb[i] = wb[i] * decay + (neg_step_size * mb[i]) / denom;
        }
    }
}
