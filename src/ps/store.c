/*
 * store.c - one server's shard of the embedding tables: rows by id, created on first touch,
 * bounded by a capacity, least recently touched evicted first; the sparse optimizer per row;
 * save and load as safetensors.
 *
 * Each table is an open-addressing hash (linear probing, load <= 1/2, deletion by backward shift,
 * so no tombstones) from the id to a row index, and slabs indexed by row: ids, weights, optimizer
 * state, the touch stamp and an intrusive LRU list. Why not uthash: its handle costs 56 bytes
 * per row plus a malloc per row, more than a 16-float row itself; here a row costs its floats
 * plus 24 bytes (id, stamp, two links, a 4-byte hash slot at load 1/2), slabs grow geometrically
 * up to the capacity, and a save writes the slabs as they are.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/ps.h"
#include "adtrain/safetensors.h"

#define NIL (-1)

typedef struct ps_tab {
    adt_ps_table cfg;
    adt_ps_optim optim; /* the table's own, or the store's */
    uint64_t init_key;
    int n_state;       /* state floats per row: states(kind) * dim */
    uint32_t *slot;    /* [mask+1]: row index + 1, 0 = empty */
    uint64_t mask;
    int64_t n_rows, alloc; /* rows in use / rows the slabs hold */
    uint64_t *ids;
    float *w, *st;
    int64_t *stamp;
    int32_t *prev, *next; /* LRU list: head is the least recently touched */
    int32_t head, tail, free_list; /* free rows chain through next[] */
    int64_t n_free_slots;
    adt_ps_store_stats stats;
} ps_tab;

struct adt_ps_store {
    int n_tables;
    ps_tab *tabs;
    adt_ps_optim optim;
    uint64_t seed;
    float lr; /* adt_ps_store_set_lr's, 0: none */
};

static uint64_t tab_hash(uint64_t id) { return adt_rng_mix64(id ^ 0x5bd1e9955bd1e995ull); }

int adt_ps_owner(int t, uint64_t id, int n_servers) {
    return (int)(adt_rng_mix64(id * 0x9e3779b97f4a7c15ull + (uint64_t)t) % (uint64_t)n_servers);
}

/* ---- the hash ------------------------------------------------------------------------------ */

static int64_t tab_find(const ps_tab *tb, uint64_t id) {
    for (uint64_t i = tab_hash(id) & tb->mask;; i = (i + 1) & tb->mask) {
        uint32_t s = tb->slot[i];
        if (!s) return NIL;
        if (tb->ids[s - 1] == id) return s - 1;
    }
}

static void tab_insert_slot(ps_tab *tb, uint64_t id, int64_t row) {
    uint64_t i = tab_hash(id) & tb->mask;
    while (tb->slot[i]) i = (i + 1) & tb->mask;
    tb->slot[i] = (uint32_t)(row + 1);
}

/* Removes id's slot; the entries after it in its cluster move back into the hole when their home
 * position allows (Knuth's algorithm R), so lookups never cross an empty slot they need. */
static void tab_delete_slot(ps_tab *tb, uint64_t id) {
    uint64_t i = tab_hash(id) & tb->mask;
    while (tb->ids[tb->slot[i] - 1] != id) i = (i + 1) & tb->mask;
    for (uint64_t j = i;;) {
        j = (j + 1) & tb->mask;
        if (!tb->slot[j]) break;
        uint64_t k = tab_hash(tb->ids[tb->slot[j] - 1]) & tb->mask;
        int movable = i <= j ? (k <= i || k > j) : (k <= i && k > j);
        if (movable) {
            tb->slot[i] = tb->slot[j];
            i = j;
        }
    }
    tb->slot[i] = 0;
}

static void tab_rehash(ps_tab *tb, uint64_t n_slots) {
    free(tb->slot);
    tb->slot = adt_calloc(n_slots, sizeof *tb->slot);
    tb->mask = n_slots - 1;
    for (int32_t r = tb->head; r != NIL; r = tb->next[r]) tab_insert_slot(tb, tb->ids[r], r);
}

/* ---- slabs and the LRU list ------------------------------------------------------------------ */

