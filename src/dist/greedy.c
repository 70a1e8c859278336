/*
 * greedy.c - one n-D signature per node by greedy propagation in topological order: each node
 * takes the usable signature whose inputs are cheapest to box from the layouts they are in, plus
 * its compute time. Expert plans run it after fixing the leaf layouts their strategy implies
 * (and a filter saying which signatures the strategy allows); the planner starts from it.
 *
 * The costs mirror the partitioner exactly: a value is boxed from the layout it was produced (or
 * is held) in, and a layout it was already boxed to is reused for free, so the boxing the greedy
 * prices is the boxing the partitioner will insert.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

/* Layouts each value has been boxed to so far (the partitioner's cache). */
typedef struct boxed_list {
    adt_ndsbp *to;
    int n, cap;
} boxed_list;

typedef struct greedy {
    const adt_graph *g;
    const adt_mesh *m;
    const adt_greedy_opts *o;
    adt_ndsbp *layout; /* [n_values]: produced or held; ndim 0 for an open leaf */
    boxed_list *boxed; /* [n_values] */
    adt_boxing_cache bc;      /* where the caller gives none */
    adt_boxing_cache *boxing; /* the one in use */
    adt_sig_cache sc;  /* usable signatures per node structure (repeated layers share them), where
                          the caller gives none */
} greedy;

static adt_ndsbp no_partial(adt_ndsbp s) {
    for (int a = 0; a < s.ndim; a++)
        if (s.s[a].kind == ADT_SBP_P) s.s[a] = (adt_sbp){ADT_SBP_B, 0};
    return s;
}

/* Seconds to make value v available in layout `want`; a negative number when no program
 * exists. An open leaf is read in any layout but P for free (it will be held that way). */
static double read_cost(greedy *gr, int v, const adt_ndsbp *want) {
    const adt_ndsbp *have = &gr->layout[v];
    if (!have->ndim) return adt_ndsbp_partial_mask(want) ? gr->o->cost.local : 0.0;
    if (adt_ndsbp_equal(have, want)) return 0.0;
    const boxed_list *b = &gr->boxed[v];
    for (int i = 0; i < b->n; i++)
        if (adt_ndsbp_equal(&b->to[i], want)) return 0.0;
    double t = adt_boxing_cache_time(gr->boxing, &gr->g->values[v], have, want, NULL);
    return t >= ADT_BOXING_NONE ? -1.0 : t;
}

/* Input index of an in-place node that its output k overwrites (graph.c: w, then the states). */
static int inplace_input(int k) { return k == 0 ? 0 : 1 + k; }

static int reads_held_state(const greedy *gr, const adt_node *n, const adt_nd_sig *s) {
    if (!adt_op_get(n->op)->inplace) return 1;
    for (int k = 0; k < n->n_out; k++) {
        int j = inplace_input(k), v = n->in[j];
        if (gr->layout[v].ndim ? !adt_ndsbp_equal(&gr->layout[v], &s->in[j]) : adt_ndsbp_partial_mask(&s->in[j]) != 0)
            return 0;
    }
    return 1;
}

static double compute_cost(const greedy *gr, const adt_node *n, const adt_nd_sig *s) {
    if (gr->o->flop_rate <= 0) return 0.0;
    double parts = 1;
    for (int a = 0; a < gr->m->ndim; a++) {
        int split = 0;
        for (int i = 0; i < n->n_in && !split; i++) split = s->in[i].s[a].kind == ADT_SBP_S;
        for (int k = 0; k < n->n_out && !split; k++) split = s->out[k].s[a].kind == ADT_SBP_S;
        if (split) parts *= gr->m->dim[a];
    }
    return adt_node_flops(gr->g, n) / parts / gr->o->flop_rate;
}

static int split_outputs(const adt_node *n, const adt_nd_sig *s) {
    int c = 0;
    for (int k = 0; k < n->n_out; k++)
        for (int a = 0; a < s->ndim; a++) c += s->out[k].s[a].kind == ADT_SBP_S;
    return c;
}

/* Read costs of one node's inputs by the layout asked for: a node's candidates ask for few
 * distinct layouts of each input, and a boxing-cache lookup costs a hundred times a compare. */
#define READ_MEMO 32
typedef struct read_memo {
    adt_ndsbp want[ADT_MAX_INPUTS][READ_MEMO];
    double cost[ADT_MAX_INPUTS][READ_MEMO];
    int n[ADT_MAX_INPUTS];
} read_memo;

static double read_cost_memo(greedy *gr, read_memo *rm, int j, int v, const adt_ndsbp *want) {
    for (int q = 0; q < rm->n[j]; q++)
        if (adt_ndsbp_equal(&rm->want[j][q], want)) return rm->cost[j][q];
    double r = read_cost(gr, v, want);
    if (rm->n[j] < READ_MEMO) rm->want[j][rm->n[j]] = *want, rm->cost[j][rm->n[j]++] = r;
    return r;
}

