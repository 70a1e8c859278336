/*
 * search.c - the signature-assignment problem (variables with a few choices, unary and pairwise
 * costs) and its solvers: exact elimination of variables of degree <= 2 (OneFlow's node and
 * edge eliminations: a chain, a tree or a series-parallel graph collapses exactly), coordinate
 * descent with single and pair moves on the core that is left, started from several points
 * (AutoDDL), and a depth-first branch and bound that proves the optimum of small problems.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"

void adt_search_init(adt_search_problem *p, int n_vars, const int *k) {
    memset(p, 0, sizeof *p);
    p->n_vars = n_vars;
    p->k = adt_malloc((size_t)(n_vars ? n_vars : 1) * sizeof *p->k);
    p->unary = adt_calloc((size_t)(n_vars ? n_vars : 1), sizeof *p->unary);
    for (int i = 0; i < n_vars; i++) {
        p->k[i] = k[i];
        p->unary[i] = adt_calloc((size_t)k[i], sizeof **p->unary);
    }
}

static int find_edge(const adt_search_problem *p, int a, int b, int *flip) {
    for (int e = 0; e < p->n_edges; e++) {
        if (p->ea[e] == a && p->eb[e] == b) return *flip = 0, e;
        if (p->ea[e] == b && p->eb[e] == a) return *flip = 1, e;
    }
    return -1;
}

static double add_cost(double a, double b) {
    double s = a + b;
    return s > ADT_SEARCH_INF ? ADT_SEARCH_INF : s;
}

void adt_search_add_pair(adt_search_problem *p, int a, int b, const double *cost) {
    int ka = p->k[a], kb = p->k[b];
    if (a == b) {
        for (int i = 0; i < ka; i++) p->unary[a][i] = add_cost(p->unary[a][i], cost[i * kb + i]);
        return;
    }
    int flip = 0, e = find_edge(p, a, b, &flip);
    if (e < 0) {
        if (p->n_edges == p->cap_edges) {
            p->cap_edges = p->cap_edges ? 2 * p->cap_edges : 16;
            p->ea = adt_realloc(p->ea, (size_t)p->cap_edges * sizeof *p->ea);
            p->eb = adt_realloc(p->eb, (size_t)p->cap_edges * sizeof *p->eb);
            p->pair = adt_realloc(p->pair, (size_t)p->cap_edges * sizeof *p->pair);
        }
        e = p->n_edges++;
        p->ea[e] = a, p->eb[e] = b;
        p->pair[e] = adt_calloc((size_t)ka * kb, sizeof **p->pair);
    }
    double *m = p->pair[e];
    for (int i = 0; i < ka; i++)
        for (int j = 0; j < kb; j++) {
            double *d = flip ? &m[j * ka + i] : &m[i * kb + j];
            *d = add_cost(*d, cost[i * kb + j]);
        }
}

void adt_search_free(adt_search_problem *p) {
    for (int i = 0; i < p->n_vars; i++) free(p->unary[i]);
    for (int e = 0; e < p->n_edges; e++) free(p->pair[e]);
    free(p->k), free(p->unary), free(p->ea), free(p->eb), free(p->pair);
    memset(p, 0, sizeof *p);
}

static double pair_at(const adt_search_problem *p, int e, int xa, int xb) { return p->pair[e][xa * p->k[p->eb[e]] + xb]; }

double adt_search_cost(const adt_search_problem *p, const int *x) {
    double j = 0;
    for (int i = 0; i < p->n_vars; i++) j = add_cost(j, p->unary[i][x[i]]);
    for (int e = 0; e < p->n_edges; e++) j = add_cost(j, pair_at(p, e, x[p->ea[e]], x[p->eb[e]]));
    return j;
}

/* Cost of edge e seen from variable v at choice xv and the other end at xo. */
static double edge_from(const adt_search_problem *q, int e, int v, int xv, int xo) {
    return q->ea[e] == v ? pair_at(q, e, xv, xo) : pair_at(q, e, xo, xv);
}
static int other_end(const adt_search_problem *q, int e, int v) { return q->ea[e] == v ? q->eb[e] : q->ea[e]; }