static void tab_grow(ps_tab *tb) {
    int64_t n = tb->alloc ? tb->alloc * 2 : 1024;
    if (n > tb->cfg.capacity) n = tb->cfg.capacity;
    int dim = tb->cfg.dim;
    tb->ids = adt_realloc(tb->ids, (size_t)n * sizeof *tb->ids);
    tb->w = adt_realloc(tb->w, (size_t)n * (size_t)dim * sizeof *tb->w);
    if (tb->n_state) tb->st = adt_realloc(tb->st, (size_t)n * (size_t)tb->n_state * sizeof *tb->st);
    tb->stamp = adt_realloc(tb->stamp, (size_t)n * sizeof *tb->stamp);
    tb->prev = adt_realloc(tb->prev, (size_t)n * sizeof *tb->prev);
    tb->next = adt_realloc(tb->next, (size_t)n * sizeof *tb->next);
    for (int64_t r = n - 1; r >= tb->alloc; r--) tb->next[r] = tb->free_list, tb->free_list = (int32_t)r;
    tb->alloc = n;
    uint64_t want = 16;
    while (want < (uint64_t)n * 2) want <<= 1;
    if (want > tb->mask + 1) tab_rehash(tb, want);
}

static void lru_unlink(ps_tab *tb, int32_t r) {
    if (tb->prev[r] != NIL) tb->next[tb->prev[r]] = tb->next[r];
    else tb->head = tb->next[r];
    if (tb->next[r] != NIL) tb->prev[tb->next[r]] = tb->prev[r];
    else tb->tail = tb->prev[r];
}

static void lru_append(ps_tab *tb, int32_t r) {
    tb->prev[r] = tb->tail;
    tb->next[r] = NIL;
    if (tb->tail != NIL) tb->next[tb->tail] = r;
    else tb->head = r;
    tb->tail = r;
}

static void touch(ps_tab *tb, int32_t r, int64_t now) {
    tb->stamp[r] = now;
    if (tb->tail == r) return;
    lru_unlink(tb, r);
    lru_append(tb, r);
}

/* Row id's initial weights. */
static void init_weights(const ps_tab *tb, uint64_t id, float *w) {
    int dim = tb->cfg.dim;
    float lo = tb->cfg.init_lo, span = tb->cfg.init_hi - tb->cfg.init_lo;
    for (int j = 0; j < dim; j++) w[j] = lo + span * adt_rng_uniform(tb->init_key, id * (uint64_t)dim + (uint64_t)j);
}

static void row_init(const ps_tab *tb, int64_t r, uint64_t id) {
    init_weights(tb, id, tb->w + r * tb->cfg.dim);
    if (tb->n_state) memset(tb->st + r * tb->n_state, 0, (size_t)tb->n_state * sizeof *tb->st);
}

static int check_id(const ps_tab *tb, uint64_t id) {
    if (tb->cfg.rows && id >= (uint64_t)tb->cfg.rows)
        return adt_error(ADT_ERR_ARG, "ps table %s: row id %llu, expected an id in [0, %lld) (the table's declared "
                         "rows)", tb->cfg.name, (unsigned long long)id, (long long)tb->cfg.rows);
    return ADT_OK;
}

/* The row of id, created (and a victim evicted) when absent; NIL with the error set. */
static int64_t tab_get(ps_tab *tb, uint64_t id, int64_t now) {
    int64_t r = tab_find(tb, id);
    if (r != NIL) {
        touch(tb, (int32_t)r, now);
        return r;
    }
    if (check_id(tb, id)) return NIL;
    if (tb->free_list == NIL && tb->alloc < tb->cfg.capacity) tab_grow(tb);
    if (tb->free_list == NIL) {
        if (tb->cfg.full == ADT_PS_REFUSE)
            return adt_error(ADT_ERR_ARG, "ps table %s: full at its capacity of %lld rows (full-rule refuse): a new "
                             "row %llu does not fit; expected a larger capacity or the evict rule", tb->cfg.name,
                             (long long)tb->cfg.capacity, (unsigned long long)id), NIL;
        int32_t v = tb->head;
        if (tb->stamp[v] >= now)
            return adt_error(ADT_ERR_ARG, "ps table %s: capacity %lld rows, but step %lld alone touches more rows "
                             "than that; expected a capacity above the rows one step touches", tb->cfg.name,
                             (long long)tb->cfg.capacity, (long long)now), NIL;
        lru_unlink(tb, v);
        tab_delete_slot(tb, tb->ids[v]);
        tb->n_rows--;
        tb->stats.evicted++;
        tb->next[v] = tb->free_list;
        tb->free_list = v;
    }
    int32_t nr = tb->free_list;
    tb->free_list = tb->next[nr];
    tb->ids[nr] = id;
    row_init(tb, nr, id);
    tab_insert_slot(tb, id, nr);
    lru_append(tb, nr);
    tb->stamp[nr] = now;
    tb->n_rows++;
    tb->stats.created++;
    return nr;
}

