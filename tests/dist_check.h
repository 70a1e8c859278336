/*
 * dist_check.h - block arithmetic the dist tests share, written independently of src/dist (the
 * tests hold the library's blocks and boxing against it): the global index of a block element,
 * copying a block out of a global array, and the partial-sum groups of an nd-SBP.
 */
#ifndef ADTRAIN_TESTS_DIST_CHECK_H
#define ADTRAIN_TESTS_DIST_CHECK_H

#include <stdint.h>
#include <string.h>

#include "adtrain/dist.h"

/* Row-major global flat index of local element li of block b. */
static inline int64_t dc_global_index(const adt_box *b, int64_t li) {
    int64_t gi = 0, stride = 1;
    for (int d = b->shape.ndim - 1; d >= 0; d--) {
        gi += (li % b->shape.dim[d] + b->offset[d]) * stride;
        li /= b->shape.dim[d];
        stride *= b->global.dim[d];
    }
    return gi;
}

/* dst (the block, contiguous) = block b of the global array src. */
static inline void dc_copy_block(void *dst, const void *src, const adt_box *b, size_t es) {
    int64_t n = adt_shape_numel(&b->shape);
    for (int64_t li = 0; li < n; li++)
        memcpy((char *)dst + (size_t)li * es, (const char *)src + (size_t)dc_global_index(b, li) * es, es);
}

/* The partial group of coordinate c under P mask pm: the coordinates equal to c off the P axes.
 * Its leader has 0 on every P axis. */
static inline int dc_group_leader(const adt_mesh *m, unsigned pm, const int *c) {
    for (int a = 0; a < m->ndim; a++)
        if ((pm >> a & 1) && c[a] != 0) return 0;
    return 1;
}

static inline int dc_same_group(const adt_mesh *m, unsigned pm, const int *c, const int *q) {
    for (int a = 0; a < m->ndim; a++)
        if (!(pm >> a & 1) && c[a] != q[a]) return 0;
    return 1;
}

#endif
