/*
 * boxing_cache.c - boxing-program times cached by (shape, dtype, from, to) on one mesh with one
 * set of link prices: an open-addressing hash table over adt_boxing_plan's results. The greedy
 * and the planner price the same conversions many times over (repeated layers, every pair of
 * candidate signatures). Whole programs are kept too, in a second table, for the partitioner.
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

/* One open-addressing table of keys and values of vsize bytes (the cached times, or whole
 * programs): the slot of key k, its entry or the empty slot where it goes (*found 0), grown (all
 * entries rehashed) to keep it at most half full. */
static size_t table_slot(adt_boxing_key **key, void **val, size_t vsize, char **used, size_t *cap, size_t *n,
                         size_t first_cap, const adt_boxing_key *k, int *found) {
    if (2 * (*n + 1) > *cap) {
        adt_boxing_key *ok = *key;
        char *ov = *val, *ou = *used;
        size_t oc = *cap;
        *cap = oc ? 2 * oc : first_cap;
        *key = adt_malloc(*cap * sizeof **key);
        *val = adt_malloc(*cap * vsize);
        *used = adt_calloc(*cap, 1);
        for (size_t i = 0; i < oc; i++) {
            if (!ou[i]) continue;
            size_t j = key_hash(&ok[i]) & (*cap - 1);
            while ((*used)[j]) j = (j + 1) & (*cap - 1);
            (*used)[j] = 1, (*key)[j] = ok[i], memcpy((char *)*val + j * vsize, ov + i * vsize, vsize);
        }
        free(ok), free(ov), free(ou);
    }
    size_t j = key_hash(k) & (*cap - 1);
    while ((*used)[j]) {
        if (!memcmp(&(*key)[j], k, sizeof *k)) return *found = 1, j;
        j = (j + 1) & (*cap - 1);
    }
    return *found = 0, j;
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

static size_t find(adt_boxing_cache *c, const adt_boxing_key *k, int *found) {
    void *val = c->val;
    size_t j = table_slot(&c->key, &val, sizeof *c->val, &c->used, &c->cap, &c->n, 1024, k, found);
    c->val = val;
    return j;
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

/* ---- whole programs ---------------------------------------------------------------------------- */

struct adt_boxing_prog_table {
    adt_boxing_key *key;
    adt_boxing_prog *prog;
    char *used;
    size_t cap, n;
};

static size_t prog_slot(struct adt_boxing_prog_table *t, const adt_boxing_key *k, int *found) {
    void *val = t->prog;
    size_t j = table_slot(&t->key, &val, sizeof *t->prog, &t->used, &t->cap, &t->n, 256, k, found);
    t->prog = val;
    return j;
}

int adt_boxing_cache_plan(adt_boxing_cache *c, const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to,
                          adt_boxing_prog *out) {
    if (!c->progs) c->progs = adt_calloc(1, sizeof *c->progs);
    adt_boxing_key k = make_key(v, from, to);
    int found;
    size_t j = prog_slot(c->progs, &k, &found);
    if (found) return *out = c->progs->prog[j], ADT_OK;
    int rc = adt_boxing_plan(c->m, v->shape, v->dtype, from, to, c->cost, out);
    if (rc) return rc; /* not kept: the next call makes the same error message */
    c->progs->used[j] = 1, c->progs->key[j] = k, c->progs->prog[j] = *out, c->progs->n++;
    return ADT_OK;
}

void adt_boxing_cache_free(adt_boxing_cache *c) {
    free(c->key), free(c->val), free(c->used);
    if (c->progs) free(c->progs->key), free(c->progs->prog), free(c->progs->used), free(c->progs);
    memset(c, 0, sizeof *c);
}