/* ---- the store ------------------------------------------------------------------------------- */

static void tab_free(ps_tab *tb) {
    free(tb->slot), free(tb->ids), free(tb->w), free(tb->st), free(tb->stamp), free(tb->prev), free(tb->next);
}

static void tab_reset(ps_tab *tb, const adt_ps_table *cfg, const adt_ps_optim *store_optim, uint64_t seed) {
    tab_free(tb);
    memset(tb, 0, sizeof *tb);
    tb->cfg = *cfg;
    tb->optim = cfg->optim.lr > 0 ? cfg->optim : *store_optim;
    tb->init_key = adt_rng_key(seed, cfg->name);
    tb->n_state = adt_ps_optim_states(tb->optim.kind) * cfg->dim;
    tb->head = tb->tail = tb->free_list = NIL;
    tb->slot = adt_calloc(16, sizeof *tb->slot);
    tb->mask = 15;
}

int adt_ps_store_create(adt_ps_store **out, const adt_ps_table *tables, int n_tables, const adt_ps_optim *optim,
                        uint64_t seed) {
    *out = NULL;
    if (n_tables < 1 || n_tables > ADT_PS_MAX_TABLES)
        return adt_error(ADT_ERR_ARG, "ps store: %d tables, expected 1 .. %d", n_tables, ADT_PS_MAX_TABLES);
    for (int t = 0; t < n_tables; t++) {
        const adt_ps_table *c = &tables[t];
        if (c->dim < 1 || c->capacity < 1 || c->capacity > INT32_MAX - 1 || c->rows < 0 || !c->name[0])
            return adt_error(ADT_ERR_ARG, "ps store: table %d ('%s'): dim %d, capacity %lld, rows %lld; expected a "
                             "name, dim >= 1, capacity in [1, %d] and rows >= 0 (0: any id)", t, c->name, c->dim,
                             (long long)c->capacity, (long long)c->rows, INT32_MAX - 1);
    }
    for (int t = -1; t < n_tables; t++) {
        const adt_ps_optim *o = t < 0 ? optim : &tables[t].optim;
        if (t >= 0 && o->lr == 0) continue; /* the store's */
        if (o->lr <= 0 || (o->kind != ADT_PS_SGD && o->eps <= 0))
            return adt_error(ADT_ERR_ARG, "ps store: %s%s: learning rate %g and eps %g, expected lr > 0 (and eps > 0 "
                             "for adagrad and adam)", t < 0 ? "the optimizer" : "table ", t < 0 ? "" : tables[t].name,
                             o->lr, o->eps);
    }
    adt_ps_store *s = adt_calloc(1, sizeof *s);
    s->n_tables = n_tables;
    s->optim = *optim;
    s->seed = seed;
    s->tabs = adt_calloc((size_t)n_tables, sizeof *s->tabs);
    for (int t = 0; t < n_tables; t++) tab_reset(&s->tabs[t], &tables[t], optim, seed);
    *out = s;
    return ADT_OK;
}

void adt_ps_store_free(adt_ps_store *s) {
    if (!s) return;
    for (int t = 0; t < s->n_tables; t++) tab_free(&s->tabs[t]);
    free(s->tabs);
    free(s);
}

static int check_table(const adt_ps_store *s, int t) {
    if (t < 0 || t >= s->n_tables)
        return adt_error(ADT_ERR_ARG, "ps store: table %d, expected 0 .. %d", t, s->n_tables - 1);
    return ADT_OK;
}

/* Pull (g == NULL: rows copied to out) or push (the optimizer applied with g) of rows ids. */
static int store_rows(adt_ps_store *s, int t, const uint64_t *ids, int64_t n, float *out, const float *g,
                      int64_t step, int64_t now) {
    int rc;
    if ((rc = check_table(s, t))) return rc;
    ps_tab *tb = &s->tabs[t];
    int dim = tb->cfg.dim;
    adt_ps_optim o = tb->optim;
    if (s->lr > 0) o.lr = o.lr == s->optim.lr ? s->lr : o.lr * (s->lr / s->optim.lr);
    for (int64_t i = 0; i < n; i++) {
        int64_t r = tab_get(tb, ids[i], now);
        if (r == NIL) return ADT_ERR_ARG;
        if (g)
            adt_ps_optim_apply(&o, tb->w + r * dim, tb->n_state ? tb->st + r * tb->n_state : NULL, g + i * dim,
                               dim, step);
        else
            memcpy(out + i * dim, tb->w + r * dim, (size_t)dim * sizeof *out);
    }
    if (g) tb->stats.updates += n;
    else tb->stats.lookups += n;
    return ADT_OK;
}

