/*
 * shape.c - dtypes, shapes, SBP names and the block distribution shared by every split.
 */
#include "adtrain/tensor.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t adt_dtype_size(adt_dtype dt) {
    switch (dt) {
    case ADT_F32: return 4;
    case ADT_BF16: return 2;
    case ADT_I32: return 4;
    default: return 0;
    }
}

const char *adt_dtype_name(adt_dtype dt) {
    switch (dt) {
    case ADT_F32: return "f32";
    case ADT_BF16: return "bf16";
    case ADT_I32: return "i32";
    default: return "?";
    }
}

adt_shape adt_shape_make(int ndim, const int64_t *dims) {
    adt_shape s = {0};
    s.ndim = ndim;
    for (int i = 0; i < ndim && i < ADT_MAX_DIMS; i++) s.dim[i] = dims[i];
    return s;
}
adt_shape adt_shape_1d(int64_t a) { return (adt_shape){1, {a}}; }
adt_shape adt_shape_2d(int64_t a, int64_t b) { return (adt_shape){2, {a, b}}; }
adt_shape adt_shape_3d(int64_t a, int64_t b, int64_t c) { return (adt_shape){3, {a, b, c}}; }
adt_shape adt_shape_4d(int64_t a, int64_t b, int64_t c, int64_t d) {
    return (adt_shape){4, {a, b, c, d}};
}

int64_t adt_shape_numel(const adt_shape *s) { return adt_shape_prod(s, 0, s->ndim); }

int64_t adt_shape_prod(const adt_shape *s, int from, int to) {
    int64_t n = 1;
    for (int i = from; i < to; i++) n *= s->dim[i];
    return n;
}

int adt_shape_equal(const adt_shape *a, const adt_shape *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->dim[i] != b->dim[i]) return 0;
    return 1;
}

char *adt_shape_str(const adt_shape *s, char *buf, size_t n) {
    size_t k = 0;
    k += (size_t)snprintf(buf + k, n - k, "[");
    for (int i = 0; i < s->ndim && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, i ? ",%lld" : "%lld", (long long)s->dim[i]);
    if (k < n) snprintf(buf + k, n - k, "]");
    return buf;
}

char *adt_sbp_str(adt_sbp s, char *buf, size_t n) {
    if (s.kind == ADT_SBP_S) snprintf(buf, n, "S(%d)", s.axis);
    else snprintf(buf, n, "%s", s.kind == ADT_SBP_B ? "B" : "P");
    return buf;
}

char *adt_ndsbp_str(const adt_ndsbp *s, char *buf, size_t n) {
    size_t k = (size_t)snprintf(buf, n, "(");
    for (int i = 0; i < s->ndim && k < n; i++) {
        char one[16];
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? "," : "", adt_sbp_str(s->s[i], one, sizeof one));
    }
    if (k < n) snprintf(buf + k, n - k, ")");
    return buf;
}

int adt_sbp_parse(const char *s, adt_sbp *out) {
    if (!strcmp(s, "B")) { *out = (adt_sbp){ADT_SBP_B, 0}; return 0; }
    if (!strcmp(s, "P")) { *out = (adt_sbp){ADT_SBP_P, 0}; return 0; }
    if (s[0] != 'S') return -1;
    const char *p = s + 1;
    int paren = *p == '(';
    if (paren) p++;
    char *end;
    long ax = strtol(p, &end, 10);
    if (end == p || ax < -ADT_MAX_DIMS || ax >= ADT_MAX_DIMS) return -1;
    if (paren && *end++ != ')') return -1;
    if (*end) return -1;
    *out = (adt_sbp){ADT_SBP_S, (int8_t)ax};
    return 0;
}

void adt_block_range(int64_t n, int p, int i, int64_t *start, int64_t *len) {
    int64_t base = n / p, extra = n % p;
    *len = base + (i < extra ? 1 : 0);
    *start = (int64_t)i * base + (i < extra ? i : extra);
}
