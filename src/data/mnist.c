/*
 * mnist.c - MNIST-style image classification data ("mnist:PREFIX"): two IDX files,
 * PREFIX-images-idx3-ubyte and PREFIX-labels-idx1-ubyte, each plain or gzip-compressed.
 *
 * IDX (LeCun): magic 00 00 <type> <ndim>, ndim big-endian uint32 dimensions, then the data row-
 * major. Only type 0x08 (unsigned byte) is read: images [count, rows, cols], labels [count].
 * Pixels stay bytes in memory and become [0, 1] floats when a batch is filled.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

#define IDX_UBYTE 0x08
#define IDX_MAX_BYTES (1ull << 36) /* largest inflated file accepted: 64 GiB */

typedef struct idx_view {
    uint32_t dim[3];
    const uint8_t *data; /* after the header */
    uint64_t count;      /* elements */
} idx_view;

static uint32_t be32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

/* Checks magic 0x000008<ndim>, the dimensions, and that the data fills the file exactly. */
static int idx_parse(const char *name, const uint8_t *p, size_t n, int ndim, const char *what, idx_view *v) {
    uint32_t want = (uint32_t)IDX_UBYTE << 8 | (uint32_t)ndim;
    if (n < 4)
        return adt_error(ADT_ERR_FORMAT, "%s: %zu bytes, too short for an IDX magic; expected %s (magic 0x%08x)", name,
                         n, what, want);
    uint32_t magic = be32(p);
    if (magic != want) {
        if (p[0] == 0 && p[1] == 0 && p[2] != IDX_UBYTE && p[2] >= 0x09 && p[2] <= 0x0e)
            return adt_error(ADT_ERR_FORMAT, "%s: IDX element type 0x%02x, expected 0x08 (unsigned bytes) for %s", name,
                             p[2], what);
        return adt_error(ADT_ERR_FORMAT, "%s: wrong magic 0x%08x, expected 0x%08x (%s)", name, magic, want, what);
    }
    size_t header = 4 + 4 * (size_t)ndim;
    if (n < header)
        return adt_error(ADT_ERR_FORMAT, "%s: %zu bytes, too short for the %zu-byte IDX header of %s", name, n, header,
                         what);
    uint64_t count = 1;
    int overflow = 0;
    for (int d = 0; d < ndim; d++) {
        v->dim[d] = be32(p + 4 + 4 * d);
        overflow |= __builtin_mul_overflow(count, (uint64_t)v->dim[d], &count);
    }
    if (overflow || count > n - header)
        return adt_error(ADT_ERR_FORMAT, "%s: truncated: the header declares %s%llu bytes of data but %zu follow it",
                         name, overflow ? "more than " : "", overflow ? (unsigned long long)UINT64_MAX :
                         (unsigned long long)count, n - header);
    if (count < n - header)
        return adt_error(ADT_ERR_FORMAT, "%s: %llu bytes after the declared data, expected the file to end there", name,
                         (unsigned long long)(n - header - count));
    v->data = p + header;
    v->count = count;
    return ADT_OK;
}

typedef struct mnist_data {
    data_buf images, labels;
    const uint8_t *pix, *lab;
    int features;
} mnist_data;

static void mnist_free(void *impl) {
    mnist_data *d = impl;
    if (!d) return;
    data_buf_free(&d->images);
    data_buf_free(&d->labels);
    free(d);
}

/* input f32 [n, rows*cols] in [0, 1], label i32 [n] */
static int mnist_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2,
                      void *label) {
    const mnist_data *d = impl;
    float *x = input;
    int32_t *y = label;
    for (int k = 0; k < n; k++) {
        int64_t s = ids[k] + first;
        const uint8_t *px = d->pix + s * d->features;
        float *xk = x + (int64_t)k * d->features;
        for (int j = 0; j < d->features; j++) xk[j] = (float)px[j] * (1.0f / 255.0f);
        y[k] = d->lab[s];
    }
    return ADT_OK;
}

