/*
 * synthetic.c - learnable synthetic datasets for the mlp, vgg and dlrm models (synthetic:text
 * lives in text.c).
 *
 * Each generator plants a fixed model (the same for every stream) and draws sample `id` of
 * stream `s` (0 training, 1 validation) from counter-based random numbers keyed by (s, id): a
 * sample is a pure function of (seed constants, stream, id), so any process computes any sample
 * and a run never depends on the number of processes. docs/formats.md states each model.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

static uint32_t draw_below(uint64_t key, uint64_t ctr, uint32_t n) {
    return (uint32_t)(((uint64_t)adt_rng_u32(key, ctr) * n) >> 32);
}

/* =============================================================================================
 * synthetic:mlp - x ~ N(0, 1)^F, label = argmax_c (W x)_c for a fixed teacher W [classes, F]
 * with N(0, 1) entries: a linear classification problem an MLP learns to high accuracy.
 */
typedef struct syn_mlp {
    int in, classes;
    uint64_t x_key;
    float *w; /* [classes, in] */
} syn_mlp;

static void mlp_free(void *impl) {
    syn_mlp *m = impl;
    if (!m) return;
    free(m->w);
    free(m);
}

static int mlp_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2,
                    void *label) {
    const syn_mlp *m = impl;
    float *x = input;
    int32_t *y = label;
    for (int k = 0; k < n; k++) {
        uint64_t id = (uint64_t)(ids[k] + first);
        float *xk = x + (int64_t)k * m->in;
        for (int j = 0; j < m->in; j++) xk[j] = adt_rng_normal(m->x_key, id * (uint64_t)m->in + (uint64_t)j);
        int best = 0;
        double best_v = -INFINITY;
        for (int c = 0; c < m->classes; c++) {
            double acc = 0;
            for (int j = 0; j < m->in; j++) acc += (double)m->w[(int64_t)c * m->in + j] * xk[j];
            if (acc > best_v) best_v = acc, best = c;
        }
        y[k] = best;
    }
    return ADT_OK;
}

int data_synthetic_mlp(data_source *src, const adt_data_shape *shape, uint64_t stream) {
    if (shape->in_features < 1 || shape->classes < 2)
        return adt_error(ADT_ERR_SHAPE, "synthetic:mlp: in_features %d and classes %d, expected in_features >= 1 and "
                         "classes >= 2", shape->in_features, shape->classes);
    syn_mlp *m = adt_calloc(1, sizeof *m);
    m->in = shape->in_features;
    m->classes = shape->classes;
    m->x_key = adt_rng_key(stream, "synthetic.mlp.x");
    int64_t nw = (int64_t)m->in * m->classes;
    m->w = adt_malloc((size_t)nw * sizeof *m->w);
    uint64_t key = adt_rng_key(0x7eac, "synthetic.mlp.teacher");
    for (int64_t i = 0; i < nw; i++) m->w[i] = adt_rng_normal(key, (uint64_t)i);
    *src = (data_source){.n = stream ? ADT_SYN_MLP_VAL_SAMPLES : ADT_SYN_MLP_SAMPLES, .layout = ADT_DATA_CLASS,
                         .elems = {m->in, 0, 1}, .impl = m, .fill = mlp_fill, .free = mlp_free};
    snprintf(src->what, sizeof src->what, "%lld samples, %d N(0,1) features labelled by a fixed linear teacher, "
             "%d classes (stream %llu)", (long long)src->n, m->in, m->classes, (unsigned long long)stream);
    return ADT_OK;
}

/* =============================================================================================
 * synthetic:vgg - image of class k: a plane wave of the class's own spatial frequency
 * (fy_k, fx_k) with a class- and channel-specific phase, circularly shifted by a random (dy, dx)
 * over the whole image, amplitude uniform in [1/6, 1/2), plus N(0, 1) noise per pixel. Pixels
 * have about unit variance; per pixel the wave is buried in noise (SNR about 0.06), over an image
 * it is plain. The random shift makes the phase random, so every class's mean image is zero and
 * no linear function of the pixels tells the classes apart, while the power at each class's
 * frequency does: orientation and period
 * are local, translation-invariant features, which convolutions, ReLU and pooling learn.
 * Frequencies are the `classes` lowest distinct ones below Nyquist.
 */
#define VGG_AMP_MIN (1.0f / 6.0f)
#define VGG_AMP_SPAN (1.0f / 3.0f)

typedef struct syn_vgg {
    int C, H, W, classes;
    int *freq;    /* [classes, 2] fy, fx */
    float *phase; /* [classes, C] */
    uint64_t label_key, shift_key, amp_key, noise_key;
} syn_vgg;

