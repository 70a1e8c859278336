/*
 * space.c - the signature-assignment problem of a training graph on a stage mesh: which nodes
 * share one choice (layers of equal structure, by layer tag), which n-D signatures each may take,
 * what each choice costs on its own (compute, and the bytes it keeps per device for the memory
 * penalty) and what each edge costs between two choices (the boxing program's time, by the
 * same adt_boxing_plan the partitioner inserts).
 *
 * Leaves: a parameter or optimizer state is held as its in-place updater reads it, so the edge
 * runs from the updater's choice to every other reader (a ZeRO-held weight gathered for the
 * forward pass is that edge's all-gather); a fed input or a leaf without an updater is held as
 * its first reader reads it (P read as B). An edge is priced once per reader (the partitioner
 * reuses a layout a value was already boxed to; the search does not see that discount, the cost
 * model of the final plan does).
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"

static adt_ndsbp no_partial(adt_ndsbp s) {
    for (int a = 0; a < s.ndim; a++)
        if (s.s[a].kind == ADT_SBP_P) s.s[a] = (adt_sbp){ADT_SBP_B, 0};
    return s;
}

static int inplace_input(int k) { return k == 0 ? 0 : 1 + k; }

static uint64_t mix(uint64_t h, uint64_t x) { return adt_rng_mix64(h ^ (x + 0x9e3779b97f4a7c15ULL)); }

static uint64_t shape_hash(uint64_t h, const adt_shape *s) {
    h = mix(h, (uint64_t)s->ndim);
    for (int d = 0; d < s->ndim; d++) h = mix(h, (uint64_t)s->dim[d]);
    return h;
}

/* ---- ties: layers of equal structure share every choice ------------------------------------------- */

static int max_tag(const adt_graph *g) {
    int t = 0;
    for (int i = 0; i < g->n_nodes; i++) t = g->nodes[i].layer_tag > t ? g->nodes[i].layer_tag : t;
    return t;
}

/* var_of[i] for every node; returns the number of variables; rep[] their first nodes. */
static int tie_nodes(const adt_graph *g, int *var_of, int **rep_out) {
    int L = max_tag(g) + 1, N = g->n_nodes;
    int *count = adt_calloc((size_t)L, sizeof *count), *pos = adt_malloc((size_t)(N ? N : 1) * sizeof *pos);
    uint64_t *h = adt_calloc((size_t)L, sizeof *h);
    for (int i = 0; i < N; i++) {
        const adt_node *n = &g->nodes[i];
        int t = n->layer_tag < 0 ? 0 : n->layer_tag;
        pos[i] = count[t]++;
        uint64_t x = mix(h[t], (uint64_t)n->op);
        x = mix(x, (uint64_t)(n->n_in | n->n_out << 8 | n->is_backward << 16 | n->is_optimizer << 17));
        for (int k = 0; k < 8; k++) x = mix(x, (uint64_t)n->a.i[k]);
        for (int k = 0; k < 6; k++) {
            uint32_t f;
            memcpy(&f, &n->a.f[k], 4);
            x = mix(x, f);
        }
        for (int j = 0; j < n->n_in; j++) {
            const adt_value *v = &g->values[n->in[j]];
            x = shape_hash(x, &v->shape);
            int pr = v->producer;
            /* wiring: a producer in the same layer by its position, else where the value comes from */
            x = mix(x, pr >= 0 && g->nodes[pr].layer_tag == n->layer_tag ? (uint64_t)pos[pr] : pr >= 0 ? 1u << 30 : (uint64_t)(2u << 30) + v->role);
        }
        for (int k = 0; k < n->n_out; k++) x = shape_hash(x, &g->values[n->out[k]].shape);
        h[t] = x;
    }
    /* layer t ties to the first layer with the same hash and count */
    int *first_of = adt_malloc((size_t)L * sizeof *first_of);
    for (int t = 0; t < L; t++) {
        first_of[t] = t;
        for (int u = 0; u < t; u++)
            if (first_of[u] == u && h[u] == h[t] && count[u] == count[t]) {
                first_of[t] = u;
                break;
            }
    }
    /* variables: one per position of each untied layer */
    int *base = adt_malloc((size_t)L * sizeof *base), nv = 0;
    for (int t = 0; t < L; t++) base[t] = first_of[t] == t ? (nv += count[t]) - count[t] : -1;
    int *rep = adt_malloc((size_t)(nv ? nv : 1) * sizeof *rep);
    for (int i = 0; i < nv; i++) rep[i] = -1;
    for (int i = 0; i < N; i++) {
        int t = g->nodes[i].layer_tag < 0 ? 0 : g->nodes[i].layer_tag;
        var_of[i] = base[first_of[t]] + pos[i];
        if (rep[var_of[i]] < 0) rep[var_of[i]] = i;
    }
    free(count), free(pos), free(h), free(first_of), free(base);
    *rep_out = rep;
    return nv;
}

