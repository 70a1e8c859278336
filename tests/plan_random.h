/*
 * plan_random.h - random valid plans for tests. Every node of a training graph gets an n-D
 * signature drawn, from a seed, among those usable on the mesh (adt_node_nd_sigs: products of
 * the op's registered 1-D signatures whose blocks fit), and layers of the same structure are tied
 * as the planner ties repeated blocks: position by position they take the same choice. Leaves
 * keep the partitioner's default layout (their in-place updater's, else their first reader's),
 * which a valid plan needs. The result is signatures for adt_dist_partition, or a plan file that
 * `adtrain train --plan` accepts (docs/formats.md, "Plan files").
 *
 *   adt_nd_sig *sig = plan_random_sigs(g, &mesh, seed);        free() it
 *   plan_random_file(g, &cfg, batch, &mesh, seed, "p.json");   0, or -1 with adt_error_message()
 */
#ifndef ADTRAIN_TESTS_PLAN_RANDOM_H
#define ADTRAIN_TESTS_PLAN_RANDOM_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/adtrain.h"

/* Whether nodes a and b do the same thing on the same shapes (a tie may copy a's choice to b). */
static inline int plan_random_same_node(const adt_graph *g, const adt_node *a, const adt_node *b) {
    if (a->op != b->op || a->n_in != b->n_in || a->n_out != b->n_out || a->is_backward != b->is_backward ||
        a->is_optimizer != b->is_optimizer)
        return 0;
    for (int i = 0; i < a->n_in; i++)
        if (!adt_shape_equal(&g->values[a->in[i]].shape, &g->values[b->in[i]].shape)) return 0;
    for (int i = 0; i < a->n_out; i++)
        if (!adt_shape_equal(&g->values[a->out[i]].shape, &g->values[b->out[i]].shape)) return 0;
    return 1;
}

/* tie[i]: the node whose choice node i copies (a node of the first earlier layer with the same
 * structure, at the same position), or -1 when node i draws its own. */
static inline int *plan_random_ties(const adt_graph *g) {
    int n_layers = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].layer_tag + 1 > n_layers) n_layers = g->nodes[i].layer_tag + 1;
    /* the nodes of each layer, in graph order */
    int *count = calloc((size_t)n_layers + 1, sizeof *count), *first = calloc((size_t)n_layers + 1, sizeof *first);
    int *order = malloc((size_t)g->n_nodes * sizeof *order), *tie = malloc((size_t)g->n_nodes * sizeof *tie);
    for (int i = 0; i < g->n_nodes; i++) count[g->nodes[i].layer_tag]++;
    for (int t = 1; t <= n_layers; t++) first[t] = first[t - 1] + count[t - 1];
    int *fill = calloc((size_t)n_layers + 1, sizeof *fill);
    for (int i = 0; i < g->n_nodes; i++) {
        int t = g->nodes[i].layer_tag;
        order[first[t] + fill[t]++] = i;
        tie[i] = -1;
    }
    for (int t = 1; t < n_layers; t++)
        for (int u = 0; u < t; u++) {
            int same = count[u] == count[t] && count[t] > 0;
            for (int k = 0; same && k < count[t]; k++)
                same = plan_random_same_node(g, &g->nodes[order[first[u] + k]], &g->nodes[order[first[t] + k]]);
            if (!same) continue;
            for (int k = 0; k < count[t]; k++) {
                int from = order[first[u] + k];
                tie[order[first[t] + k]] = tie[from] >= 0 ? tie[from] : from;
            }
            break;
        }
    free(count), free(first), free(order), free(fill);
    return tie;
}

/* A random usable signature per node (malloc'd [g->n_nodes]); tied layers choose alike. */
static inline adt_nd_sig *plan_random_sigs(const adt_graph *g, const adt_mesh *m, uint64_t seed) {
    adt_nd_sig *sig = calloc((size_t)g->n_nodes, sizeof *sig);
    int *choice = calloc((size_t)g->n_nodes, sizeof *choice), *tie = plan_random_ties(g);
    for (int i = 0; i < g->n_nodes; i++) {
        int n = adt_node_nd_sigs(g, i, m, NULL, 0);
        adt_nd_sig *all = calloc((size_t)(n > 0 ? n : 1), sizeof *all);
        adt_node_nd_sigs(g, i, m, all, n);
        choice[i] = tie[i] >= 0 && choice[tie[i]] < n ? choice[tie[i]] : (int)(adt_rng_u32(seed, (uint64_t)i) % (uint32_t)n);
        sig[i] = all[choice[i]];
        free(all);
    }
    free(choice);
    free(tie);
    return sig;
}

/* Writes a random plan of graph g (model c at global batch `batch`, built as adtrain train and
 * adtrain plan build it) on mesh m to `path`: the data-parallel expert plan for m's device count
 * gives what the plan is made for, then the mesh takes m's shape and every node a random
 * signature. The plan is validated before it is written. */
static inline int plan_random_file(const adt_graph *g, const adt_model_cfg *c, int batch, const adt_mesh *m,
                                   uint64_t seed, const char *path) {
    adt_plan p;
    adt_expert_opts eo = {.strategy = "dp", .devices = m->nranks, .batch = batch};
    if (adt_expert_plan(g, c, &eo, &p)) return -1;
    p.mesh.ndim = m->ndim;
    for (int a = 0; a < m->ndim; a++) {
        p.mesh.dim[a] = m->dim[a];
        snprintf(p.axis[a], sizeof p.axis[a], "a%d", a);
    }
    p.mesh.intra_axis = m->ndim - 1;
    p.cost = adt_comm_cost_default(&p.mesh);
    snprintf(p.strategy, sizeof p.strategy, "random %llu", (unsigned long long)seed);
    free(p.node_sig);
    p.node_sig = plan_random_sigs(g, &p.mesh, seed);
    memset(p.leaf_sbp, 0, (size_t)g->n_values * sizeof *p.leaf_sbp);
    int rc = adt_plan_validate(&p, g);
    if (!rc) rc = adt_plan_save(&p, g, path);
    adt_plan_free(&p);
    return rc ? -1 : 0;
}

#endif