int adt_ps_store_peek(const adt_ps_store *s, int t, const uint64_t *ids, int64_t n, float *out) {
    int rc;
    if ((rc = check_table(s, t))) return rc;
    const ps_tab *tb = &s->tabs[t];
    int dim = tb->cfg.dim;
    for (int64_t i = 0; i < n; i++) {
        if ((rc = check_id(tb, ids[i]))) return rc;
        int64_t r = tab_find(tb, ids[i]);
        if (r == NIL) init_weights(tb, ids[i], out + i * dim);
        else memcpy(out + i * dim, tb->w + r * dim, (size_t)dim * sizeof *out);
    }
    return ADT_OK;
}

int adt_ps_store_pull(adt_ps_store *s, int t, const uint64_t *ids, int64_t n, float *out, int64_t now) {
    return store_rows(s, t, ids, n, out, NULL, 0, now);
}

int adt_ps_store_push(adt_ps_store *s, int t, const uint64_t *ids, int64_t n, const float *g, int64_t step,
                      int64_t now) {
    return store_rows(s, t, ids, n, NULL, g, step, now);
}

void adt_ps_store_set_lr(adt_ps_store *s, float lr) { s->lr = lr > 0 ? lr : 0; }

const float *adt_ps_store_row(const adt_ps_store *s, int t, uint64_t id, const float **state) {
    if (state) *state = NULL;
    if (t < 0 || t >= s->n_tables) return NULL;
    const ps_tab *tb = &s->tabs[t];
    int64_t r = tab_find(tb, id);
    if (r == NIL) return NULL;
    if (state && tb->n_state) *state = tb->st + r * tb->n_state;
    return tb->w + r * tb->cfg.dim;
}

void adt_ps_store_get_stats(const adt_ps_store *s, int t, adt_ps_store_stats *st) {
    memset(st, 0, sizeof *st);
    if (t < 0 || t >= s->n_tables) return;
    *st = s->tabs[t].stats;
    st->rows = s->tabs[t].n_rows;
}

/* ---- save and load ----------------------------------------------------------------------------- */

static const char *optim_name(adt_ps_optim_kind k) {
    return k == ADT_PS_ADAM ? "adam" : k == ADT_PS_ADAGRAD ? "adagrad" : "sgd";
}

int adt_ps_store_save(const adt_ps_store *s, const char *path) {
    adt_st_writer *wr = adt_st_writer_create();
    adt_st_writer_set_metadata(wr, "adtrain.ps", "1");
    adt_st_writer_set_metadata(wr, "optimizer", optim_name(s->optim.kind));
    int rc = ADT_OK;
    for (int t = 0; t < s->n_tables && !rc; t++) {
        const ps_tab *tb = &s->tabs[t];
        int64_t n = tb->n_rows, dim = tb->cfg.dim;
        uint64_t *ids = adt_malloc((size_t)(n ? n : 1) * sizeof *ids);
        float *w = adt_malloc((size_t)(n ? n : 1) * (size_t)dim * sizeof *w);
        float *st = tb->n_state ? adt_malloc((size_t)(n ? n : 1) * (size_t)tb->n_state * sizeof *st) : NULL;
        int64_t k = 0;
        for (int32_t r = tb->head; r != NIL; r = tb->next[r], k++) {
            ids[k] = tb->ids[r];
            memcpy(w + k * dim, tb->w + (int64_t)r * dim, (size_t)dim * sizeof *w);
            if (st) memcpy(st + k * tb->n_state, tb->st + (int64_t)r * tb->n_state, (size_t)tb->n_state * sizeof *st);
        }
        char name[128];
        snprintf(name, sizeof name, "%s.ids", tb->cfg.name);
        rc = adt_st_writer_add_copy(wr, name, ADT_ST_U64, 1, (int64_t[]){n}, ids);
        snprintf(name, sizeof name, "%s.w", tb->cfg.name);
        if (!rc) rc = adt_st_writer_add_copy(wr, name, ADT_ST_F32, 2, (int64_t[]){n, dim}, w);
        snprintf(name, sizeof name, "%s.state", tb->cfg.name);
        if (!rc && st) rc = adt_st_writer_add_copy(wr, name, ADT_ST_F32, 2, (int64_t[]){n, tb->n_state}, st);
        free(ids), free(w), free(st);
    }
    if (!rc) rc = adt_st_writer_save(wr, path);
    adt_st_writer_free(wr);
    return rc;
}

