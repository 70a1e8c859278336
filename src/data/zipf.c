/*
 * zipf.c - synthetic:criteo-zipf, Criteo-shaped clicks whose categorical ids follow a Zipf law
 * over tables of any size (the model's table_rows), with a planted signal so AUC means something.
 *
 * Spec: synthetic:criteo-zipf[,alpha=A][,signal=S][,samples=N]
 *   alpha    Zipf exponent of every field, > 0 (default 1.05): rank k has weight k^-alpha
 *   signal   scale of the planted per-row effects, >= 0 (default 1; 0: labels are noise)
 *   samples  training samples (default 2^24; the validation stream has 2^16)
 * Sample `id` of stream s (0 training, 1 validation):
 *   dense x_j = log(1 + floor(20 E)), E ~ Exp(1)                      (as synthetic:dlrm)
 *   field t:  rank k_t ~ Zipf(alpha) on 1 .. rows_t (rejection-inversion, Hormann & Derflinger
 *             1996, O(1) per draw for any rows_t); row_t = k_t - 1, so row 0 is the most frequent
 *   z = -1.2 + sum_j a_j (x_j - 2.4)                  a_j ~ N(0, 1/n_dense)
 *            + signal * sum_{t < 8} e_t(row_t)         e_t(r) ~ N(0, 0.8^2)   per-row effects
 *   label ~ Bernoulli(sigmoid(z))
 * The planted model (a_j, e_t) depends on no stream, so validation samples follow the training
 * law; adt_dataset_planted_prob gives sigmoid(z), the best score any model can reach. Every draw
 * is a counter-based random number of (stream, id, field): any process computes any sample.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

#define ZIPF_SIGNAL_TABLES 8
#define ZIPF_EFFECT_SD 0.8
#define ZIPF_MAX_TRIES 64

/* ---- Zipf by rejection-inversion (the Apache Commons RNG formulation) ----------------------- */

typedef struct zipf_law {
    double s, n;               /* exponent, elements */
    double h_x1, h_n, thresh;  /* H(1.5) - 1, H(n + 0.5), the acceptance shortcut */
} zipf_law;

/* log1p(x)/x and expm1(x)/x, with their limits at 0 */
static double helper1(double x) { return fabs(x) > 1e-8 ? log1p(x) / x : 1 - x / 2 + x * x / 3; }
static double helper2(double x) { return fabs(x) > 1e-8 ? expm1(x) / x : 1 + x / 2 + x * x / 6; }
static double zh(const zipf_law *z, double x) { return exp(-z->s * log(x)); }
static double zH(const zipf_law *z, double x) {
    double lx = log(x);
    return helper2((1 - z->s) * lx) * lx;
}
static double zH_inv(const zipf_law *z, double x) {
    double t = x * (1 - z->s);
    if (t < -1) t = -1;
    return exp(helper1(t) * x);
}

static void zipf_init(zipf_law *z, double s, int64_t n) {
    z->s = s, z->n = (double)n;
    z->h_x1 = zH(z, 1.5) - 1;
    z->h_n = zH(z, z->n + 0.5);
    z->thresh = 2 - zH_inv(z, zH(z, 2.5) - zh(z, 2));
}

/* A rank in [1, n] from uniforms u(0), u(1), ... (one per try). */
static int64_t zipf_draw(const zipf_law *z, uint64_t key, uint64_t ctr) {
    int64_t k = 1;
    for (int i = 0; i < ZIPF_MAX_TRIES; i++) {
        double u = z->h_n + (double)adt_rng_uniform(key, ctr * ZIPF_MAX_TRIES + (uint64_t)i) * (z->h_x1 - z->h_n);
        double x = zH_inv(z, u);
        k = (int64_t)(x + 0.5);
        if (k < 1) k = 1;
        else if ((double)k > z->n) k = (int64_t)z->n;
        if ((double)k - x <= z->thresh || u >= zH(z, (double)k + 0.5) - zh(z, (double)k)) return k;
    }
    return k; /* acceptance is above 1/2 per try: 64 rejections do not happen */
}

/* ---- the dataset ---------------------------------------------------------------------------- */

typedef struct syn_zipf {
    data_ctr_gen base;
    double signal;
    zipf_law law[ADT_DATA_MAX_TABLES];
    uint64_t effect_key[ADT_DATA_MAX_TABLES];
    uint64_t cat_key;
} syn_zipf;

static void zipf_cat(const void *gen, uint64_t id, int32_t *rows, double *z) {
    const syn_zipf *m = gen;
    int K = m->base.K;
    for (int t = 0; t < K; t++) {
        rows[t] = (int32_t)(zipf_draw(&m->law[t], m->cat_key, id * (uint64_t)K + (uint64_t)t) - 1);
        if (t < ZIPF_SIGNAL_TABLES)
            *z += m->signal * ZIPF_EFFECT_SD * adt_rng_normal(m->effect_key[t], (uint64_t)rows[t]);
    }
}

