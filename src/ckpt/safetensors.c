/*
 * safetensors.c - the safetensors reader (validate everything, then hand out trusted views) and
 * the writer (atomic save, insertion order, space-padded header).
 *
 * The reader treats every byte of the file as hostile: checkpoints come from other programs,
 * other versions and half-finished copies, and a bad one must produce a message naming the file,
 * the tensor and the field, never a crash or a silently wrong tensor.
 */
#ifndef _GNU_SOURCE
#define _POSIX_C_SOURCE 200809L /* pread, fsync, O_CLOEXEC, O_DIRECTORY */
#endif

#include "adtrain/safetensors.h"

#include "adtrain/base.h"
#include "ckpt_internal.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; this reader copies it as is"
#endif

/* Integers in the header are JSON numbers, which cJSON holds as doubles: beyond 2^53 they are
 * no longer exact, so such a value cannot be a trustworthy offset or dimension. */
#define ST_MAX_JSON_INT 9007199254740992.0

static const struct {
    const char *name;
    size_t size;
} k_dtypes[ADT_ST_NUM_DTYPES] = {
    [ADT_ST_BOOL] = {"BOOL", 1},    [ADT_ST_U8] = {"U8", 1},     [ADT_ST_I8] = {"I8", 1},
    [ADT_ST_F8_E5M2] = {"F8_E5M2", 1}, [ADT_ST_F8_E4M3] = {"F8_E4M3", 1},
    [ADT_ST_I16] = {"I16", 2},      [ADT_ST_U16] = {"U16", 2},   [ADT_ST_F16] = {"F16", 2},
    [ADT_ST_BF16] = {"BF16", 2},    [ADT_ST_I32] = {"I32", 4},   [ADT_ST_U32] = {"U32", 4},
    [ADT_ST_F32] = {"F32", 4},      [ADT_ST_F64] = {"F64", 8},   [ADT_ST_I64] = {"I64", 8},
    [ADT_ST_U64] = {"U64", 8},
};

const char *adt_st_dtype_name(adt_st_dtype dtype) {
    if ((int)dtype < 0 || dtype >= ADT_ST_NUM_DTYPES) return "?";
    return k_dtypes[dtype].name;
}

size_t adt_st_dtype_size(adt_st_dtype dtype) {
    if ((int)dtype < 0 || dtype >= ADT_ST_NUM_DTYPES) return 0;
    return k_dtypes[dtype].size;
}

int adt_st_dtype_parse(const char *name, adt_st_dtype *out) {
    for (int i = 0; i < ADT_ST_NUM_DTYPES; i++) {
        if (strcmp(name, k_dtypes[i].name) == 0) {
            *out = (adt_st_dtype)i;
            return ADT_OK;
        }
    }
    return adt_error(ADT_ERR_ARG,
                     "unknown dtype '%s' (expected one of BOOL, U8, I8, F8_E5M2, F8_E4M3, I16, "
                     "U16, F16, BF16, I32, U32, F32, F64, I64, U64)",
                     name);
}

/* "[32,96]", "[]" for a scalar; truncated with "..." if it does not fit. */
static const char *fmt_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t n = 0;
    buf[n++] = '[';
    for (int i = 0; i < ndim && n < cap; i++) {
        int w = snprintf(buf + n, cap - n, "%s%" PRId64, i ? "," : "", shape[i]);
        if (w < 0) break;
        n += (size_t)w;
    }
    if (n + 2 > cap) {
        memcpy(buf + cap - 5, "...]", 5);
    } else {
        buf[n++] = ']';
        buf[n] = 0;
    }
    return buf;
}

/* ---------------------------------------------------------------------------------------------
 * Reader
 */
typedef struct {
    const char *name; /* points at the owning tensor's name */
    int idx;
} st_name_ref;

struct adt_st_file {
    char *name;
    unsigned char *data; /* the data buffer, 64-byte aligned, owned */
    size_t data_len;
    int n;
    adt_st_tensor *tensors; /* in file order */
    st_name_ref *by_name;   /* sorted by name, for adt_st_find */
    ckpt_meta meta;
};

/* A tensor entry while the header is being checked, with the offsets kept. */
typedef struct {
    adt_st_tensor t;
    uint64_t begin, end;
} st_entry;

static const char *json_type_name(const cJSON *j) {
    if (cJSON_IsObject(j)) return "an object";
    if (cJSON_IsArray(j)) return "an array";
    if (cJSON_IsString(j)) return "a string";
    if (cJSON_IsNumber(j)) return "a number";
    if (cJSON_IsBool(j)) return "a boolean";
    if (cJSON_IsNull(j)) return "null";
    return "an invalid value";
}