static void vgg_free(void *impl) {
    syn_vgg *v = impl;
    if (!v) return;
    free(v->freq);
    free(v->phase);
    free(v);
}

static int vgg_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2,
                    void *label) {
    const syn_vgg *v = impl;
    int64_t chw = (int64_t)v->C * v->H * v->W;
    float *x = input;
    int32_t *y = label;
    for (int k = 0; k < n; k++) {
        uint64_t id = (uint64_t)(ids[k] + first);
        int cls = (int)draw_below(v->label_key, id, (uint32_t)v->classes);
        int dy = (int)draw_below(v->shift_key, 2 * id, (uint32_t)v->H);
        int dx = (int)draw_below(v->shift_key, 2 * id + 1, (uint32_t)v->W);
        float amp = VGG_AMP_MIN + VGG_AMP_SPAN * adt_rng_uniform(v->amp_key, id);
        double fy = (double)v->freq[2 * cls] / v->H, fx = (double)v->freq[2 * cls + 1] / v->W;
        float *xk = x + (int64_t)k * chw;
        for (int c = 0; c < v->C; c++)
            for (int h = 0; h < v->H; h++)
                for (int w = 0; w < v->W; w++) {
                    int64_t i = ((int64_t)c * v->H + h) * v->W + w;
                    double arg = 6.283185307179586 * (fy * (h + dy) + fx * (w + dx)) + v->phase[cls * v->C + c];
                    xk[i] = amp * (float)cos(arg) + adt_rng_normal(v->noise_key, id * (uint64_t)chw + (uint64_t)i);
                }
        y[k] = cls;
    }
    return ADT_OK;
}

/* The frequencies (fy, fx) of a half-plane below Nyquist, lowest first: (fy, fx) and (-fy, -fx)
 * are the same wave, so fy > 0, or fy == 0 and fx > 0. Returns how many exist (<= max kept). */
static int vgg_frequencies(int H, int W, int *out, int max) {
    int ny = (H - 1) / 2, nx = (W - 1) / 2, k = 0;
    /* by increasing fy^2 + fx^2, then fy, then fx: a fixed order independent of max */
    for (int r2 = 1; r2 <= ny * ny + nx * nx; r2++)
        for (int fy = 0; fy <= ny; fy++)
            for (int fx = -nx; fx <= nx; fx++) {
                if (fy * fy + fx * fx != r2 || (fy == 0 && fx <= 0)) continue;
                if (k < max) out[2 * k] = fy, out[2 * k + 1] = fx;
                k++;
            }
    return k;
}

int data_synthetic_vgg(data_source *src, const adt_data_shape *shape, uint64_t stream) {
    int C = shape->channels, H = shape->height, W = shape->width;
    if (C < 1 || H < 1 || W < 1 || shape->classes < 2)
        return adt_error(ADT_ERR_SHAPE, "synthetic:vgg: images %dx%dx%d (CxHxW) and %d classes, expected channels, "
                         "height, width >= 1 and classes >= 2", C, H, W, shape->classes);
    if ((int64_t)C * H * W > INT32_MAX)
        return adt_error(ADT_ERR_SHAPE, "synthetic:vgg: images %dx%dx%d are too large, expected C*H*W < 2^31", C, H, W);
    syn_vgg *v = adt_calloc(1, sizeof *v);
    v->C = C, v->H = H, v->W = W, v->classes = shape->classes;
    v->freq = adt_malloc((size_t)v->classes * 2 * sizeof *v->freq);
    int avail = vgg_frequencies(H, W, v->freq, v->classes);
    if (avail < v->classes) {
        vgg_free(v);
        return adt_error(ADT_ERR_SHAPE, "synthetic:vgg: %dx%d images have %d distinct plane-wave frequencies, fewer "
                         "than the %d classes: expected classes <= %d or larger images", H, W, avail, shape->classes,
                         avail);
    }
    v->phase = adt_malloc((size_t)v->classes * (size_t)C * sizeof *v->phase);
    uint64_t pk = adt_rng_key(0x1a6e, "synthetic.vgg.phase");
    for (int64_t i = 0; i < (int64_t)v->classes * C; i++) v->phase[i] = 6.2831853f * adt_rng_uniform(pk, (uint64_t)i);
    v->label_key = adt_rng_key(stream, "synthetic.vgg.label");
    v->shift_key = adt_rng_key(stream, "synthetic.vgg.shift");
    v->amp_key = adt_rng_key(stream, "synthetic.vgg.amp");
    v->noise_key = adt_rng_key(stream, "synthetic.vgg.noise");
    *src = (data_source){.n = stream ? ADT_SYN_VGG_VAL_SAMPLES : ADT_SYN_VGG_SAMPLES, .layout = ADT_DATA_CLASS,
                         .elems = {(int64_t)C * H * W, 0, 1}, .impl = v, .fill = vgg_fill, .free = vgg_free};
    snprintf(src->what, sizeof src->what, "%lld images %dx%dx%d of class-specific plane waves plus noise, %d classes "
             "(stream %llu)", (long long)src->n, C, H, W, v->classes, (unsigned long long)stream);
    return ADT_OK;
}

