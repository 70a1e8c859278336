/*
 * ndsbp.c - meshes and nd-SBP blocks: which part of a logical tensor each mesh coordinate
 * holds, and the nd-SBP text form.
 *
 * Nesting: mesh axes are applied outer (0) to inner; a split of tensor axis k on axis m cuts
 * the range of k left by the outer axes with adt_mesh_cut (adt_block_range, or the parts of a
 * batch split). So (S0,S0) on a (2,3) mesh cuts axis 0 in two, then each half in three, and rank
 * (c0,c1) holds block c1 of block c0.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/dist.h"

/* ---- meshes -------------------------------------------------------------------------------- */

int adt_mesh_init(adt_mesh *m, int ndim, const int *dims) {
    memset(m, 0, sizeof *m);
    if (ndim < 1 || ndim > ADT_MAX_MESH_DIMS)
        return adt_error(ADT_ERR_ARG, "mesh: %d axes, expected 1..%d", ndim, ADT_MAX_MESH_DIMS);
    m->ndim = ndim;
    m->nranks = 1;
    m->intra_axis = -1;
    for (int a = 0; a < ndim; a++) {
        if (dims[a] < 1) return adt_error(ADT_ERR_ARG, "mesh: axis %d has size %d, expected >= 1", a, dims[a]);
        m->dim[a] = dims[a];
        m->nranks *= dims[a];
    }
    return ADT_OK;
}

int adt_mesh_index(const adt_mesh *m, const int *coord) {
    int idx = 0;
    for (int a = 0; a < m->ndim; a++) idx = idx * m->dim[a] + coord[a];
    return idx;
}

void adt_mesh_coord(const adt_mesh *m, int index, int *coord) {
    for (int a = m->ndim - 1; a >= 0; a--) {
        coord[a] = index % m->dim[a];
        index /= m->dim[a];
    }
}

int adt_mesh_rank(const adt_mesh *m, const int *coord) {
    int idx = adt_mesh_index(m, coord);
    return m->ranks ? m->ranks[idx] : idx;
}

char *adt_mesh_str(const adt_mesh *m, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int a = 0; a < m->ndim && k < n; a++) k += (size_t)snprintf(buf + k, n - k, a ? ",%d" : "%d", m->dim[a]);
    if (k < n) snprintf(buf + k, n - k, ")");
    return buf;
}

void adt_mesh_cut(const adt_mesh *m, int axis, int64_t n, int i, int64_t *start, int64_t *len) {
    if (!m->split || axis != m->split_axis || m->split_total < 1 || n % m->split_total) {
        adt_block_range(n, m->dim[axis], i, start, len);
        return;
    }
    int64_t unit = n / m->split_total, before = 0; /* a batch-derived length: parts of the batch split */
    for (int c = 0; c < i; c++) before += m->split[c];
    *start = before * unit;
    *len = (int64_t)m->split[i] * unit;
}

/* The smallest and largest part mesh axis `axis` cuts a length n into. */
static void mesh_cut_bounds(const adt_mesh *m, int axis, int64_t n, int64_t *lo, int64_t *hi) {
    int p = m->dim[axis];
    if (!m->split || axis != m->split_axis || m->split_total < 1 || n % m->split_total) {
        *lo = n / p, *hi = (n + p - 1) / p;
        return;
    }
    int a = m->split[0], b = m->split[0];
    for (int c = 1; c < p; c++) a = m->split[c] < a ? m->split[c] : a, b = m->split[c] > b ? m->split[c] : b;
    *lo = a * (n / m->split_total), *hi = b * (n / m->split_total);
}

/* ---- nd-SBP -------------------------------------------------------------------------------- */

int adt_ndsbp_equal(const adt_ndsbp *a, const adt_ndsbp *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++) {
        if (a->s[i].kind != b->s[i].kind) return 0;
        if (a->s[i].kind == ADT_SBP_S && a->s[i].axis != b->s[i].axis) return 0;
    }
    return 1;
}

unsigned adt_ndsbp_partial_mask(const adt_ndsbp *s) {
    unsigned mask = 0;
    for (int i = 0; i < s->ndim; i++)
        if (s->s[i].kind == ADT_SBP_P) mask |= 1u << i;
    return mask;
}

adt_ndsbp adt_ndsbp_all_b(int mesh_ndim) {
    adt_ndsbp s;
    memset(&s, 0, sizeof s);
    s.ndim = mesh_ndim;
    return s;
}

adt_box adt_ndsbp_block(const adt_ndsbp *s, const adt_mesh *m, const int *coord, adt_shape global) {
    adt_box b;
    memset(&b, 0, sizeof b);
    b.global = global;
    b.shape = global;
    for (int a = 0; a < s->ndim && a < m->ndim; a++) {
        if (s->s[a].kind != ADT_SBP_S) continue;
        int k = s->s[a].axis;
        int64_t start, len;
        adt_mesh_cut(m, a, b.shape.dim[k], coord[a], &start, &len);
        b.offset[k] += start;
        b.shape.dim[k] = len;
    }
    return b;
}