/* True (and *out set) if j is an integer in [0, 2^53]. */
static int json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return 0;
    double v = j->valuedouble;
    if (!(v >= 0 && v <= ST_MAX_JSON_INT)) return 0; /* also rejects NaN */
    uint64_t u = (uint64_t)v;
    if ((double)u != v) return 0;
    *out = u;
    return 1;
}

/* Writes a printable, bounded excerpt of untrusted bytes for an error message. */
static void fmt_excerpt(char *buf, size_t cap, const char *p, size_t avail) {
    size_t n = 0;
    for (size_t i = 0; i < avail && n + 5 < cap && i < 24; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c >= 0x20 && c < 0x7f && c != '\\') {
            buf[n++] = (char)c;
        } else {
            n += (size_t)snprintf(buf + n, cap - n, "\\x%02x", c);
        }
    }
    buf[n] = 0;
}

static int cmp_entry_offset(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return strcmp(x->t.name, y->t.name);
}

static int cmp_name_ref(const void *a, const void *b) {
    const st_name_ref *x = a, *y = b;
    return strcmp(x->name, y->name);
}

/* Checks one tensor entry of the header and fills *e (its name is not yet copied). */
static int parse_entry(const adt_st_file *f, const cJSON *j, st_entry *e) {
    const char *fn = f->name, *tn = j->string;
    char sbuf[200];
    if (!cJSON_IsObject(j))
        return adt_error(ADT_ERR_FORMAT,
                         "%s: tensor '%s' is %s in the header, expected an object with dtype, "
                         "shape and data_offsets",
                         fn, tn, json_type_name(j));

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    if (!jd) return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has no \"dtype\"", fn, tn);
    if (!cJSON_IsString(jd))
        return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s': \"dtype\" is %s, expected a string",
                         fn, tn, json_type_name(jd));
    if (adt_st_dtype_parse(jd->valuestring, &e->t.dtype) != ADT_OK)
        return adt_error_prefix(ADT_ERR_FORMAT, "%s: tensor '%s': ", fn, tn);

    const cJSON *js = cJSON_GetObjectItemCaseSensitive(j, "shape");
    if (!js) return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has no \"shape\"", fn, tn);
    if (!cJSON_IsArray(js))
        return adt_error(ADT_ERR_FORMAT,
                         "%s: tensor '%s': \"shape\" is %s, expected an array of non-negative "
                         "integers",
                         fn, tn, json_type_name(js));
    int ndim = cJSON_GetArraySize(js);
    if (ndim > ADT_ST_MAX_DIMS)
        return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has %d dimensions, at most %d supported",
                         fn, tn, ndim, ADT_ST_MAX_DIMS);
    e->t.ndim = ndim;
    int d = 0, any_zero = 0;
    for (const cJSON *c = js->child; c; c = c->next, d++) {
        uint64_t v;
        if (!json_uint(c, &v)) {
            if (cJSON_IsNumber(c))
                return adt_error(ADT_ERR_FORMAT,
                                 "%s: tensor '%s': shape[%d] is %.17g, expected a non-negative "
                                 "integer",
                                 fn, tn, d, c->valuedouble);
            return adt_error(ADT_ERR_FORMAT,
                             "%s: tensor '%s': shape[%d] is %s, expected a non-negative integer",
                             fn, tn, d, json_type_name(c));
        }
        e->t.shape[d] = (int64_t)v;
        if (v == 0) any_zero = 1;
    }

    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!jo) return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has no \"data_offsets\"", fn, tn);
    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_uint(jo->child, &e->begin) ||
        !json_uint(jo->child->next, &e->end))
        return adt_error(ADT_ERR_FORMAT,
                         "%s: tensor '%s': \"data_offsets\" must be [begin, end] with "
                         "non-negative integers",
                         fn, tn);
    if (e->begin > e->end)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                         "] end before they begin",
                         fn, tn, e->begin, e->end);
    if (e->end > f->data_len)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ",%" PRIu64
                         "] run past the end of the %zu-byte data buffer (truncated file?)",
                         fn, tn, e->begin, e->end, f->data_len);

    /* Byte size = product(shape) * dtype size, overflow-checked. A zero dimension makes it 0
     * whatever the others are, so test for that first rather than multiply blindly. */
    uint64_t need = 0;
    if (!any_zero) {
        need = adt_st_dtype_size(e->t.dtype);
        for (int i = 0; i < ndim; i++) {
            if (__builtin_mul_overflow(need, (uint64_t)e->t.shape[i], &need))
                return adt_error(ADT_ERR_FORMAT,
                                 "%s: tensor '%s': shape %s of %s overflows 64-bit byte counts",
                                 fn, tn, fmt_shape(sbuf, sizeof sbuf, ndim, e->t.shape),
                                 adt_st_dtype_name(e->t.dtype));
        }
    }
    if (need != e->end - e->begin)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: tensor '%s': shape %s of %s needs %" PRIu64
                         " bytes, but data_offsets [%" PRIu64 ",%" PRIu64 "] span %" PRIu64,
                         fn, tn, fmt_shape(sbuf, sizeof sbuf, ndim, e->t.shape),
                         adt_st_dtype_name(e->t.dtype), need, e->begin, e->end,
                         e->end - e->begin);
    e->t.nbytes = (size_t)need;
    return ADT_OK;
}

