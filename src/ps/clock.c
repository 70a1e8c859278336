/*
 * clock.c - the consistency modes and the staleness clock: when a server may answer a pull.
 *
 * A pure state machine in the etcd-raft manner: it only records pushes and answers questions, so
 * the server's I/O loop (server.c) stays thin and the rule is tested on its own.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ps.h"

int adt_ps_sync_parse(const char *s, const char *what, adt_ps_sync *out) {
    if (s && !strcmp(s, "sync")) return *out = (adt_ps_sync){ADT_PS_SYNC, 0}, ADT_OK;
    if (s && !strcmp(s, "async")) return *out = (adt_ps_sync){ADT_PS_ASYNC, 0}, ADT_OK;
    if (s && !strncmp(s, "ssp:", 4)) {
        char *end;
        long k = strtol(s + 4, &end, 10);
        if (end != s + 4 && !*end && k >= 1 && k <= 1000000) return *out = (adt_ps_sync){ADT_PS_SSP, (int)k}, ADT_OK;
    }
    return adt_error(ADT_ERR_ARG, "%s: '%s', expected sync, ssp:K with K an integer in [1, 1000000] (a worker at "
                     "most K steps ahead of the slowest), or async", what, s ? s : "(null)");
}

const char *adt_ps_sync_str(adt_ps_sync s, char *buf, int n) {
    if (s.kind == ADT_PS_SSP) snprintf(buf, (size_t)n, "ssp:%d", s.staleness);
    else snprintf(buf, (size_t)n, "%s", s.kind == ADT_PS_SYNC ? "sync" : "async");
    return buf;
}

int adt_ps_clock_init(adt_ps_clock *c, int n_workers, adt_ps_sync sync) {
    memset(c, 0, sizeof *c);
    if (n_workers < 1) return adt_error(ADT_ERR_ARG, "ps clock: %d workers, expected at least 1", n_workers);
    if (sync.kind == ADT_PS_SSP && sync.staleness < 1)
        return adt_error(ADT_ERR_ARG, "ps clock: ssp:%d, expected a staleness bound >= 1", sync.staleness);
    if (sync.kind == ADT_PS_SYNC) sync.staleness = 0;
    c->sync = sync;
    c->n_workers = n_workers;
    c->done = adt_calloc((size_t)n_workers, sizeof *c->done);
    return ADT_OK;
}

void adt_ps_clock_free(adt_ps_clock *c) {
    free(c->done);
    c->done = NULL;
}

int adt_ps_clock_push(adt_ps_clock *c, int w, int64_t step) {
    if (w < 0 || w >= c->n_workers)
        return adt_error(ADT_ERR_STATE, "ps clock: a push from worker %d, expected 0 .. %d", w, c->n_workers - 1);
    if (step != c->done[w])
        return adt_error(ADT_ERR_STATE, "ps clock: worker %d pushed step %lld, expected step %lld (steps are pushed "
                         "once each, in order)", w, (long long)step, (long long)c->done[w]);
    c->done[w]++;
    return ADT_OK;
}

/* A worker that left counts as having pushed every step. */
#define CLOCK_LEFT (INT64_MAX / 4)

void adt_ps_clock_leave(adt_ps_clock *c, int w) {
    if (w >= 0 && w < c->n_workers) c->done[w] = CLOCK_LEFT;
}

int64_t adt_ps_clock_min(const adt_ps_clock *c) {
    int64_t m = c->done[0];
    for (int w = 1; w < c->n_workers; w++)
        if (c->done[w] < m) m = c->done[w];
    return m;
}

/* The pull of step s reads rows that hold every update of steps < s - K: the slowest worker has
 * pushed steps 0 .. s-K-1, i.e. min done >= s - K. Under sync (K = 0) that is the whole previous
 * step, which is what one process would read. */
int adt_ps_clock_may_serve(const adt_ps_clock *c, int64_t step) {
    if (c->sync.kind == ADT_PS_ASYNC) return 1;
    return step - adt_ps_clock_min(c) <= (int64_t)c->sync.staleness;
}

void adt_ps_clock_start(adt_ps_clock *c, int64_t step) {
    for (int w = 0; w < c->n_workers; w++) c->done[w] = step;
}

int adt_ps_clock_step_gathered(const adt_ps_clock *c, int64_t step) { return adt_ps_clock_min(c) > step; }
