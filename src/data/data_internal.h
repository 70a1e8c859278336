/*
 * data_internal.h - what the dataset kinds share inside src/data: the source interface behind
 * adt_dataset, file buffers (mmap, read, gunzip) and the shape checks.
 *
 * Not installed: adtrain/data.h is the public face.
 */
#ifndef ADTRAIN_DATA_INTERNAL_H
#define ADTRAIN_DATA_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "adtrain/data.h"

/* One kind of dataset, opened: its samples and how to write them. `ids` passed to fill/prob
 * are already checked to lie in [0, n). */
typedef struct data_source {
    int64_t n; /* samples before range selection */
    adt_data_layout layout;
    int64_t elems[3]; /* per sample: input, input2, label elements */
    char what[200]; /* "10000 images 1x28x28, 10 classes" */
    const adt_text_vocab *vocab;
    int vocab_size;
    void *impl;
    int (*fill)(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2, void *label);
    int (*prob)(const void *impl, const int64_t *ids, int n, int64_t first, float *prob);
    void (*free)(void *impl);
} data_source;

/* ---- bytes of a file ---------------------------------------------------------------------- */
typedef struct data_buf {
    const uint8_t *p;
    size_t n;
    void *map; /* mmap'd region (map_len bytes), or NULL */
    size_t map_len;
    uint8_t *heap; /* malloc'd copy or inflated data, or NULL */
} data_buf;

/* Maps a regular file read-only (reads it when it cannot be mapped, e.g. a pipe). `what` says
 * what was expected in the message of a missing file ("a token file"). */
int data_buf_open(data_buf *b, const char *path, const char *what);
void data_buf_copy(data_buf *b, const void *p, size_t n);
/* If the bytes start with the gzip magic, replaces them with the inflated stream (all members);
 * a corrupt or truncated stream, or more than max_out bytes, is an error naming `name`. */
int data_buf_gunzip(data_buf *b, const char *name, uint64_t max_out);
void data_buf_free(data_buf *b);

/* ---- the kinds ---------------------------------------------------------------------------- */
/* `name` is the file (or prefix) in messages; buffers are owned by the source on success and
 * freed by the callee on failure. */
int data_text_source(data_source *src, adt_text_dataset *ds, const adt_data_shape *shape);
int data_tokens_source(data_source *src, const char *name, data_buf *buf, const adt_data_shape *shape);
int data_mnist_source(data_source *src, const char *name, data_buf *images, const char *images_name,
                      data_buf *labels, const char *labels_name, const adt_data_shape *shape);
int data_criteo_source(data_source *src, const char *name, data_buf *buf, const adt_data_shape *shape);
int data_synthetic_mlp(data_source *src, const adt_data_shape *shape, uint64_t stream);
int data_synthetic_vgg(data_source *src, const adt_data_shape *shape, uint64_t stream);
int data_synthetic_dlrm(data_source *src, const adt_data_shape *shape, uint64_t stream);
/* opts: "" or ",alpha=A,signal=S,samples=N" (zipf.c) */
int data_synthetic_zipf(data_source *src, const adt_data_shape *shape, uint64_t stream, const char *opts);
/* the exponent ",alpha=A" of those options sets (default 1.05); *rc: the options' error */
double data_zipf_alpha(const char *opts, int *rc);

/* ---- click generators (synthetic:dlrm, synthetic:criteo-zipf) ------------------------------
 * Both plant z = -1.2 + sum_j a_j (x_j - 2.4) + (their categorical part), dense features
 * x_j = log(1 + floor(20 E)), E ~ Exp(1), and draw label ~ Bernoulli(sigmoid(z)). A generator's
 * struct starts with this one; `cat` writes sample id's rows and adds their share to *z. */
typedef struct data_ctr_gen {
    int D, K;
    float *a; /* [D] dense weights */
    uint64_t dense_key, label_key;
    void (*cat)(const void *gen, uint64_t id, int32_t *rows, double *z);
} data_ctr_gen;
/* The data_source callbacks of such a generator (impl = the generator). */
int data_ctr_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2, void *label);
int data_ctr_prob(const void *impl, const int64_t *ids, int n, int64_t first, float *prob);
void data_ctr_free(void *impl);

/* ---- shared arithmetic -------------------------------------------------------------------- */
/* Token windows: sample s is tokens [s*T, s*T + T]; (tokens - 1) / T of them. */
static inline int64_t data_windows(int64_t tokens, int T) { return T >= 1 && tokens >= 2 ? (tokens - 1) / T : 0; }

#endif
