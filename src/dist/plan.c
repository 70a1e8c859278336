/*
 * plan.c - the plan object (include/adtrain/dist.h): what a plan was made for and the checks
 * that a plan fits a graph, its stage meshes, and the training graph a plan describes.
 * The file form is in plan_file.c, expert plans in expert.c.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

void adt_plan_free(adt_plan *p) {
    if (!p) return;
    free(p->mesh.ranks);
    free(p->node_sig);
    free(p->leaf_sbp);
    free(p->pending);
    free(p->batch_split);
    free(p->split_parts);
    memset(p, 0, sizeof *p);
}

/* ---- the graph a plan is for ----------------------------------------------------------------- */

static uint32_t crc_int(uint32_t c, int64_t x) { return adt_crc32c(c, &x, sizeof x); }

uint32_t adt_plan_graph_checksum(const adt_graph *g) {
    uint32_t c = crc_int(crc_int(0, g->n_values), g->n_nodes);
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        c = adt_crc32c(c, val->name, strlen(val->name));
        c = crc_int(crc_int(crc_int(c, val->dtype), val->role), val->shape.ndim);
        for (int d = 0; d < val->shape.ndim; d++) c = crc_int(c, val->shape.dim[d]);
    }
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        c = crc_int(crc_int(crc_int(c, n->op), n->n_in), n->n_out);
        for (int j = 0; j < n->n_in; j++) c = crc_int(c, n->in[j]);
        for (int k = 0; k < n->n_out; k++) c = crc_int(c, n->out[k]);
        c = crc_int(crc_int(crc_int(c, n->layer_tag), n->is_backward), n->is_optimizer);
    }
    return c;
}

int adt_plan_build_graph(const adt_plan *p, const adt_optim_cfg *oc, adt_graph **out) {
    *out = NULL;
    adt_optim_cfg def = p->optim == ADT_OPTIM_ADAMW ? adt_optim_adamw(0.9f, 0.95f, 1e-8f, 0.0f)
                                                    : adt_optim_sgd(p->momentum ? 0.9f : 0.0f, 0.0f);
    if (oc && (oc->kind != p->optim || (oc->kind == ADT_OPTIM_SGD && (oc->momentum != 0) != (p->momentum != 0))))
        return adt_error(ADT_ERR_ARG, "%s: field \"optimizer\": the plan is for %s%s, the run uses %s%s", p->name,
                         p->optim == ADT_OPTIM_ADAMW ? "adamw" : "sgd", p->momentum ? " with momentum" : "",
                         oc->kind == ADT_OPTIM_ADAMW ? "adamw" : "sgd",
                         oc->kind == ADT_OPTIM_SGD && oc->momentum != 0 ? " with momentum" : "");
    if (p->microbatches < 1 || p->batch % p->microbatches)
        return adt_error(ADT_ERR_ARG, "%s: field \"batch\" (%d) must be a multiple of \"microbatches\" (%d)", p->name,
                         p->batch, p->microbatches);
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    int rc = adt_model_build(g, &p->model, p->batch / p->microbatches, &io);
    if (!rc) {
        adt_graph_backward(g, io.loss);
        adt_graph_optimizer(g, oc ? oc : &def);
        if (adt_graph_error(g)) rc = adt_error(adt_graph_error(g), "%s", adt_graph_error_message(g));
    }
    if (rc) {
        adt_graph_free(g);
        return adt_error_prefix(rc, "%s: building the plan's training graph: ", p->name);
    }
    *out = g;
    return ADT_OK;
}

int adt_plan_check_model(const adt_plan *p, const adt_model_cfg *c, int batch) {
    char *want = adt_model_cfg_to_json(&p->model), *have = adt_model_cfg_to_json(c);
    int same = !strcmp(want, have);
    int rc = ADT_OK;
    if (!same)
        rc = adt_error(ADT_ERR_ARG, "%s: field \"model\": the plan is for %s, the run's model is %s", p->name, want, have);
    else if (batch != p->batch)
        rc = adt_error(ADT_ERR_ARG, "%s: field \"batch\": the plan is for a global batch of %d, the run's is %d", p->name,
                       p->batch, batch);
    free(want);
    free(have);
    return rc;
}

/* ---- meshes and stages --------------------------------------------------------------------------- */