/* ---- edge instances, summed by kind --------------------------------------------------------------- */

/* The layout variable `src` gives a value at choice k: output `idx` of its signature, or (leaf held
 * as read) input `idx` with P read as B. */
typedef struct einst {
    int src, src_in, idx, dst, dst_idx, value;
    uint64_t h;
    double count;
} einst;

static double block_bytes(const adt_graph *g, int v, const adt_ndsbp *s, const adt_mesh *m) {
    adt_shape lo, hi;
    adt_ndsbp_block_bounds(s, m, g->values[v].shape, &lo, &hi);
    return (double)adt_shape_numel(&hi) * (double)adt_dtype_size(g->values[v].dtype);
}

/* Whether an in-place node's signature reads its state without P (a leaf is never held as P). */
static int state_ok(const adt_node *n, const adt_nd_sig *s) {
    if (!adt_op_get(n->op)->inplace) return 1;
    for (int k = 0; k < n->n_out; k++)
        if (adt_ndsbp_partial_mask(&s->in[inplace_input(k)])) return 0;
    return 1;
}

enum { OPERAND_OUT, OPERAND_HELD, OPERAND_IN };

/* The layouts k choices give one operand (output idx; input idx as a leaf is held, P read as B;
 * input idx as read), each once in u; which one every choice gives in at[]. Returns how many. */
static int distinct_layouts(const adt_nd_sig *sigs, int k, int operand, int idx, adt_ndsbp *u, int *at) {
    int n = 0;
    for (int c = 0; c < k; c++) {
        adt_ndsbp l = operand == OPERAND_OUT ? sigs[c].out[idx] : operand == OPERAND_HELD ? no_partial(sigs[c].in[idx])
                                                                                          : sigs[c].in[idx];
        int j = 0;
        while (j < n && !adt_ndsbp_equal(&u[j], &l)) j++;
        if (j == n) u[n++] = l;
        at[c] = j;
    }
    return n;
}