static int parse_metadata(adt_st_file *f, const cJSON *j) {
    if (!cJSON_IsObject(j))
        return adt_error(ADT_ERR_FORMAT,
                         "%s: \"__metadata__\" is %s, expected an object of string values",
                         f->name, json_type_name(j));
    for (const cJSON *c = j->child; c; c = c->next) {
        if (!cJSON_IsString(c))
            return adt_error(ADT_ERR_FORMAT,
                             "%s: \"__metadata__\" entry '%s' is %s, expected a string", f->name,
                             c->string, json_type_name(c));
        ckpt_meta_append(&f->meta, c->string, c->valuestring);
    }
    return ADT_OK;
}

/* Parses and checks the header (hdr_len bytes, NUL-terminated at hdr[hdr_len]) against the data
 * buffer already in f, and fills f's tensor table. */
static int parse_header(adt_st_file *f, const char *hdr, size_t hdr_len) {
    const char *fn = f->name;
    char ex[128];
    /* The format requires the header to be a JSON object starting at its first byte. */
    if (hdr_len == 0)
        return adt_error(ADT_ERR_FORMAT, "%s: header length is 0; not a safetensors file?", fn);
    if (hdr[0] != '{') {
        fmt_excerpt(ex, sizeof ex, hdr, hdr_len);
        return adt_error(ADT_ERR_FORMAT,
                         "%s: header does not start with '{' (starts with \"%s\"); not a "
                         "safetensors file?",
                         fn, ex);
    }
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(hdr, hdr_len, &end, 0);
    if (!root) {
        size_t pos = end && end >= hdr && end <= hdr + hdr_len ? (size_t)(end - hdr) : 0;
        fmt_excerpt(ex, sizeof ex, hdr + pos, hdr_len - pos);
        return adt_error(ADT_ERR_FORMAT,
                         "%s: header is not valid JSON (error at byte %zu of %zu, near \"%s\")",
                         fn, pos, hdr_len, ex);
    }
    int rc = ADT_OK;
    st_entry *ents = NULL;
    int n_ent = 0;

    /* The spec pads the header with spaces; accept any JSON whitespace, but nothing else. */
    size_t pos = end ? (size_t)(end - hdr) : hdr_len;
    for (size_t i = pos; i < hdr_len; i++) {
        char c = hdr[i];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
            fmt_excerpt(ex, sizeof ex, hdr + i, hdr_len - i);
            rc = adt_error(ADT_ERR_FORMAT,
                           "%s: header has data after its JSON object (at byte %zu: \"%s\"), "
                           "expected only space padding",
                           fn, i, ex);
            goto done;
        }
    }
    if (!cJSON_IsObject(root)) {
        rc = adt_error(ADT_ERR_FORMAT, "%s: header is %s, expected a JSON object", fn,
                       json_type_name(root));
        goto done;
    }

    int n_children = cJSON_GetArraySize(root);
    ents = adt_calloc((size_t)n_children, sizeof *ents);
    int seen_meta = 0;
    for (const cJSON *c = root->child; c; c = c->next) {
        if (strcmp(c->string, "__metadata__") == 0) {
            if (seen_meta) {
                rc = adt_error(ADT_ERR_FORMAT, "%s: \"__metadata__\" appears twice in the header",
                               fn);
                goto done;
            }
            seen_meta = 1;
            if ((rc = parse_metadata(f, c)) != ADT_OK) goto done;
            continue;
        }
        st_entry *e = &ents[n_ent];
        if ((rc = parse_entry(f, c, e)) != ADT_OK) goto done;
        e->t.name = c->string; /* borrowed from the JSON tree until copied below */
        n_ent++;
    }

    /* File order makes the overlap check a single pass, and is the natural listing order. */
    qsort(ents, (size_t)n_ent, sizeof *ents, cmp_entry_offset);
    int last = -1; /* the non-empty tensor reaching furthest so far */
    for (int i = 0; i < n_ent; i++) {
        if (ents[i].begin == ents[i].end) continue; /* an empty tensor occupies no bytes */
        if (last >= 0 && ents[i].begin < ents[last].end) {
            rc = adt_error(ADT_ERR_FORMAT,
                           "%s: tensors '%s' [%" PRIu64 ",%" PRIu64 "] and '%s' [%" PRIu64
                           ",%" PRIu64 "] overlap in the data buffer",
                           fn, ents[last].t.name, ents[last].begin, ents[last].end,
                           ents[i].t.name, ents[i].begin, ents[i].end);
            goto done;
        }
        if (last < 0 || ents[i].end > ents[last].end) last = i;
    }

    f->n = n_ent;
    f->tensors = adt_calloc((size_t)n_ent, sizeof *f->tensors);
    f->by_name = adt_calloc((size_t)n_ent, sizeof *f->by_name);
    for (int i = 0; i < n_ent; i++) {
        f->tensors[i] = ents[i].t;
        f->tensors[i].name = adt_strdup(ents[i].t.name);
        f->tensors[i].data = f->data + ents[i].begin;
        f->by_name[i].name = f->tensors[i].name;
        f->by_name[i].idx = i;
    }
    /* JSON allows repeated keys and cJSON keeps them all; a checkpoint must not. */
    qsort(f->by_name, (size_t)n_ent, sizeof *f->by_name, cmp_name_ref);
    for (int i = 1; i < n_ent; i++) {
        if (strcmp(f->by_name[i - 1].name, f->by_name[i].name) == 0) {
            rc = adt_error(ADT_ERR_FORMAT, "%s: tensor name '%s' appears more than once", fn,
                           f->by_name[i].name);
            goto done;
        }
    }

