/*
 * localize.c - n-D signatures (products of the ops' 1-D ones) and the localisation of a global
 * node for one mesh coordinate: its input and output blocks, the attributes its op's localize
 * rule rewrites for them, and the local graph pieces built from that.
 *
 * The shape check is what makes a product signature usable on a given mesh and shape: a
 * signature can be right in general and still not fit a particular uneven split (a reshape
 * that merges axes maps an even split of one onto an uneven split of the other), so every
 * coordinate's local op must produce exactly the output blocks the signature promises.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

#define MAX_SIGS_1D 64

void adt_nd_sig_product(const adt_sbp_sig *sigs1d, const int *choice, int mesh_ndim, int n_in,
                        int n_out, adt_nd_sig *out) {
    memset(out, 0, sizeof *out);
    out->ndim = mesh_ndim;
    for (int i = 0; i < n_in; i++) out->in[i].ndim = mesh_ndim;
    for (int k = 0; k < n_out; k++) out->out[k].ndim = mesh_ndim;
    for (int m = 0; m < mesh_ndim; m++) {
        const adt_sbp_sig *s = &sigs1d[choice[m]];
        for (int i = 0; i < n_in; i++) out->in[i].s[m] = s->in[i];
        for (int k = 0; k < n_out; k++) out->out[k].s[m] = s->out[k];
    }
}

adt_nd_sig adt_nd_sig_all_b(int mesh_ndim, int n_in, int n_out) {
    adt_nd_sig s;
    memset(&s, 0, sizeof s);
    s.ndim = mesh_ndim;
    for (int i = 0; i < n_in; i++) s.in[i].ndim = mesh_ndim;
    for (int k = 0; k < n_out; k++) s.out[k].ndim = mesh_ndim;
    return s;
}

int64_t adt_nd_sig_count(int n1d, int mesh_ndim) {
    int64_t c = 1;
    for (int m = 0; m < mesh_ndim; m++) c *= n1d;
    return c;
}

void adt_nd_sig_choice(int64_t index, int n1d, int mesh_ndim, int *choice) {
    for (int m = mesh_ndim - 1; m >= 0; m--) {
        choice[m] = (int)(index % n1d);
        index /= n1d;
    }
}

char *adt_nd_sig_str(const adt_nd_sig *s, int n_in, int n_out, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = 0;
    for (int i = 0; i < n_in + n_out && k < n; i++) {
        char one[64];
        const adt_ndsbp *v = i < n_in ? &s->in[i] : &s->out[i - n_in];
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i == n_in ? (i ? " -> " : "-> ") : (i ? " " : ""),
                              adt_ndsbp_str(v, one, sizeof one));
    }
    return buf;
}

int adt_dist_localize(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m,
                      const int *coord, adt_local_node *out) {
    if (node < 0 || node >= g->n_nodes) return adt_error(ADT_ERR_ARG, "localize: no node %d", node);
    const adt_node *n = &g->nodes[node];
    if (s->ndim != m->ndim)
        return adt_error(ADT_ERR_ARG, "node %s: a signature for %d mesh axes on a %d-axis mesh", n->name,
                         s->ndim, m->ndim);
    memset(out, 0, sizeof *out);
    out->node = node;
    for (int i = 0; i < n->n_in; i++) {
        out->in[i] = adt_ndsbp_block(&s->in[i], m, coord, g->values[n->in[i]].shape);
        out->in_partial[i] = adt_ndsbp_partial_mask(&s->in[i]);
    }
    for (int k = 0; k < n->n_out; k++) {
        out->out[k] = adt_ndsbp_block(&s->out[k], m, coord, g->values[n->out[k]].shape);
        out->out_partial[k] = adt_ndsbp_partial_mask(&s->out[k]);
    }
    out->a = n->a;
    const adt_op_def *d = adt_op_get(n->op);
    if (d->localize) d->localize(n, out->in, out->out, &out->a);
    return ADT_OK;
}

/* The first value of node n whose nd-SBP does not fit its shape on m, or -1. */
static int first_misfit(const adt_graph *g, const adt_node *n, const adt_nd_sig *s, const adt_mesh *m,
                        int *is_out) {
    for (int i = 0; i < n->n_in; i++)
        if (!adt_ndsbp_fits(&s->in[i], m, g->values[n->in[i]].shape)) return *is_out = 0, i;
    for (int k = 0; k < n->n_out; k++)
        if (!adt_ndsbp_fits(&s->out[k], m, g->values[n->out[k]].shape)) return *is_out = 1, k;
    return -1;
}