int adt_plan_stage_mesh(const adt_plan *p, int stage, adt_mesh *out, int *ranks) {
    if (stage < 0 || stage >= p->n_stages)
        return adt_error(ADT_ERR_ARG, "%s: no stage %d (the plan has %d)", p->name, stage, p->n_stages);
    const adt_mesh *m = &p->mesh;
    int dims[ADT_MAX_MESH_DIMS], nd = 0;
    for (int a = 0; a < m->ndim; a++)
        if (a != p->pp_axis) dims[nd++] = m->dim[a];
    if (!nd) dims[nd++] = 1; /* a pipeline of single devices */
    int rc = adt_mesh_init(out, nd, dims);
    if (rc) return rc;
    if (p->mesh.intra_axis >= 0 && p->mesh.intra_axis != p->pp_axis)
        out->intra_axis = p->mesh.intra_axis - (p->pp_axis >= 0 && p->pp_axis < p->mesh.intra_axis);
    for (int i = 0; i < out->nranks; i++) {
        int sc[ADT_MAX_MESH_DIMS], fc[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(out, i, sc);
        for (int a = 0, k = 0; a < m->ndim; a++) fc[a] = a == p->pp_axis ? stage : sc[k++];
        ranks[i] = adt_mesh_rank(m, fc);
    }
    out->ranks = ranks;
    if (p->split_parts && p->split_axis >= 0 && p->split_axis < out->ndim) {
        out->split = p->split_parts;
        out->split_axis = p->split_axis;
        out->split_total = p->batch / p->microbatches;
    }
    return ADT_OK;
}

int adt_plan_locate(const adt_plan *p, int rank, int *stage, int *coord) {
    const adt_mesh *m = &p->mesh;
    for (int i = 0; i < m->nranks; i++) {
        if ((m->ranks ? m->ranks[i] : i) != rank) continue;
        int fc[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, i, fc);
        *stage = p->pp_axis >= 0 ? fc[p->pp_axis] : 0;
        int k = 0;
        for (int a = 0; a < m->ndim; a++)
            if (a != p->pp_axis) coord[k++] = fc[a];
        if (!k) coord[0] = 0; /* a pipeline of single devices */
        return ADT_OK;
    }
    return adt_error(ADT_ERR_ARG, "%s: rank %d is not on the mesh (%d devices)", p->name, rank, m->nranks);
}

int adt_plan_stage_of(const adt_plan *p, int layer_tag) {
    for (int s = 0; s < p->n_stages; s++)
        if (layer_tag >= p->stage_first[s] && layer_tag <= p->stage_last[s]) return s;
    return -1;
}

adt_dist_plan adt_plan_dist(const adt_plan *p, int stage, int *ranks) {
    adt_dist_plan d = {.node_sig = p->node_sig, .leaf_sbp = p->leaf_sbp, .cost = p->cost};
    adt_plan_stage_mesh(p, stage, &d.mesh, ranks);
    return d;
}

/* ---- validation ---------------------------------------------------------------------------------- */

static int check_mesh(const adt_plan *p) {
    const adt_mesh *m = &p->mesh;
    if (m->ndim < 1 || m->ndim > ADT_MAX_MESH_DIMS || !m->ranks)
        return adt_error(ADT_ERR_ARG, "%s: field \"mesh\": %d axes, expected 1..%d with ranks", p->name, m->ndim,
                         ADT_MAX_MESH_DIMS);
    char *seen = adt_calloc((size_t)m->nranks, 1);
    int rc = ADT_OK;
    for (int i = 0; i < m->nranks && !rc; i++) {
        int r = m->ranks[i];
        if (r < 0 || r >= m->nranks || seen[r])
            rc = adt_error(ADT_ERR_ARG, "%s: field \"mesh.ranks[%d]\" is %d, expected each of 0..%d exactly once", p->name,
                           i, r, m->nranks - 1);
        else seen[r] = 1;
    }
    free(seen);
    return rc;
}

static int check_stages(const adt_plan *p) {
    int want = p->pp_axis >= 0 ? p->mesh.dim[p->pp_axis] : 1;
    if (p->n_stages != want)
        return adt_error(ADT_ERR_ARG, "%s: field \"pipeline.stages\" has %d stages, expected %d (the size of the pipeline "
                         "axis)", p->name, p->n_stages, want);
    for (int s = 0; s < p->n_stages; s++) {
        int expect_first = s ? p->stage_last[s - 1] + 1 : 0;
        if (p->stage_first[s] != expect_first || p->stage_last[s] < p->stage_first[s] ||
            (s == p->n_stages - 1 && p->stage_last[s] != p->n_layers - 1))
            return adt_error(ADT_ERR_ARG, "%s: field \"pipeline.stages[%d]\" is layers [%d, %d], expected a non-empty "
                             "range starting at %d%s (stages cover layers 0..%d in order)",
                             p->name, s, p->stage_first[s], p->stage_last[s], expect_first,
                             s == p->n_stages - 1 ? " and ending at the last layer" : "", p->n_layers - 1);
    }
    return ADT_OK;
}

static int check_leaves(const adt_plan *p, const adt_graph *g, const adt_mesh *sm) {
    for (int v = 0; v < g->n_values; v++) {
        const adt_ndsbp *s = &p->leaf_sbp[v];
        if (!s->ndim) continue;
        char a[64], mb[32], sh[64];
        if (g->values[v].producer >= 0)
            return adt_error(ADT_ERR_ARG, "%s: a layout is given for '%s', which is not a leaf", p->name,
                             g->values[v].name);
        if (!adt_ndsbp_fits(s, sm, g->values[v].shape) || adt_ndsbp_partial_mask(s))
            return adt_error(ADT_ERR_ARG, "%s: leaf '%s' %s cannot be held as %s on the stage mesh %s (a leaf is B or "
                             "S with a non-empty block on every device)",
                             p->name, g->values[v].name, adt_shape_str(&g->values[v].shape, sh, sizeof sh),
                             adt_ndsbp_str(s, a, sizeof a), adt_mesh_str(sm, mb, sizeof mb));
    }
    return ADT_OK;
}

/* An in-place update writes the stored state: it must read its state in the held layout. */
static int check_inplace(const adt_plan *p, const adt_graph *g) {
    for (int i = 0; i < g->n_nodes; i++) {
        const adt_node *n = &g->nodes[i];
        if (!adt_op_get(n->op)->inplace) continue;
        for (int k = 0; k < n->n_out; k++) {
            int j = k ? 1 + k : 0, v = n->in[j];
            const adt_ndsbp *held = &p->leaf_sbp[v];
            if (!held->ndim || adt_ndsbp_equal(held, &p->node_sig[i].in[j])) continue;
            char a[64], b[64];
            return adt_error(ADT_ERR_ARG, "%s: node %s updates '%s' in place as %s, but the plan holds it as %s", p->name,
                             n->name, g->values[v].name, adt_ndsbp_str(&p->node_sig[i].in[j], a, sizeof a),
                             adt_ndsbp_str(held, b, sizeof b));
        }
    }
    return ADT_OK;
}

int adt_plan_check(const adt_plan *p) {
    int rc = check_mesh(p);
    return rc ? rc : check_stages(p);
}

int adt_plan_validate(const adt_plan *p, const adt_graph *g) {
    if (!p->node_sig || !p->leaf_sbp) return adt_error(ADT_ERR_STATE, "%s: the plan has no layouts (not bound)", p->name);
    if (g->n_nodes != p->n_nodes || g->n_values != p->n_values)
        return adt_error(ADT_ERR_ARG, "%s: field \"graph\": the plan is for a graph of %d nodes and %d values, this one "
                         "has %d nodes and %d values (model, batch, microbatches and optimizer must be the plan's)",
                         p->name, p->n_nodes, p->n_values, g->n_nodes, g->n_values);
    uint32_t c = adt_plan_graph_checksum(g);
    if (c != p->checksum)
        return adt_error(ADT_ERR_ARG, "%s: field \"graph.checksum\" is %08x, this graph's is %08x: a value's name, shape, "
                         "dtype or role, or a node's op, inputs or layer differs", p->name, (unsigned)p->checksum,
                         (unsigned)c);
    int rc = adt_plan_check(p);
    if (rc) return rc;
    int ranks[1024], *rk = p->mesh.nranks <= 1024 ? ranks : adt_malloc((size_t)p->mesh.nranks * sizeof *rk);
    adt_mesh sm;
    rc = adt_plan_stage_mesh(p, 0, &sm, rk);
    adt_sig_cache sc = {.g = g, .m = &sm}; /* repeated layers are checked once */
    for (int i = 0; i < g->n_nodes && !rc; i++)
        if ((rc = adt_sig_cache_valid(&sc, i, &p->node_sig[i]))) rc = adt_error_prefix(rc, "%s: ", p->name);
    adt_sig_cache_free(&sc);
    if (!rc) rc = check_leaves(p, g, &sm);
    if (!rc) rc = check_inplace(p, g);
    if (rk != ranks) free(rk);
    return rc;
}

/* ---- balanced data parallelism: the batch split ---------------------------------------------------- */

int adt_plan_data_axis(const adt_plan *p, const adt_graph *g, int *axis) {
    *axis = -1;
    if (!p->node_sig) return adt_error(ADT_ERR_STATE, "%s: the plan has no layouts (not bound)", p->name);
    adt_dist_plan d = {.node_sig = p->node_sig, .leaf_sbp = p->leaf_sbp};
    d.mesh.ndim = p->mesh.ndim - (p->pp_axis >= 0);
    if (d.mesh.ndim < 1) d.mesh.ndim = 1; /* a pipeline of single devices */
    int64_t batch = p->batch / (p->microbatches > 0 ? p->microbatches : 1);
    const char *first = NULL;
    char names[160] = "";
    for (int v = 0; v < g->n_values; v++) {
        const adt_value *val = &g->values[v];
        if (val->producer >= 0 || !adt_role_is_fed(val->role) || v == g->lr_input || v == g->step_input ||
            val->shape.ndim < 1 || val->shape.dim[0] != batch)
            continue;
        size_t k = strlen(names);
        if (k < sizeof names - 40) snprintf(names + k, sizeof names - k, "%s'%s'", k ? ", " : "", val->name);
        adt_ndsbp held = adt_dist_leaf_layout(g, &d, v);
        int found = -1;
        char lay[64];
        for (int a = 0; a < held.ndim; a++) {
            if (held.s[a].kind != ADT_SBP_S || held.s[a].axis != 0) continue;
            if (found >= 0)
                return adt_error(ADT_ERR_ARG, "%s: field \"batch_split\": the fed input '%s' is held as %s, its batch split "
                                 "over mesh axes %d and %d; a batch split needs the batch on one data-parallel axis",
                                 p->name, val->name, adt_ndsbp_str(&held, lay, sizeof lay), found, a);
            found = a;
        }
        if (found < 0) continue;
        if (*axis >= 0 && found != *axis)
            return adt_error(ADT_ERR_ARG, "%s: field \"batch_split\": the fed inputs '%s' and '%s' split the batch over "
                             "different mesh axes (%d and %d)", p->name, first, val->name, *axis, found);
        *axis = found;
        first = val->name;
    }
    if (*axis < 0)
        return adt_error(ADT_ERR_ARG, "%s: field \"batch_split\": the plan has no data-parallel axis (no mesh axis splits "
                         "the batch of the fed inputs %s)", p->name, names[0] ? names : "(none)");
    return ADT_OK;
}

/* The stage-mesh axis a data axis is, in the whole mesh's numbering (for messages). */
static const char *data_axis_name(const adt_plan *p, int stage_axis) {
    for (int a = 0, k = 0; a < p->mesh.ndim; a++) {
        if (a == p->pp_axis) continue;
        if (k++ == stage_axis) return p->axis[a][0] ? p->axis[a] : "?";
    }
    return "?";
}

int adt_plan_set_batch_split(adt_plan *p, const adt_graph *g, const int *sizes, int n) {
    if (!p->node_sig || !p->leaf_sbp)
        return adt_error(ADT_ERR_STATE, "%s: field \"batch_split\": the plan has no layouts (bind it first)", p->name);
    if (!sizes || n == 0) {
        free(p->batch_split), free(p->split_parts);
        p->batch_split = p->split_parts = NULL, p->n_batch_split = 0, p->split_axis = -1;
        return ADT_OK;
    }
    int axis, rc = adt_plan_data_axis(p, g, &axis);
    if (rc) return rc;
    int want = 1;
    for (int a = 0, k = 0; a < p->mesh.ndim; a++)
        if (a != p->pp_axis && k++ == axis) want = p->mesh.dim[a];
    const char *an = data_axis_name(p, axis);
    if (n != want)
        return adt_error(ADT_ERR_ARG, "%s: field \"batch_split\" has %d entries, expected %d (one local batch per replica "
                         "of the data-parallel axis \"%s\")", p->name, n, want, an);
    int64_t sum = 0;
    for (int i = 0; i < n; i++) {
        if (sizes[i] < 1 || sizes[i] % p->microbatches)
            return adt_error(ADT_ERR_ARG, "%s: field \"batch_split[%d]\" is %d, expected a positive multiple of the "
                             "microbatches (%d)", p->name, i, sizes[i], p->microbatches);
        sum += sizes[i];
    }
    if (sum != p->batch)
        return adt_error(ADT_ERR_ARG, "%s: field \"batch_split\" sums to %lld, expected the global batch (%d)", p->name,
                         (long long)sum, p->batch);
    int *old = p->batch_split, *old_parts = p->split_parts, old_n = p->n_batch_split, old_axis = p->split_axis;
    p->batch_split = adt_malloc((size_t)n * sizeof *p->batch_split);
    p->split_parts = adt_malloc((size_t)n * sizeof *p->split_parts);
    for (int i = 0; i < n; i++) p->batch_split[i] = sizes[i], p->split_parts[i] = sizes[i] / p->microbatches;
    p->n_batch_split = n, p->split_axis = axis;
    rc = adt_plan_validate(p, g);
    if (rc) {
        free(p->batch_split), free(p->split_parts);
        p->batch_split = old, p->split_parts = old_parts, p->n_batch_split = old_n, p->split_axis = old_axis;
        return adt_error_prefix(rc, "%s: field \"batch_split\": ", p->name);
    }
    free(old), free(old_parts);
    return ADT_OK;
}