done:
    free(ents);
    cJSON_Delete(root);
    return rc;
}

static adt_st_file *file_new(const char *name) {
    adt_st_file *f = adt_calloc(1, sizeof *f);
    f->name = adt_strdup(name ? name : "<memory>");
    return f;
}

static uint64_t load_le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* Checks the header length field against the `rest` bytes that follow it. */
static int check_header_len(const char *fn, uint64_t hlen, uint64_t rest) {
    if (hlen > rest)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: header length %" PRIu64 " exceeds the %" PRIu64
                         " bytes that follow it (truncated file, or not a safetensors file)",
                         fn, hlen, rest);
    if (hlen > ADT_ST_MAX_HEADER)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: header length %" PRIu64 " is over the %" PRIu64 "-byte limit", fn,
                         hlen, ADT_ST_MAX_HEADER);
    return ADT_OK;
}

int adt_st_open_memory(adt_st_file **out, const char *name, const void *buf, size_t n) {
    *out = NULL;
    adt_st_file *f = file_new(name);
    const unsigned char *b = buf;
    int rc;
    if (n < 8) {
        rc = adt_error(ADT_ERR_FORMAT,
                       "%s: file is %zu bytes, too short for the 8-byte header length", f->name,
                       n);
        goto fail;
    }
    uint64_t hlen = load_le64(b);
    if ((rc = check_header_len(f->name, hlen, n - 8)) != ADT_OK) goto fail;
    f->data_len = n - 8 - (size_t)hlen;
    f->data = adt_alloc_aligned(f->data_len);
    if (f->data_len) memcpy(f->data, b + 8 + hlen, f->data_len);
    /* A NUL-terminated copy, so no JSON scanner can run past the header into other bytes. */
    char *hdr = adt_malloc((size_t)hlen + 1);
    if (hlen) memcpy(hdr, b + 8, (size_t)hlen);
    hdr[hlen] = 0;
    rc = parse_header(f, hdr, (size_t)hlen);
    free(hdr);
    if (rc != ADT_OK) goto fail;
    *out = f;
    return ADT_OK;
fail:
    adt_st_close(f);
    return rc;
}

/* Reads exactly n bytes at offset off; returns the count read (short only at end of file) or -1
 * with errno set. */
static ssize_t pread_full(int fd, void *buf, size_t n, off_t off) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = pread(fd, (char *)buf + got, n - got, off + (off_t)got);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    return (ssize_t)got;
}

/* What a caller knows the file must be (its size and crc32c, from a manifest), or NULL. */
typedef struct st_expect {
    uint64_t bytes;
    uint32_t crc32c;
} st_expect;

