/*
 * boxing_cache.c - boxing-program times cached by (shape, dtype, from, to) on one mesh with one
 * set of link prices: an open-addressing hash table over adt_boxing_plan's results. The greedy
 * and the planner price the same conversions many times over (repeated layers, every pair of
 * candidate signatures).
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

static size_t key_hash(const adt_boxing_key *k) { return (size_t)adt_crc32c(0, k, sizeof *k); }

static void grow(adt_boxing_cache *c) {
    adt_boxing_cache old = *c;
    c->cap = c->cap ? 2 * c->cap : 1024;
    c->key = adt_malloc(c->cap * sizeof *c->key);
    c->val = adt_malloc(c->cap * sizeof *c->val);
    c->used = adt_calloc(c->cap, 1);
    c->n = 0;
    for (size_t i = 0; i < old.cap; i++) {
        if (!old.used[i]) continue;
        size_t j = key_hash(&old.key[i]) & (c->cap - 1);
        while (c->used[j]) j = (j + 1) & (c->cap - 1);
        c->used[j] = 1, c->key[j] = old.key[i], c->val[j] = old.val[i], c->n++;
    }
    free(old.key), free(old.val), free(old.used);
}

double adt_boxing_cache_time(adt_boxing_cache *c, const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to,
                          const adt_boxing_cached **kinds) {
    static const adt_boxing_cached zero;
    if (kinds) *kinds = &zero;
    if (adt_ndsbp_equal(from, to)) return 0.0;
    adt_boxing_key k;
    memset(&k, 0, sizeof k); /* padding too: the key is hashed and compared as bytes */
    k.shape = v->shape, k.dtype = v->dtype;
    k.from.ndim = from->ndim, k.to.ndim = to->ndim;
    for (int a = 0; a < from->ndim; a++) k.from.s[a] = from->s[a], k.to.s[a] = to->s[a];
    if (2 * (c->n + 1) > c->cap) grow(c);
    size_t j = key_hash(&k) & (c->cap - 1);
    while (c->used[j]) {
        if (!memcmp(&c->key[j], &k, sizeof k)) {
            if (kinds) *kinds = &c->val[j];
            return c->val[j].time;
        }
        j = (j + 1) & (c->cap - 1);
    }
    adt_boxing_prog prog;
    adt_boxing_cached r;
    memset(&r, 0, sizeof r);
    if (adt_boxing_plan(c->m, v->shape, v->dtype, from, to, c->cost, &prog)) r.time = ADT_BOXING_NONE;
    else {
        r.time = prog.time;
        for (int q = 0; q < prog.n_steps; q++) r.kind[prog.step[q].kind] += prog.step[q].time;
    }
    c->used[j] = 1, c->key[j] = k, c->val[j] = r, c->n++;
    if (kinds) *kinds = &c->val[j];
    return r.time;
}

void adt_boxing_cache_free(adt_boxing_cache *c) {
    free(c->key), free(c->val), free(c->used);
    memset(c, 0, sizeof *c);
}
