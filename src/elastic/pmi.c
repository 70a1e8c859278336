/*
 * pmi.c - the PMI-1 server's protocol core: request parsing, replies, the key-value store and
 * barriers, over byte streams (no sockets here, so the fuzzer drives exactly what runs).
 *
 * Wire protocol (Flux RFC 13, as MPICH's simple PMI client speaks it): one request per line,
 * space-separated key=value words, "cmd=<name>" among them; the server answers each request with
 * one line, except barrier_in (answered when every rank is in) and abort (never answered: the
 * process manager is expected to kill the job). TCP clients first send
 * "cmd=initack pmiid=<rank>" and get "cmd=initack", "cmd=set size=", "cmd=set rank=",
 * "cmd=set debug=" back.
 *
 * Errors come in two kinds. A request that parses but cannot be honoured (unknown key,
 * duplicate put, value too long) gets rc=-1 and the connection lives on, as Hydra does. A line
 * that is not the protocol (no cmd=, bad bytes, a request out of order, over ADT_PMI_LINE_MAX)
 * kills the connection: the client and we no longer agree on the state, and a rank that cannot
 * talk PMI cannot take part in the world anyway.
 */
#include "adtrain/agent.h"
#include "adtrain/base.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* A client that stops reading its replies must not make us buffer without bound. */
#define PMI_OUT_MAX ((size_t)1 << 20)
/* Bounds on the store: a world's puts are a few per rank; anything near these is abuse. */
#define PMI_KV_MAX_ENTRIES (1 << 20)
#define PMI_KV_MAX_BYTES ((size_t)64 << 20)
#define PMI_MAX_WORDS 16

typedef enum {
    CONN_FREE = 0,
    CONN_NEW,   /* open; the rank may still be unknown (TCP) */
    CONN_INIT,  /* init answered                              */
    CONN_FINAL, /* finalize answered: nothing more may come   */
    CONN_ABORT, /* abort received: nothing more may come      */
    CONN_DEAD,  /* protocol error                             */
} conn_state;

typedef struct pmi_conn {
    conn_state state;
    int rank;       /* global rank or -1 */
    int in_barrier;
    int nreq;       /* requests handled, for messages */
    char *in;       /* the partial line, ADT_PMI_LINE_MAX + 1 bytes */
    size_t in_len;
    char *out;
    size_t out_len, out_cap;
} pmi_conn;

struct adt_pmi_server {
    adt_pmi_config cfg;
    char *kvsname, *mapping;
    pmi_conn *conns;
    int n_conns;
    int *rank_conn;                 /* local rank -> conn id or -1 */
    adt_pmi_rank_state *rank_state; /* local rank -> state        */
    /* key-value store: entries in put order, open-addressing index (slot = entry + 1) */
    char **keys, **vals;
    int n_kv, cap_kv;
    size_t kv_bytes;
    int *slots;
    size_t n_slots;
    /* barrier */
    int n_in_barrier, epoch, barrier_pending, kv_mark;
};

/* ---------------------------------------------------------------------------------------------
 * Key-value store
 */
