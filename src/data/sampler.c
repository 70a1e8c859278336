/*
 * sampler.c - the seeded per-epoch sample order shared by every dataset, and the batches a run
 * takes from it.
 */
#include "adtrain/data.h"

#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"

/* ---- sample order ------------------------------------------------------------------------- */

void adt_sample_permutation(int64_t *perm, int64_t n, uint64_t seed, int64_t epoch) {
    uint64_t key = adt_rng_mix64(adt_rng_key(seed, "data.shuffle") ^ adt_rng_mix64((uint64_t)epoch));
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        /* 64 random bits: the modulo bias is below 2^-30 for any n that fits in memory */
        uint64_t r = (uint64_t)adt_rng_u32(key, 2 * (uint64_t)i) << 32 | adt_rng_u32(key, 2 * (uint64_t)i + 1);
        int64_t j = (int64_t)(r % (uint64_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

int adt_sampler_init(adt_sampler *s, int64_t n_samples, int batch, int shuffle, uint64_t seed) {
    memset(s, 0, sizeof *s);
    if (batch < 1) return adt_error(ADT_ERR_ARG, "batch size %d, expected >= 1", batch);
    if (n_samples < batch)
        return adt_error(ADT_ERR_ARG, "%lld samples, fewer than one batch of %d", (long long)n_samples, batch);
    s->n = n_samples;
    s->batch = batch;
    s->shuffle = shuffle;
    s->seed = seed;
    s->epoch = -1;
    if (shuffle) s->perm = adt_malloc((size_t)n_samples * sizeof *s->perm);
    return ADT_OK;
}

void adt_sampler_free(adt_sampler *s) {
    free(s->perm);
    s->perm = NULL;
}

int64_t adt_sampler_steps_per_epoch(const adt_sampler *s) { return s->batch > 0 ? s->n / s->batch : 0; }

void adt_sampler_batch(adt_sampler *s, int64_t step, int64_t *ids) {
    int64_t spe = adt_sampler_steps_per_epoch(s);
    ADT_ASSERT(spe > 0 && step >= 0);
    int64_t epoch = step / spe, first = (step % spe) * s->batch;
    if (s->shuffle && epoch != s->epoch) {
        adt_sample_permutation(s->perm, s->n, s->seed, epoch);
        s->epoch = epoch;
    }
    for (int k = 0; k < s->batch; k++) ids[k] = s->shuffle ? s->perm[first + k] : first + k;
}