int adt_sbp_space_build(adt_sbp_space *s, const adt_graph *g, const adt_mesh *m, const adt_comm_cost *cost,
                        const adt_cluster *c, double lambda, adt_sig_cache *sigs, adt_boxing_cache *boxing) {
    memset(s, 0, sizeof *s);
    if (g->status) return adt_error(g->status, "planner: the graph has an error: %s", g->err);
    int N = g->n_nodes, V = g->n_values;
    s->var_of = adt_malloc((size_t)(N ? N : 1) * sizeof *s->var_of);
    int nv = tie_nodes(g, s->var_of, &s->rep);
    int *k = adt_malloc((size_t)(nv ? nv : 1) * sizeof *k);
    s->sigs = adt_calloc((size_t)(nv ? nv : 1), sizeof *s->sigs);
    s->mem = adt_calloc((size_t)(nv ? nv : 1), sizeof *s->mem);
    adt_sig_cache own = {.g = g, .m = m}, *scache = sigs ? sigs : &own;
    for (int v = 0; v < nv; v++) {
        int r = s->rep[v], n_all;
        const adt_nd_sig *usable = adt_sig_cache_get(scache, r, &n_all);
        adt_nd_sig *all = adt_malloc((size_t)(n_all ? n_all : 1) * sizeof *all);
        int n_ok = 0;
        for (int q = 0; q < n_all; q++)
            if (state_ok(&g->nodes[r], &usable[q])) all[n_ok++] = usable[q];
        if (!n_ok) {
            free(all), free(k);
            adt_sig_cache_free(&own);
            adt_sbp_space_free(s);
            return adt_error(ADT_ERR_ARG, "planner: node %s (%s) has no usable signature on the mesh",
                             g->nodes[r].name, adt_op_name(g->nodes[r].op));
        }
        s->sigs[v] = all;
        k[v] = n_ok;
        s->mem[v] = adt_calloc((size_t)n_ok, sizeof **s->mem);
    }
    adt_sig_cache_free(&own);
    adt_search_init(&s->prob, nv, k);
    free(k);

    /* who decides each leaf's held layout: its updater (input idx), else its first reader */
    int *dec_node = adt_malloc((size_t)(V ? V : 1) * sizeof *dec_node), *dec_in = adt_malloc((size_t)(V ? V : 1) * sizeof *dec_in);
    char *bwd_read = adt_calloc((size_t)(V ? V : 1), 1);
    for (int v = 0; v < V; v++) dec_node[v] = -1;
    for (int i = 0; i < N; i++) {
        const adt_node *n = &g->nodes[i];
        if (!adt_op_get(n->op)->inplace) continue;
        for (int q = 0; q < n->n_out; q++) {
            int v = n->in[inplace_input(q)];
            if (g->values[v].producer < 0 && dec_node[v] < 0) dec_node[v] = i, dec_in[v] = inplace_input(q);
        }
    }
    for (int i = 0; i < N; i++) {
        const adt_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            int v = n->in[j];
            if (n->is_backward) bwd_read[v] = 1;
            if (g->values[v].producer < 0 && dec_node[v] < 0) dec_node[v] = i, dec_in[v] = j;
        }
    }

    adt_boxing_cache own_bc = {.m = m, .cost = cost}, *bc = boxing ? boxing : &own_bc;
    /* unary: compute of every member, a local step for a P read of a leaf it holds. Members of a
     * variable have the representative's op, attributes and shapes (tie_nodes), so its compute
     * times serve every member whose operands also have its dtypes. */
    double **rep_t = adt_calloc((size_t)(nv ? nv : 1), sizeof *rep_t);
    for (int i = 0; i < N; i++) {
        int v = s->var_of[i], r = s->rep[v];
        const adt_node *n = &g->nodes[i];
        int same = i != r;
        for (int j = 0; same && j < n->n_in + n->n_out; j++) {
            int x = j < n->n_in ? n->in[j] : n->out[j - n->n_in];
            int y = j < n->n_in ? g->nodes[r].in[j] : g->nodes[r].out[j - n->n_in];
            same = g->values[x].dtype == g->values[y].dtype;
        }
        if (i == r) rep_t[v] = adt_malloc((size_t)s->prob.k[v] * sizeof **rep_t);
        for (int q = 0; q < s->prob.k[v]; q++) {
            const adt_nd_sig *sg = &s->sigs[v][q];
            double u = same ? rep_t[v][q] : adt_node_sig_time(g, i, sg, m, c);
            if (i == r) rep_t[v][q] = u;
            for (int j = 0; j < n->n_in; j++) {
                int x = n->in[j];
                if (g->values[x].producer < 0 && dec_node[x] == i && dec_in[x] == j && adt_ndsbp_partial_mask(&sg->in[j]))
                    u += cost->local;
            }
            for (int o = 0; o < n->n_out; o++) {
                int x = n->out[o];
                if (!n->is_backward && !n->is_optimizer && bwd_read[x] && g->values[x].alias_of < 0)
                    s->mem[v][q] += block_bytes(g, x, &sg->out[o], m);
            }
            s->prob.unary[v][q] += u;
        }
    }
    for (int v = 0; v < nv; v++) free(rep_t[v]);
    free(rep_t);
    /* persistent leaves: bytes by the deciding choice */
    for (int x = 0; x < V; x++) {
        if (g->values[x].producer >= 0 || dec_node[x] < 0 || !adt_role_is_persistent(g->values[x].role)) continue;
        int v = s->var_of[dec_node[x]];
        for (int q = 0; q < s->prob.k[v]; q++) {
            adt_ndsbp held = no_partial(s->sigs[v][q].in[dec_in[x]]);
            s->mem[v][q] += block_bytes(g, x, &held, m);
        }
    }
    /* edges: instances grouped by (source choice, destination choice, value shape) */
    einst *es = NULL;
    int n_es = 0, cap_es = 0;
    size_t hcap = 1;
    while (hcap < (size_t)4 * (N + 1) * 4) hcap <<= 1;
    int *hslot = adt_malloc(hcap * sizeof *hslot);
    for (size_t i = 0; i < hcap; i++) hslot[i] = -1;
    for (int i = 0; i < N; i++) {
        const adt_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            int x = n->in[j], pr = g->values[x].producer;
            einst e = {.dst = s->var_of[i], .dst_idx = j, .value = x, .count = 1};
            if (pr >= 0) e.src = s->var_of[pr], e.src_in = 0, e.idx = g->values[x].out_index;
            else if (dec_node[x] == i && dec_in[x] == j) continue; /* held as this read */
            else e.src = s->var_of[dec_node[x]], e.src_in = 1, e.idx = dec_in[x];
            uint64_t h = mix(mix(mix(mix(mix(7, (uint64_t)e.src), (uint64_t)(e.src_in | e.idx << 1)), (uint64_t)e.dst),
                                 (uint64_t)e.dst_idx), (uint64_t)g->values[x].dtype);
            e.h = shape_hash(h, &g->values[x].shape);
            size_t slot = e.h & (hcap - 1);
            int found = -1;
            while (hslot[slot] >= 0) {
                einst *f = &es[hslot[slot]];
                if (f->h == e.h && f->src == e.src && f->src_in == e.src_in && f->idx == e.idx && f->dst == e.dst &&
                    f->dst_idx == e.dst_idx) {
                    found = hslot[slot];
                    break;
                }
                slot = (slot + 1) & (hcap - 1);
            }
            if (found >= 0) {
                es[found].count += 1;
                continue;
            }
            if (n_es == cap_es) cap_es = cap_es ? 2 * cap_es : 64, es = adt_realloc(es, (size_t)cap_es * sizeof *es);
            hslot[slot] = n_es;
            es[n_es++] = e;
        }
    }
    /* a matrix prices each distinct (source layout, destination layout) once: many choices of a
     * node give one input or output the same layout */
    int kmax = 1;
    for (int v = 0; v < nv; v++) kmax = s->prob.k[v] > kmax ? s->prob.k[v] : kmax;
    adt_ndsbp *ua = adt_malloc(2 * (size_t)kmax * sizeof *ua), *ub = ua + kmax;
    int *ia = adt_malloc(2 * (size_t)kmax * sizeof *ia), *ib = ia + kmax;
    double *mat = adt_malloc((size_t)kmax * kmax * sizeof *mat), *ut = adt_malloc((size_t)kmax * kmax * sizeof *ut);
    for (int q = 0; q < n_es; q++) {
        einst *e = &es[q];
        int ka = s->prob.k[e->src], kb = s->prob.k[e->dst];
        int na = distinct_layouts(s->sigs[e->src], ka, e->src_in ? OPERAND_HELD : OPERAND_OUT, e->idx, ua, ia);
        int nb = distinct_layouts(s->sigs[e->dst], kb, OPERAND_IN, e->dst_idx, ub, ib);
        const adt_value *val = &g->values[e->value];
        for (int a = 0; a < na; a++)
            for (int b = 0; b < nb; b++) {
                double t = adt_boxing_cache_time(bc, val, &ua[a], &ub[b], NULL);
                ut[a * nb + b] = t >= ADT_SEARCH_INF ? ADT_SEARCH_INF : t * e->count;
            }
        for (int a = 0; a < ka; a++)
            for (int b = 0; b < kb; b++) mat[a * kb + b] = ut[ia[a] * nb + ib[b]];
        adt_search_add_pair(&s->prob, e->src, e->dst, mat);
    }
    free(ua), free(ia), free(mat), free(ut);
    adt_sbp_space_set_penalty(s, lambda);
    free(es), free(hslot), free(dec_node), free(dec_in), free(bwd_read);
    adt_boxing_cache_free(&own_bc);
    return ADT_OK;
}