int64_t adt_box_overlap(const adt_box *a, const adt_box *b, adt_box *out) {
    adt_box o;
    memset(&o, 0, sizeof o);
    o.global = a->global;
    o.shape.ndim = a->shape.ndim;
    int64_t n = 1;
    for (int d = 0; d < a->shape.ndim; d++) {
        int64_t lo = a->offset[d] > b->offset[d] ? a->offset[d] : b->offset[d];
        int64_t ae = a->offset[d] + a->shape.dim[d], be = b->offset[d] + b->shape.dim[d];
        int64_t hi = ae < be ? ae : be;
        o.offset[d] = lo;
        o.shape.dim[d] = hi > lo ? hi - lo : 0;
        n *= o.shape.dim[d];
    }
    if (out) *out = o;
    return n;
}

/* One run of n elements: copied, or (add) f32 elements added. */
static void run_copy(char *d, const char *s, int64_t n, size_t es, int add) {
    if (!add) {
        memcpy(d, s, (size_t)n * es);
        return;
    }
    float *out = (float *)(void *)d;
    const float *in = (const float *)(const void *)s;
    for (int64_t j = 0; j < n; j++) out[j] += in[j];
}

/* n runs of `bytes` bytes, the i-th at s + i * sstep and d + i * dstep: copies of a size known
 * here for short runs (the compiler makes each one or two vector moves; a call to memcpy per run
 * cost more than its 16 bytes). */
#define ROWS_FIXED(B)                                                                               \
    for (int64_t i = 0; i < n; i++) memcpy(d + i * dstep, s + i * sstep, B)
static void rows_copy(char *d, const char *s, int64_t n, int64_t dstep, int64_t sstep, int64_t run, size_t es,
                      int add) {
    if (!add) switch ((size_t)run * es) {
        case 4: ROWS_FIXED(4); return;
        case 8: ROWS_FIXED(8); return;
        case 12: ROWS_FIXED(12); return;
        case 16: ROWS_FIXED(16); return;
        case 32: ROWS_FIXED(32); return;
        case 64: ROWS_FIXED(64); return;
        default: break;
        }
    for (int64_t i = 0; i < n; i++) run_copy(d + i * dstep, s + i * sstep, run, es, add);
}
#undef ROWS_FIXED

/* Row by row, the innermost row axis a tight loop and an odometer over the axes outside it, axes
 * that both blocks hold whole merged into the run: a walk that found each row's offsets anew, a
 * division per axis, and called memcpy per run took 180 us to pack the two last-axis parts of a
 * DLRM tensor-parallel reduce-scatter's [256, 27, 8] (runs of 16 bytes), this one 20 us. */
void adt_box_transfer(void *dst, const adt_box *db, const void *src, const adt_box *sb, size_t es, int add) {
    adt_box o;
    if (adt_box_overlap(db, sb, &o) == 0) return;
    int nd = o.shape.ndim;
    if (nd == 0) { /* a scalar: the one element */
        if (add) *(float *)dst += *(const float *)src;
        else memcpy(dst, src, es);
        return;
    }
    /* element strides of both blocks, and the overlap's first element in each */
    int64_t ss[ADT_MAX_DIMS], ds[ADT_MAX_DIMS], so = 0, doff = 0, sacc = 1, dacc = 1;
    for (int d = nd - 1; d >= 0; d--) {
        ss[d] = sacc, ds[d] = dacc;
        sacc *= sb->shape.dim[d], dacc *= db->shape.dim[d];
        so += (o.offset[d] - sb->offset[d]) * ss[d];
        doff += (o.offset[d] - db->offset[d]) * ds[d];
    }
    /* a run: the last axis, and the axes before it while every later one spans both blocks whole
     * (then their elements follow each other in both) */
    int inner = nd - 1;
    int64_t run = o.shape.dim[nd - 1];
    while (inner > 0 && o.shape.dim[inner] == sb->shape.dim[inner] && o.shape.dim[inner] == db->shape.dim[inner])
        run *= o.shape.dim[--inner];
    /* rows: axis inner - 1 in the tight loop, the axes before it on the odometer */
    int t = inner - 1;
    int64_t n = t >= 0 ? o.shape.dim[t] : 1, sstep = t >= 0 ? ss[t] * (int64_t)es : 0;
    int64_t dstep = t >= 0 ? ds[t] * (int64_t)es : 0, outer = 1, idx[ADT_MAX_DIMS] = {0};
    for (int d = 0; d < t; d++) outer *= o.shape.dim[d];
    for (int64_t r = 0; r < outer; r++) {
        rows_copy((char *)dst + (size_t)doff * es, (const char *)src + (size_t)so * es, n, dstep, sstep, run, es, add);
        for (int d = t - 1; d >= 0; d--) { /* the next rows: an odometer over the outer axes */
            so += ss[d], doff += ds[d];
            if (++idx[d] < o.shape.dim[d]) break;
            so -= ss[d] * o.shape.dim[d], doff -= ds[d] * o.shape.dim[d], idx[d] = 0;
        }
    }
}