/* ---- a working copy with adjacency ----------------------------------------------------------------- */

typedef struct work {
    adt_search_problem q; /* a copy that elimination rewrites                       */
    int *alive_e;         /* [cap] edge still present                               */
    int *alive_v;
    int **adj, *deg, *adj_cap; /* incident live edges per variable                  */
} work;

static void adj_add(work *w, int v, int e) {
    if (w->deg[v] == w->adj_cap[v]) {
        w->adj_cap[v] = w->adj_cap[v] ? 2 * w->adj_cap[v] : 4;
        w->adj[v] = adt_realloc(w->adj[v], (size_t)w->adj_cap[v] * sizeof **w->adj);
    }
    w->adj[v][w->deg[v]++] = e;
}

static void adj_del(work *w, int v, int e) {
    for (int i = 0; i < w->deg[v]; i++)
        if (w->adj[v][i] == e) {
            w->adj[v][i] = w->adj[v][--w->deg[v]];
            return;
        }
}

static void work_init(work *w, const adt_search_problem *p) {
    memset(w, 0, sizeof *w);
    adt_search_init(&w->q, p->n_vars, p->k);
    for (int i = 0; i < p->n_vars; i++) memcpy(w->q.unary[i], p->unary[i], (size_t)p->k[i] * sizeof(double));
    for (int e = 0; e < p->n_edges; e++) adt_search_add_pair(&w->q, p->ea[e], p->eb[e], p->pair[e]);
    int n = p->n_vars ? p->n_vars : 1;
    w->alive_v = adt_malloc((size_t)n * sizeof *w->alive_v);
    for (int i = 0; i < p->n_vars; i++) w->alive_v[i] = 1;
    w->adj = adt_calloc((size_t)n, sizeof *w->adj);
    w->deg = adt_calloc((size_t)n, sizeof *w->deg);
    w->adj_cap = adt_calloc((size_t)n, sizeof *w->adj_cap);
    w->alive_e = NULL;
    int cap = w->q.n_edges + 1;
    w->alive_e = adt_malloc((size_t)cap * sizeof *w->alive_e);
    for (int e = 0; e < w->q.n_edges; e++) {
        w->alive_e[e] = 1;
        adj_add(w, w->q.ea[e], e);
        adj_add(w, w->q.eb[e], e);
    }
}

static void work_free(work *w) {
    for (int i = 0; i < w->q.n_vars; i++) free(w->adj[i]);
    free(w->adj), free(w->deg), free(w->adj_cap), free(w->alive_e), free(w->alive_v);
    adt_search_free(&w->q);
}

/* Adds a pair to the working copy, keeping adjacency: summed into the live edge between a and b
 * when there is one, else a new edge; a == b (two edges to the same neighbour) is unary. */
static void work_add_pair(work *w, int a, int b, const double *cost) {
    adt_search_problem *q = &w->q;
    int ka = q->k[a], kb = q->k[b];
    if (a == b) {
        for (int i = 0; i < ka; i++) q->unary[a][i] = add_cost(q->unary[a][i], cost[i * kb + i]);
        return;
    }
    for (int i = 0; i < w->deg[a]; i++) {
        int e = w->adj[a][i];
        if (other_end(q, e, a) != b) continue;
        int flip = q->ea[e] != a;
        for (int x = 0; x < ka; x++)
            for (int y = 0; y < kb; y++) {
                double *d = flip ? &q->pair[e][y * ka + x] : &q->pair[e][x * kb + y];
                *d = add_cost(*d, cost[x * kb + y]);
            }
        return;
    }
    if (q->n_edges == q->cap_edges) {
        q->cap_edges = q->cap_edges ? 2 * q->cap_edges : 16;
        q->ea = adt_realloc(q->ea, (size_t)q->cap_edges * sizeof *q->ea);
        q->eb = adt_realloc(q->eb, (size_t)q->cap_edges * sizeof *q->eb);
        q->pair = adt_realloc(q->pair, (size_t)q->cap_edges * sizeof *q->pair);
    }
    int e = q->n_edges++;
    q->ea[e] = a, q->eb[e] = b;
    size_t n = (size_t)ka * kb;
    q->pair[e] = adt_malloc(n * sizeof **q->pair);
    memcpy(q->pair[e], cost, n * sizeof **q->pair);
    w->alive_e = adt_realloc(w->alive_e, (size_t)q->cap_edges * sizeof *w->alive_e);
    w->alive_e[e] = 1;
    adj_add(w, a, e);
    adj_add(w, b, e);
}