/* The best of cands[0..n) for node i (with the filter when `filtered`), or -1. */
static int pick(greedy *gr, int i, const adt_nd_sig *cands, int n_cands, int filtered) {
    const adt_node *n = &gr->g->nodes[i];
    int best = -1, best_split = 0;
    double best_cost = 0;
    read_memo rm;
    memset(rm.n, 0, sizeof rm.n);
    for (int c = 0; c < n_cands; c++) {
        const adt_nd_sig *s = &cands[c];
        if (!reads_held_state(gr, n, s)) continue;
        if (filtered && gr->o->allow && !gr->o->allow(gr->o->ctx, gr->g, i, s, gr->layout)) continue;
        double cost = compute_cost(gr, n, s);
        for (int j = 0; j < n->n_in && cost >= 0; j++) {
            double r = read_cost_memo(gr, &rm, j, n->in[j], &s->in[j]);
            cost = r < 0 ? -1 : cost + r;
        }
        if (cost < 0) continue;
        int split = split_outputs(n, s);
        /* a relative tolerance, so rounding in the sums does not decide between equals */
        double tol = 1e-12 * (best_cost > cost ? best_cost : cost);
        if (best < 0 || cost < best_cost - tol || (cost <= best_cost + tol && split > best_split))
            best = c, best_cost = cost, best_split = split;
    }
    return best;
}

static void commit(greedy *gr, const adt_node *n, const adt_nd_sig *s, adt_ndsbp *leaf_sbp) {
    for (int j = 0; j < n->n_in; j++) {
        int v = n->in[j];
        if (!gr->layout[v].ndim) gr->layout[v] = leaf_sbp[v] = no_partial(s->in[j]); /* held as first read */
        if (adt_ndsbp_equal(&gr->layout[v], &s->in[j])) continue;
        boxed_list *b = &gr->boxed[v];
        int seen = 0;
        for (int k = 0; k < b->n && !seen; k++) seen = adt_ndsbp_equal(&b->to[k], &s->in[j]);
        if (seen) continue;
        if (b->n == b->cap) {
            b->cap = b->cap ? 2 * b->cap : 4;
            b->to = adt_realloc(b->to, (size_t)b->cap * sizeof *b->to);
        }
        b->to[b->n++] = s->in[j];
    }
    for (int k = 0; k < n->n_out; k++) gr->layout[n->out[k]] = s->out[k];
}

int adt_dist_greedy(const adt_graph *g, const adt_mesh *m, const adt_greedy_opts *o, adt_ndsbp *leaf_sbp,
                    adt_nd_sig *node_sig) {
    if (g->status) return adt_error(g->status, "greedy plan: the graph has an error: %s", g->err);
    greedy gr = {.g = g, .m = m, .o = o, .bc = {.m = m, .cost = &o->cost}, .sc = {.g = g, .m = m}};
    adt_sig_cache *sc = o->sigs ? o->sigs : &gr.sc;
    gr.boxing = o->boxing ? o->boxing : &gr.bc;
    gr.layout = adt_calloc((size_t)g->n_values + 1, sizeof *gr.layout);
    gr.boxed = adt_calloc((size_t)g->n_values + 1, sizeof *gr.boxed);
    int rc = ADT_OK;
    for (int v = 0; v < g->n_values && !rc; v++) {
        if (g->values[v].producer >= 0 || !leaf_sbp[v].ndim) continue;
        if (leaf_sbp[v].ndim != m->ndim || !adt_ndsbp_fits(&leaf_sbp[v], m, g->values[v].shape) ||
            adt_ndsbp_partial_mask(&leaf_sbp[v])) {
            char a[64], mb[32];
            rc = adt_error(ADT_ERR_ARG, "greedy plan: leaf '%s' cannot be held as %s on mesh %s", g->values[v].name,
                           adt_ndsbp_str(&leaf_sbp[v], a, sizeof a), adt_mesh_str(m, mb, sizeof mb));
        }
        gr.layout[v] = leaf_sbp[v];
    }
    for (int i = 0; i < g->n_nodes && !rc; i++) {
        int n_cands;
        const adt_nd_sig *cands = adt_sig_cache_get(sc, i, &n_cands);
        int best = pick(&gr, i, cands, n_cands, 1);
        if (best < 0) best = pick(&gr, i, cands, n_cands, 0);
        if (best < 0) {
            char mb[32];
            rc = adt_error(ADT_ERR_ARG, "greedy plan: node %s (%s) has no usable signature on mesh %s that reads its "
                           "in-place state as held",
                           g->nodes[i].name, adt_op_name(g->nodes[i].op), adt_mesh_str(m, mb, sizeof mb));
            break;
        }
        node_sig[i] = cands[best];
        commit(&gr, &g->nodes[i], &cands[best], leaf_sbp);
    }
    for (int v = 0; v < g->n_values && !rc; v++) /* leaves nobody reads: replicated */
        if (g->values[v].producer < 0 && !leaf_sbp[v].ndim) leaf_sbp[v] = adt_ndsbp_all_b(m->ndim);
    for (int v = 0; v < g->n_values; v++) free(gr.boxed[v].to);
    free(gr.boxed);
    free(gr.layout);
    adt_sig_cache_free(&gr.sc);
    adt_boxing_cache_free(&gr.bc);
    return rc;
}