static int st_open(adt_st_file **out, const char *path, const st_expect *want) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return adt_error(ADT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    adt_st_file *f = file_new(path);
    char *hdr = NULL;
    int rc = ADT_OK;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = adt_error(ADT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        rc = adt_error(ADT_ERR_IO, "%s: not a regular file", path);
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    unsigned char lenbuf[8];
    if (want && size != want->bytes) {
        rc = adt_error(ADT_ERR_FORMAT, "%s: file is %" PRIu64 " bytes, expected %" PRIu64 " (%s)", path, size,
                       want->bytes, size < want->bytes ? "truncated" : "grown since it was written");
        goto fail;
    }
    if (size < 8) {
        rc = adt_error(ADT_ERR_FORMAT,
                       "%s: file is %" PRIu64 " bytes, too short for the 8-byte header length",
                       path, size);
        goto fail;
    }
    ssize_t r = pread_full(fd, lenbuf, 8, 0);
    if (r != 8) goto read_fail;
    uint64_t hlen = load_le64(lenbuf);
    if ((rc = check_header_len(path, hlen, size - 8)) != ADT_OK) goto fail;
    if (size - 8 - hlen > (uint64_t)SIZE_MAX) {
        rc = adt_error(ADT_ERR_IO, "%s: data buffer of %" PRIu64 " bytes does not fit in memory",
                       path, size - 8 - hlen);
        goto fail;
    }

    hdr = adt_malloc((size_t)hlen + 1);
    r = pread_full(fd, hdr, (size_t)hlen, 8);
    if (r != (ssize_t)hlen) goto read_fail;
    hdr[hlen] = 0;
    f->data_len = (size_t)(size - 8 - hlen);
    f->data = adt_alloc_aligned(f->data_len);
    r = pread_full(fd, f->data, f->data_len, (off_t)(8 + hlen));
    if (r != (ssize_t)f->data_len) goto read_fail;
    if (want) { /* before the header is believed: a damaged file says so, not "bad JSON" */
        uint32_t crc = adt_crc32c(adt_crc32c(adt_crc32c(0, lenbuf, 8), hdr, (size_t)hlen), f->data, f->data_len);
        if (crc != want->crc32c) {
            rc = adt_error(ADT_ERR_FORMAT, "%s: content crc32c %08x, expected %08x (the file changed or was damaged "
                           "after it was written)", path, crc, want->crc32c);
            goto fail;
        }
    }

    if ((rc = parse_header(f, hdr, (size_t)hlen)) != ADT_OK) goto fail;
    free(hdr);
    close(fd);
    *out = f;
    return ADT_OK;

read_fail:
    if (r < 0)
        rc = adt_error(ADT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    else
        rc = adt_error(ADT_ERR_IO, "%s: file shrank while being read (another writer?)", path);
fail:
    free(hdr);
    close(fd);
    adt_st_close(f);
    return rc;
}

int adt_st_open(adt_st_file **out, const char *path) { return st_open(out, path, NULL); }

int adt_st_open_checked(adt_st_file **out, const char *path, uint64_t bytes, uint32_t crc32c) {
    st_expect want = {bytes, crc32c};
    return st_open(out, path, &want);
}

void adt_st_close(adt_st_file *f) {
    if (!f) return;
    for (int i = 0; i < f->n; i++) free((char *)f->tensors[i].name);
    ckpt_meta_free(&f->meta);
    free(f->tensors);
    free(f->by_name);
    adt_free_aligned(f->data);
    free(f->name);
    free(f);
}

const char *adt_st_name(const adt_st_file *f) { return f->name; }
int adt_st_count(const adt_st_file *f) { return f->n; }

const adt_st_tensor *adt_st_get(const adt_st_file *f, int i) {
    return i >= 0 && i < f->n ? &f->tensors[i] : NULL;
}

const adt_st_tensor *adt_st_find(const adt_st_file *f, const char *name) {
    st_name_ref key = {name, 0};
    const st_name_ref *hit = f->n ? bsearch(&key, f->by_name, (size_t)f->n, sizeof key,
                                            cmp_name_ref)
                                  : NULL;
    return hit ? &f->tensors[hit->idx] : NULL;
}

const char *adt_st_metadata(const adt_st_file *f, const char *key) {
    /* First match: a repeated key keeps the value a JSON reader that stops early would see. */
    return ckpt_meta_find(&f->meta, key);
}

int adt_st_metadata_count(const adt_st_file *f) { return f->meta.n; }

int adt_st_metadata_get(const adt_st_file *f, int i, const char **key, const char **value) {
    if (i < 0 || i >= f->meta.n)
        return adt_error(ADT_ERR_ARG, "%s: metadata index %d out of range [0,%d)", f->name, i,
                         f->meta.n);
    *key = f->meta.keys[i];
    *value = f->meta.vals[i];
    return ADT_OK;
}

/* Finds `name` and checks its shape against what the caller expects. */
static int find_shaped(const adt_st_file *f, const char *name, int ndim, const int64_t *shape,
                       const adt_st_tensor **out) {
    if (ndim < 0 || ndim > ADT_ST_MAX_DIMS)
        return adt_error(ADT_ERR_ARG, "%s: tensor '%s': expected ndim %d outside [0,%d]",
                         f->name, name, ndim, ADT_ST_MAX_DIMS);
    const adt_st_tensor *t = adt_st_find(f, name);
    if (!t)
        return adt_error(ADT_ERR_FORMAT, "%s: no tensor named '%s' (the file has %d tensors)",
                         f->name, name, f->n);
    int same = t->ndim == ndim;
    for (int i = 0; same && i < ndim; i++) same = t->shape[i] == shape[i];
    if (!same) {
        char have[200], want[200];
        return adt_error(ADT_ERR_SHAPE, "%s: tensor '%s' has shape %s, the model expects %s",
                         f->name, name, fmt_shape(have, sizeof have, t->ndim, t->shape),
                         fmt_shape(want, sizeof want, ndim, shape));
    }
    *out = t;
    return ADT_OK;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 is exact in float */
        float v = (float)man * 0x1p-24f;
        return sign ? -v : v;
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13); /* inf / nan, payload kept */
    } else {
        bits = sign | ((exp + 112u) << 23) | (man << 13); /* rebias 15 -> 127 */
    }
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

int adt_st_read_f32(const adt_st_file *f, const char *name, float *dst, int ndim,
                    const int64_t *shape) {
    const adt_st_tensor *t;
    int rc = find_shaped(f, name, ndim, shape, &t);
    if (rc != ADT_OK) return rc;
    const unsigned char *p = t->data;
    switch (t->dtype) {
    case ADT_ST_F32:
        if (t->nbytes) memcpy(dst, p, t->nbytes);
        return ADT_OK;
    case ADT_ST_BF16:
    case ADT_ST_F16: {
        size_t n = t->nbytes / 2;
        for (size_t i = 0; i < n; i++) {
            uint16_t h = (uint16_t)(p[2 * i] | p[2 * i + 1] << 8);
            dst[i] = t->dtype == ADT_ST_BF16 ? bf16_to_f32(h) : f16_to_f32(h);
        }
        return ADT_OK;
    }
    default:
        return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected F32 (or BF16/F16)",
                         f->name, name, adt_st_dtype_name(t->dtype));
    }
}

