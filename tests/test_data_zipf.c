/*
 * test_data_zipf.c - synthetic:criteo-zipf, the parameter-server mode's large-table data:
 *   determinism    a sample is the same whatever batch or order it is filled in, and streams differ;
 *   zipf_law       the empirical frequencies of the top ranks and of the tail of a 1000-row field
 *                  match the exact Zipf pmf k^-a / H(N, a) (and for a 2^30-row field the top
 *                  ranks' pmf from H computed by Euler-Maclaurin), for a = 0.8, 1.05 and 1.5;
 *   signal         the planted probability's AUC on the validation stream is well above 0.5 with
 *                  signal 1 and above signal 0's (the per-row effects carry information);
 *   options        bad options are refused with the expected forms named; ranges still apply.
 */
#include <math.h>
#include <stdint.h>

#include "adtrain/adtrain.h"
#include "check.h"

static adt_data_shape shape_of(int64_t rows, int tables) {
    adt_data_shape s = {.n_dense = 4, .n_tables = tables};
    for (int t = 0; t < tables; t++) s.table_rows[t] = rows;
    return s;
}

static void test_determinism(void) {
    adt_data_shape sh = shape_of(5000, 3);
    adt_dataset *ds, *val;
    CHECK(adt_dataset_open(&ds, "synthetic:criteo-zipf", &sh, NULL, 0) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_dataset_open(&val, "synthetic:criteo-zipf", &sh, NULL, 1) == ADT_OK, "%s", adt_error_message());
    CHECK(adt_dataset_samples(ds) == (1 << 24) && adt_dataset_samples(val) == (1 << 16), "sizes");
    CHECK(adt_dataset_layout(ds) == ADT_DATA_CTR, "layout");
    int64_t ids[4] = {7, 123456, 3, 7};
    float x[16], y[4], x1[4], y1;
    int32_t c[12], c1[3];
    adt_dataset_fill(ds, ids, 4, x, c, y);
    int same = 1;
    for (int k = 0; k < 4; k++) {
        adt_dataset_fill(ds, &ids[k], 1, x1, c1, &y1);
        same &= !memcmp(x1, x + 4 * k, sizeof x1) && !memcmp(c1, c + 3 * k, sizeof c1) && y1 == y[k];
        for (int t = 0; t < 3; t++) same &= c1[t] >= 0 && c1[t] < 5000;
    }
    CHECK(same, "a sample depends on its batch, or an id is out of range");
    float xv[16], yv[4];
    int32_t cv[12];
    adt_dataset_fill(val, ids, 4, xv, cv, yv);
    CHECK(memcmp(cv, c, sizeof c) || memcmp(xv, x, sizeof x), "the validation stream repeats the training one");
    adt_dataset_free(ds);
    adt_dataset_free(val);
}

/* Empirical rank frequencies of field 0 over n samples, against the pmf with normaliser H. */
static void check_law(double a, int64_t rows, double H, int n) {
    adt_data_shape sh = shape_of(rows, 1);
    char spec[96];
    snprintf(spec, sizeof spec, "synthetic:criteo-zipf,alpha=%g", a);
    adt_dataset *ds;
    CHECK(adt_dataset_open(&ds, spec, &sh, NULL, 0) == ADT_OK, "%s", adt_error_message());
    if (!ds) return;
    int64_t *ids = malloc(sizeof *ids * (size_t)n);
    float *x = malloc(sizeof *x * 4 * (size_t)n), *y = malloc(sizeof *y * (size_t)n);
    int32_t *c = malloc(sizeof *c * (size_t)n);
    for (int i = 0; i < n; i++) ids[i] = i;
    adt_dataset_fill(ds, ids, n, x, c, y);
    int64_t cnt[10] = {0}, beyond = 0;
    for (int i = 0; i < n; i++) {
        if (c[i] < 10) cnt[c[i]]++;
        else beyond++;
    }
    double top = 0;
    for (int k = 0; k < 10; k++) {
        double p = pow(k + 1.0, -a) / H, sd = sqrt(p * (1 - p) / n);
        top += p;
        CHECK(fabs((double)cnt[k] / n - p) < 5 * sd + 1e-4, "alpha %g rows %lld: rank %d frequency %.5f, pmf %.5f", a,
              (long long)rows, k + 1, (double)cnt[k] / n, p);
    }
    double pt = 1 - top, sdt = sqrt(pt * (1 - pt) / n);
    CHECK(fabs((double)beyond / n - pt) < 5 * sdt + 1e-4, "alpha %g rows %lld: mass beyond rank 10 %.5f, pmf %.5f",
          a, (long long)rows, (double)beyond / n, pt);
    free(ids), free(x), free(y), free(c);
    adt_dataset_free(ds);
}

