/*
 * criteo.c - click-through data in the Criteo (Kaggle display advertising) layout
 * ("criteo:FILE"): per line a 0/1 label, 13 integer features and 26 categorical ones written as
 * hex strings; tab-separated as Criteo ships it, or comma-separated with a header line.
 *
 * The whole file is parsed at open into the form a DLRM consumes (log-scaled dense floats and
 * hashed table rows; docs/formats.md gives every rule), so a bad line fails before training
 * starts and a batch costs a copy. Memory: 157 bytes per sample.
 */
#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

#define CRITEO_DENSE 13
#define CRITEO_CAT 26
#define CRITEO_FIELDS (1 + CRITEO_DENSE + CRITEO_CAT)
#define CRITEO_MIN_FIELDS (1 + CRITEO_DENSE) /* trailing empty categoricals may be stripped */
#define CRITEO_HASH_SEED 0x63726974656full   /* "criteo" */

typedef struct criteo_data {
    float *dense;   /* [n, 13] log(1 + max(x, 0)) */
    int32_t *cat;   /* [n, 26] row of table t    */
    uint8_t *label; /* [n] */
} criteo_data;

static void criteo_free(void *impl) {
    criteo_data *d = impl;
    if (!d) return;
    free(d->dense);
    free(d->cat);
    free(d->label);
    free(d);
}

/* input f32 [n, 13], input2 i32 [n, 26], label f32 [n] */
static int criteo_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2,
                       void *label) {
    const criteo_data *d = impl;
    float *x = input, *y = label;
    int32_t *c = input2;
    for (int k = 0; k < n; k++) {
        int64_t s = ids[k] + first;
        memcpy(x + (int64_t)k * CRITEO_DENSE, d->dense + s * CRITEO_DENSE, CRITEO_DENSE * sizeof *x);
        memcpy(c + (int64_t)k * CRITEO_CAT, d->cat + s * CRITEO_CAT, CRITEO_CAT * sizeof *c);
        y[k] = (float)d->label[s];
    }
    return ADT_OK;
}

/* Row of table t for a categorical value (its bytes as written; "" when missing):
 * mix64(fnv1a64(bytes) ^ mix64(SEED + t)) mod rows, mix64 being adt_rng_mix64 (splitmix64). */
static int32_t criteo_hash(const char *s, size_t len, int t, int64_t rows) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) h = (h ^ (uint8_t)s[i]) * 0x100000001b3ull;
    return (int32_t)(adt_rng_mix64(h ^ adt_rng_mix64(CRITEO_HASH_SEED + (uint64_t)t)) % (uint64_t)rows);
}

typedef struct field {
    const char *p;
    size_t n;
} field;

/* A field as a person reads it in a message, cut short when long. */
static const char *field_repr(char *buf, size_t cap, field f) {
    size_t k = 0, i = 0;
    for (; i < f.n && k + 8 < cap; i++) {
        unsigned char c = (unsigned char)f.p[i];
        if (c >= 32 && c < 127 && c != '\'') buf[k++] = (char)c;
        else k += (size_t)snprintf(buf + k, cap - k, "\\x%02x", c);
    }
    if (i < f.n) k += (size_t)snprintf(buf + k, cap - k, "...");
    buf[k] = 0;
    return buf;
}

