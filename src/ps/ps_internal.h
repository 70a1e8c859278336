/*
 * ps_internal.h - what the parameter-server files share: a map from 64-bit ids to dense indices
 * (deduplicating a batch's ids, summing a step's gradients per row) and the protocol's tags.
 */
#ifndef ADTRAIN_PS_INTERNAL_H
#define ADTRAIN_PS_INTERNAL_H

#include <stdint.h>

#include "adtrain/ps.h"

/* Message tags on the protocol's own communicator. A pull and a push are int64 lists
 * [step, count_0 .. count_{T-1}, ids of table 0, ids of table 1, ...]; a push is followed by its
 * gradients (f32, the ids' rows in that order), a pull answered by the rows (f32, same order). */
enum { PS_TAG_PULL = 1, PS_TAG_ROWS = 2, PS_TAG_PUSH = 3, PS_TAG_GRAD = 4, PS_TAG_DONE = 5, PS_TAG_PEEK = 6,
       PS_TAG_PEEKROWS = 7, PS_TAG_SAVE = 8, PS_TAG_SAVED = 9, PS_TAG_NEXT = 10, PS_TAG_CHUNK = 11 };
/* Dynamic sharding: NEXT (worker -> server 0) is int64 [0], its answer CHUNK int64 [chunk or -1]. */
/* A cut marker (SAVE) is int64 [steps pushed, the shard's path as bytes, NUL-terminated]; its
 * answer (SAVED) int64 [status, the error message as bytes], at most PS_SAVED_WORDS words. */
#define PS_SAVED_WORDS 130
/* A peek is a pull outside the clock that creates and touches no row (an absent row reads as its
 * initial value): what evaluation reads. Its step field s holds it until every worker has pushed
 * steps 0 .. s-1 (the asker's own pushes), so that it sees them applied. */

/* ids -> 0, 1, 2, ... in order of first insertion; cleared in time proportional to its entries. */
typedef struct ps_idmap {
    uint64_t *keys;
    int32_t *val; /* -1: empty */
    uint64_t mask;
    int32_t n;
} ps_idmap;

void ps_idmap_init(ps_idmap *m);
void ps_idmap_free(ps_idmap *m);
void ps_idmap_clear(ps_idmap *m);
/* The index of id, inserted as the next one (*added = 1) when absent. */
int32_t ps_idmap_put(ps_idmap *m, uint64_t id, int *added);

/* An idle loop's pause: a few spins, then naps that give the core away (server.c). */
void ps_nap(int *idle);
/* The configured timeout, else the world communicator's. */
double ps_timeout(const adt_ps_world *pw, const adt_ps_cfg *cfg);

#endif