/* ---- elimination ----------------------------------------------------------------------------------- */

typedef struct elim {
    int v, u, w;  /* eliminated variable and its neighbours at the time (-1: none) */
    int *best;    /* argmin of v per (x_u) or (x_u, x_w)                          */
} elim;

/* Eliminates while some live variable has degree <= 2; records in order. */
static int eliminate(work *w, elim *rec) {
    adt_search_problem *q = &w->q;
    int n_rec = 0;
    for (int changed = 1; changed;) {
        changed = 0;
        for (int v = 0; v < q->n_vars; v++) {
            if (!w->alive_v[v] || w->deg[v] > 2) continue;
            int kv = q->k[v];
            elim r = {.v = v, .u = -1, .w = -1};
            if (w->deg[v] == 0) {
                r.best = adt_malloc(sizeof *r.best);
                int b = 0;
                for (int i = 1; i < kv; i++)
                    if (q->unary[v][i] < q->unary[v][b]) b = i;
                r.best[0] = b;
            } else if (w->deg[v] == 1) {
                int e = w->adj[v][0], u = other_end(q, e, v), ku = q->k[u];
                r.u = u;
                r.best = adt_malloc((size_t)ku * sizeof *r.best);
                for (int xu = 0; xu < ku; xu++) {
                    double bc = 0;
                    int b = -1;
                    for (int xv = 0; xv < kv; xv++) {
                        double c = add_cost(q->unary[v][xv], edge_from(q, e, v, xv, xu));
                        if (b < 0 || c < bc) bc = c, b = xv;
                    }
                    r.best[xu] = b;
                    q->unary[u][xu] = add_cost(q->unary[u][xu], bc);
                }
                w->alive_e[e] = 0;
                adj_del(w, u, e);
            } else {
                int e1 = w->adj[v][0], e2 = w->adj[v][1];
                int u = other_end(q, e1, v), x = other_end(q, e2, v), ku = q->k[u], kx = q->k[x];
                r.u = u, r.w = x;
                r.best = adt_malloc((size_t)ku * kx * sizeof *r.best);
                double *m = adt_malloc((size_t)ku * kx * sizeof *m);
                for (int xu = 0; xu < ku; xu++)
                    for (int xx = 0; xx < kx; xx++) {
                        double bc = 0;
                        int b = -1;
                        for (int xv = 0; xv < kv; xv++) {
                            double c = add_cost(add_cost(q->unary[v][xv], edge_from(q, e1, v, xv, xu)),
                                                edge_from(q, e2, v, xv, xx));
                            if (b < 0 || c < bc) bc = c, b = xv;
                        }
                        r.best[xu * kx + xx] = b;
                        m[xu * kx + xx] = bc;
                    }
                w->alive_e[e1] = w->alive_e[e2] = 0;
                adj_del(w, u, e1);
                adj_del(w, x, e2);
                work_add_pair(w, u, x, m);
                free(m);
            }
            w->alive_v[v] = 0;
            w->deg[v] = 0;
            rec[n_rec++] = r;
            changed = 1;
        }
    }
    return n_rec;
}

static void back_substitute(const elim *rec, int n_rec, const adt_search_problem *q, int *x) {
    for (int i = n_rec - 1; i >= 0; i--) {
        const elim *r = &rec[i];
        if (r->u < 0) x[r->v] = r->best[0];
        else if (r->w < 0) x[r->v] = r->best[x[r->u]];
        else x[r->v] = r->best[x[r->u] * q->k[r->w] + x[r->w]];
    }
}