void adt_sbp_space_set_penalty(adt_sbp_space *s, double lambda) {
    double d = lambda - s->lambda;
    if (d != 0)
        for (int v = 0; v < s->prob.n_vars; v++)
            for (int q = 0; q < s->prob.k[v]; q++) s->prob.unary[v][q] += d * s->mem[v][q];
    s->lambda = lambda;
}

void adt_sbp_space_free(adt_sbp_space *s) {
    for (int v = 0; v < s->prob.n_vars; v++) free(s->sigs ? s->sigs[v] : NULL), free(s->mem ? s->mem[v] : NULL);
    adt_search_free(&s->prob);
    free(s->var_of), free(s->rep), free(s->sigs), free(s->mem);
    memset(s, 0, sizeof *s);
}

static int sig_equal(const adt_nd_sig *a, const adt_nd_sig *b, const adt_node *n) {
    for (int j = 0; j < n->n_in; j++)
        if (!adt_ndsbp_equal(&a->in[j], &b->in[j])) return 0;
    for (int k = 0; k < n->n_out; k++)
        if (!adt_ndsbp_equal(&a->out[k], &b->out[k])) return 0;
    return 1;
}

void adt_sbp_space_choice(const adt_sbp_space *s, const adt_graph *g, const adt_nd_sig *node_sig, int *x) {
    for (int v = 0; v < s->prob.n_vars; v++) {
        int r = s->rep[v];
        x[v] = -1;
        for (int q = 0; q < s->prob.k[v] && x[v] < 0; q++)
            if (sig_equal(&s->sigs[v][q], &node_sig[r], &g->nodes[r])) x[v] = q;
    }
}