int adt_st_read_i32(const adt_st_file *f, const char *name, int32_t *dst, int ndim,
                    const int64_t *shape) {
    const adt_st_tensor *t;
    int rc = find_shaped(f, name, ndim, shape, &t);
    if (rc != ADT_OK) return rc;
    if (t->dtype == ADT_ST_I32) {
        if (t->nbytes) memcpy(dst, t->data, t->nbytes);
        return ADT_OK;
    }
    if (t->dtype == ADT_ST_I64) {
        size_t n = t->nbytes / 8;
        const unsigned char *p = t->data;
        for (size_t i = 0; i < n; i++) {
            int64_t v;
            memcpy(&v, p + 8 * i, 8);
            if (v < INT32_MIN || v > INT32_MAX)
                return adt_error(ADT_ERR_FORMAT,
                                 "%s: tensor '%s' element %zu is %" PRId64
                                 ", which does not fit in int32",
                                 f->name, name, i, v);
            dst[i] = (int32_t)v;
        }
        return ADT_OK;
    }
    return adt_error(ADT_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected I32 (or I64)",
                     f->name, name, adt_st_dtype_name(t->dtype));
}

/* ---------------------------------------------------------------------------------------------
 * Writer
 */
typedef struct {
    char *name;
    adt_st_dtype dtype;
    int ndim;
    int64_t shape[ADT_ST_MAX_DIMS];
    const void *data;
    void *owned; /* non-NULL for adt_st_writer_add_copy: data == owned */
    size_t nbytes;
} st_wentry;

struct adt_st_writer {
    st_wentry *ents;
    int n, cap;
    ckpt_meta meta;
};

adt_st_writer *adt_st_writer_create(void) { return adt_calloc(1, sizeof(adt_st_writer)); }

void adt_st_writer_free(adt_st_writer *w) {
    if (!w) return;
    for (int i = 0; i < w->n; i++) {
        free(w->ents[i].name);
        free(w->ents[i].owned);
    }
    ckpt_meta_free(&w->meta);
    free(w->ents);
    free(w);
}

