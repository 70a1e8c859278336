/*
 * dispatch.c - dynamic sharding: the run's samples cut into chunks of a worker's batch, handed
 * out one at a time to whichever worker asks next, so a slow worker trains fewer of them.
 *
 * A pure state machine (as clock.c): server 0's loop (server.c) feeds it the workers' requests
 * and sends its answers. Chunks go out in index order, each exactly once; what a chunk holds is
 * the caller's mapping (src/train/ps.c: chunk c is block c mod W of the sampler's global batch
 * c / W), so the samples of a run are the one-process run's, whoever trains them.
 */
#include <stdint.h>
#include <stdlib.h>

#include "adtrain/base.h"
#include "adtrain/ps.h"

int adt_ps_dispatch_init(adt_ps_dispatch *d, int64_t total, int n_workers) {
    if (total < 0 || n_workers < 1)
        return adt_error(ADT_ERR_ARG, "ps dispatch: %lld chunks over %d workers, expected chunks >= 0 and workers >= 1",
                         (long long)total, n_workers);
    *d = (adt_ps_dispatch){.total = total, .n_workers = n_workers};
    d->taken = adt_calloc((size_t)n_workers, sizeof *d->taken);
    return ADT_OK;
}

void adt_ps_dispatch_free(adt_ps_dispatch *d) {
    free(d->taken);
    d->taken = NULL;
}

int64_t adt_ps_dispatch_next(adt_ps_dispatch *d, int w) {
    if (w < 0 || w >= d->n_workers || d->next >= d->total) return -1;
    d->taken[w]++;
    return d->next++;
}
