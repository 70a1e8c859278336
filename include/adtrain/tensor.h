/*
 * adtrain/tensor.h - dtypes, shapes, and the SBP / mesh *types* (the algebra lives in dist/).
 *
 * A shape is a small value type (at most ADT_MAX_DIMS axes). Tensors are contiguous row-major;
 * there are no strided views, so every kernel sees dense memory.
 */
#ifndef ADTRAIN_TENSOR_H
#define ADTRAIN_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define ADT_MAX_DIMS 6

typedef enum adt_dtype {
    ADT_F32 = 0,
    ADT_BF16 = 1, /* storage type for later mixed precision; no kernel computes in it yet */
    ADT_I32 = 2,  /* token ids, labels, argmax indices */
    ADT_DTYPE_COUNT
} adt_dtype;

size_t adt_dtype_size(adt_dtype dt);
const char *adt_dtype_name(adt_dtype dt);

typedef struct adt_shape {
    int ndim;
    int64_t dim[ADT_MAX_DIMS];
} adt_shape;

adt_shape adt_shape_make(int ndim, const int64_t *dims);
adt_shape adt_shape_1d(int64_t a);
adt_shape adt_shape_2d(int64_t a, int64_t b);
adt_shape adt_shape_3d(int64_t a, int64_t b, int64_t c);
adt_shape adt_shape_4d(int64_t a, int64_t b, int64_t c, int64_t d);
int64_t adt_shape_numel(const adt_shape *s);
int adt_shape_equal(const adt_shape *a, const adt_shape *b);
/* product of dims [from, to) */
int64_t adt_shape_prod(const adt_shape *s, int from, int to);
/* "[3,16,32]" into buf; returns buf */
char *adt_shape_str(const adt_shape *s, char *buf, size_t n);

/* ---------------------------------------------------------------------------------------------
 * SBP: how one mesh axis holds a logical tensor.
 *   S(k): each device holds a block of tensor axis k (uneven sizes differ by at most one);
 *   B:    every device holds all of it;
 *   P:    every device holds a full-shape tensor and the logical tensor is their sum.
 */
typedef enum adt_sbp_kind { ADT_SBP_B = 0, ADT_SBP_S = 1, ADT_SBP_P = 2 } adt_sbp_kind;

typedef struct adt_sbp {
    int8_t kind; /* adt_sbp_kind */
    int8_t axis; /* tensor axis for S; 0 otherwise */
} adt_sbp;

#define ADT_MAX_MESH_DIMS 3

/* One SBP per mesh axis, outer axis first (nested splits read left to right). */
typedef struct adt_ndsbp {
    int ndim;
    adt_sbp s[ADT_MAX_MESH_DIMS];
} adt_ndsbp;

/* A device mesh: shape, and the global rank at each mesh coordinate (row-major).
 * A batch split (balanced data parallelism) makes the blocks of one mesh axis uneven by design:
 * when split is set, mesh axis split_axis cuts a tensor axis whose length L is a multiple of
 * split_total (the batch: the batch axis and the axes made from it, like [B*T]) into parts
 * proportional to split[0..dim[split_axis]) (coordinate c: split[c] * L / split_total rows,
 * in order); other lengths, and other axes, keep the block distribution of adt_block_range.
 * split is not owned by the mesh (NULL, the default: no batch split). */
typedef struct adt_mesh {
    int ndim;
    int dim[ADT_MAX_MESH_DIMS];
    int intra_axis; /* the mesh axis that stays within one node, -1 if none */
    int nranks;
    int *ranks; /* [nranks] */
    const int *split; /* [dim[split_axis]] parts summing to split_total, or NULL */
    int split_axis;
    int split_total;
} adt_mesh;

/* "S(1)", "B", "P"; ndsbp as "(S(0),B)" */
char *adt_sbp_str(adt_sbp s, char *buf, size_t n);
char *adt_ndsbp_str(const adt_ndsbp *s, char *buf, size_t n);
/* Parses "S0", "S(0)", "S-1" (last axis), "B", "P"; returns 0 or -1. Negative axes are kept
 * negative here and resolved against a tensor's rank by the caller. */
int adt_sbp_parse(const char *s, adt_sbp *out);

/* A block of a logical tensor: the local tensor of shape `shape` sits at `offset` inside the
 * logical one of shape `global` (what a rank holds of a split tensor; equal to `global` with a
 * zero offset for B and P). */
typedef struct adt_box {
    adt_shape global;
    adt_shape shape;
    int64_t offset[ADT_MAX_DIMS];
} adt_box;

/* Block distribution of n items over p parts: part i gets [start, start+len). The first n % p
 * parts get one extra item. Used for every uneven split. */
void adt_block_range(int64_t n, int p, int i, int64_t *start, int64_t *len);

#ifdef __cplusplus
}
#endif
#endif