static int writer_add(adt_st_writer *w, const char *name, adt_st_dtype dtype, int ndim,
                      const int64_t *shape, const void *data, int copy) {
    if (!name || !name[0]) return adt_error(ADT_ERR_ARG, "safetensors writer: empty tensor name");
    if (strcmp(name, "__metadata__") == 0)
        return adt_error(ADT_ERR_ARG,
                         "safetensors writer: '__metadata__' is reserved, not a tensor name");
    if (adt_st_dtype_size(dtype) == 0)
        return adt_error(ADT_ERR_ARG, "safetensors writer: tensor '%s' has invalid dtype %d",
                         name, (int)dtype);
    if (ndim < 0 || ndim > ADT_ST_MAX_DIMS)
        return adt_error(ADT_ERR_ARG,
                         "safetensors writer: tensor '%s' has ndim %d, expected 0..%d", name,
                         ndim, ADT_ST_MAX_DIMS);
    if (ndim > 0 && !shape)
        return adt_error(ADT_ERR_ARG, "safetensors writer: tensor '%s' has no shape", name);
    /* Sizes must also stay exact as JSON numbers (doubles) for any reader. */
    uint64_t nbytes = adt_st_dtype_size(dtype);
    int overflow = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] < 0)
            return adt_error(ADT_ERR_ARG,
                             "safetensors writer: tensor '%s': shape[%d] is %" PRId64
                             ", expected >= 0",
                             name, i, shape[i]);
        if (__builtin_mul_overflow(nbytes, (uint64_t)shape[i], &nbytes)) overflow = 1;
    }
    for (int i = 0; i < ndim; i++)
        if (shape[i] == 0) nbytes = 0, overflow = 0;
    if (overflow || nbytes > (uint64_t)ST_MAX_JSON_INT || nbytes > (uint64_t)SIZE_MAX)
        return adt_error(ADT_ERR_ARG, "safetensors writer: tensor '%s' is too large", name);
    if (nbytes && !data)
        return adt_error(ADT_ERR_ARG, "safetensors writer: tensor '%s' has NULL data", name);
    for (int i = 0; i < w->n; i++)
        if (strcmp(w->ents[i].name, name) == 0)
            return adt_error(ADT_ERR_ARG, "safetensors writer: tensor '%s' added twice", name);

    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 16;
        w->ents = adt_realloc(w->ents, (size_t)w->cap * sizeof *w->ents);
    }
    st_wentry *e = &w->ents[w->n++];
    memset(e, 0, sizeof *e);
    e->name = adt_strdup(name);
    e->dtype = dtype;
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++) e->shape[i] = shape[i];
    e->nbytes = (size_t)nbytes;
    if (copy && nbytes) {
        e->owned = adt_malloc((size_t)nbytes);
        memcpy(e->owned, data, (size_t)nbytes);
        e->data = e->owned;
    } else {
        e->data = data;
    }
    return ADT_OK;
}

int adt_st_writer_add(adt_st_writer *w, const char *name, adt_st_dtype dtype, int ndim,
                      const int64_t *shape, const void *data) {
    return writer_add(w, name, dtype, ndim, shape, data, 0);
}

int adt_st_writer_add_copy(adt_st_writer *w, const char *name, adt_st_dtype dtype, int ndim,
                           const int64_t *shape, const void *data) {
    return writer_add(w, name, dtype, ndim, shape, data, 1);
}

int adt_st_writer_set_metadata(adt_st_writer *w, const char *key, const char *value) {
    if (!key || !value)
        return adt_error(ADT_ERR_ARG, "safetensors writer: NULL metadata key or value");
    ckpt_meta_set(&w->meta, key, value);
    return ADT_OK;
}

/* Builds the space-padded header (length a multiple of 8, so the data buffer starts 8-byte
 * aligned in the file) and the total data size. *out is malloc'd. */