static uint64_t fnv1a(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static int kv_find(const adt_pmi_server *s, const char *key) {
    if (!s->n_slots) return -1;
    for (size_t i = fnv1a(key) & (s->n_slots - 1);; i = (i + 1) & (s->n_slots - 1)) {
        int e = s->slots[i];
        if (!e) return -1;
        if (!strcmp(s->keys[e - 1], key)) return e - 1;
    }
}

static void kv_index(adt_pmi_server *s, int e) {
    size_t i = fnv1a(s->keys[e]) & (s->n_slots - 1);
    while (s->slots[i]) i = (i + 1) & (s->n_slots - 1);
    s->slots[i] = e + 1;
}

/* Adds key=value; the caller has checked the key is new. Returns 0, or -1 if the store is full. */
static int kv_add(adt_pmi_server *s, const char *key, size_t kl, const char *val, size_t vl) {
    if (s->n_kv >= PMI_KV_MAX_ENTRIES || s->kv_bytes + kl + vl + 2 > PMI_KV_MAX_BYTES) return -1;
    if (s->n_kv == s->cap_kv) {
        s->cap_kv = s->cap_kv ? 2 * s->cap_kv : 64;
        s->keys = adt_realloc(s->keys, (size_t)s->cap_kv * sizeof *s->keys);
        s->vals = adt_realloc(s->vals, (size_t)s->cap_kv * sizeof *s->vals);
    }
    char *k = adt_malloc(kl + 1), *v = adt_malloc(vl + 1);
    memcpy(k, key, kl), k[kl] = 0;
    memcpy(v, val, vl), v[vl] = 0;
    s->keys[s->n_kv] = k, s->vals[s->n_kv] = v;
    s->kv_bytes += kl + vl + 2;
    s->n_kv++;
    /* keep the index at most half full */
    if ((size_t)s->n_kv * 2 > s->n_slots) {
        free(s->slots);
        s->n_slots = s->n_slots ? 2 * s->n_slots : 256;
        s->slots = adt_calloc(s->n_slots, sizeof *s->slots);
        for (int e = 0; e < s->n_kv; e++) kv_index(s, e);
    } else {
        kv_index(s, s->n_kv - 1);
    }
    return 0;
}

static int visible(unsigned char ch) { return ch >= 0x21 && ch <= 0x7e; }

int adt_pmi_kvs_put(adt_pmi_server *s, const char *key, const char *value) {
    size_t kl = strlen(key), vl = strlen(value);
    if (kl == 0 || kl >= ADT_PMI_KEYLEN_MAX)
        return adt_error(ADT_ERR_ARG, "PMI key '%.80s': expected 1 to %d characters", key,
                         ADT_PMI_KEYLEN_MAX - 1);
    if (vl >= ADT_PMI_VALLEN_MAX)
        return adt_error(ADT_ERR_ARG, "PMI value of key '%s': %zu characters, at most %d", key, vl,
                         ADT_PMI_VALLEN_MAX - 1);
    for (size_t i = 0; i < kl; i++)
        if (!visible((unsigned char)key[i]) || key[i] == '=')
            return adt_error(ADT_ERR_ARG, "PMI key '%.80s': byte %zu is not a visible character "
                             "other than '='", key, i);
    for (size_t i = 0; i < vl; i++)
        if (!visible((unsigned char)value[i]))
            return adt_error(ADT_ERR_ARG, "PMI value of key '%s': byte %zu is not visible ASCII",
                             key, i);
    if (kv_find(s, key) >= 0)
        return adt_error(ADT_ERR_ARG, "PMI key '%s' was already put", key);
    if (kv_add(s, key, kl, value, vl))
        return adt_error(ADT_ERR_NOMEM, "PMI key-value store is full (%d entries, %zu bytes)",
                         s->n_kv, s->kv_bytes);
    return ADT_OK;
}

const char *adt_pmi_kvs_get(const adt_pmi_server *s, const char *key) {
    int e = kv_find(s, key);
    return e < 0 ? NULL : s->vals[e];
}

int adt_pmi_kvs_count(const adt_pmi_server *s) { return s->n_kv; }

void adt_pmi_kvs_entry(const adt_pmi_server *s, int i, const char **key, const char **value) {
    ADT_ASSERT(i >= 0 && i < s->n_kv);
    *key = s->keys[i];
    *value = s->vals[i];
}

/* ---------------------------------------------------------------------------------------------
 * Server and connections
 */
int adt_pmi_process_mapping(char *buf, size_t cap, int n_nodes, const int *ranks_per_node) {
    if (n_nodes < 1) return adt_error(ADT_ERR_ARG, "process mapping: %d nodes, expected >= 1", n_nodes);
    size_t len = (size_t)snprintf(buf, cap, "(vector");
    for (int i = 0; i < n_nodes;) {
        int j = i;
        if (ranks_per_node[i] < 1)
            return adt_error(ADT_ERR_ARG, "process mapping: node %d has %d ranks, expected >= 1",
                             i, ranks_per_node[i]);
        while (j + 1 < n_nodes && ranks_per_node[j + 1] == ranks_per_node[i]) j++;
        len += (size_t)snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0,
                                ",(%d,%d,%d)", i, j - i + 1, ranks_per_node[i]);
        i = j + 1;
    }
    len += (size_t)snprintf(buf + (len < cap ? len : cap), len < cap ? cap - len : 0, ")");
    if (len >= cap)
        return adt_error(ADT_ERR_ARG, "process mapping needs %zu bytes, buffer has %zu", len + 1, cap);
    return ADT_OK;
}