/* =============================================================================================
 * synthetic:dlrm - clicks from a planted logistic model, Criteo-shaped:
 *   dense x_j = log(1 + floor(20 E)), E ~ Exp(1)                   (like log-scaled counts)
 *   value c_t = floor(V_t u^2), u ~ U[0, 1)                        (a few values dominate)
 *         V_t = 100 for the signal tables t < 4, 1000 for the others
 *   row_t = mix64(c_t ^ key_t) mod table_rows[t]                   (hashed, like Criteo)
 *   z = -1.2 + sum_j a_j (x_j - 2.4)                  a_j ~ N(0, 2/n_dense)
 *            + sum_{t < 4} b_t(row_t)                 b_t(r) ~ N(0, 1.2^2)    per-row effects
 *            + sum_{r < 2} u_r(row_0) v_r(row_1)      u, v ~ N(0, 1)          a rank-2 pair effect
 *   label ~ Bernoulli(sigmoid(z))
 * Effects are functions of the row a model sees, so hashing collisions cost nothing. About 23%
 * of the labels are 1 (Criteo: 26%) and the planted probability's own AUC is about 0.92. The
 * signal tables have few values so that ~1e5 samples teach every one; the others carry no
 * signal, as many of Criteo's do. A small DLRM (embedding 16, dot interactions, Adam 1e-3,
 * batch 256) passes AUC 0.85 on the validation stream after about 900 steps.
 */
#define DLRM_VALUES 1000       /* distinct values of a table without signal */
#define DLRM_SIGNAL_VALUES 100 /* ... and of one with signal */
#define DLRM_EFFECT_TABLES 4
#define DLRM_EFFECT_SD 1.2
#define DLRM_RANK 2
#define DLRM_BIAS (-1.2)
#define DLRM_DENSE_MEAN 2.4

typedef struct syn_dlrm {
    data_ctr_gen base;
    int64_t rows[ADT_DATA_MAX_TABLES];
    uint64_t row_key[ADT_DATA_MAX_TABLES], effect_key[ADT_DATA_MAX_TABLES], u_key, v_key;
    uint64_t cat_key;
} syn_dlrm;

void data_ctr_free(void *impl) {
    data_ctr_gen *m = impl;
    if (!m) return;
    free(m->a);
    free(m);
}

/* Sample id's features (into x [D] and rows [K]) and its planted click probability. */
static double ctr_sample(const data_ctr_gen *m, uint64_t id, float *x, int32_t *rows) {
    double z = DLRM_BIAS;
    for (int j = 0; j < m->D; j++) {
        float u = adt_rng_uniform(m->dense_key, id * (uint64_t)m->D + (uint64_t)j);
        double v = log1p(floor(-20.0 * log(1.0 - (double)u)));
        x[j] = (float)v;
        z += m->a[j] * (v - DLRM_DENSE_MEAN);
    }
    m->cat(m, id, rows, &z);
    return 1.0 / (1.0 + exp(-z));
}

static void dlrm_cat(const void *gen, uint64_t id, int32_t *rows, double *zp) {
    const syn_dlrm *m = gen;
    int K = m->base.K;
    double z = *zp;
    for (int t = 0; t < K; t++) {
        double u = adt_rng_uniform(m->cat_key, id * (uint64_t)K + (uint64_t)t);
        uint64_t c = (uint64_t)((t < DLRM_EFFECT_TABLES ? DLRM_SIGNAL_VALUES : DLRM_VALUES) * u * u);
        rows[t] = (int32_t)(adt_rng_mix64(c ^ m->row_key[t]) % (uint64_t)m->rows[t]);
        if (t < DLRM_EFFECT_TABLES) z += DLRM_EFFECT_SD * adt_rng_normal(m->effect_key[t], (uint64_t)rows[t]);
    }
    if (K >= 2)
        for (int r = 0; r < DLRM_RANK; r++)
            z += (double)adt_rng_normal(m->u_key, (uint64_t)rows[0] * DLRM_RANK + (uint64_t)r) *
                 adt_rng_normal(m->v_key, (uint64_t)rows[1] * DLRM_RANK + (uint64_t)r);
    *zp = z;
}