/* ---- coordinate descent on the live core -------------------------------------------------------------- */

static double local_cost(const work *w, int v, int xv, const int *x) {
    const adt_search_problem *q = &w->q;
    double c = q->unary[v][xv];
    for (int i = 0; i < w->deg[v]; i++) {
        int e = w->adj[v][i];
        c = add_cost(c, edge_from(q, e, v, xv, x[other_end(q, e, v)]));
    }
    return c;
}

static int single_move(const work *w, int v, int *x) {
    double cur = local_cost(w, v, x[v], x);
    int best = x[v];
    for (int k = 0; k < w->q.k[v]; k++) {
        double c = local_cost(w, v, k, x);
        if (c < cur - 1e-12 * fabs(cur)) cur = c, best = k;
    }
    if (best == x[v]) return 0;
    x[v] = best;
    return 1;
}

/* v's cost at choice xv without edge `skip`, its other edges at x. */
static double local_cost_but(const work *w, int v, int xv, const int *x, int skip) {
    const adt_search_problem *q = &w->q;
    double c = q->unary[v][xv];
    for (int i = 0; i < w->deg[v]; i++) {
        int e = w->adj[v][i];
        if (e != skip) c = add_cost(c, edge_from(q, e, v, xv, x[other_end(q, e, v)]));
    }
    return c;
}

/* Both ends of edge e at once, everything else fixed. The cost of (ia, ib) is a's cost without e,
 * b's without e, and e's own: each end's part priced once per choice, not once per pair. */
static int pair_move(const work *w, int e, int *x, double *la, double *lb) {
    const adt_search_problem *q = &w->q;
    int a = q->ea[e], b = q->eb[e], xa0 = x[a], xb0 = x[b], ka = q->k[a], kb = q->k[b];
    for (int ia = 0; ia < ka; ia++) la[ia] = local_cost_but(w, a, ia, x, e);
    for (int ib = 0; ib < kb; ib++) lb[ib] = local_cost_but(w, b, ib, x, e);
    const double *m = q->pair[e];
    double cur = add_cost(add_cost(la[xa0], lb[xb0]), m[xa0 * kb + xb0]);
    int ba = xa0, bb = xb0;
    for (int ia = 0; ia < ka; ia++)
        for (int ib = 0; ib < kb; ib++) {
            double c = add_cost(add_cost(la[ia], lb[ib]), m[ia * kb + ib]);
            if (c < cur - 1e-12 * fabs(cur)) cur = c, ba = ia, bb = ib;
        }
    x[a] = ba, x[b] = bb;
    return ba != xa0 || bb != xb0;
}

static int descend(const work *w, int *x, int max_sweeps) {
    const adt_search_problem *q = &w->q;
    int sweeps = 0, kmax = 1;
    for (int v = 0; v < q->n_vars; v++) kmax = q->k[v] > kmax ? q->k[v] : kmax;
    double *la = adt_malloc(2 * (size_t)kmax * sizeof *la), *lb = la + kmax;
    for (int improved = 1; improved && sweeps < max_sweeps; sweeps++) {
        improved = 0;
        for (int v = 0; v < q->n_vars; v++)
            if (w->alive_v[v]) improved |= single_move(w, v, x);
        for (int v = q->n_vars - 1; v >= 0; v--)
            if (w->alive_v[v]) improved |= single_move(w, v, x);
        if (!improved)
            for (int e = 0; e < q->n_edges; e++)
                if (w->alive_e[e]) improved |= pair_move(w, e, x, la, lb);
    }
    free(la);
    return sweeps;
}

