/*
 * rebalance.c - changing the batch split of a running plan between steps (balanced data
 * parallelism, include/adtrain/dist.h adt_plan_set_batch_split): the local shapes of every
 * batch-split value change, so a rank's local graph, its communicators and its executor are
 * made again for the new split, and the persistent state (parameters, optimizer state) is carried
 * over: copied where a rank's block stays the same, else gathered whole over the old mesh and cut
 * for the new one (a value held split over the data axis along a length the batch divides, ZeRO's
 * shards of such a length). Every rank of the mesh calls these together.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/exec.h"

static int same_box(const adt_box *a, const adt_box *b) {
    if (a->shape.ndim != b->shape.ndim) return 0;
    for (int d = 0; d < a->shape.ndim; d++)
        if (a->shape.dim[d] != b->shape.dim[d] || a->offset[d] != b->offset[d]) return 0;
    return 1;
}

/* Whether some coordinate holds another block of the value under the new mesh than the old. */
static int blocks_move(const adt_ndsbp *from, const adt_mesh *fm, const adt_ndsbp *to, const adt_mesh *tm,
                       adt_shape shape) {
    for (int i = 0; i < fm->nranks; i++) {
        int c[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(fm, i, c);
        adt_box a = adt_ndsbp_block(from, fm, c, shape), b = adt_ndsbp_block(to, tm, c, shape);
        if (!same_box(&a, &b)) return 1;
    }
    return 0;
}

int adt_dist_move_state(const adt_graph *g, adt_mesh_comm *from_mc, const adt_dist_local *from, adt_exec *from_ex,
                        const adt_mesh *to_mesh, const adt_dist_local *to, adt_exec *to_ex) {
    const adt_mesh *fm = adt_mesh_comm_mesh(from_mc);
    const int *coord = adt_mesh_comm_coord(from_mc);
    if (fm->ndim != to_mesh->ndim || fm->nranks != to_mesh->nranks)
        return adt_error(ADT_ERR_ARG, "moving state: meshes of %d and %d devices; a new batch split keeps the mesh",
                         fm->nranks, to_mesh->nranks);
    void *whole = NULL;
    size_t whole_bytes = 0;
    int rc = ADT_OK;
    for (int v = 0; v < g->n_values && !rc; v++) {
        const adt_value *val = &g->values[v];
        if (!adt_role_is_persistent(val->role) || from->value[v] < 0 || to->value[v] < 0) continue;
        void *src = adt_exec_data(from_ex, from->value[v]), *dst = adt_exec_data(to_ex, to->value[v]);
        size_t es = adt_dtype_size(val->dtype);
        adt_box nb = adt_ndsbp_block(&to->layout[v], to_mesh, coord, val->shape);
        if (!blocks_move(&from->layout[v], fm, &to->layout[v], to_mesh, val->shape)) {
            memcpy(dst, src, (size_t)adt_shape_numel(&nb.shape) * es);
            continue;
        }
        size_t bytes = (size_t)adt_shape_numel(&val->shape) * es; /* every rank of the mesh takes this branch */
        if (bytes > whole_bytes) free(whole), whole = adt_malloc(bytes), whole_bytes = bytes;
        rc = adt_mesh_comm_gather(from_mc, &from->layout[v], val->shape, val->dtype, src, whole);
        if (rc) {
            rc = adt_error_prefix(rc, "moving '%s' to its new block: ", val->name);
            break;
        }
        adt_box all = {.global = val->shape, .shape = val->shape};
        adt_box_transfer(dst, &nb, whole, &all, es, 0);
    }
    free(whole);
    return rc;
}

/* Whether every rank of the world reached this point without an error (collective). */
static int all_ok(adt_comm *world, int rc) {
    int32_t bad = rc != 0;
    int rc2 = adt_comm_allreduce_i32(world, &bad, 1);
    return !rc2 && !bad;
}

int adt_dist_rebuild(adt_comm *world, const adt_graph *g, const adt_dist_plan *p, const adt_exec_opts *opts,
                     adt_dist_local *loc, adt_mesh_comm **mc, adt_exec **ex) {
    adt_dist_local nloc = {0};
    adt_mesh_comm *nmc = NULL;
    adt_exec *nex = NULL;
    const int *coord = adt_mesh_comm_coord(*mc);
    int rc = adt_dist_partition(g, p, coord, &nloc);
    if (!rc) rc = adt_mesh_comm_create(&nmc, world, &p->mesh);
    if (!rc) {
        adt_exec_opts o = opts ? *opts : (adt_exec_opts){0};
        o.comm = adt_mesh_comm_hook(nmc, nloc.g);
        rc = adt_exec_create(&nex, nloc.g, &o);
    }
    /* the state moves through collectives: every rank must have its new pieces first */
    if (!all_ok(world, rc)) {
        if (!rc) rc = adt_error(ADT_ERR_ARG, "rebuilding for a new batch split: another rank failed");
    } else {
        rc = adt_dist_move_state(g, *mc, loc, *ex, &p->mesh, &nloc, nex);
    }
    if (rc) {
        adt_exec_free(nex);
        if (nmc) adt_mesh_comm_release(nmc, nloc.g);
        adt_mesh_comm_free(nmc);
        adt_dist_local_free(&nloc);
        return rc;
    }
    adt_exec_free(*ex);
    adt_mesh_comm_release(*mc, loc->g);
    adt_mesh_comm_free(*mc);
    adt_dist_local_free(loc);
    *loc = nloc, *mc = nmc, *ex = nex;
    return ADT_OK;
}
