/*
 * boxing_virtual.c - runs a boxing program in memory over one buffer per mesh position.
 *
 * Every step is written as block copies between the blocks of the state before (per rank) and
 * the state after (per rank), within the groups of ranks that differ only in the step's mesh
 * axis coordinate: a collective is "my new block is made of the parts of my group's old blocks
 * that overlap it", summed for a P source. This is deliberately the naive definition, not an
 * algorithm: it is the yardstick the comm-based executor and the kernels are checked against.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

void adt_box_transfer(void *dst, const adt_box *db, const void *src, const adt_box *sb, size_t es, int add) {
    int nd = db->global.ndim;
    int64_t lo[ADT_MAX_DIMS] = {0}, len[ADT_MAX_DIMS] = {0};
    if (nd < 1) return;
    for (int d = 0; d < nd; d++) {
        int64_t a = db->offset[d] > sb->offset[d] ? db->offset[d] : sb->offset[d];
        int64_t de = db->offset[d] + db->shape.dim[d], se = sb->offset[d] + sb->shape.dim[d];
        int64_t b = de < se ? de : se;
        if (b <= a) return;
        lo[d] = a;
        len[d] = b - a;
    }
    int64_t rows = 1;
    for (int d = 0; d < nd - 1; d++) rows *= len[d];
    int64_t run = len[nd - 1];
    for (int64_t r = 0; r < rows; r++) {
        /* the overlap's row r: walk its outer coordinates, last-but-one fastest */
        int64_t rest = r, so = 0, doff = 0, sstride = 1, dstride = 1;
        for (int d = nd - 1; d >= 0; d--) {
            int64_t c = lo[d];
            if (d < nd - 1) {
                c += rest % len[d];
                rest /= len[d];
            }
            so += (c - sb->offset[d]) * sstride;
            doff += (c - db->offset[d]) * dstride;
            sstride *= sb->shape.dim[d];
            dstride *= db->shape.dim[d];
        }
        if (add) {
            float *o = (float *)dst + doff;
            const float *s = (const float *)src + so;
            for (int64_t j = 0; j < run; j++) o[j] += s[j];
        } else {
            memcpy((char *)dst + (size_t)doff * es, (const char *)src + (size_t)so * es, (size_t)run * es);
        }
    }
}

static int check_step(const adt_boxing_step *st, int i) {
    char a[64], b[64];
    int ax = st->mesh_axis;
    int ok = ax >= 0 && ax < st->from.ndim && st->to.ndim == st->from.ndim;
    for (int m = 0; ok && m < st->from.ndim; m++)
        if (m != ax) ok = st->from.s[m].kind == st->to.s[m].kind && st->from.s[m].axis == st->to.s[m].axis;
    if (!ok || !adt_boxing_step_valid(&st->from, ax, st->to.s[ax]) ||
        adt_boxing_kind_of(st->from.s[ax], st->to.s[ax]) != st->kind)
        return adt_error(ADT_ERR_ARG,
                         "boxing step %d: %s %s -> %s on mesh axis %d is not a valid single-axis step (nested split, "
                         "or the states differ elsewhere)",
                         i, adt_boxing_kind_name(st->kind), adt_ndsbp_str(&st->from, a, sizeof a),
                         adt_ndsbp_str(&st->to, b, sizeof b), ax);
    return ADT_OK;
}

int adt_boxing_step_local(const adt_boxing_step *st, const adt_mesh *m, const int *coord, adt_shape global,
                          adt_dtype dtype, const void *const *group, void *out) {
    size_t es = adt_dtype_size(dtype);
    int ax = st->mesh_axis;
    if (ax < 0 || ax >= m->ndim) return adt_error(ADT_ERR_ARG, "boxing step on mesh axis %d of a %d-axis mesh", ax, m->ndim);
    int reduce = st->kind == ADT_BOXING_ALL_REDUCE || st->kind == ADT_BOXING_REDUCE_SCATTER;
    if (reduce && dtype != ADT_F32)
        return adt_error(ADT_ERR_ARG, "boxing step: %s of %s data (sums need f32)", adt_boxing_kind_name(st->kind),
                         adt_dtype_name(dtype));
    adt_box db = adt_ndsbp_block(&st->to, m, coord, global);
    memset(out, 0, (size_t)adt_shape_numel(&db.shape) * es); /* what KEEP_ONE / ZERO_FILL leave */
    int c[ADT_MAX_MESH_DIMS];
    memcpy(c, coord, sizeof c);
    switch (st->kind) {
    case ADT_BOXING_ALL_REDUCE:
    case ADT_BOXING_REDUCE_SCATTER:
    case ADT_BOXING_ALL_GATHER:
    case ADT_BOXING_ALL_TO_ALL:
        for (int j = 0; j < m->dim[ax]; j++) { /* the group: my coordinate with axis ax = j */
            c[ax] = j;
            adt_box sb = adt_ndsbp_block(&st->from, m, c, global);
            adt_box_transfer(out, &db, group[j], &sb, es, reduce);
        }
        break;
    default: /* SLICE, ZERO_FILL, KEEP_ONE: my own data cut, or placed into zeros (coordinate 0
              * keeps its data on KEEP_ONE, the others leave zeros) */
        if (st->kind != ADT_BOXING_KEEP_ONE || coord[ax] == 0) {
            adt_box sb = adt_ndsbp_block(&st->from, m, coord, global);
            adt_box_transfer(out, &db, group[coord[ax]], &sb, es, 0);
        }
        break;
    }
    return ADT_OK;
}

int adt_boxing_run_virtual(const adt_boxing_prog *p, const adt_mesh *m, void **bufs) {
    adt_dtype dtype = p->dtype;
    size_t es = adt_dtype_size(dtype);
    if (!es) return adt_error(ADT_ERR_ARG, "boxing: a program over elements of unknown dtype %d", (int)dtype);
    for (int i = 0; i < p->n_steps; i++) {
        int rc = check_step(&p->step[i], i);
        if (rc) return rc;
        int k = p->step[i].kind;
        if ((k == ADT_BOXING_ALL_REDUCE || k == ADT_BOXING_REDUCE_SCATTER) && dtype != ADT_F32)
            return adt_error(ADT_ERR_ARG, "boxing step %d: %s of %s data (sums need f32)", i, adt_boxing_kind_name(k),
                             adt_dtype_name(dtype));
    }
    int nr = m->nranks;
    void **next = adt_calloc((size_t)nr, sizeof *next);
    for (int i = 0; i < p->n_steps; i++) {
        const adt_boxing_step *st = &p->step[i];
        int ax = st->mesh_axis;
        const void **group = adt_calloc((size_t)m->dim[ax], sizeof *group);
        for (int r = 0; r < nr; r++) {
            int c[ADT_MAX_MESH_DIMS], cj[ADT_MAX_MESH_DIMS];
            adt_mesh_coord(m, r, c);
            memcpy(cj, c, sizeof cj);
            for (int j = 0; j < m->dim[ax]; j++) {
                cj[ax] = j;
                group[j] = bufs[adt_mesh_index(m, cj)];
            }
            adt_box db = adt_ndsbp_block(&st->to, m, c, p->global);
            int64_t n = adt_shape_numel(&db.shape);
            next[r] = adt_malloc((size_t)(n > 0 ? n : 1) * es);
            adt_boxing_step_local(st, m, c, p->global, dtype, group, next[r]);
        }
        free(group);
        for (int r = 0; r < nr; r++) {
            free(bufs[r]);
            bufs[r] = next[r];
            next[r] = NULL;
        }
    }
    free(next);
    return ADT_OK;
}
