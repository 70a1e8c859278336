/*
 * dataset.c - the one door to every dataset kind: parses "KIND:PATH[@START:END]", checks the
 * model's shape against the data, opens the kind, and applies the range selection, so the
 * trainer handles text, tokens, MNIST, Criteo and the synthetic sets alike.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

struct adt_dataset {
    data_source src;
    char kind[24];    /* "mnist", "synthetic:vgg", ... */
    int64_t first, count; /* selected sample ids [first, first + count) of src */
    char line[512];
};

/* ---- text as a source --------------------------------------------------------------------- */

typedef struct text_src {
    adt_text_dataset *ds;
    int T;
} text_src;

static void text_free(void *impl) {
    text_src *t = impl;
    if (!t) return;
    adt_text_dataset_free(t->ds);
    free(t);
}

static int text_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2,
                     void *label) {
    const text_src *t = impl;
    int32_t *x = input, *y = label;
    for (int k = 0; k < n; k++) {
        int64_t id = ids[k] + first;
        int rc = adt_text_dataset_fill(t->ds, &id, 1, t->T, x + (int64_t)k * t->T, y + (int64_t)k * t->T);
        if (rc) return rc;
    }
    return ADT_OK;
}

int data_text_source(data_source *src, adt_text_dataset *ds, const adt_data_shape *shape) {
    const adt_text_vocab *v = adt_text_dataset_vocab(ds);
    int rc = adt_text_dataset_check_window(ds, shape->n_ctx);
    if (!rc && shape->vocab_size > 0 && v->size > shape->vocab_size)
        rc = adt_error(ADT_ERR_SHAPE, "%s: %d distinct symbols, expected at most the model's vocab_size %d",
                       adt_text_dataset_name(ds), v->size, shape->vocab_size);
    if (rc) {
        adt_text_dataset_free(ds);
        return rc;
    }
    text_src *t = adt_calloc(1, sizeof *t);
    t->ds = ds;
    t->T = shape->n_ctx;
    *src = (data_source){.n = adt_text_dataset_samples(ds, t->T), .layout = ADT_DATA_SEQ, .elems = {t->T, 0, t->T},
                         .vocab = v, .vocab_size = v->size, .impl = t, .fill = text_fill, .free = text_free};
    snprintf(src->what, sizeof src->what, "%lld characters, vocab %d, windows of %d",
             (long long)adt_text_dataset_tokens(ds), v->size, t->T);
    return ADT_OK;
}

/* ---- spec parsing ------------------------------------------------------------------------- */

static const char *spec_kinds = "text:FILE, tokens:FILE, mnist:PREFIX, criteo:FILE, synthetic:text|mlp|vgg|dlrm or "
                                "synthetic:criteo-zipf[,alpha=A][,signal=S][,samples=N]";

/* A decimal count in s[0..n); -1 if empty, not digits, or too large. */
static int64_t parse_count(const char *s, size_t n) {
    if (n == 0 || n > 18) return -1;
    int64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        v = v * 10 + (s[i] - '0');
    }
    return v;
}

/* Splits off "@START:END" when the spec ends with one (a file name may hold '@' elsewhere).
 * lo/hi are -1 when omitted; returns the length of the spec before the '@'. */
static size_t split_range(const char *spec, int *has, int64_t *lo, int64_t *hi, int *bad) {
    size_t len = strlen(spec);
    *has = 0, *bad = 0, *lo = -1, *hi = -1;
    const char *at = strrchr(spec, '@');
    if (!at) return len;
    const char *colon = strchr(at, ':');
    if (!colon) return len;
    for (const char *q = at + 1; *q; q++)
        if (q != colon && (*q < '0' || *q > '9')) return len; /* not a range: part of the path */
    *has = 1;
    size_t nlo = (size_t)(colon - at - 1), nhi = strlen(colon + 1);
    if (nlo) *lo = parse_count(at + 1, nlo);
    if (nhi) *hi = parse_count(colon + 1, nhi);
    if ((nlo && *lo < 0) || (nhi && *hi < 0)) *bad = 1;
    return (size_t)(at - spec);
}

static int file_exists(const char *path) { return access(path, F_OK) == 0; }