int data_ctr_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2,
                  void *label) {
    const data_ctr_gen *m = impl;
    float *x = input, *y = label;
    int32_t *c = input2;
    for (int k = 0; k < n; k++) {
        uint64_t id = (uint64_t)(ids[k] + first);
        double p = ctr_sample(m, id, x + (int64_t)k * m->D, c + (int64_t)k * m->K);
        y[k] = (double)adt_rng_uniform(m->label_key, id) < p ? 1.0f : 0.0f;
    }
    return ADT_OK;
}

int data_ctr_prob(const void *impl, const int64_t *ids, int n, int64_t first, float *prob) {
    const data_ctr_gen *m = impl;
    float x[256];
    int32_t rows[ADT_DATA_MAX_TABLES];
    float *xs = m->D <= 256 ? x : adt_malloc((size_t)m->D * sizeof *xs);
    for (int k = 0; k < n; k++) prob[k] = (float)ctr_sample(m, (uint64_t)(ids[k] + first), xs, rows);
    if (xs != x) free(xs);
    return ADT_OK;
}

int data_synthetic_dlrm(data_source *src, const adt_data_shape *shape, uint64_t stream) {
    if (shape->n_dense < 0 || shape->n_tables < 1 || shape->n_tables > ADT_DATA_MAX_TABLES)
        return adt_error(ADT_ERR_SHAPE, "synthetic:dlrm: n_dense %d and n_tables %d, expected n_dense >= 0 and "
                         "1 <= n_tables <= %d", shape->n_dense, shape->n_tables, ADT_DATA_MAX_TABLES);
    for (int t = 0; t < shape->n_tables; t++)
        if (shape->table_rows[t] < 1 || shape->table_rows[t] > INT32_MAX)
            return adt_error(ADT_ERR_SHAPE, "synthetic:dlrm: table_rows[%d] = %lld, expected 1 .. %d", t,
                             (long long)shape->table_rows[t], INT32_MAX);
    syn_dlrm *m = adt_calloc(1, sizeof *m);
    data_ctr_gen *g = &m->base;
    g->D = shape->n_dense;
    g->K = shape->n_tables;
    g->cat = dlrm_cat;
    uint64_t model = adt_rng_key(0xd1a3, "synthetic.dlrm.model");
    for (int t = 0; t < g->K; t++) {
        m->rows[t] = shape->table_rows[t];
        m->row_key[t] = adt_rng_key(model ^ (uint64_t)t, "synthetic.dlrm.row");
        m->effect_key[t] = adt_rng_key(model ^ (uint64_t)t, "synthetic.dlrm.effect");
    }
    m->u_key = adt_rng_key(model, "synthetic.dlrm.pair.u");
    m->v_key = adt_rng_key(model, "synthetic.dlrm.pair.v");
    g->a = adt_malloc((size_t)(g->D ? g->D : 1) * sizeof *g->a);
    uint64_t ak = adt_rng_key(model, "synthetic.dlrm.dense");
    for (int j = 0; j < g->D; j++) g->a[j] = adt_rng_normal(ak, (uint64_t)j) * sqrtf(2.0f / (float)g->D);
    g->dense_key = adt_rng_key(stream, "synthetic.dlrm.x");
    m->cat_key = adt_rng_key(stream, "synthetic.dlrm.c");
    g->label_key = adt_rng_key(stream, "synthetic.dlrm.y");
    *src = (data_source){.n = stream ? ADT_SYN_DLRM_VAL_SAMPLES : ADT_SYN_DLRM_SAMPLES, .layout = ADT_DATA_CTR,
                         .elems = {g->D, g->K, 1}, .impl = m, .fill = data_ctr_fill, .prob = data_ctr_prob,
                         .free = data_ctr_free};
    snprintf(src->what, sizeof src->what, "%lld clicks from a planted logistic model, %d dense + %d categorical "
             "(stream %llu)", (long long)src->n, g->D, g->K, (unsigned long long)stream);
    return ADT_OK;
}

int adt_data_id_law(const char *spec, int table, int *kind, double *param) {
    *kind = ADT_IDS_UNKNOWN, *param = 0;
    if (!strcmp(spec, "synthetic:dlrm")) { /* dlrm_cat: floor(V u^2) over V values, hashed */
        *kind = ADT_IDS_SQUARE, *param = table < DLRM_EFFECT_TABLES ? DLRM_SIGNAL_VALUES : DLRM_VALUES;
        return ADT_OK;
    }
    const char *z = "synthetic:criteo-zipf";
    size_t n = strlen(z);
    if (!strncmp(spec, z, n) && (spec[n] == 0 || spec[n] == ',')) {
        int rc;
        *param = data_zipf_alpha(spec + n, &rc);
        *kind = ADT_IDS_ZIPF;
        return rc;
    }
    return ADT_OK;
}