int adt_pmi_server_create(adt_pmi_server **out, const adt_pmi_config *cfg) {
    *out = NULL;
    int local = cfg->local_size ? cfg->local_size : cfg->world_size;
    if (cfg->world_size < 1)
        return adt_error(ADT_ERR_ARG, "PMI server: world_size %d, expected >= 1", cfg->world_size);
    if (local < 1 || cfg->rank_offset < 0 || cfg->rank_offset + local > cfg->world_size)
        return adt_error(ADT_ERR_ARG, "PMI server: ranks [%d, %d) do not fit a world of %d",
                         cfg->rank_offset, cfg->rank_offset + local, cfg->world_size);
    const char *name = cfg->kvsname ? cfg->kvsname : "adt_kvs";
    size_t nl = strlen(name);
    int bad = nl == 0 || nl >= ADT_PMI_KVSNAME_MAX;
    for (size_t i = 0; i < nl; i++) bad |= !visible((unsigned char)name[i]) || name[i] == '=';
    if (bad)
        return adt_error(ADT_ERR_ARG, "PMI kvsname '%.80s': expected 1 to %d visible characters "
                         "without '='", name, ADT_PMI_KVSNAME_MAX - 1);
    char map[ADT_PMI_VALLEN_MAX];
    if (cfg->process_mapping) {
        if (strlen(cfg->process_mapping) >= sizeof map)
            return adt_error(ADT_ERR_ARG, "PMI process mapping longer than %zu bytes", sizeof map - 1);
        snprintf(map, sizeof map, "%s", cfg->process_mapping);
    } else {
        int rc = adt_pmi_process_mapping(map, sizeof map, 1, &cfg->world_size);
        if (rc) return rc;
    }
    adt_pmi_server *s = adt_calloc(1, sizeof *s);
    s->cfg = *cfg;
    s->cfg.local_size = local;
    if (!s->cfg.universe_size) s->cfg.universe_size = cfg->world_size;
    s->kvsname = adt_strdup(name);
    s->mapping = adt_strdup(map);
    s->cfg.kvsname = s->kvsname;
    s->cfg.process_mapping = s->mapping;
    s->rank_conn = adt_malloc((size_t)local * sizeof *s->rank_conn);
    s->rank_state = adt_calloc((size_t)local, sizeof *s->rank_state);
    for (int i = 0; i < local; i++) s->rank_conn[i] = -1;
    *out = s;
    return ADT_OK;
}

void adt_pmi_server_free(adt_pmi_server *s) {
    if (!s) return;
    for (int i = 0; i < s->n_conns; i++) free(s->conns[i].in), free(s->conns[i].out);
    for (int i = 0; i < s->n_kv; i++) free(s->keys[i]), free(s->vals[i]);
    free(s->conns), free(s->keys), free(s->vals), free(s->slots);
    free(s->rank_conn), free(s->rank_state), free(s->kvsname), free(s->mapping);
    free(s);
}

static int local_of(const adt_pmi_server *s, int rank) {
    int l = rank - s->cfg.rank_offset;
    return l >= 0 && l < s->cfg.local_size ? l : -1;
}

static pmi_conn *conn_get(adt_pmi_server *s, int id) {
    return id >= 0 && id < s->n_conns && s->conns[id].state != CONN_FREE ? &s->conns[id] : NULL;
}

static void emit(adt_pmi_server *s, adt_pmi_event_kind kind, int conn, int rank, int code) {
    if (!s->cfg.on_event) return;
    adt_pmi_event ev = {.kind = kind, .conn = conn, .rank = rank, .code = code};
    s->cfg.on_event(s->cfg.ctx, &ev);
}

static void attach(adt_pmi_server *s, int id, int rank) {
    int l = local_of(s, rank);
    s->conns[id].rank = rank;
    s->rank_conn[l] = id;
    s->rank_state[l] = ADT_PMI_RANK_CONNECTED;
}