/* PREFIX-<part> or PREFIX-<part>.gz, the plain file when both exist. */
static int mnist_path(char *out, size_t cap, const char *prefix, const char *part) {
    snprintf(out, cap, "%s-%s", prefix, part);
    if (file_exists(out)) return ADT_OK;
    snprintf(out, cap, "%s-%s.gz", prefix, part);
    if (file_exists(out)) return ADT_OK;
    return adt_error(ADT_ERR_IO, "mnist:%s: neither %s-%s nor %s-%s.gz exists, expected MNIST IDX files "
                     "PREFIX-images-idx3-ubyte[.gz] and PREFIX-labels-idx1-ubyte[.gz]", prefix, prefix, part, prefix,
                     part);
}

static int open_mnist(data_source *src, const char *prefix, const adt_data_shape *shape) {
    char ip[4096], lp[4096];
    int rc;
    if ((rc = mnist_path(ip, sizeof ip, prefix, "images-idx3-ubyte")) ||
        (rc = mnist_path(lp, sizeof lp, prefix, "labels-idx1-ubyte")))
        return rc;
    data_buf im, lb;
    if ((rc = data_buf_open(&im, ip, "MNIST images (IDX)"))) return rc;
    if ((rc = data_buf_open(&lb, lp, "MNIST labels (IDX)"))) {
        data_buf_free(&im);
        return rc;
    }
    char name[4200];
    snprintf(name, sizeof name, "mnist:%s", prefix);
    return data_mnist_source(src, name, &im, ip, &lb, lp, shape);
}

/* vocab must equal synthetic:text's own, the only vocabulary its text is written in. */
static int check_synthetic_vocab(const adt_text_vocab *own, const adt_text_vocab *vocab) {
    if (vocab && (own->size != vocab->size || memcmp(own->byte, vocab->byte, (size_t)own->size)))
        return adt_error(ADT_ERR_ARG, "synthetic:text has its own %d-symbol vocabulary, which differs from the training "
                         "data's (%d symbols); expected synthetic:text for training too", own->size, vocab->size);
    return ADT_OK;
}

static int open_kind(data_source *src, const char *kind, const char *path, const adt_data_shape *shape,
                     const adt_text_vocab *vocab, int is_val) {
    int rc;
    uint64_t stream = is_val ? 1 : 0;
    if (!strcmp(kind, "text")) {
        adt_text_dataset *ds;
        if ((rc = adt_text_dataset_open(&ds, path, vocab))) return rc;
        return data_text_source(src, ds, shape);
    }
    if (!strcmp(kind, "tokens")) {
        data_buf b;
        if ((rc = data_buf_open(&b, path, "a token file"))) return rc;
        return data_tokens_source(src, path, &b, shape);
    }
    if (!strcmp(kind, "criteo")) {
        data_buf b;
        if ((rc = data_buf_open(&b, path, "Criteo data (TSV)"))) return rc;
        return data_criteo_source(src, path, &b, shape);
    }
    if (!strcmp(kind, "mnist")) return open_mnist(src, path, shape);
    if (!strcmp(kind, "synthetic:text")) {
        adt_text_dataset *ds;
        if ((rc = adt_text_dataset_synthetic(&ds, is_val ? ADT_SYN_TEXT_VAL_TOKENS : ADT_SYN_TEXT_TOKENS, stream)))
            return rc;
        if ((rc = check_synthetic_vocab(adt_text_dataset_vocab(ds), vocab))) {
            adt_text_dataset_free(ds);
            return rc;
        }
        return data_text_source(src, ds, shape);
    }
    if (!strcmp(kind, "synthetic:mlp")) return data_synthetic_mlp(src, shape, stream);
    if (!strcmp(kind, "synthetic:vgg")) return data_synthetic_vgg(src, shape, stream);
    if (!strcmp(kind, "synthetic:dlrm")) return data_synthetic_dlrm(src, shape, stream);
    if (!strcmp(kind, "synthetic:criteo-zipf")) return data_synthetic_zipf(src, shape, stream, path + strlen("criteo-zipf"));
    ADT_ASSERT(!"unreachable: kind checked by the caller");
    return ADT_ERR_ARG;
}