/* A decimal number: digits with an optional sign, point and exponent ("260", "-1", "260.0"). */
static int parse_number(field f, double *out) {
    char tmp[64];
    if (f.n == 0 || f.n >= sizeof tmp) return -1;
    /* fast path: Criteo's own files hold plain integers */
    size_t i = f.p[0] == '-';
    if (f.n > i && f.n - i <= 18) {
        int64_t v = 0;
        for (; i < f.n && f.p[i] >= '0' && f.p[i] <= '9'; i++) v = v * 10 + (f.p[i] - '0');
        if (i == f.n) {
            *out = f.p[0] == '-' ? -(double)v : (double)v;
            return 0;
        }
    }
    for (size_t k = 0; k < f.n; k++)
        if (!strchr("0123456789+-.eE", f.p[k])) return -1;
    memcpy(tmp, f.p, f.n);
    tmp[f.n] = 0;
    char *end;
    double v = strtod(tmp, &end);
    if (end != tmp + f.n || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

static int is_hex(field f) {
    if (f.n > 16) return 0;
    for (size_t i = 0; i < f.n; i++)
        if (!isxdigit((unsigned char)f.p[i])) return 0;
    return 1;
}

/* Splits one line (without its newline and any '\r') into at most max fields; returns the
 * count, or max + 1 when there are more. */
static int split_line(const char *p, size_t n, char sep, field *f, int max) {
    int k = 0;
    size_t start = 0;
    for (size_t i = 0; i <= n; i++) {
        if (i == n || p[i] == sep) {
            if (k == max) return max + 1;
            f[k].p = p + start;
            f[k].n = i - start;
            k++;
            start = i + 1;
        }
    }
    return k;
}

static const char *field_name(int i, char *buf, size_t cap) {
    if (i == 0) snprintf(buf, cap, "label");
    else if (i <= CRITEO_DENSE) snprintf(buf, cap, "I%d", i);
    else snprintf(buf, cap, "C%d", i - CRITEO_DENSE);
    return buf;
}

/* Parses line `line` (1-based) into sample s. */
static int parse_sample(criteo_data *d, int64_t s, const field *f, int nf, const char *name, int64_t line,
                        const adt_data_shape *shape) {
    char fn[8], rep[48];
    if (nf > CRITEO_FIELDS || nf < CRITEO_MIN_FIELDS)
        return adt_error(ADT_ERR_FORMAT, "%s:%lld: %s%d fields, expected %d (label, %d integer, %d categorical)", name,
                         (long long)line, nf > CRITEO_FIELDS ? "more than " : "", nf > CRITEO_FIELDS ? CRITEO_FIELDS : nf,
                         CRITEO_FIELDS, CRITEO_DENSE, CRITEO_CAT);
    double v;
    if (parse_number(f[0], &v) || (v != 0 && v != 1))
        return adt_error(ADT_ERR_FORMAT, "%s:%lld: field 1 (label) is '%s', expected 0 or 1", name, (long long)line,
                         field_repr(rep, sizeof rep, f[0]));
    d->label[s] = (uint8_t)v;
    for (int j = 0; j < CRITEO_DENSE; j++) {
        field x = f[1 + j];
        float out = 0;
        if (x.n) {
            if (parse_number(x, &v))
                return adt_error(ADT_ERR_FORMAT, "%s:%lld: field %d (%s) is '%s', expected an integer or empty", name,
                                 (long long)line, 2 + j, field_name(1 + j, fn, sizeof fn),
                                 field_repr(rep, sizeof rep, x));
            out = v > 0 ? (float)log1p(v) : 0.0f; /* negative counts clamp to 0, as DLRM's preprocessing */
        }
        d->dense[s * CRITEO_DENSE + j] = out;
    }
    for (int t = 0; t < CRITEO_CAT; t++) {
        int i = 1 + CRITEO_DENSE + t;
        field c = i < nf ? f[i] : (field){"", 0};
        if (!is_hex(c))
            return adt_error(ADT_ERR_FORMAT, "%s:%lld: field %d (%s) is '%s', expected a hex string of at most 16 "
                             "digits, or empty", name, (long long)line, i + 1, field_name(i, fn, sizeof fn),
                             field_repr(rep, sizeof rep, c));
        d->cat[s * CRITEO_CAT + t] = criteo_hash(c.p, c.n, t, shape->table_rows[t]);
    }
    return ADT_OK;
}

static int check_shape(const char *name, const adt_data_shape *shape) {
    if (shape->n_dense != 0 && shape->n_dense != CRITEO_DENSE)
        return adt_error(ADT_ERR_SHAPE, "criteo:%s: the model takes n_dense %d, expected %d (Criteo's integer features)",
                         name, shape->n_dense, CRITEO_DENSE);
    if (shape->n_tables != 0 && shape->n_tables != CRITEO_CAT)
        return adt_error(ADT_ERR_SHAPE, "criteo:%s: the model has n_tables %d, expected %d (Criteo's categorical "
                         "features)", name, shape->n_tables, CRITEO_CAT);
    for (int t = 0; t < CRITEO_CAT; t++)
        if (shape->table_rows[t] < 1 || shape->table_rows[t] > INT32_MAX)
            return adt_error(ADT_ERR_SHAPE, "criteo:%s: table_rows[%d] = %lld, expected 1 .. %d rows to hash C%d into",
                             name, t, (long long)shape->table_rows[t], INT32_MAX, t + 1);
    return ADT_OK;
}

/* The separator of the file, from its first line: a tab if it has one, else a comma. */
static char detect_sep(const char *p, size_t n) {
    for (size_t i = 0; i < n && p[i] != '\n'; i++)
        if (p[i] == '\t') return '\t';
    for (size_t i = 0; i < n && p[i] != '\n'; i++)
        if (p[i] == ',') return ',';
    return '\t';
}

static int parse_all(criteo_data *d, int64_t *n_out, int *has_header, char *sep_out, const char *name,
                     const uint8_t *buf, size_t size, const adt_data_shape *shape) {
    const char *p = (const char *)buf, *end = p + size;
    char sep = detect_sep(p, size);
    field f[CRITEO_FIELDS];
    int64_t s = 0, line = 0;
    *has_header = 0;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        size_t len = (size_t)(eol - p);
        if (len && p[len - 1] == '\r') len--;
        line++;
        if (len == 0)
            return adt_error(ADT_ERR_FORMAT, "%s:%lld: empty line, expected %d fields", name, (long long)line,
                             CRITEO_FIELDS);
        int nf = split_line(p, len, sep, f, CRITEO_FIELDS);
        double v;
        if (line == 1 && nf > 0 && parse_number(f[0], &v) && f[0].n > 0) {
            /* a header ("label,I1,...,C26") names the columns: only its width is checked */
            if (nf != CRITEO_FIELDS)
                return adt_error(ADT_ERR_FORMAT, "%s:1: header line with %s%d columns, expected %d", name,
                                 nf > CRITEO_FIELDS ? "more than " : "", nf > CRITEO_FIELDS ? CRITEO_FIELDS : nf,
                                 CRITEO_FIELDS);
            *has_header = 1;
        } else {
            int rc = parse_sample(d, s, f, nf, name, line, shape);
            if (rc) return rc;
            s++;
        }
        p = nl ? nl + 1 : end;
    }
    *n_out = s;
    *sep_out = sep;
    return ADT_OK;
}

int data_criteo_source(data_source *src, const char *name, data_buf *buf, const adt_data_shape *shape) {
    int rc = check_shape(name, shape);
    if (rc) {
        data_buf_free(buf);
        return rc;
    }
    /* at most one sample per line */
    int64_t lines = buf->n > 0;
    for (const uint8_t *q = buf->p, *end = buf->p + buf->n; (q = memchr(q, '\n', (size_t)(end - q))) != NULL; q++)
        lines += q + 1 < end;
    criteo_data *d = adt_calloc(1, sizeof *d);
    d->dense = adt_malloc((size_t)lines * CRITEO_DENSE * sizeof *d->dense);
    d->cat = adt_malloc((size_t)lines * CRITEO_CAT * sizeof *d->cat);
    d->label = adt_malloc((size_t)lines);
    int64_t n = 0, pos = 0;
    int header;
    char sep;
    rc = parse_all(d, &n, &header, &sep, name, buf->p, buf->n, shape);
    data_buf_free(buf);
    if (rc == ADT_OK && n == 0)
        rc = adt_error(ADT_ERR_FORMAT, "%s: no samples, expected lines of %d fields", name, CRITEO_FIELDS);
    if (rc) {
        criteo_free(d);
        return rc;
    }
    for (int64_t i = 0; i < n; i++) pos += d->label[i];
    *src = (data_source){.n = n, .layout = ADT_DATA_CTR, .elems = {CRITEO_DENSE, CRITEO_CAT, 1}, .impl = d,
                         .fill = criteo_fill, .free = criteo_free};
    snprintf(src->what, sizeof src->what, "%lld clicks (%.1f%% positive), 13 dense + 26 hashed categorical, %s%s",
             (long long)n, 100.0 * (double)pos / (double)n, sep == '\t' ? "TSV" : "CSV", header ? " with header" : "");
    return ADT_OK;
}