int adt_pmi_conn_open(adt_pmi_server *s, int rank) {
    if (rank >= 0) {
        int l = local_of(s, rank);
        if (l < 0)
            return adt_error(ADT_ERR_ARG, "PMI: rank %d is not served here (ranks %d..%d)", rank,
                             s->cfg.rank_offset, s->cfg.rank_offset + s->cfg.local_size - 1);
        if (s->rank_conn[l] >= 0 || s->rank_state[l] != ADT_PMI_RANK_NONE)
            return adt_error(ADT_ERR_ARG, "PMI: rank %d already has a connection", rank);
    }
    int id = 0;
    while (id < s->n_conns && s->conns[id].state != CONN_FREE) id++;
    if (id == s->n_conns) {
        s->conns = adt_realloc(s->conns, (size_t)(s->n_conns + 1) * sizeof *s->conns);
        memset(&s->conns[id], 0, sizeof s->conns[id]);
        s->n_conns++;
    }
    pmi_conn *c = &s->conns[id];
    char *in = c->in, *outb = c->out;
    size_t out_cap = c->out_cap;
    memset(c, 0, sizeof *c);
    c->in = in ? in : adt_malloc(ADT_PMI_LINE_MAX + 1);
    c->out = outb, c->out_cap = out_cap;
    c->state = CONN_NEW;
    c->rank = -1;
    if (rank >= 0) attach(s, id, rank);
    return id;
}

void adt_pmi_conn_close(adt_pmi_server *s, int id) {
    pmi_conn *c = conn_get(s, id);
    if (!c) return;
    if (c->in_barrier) s->n_in_barrier--;
    int l = c->rank >= 0 ? local_of(s, c->rank) : -1;
    if (l >= 0) {
        s->rank_conn[l] = -1;
        adt_pmi_rank_state *st = &s->rank_state[l];
        /* EOF before init is a worker that does not use PMI (yet); after init it is a loss */
        if (*st == ADT_PMI_RANK_INIT) *st = ADT_PMI_RANK_LOST;
        else if (*st == ADT_PMI_RANK_CONNECTED) *st = ADT_PMI_RANK_NONE;
    }
    c->state = CONN_FREE;
    c->in_len = c->out_len = 0;
    c->in_barrier = 0;
}

int adt_pmi_conn_rank(const adt_pmi_server *s, int id) {
    return id >= 0 && id < s->n_conns && s->conns[id].state != CONN_FREE ? s->conns[id].rank : -1;
}

adt_pmi_rank_state adt_pmi_rank_state_of(const adt_pmi_server *s, int rank) {
    int l = local_of(s, rank);
    return l < 0 ? ADT_PMI_RANK_NONE : s->rank_state[l];
}

size_t adt_pmi_conn_output(adt_pmi_server *s, int id, const char **data) {
    pmi_conn *c = conn_get(s, id);
    *data = c ? c->out : NULL;
    return c ? c->out_len : 0;
}

void adt_pmi_conn_consume(adt_pmi_server *s, int id, size_t n) {
    pmi_conn *c = conn_get(s, id);
    if (!c || !c->out_len) return;
    if (n > c->out_len) n = c->out_len;
    memmove(c->out, c->out + n, c->out_len - n);
    c->out_len -= n;
}

/* ---------------------------------------------------------------------------------------------
 * Requests
 */
typedef struct {
    const char *key, *val;
} word;

typedef struct {
    adt_pmi_server *s;
    int id;
    pmi_conn *c;
    const char *line; /* for messages, as received */
    word w[PMI_MAX_WORDS];
    int nw;
} request;

static const char *req_get(const request *r, const char *key) {
    for (int i = 0; i < r->nw; i++)
        if (!strcmp(r->w[i].key, key)) return r->w[i].val;
    return NULL;
}

/* A protocol error: the message names the connection, its rank, the request number and an
 * excerpt of the line (non-printable bytes shown as '?'). */