void adt_ndsbp_block_bounds(const adt_ndsbp *s, const adt_mesh *m, adt_shape global, adt_shape *lo,
                            adt_shape *hi) {
    *lo = *hi = global;
    for (int a = 0; a < s->ndim && a < m->ndim; a++) {
        if (s->s[a].kind != ADT_SBP_S) continue;
        int k = s->s[a].axis;
        int64_t l, h, ignore;
        mesh_cut_bounds(m, a, lo->dim[k], &l, &ignore); /* the floor of the smallest   */
        mesh_cut_bounds(m, a, hi->dim[k], &ignore, &h); /* the ceiling of the largest  */
        lo->dim[k] = l, hi->dim[k] = h;
    }
}

int adt_ndsbp_fits(const adt_ndsbp *s, const adt_mesh *m, adt_shape global) {
    if (s->ndim != m->ndim) return 0;
    for (int a = 0; a < s->ndim; a++)
        if (s->s[a].kind == ADT_SBP_S && (s->s[a].axis < 0 || s->s[a].axis >= global.ndim)) return 0;
    adt_shape lo, hi;
    adt_ndsbp_block_bounds(s, m, global, &lo, &hi);
    for (int k = 0; k < global.ndim; k++)
        if (lo.dim[k] < 1) return 0;
    return 1;
}

int adt_ndsbp_even(const adt_ndsbp *s, const adt_mesh *m, adt_shape global) {
    adt_shape lo, hi; /* nested floors equal nested ceilings only where every division is exact */
    adt_ndsbp_block_bounds(s, m, global, &lo, &hi);
    for (int k = 0; k < global.ndim; k++)
        if (lo.dim[k] != hi.dim[k]) return 0;
    return 1;
}

/* "(S0, B)", "S(0),B", "(P)": optional parentheses around comma-separated SBPs, blanks
 * anywhere between tokens. */
int adt_ndsbp_parse(const char *text, int mesh_ndim, int tensor_rank, adt_ndsbp *out) {
    memset(out, 0, sizeof *out);
    if (!text) return adt_error(ADT_ERR_ARG, "nd-SBP: no text given");
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    int paren = *p == '(';
    if (paren) p++;
    int n = 0;
    for (;;) {
        while (isspace((unsigned char)*p)) p++;
        char tok[16];
        size_t k = 0;
        int open = 0; /* a ')' ends the token unless it closes the token's own "S(1)" */
        while (*p && *p != ',' && !isspace((unsigned char)*p)) {
            if (*p == ')' && !open) break;
            open += *p == '(' ? 1 : *p == ')' ? -1 : 0;
            if (k + 1 >= sizeof tok) return adt_error(ADT_ERR_ARG, "nd-SBP '%.64s': entry %d is too long", text, n);
            tok[k++] = *p++;
        }
        tok[k] = 0;
        if (n >= ADT_MAX_MESH_DIMS)
            return adt_error(ADT_ERR_ARG, "nd-SBP '%.64s': more than %d entries", text, ADT_MAX_MESH_DIMS);
        adt_sbp s;
        if (!k || adt_sbp_parse(tok, &s))
            return adt_error(ADT_ERR_ARG, "nd-SBP '%.64s': entry %d '%s' is not B, P or S(k)", text, n, tok);
        if (s.kind == ADT_SBP_S) {
            int ax = s.axis < 0 ? tensor_rank + s.axis : s.axis;
            if (ax < 0 || ax >= tensor_rank)
                return adt_error(ADT_ERR_ARG, "nd-SBP '%.64s': entry %d splits axis %d of a rank-%d tensor",
                                 text, n, s.axis, tensor_rank);
            s.axis = (int8_t)ax;
        }
        out->s[n++] = s;
        while (isspace((unsigned char)*p)) p++;
        if (*p == ',') { p++; continue; }
        break;
    }
    if (paren) {
        if (*p != ')') return adt_error(ADT_ERR_ARG, "nd-SBP '%.64s': expected ')' after entry %d", text, n - 1);
        p++;
    }
    while (isspace((unsigned char)*p)) p++;
    if (*p) return adt_error(ADT_ERR_ARG, "nd-SBP '%.64s': unexpected text '%.16s' after the entries", text, p);
    if (n != mesh_ndim)
        return adt_error(ADT_ERR_ARG, "nd-SBP '%.64s': %d entries, expected one per mesh axis (%d)", text, n,
                         mesh_ndim);
    out->ndim = n;
    return ADT_OK;
}