/* Greedy start: variables in order, each the cheapest given the ones already set. */
static void greedy_start(const work *w, int *x) {
    const adt_search_problem *q = &w->q;
    int *set = adt_calloc((size_t)q->n_vars + 1, sizeof *set);
    for (int v = 0; v < q->n_vars; v++) {
        if (!w->alive_v[v]) continue;
        double bc = 0;
        int b = 0;
        for (int k = 0; k < q->k[v]; k++) {
            double c = q->unary[v][k];
            for (int i = 0; i < w->deg[v]; i++) {
                int e = w->adj[v][i], o = other_end(q, e, v);
                if (set[o]) c = add_cost(c, edge_from(q, e, v, k, x[o]));
            }
            if (!k || c < bc) bc = c, b = k;
        }
        x[v] = b, set[v] = 1;
    }
    free(set);
}

static int bnb_run(const adt_search_problem *p, int *x, double best, double max_nodes);

/* A core this small gets a branch and bound (of at most core_steps steps), which proves it
 * optimal or improves it; larger cores keep what the descent found. */
#define SEARCH_CORE_VARS 32

/* The live core of the working copy as a problem of its own (map[i]: its variable i). */
static void core_problem(const work *w, adt_search_problem *c, int *map, int *inv) {
    const adt_search_problem *q = &w->q;
    int n = 0, k[SEARCH_CORE_VARS] = {0};
    for (int v = 0; v < q->n_vars; v++) {
        inv[v] = -1;
        if (w->alive_v[v] && n < SEARCH_CORE_VARS) inv[v] = n, map[n] = v, k[n++] = q->k[v];
    }
    adt_search_init(c, n, k);
    for (int i = 0; i < n; i++) memcpy(c->unary[i], q->unary[map[i]], (size_t)k[i] * sizeof(double));
    for (int e = 0; e < q->n_edges; e++)
        if (w->alive_e[e]) adt_search_add_pair(c, inv[q->ea[e]], inv[q->eb[e]], q->pair[e]);
}

/* A random start: each core variable uniformly (a counter-based stream, so runs repeat). */
static void random_start(const work *w, int *x, int round) {
    for (int v = 0; v < w->q.n_vars; v++)
        if (w->alive_v[v]) x[v] = (int)(adt_rng_u32(0x5eed, (uint64_t)round << 32 | (uint64_t)v) % (uint32_t)w->q.k[v]);
}

#define SEARCH_RANDOM_STARTS 8

double adt_search_solve(const adt_search_problem *p, const int *const *starts, int n_starts, int max_sweeps,
                        double core_steps, int *x, adt_search_stats *st) {
    adt_search_stats s = {0};
    if (max_sweeps <= 0) max_sweeps = 50;
    work w;
    work_init(&w, p);
    elim *rec = adt_malloc((size_t)(p->n_vars + 1) * sizeof *rec);
    int n_rec = eliminate(&w, rec);
    s.eliminated = n_rec;
    s.core = p->n_vars - n_rec;
    s.exact = s.core == 0;
    int n = p->n_vars ? p->n_vars : 1;
    int *cur = adt_calloc((size_t)n, sizeof *cur), *best = adt_calloc((size_t)n, sizeof *best);
    double best_j = -1;
    /* random restarts where the core is small enough for them to matter and cost little */
    int n_rand = s.core && s.core <= 2 * SEARCH_CORE_VARS ? SEARCH_RANDOM_STARTS : 0;
    for (int t = 0; t <= n_starts + n_rand; t++) {
        if (t < n_starts) {
            if (!starts[t]) continue;
            for (int v = 0; v < p->n_vars; v++) cur[v] = starts[t][v] >= 0 && starts[t][v] < p->k[v] ? starts[t][v] : 0;
        } else if (t == n_starts) {
            greedy_start(&w, cur);
        } else {
            random_start(&w, cur, t - n_starts);
        }
        s.starts++;
        if (s.core) s.sweeps += descend(&w, cur, max_sweeps);
        back_substitute(rec, n_rec, &w.q, cur);
        double j = adt_search_cost(p, cur);
        if (best_j < 0 || j < best_j) best_j = j, memcpy(best, cur, (size_t)n * sizeof *cur);
        if (s.exact) break; /* every start gives the optimum */
    }
    if (s.core && s.core <= SEARCH_CORE_VARS && core_steps > 0) {
        /* a bounded branch and bound on the core from the best point: proves it, or improves it */
        adt_search_problem c;
        int *map = adt_malloc((size_t)n * sizeof *map), *inv = adt_malloc((size_t)n * sizeof *inv);
        core_problem(&w, &c, map, inv);
        int *xc = adt_malloc((size_t)(c.n_vars ? c.n_vars : 1) * sizeof *xc);
        for (int i = 0; i < c.n_vars; i++) xc[i] = best[map[i]];
        double jc = adt_search_cost(&c, xc);
        s.exact = bnb_run(&c, xc, jc * (1 + 1e-12) + 1e-300, core_steps);
        for (int i = 0; i < c.n_vars; i++) cur[map[i]] = xc[i];
        back_substitute(rec, n_rec, &w.q, cur);
        double j = adt_search_cost(p, cur);
        if (j < best_j) best_j = j, memcpy(best, cur, (size_t)n * sizeof *cur);
        free(map), free(inv), free(xc);
        adt_search_free(&c);
    }
    memcpy(x, best, (size_t)p->n_vars * sizeof *x);
    for (int i = 0; i < n_rec; i++) free(rec[i].best);
    free(rec), free(cur), free(best);
    work_free(&w);
    if (st) *st = s;
    return best_j;
}