static int req_fail(request *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int req_fail(request *r, const char *fmt, ...) {
    char why[256], ex[72];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    size_t n = 0;
    for (const char *p = r->line; *p && n < sizeof ex - 4; p++) ex[n++] = (*p >= 0x20 && *p < 0x7f) ? *p : '?';
    if (r->line[n]) ex[n++] = '.', ex[n++] = '.', ex[n++] = '.';
    ex[n] = 0;
    r->c->state = CONN_DEAD;
    int l = r->c->rank >= 0 ? local_of(r->s, r->c->rank) : -1;
    if (l >= 0) r->s->rank_state[l] = ADT_PMI_RANK_LOST;
    char who[48];
    if (r->c->rank >= 0) snprintf(who, sizeof who, "rank %d", r->c->rank);
    else snprintf(who, sizeof who, "connection %d (no rank yet)", r->id);
    return adt_error(ADT_ERR_FORMAT, "PMI %s, request %d \"%s\": %s", who, r->c->nreq, ex, why);
}

static int reply(request *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int reply(request *r, const char *fmt, ...) {
    pmi_conn *c = r->c;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = c->out_cap - c->out_len;
        int n = vsnprintf(c->out ? c->out + c->out_len : NULL, room, fmt, ap);
        va_end(ap);
        ADT_ASSERT(n >= 0);
        if ((size_t)n < room) {
            c->out_len += (size_t)n;
            break;
        }
        if (c->out_len + (size_t)n + 1 > PMI_OUT_MAX)
            return req_fail(r, "the client is not reading its replies (over %zu bytes pending)",
                            PMI_OUT_MAX);
        size_t cap = c->out_cap ? c->out_cap : 256;
        while (cap < c->out_len + (size_t)n + 1) cap *= 2;
        c->out = adt_realloc(c->out, cap);
        c->out_cap = cap;
    }
    return ADT_OK;
}

/* Splits the line (NUL-terminated, no newline) into key=value words in place. */
static int req_parse(request *r, char *p) {
    const char *base = p;
    r->nw = 0;
    for (;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        char *start = p, *eq = NULL;
        for (; *p && *p != ' ' && *p != '\t'; p++) {
            if (!visible((unsigned char)*p))
                return req_fail(r, "byte 0x%02x at column %d is not visible ASCII",
                                (unsigned char)*p, (int)(p - base) + 1);
            if (*p == '=' && !eq) eq = p;
        }
        if (!eq || eq == start)
            return req_fail(r, "word %d is not key=value", r->nw + 1);
        if (r->nw == PMI_MAX_WORDS)
            return req_fail(r, "more than %d key=value words", PMI_MAX_WORDS);
        if (*p) *p++ = 0;
        *eq = 0;
        for (int i = 0; i < r->nw; i++)
            if (!strcmp(r->w[i].key, start)) return req_fail(r, "key '%s' given twice", start);
        r->w[r->nw].key = start;
        r->w[r->nw].val = eq + 1;
        r->nw++;
    }
    if (!r->nw) return req_fail(r, "empty request, expected cmd=<command>");
    return ADT_OK;
}

/* Parses a decimal int in [lo, hi]; -1 if it is not one. */
static int parse_int(const char *v, long lo, long hi, int *out) {
    if (!v || !*v) return -1;
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < lo || x > hi) return -1;
    *out = (int)x;
    return 0;
}

static void barrier_release(adt_pmi_server *s) {
    s->barrier_pending = 0;
    /* the next barrier ships only puts made after this one: merged remote entries are not ours */
    s->kv_mark = s->n_kv;
    int released = s->epoch++;
    s->n_in_barrier = 0;
    for (int i = 0; i < s->n_conns; i++) {
        pmi_conn *c = &s->conns[i];
        if (c->state == CONN_FREE || !c->in_barrier) continue;
        c->in_barrier = 0;
        request r = {.s = s, .id = i, .c = c, .line = "barrier_in"};
        /* cannot overflow in practice: a rank in a barrier has no other reply pending */
        (void)reply(&r, "cmd=barrier_out rc=0\n");
    }
    emit(s, ADT_PMI_EV_BARRIER, -1, -1, released);
}

int adt_pmi_server_barrier_release(adt_pmi_server *s) {
    if (!s->barrier_pending)
        return adt_error(ADT_ERR_STATE, "PMI barrier release: no barrier is waiting for release");
    barrier_release(s);
    return ADT_OK;
}

static void barrier_enter(adt_pmi_server *s, pmi_conn *c) {
    c->in_barrier = 1;
    if (++s->n_in_barrier < s->cfg.local_size) return;
    if (s->cfg.on_barrier) {
        s->barrier_pending = 1;
        s->cfg.on_barrier(s->cfg.ctx, s->epoch, s->kv_mark);
    } else {
        barrier_release(s);
    }
}