static int load_table(adt_ps_store *s, ps_tab *tb, const adt_st_file *f, const char *path) {
    char name[128];
    snprintf(name, sizeof name, "%s.ids", tb->cfg.name);
    const adt_st_tensor *ti = adt_st_find(f, name);
    if (!ti || ti->dtype != ADT_ST_U64 || ti->ndim != 1)
        return adt_error(ADT_ERR_FORMAT, "%s: no U64 tensor '%s' of one axis, expected one per table of the store",
                         path, name);
    int64_t n = ti->shape[0], dim = tb->cfg.dim;
    if (n > tb->cfg.capacity)
        return adt_error(ADT_ERR_FORMAT, "%s: table %s holds %lld rows, above its capacity of %lld here", path,
                         tb->cfg.name, (long long)n, (long long)tb->cfg.capacity);
    float *w = adt_malloc((size_t)(n ? n : 1) * (size_t)dim * sizeof *w);
    float *st = tb->n_state ? adt_malloc((size_t)(n ? n : 1) * (size_t)tb->n_state * sizeof *st) : NULL;
    snprintf(name, sizeof name, "%s.w", tb->cfg.name);
    int rc = adt_st_read_f32(f, name, w, 2, (int64_t[]){n, dim});
    snprintf(name, sizeof name, "%s.state", tb->cfg.name);
    if (!rc && st) rc = adt_st_read_f32(f, name, st, 2, (int64_t[]){n, tb->n_state});
    if (!rc) {
        adt_ps_table cfg = tb->cfg;
        adt_ps_store_stats keep = tb->stats;
        tab_reset(tb, &cfg, &s->optim, s->seed);
        tb->stats = keep;
        for (int64_t k = 0; k < n && !rc; k++) {
            uint64_t id;
            memcpy(&id, (const char *)ti->data + k * 8, 8);
            if (tab_find(tb, id) != NIL) {
                rc = adt_error(ADT_ERR_FORMAT, "%s: table %s lists row %llu twice", path, tb->cfg.name,
                               (unsigned long long)id);
                break;
            }
            int64_t r = tab_get(tb, id, -1);
            if (r == NIL) {
                rc = ADT_ERR_FORMAT;
                break;
            }
            tb->stats.created--;
            memcpy(tb->w + r * dim, w + k * dim, (size_t)dim * sizeof *w);
            if (st) memcpy(tb->st + r * tb->n_state, st + k * tb->n_state, (size_t)tb->n_state * sizeof *st);
        }
    }
    free(w), free(st);
    return rc;
}

int adt_ps_store_load(adt_ps_store *s, const char *path) {
    adt_st_file *f;
    int rc = adt_st_open(&f, path);
    if (rc) return rc;
    const char *opt = adt_st_metadata(f, "optimizer");
    if (!adt_st_metadata(f, "adtrain.ps") || !opt || strcmp(opt, optim_name(s->optim.kind))) {
        rc = adt_error(ADT_ERR_FORMAT, "%s: a parameter-server shard with optimizer '%s', expected metadata "
                       "adtrain.ps and optimizer '%s'", path, opt ? opt : "(none)", optim_name(s->optim.kind));
    }
    /* every tensor must belong to a table of the store */
    for (int i = 0; !rc && i < adt_st_count(f); i++) {
        const char *nm = adt_st_get(f, i)->name;
        int known = 0;
        for (int t = 0; t < s->n_tables && !known; t++) {
            size_t L = strlen(s->tabs[t].cfg.name);
            known = !strncmp(nm, s->tabs[t].cfg.name, L) &&
                    (!strcmp(nm + L, ".ids") || !strcmp(nm + L, ".w") || !strcmp(nm + L, ".state"));
        }
        if (!known) rc = adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' belongs to no table of this store", path, nm);
    }
    for (int t = 0; t < s->n_tables && !rc; t++) rc = load_table(s, &s->tabs[t], f, path);
    adt_st_close(f);
    return rc;
}