/* ---- branch and bound ----------------------------------------------------------------------------- */

typedef struct bnb {
    const adt_search_problem *p;
    int *order, *pos;  /* variables in assignment order; pos[v] its place            */
    int **adj, *deg;   /* incident edges                                               */
    int *x, *bx;
    double **part;     /* [v][k]: unary plus the edges to assigned neighbours          */
    double *minp;      /* [v]: min over k of part[v]                                    */
    double **save;     /* [depth]: rows of the neighbours changed at that depth         */
    int kmax;
    double best, steps, max_steps;
    int aborted;
} bnb;

static double row_min(const double *r, int k) {
    double m = r[0];
    for (int i = 1; i < k; i++) m = r[i] < m ? r[i] : m;
    return m;
}

/* Depth-first over order[d..]; lb = sum of minp over them (a lower bound on what they add:
 * each at its cheapest given the assigned neighbours, edges among themselves >= 0). */
static void dfs(bnb *b, int d, double acc, double lb) {
    const adt_search_problem *p = b->p;
    if (b->aborted) return;
    if (++b->steps > b->max_steps) {
        b->aborted = 1;
        return;
    }
    if (d == p->n_vars) {
        if (acc < b->best) b->best = acc, memcpy(b->bx, b->x, (size_t)p->n_vars * sizeof *b->x);
        return;
    }
    int v = b->order[d];
    double *save = b->save[d];
    for (int k = 0; k < p->k[v]; k++) {
        double a = add_cost(acc, b->part[v][k]);
        if (a >= b->best) continue;
        b->x[v] = k;
        /* the unassigned neighbours now see v = k */
        double rest = lb - b->minp[v];
        int ns = 0;
        for (int j = 0; j < b->deg[v]; j++) {
            int e = b->adj[v][j], o = other_end(p, e, v);
            if (b->pos[o] <= d) continue;
            memcpy(save + (size_t)ns * (b->kmax + 1), b->part[o], (size_t)p->k[o] * sizeof(double));
            save[(size_t)ns * (b->kmax + 1) + b->kmax] = b->minp[o];
            ns++;
            for (int q = 0; q < p->k[o]; q++) b->part[o][q] = add_cost(b->part[o][q], edge_from(p, e, v, k, q));
            double m = row_min(b->part[o], p->k[o]);
            rest += m - b->minp[o];
            b->minp[o] = m;
        }
        if (add_cost(a, rest) < b->best * (1 - 1e-12)) dfs(b, d + 1, a, rest);
        for (int j = b->deg[v] - 1; j >= 0; j--) { /* restore in reverse */
            int e = b->adj[v][j], o = other_end(p, e, v);
            if (b->pos[o] <= d) continue;
            ns--;
            memcpy(b->part[o], save + (size_t)ns * (b->kmax + 1), (size_t)p->k[o] * sizeof(double));
            b->minp[o] = save[(size_t)ns * (b->kmax + 1) + b->kmax];
        }
    }
}