/* opts: "" or ",key=value,..." after the kind's name. */
static int parse_opts(const char *opts, double *alpha, double *signal, int64_t *samples) {
    for (const char *p = opts; *p;) {
        if (*p != ',') goto bad;
        p++;
        size_t n = strcspn(p, ",");
        char item[64];
        if (n >= sizeof item) goto bad;
        memcpy(item, p, n);
        item[n] = 0;
        p += n;
        char *eq = strchr(item, '='), *end;
        if (!eq) goto bad;
        *eq = 0;
        double v = strtod(eq + 1, &end);
        if (end == eq + 1 || *end) goto bad;
        if (!strcmp(item, "alpha") && v > 0 && v <= 10) *alpha = v;
        else if (!strcmp(item, "signal") && v >= 0 && v <= 100) *signal = v;
        else if (!strcmp(item, "samples") && v >= 1 && v <= 1e15 && v == floor(v)) *samples = (int64_t)v;
        else goto bad;
    }
    return ADT_OK;
bad:
    return adt_error(ADT_ERR_ARG, "synthetic:criteo-zipf%s: expected options ,alpha=A (0 < A <= 10) ,signal=S "
                     "(0 <= S <= 100) ,samples=N (an integer >= 1), e.g. synthetic:criteo-zipf,alpha=1.1,signal=1",
                     opts);
}

#define ZIPF_ALPHA 1.05

double data_zipf_alpha(const char *opts, int *rc) {
    double alpha = ZIPF_ALPHA, signal;
    int64_t samples;
    *rc = parse_opts(opts, &alpha, &signal, &samples);
    return alpha;
}

int data_synthetic_zipf(data_source *src, const adt_data_shape *shape, uint64_t stream, const char *opts) {
    double alpha = ZIPF_ALPHA, signal = 1.0;
    int64_t samples = (int64_t)1 << 24;
    int rc = parse_opts(opts, &alpha, &signal, &samples);
    if (rc) return rc;
    if (shape->n_dense < 0 || shape->n_tables < 1 || shape->n_tables > ADT_DATA_MAX_TABLES)
        return adt_error(ADT_ERR_SHAPE, "synthetic:criteo-zipf: n_dense %d and n_tables %d, expected n_dense >= 0 and "
                         "1 <= n_tables <= %d", shape->n_dense, shape->n_tables, ADT_DATA_MAX_TABLES);
    for (int t = 0; t < shape->n_tables; t++)
        if (shape->table_rows[t] < 1 || shape->table_rows[t] > INT32_MAX)
            return adt_error(ADT_ERR_SHAPE, "synthetic:criteo-zipf: table_rows[%d] = %lld, expected 1 .. %d", t,
                             (long long)shape->table_rows[t], INT32_MAX);
    syn_zipf *m = adt_calloc(1, sizeof *m);
    data_ctr_gen *g = &m->base;
    g->D = shape->n_dense;
    g->K = shape->n_tables;
    g->cat = zipf_cat;
    m->signal = signal;
    uint64_t model = adt_rng_key(0x21bf, "synthetic.zipf.model");
    for (int t = 0; t < g->K; t++) {
        zipf_init(&m->law[t], alpha, shape->table_rows[t]);
        m->effect_key[t] = adt_rng_key(model ^ (uint64_t)t, "synthetic.zipf.effect");
    }
    g->a = adt_malloc((size_t)(g->D ? g->D : 1) * sizeof *g->a);
    uint64_t ak = adt_rng_key(model, "synthetic.zipf.dense");
    for (int j = 0; j < g->D; j++) g->a[j] = adt_rng_normal(ak, (uint64_t)j) * sqrtf(1.0f / (float)g->D);
    g->dense_key = adt_rng_key(stream, "synthetic.zipf.x");
    m->cat_key = adt_rng_key(stream, "synthetic.zipf.c");
    g->label_key = adt_rng_key(stream, "synthetic.zipf.y");
    *src = (data_source){.n = stream ? (int64_t)1 << 16 : samples, .layout = ADT_DATA_CTR, .elems = {g->D, g->K, 1},
                         .impl = m, .fill = data_ctr_fill, .prob = data_ctr_prob, .free = data_ctr_free};
    snprintf(src->what, sizeof src->what, "%lld clicks, %d dense + %d Zipf(%.3g) fields, planted signal %.3g "
             "(stream %llu)", (long long)src->n, g->D, g->K, alpha, signal, (unsigned long long)stream);
    return ADT_OK;
}
