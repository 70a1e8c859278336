/*
 * k_move.c - data movement without arithmetic: axis permutation, concatenation and slicing.
 *
 * permute first simplifies the problem: size-1 axes are dropped and output axes that stay
 * adjacent and in order in the input are merged, so e.g. [B,T,H,D] -> [B,H,T,D] becomes a copy
 * of contiguous D-runs and a plain 2-D transpose stays a 2-D transpose. Then one of two loops
 * runs: when the innermost output axis is also innermost in the input, contiguous runs are
 * copied; otherwise a tiled 2-D transpose between the two innermost axes keeps both the reads
 * and the writes inside cache lines.
 */
#include <string.h>

#include "ops/kernels.h"

#define PERMUTE_MAX_DIMS 6
/* A 32x32 tile of floats is 4 KiB each way: both sides stay in L1. */
#define TRANSPOSE_TILE 32

/* The output axes of a permute after simplification, outermost first; `istr` is each axis's
 * stride in the input, `ostr` in the (contiguous) output. */
typedef struct {
    int n;
    int64_t size[PERMUTE_MAX_DIMS];
    int64_t istr[PERMUTE_MAX_DIMS];
    int64_t ostr[PERMUTE_MAX_DIMS];
} axes_t;

/* Visits every index of the axes in `a` (row-major), calling body(in_off, out_off, ctx). The
 * offsets are updated incrementally, no division per element. */
typedef void (*visit_fn)(int64_t in_off, int64_t out_off, void *ctx);
static void visit(const axes_t *a, visit_fn body, void *ctx) {
    int64_t idx[PERMUTE_MAX_DIMS] = {0};
    int64_t io = 0, oo = 0;
    for (int d = 0; d < a->n; d++)
        if (a->size[d] <= 0) return;
    for (;;) {
        body(io, oo, ctx);
        int d = a->n - 1;
        for (; d >= 0; d--) {
            idx[d]++;
            io += a->istr[d];
            oo += a->ostr[d];
            if (idx[d] < a->size[d]) break;
            io -= a->istr[d] * a->size[d];
            oo -= a->ostr[d] * a->size[d];
            idx[d] = 0;
        }
        if (d < 0) return;
    }
}

typedef struct {
    float *out;
    const float *x;
    int64_t len; /* contiguous run (copy case) */
    /* transpose case: out[u*ostr_u + v] = x[u + v*istr_v], u < n_u, v < n_v */
    int64_t n_u, n_v, ostr_u, istr_v;
} move_ctx;

static void copy_run(int64_t io, int64_t oo, void *vctx) {
    move_ctx *c = vctx;
    memcpy(c->out + oo, c->x + io, (size_t)c->len * sizeof(float));
}

static void transpose_block(int64_t io, int64_t oo, void *vctx) {
    move_ctx *c = vctx;
    const float *src = c->x + io;
    float *dst = c->out + oo;
    for (int64_t u0 = 0; u0 < c->n_u; u0 += TRANSPOSE_TILE) {
        int64_t u1 = u0 + TRANSPOSE_TILE < c->n_u ? u0 + TRANSPOSE_TILE : c->n_u;
        for (int64_t v0 = 0; v0 < c->n_v; v0 += TRANSPOSE_TILE) {
            int64_t v1 = v0 + TRANSPOSE_TILE < c->n_v ? v0 + TRANSPOSE_TILE : c->n_v;
            for (int64_t u = u0; u < u1; u++) {
                float *d = dst + u * c->ostr_u;
                const float *s = src + u;
                for (int64_t v = v0; v < v1; v++) d[v] = s[v * c->istr_v];
            }
        }
    }
}

/* out has dims dims[perm[0]], dims[perm[1]], ...; x is contiguous with dims[ndim]. */
void adt_k_permute(float *out, const float *x, int ndim, const int64_t *dims, const int *perm) {
    int64_t istride[PERMUTE_MAX_DIMS], total = 1;
    for (int d = ndim - 1; d >= 0; d--) {
        istride[d] = total;
        total *= dims[d];
    }
    if (total <= 0) return;

    /* Output axes in order, size-1 ones dropped, each merged into the previous one when the
     * pair is also adjacent and in order in the input. */
    axes_t ax = {0};
    for (int i = 0; i < ndim; i++) {
        int64_t sz = dims[perm[i]], st = istride[perm[i]];
        if (sz == 1) continue;
        if (ax.n > 0 && ax.istr[ax.n - 1] == sz * st) {
            ax.size[ax.n - 1] *= sz;
            ax.istr[ax.n - 1] = st;
            continue;
        }
        ax.size[ax.n] = sz;
        ax.istr[ax.n] = st;
        ax.n++;
    }
    if (ax.n <= 1) { /* the identity, up to size-1 axes */
        memcpy(out, x, (size_t)total * sizeof(float));
        return;
    }
    int64_t os = 1;
    for (int d = ax.n - 1; d >= 0; d--) {
        ax.ostr[d] = os;
        os *= ax.size[d];
    }

    move_ctx c = {.out = out, .x = x};
    int last = ax.n - 1;
    if (ax.istr[last] == 1) {
        c.len = ax.size[last];
        ax.n--;
        visit(&ax, copy_run, &c);
        return;
    }
    /* The input's innermost axis (stride 1) is output axis j < last: transpose (j, last). */
    int j = 0;
    while (ax.istr[j] != 1) j++;
    c.n_u = ax.size[j];
    c.ostr_u = ax.ostr[j];
    c.n_v = ax.size[last];
    c.istr_v = ax.istr[last];
    axes_t outer = {0};
    for (int d = 0; d < last; d++) {
        if (d == j) continue;
        outer.size[outer.n] = ax.size[d];
        outer.istr[outer.n] = ax.istr[d];
        outer.ostr[outer.n] = ax.ostr[d];
        outer.n++;
    }
    visit(&outer, transpose_block, &c);
}

/* out[outer, sum(axis_sizes), inner] = the xs[i][outer, axis_sizes[i], inner] side by side. */
void adt_k_concat(float *out, const float *const *xs, const int64_t *axis_sizes, int n,
                  int64_t outer, int64_t inner) {
    int64_t total = 0;
    for (int i = 0; i < n; i++) total += axis_sizes[i];
    for (int64_t o = 0; o < outer; o++) {
        float *dst = out + o * total * inner;
        for (int i = 0; i < n; i++) {
            int64_t len = axis_sizes[i] * inner;
            if (len > 0) memcpy(dst, xs[i] + o * len, (size_t)len * sizeof(float));
            dst += len;
        }
    }
}

/* out[outer, len, inner] = x[outer, start:start+len, inner] of x[outer, axis_total, inner]. */
void adt_k_slice(float *out, const float *x, int64_t outer, int64_t axis_total, int64_t start,
                 int64_t len, int64_t inner) {
    int64_t run = len * inner;
    if (run <= 0) return;
    for (int64_t o = 0; o < outer; o++)
        memcpy(out + o * run, x + (o * axis_total + start) * inner, (size_t)run * sizeof(float));
}