/* Branch and bound from an incumbent (x holds it when best < infinity): x receives the optimum.
 * Returns 1 when the search finished (x optimal), 0 when it ran out of steps (x the best seen). */
static int bnb_run(const adt_search_problem *p, int *x, double best, double max_nodes) {
    int n = p->n_vars ? p->n_vars : 1;
    bnb b = {.p = p, .best = best, .max_steps = max_nodes};
    b.order = adt_malloc((size_t)n * sizeof *b.order);
    b.pos = adt_malloc((size_t)n * sizeof *b.pos);
    b.x = adt_calloc((size_t)n, sizeof *b.x);
    b.bx = adt_calloc((size_t)n, sizeof *b.bx);
    b.adj = adt_calloc((size_t)n, sizeof *b.adj);
    b.deg = adt_calloc((size_t)n, sizeof *b.deg);
    b.part = adt_calloc((size_t)n, sizeof *b.part);
    b.minp = adt_calloc((size_t)n, sizeof *b.minp);
    b.save = adt_calloc((size_t)n, sizeof *b.save);
    int *cap = adt_calloc((size_t)n, sizeof *cap);
    for (int e = 0; e < p->n_edges; e++)
        for (int s = 0; s < 2; s++) {
            int v = s ? p->eb[e] : p->ea[e];
            if (b.deg[v] == cap[v]) cap[v] = cap[v] ? 2 * cap[v] : 4, b.adj[v] = adt_realloc(b.adj[v], (size_t)cap[v] * sizeof(int));
            b.adj[v][b.deg[v]++] = e;
        }
    /* breadth-first order, so a variable's neighbours are mostly assigned before it */
    for (int v = 0; v < p->n_vars; v++) b.pos[v] = p->n_vars;
    int m = 0;
    for (int s = 0; s < p->n_vars; s++) {
        if (b.pos[s] < p->n_vars) continue;
        int head = m;
        b.pos[s] = m, b.order[m++] = s;
        while (head < m) {
            int v = b.order[head++];
            for (int j = 0; j < b.deg[v]; j++) {
                int o = other_end(p, b.adj[v][j], v);
                if (b.pos[o] == p->n_vars) b.pos[o] = m, b.order[m++] = o;
            }
        }
    }
    double lb = 0;
    for (int v = 0; v < p->n_vars; v++) {
        b.kmax = p->k[v] > b.kmax ? p->k[v] : b.kmax;
        b.part[v] = adt_malloc((size_t)p->k[v] * sizeof **b.part);
        memcpy(b.part[v], p->unary[v], (size_t)p->k[v] * sizeof **b.part);
        b.minp[v] = row_min(b.part[v], p->k[v]);
        lb = add_cost(lb, b.minp[v]);
    }
    for (int v = 0; v < p->n_vars; v++) b.save[b.pos[v]] = adt_malloc((size_t)(b.deg[v] + 1) * (b.kmax + 1) * sizeof(double));
    memcpy(b.bx, x, (size_t)p->n_vars * sizeof *x);
    dfs(&b, 0, 0.0, lb);
    memcpy(x, b.bx, (size_t)p->n_vars * sizeof *x);
    for (int v = 0; v < p->n_vars; v++) free(b.adj[v]), free(b.part[v]), free(b.save[v]);
    free(b.adj), free(b.deg), free(cap), free(b.order), free(b.pos), free(b.x), free(b.bx);
    free(b.part), free(b.minp), free(b.save);
    return !b.aborted;
}

double adt_search_exhaustive(const adt_search_problem *p, int *x, double max_nodes) {
    for (int v = 0; v < p->n_vars; v++) x[v] = 0;
    if (!bnb_run(p, x, ADT_SEARCH_INF * 2, max_nodes)) return -1.0;
    return adt_search_cost(p, x);
}