/* H(N, a) = sum_{k<=N} k^-a: the first M terms, then Euler-Maclaurin for the rest. */
static double harmonic(int64_t N, double a) {
    int64_t M = N < 100000 ? N : 100000;
    double h = 0;
    for (int64_t k = M; k >= 1; k--) h += pow((double)k, -a);
    if (N == M) return h;
    double m = (double)M, n = (double)N;
    double integral = fabs(a - 1) < 1e-12 ? log(n / m) : (pow(n, 1 - a) - pow(m, 1 - a)) / (1 - a);
    return h + integral + (pow(n, -a) - pow(m, -a)) / 2 - a * (pow(n, -a - 1) - pow(m, -a - 1)) / 12;
}

static void test_zipf_law(void) {
    const double as[3] = {0.8, 1.05, 1.5};
    for (int i = 0; i < 3; i++) {
        check_law(as[i], 1000, harmonic(1000, as[i]), 200000);
        check_law(as[i], (int64_t)1 << 30, harmonic((int64_t)1 << 30, as[i]), 200000);
    }
}

static double planted_auc(const char *spec) {
    adt_data_shape sh = shape_of(100000, 8);
    adt_dataset *ds;
    if (adt_dataset_open(&ds, spec, &sh, NULL, 1)) return -1;
    const int n = 20000;
    int64_t *ids = malloc(sizeof *ids * n);
    float *x = malloc(sizeof *x * 4 * n), *y = malloc(sizeof *y * n), *p = malloc(sizeof *p * n);
    int32_t *c = malloc(sizeof *c * 8 * n);
    for (int i = 0; i < n; i++) ids[i] = i;
    adt_dataset_fill(ds, ids, n, x, c, y);
    adt_dataset_planted_prob(ds, ids, n, p);
    double auc = -1, pos = 0;
    for (int i = 0; i < n; i++) pos += y[i];
    adt_auc(p, y, n, &auc);
    fprintf(stderr, "%s: positives %.1f%%, planted AUC %.3f\n", spec, 100 * pos / n, auc);
    free(ids), free(x), free(y), free(p), free(c);
    adt_dataset_free(ds);
    return auc;
}

static void test_signal(void) {
    double a1 = planted_auc("synthetic:criteo-zipf"), a0 = planted_auc("synthetic:criteo-zipf,signal=0");
    CHECK(a1 > 0.75, "planted AUC %.3f with signal 1", a1);
    CHECK(a1 > a0 + 0.05, "signal 1 AUC %.3f, signal 0 %.3f: the per-row effects carry nothing", a1, a0);
}

static void test_options(void) {
    adt_data_shape sh = shape_of(100, 2);
    adt_dataset *ds;
    const char *bad[] = {"synthetic:criteo-zipf,alpha=0", "synthetic:criteo-zipf,alpha", "synthetic:criteo-zipf,beta=1",
                         "synthetic:criteo-zipf,samples=1.5", "synthetic:criteo-zipf,", "synthetic:criteo-zipf,signal=-1"};
    for (int i = 0; i < 6; i++) {
        CHECK(adt_dataset_open(&ds, bad[i], &sh, NULL, 0) == ADT_ERR_ARG && strstr(adt_error_message(), "alpha=A") &&
              strstr(adt_error_message(), "samples=N"), "'%s': %s", bad[i], adt_error_message());
    }
    CHECK(adt_dataset_open(&ds, "synthetic:criteo-zipfx", &sh, NULL, 0) == ADT_ERR_ARG, "a longer name accepted");
    CHECK(adt_dataset_open(&ds, "synthetic:criteo-zipf,samples=1000@100:300", &sh, NULL, 0) == ADT_OK, "%s",
          adt_error_message());
    CHECK(adt_dataset_samples(ds) == 200, "range: %lld", (long long)adt_dataset_samples(ds));
    adt_dataset_free(ds);
    adt_data_shape none = {.n_dense = 4, .n_tables = 0};
    CHECK(adt_dataset_open(&ds, "synthetic:criteo-zipf", &none, NULL, 0) == ADT_ERR_SHAPE, "no tables accepted");
}

int main(void) {
    RUN(test_determinism);
    RUN(test_zipf_law);
    RUN(test_signal);
    RUN(test_options);
    return check_finish();
}