static int build_header(const adt_st_writer *w, char **out, size_t *out_len, uint64_t *data_len) {
    *out = NULL;
    cJSON *root = cJSON_CreateObject();
    int ok = root != NULL;
    if (ok && w->meta.n) {
        cJSON *meta = cJSON_AddObjectToObject(root, "__metadata__");
        ok = meta != NULL;
        for (int i = 0; ok && i < w->meta.n; i++)
            ok = cJSON_AddStringToObject(meta, w->meta.keys[i], w->meta.vals[i]) != NULL;
    }
    uint64_t off = 0;
    /* Shapes and offsets go in as raw text so 64-bit values print exactly (cJSON would format
     * them as doubles). */
    char buf[ADT_ST_MAX_DIMS * 22 + 64];
    for (int i = 0; ok && i < w->n; i++) {
        const st_wentry *e = &w->ents[i];
        cJSON *t = cJSON_AddObjectToObject(root, e->name);
        ok = t && cJSON_AddStringToObject(t, "dtype", adt_st_dtype_name(e->dtype));
        fmt_shape(buf, sizeof buf, e->ndim, e->shape);
        ok = ok && cJSON_AddRawToObject(t, "shape", buf);
        snprintf(buf, sizeof buf, "[%" PRIu64 ",%" PRIu64 "]", off, off + e->nbytes);
        ok = ok && cJSON_AddRawToObject(t, "data_offsets", buf);
        off += e->nbytes;
        if (off > (uint64_t)ST_MAX_JSON_INT) {
            cJSON_Delete(root);
            return adt_error(ADT_ERR_ARG, "safetensors writer: total data size is too large");
        }
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return adt_error(ADT_ERR_NOMEM, "safetensors writer: out of memory building the header");
    size_t len = strlen(json);
    size_t padded = (len + 7) & ~(size_t)7;
    char *hdr = adt_malloc(padded);
    memcpy(hdr, json, len);
    memset(hdr + len, ' ', padded - len);
    cJSON_free(json);
    *out = hdr;
    *out_len = padded;
    *data_len = off;
    return ADT_OK;
}

static void store_le64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

int adt_st_writer_serialize(adt_st_writer *w, void **out_buf, size_t *out_len) {
    *out_buf = NULL;
    *out_len = 0;
    char *hdr;
    size_t hlen;
    uint64_t dlen;
    int rc = build_header(w, &hdr, &hlen, &dlen);
    if (rc != ADT_OK) return rc;
    size_t total = 8 + hlen + (size_t)dlen;
    unsigned char *b = adt_malloc(total);
    store_le64(b, hlen);
    memcpy(b + 8, hdr, hlen);
    size_t off = 8 + hlen;
    for (int i = 0; i < w->n; i++) {
        if (w->ents[i].nbytes) memcpy(b + off, w->ents[i].data, w->ents[i].nbytes);
        off += w->ents[i].nbytes;
    }
    free(hdr);
    *out_buf = b;
    *out_len = total;
    return ADT_OK;
}

static int write_full(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

/* Makes a rename durable: the directory entry lives in the parent directory. */
static int fsync_parent_dir(const char *path) {
    const char *slash = strrchr(path, '/');
    char *dir;
    if (!slash) {
        dir = adt_strdup(".");
    } else {
        size_t n = slash == path ? 1 : (size_t)(slash - path);
        dir = adt_malloc(n + 1);
        memcpy(dir, path, n);
        dir[n] = 0;
    }
    int rc = ADT_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    /* Some file systems cannot fsync a directory (EINVAL); nothing more can be done there. */
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        rc = adt_error(ADT_ERR_IO, "%s: saved, but syncing directory %s failed: %s", path, dir,
                       strerror(errno));
    if (fd >= 0) close(fd);
    free(dir);
    return rc;
}

int ckpt_write_atomic(const char *path, const void *const *chunk, const size_t *len, int n, uint64_t *out_bytes,
                      uint32_t *out_crc) {
    size_t plen = strlen(path);
    char *tmp = adt_malloc(plen + 5);
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int rc = adt_error(ADT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    const char *what = NULL; /* the step that failed, if any */
    int err = 0, rc;
    uint32_t crc = 0;
    uint64_t bytes = 0;
    for (int i = 0; !what && i < n; i++) {
        if (!len[i]) continue;
        crc = adt_crc32c(crc, chunk[i], len[i]);
        bytes += len[i];
        if (write_full(fd, chunk[i], len[i])) what = "write", err = errno;
    }
    if (!what && fsync(fd) != 0) what = "fsync", err = errno;
    if (close(fd) != 0 && !what) what = "close", err = errno;
    if (!what && rename(tmp, path) != 0) what = "rename to the final name", err = errno;
    if (what) {
        rc = adt_error(ADT_ERR_IO, "%s: %s failed: %s", tmp, what, strerror(err));
        unlink(tmp);
    } else {
        rc = fsync_parent_dir(path);
        if (out_bytes) *out_bytes = bytes;
        if (out_crc) *out_crc = crc;
    }
    free(tmp);
    return rc;
}

int adt_st_writer_save(adt_st_writer *w, const char *path) { return adt_st_writer_save_sum(w, path, NULL, NULL); }

int adt_st_writer_save_sum(adt_st_writer *w, const char *path, uint64_t *out_bytes, uint32_t *out_crc) {
    char *hdr;
    size_t hlen;
    uint64_t dlen;
    int rc = build_header(w, &hdr, &hlen, &dlen);
    if (rc != ADT_OK) return adt_error_prefix(rc, "%s: ", path);
    unsigned char lenbuf[8];
    store_le64(lenbuf, hlen);
    /* the file as chunks: length, header, every tensor's bytes in place (no second copy) */
    const void **chunk = adt_malloc((size_t)(w->n + 2) * sizeof *chunk);
    size_t *len = adt_malloc((size_t)(w->n + 2) * sizeof *len);
    chunk[0] = lenbuf, len[0] = 8;
    chunk[1] = hdr, len[1] = hlen;
    for (int i = 0; i < w->n; i++) chunk[i + 2] = w->ents[i].data, len[i + 2] = w->ents[i].nbytes;
    rc = ckpt_write_atomic(path, chunk, len, w->n + 2, out_bytes, out_crc);
    free(chunk);
    free(len);
    free(hdr);
    return rc;
}