/* in_features follows C*H*W when the image layout is given; both given must agree. */
static int normalise_shape(adt_data_shape *s, const char *spec) {
    if (s->channels > 0 && s->height > 0 && s->width > 0) {
        int64_t chw = (int64_t)s->channels * s->height * s->width;
        if (s->in_features == 0 && chw <= INT32_MAX) s->in_features = (int)chw;
        if (s->in_features != chw)
            return adt_error(ADT_ERR_SHAPE, "%s: in_features %d but channels x height x width = %dx%dx%d = %lld, "
                             "expected them equal", spec, s->in_features, s->channels, s->height, s->width,
                             (long long)chw);
    }
    return ADT_OK;
}

static adt_dataset *dataset_new(const char *kind) {
    adt_dataset *ds = adt_calloc(1, sizeof *ds);
    snprintf(ds->kind, sizeof ds->kind, "%s", kind);
    return ds;
}

static void describe(adt_dataset *ds, const char *spec) {
    if (ds->count == ds->src.n)
        snprintf(ds->line, sizeof ds->line, "%s: %s", spec, ds->src.what);
    else
        snprintf(ds->line, sizeof ds->line, "%s: %s; samples [%lld, %lld) of %lld", spec, ds->src.what,
                 (long long)ds->first, (long long)(ds->first + ds->count), (long long)ds->src.n);
}

/* "criteo-zipf" with or without its ",key=value" options */
static int is_zipf_path(const char *path) {
    return !strncmp(path, "criteo-zipf", 11) && (path[11] == 0 || path[11] == ',');
}

int adt_dataset_open(adt_dataset **out, const char *spec, const adt_data_shape *shape_in, const adt_text_vocab *vocab,
                     int is_val) {
    *out = NULL;
    int has_range, bad_range;
    int64_t lo, hi;
    size_t body = split_range(spec, &has_range, &lo, &hi, &bad_range);
    if (bad_range)
        return adt_error(ADT_ERR_ARG, "%s: bad range '%s', expected @START:END with decimal sample ids", spec,
                         spec + body);
    char *head = adt_malloc(body + 1);
    memcpy(head, spec, body);
    head[body] = 0;
    char *colon = strchr(head, ':');
    const char *path = NULL;
    char kind[24] = "";
    if (colon && (size_t)(colon - head) < 16) {
        memcpy(kind, head, (size_t)(colon - head));
        kind[colon - head] = 0;
        path = colon + 1;
    }
    int is_file = !strcmp(kind, "text") || !strcmp(kind, "tokens") || !strcmp(kind, "mnist") || !strcmp(kind, "criteo");
    int is_syn = !strcmp(kind, "synthetic") && (!strcmp(path, "text") || !strcmp(path, "mlp") ||
                                                !strcmp(path, "vgg") || !strcmp(path, "dlrm") ||
                                                is_zipf_path(path));
    int rc = ADT_OK;
    if (!is_file && !is_syn)
        rc = adt_error(ADT_ERR_ARG, "'%s' is not a dataset; expected %s", spec, spec_kinds);
    else if (is_file && !path[0])
        rc = adt_error(ADT_ERR_ARG, "'%s' names no file; expected %s:%s", spec, kind,
                       strcmp(kind, "mnist") ? "FILE" : "PREFIX");
    adt_data_shape shape = shape_in ? *shape_in : (adt_data_shape){0};
    if (!rc) rc = normalise_shape(&shape, spec);
    adt_dataset *ds = NULL;
    if (!rc) {
        if (is_syn) snprintf(kind, sizeof kind, "%s", is_zipf_path(path) ? "synthetic:criteo-zipf" : head);
        ds = dataset_new(kind);
        rc = open_kind(&ds->src, kind, path, &shape, vocab, is_val);
    }
    if (!rc) {
        int64_t n = ds->src.n, a = lo < 0 ? 0 : lo, b = hi < 0 ? n : hi;
        if (has_range && (a >= b || b > n))
            rc = adt_error(ADT_ERR_ARG, "%s: range [%lld, %lld) does not fit the %lld samples of %s, expected "
                           "0 <= START < END <= %lld", spec, (long long)a, (long long)b, (long long)n, head,
                           (long long)n);
        ds->first = a;
        ds->count = b - a;
    }
    if (!rc) describe(ds, spec);
    free(head);
    if (rc) {
        adt_dataset_free(ds);
        return rc;
    }
    *out = ds;
    return ADT_OK;
}

