/*
 * auc.c - ROC AUC for click-through evaluation (DLRM on Criteo and synthetic:dlrm).
 *
 * AUC = (R+ - P(P+1)/2) / (P N), R+ the sum of the positives' ranks in ascending score order,
 * tied scores sharing their average rank (Mann-Whitney U): O(n log n), exact for ties.
 */
#include <math.h>
#include <stdlib.h>

#include "adtrain/base.h"
#include "adtrain/data.h"

typedef struct scored {
    float s;
    float y;
} scored;

static int by_score(const void *a, const void *b) {
    float x = ((const scored *)a)->s, y = ((const scored *)b)->s;
    return (x > y) - (x < y);
}

int adt_auc(const float *scores, const float *labels, int64_t n, double *out) {
    *out = NAN;
    if (n < 1) return adt_error(ADT_ERR_ARG, "AUC of %lld samples, expected at least one", (long long)n);
    int64_t pos = 0;
    for (int64_t i = 0; i < n; i++) {
        if (labels[i] != 0.0f && labels[i] != 1.0f)
            return adt_error(ADT_ERR_ARG, "AUC: label %g of sample %lld, expected 0 or 1", (double)labels[i],
                             (long long)i);
        if (isnan(scores[i]))
            return adt_error(ADT_ERR_ARG, "AUC: score of sample %lld is NaN, expected a number", (long long)i);
        pos += labels[i] == 1.0f;
    }
    int64_t neg = n - pos;
    if (pos == 0 || neg == 0)
        return adt_error(ADT_ERR_ARG, "AUC of %lld samples with %lld positives and %lld negatives is undefined, "
                         "expected both classes", (long long)n, (long long)pos, (long long)neg);
    scored *v = adt_malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = (scored){scores[i], labels[i]};
    qsort(v, (size_t)n, sizeof *v, by_score);
    double rank_sum = 0; /* of the positives, ranks 1-based */
    for (int64_t i = 0; i < n;) {
        int64_t j = i, p = 0;
        while (j < n && v[j].s == v[i].s) p += v[j++].y == 1.0f;
        rank_sum += (double)p * 0.5 * (double)(i + 1 + j); /* average of ranks i+1 .. j */
        i = j;
    }
    free(v);
    *out = (rank_sum - 0.5 * (double)pos * (double)(pos + 1)) / ((double)pos * (double)neg);
    return ADT_OK;
}
