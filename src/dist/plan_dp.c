/*
 * plan_dp.c - the default data-parallel plan: the batch split over every mesh axis, parameters
 * and optimizer state replicated, gradients summed (P -> B all-reduce) before the update.
 *
 * This is the plan `adtrain train` runs under mpiexec when no plan is given. It is a stand-in
 * until the expert plans of the planner land; it is built the simple way: fed inputs and labels
 * are held as S(0) on every mesh axis, every other leaf as B, and each node takes, among its
 * usable n-D signatures, the one whose inputs need the cheapest boxing from the layouts its
 * producers chose (ties to the first in product order, all-B first). Every op has a batch-split
 * signature that matches a batch-split input exactly, so activations and their gradients stay
 * split, weight gradients come out P, and the optimizer nodes (forced all-B) read them through
 * one all-reduce each.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

/* Seconds to box a value from `from` to `to` (INFINITY when impossible). */
static double box_cost(const adt_mesh *m, const adt_value *v, const adt_ndsbp *from, const adt_ndsbp *to,
                       const adt_comm_cost *cost) {
    if (adt_ndsbp_equal(from, to)) return 0;
    adt_boxing_prog p;
    if (adt_boxing_plan(m, v->shape, v->dtype, from, to, cost, &p)) return INFINITY;
    return p.time;
}

static adt_ndsbp batch_split(const adt_mesh *m) {
    adt_ndsbp s = adt_ndsbp_all_b(m->ndim);
    for (int a = 0; a < m->ndim; a++) s.s[a] = (adt_sbp){ADT_SBP_S, 0};
    return s;
}

void adt_dist_dp_plan_free(adt_dist_plan *p) {
    free((void *)p->node_sig);
    free((void *)p->leaf_sbp);
    p->node_sig = NULL;
    p->leaf_sbp = NULL;
}

int adt_dist_dp_plan(const adt_graph *g, const adt_mesh *m, adt_dist_plan *out) {
    memset(out, 0, sizeof *out);
    if (g->status) return adt_error(g->status, "data-parallel plan: the graph has an error: %s", g->err);
    out->mesh = *m;
    for (int a = 0; a < m->ndim; a++) out->cost.alpha[a] = 1e-5, out->cost.beta[a] = 1e-9;
    out->cost.local = 1e-12;
    adt_nd_sig *sig = adt_calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *sig);
    adt_ndsbp *leaf = adt_calloc((size_t)(g->n_values ? g->n_values : 1), sizeof *leaf);
    adt_ndsbp *lay = adt_calloc((size_t)(g->n_values ? g->n_values : 1), sizeof *lay);
    int rc = ADT_OK;
    char mb[32];
    for (int v = 0; v < g->n_values && !rc; v++) {
        const adt_value *val = &g->values[v];
        if (val->producer >= 0) continue;
        int split = adt_role_is_fed(val->role) && v != g->lr_input && v != g->step_input;
        leaf[v] = split ? batch_split(m) : adt_ndsbp_all_b(m->ndim);
        if (split && !adt_ndsbp_fits(&leaf[v], m, val->shape))
            rc = adt_error(ADT_ERR_ARG, "data-parallel plan: '%s' has a batch of %lld, fewer than the %d ranks of "
                           "mesh %s; expected at least one sample per rank",
                           val->name, (long long)(val->shape.ndim ? val->shape.dim[0] : 0), m->nranks,
                           adt_mesh_str(m, mb, sizeof mb));
        lay[v] = leaf[v];
    }
    for (int i = 0; i < g->n_nodes && !rc; i++) {
        const adt_node *n = &g->nodes[i];
        int ns = adt_node_nd_sigs(g, i, m, NULL, 0);
        adt_nd_sig *all = adt_calloc((size_t)(ns ? ns : 1), sizeof *all);
        adt_node_nd_sigs(g, i, m, all, ns);
        int best = 0; /* all-B, the only choice for an optimizer update (replicated state) */
        double best_cost = INFINITY;
        for (int c = 0; c < ns && !n->is_optimizer; c++) {
            double cost = 0;
            for (int j = 0; j < n->n_in && cost < best_cost; j++)
                cost += box_cost(m, &g->values[n->in[j]], &lay[n->in[j]], &all[c].in[j], &out->cost);
            if (cost < best_cost) best = c, best_cost = cost;
        }
        if (ns > 0) sig[i] = all[best];
        else rc = adt_error(ADT_ERR_SHAPE, "data-parallel plan: node %s has no usable signature on mesh %s", n->name,
                            adt_mesh_str(m, mb, sizeof mb));
        for (int k = 0; k < n->n_out && !rc; k++) lay[n->out[k]] = sig[i].out[k];
        free(all);
    }
    free(lay);
    out->node_sig = sig;
    out->leaf_sbp = leaf;
    if (rc) adt_dist_dp_plan_free(out);
    return rc;
}