int adt_dataset_open_memory(adt_dataset **out, const char *kind, const char *name, const void *data, size_t n,
                            const void *data2, size_t n2, const adt_data_shape *shape_in,
                            const adt_text_vocab *vocab) {
    *out = NULL;
    adt_data_shape shape = shape_in ? *shape_in : (adt_data_shape){0};
    int rc = normalise_shape(&shape, name);
    if (rc) return rc;
    adt_dataset *ds = dataset_new(kind);
    data_buf a, b;
    if (!strcmp(kind, "text")) {
        adt_text_dataset *t;
        rc = adt_text_dataset_from_bytes(&t, data, n, vocab, name);
        if (!rc) rc = data_text_source(&ds->src, t, &shape);
    } else if (!strcmp(kind, "tokens")) {
        data_buf_copy(&a, data, n);
        rc = data_tokens_source(&ds->src, name, &a, &shape);
    } else if (!strcmp(kind, "criteo")) {
        data_buf_copy(&a, data, n);
        rc = data_criteo_source(&ds->src, name, &a, &shape);
    } else if (!strcmp(kind, "mnist")) {
        char im[300], lb[300];
        snprintf(im, sizeof im, "%s (images)", name);
        snprintf(lb, sizeof lb, "%s (labels)", name);
        data_buf_copy(&a, data, n);
        data_buf_copy(&b, data2, n2);
        rc = data_mnist_source(&ds->src, name, &a, im, &b, lb, &shape);
    } else {
        rc = adt_error(ADT_ERR_ARG, "%s: kind '%s' cannot be opened from memory, expected text, tokens, criteo or mnist",
                       name, kind);
    }
    if (rc) {
        adt_dataset_free(ds);
        return rc;
    }
    ds->count = ds->src.n;
    describe(ds, name);
    *out = ds;
    return ADT_OK;
}

void adt_dataset_free(adt_dataset *ds) {
    if (!ds) return;
    if (ds->src.free) ds->src.free(ds->src.impl);
    free(ds);
}

int64_t adt_dataset_samples(const adt_dataset *ds) { return ds->count; }
adt_data_layout adt_dataset_layout(const adt_dataset *ds) { return ds->src.layout; }
const char *adt_dataset_kind_name(const adt_dataset *ds) { return ds->kind; }
const char *adt_dataset_describe(const adt_dataset *ds) { return ds->line; }
const adt_text_vocab *adt_dataset_vocab(const adt_dataset *ds) { return ds->src.vocab; }
int adt_dataset_vocab_size(const adt_dataset *ds) { return ds->src.vocab_size; }
int64_t adt_dataset_sample_elems(const adt_dataset *ds, int which) {
    return which >= 0 && which < 3 ? ds->src.elems[which] : 0;
}

static int check_ids(const adt_dataset *ds, const int64_t *ids, int n) {
    if (n < 0) return adt_error(ADT_ERR_ARG, "%s: %d samples requested, expected >= 0", ds->kind, n);
    for (int k = 0; k < n; k++)
        if (ids[k] < 0 || ids[k] >= ds->count)
            return adt_error(ADT_ERR_ARG, "%s: sample %lld out of range, expected 0 <= id < %lld", ds->kind,
                             (long long)ids[k], (long long)ds->count);
    return ADT_OK;
}

int adt_dataset_fill(const adt_dataset *ds, const int64_t *ids, int n, void *input, void *input2, void *label) {
    if (!input || !label || (ds->src.layout == ADT_DATA_CTR && !input2))
        return adt_error(ADT_ERR_ARG, "%s: fill without a%s buffer", ds->kind,
                         !input ? "n input" : !label ? " label" : " categorical (input2)");
    int rc = check_ids(ds, ids, n);
    if (rc) return rc;
    return ds->src.fill(ds->src.impl, ids, n, ds->first, input, input2, label);
}

int adt_dataset_planted_prob(const adt_dataset *ds, const int64_t *ids, int n, float *prob) {
    if (!ds->src.prob)
        return adt_error(ADT_ERR_UNSUPPORTED, "%s: no planted probability, expected synthetic:dlrm or "
                         "synthetic:criteo-zipf", ds->kind);
    int rc = check_ids(ds, ids, n);
    if (rc) return rc;
    return ds->src.prob(ds->src.impl, ids, n, ds->first, prob);
}
