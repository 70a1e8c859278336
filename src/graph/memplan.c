/*
 * memplan.c - liveness-based memory plan: one arena, buffers reused once dead.
 *
 * Each storage root (a value that is not a view) lives from its producer's position to the
 * last position that reads it or any view of it. Roots are placed largest first at the lowest
 * offset that overlaps no already-placed root alive at the same time ("greedy by size", as in
 * TFLite's arena planner): simple, and within a few percent of optimal on layer graphs.
 *
 * A node that runs asynchronously (a collective started early and waited for later) reads its
 * input and writes its output until its wait: read_until extends both lifetimes to that point.
 * `share` lets the caller put a value in another's storage (an all-reduce done in place on its
 * input's buffer).
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/exec.h"
#include "adtrain/ops.h"

#define ALIGN 64

static int64_t align_up(int64_t x) { return (x + ALIGN - 1) & ~(int64_t)(ALIGN - 1); }

/* The value owning v's storage: through views and in-place updates, and through the caller's
 * extra sharing (share[v] >= 0). */
static int value_root(const adt_graph *g, const int *share, int v) {
    for (;;) {
        if (g->values[v].alias_of >= 0) v = g->values[v].alias_of;
        else if (share && share[v] >= 0) v = share[v];
        else return v;
    }
}

static int is_state(const adt_graph *g, int v) {
    adt_role r = g->values[v].role;
    return adt_role_is_persistent(r) || adt_role_is_fed(r);
}

typedef struct placed {
    int64_t off, size;
    int first, last;
} placed;

/* Placement order: largest first, then earliest, then by id (a total order: reproducible). */
typedef struct root_key {
    int64_t size;
    int first, v;
} root_key;

static int cmp_size_desc(const void *a, const void *b) {
    const root_key *ka = a, *kb = b;
    if (ka->size != kb->size) return ka->size > kb->size ? -1 : 1;
    if (ka->first != kb->first) return ka->first - kb->first;
    return ka->v - kb->v;
}

int adt_memplan_build(adt_memplan *mp, const adt_graph *g, const int *order, int n, int no_reuse) {
    return adt_memplan_build_sched(mp, g, order, n, no_reuse, NULL, NULL);
}

int adt_memplan_build_sched(adt_memplan *mp, const adt_graph *g, const int *order, int n, int no_reuse,
                            const int *read_until, const int *share) {
    memset(mp, 0, sizeof *mp);
    int nv = g->n_values;
    mp->n_values = nv;
    mp->offset = adt_malloc((size_t)nv * sizeof *mp->offset);
    mp->first = adt_malloc((size_t)nv * sizeof *mp->first);
    mp->last = adt_malloc((size_t)nv * sizeof *mp->last);
    mp->root = adt_malloc((size_t)nv * sizeof *mp->root);
    mp->state_offset = adt_malloc((size_t)nv * sizeof *mp->state_offset);
    for (int v = 0; v < nv; v++) {
        mp->offset[v] = -1;
        mp->state_offset[v] = -1;
        mp->first[v] = mp->last[v] = -1;
        mp->root[v] = value_root(g, share, v);
    }
    if (!order) n = g->n_nodes;
    for (int p = 0; p < n; p++) {
        const adt_node *nd = &g->nodes[order ? order[p] : p];
        int until = read_until && read_until[p] > p ? read_until[p] : p; /* a node still in flight */
        for (int k = 0; k < nd->n_out; k++) {
            int r = mp->root[nd->out[k]];
            if (mp->first[r] < 0) mp->first[r] = p;
            if (mp->last[r] < until) mp->last[r] = until;
        }
        for (int i = 0; i < nd->n_in; i++) {
            int r = mp->root[nd->in[i]];
            if (mp->last[r] < until) mp->last[r] = until;
        }
        int64_t s = 0;
        const adt_op_def *def = adt_op_get(nd->op);
        if (def->scratch) s = def->scratch(g, nd) * (int64_t)sizeof(float);
        if (s > mp->scratch_bytes) mp->scratch_bytes = s;
    }
    for (int v = 0; v < nv; v++)
        if (g->values[v].is_output && mp->first[mp->root[v]] >= 0) mp->last[mp->root[v]] = n;

    root_key *roots = adt_malloc((size_t)nv * sizeof *roots);
    int nr = 0;
    for (int v = 0; v < nv; v++) {
        if (mp->root[v] != v) continue;
        if (is_state(g, v)) {
            mp->state_offset[v] = mp->state_bytes;
            mp->state_bytes += align_up(adt_value_bytes(g, v));
            continue;
        }
        if (mp->first[v] < 0) continue;
        roots[nr++] = (root_key){adt_value_bytes(g, v), mp->first[v], v};
        mp->noreuse_bytes += align_up(adt_value_bytes(g, v));
    }
    qsort(roots, (size_t)nr, sizeof *roots, cmp_size_desc);

    /* placed buffers kept in offset order (a later one after equal offsets), so the first gap that
     * fits among those alive at the same time is one walk, with no sort per buffer: the planner
     * prices thousands of plans of graphs with thousands of values */
    placed *pl = adt_malloc((size_t)(nr + 1) * sizeof *pl);
    int np = 0;
    int64_t top = 0;
    for (int i = 0; i < nr; i++) {
        int v = roots[i].v;
        int64_t size = align_up(roots[i].size), off = 0;
        if (no_reuse) {
            off = top;
        } else {
            for (int j = 0; j < np; j++) { /* first gap that fits */
                if (pl[j].first > mp->last[v] || mp->first[v] > pl[j].last) continue; /* not alive with v */
                if (pl[j].off >= off + size) break;
                if (pl[j].off + pl[j].size > off) off = pl[j].off + pl[j].size;
            }
        }
        int at = np;
        while (at > 0 && pl[at - 1].off > off) at--;
        memmove(pl + at + 1, pl + at, (size_t)(np - at) * sizeof *pl);
        pl[at] = (placed){off, size, mp->first[v], mp->last[v]};
        np++;
        mp->offset[v] = off;
        if (off + size > top) top = off + size;
    }
    mp->arena_bytes = top;
    free(pl);
    free(roots);
    return ADT_OK;
}

void adt_memplan_free(adt_memplan *mp) {
    free(mp->offset);
    free(mp->first);
    free(mp->last);
    free(mp->root);
    free(mp->state_offset);
    memset(mp, 0, sizeof *mp);
}
