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

/* The key's bytes (padding zeroed) as 64-bit words, each folded in by a multiply (inline: the
 * key is some 20 words, and a call to the full mixer per word was a tenth of the planner's
 * search), the whole mixed once at the end. */
static size_t key_hash(const adt_boxing_key *k) {
    uint64_t h = 0x9e3779b97f4a7c15ULL, w;
    const unsigned char *b = (const unsigned char *)k;
    size_t i = 0;
    for (; i + 8 <= sizeof *k; i += 8) memcpy(&w, b + i, 8), h = (h ^ w) * 0x100000001b3ULL, h ^= h >> 29;
    for (; i < sizeof *k; i++) h = (h ^ b[i]) * 0x100000001b3ULL;
    return (size_t)adt_rng_mix64(h);
}

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

static adt_boxing_key make_key(const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to) {
    adt_boxing_key k;
    memset(&k, 0, sizeof k); /* padding too: the key is hashed and compared as bytes */
    k.shape = v->shape, k.dtype = v->dtype;
    k.from.ndim = from->ndim, k.to.ndim = to->ndim;
    for (int a = 0; a < from->ndim; a++) k.from.s[a] = from->s[a];
    for (int a = 0; a < to->ndim; a++) k.to.s[a] = to->s[a];
    return k;
}

/* The slot of key k: its entry, or the empty slot where it goes (*found 0). */
static size_t find(adt_boxing_cache *c, const adt_boxing_key *k, int *found) {
    if (2 * (c->n + 1) > c->cap) grow(c);
    size_t j = key_hash(k) & (c->cap - 1);
    while (c->used[j]) {
        if (!memcmp(&c->key[j], k, sizeof *k)) return *found = 1, j;
        j = (j + 1) & (c->cap - 1);
    }
    return *found = 0, j;
}

double adt_boxing_cache_time(adt_boxing_cache *c, const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to,
                             const adt_boxing_cached **kinds) {
    static const adt_boxing_cached zero;
    if (kinds) *kinds = &zero;
    if (adt_ndsbp_equal(from, to)) return 0.0;
    adt_boxing_key k = make_key(v, from, to);
    int found;
    size_t j = find(c, &k, &found);
    if (!found) {
        /* one search from the source prices every target that fits: later misses become hits */
        adt_ndsbp states[512];
        adt_boxing_cached all[512];
        int n = adt_ndsbp_fits(to, c->m, v->shape)
                    ? adt_boxing_plan_all(c->m, v->shape, v->dtype, from, c->cost, states, all) : -1;
        for (int i = 0; i < n; i++) {
            /* unreached ones go the long way below (adt_boxing_plan retries through empty blocks) */
            if (all[i].time >= ADT_BOXING_NONE || !adt_ndsbp_fits(&states[i], c->m, v->shape)) continue;
            adt_boxing_key ki = make_key(v, from, &states[i]);
            int f;
            size_t s = find(c, &ki, &f);
            if (!f) c->used[s] = 1, c->key[s] = ki, c->val[s] = all[i], c->n++;
        }
        j = find(c, &k, &found);
        if (!found) { /* a target with empty blocks, or a source the search refuses */
            adt_boxing_prog prog;
            adt_boxing_cached r;
            memset(&r, 0, sizeof r);
            if (adt_boxing_plan(c->m, v->shape, v->dtype, from, to, c->cost, &prog)) r.time = ADT_BOXING_NONE;
            else {
                r.time = prog.time;
                for (int q = 0; q < prog.n_steps; q++) r.kind[prog.step[q].kind] += prog.step[q].time;
            }
            c->used[j] = 1, c->key[j] = k, c->val[j] = r, c->n++;
        }
    }
    if (kinds) *kinds = &c->val[j];
    return c->val[j].time;
}

void adt_boxing_cache_free(adt_boxing_cache *c) {
    free(c->key), free(c->val), free(c->used);
    memset(c, 0, sizeof *c);
}