static int do_initack(request *r) {
    adt_pmi_server *s = r->s;
    int rank;
    if (parse_int(req_get(r, "pmiid"), 0, 1 << 30, &rank))
        return req_fail(r, "initack needs pmiid=<rank>");
    int l = local_of(s, rank);
    if (l < 0)
        return req_fail(r, "pmiid %d is not a rank served here (%d..%d)", rank, s->cfg.rank_offset,
                        s->cfg.rank_offset + s->cfg.local_size - 1);
    if (s->rank_conn[l] >= 0 || s->rank_state[l] != ADT_PMI_RANK_NONE)
        return req_fail(r, "rank %d is already connected", rank);
    attach(s, r->id, rank);
    emit(s, ADT_PMI_EV_IDENTIFY, r->id, rank, 0);
    return reply(r, "cmd=initack\ncmd=set size=%d\ncmd=set rank=%d\ncmd=set debug=0\n",
                 s->cfg.world_size, rank);
}

static int do_put(request *r) {
    const char *kvs = req_get(r, "kvsname"), *key = req_get(r, "key"), *val = req_get(r, "value");
    if (!kvs || !key || !val) return req_fail(r, "put needs kvsname=, key= and value=");
    const char *err = NULL;
    size_t kl = strlen(key), vl = strlen(val);
    if (strcmp(kvs, r->s->kvsname)) err = "unknown_kvsname";
    else if (kl == 0) err = "empty_key"; /* adt_pmi_kvs_put refuses it too: no get could name it */
    else if (kl >= ADT_PMI_KEYLEN_MAX) err = "key_too_long";
    else if (vl >= ADT_PMI_VALLEN_MAX) err = "value_too_long";
    else if (!strncmp(key, "PMI_", 4)) err = "reserved_key";
    else if (kv_find(r->s, key) >= 0) err = "duplicate_key";
    else if (kv_add(r->s, key, kl, val, vl)) err = "kvs_full";
    if (err) return reply(r, "cmd=put_result rc=-1 msg=%s\n", err);
    return reply(r, "cmd=put_result rc=0 msg=success\n");
}

static int do_get(request *r) {
    const char *kvs = req_get(r, "kvsname"), *key = req_get(r, "key");
    if (!kvs || !key) return req_fail(r, "get needs kvsname= and key=");
    if (strcmp(kvs, r->s->kvsname)) return reply(r, "cmd=get_result rc=-1 msg=unknown_kvsname\n");
    const char *v = !strcmp(key, "PMI_process_mapping") ? r->s->mapping : adt_pmi_kvs_get(r->s, key);
    /* RFC 13: a missing key in the reserved PMI_ namespace reads as an empty value */
    if (!v && !strncmp(key, "PMI_", 4)) v = "";
    if (!v) return reply(r, "cmd=get_result rc=-1 msg=key_not_found\n");
    return reply(r, "cmd=get_result rc=0 msg=success value=%s\n", v);
}