static int check_shape(const char *name, const idx_view *im, const idx_view *lb, const char *labels_name,
                       const adt_data_shape *shape) {
    uint64_t rows = im->dim[1], cols = im->dim[2], feats = rows * cols;
    if (rows == 0 || cols == 0 || feats > INT32_MAX)
        return adt_error(ADT_ERR_FORMAT, "%s: images are %llux%llu, expected both sides >= 1", name,
                         (unsigned long long)rows, (unsigned long long)cols);
    int chw_set = shape->channels > 0 || shape->height > 0 || shape->width > 0;
    if (chw_set && (shape->channels != 1 || (uint64_t)shape->height != rows || (uint64_t)shape->width != cols))
        return adt_error(ADT_ERR_SHAPE, "%s: the model takes images %dx%dx%d (CxHxW), expected 1x%llux%llu", name,
                         shape->channels, shape->height, shape->width, (unsigned long long)rows,
                         (unsigned long long)cols);
    if (shape->in_features > 0 && (uint64_t)shape->in_features != feats)
        return adt_error(ADT_ERR_SHAPE, "%s: the model takes in_features %d, expected in_features %llu (%llux%llu images)",
                         name, shape->in_features, (unsigned long long)feats, (unsigned long long)rows,
                         (unsigned long long)cols);
    if (im->dim[0] != lb->dim[0])
        return adt_error(ADT_ERR_FORMAT, "%s: %u images but %s holds %u labels, expected the counts to agree", name,
                         im->dim[0], labels_name, lb->dim[0]);
    if (im->dim[0] == 0) return adt_error(ADT_ERR_FORMAT, "%s: no images, expected at least one", name);
    if (shape->classes > 0)
        for (uint64_t i = 0; i < lb->count; i++)
            if (lb->data[i] >= shape->classes)
                return adt_error(ADT_ERR_FORMAT, "%s: label %d of sample %llu (byte offset %llu) is out of range, "
                                 "expected labels < classes %d", labels_name, lb->data[i], (unsigned long long)i,
                                 (unsigned long long)(8 + i), shape->classes);
    return ADT_OK;
}

int data_mnist_source(data_source *src, const char *name, data_buf *images, const char *images_name,
                      data_buf *labels, const char *labels_name, const adt_data_shape *shape) {
    idx_view im = {0}, lb = {0};
    int rc;
    if ((rc = data_buf_gunzip(images, images_name, IDX_MAX_BYTES)) ||
        (rc = data_buf_gunzip(labels, labels_name, IDX_MAX_BYTES)) ||
        (rc = idx_parse(images_name, images->p, images->n, 3, "IDX unsigned-byte images", &im)) ||
        (rc = idx_parse(labels_name, labels->p, labels->n, 1, "IDX unsigned-byte labels", &lb)) ||
        (rc = check_shape(name, &im, &lb, labels_name, shape))) {
        data_buf_free(images);
        data_buf_free(labels);
        return rc;
    }
    mnist_data *d = adt_calloc(1, sizeof *d);
    d->images = *images;
    d->labels = *labels;
    memset(images, 0, sizeof *images);
    memset(labels, 0, sizeof *labels);
    d->pix = im.data;
    d->lab = lb.data;
    d->features = (int)(im.dim[1] * im.dim[2]);
    int max_label = 0;
    for (uint64_t i = 0; i < lb.count; i++)
        if (lb.data[i] > max_label) max_label = lb.data[i];
    *src = (data_source){.n = im.dim[0], .layout = ADT_DATA_CLASS, .elems = {d->features, 0, 1}, .impl = d,
                         .fill = mnist_fill, .free = mnist_free};
    snprintf(src->what, sizeof src->what, "%u images 1x%ux%u, labels 0..%d", im.dim[0], im.dim[1], im.dim[2],
             max_label);
    return ADT_OK;
}