void adt_leaf_layouts(const adt_graph *g, const adt_nd_sig *node_sig, adt_ndsbp *leaf_sbp) {
    int nd = g->n_nodes ? node_sig[0].ndim : 1;
    for (int v = 0; v < g->n_values; v++) leaf_sbp[v].ndim = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (!adt_op_get(n->op)->inplace) continue;
        for (int q = 0; q < n->n_out; q++) {
            int v = n->in[inplace_input(q)];
            if (g->values[v].producer < 0 && !leaf_sbp[v].ndim) leaf_sbp[v] = node_sig[i].in[inplace_input(q)];
        }
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        for (int j = 0; j < n->n_in; j++) {
            int v = n->in[j];
            if (g->values[v].producer < 0 && !leaf_sbp[v].ndim) leaf_sbp[v] = no_partial(node_sig[i].in[j]);
        }
    }
    for (int v = 0; v < g->n_values; v++)
        if (g->values[v].producer < 0 && !leaf_sbp[v].ndim) leaf_sbp[v] = adt_ndsbp_all_b(nd);
}

void adt_sbp_space_apply(const adt_sbp_space *s, const adt_graph *g, const int *x, adt_nd_sig *node_sig,
                         adt_ndsbp *leaf_sbp) {
    for (int i = 0; i < g->n_nodes; i++) node_sig[i] = s->sigs[s->var_of[i]][x[s->var_of[i]]];
    adt_leaf_layouts(g, node_sig, leaf_sbp);
}