static int handle_line(adt_pmi_server *s, int id, char *line) {
    pmi_conn *c = &s->conns[id];
    request r = {.s = s, .id = id, .c = c, .line = line};
    char copy[ADT_PMI_LINE_MAX + 1];
    snprintf(copy, sizeof copy, "%s", line);
    r.line = copy;
    c->nreq++;
    int rc = req_parse(&r, line);
    if (rc) return rc;
    if (req_get(&r, "mcmd")) return req_fail(&r, "spawn (mcmd=) is not supported");
    const char *cmd = req_get(&r, "cmd");
    if (!cmd) return req_fail(&r, "no cmd=<command> in the request");
    if (c->in_barrier) return req_fail(&r, "request while waiting in a barrier");
    if (c->state == CONN_FINAL) return req_fail(&r, "request after finalize");
    if (c->state == CONN_ABORT) return req_fail(&r, "request after abort");

    if (c->rank < 0) {
        if (strcmp(cmd, "initack")) return req_fail(&r, "expected cmd=initack pmiid=<rank> first");
        return do_initack(&r);
    }
    if (!strcmp(cmd, "initack")) return req_fail(&r, "initack on a connection that has a rank");
    if (!strcmp(cmd, "abort")) {
        int code = 1;
        const char *v = req_get(&r, "exitcode");
        if (v && parse_int(v, -2147483647L - 1, 2147483647L, &code))
            return req_fail(&r, "abort exitcode '%s' is not an integer", v);
        c->state = CONN_ABORT;
        s->rank_state[local_of(s, c->rank)] = ADT_PMI_RANK_ABORTED;
        emit(s, ADT_PMI_EV_ABORT, id, c->rank, code);
        return ADT_OK;
    }
    if (!strcmp(cmd, "init")) {
        if (c->state != CONN_NEW) return req_fail(&r, "init sent twice");
        const char *v = req_get(&r, "pmi_version");
        if (!v || strcmp(v, "1"))
            return req_fail(&r, "pmi_version=%s, only PMI version 1 is served", v ? v : "(none)");
        c->state = CONN_INIT;
        s->rank_state[local_of(s, c->rank)] = ADT_PMI_RANK_INIT;
        emit(s, ADT_PMI_EV_INIT, id, c->rank, 0);
        return reply(&r, "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n");
    }
    static const char *const known[] = {"get_maxes", "get_appnum", "get_my_kvsname",
                                        "get_universe_size", "put", "get", "barrier_in",
                                        "finalize", "publish_name", "unpublish_name",
                                        "lookup_name"};
    int k = -1;
    for (int i = 0; i < (int)(sizeof known / sizeof *known); i++)
        if (!strcmp(cmd, known[i])) k = i;
    if (k < 0) return req_fail(&r, "unknown command '%.40s'", cmd);
    if (c->state != CONN_INIT) return req_fail(&r, "'%s' before init", cmd);
    switch (k) {
    case 0:
        return reply(&r, "cmd=maxes rc=0 kvsname_max=%d keylen_max=%d vallen_max=%d\n",
                     ADT_PMI_KVSNAME_MAX, ADT_PMI_KEYLEN_MAX, ADT_PMI_VALLEN_MAX);
    case 1: return reply(&r, "cmd=appnum rc=0 appnum=%d\n", s->cfg.appnum);
    case 2: return reply(&r, "cmd=my_kvsname rc=0 kvsname=%s\n", s->kvsname);
    case 3: return reply(&r, "cmd=universe_size rc=0 size=%d\n", s->cfg.universe_size);
    case 4: return do_put(&r);
    case 5: return do_get(&r);
    case 6: barrier_enter(s, c); return ADT_OK;
    case 7:
        c->state = CONN_FINAL;
        s->rank_state[local_of(s, c->rank)] = ADT_PMI_RANK_FINALIZED;
        emit(s, ADT_PMI_EV_FINALIZE, id, c->rank, 0);
        return reply(&r, "cmd=finalize_ack rc=0\n");
    case 8: return reply(&r, "cmd=publish_result rc=-1 msg=not_supported\n");
    case 9: return reply(&r, "cmd=unpublish_result rc=-1 msg=not_supported\n");
    default: return reply(&r, "cmd=lookup_result rc=-1 msg=not_supported\n");
    }
}

int adt_pmi_conn_feed(adt_pmi_server *s, int id, const char *data, size_t n) {
    pmi_conn *c = conn_get(s, id);
    if (!c) return adt_error(ADT_ERR_ARG, "PMI: no open connection %d", id);
    if (c->state == CONN_DEAD)
        return adt_error(ADT_ERR_STATE, "PMI connection %d already failed; close it", id);
    while (n) {
        const char *nl = memchr(data, '\n', n);
        size_t take = nl ? (size_t)(nl - data) : n;
        if (c->in_len + take > ADT_PMI_LINE_MAX) {
            c->in[c->in_len < 60 ? c->in_len : 60] = 0;
            request r = {.s = s, .id = id, .c = c, .line = c->in};
            c->nreq++;
            return req_fail(&r, "line longer than %d bytes", ADT_PMI_LINE_MAX);
        }
        const char *nul = memchr(data, 0, take);
        if (nul) {
            /* a NUL would hide the rest of the line from the parser */
            memcpy(c->in + c->in_len, data, (size_t)(nul - data));
            c->in[c->in_len + (size_t)(nul - data)] = 0;
            request r = {.s = s, .id = id, .c = c, .line = c->in};
            c->nreq++;
            return req_fail(&r, "NUL byte at column %zu", c->in_len + (size_t)(nul - data) + 1);
        }
        memcpy(c->in + c->in_len, data, take);
        c->in_len += take;
        data += take, n -= take;
        if (!nl) break;
        data++, n--;
        c->in[c->in_len] = 0;
        c->in_len = 0;
        int rc = handle_line(s, id, c->in);
        c = &s->conns[id]; /* callbacks do not open connections, but stay safe */
        if (rc) return rc;
    }
    return ADT_OK;
}
