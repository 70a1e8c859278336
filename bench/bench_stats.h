/*
 * bench_stats.h - what the per-call latency benchmarks share: medians, p99, means and maxima of
 * timed calls, printed as JSON fields.
 */
#ifndef ADTRAIN_BENCH_STATS_H
#define ADTRAIN_BENCH_STATS_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct stat_us {
    double median, p99, mean, max;
    int64_t n;
} stat_us;

static int bench_cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* t[0..n) in seconds -> microseconds. Sorts t. */
static inline stat_us summarise(double *t, int64_t n) {
    stat_us s = {0};
    if (n == 0) return s;
    qsort(t, (size_t)n, sizeof *t, bench_cmp_d);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += t[i];
    s.n = n;
    s.median = 1e6 * t[n / 2];
    s.p99 = 1e6 * t[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1];
    s.mean = 1e6 * sum / (double)n;
    s.max = 1e6 * t[n - 1];
    return s;
}

static inline void print_stat(FILE *f, const char *name, stat_us s, int comma) {
    fprintf(f, "\"%s\": {\"n\": %lld, \"median_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, \"max_us\": %.1f}%s",
            name, (long long)s.n, s.median, s.p99, s.mean, s.max, comma ? ", " : "");
}

#endif