#define MAX_REPS 64

static void add_rep(int *reps, int *n, int r) {
    for (int i = 0; i < *n; i++)
        if (reps[i] == r) return;
    if (*n < MAX_REPS + 1) reps[(*n)++] = r;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

/* Coordinates that stand for all others when the op has no localize rule (its local op depends on
 * block shapes only). Along mesh axis a a block's length depends on the coordinate c_a only
 * through comparisons c_a < r, r a remainder L mod p_a of a length L the axis splits (every
 * length the outer axes can leave, for nested splits): the coordinates {0} and each such r stand
 * for the intervals between them, and their product for every coordinate, with the same result
 * and the same first failing coordinate in row-major order. 0 when there are too many. */
static int coord_reps(const adt_graph *g, const adt_node *n, const adt_nd_sig *s, const adt_mesh *m,
                      int reps[][MAX_REPS + 1], int *nrep) {
    for (int a = 0; a < m->ndim; a++) nrep[a] = 0, add_rep(reps[a], &nrep[a], 0);
    for (int i = 0; i < n->n_in + n->n_out; i++) {
        const adt_ndsbp *sb = i < n->n_in ? &s->in[i] : &s->out[i - n->n_in];
        const adt_shape *sh = &g->values[i < n->n_in ? n->in[i] : n->out[i - n->n_in]].shape;
        for (int k = 0; k < sh->ndim; k++) {
            int64_t len[16];
            int nl = 1;
            len[0] = sh->dim[k];
            for (int a = 0; a < m->ndim; a++) {
                if (sb->s[a].kind != ADT_SBP_S || sb->s[a].axis != k) continue;
                int p = m->dim[a], nn = 0;
                int64_t next[16];
                for (int q = 0; q < nl; q++) {
                    int64_t r = len[q] % p, b = len[q] / p;
                    if (r) add_rep(reps[a], &nrep[a], (int)r);
                    for (int t = 0; t < (r ? 2 : 1); t++) {
                        int64_t v = b + t, seen = 0;
                        for (int u = 0; u < nn; u++) seen |= next[u] == v;
                        if (!seen && nn < 16) next[nn++] = v;
                        else if (!seen) return 0;
                    }
                }
                memcpy(len, next, (size_t)nn * sizeof *len);
                nl = nn;
            }
        }
    }
    for (int a = 0; a < m->ndim; a++) {
        if (nrep[a] > MAX_REPS) return 0;
        qsort(reps[a], (size_t)nrep[a], sizeof reps[a][0], cmp_int);
    }
    return 1;
}

/* Runs the op's shape rule on scratch graph sg, whose first n_in values stand for the inputs
 * and get each coordinate's block shapes: at every coordinate, or at the representatives of
 * coord_reps when the op has no localize rule. */
static int check_coords(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m, adt_graph *sg) {
    const adt_node *n = &g->nodes[node];
    const adt_op_def *d = adt_op_get(n->op);
    char sigs[512], mbuf[32], cbuf[32], e[64], got[64];
    int reps[ADT_MAX_MESH_DIMS][MAX_REPS + 1], nrep[ADT_MAX_MESH_DIMS], count = m->nranks, use_reps = 0;
    /* a batch split's parts are arbitrary: its coordinates do not reduce to representatives */
    if (!d->localize && !m->split && coord_reps(g, n, s, m, reps, nrep)) {
        use_reps = 1, count = 1;
        for (int a = 0; a < m->ndim; a++) count *= nrep[a];
    }
    for (int idx = 0; idx < count; idx++) {
        int coord[ADT_MAX_MESH_DIMS];
        if (use_reps)
            for (int a = m->ndim - 1, r = idx; a >= 0; a--) coord[a] = reps[a][r % nrep[a]], r /= nrep[a];
        else
            adt_mesh_coord(m, idx, coord);
        adt_local_node ln;
        adt_dist_localize(g, node, s, m, coord, &ln);
        adt_node local = *n;
        for (int i = 0; i < n->n_in; i++) {
            sg->values[i].shape = ln.in[i].shape;
            local.in[i] = i;
        }
        local.a = ln.a;
        adt_shape os[ADT_MAX_OUTPUTS];
        adt_dtype od[ADT_MAX_OUTPUTS];
        sg->status = ADT_OK;
        int rc = d->infer(sg, &local, os, od);
        const char *why = NULL;
        int bad_k = -1;
        if (rc < 0 || sg->status) why = sg->err;
        for (int k = 0; !why && k < n->n_out; k++)
            if (!adt_shape_equal(&os[k], &ln.out[k].shape)) bad_k = k, why = "";
        if (!why) continue;
        snprintf(cbuf, sizeof cbuf, "(");
        for (int a = 0; a < m->ndim; a++)
            snprintf(cbuf + strlen(cbuf), sizeof cbuf - strlen(cbuf), a ? ",%d" : "%d", coord[a]);
        strncat(cbuf, ")", sizeof cbuf - strlen(cbuf) - 1);
        adt_nd_sig_str(s, n->n_in, n->n_out, sigs, sizeof sigs);
        adt_mesh_str(m, mbuf, sizeof mbuf);
        if (bad_k >= 0)
            return adt_error(ADT_ERR_SHAPE,
                             "node %s: signature %s on mesh %s: at coordinate %s output %d ('%s') comes out %s, "
                             "expected its block %s",
                             n->name, sigs, mbuf, cbuf, bad_k, g->values[n->out[bad_k]].name,
                             adt_shape_str(&os[bad_k], got, sizeof got),
                             adt_shape_str(&ln.out[bad_k].shape, e, sizeof e));
        return adt_error(ADT_ERR_SHAPE, "node %s: signature %s on mesh %s: at coordinate %s the local op is refused: %s",
                         n->name, sigs, mbuf, cbuf, why);
    }
    return ADT_OK;
}

/* A scratch graph with one leaf per input of node n (the shape rule reads dtypes and shapes). */
static adt_graph *scratch_graph(const adt_graph *g, const adt_node *n) {
    adt_graph *sg = adt_graph_create();
    for (int i = 0; i < n->n_in; i++) { /* the global names, so a refusal names the value */
        const adt_value *v = &g->values[n->in[i]];
        if (adt_input(sg, v->name, v->dtype, v->shape) != i) {
            char name[32];
            snprintf(name, sizeof name, "input %d", i); /* the same value twice */
            sg->status = ADT_OK;
            adt_input(sg, name, v->dtype, v->shape);
        }
    }
    return sg;
}

static int sig_check(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m, adt_graph *sg) {
    const adt_node *n = &g->nodes[node];
    int is_out, bad = first_misfit(g, n, s, m, &is_out);
    if (bad >= 0) {
        char sigs[512], mbuf[32];
        const adt_value *v = &g->values[is_out ? n->out[bad] : n->in[bad]];
        char sh[64];
        return adt_error(ADT_ERR_SHAPE, "node %s: signature %s on mesh %s: %s %d ('%s', %s) would have an empty block",
                         n->name, adt_nd_sig_str(s, n->n_in, n->n_out, sigs, sizeof sigs),
                         adt_mesh_str(m, mbuf, sizeof mbuf), is_out ? "output" : "input", bad, v->name,
                         adt_shape_str(&v->shape, sh, sizeof sh));
    }
    for (int i = 0; i < n->n_in + n->n_out; i++) { /* only f32 sums: integer ids are never partial */
        int is_in = i < n->n_in, v = is_in ? n->in[i] : n->out[i - n->n_in];
        const adt_ndsbp *sb = is_in ? &s->in[i] : &s->out[i - n->n_in];
        if (g->values[v].dtype == ADT_F32 || !adt_ndsbp_partial_mask(sb)) continue;
        char sigs[512], mbuf[32];
        return adt_error(ADT_ERR_SHAPE, "node %s: signature %s on mesh %s: %s %d ('%s') is %s data, which is never "
                         "held as partial sums",
                         n->name, adt_nd_sig_str(s, n->n_in, n->n_out, sigs, sizeof sigs),
                         adt_mesh_str(m, mbuf, sizeof mbuf), is_in ? "input" : "output", is_in ? i : i - n->n_in,
                         g->values[v].name, adt_dtype_name(g->values[v].dtype));
    }
    return check_coords(g, node, s, m, sg);
}

int adt_nd_sig_check(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m) {
    if (node < 0 || node >= g->n_nodes) return adt_error(ADT_ERR_ARG, "signature check: no node %d", node);
    if (s->ndim != m->ndim)
        return adt_error(ADT_ERR_ARG, "node %s: a signature for %d mesh axes on a %d-axis mesh",
                         g->nodes[node].name, s->ndim, m->ndim);
    adt_graph *sg = scratch_graph(g, &g->nodes[node]);
    int rc = sig_check(g, node, s, m, sg);
    adt_graph_free(sg);
    return rc;
}

/* The usable signatures of node on m: written to out (up to max) when grow is NULL, else
 * appended to *grow (realloc'd; *grow NULL at first); returns how many are usable. */
static int node_nd_sigs(const adt_graph *g, int node, const adt_mesh *m, adt_nd_sig *out, int max, adt_nd_sig **grow) {
    const adt_node *n = &g->nodes[node];
    adt_sbp_sig sigs1d[MAX_SIGS_1D];
    int n1d = adt_node_sbp_signatures(g, n, sigs1d, MAX_SIGS_1D);
    int64_t total = adt_nd_sig_count(n1d, m->ndim);
    adt_graph *sg = scratch_graph(g, n);
    int usable = 0;
    for (int64_t idx = 0; idx < total; idx++) {
        int choice[ADT_MAX_MESH_DIMS];
        adt_nd_sig s;
        adt_nd_sig_choice(idx, n1d, m->ndim, choice);
        adt_nd_sig_product(sigs1d, choice, m->ndim, n->n_in, n->n_out, &s);
        if (sig_check(g, node, &s, m, sg)) continue;
        if (grow) {
            if (!(usable & (usable - 1))) *grow = adt_realloc(*grow, (size_t)(usable ? 2 * usable : 1) * sizeof **grow);
            (*grow)[usable] = s;
        } else if (usable < max) {
            out[usable] = s;
        }
        usable++;
    }
    adt_graph_free(sg);
    adt_error_clear();
    return usable;
}

int adt_node_nd_sigs(const adt_graph *g, int node, const adt_mesh *m, adt_nd_sig *out, int max) {
    return node_nd_sigs(g, node, m, out, max, NULL);
}

/* ---- usable signatures shared by nodes of equal structure ------------------------------------------
 * Whether a product signature is usable depends on the op, its attributes and its operands'
 * shapes, dtypes and roles only, so nodes that agree on all of them (the same layer repeated)
 * share one list. The hash finds candidates; an exact comparison decides. */

static uint64_t node_hash(const adt_graph *g, const adt_node *n) {
    uint64_t h = adt_rng_mix64((uint64_t)n->op << 16 | (uint64_t)n->n_in << 8 | (uint64_t)n->n_out);
    h = adt_crc32c((uint32_t)h, &n->a, sizeof n->a) ^ h;
    for (int j = 0; j < n->n_in + n->n_out; j++) {
        const adt_value *v = &g->values[j < n->n_in ? n->in[j] : n->out[j - n->n_in]];
        h = adt_rng_mix64(h ^ adt_crc32c((uint32_t)(v->dtype | v->role << 4), v->shape.dim, (size_t)v->shape.ndim * 8));
    }
    return h | 1; /* 0 marks an empty slot */
}

static int same_structure(const adt_graph *g, const adt_node *a, const adt_node *b) {
    if (a->op != b->op || a->n_in != b->n_in || a->n_out != b->n_out || memcmp(&a->a, &b->a, sizeof a->a)) return 0;
    for (int j = 0; j < a->n_in + a->n_out; j++) {
        const adt_value *x = &g->values[j < a->n_in ? a->in[j] : a->out[j - a->n_in]];
        const adt_value *y = &g->values[j < b->n_in ? b->in[j] : b->out[j - b->n_in]];
        if (x->dtype != y->dtype || x->role != y->role || !adt_shape_equal(&x->shape, &y->shape)) return 0;
    }
    return 1;
}

/* The slot of node i's structure class, created (lists not computed: count -1) when new. */
static size_t class_slot(adt_sig_cache *sc, int i) {
    const adt_graph *g = sc->g;
    if (2 * (sc->n + 1) > sc->cap) { /* grow: rehash the classes */
        adt_sig_cache old = *sc;
        sc->cap = sc->cap ? 2 * sc->cap : 64;
        sc->hash = adt_calloc(sc->cap, sizeof *sc->hash);
        sc->rep = adt_malloc(sc->cap * sizeof *sc->rep);
        sc->count = adt_malloc(sc->cap * sizeof *sc->count);
        sc->sigs = adt_malloc(sc->cap * sizeof *sc->sigs);
        sc->n_ok = adt_malloc(sc->cap * sizeof *sc->n_ok);
        sc->ok = adt_malloc(sc->cap * sizeof *sc->ok);
        for (size_t k = 0; k < old.cap; k++) {
            if (!old.hash[k]) continue;
            size_t j = old.hash[k] & (sc->cap - 1);
            while (sc->hash[j]) j = (j + 1) & (sc->cap - 1);
            sc->hash[j] = old.hash[k], sc->rep[j] = old.rep[k], sc->count[j] = old.count[k], sc->sigs[j] = old.sigs[k];
            sc->n_ok[j] = old.n_ok[k], sc->ok[j] = old.ok[k];
        }
        free(old.hash), free(old.rep), free(old.count), free(old.sigs), free(old.n_ok), free(old.ok);
    }
    const adt_node *n = &g->nodes[i];
    uint64_t h = node_hash(g, n);
    size_t j = h & (sc->cap - 1);
    while (sc->hash[j]) {
        if (sc->hash[j] == h && same_structure(g, &g->nodes[sc->rep[j]], n)) return j;
        j = (j + 1) & (sc->cap - 1);
    }
    sc->hash[j] = h, sc->rep[j] = i, sc->count[j] = -1, sc->sigs[j] = NULL, sc->n_ok[j] = 0, sc->ok[j] = NULL;
    sc->n++;
    return j;
}

const adt_nd_sig *adt_sig_cache_get(adt_sig_cache *sc, int i, int *n_out) {
    size_t j = class_slot(sc, i);
    if (sc->count[j] < 0) {
        sc->sigs[j] = NULL; /* one pass: the check is most of the cost */
        sc->count[j] = node_nd_sigs(sc->g, i, sc->m, NULL, 0, &sc->sigs[j]);
        if (!sc->sigs[j]) sc->sigs[j] = adt_malloc(sizeof **sc->sigs); /* callers get a list even when empty */
    }
    *n_out = sc->count[j];
    return sc->sigs[j];
}

static int nd_sig_same(const adt_node *n, const adt_nd_sig *a, const adt_nd_sig *b) {
    if (a->ndim != b->ndim) return 0;
    for (int k = 0; k < n->n_in; k++)
        if (!adt_ndsbp_equal(&a->in[k], &b->in[k])) return 0;
    for (int k = 0; k < n->n_out; k++)
        if (!adt_ndsbp_equal(&a->out[k], &b->out[k])) return 0;
    return 1;
}

int adt_sig_cache_valid(adt_sig_cache *sc, int node, const adt_nd_sig *s) {
    size_t j = class_slot(sc, node);
    const adt_node *n = &sc->g->nodes[node];
    for (int k = 0; k < sc->n_ok[j]; k++)
        if (nd_sig_same(n, &sc->ok[j][k], s)) return ADT_OK;
    int rc = sc->check_only ? adt_nd_sig_check(sc->g, node, s, sc->m) : adt_nd_sig_valid(sc->g, node, s, sc->m);
    if (rc) return rc;
    if (!(sc->n_ok[j] & (sc->n_ok[j] - 1))) /* grow at powers of two */
        sc->ok[j] = adt_realloc(sc->ok[j], (size_t)(sc->n_ok[j] ? 2 * sc->n_ok[j] : 1) * sizeof **sc->ok);
    sc->ok[j][sc->n_ok[j]++] = *s;
    return ADT_OK;
}

void adt_sig_cache_free(adt_sig_cache *sc) {
    for (size_t k = 0; k < sc->cap; k++)
        if (sc->hash[k]) free(sc->sigs[k]), free(sc->ok[k]);
    free(sc->hash), free(sc->rep), free(sc->count), free(sc->sigs), free(sc->n_ok), free(sc->ok);
    memset(sc, 0, sizeof *sc);
}

struct adt_sig_pool_entry {
    const adt_graph *g;
    adt_mesh m; /* the shape alone (no ranks): signatures do not depend on placement */
    adt_sig_cache sc;
};

adt_sig_cache *adt_sig_pool_get(adt_sig_pool *p, const adt_graph *g, const adt_mesh *m) {
    for (int i = 0; i < p->n; i++) {
        struct adt_sig_pool_entry *e = p->e[i];
        int same = e->g == g && e->m.ndim == m->ndim && !e->m.split && !m->split;
        for (int a = 0; same && a < m->ndim; a++) same = e->m.dim[a] == m->dim[a];
        if (same) return &e->sc;
    }
    if (p->n == p->cap) p->cap = p->cap ? 2 * p->cap : 8, p->e = adt_realloc(p->e, (size_t)p->cap * sizeof *p->e);
    struct adt_sig_pool_entry *e = adt_calloc(1, sizeof *e);
    e->g = g;
    e->m = *m;
    e->m.ranks = NULL;
    e->sc.g = g, e->sc.m = &e->m;
    p->e[p->n++] = e;
    return &e->sc;
}

void adt_sig_pool_free(adt_sig_pool *p) {
    for (int i = 0; i < p->n; i++) adt_sig_cache_free(&p->e[i]->sc), free(p->e[i]);
    free(p->e);
    memset(p, 0, sizeof *p);
}

/* ---- signatures as text; registered signatures ------------------------------------------------ */

/* The next nd-SBP token of a signature: a parenthesised group (blanks allowed inside) or a run
 * of non-blank characters; "->" comes back as itself. Returns the length, 0 at the end, -1 when
 * a '(' is not closed. */
static int next_token(const char **pp, char *tok, size_t cap) {
    const char *p = *pp;
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    const char *start = p;
    if (*p == '(') {
        int depth = 0;
        do {
            depth += *p == '(' ? 1 : *p == ')' ? -1 : 0;
            p++;
        } while (*p && depth > 0);
        if (depth > 0) return -1;
    } else {
        while (*p && *p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') p++;
    }
    size_t n = (size_t)(p - start);
    if (n >= cap) n = cap - 1;
    memcpy(tok, start, n);
    tok[n] = 0;
    *pp = p;
    return (int)(p - start);
}

int adt_nd_sig_parse(const char *text, const adt_graph *g, int node, int mesh_ndim, adt_nd_sig *out) {
    const adt_node *n = &g->nodes[node];
    *out = adt_nd_sig_all_b(mesh_ndim, n->n_in, n->n_out);
    /* count first, so a wrong arity is reported as such rather than as a bad nd-SBP */
    int count[2] = {0, 0}, side = 0, len;
    char tok[128];
    for (const char *p = text; (len = next_token(&p, tok, sizeof tok)) > 0;) {
        if (strcmp(tok, "->")) count[side]++;
        else if (side++) return adt_error(ADT_ERR_ARG, "signature '%.80s': '->' appears twice", text);
    }
    if (len < 0) return adt_error(ADT_ERR_ARG, "signature '%.80s': a '(' is not closed", text);
    if (!side || count[0] != n->n_in || count[1] != n->n_out)
        return adt_error(ADT_ERR_ARG,
                         "signature '%.80s' of node %s (%s): %d input and %d output nd-SBP(s)%s, expected %d input "
                         "nd-SBP(s), '->', then %d output nd-SBP(s)",
                         text, n->name, adt_op_name(n->op), count[0], count[1], side ? "" : " and no '->'", n->n_in,
                         n->n_out);
    side = 0;
    int idx = 0;
    for (const char *p = text; next_token(&p, tok, sizeof tok) > 0;) {
        if (!strcmp(tok, "->")) {
            side = 1, idx = 0;
            continue;
        }
        int v = side ? n->out[idx] : n->in[idx];
        adt_ndsbp *dst = side ? &out->out[idx] : &out->in[idx];
        if (adt_ndsbp_parse(tok, mesh_ndim, g->values[v].shape.ndim, dst))
            return adt_error_prefix(ADT_ERR_ARG, "signature '%.80s', %s %d ('%s'): ", text, side ? "output" : "input",
                                    idx, g->values[v].name);
        idx++;
    }
    return ADT_OK;
}

static int sbp_eq(adt_sbp a, adt_sbp b) { return a.kind == b.kind && (a.kind != ADT_SBP_S || a.axis == b.axis); }

int adt_nd_sig_valid(const adt_graph *g, int node, const adt_nd_sig *s, const adt_mesh *m) {
    if (node < 0 || node >= g->n_nodes) return adt_error(ADT_ERR_ARG, "signature check: no node %d", node);
    const adt_node *n = &g->nodes[node];
    if (s->ndim != m->ndim)
        return adt_error(ADT_ERR_ARG, "node %s: a signature for %d mesh axes on a %d-axis mesh", n->name, s->ndim,
                         m->ndim);
    adt_sbp_sig sigs1d[MAX_SIGS_1D];
    int n1d = adt_node_sbp_signatures(g, n, sigs1d, MAX_SIGS_1D);
    for (int a = 0; a < m->ndim; a++) {
        int found = 0;
        for (int k = 0; k < n1d && !found; k++) {
            int same = 1;
            for (int i = 0; i < n->n_in && same; i++) same = sbp_eq(sigs1d[k].in[i], s->in[i].s[a]);
            for (int o = 0; o < n->n_out && same; o++) same = sbp_eq(sigs1d[k].out[o], s->out[o].s[a]);
            found = same;
        }
        if (found) continue;
        char sig[512];
        return adt_error(ADT_ERR_ARG, "node %s: signature %s: mesh axis %d is not a signature of op %s (its 1-D "
                         "signatures are listed by adt_node_sbp_signatures)",
                         n->name, adt_nd_sig_str(s, n->n_in, n->n_out, sig, sizeof sig), a, adt_op_name(n->op));
    }
    return adt_nd_sig_check(g, node, s, m);
}

/* ---- local graph pieces -------------------------------------------------------------------- */

int adt_dist_add_local_leaf(adt_graph *lg, const adt_graph *g, int value, const adt_box *b) {
    const adt_value *gv = &g->values[value];
    int v = adt_input(lg, gv->name, gv->dtype, b->shape);
    if (v < 0) return -1;
    adt_value *lv = &lg->values[v];
    lv->role = gv->role;
    lv->init = gv->init;
    lv->layer_tag = gv->layer_tag;
    lv->requires_grad = gv->requires_grad;
    lv->global_shape = b->global;
    memcpy(lv->offset, b->offset, sizeof lv->offset);
    if (value == g->lr_input) lg->lr_input = v;
    if (value == g->step_input) lg->step_input = v;
    return v;
}

int adt_dist_add_local_node(adt_graph *lg, const adt_graph *g, const adt_local_node *ln, const int *in) {
    if (lg->status) return -1;
    const adt_node *gn = &g->nodes[ln->node];
    for (int i = 0; i < gn->n_in; i++)
        if (in[i] < 0 || in[i] >= lg->n_values || !adt_shape_equal(&lg->values[in[i]].shape, &ln->in[i].shape)) {
            char want[64], got[64];
            return adt_graph_fail(lg, ADT_ERR_SHAPE, "node %s: local input %d is %s, expected the block %s", gn->name,
                                  i, in[i] < 0 || in[i] >= lg->n_values ? "missing"
                                                                        : adt_shape_str(&lg->values[in[i]].shape, got, sizeof got),
                                  adt_shape_str(&ln->in[i].shape, want, sizeof want));
        }
    int id = adt_graph_add_node(lg, gn->op, in, gn->n_in, &ln->a);
    if (id < 0) return -1;
    adt_node *n = &lg->nodes[id];
    adt_str_copy(n->name, sizeof n->name, gn->name);
    n->layer_tag = gn->layer_tag;
    n->stage = gn->stage;
    n->is_backward = gn->is_backward;
    n->is_optimizer = gn->is_optimizer;
    n->fwd_node = -1; /* the global id means nothing here */
    for (int k = 0; k < n->n_out; k++) {
        adt_value *lv = &lg->values[n->out[k]];
        const adt_value *gv = &g->values[gn->out[k]];
        if (!adt_shape_equal(&lv->shape, &ln->out[k].shape)) {
            char want[64], got[64];
            return adt_graph_fail(lg, ADT_ERR_SHAPE, "node %s: local output %d comes out %s, expected its block %s",
                                  gn->name, k, adt_shape_str(&lv->shape, got, sizeof got),
                                  adt_shape_str(&ln->out[k].shape, want, sizeof want));
        }
        adt_str_copy(lv->name, sizeof lv->name, gv->name);
        lv->role = gv->role;
        lv->layer_tag = gv->layer_tag;
        lv->global_shape = ln->out[k].global;
        memcpy(lv->offset, ln->out[k].offset, sizeof lv->offset);
    }
    return id;
}
