/*
 * idmap.c - ids to first-seen indices (linear probing, load <= 1/2): a batch's distinct rows.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "ps/ps_internal.h"

static uint64_t idmap_hash(uint64_t id) { return adt_rng_mix64(id ^ 0x2545f4914f6cdd1dull); }

void ps_idmap_init(ps_idmap *m) {
    m->mask = 63;
    m->n = 0;
    m->keys = adt_malloc((m->mask + 1) * sizeof *m->keys);
    m->val = adt_malloc((m->mask + 1) * sizeof *m->val);
    memset(m->val, 0xff, (m->mask + 1) * sizeof *m->val);
}

void ps_idmap_free(ps_idmap *m) {
    free(m->keys), free(m->val);
    m->keys = NULL, m->val = NULL;
}

void ps_idmap_clear(ps_idmap *m) {
    memset(m->val, 0xff, (m->mask + 1) * sizeof *m->val);
    m->n = 0;
}

static void idmap_grow(ps_idmap *m) {
    uint64_t old = m->mask + 1;
    uint64_t *k = m->keys;
    int32_t *v = m->val;
    m->mask = old * 2 - 1;
    m->keys = adt_malloc((m->mask + 1) * sizeof *m->keys);
    m->val = adt_malloc((m->mask + 1) * sizeof *m->val);
    memset(m->val, 0xff, (m->mask + 1) * sizeof *m->val);
    for (uint64_t i = 0; i < old; i++) {
        if (v[i] < 0) continue;
        uint64_t j = idmap_hash(k[i]) & m->mask;
        while (m->val[j] >= 0) j = (j + 1) & m->mask;
        m->keys[j] = k[i], m->val[j] = v[i];
    }
    free(k), free(v);
}

int32_t ps_idmap_put(ps_idmap *m, uint64_t id, int *added) {
    if ((uint64_t)(m->n + 1) * 2 > m->mask + 1) idmap_grow(m);
    uint64_t j = idmap_hash(id) & m->mask;
    for (; m->val[j] >= 0; j = (j + 1) & m->mask)
        if (m->keys[j] == id) return *added = 0, m->val[j];
    m->keys[j] = id;
    m->val[j] = m->n++;
    *added = 1;
    return m->val[j];
}
