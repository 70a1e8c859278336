/*
 * tokens.c - pre-tokenised datasets ("tokens:FILE"): a 32-byte header and little-endian ids of 2
 * or 4 bytes (docs/formats.md), cut into the same windows as character-level text.
 *
 * The file stays mapped; every id is checked once at open, so a corrupt or mismatched file fails
 * before the first step rather than as an out-of-range embedding lookup mid-run.
 */
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "data/data_internal.h"

#define TOK_MAGIC "ADTTOKEN"
#define TOK_HEADER 32
#define TOK_VERSION 1

typedef struct tok_data {
    char *name;
    data_buf buf;
    int token_bytes;
    int64_t n_tokens;
    int T;
} tok_data;

static uint32_t le32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static uint64_t le64(const uint8_t *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static inline uint32_t tok_at(const tok_data *d, int64_t i) {
    const uint8_t *p = d->buf.p + TOK_HEADER + i * d->token_bytes;
    return d->token_bytes == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : le32(p);
}

static void tok_free(void *impl) {
    tok_data *d = impl;
    if (!d) return;
    data_buf_free(&d->buf);
    free(d->name);
    free(d);
}

/* input i32 [n,T], label i32 [n,T]: window s is tokens s*T .. s*T+T */
static int tok_fill(const void *impl, const int64_t *ids, int n, int64_t first, void *input, void *input2,
                    void *label) {
    const tok_data *d = impl;
    int32_t *x = input, *y = label;
    for (int k = 0; k < n; k++) {
        int64_t base = (ids[k] + first) * d->T;
        for (int t = 0; t < d->T; t++) {
            x[(int64_t)k * d->T + t] = (int32_t)tok_at(d, base + t);
            y[(int64_t)k * d->T + t] = (int32_t)tok_at(d, base + t + 1);
        }
    }
    return ADT_OK;
}

static int check_header(const char *name, const uint8_t *p, size_t size, int *token_bytes, uint32_t *vocab,
                        int64_t *n_tokens) {
    if (size < TOK_HEADER)
        return adt_error(ADT_ERR_FORMAT, "%s: %zu bytes, shorter than the %d-byte token file header", name, size,
                         TOK_HEADER);
    if (memcmp(p, TOK_MAGIC, 8) != 0)
        return adt_error(ADT_ERR_FORMAT, "%s: wrong magic, expected a token file starting with \"%s\"", name,
                         TOK_MAGIC);
    uint32_t version = le32(p + 8), tb = le32(p + 12), v = le32(p + 16), reserved = le32(p + 20);
    uint64_t n = le64(p + 24);
    if (version != TOK_VERSION)
        return adt_error(ADT_ERR_FORMAT, "%s: token file version %u, expected %d", name, version, TOK_VERSION);
    if (tb != 2 && tb != 4)
        return adt_error(ADT_ERR_FORMAT, "%s: %u bytes per token, expected 2 or 4", name, tb);
    if (v < 1 || (tb == 2 && v > 65536) || v > INT32_MAX)
        return adt_error(ADT_ERR_FORMAT, "%s: vocab_size %u, expected 1 .. %u for %u-byte tokens", name, v,
                         tb == 2 ? 65536u : (uint32_t)INT32_MAX, tb);
    if (reserved != 0)
        return adt_error(ADT_ERR_FORMAT, "%s: reserved header field is %u, expected 0", name, reserved);
    uint64_t payload = size - TOK_HEADER;
    if (n > payload / tb)
        return adt_error(ADT_ERR_FORMAT,
                         "%s: truncated: the header says %llu tokens (%llu bytes) but only %llu bytes follow it", name,
                         (unsigned long long)n, n > UINT64_MAX / tb ? 0ull : (unsigned long long)(n * tb),
                         (unsigned long long)payload);
    if (n * tb != payload)
        return adt_error(ADT_ERR_FORMAT, "%s: %llu bytes after %llu tokens, expected the file to end there", name,
                         (unsigned long long)(payload - n * tb), (unsigned long long)n);
    *token_bytes = (int)tb;
    *vocab = v;
    *n_tokens = (int64_t)n;
    return ADT_OK;
}

int data_tokens_source(data_source *src, const char *name, data_buf *buf, const adt_data_shape *shape) {
    int tb = 0;
    uint32_t vocab = 0;
    int64_t n = 0;
    int rc = check_header(name, buf->p, buf->n, &tb, &vocab, &n);
    if (rc) goto fail;
    if (shape->n_ctx < 1) {
        rc = adt_error(ADT_ERR_ARG, "%s: window n_ctx %d, expected >= 1", name, shape->n_ctx);
        goto fail;
    }
    if (data_windows(n, shape->n_ctx) < 1) {
        rc = adt_error(ADT_ERR_FORMAT, "%s: %lld tokens, shorter than one window: expected at least %lld (n_ctx %d + 1 "
                       "for the shifted targets)", name, (long long)n, (long long)shape->n_ctx + 1, shape->n_ctx);
        goto fail;
    }
    /* Every id below the file's own vocab_size, and below the model's when it is smaller. */
    uint32_t limit = vocab;
    int model_limit = shape->vocab_size > 0 && (uint32_t)shape->vocab_size < vocab;
    if (model_limit) limit = (uint32_t)shape->vocab_size;
    tok_data probe = {.buf = *buf, .token_bytes = tb};
    for (int64_t i = 0; i < n; i++) {
        uint32_t id = tok_at(&probe, i);
        if (id >= limit) {
            rc = model_limit ? adt_error(ADT_ERR_FORMAT, "%s: token %u at byte offset %lld (token %lld) is out of range "
                                         "for the model: expected ids < vocab_size %u", name, id,
                                         (long long)(TOK_HEADER + i * tb), (long long)i, limit)
                             : adt_error(ADT_ERR_FORMAT, "%s: token %u at byte offset %lld (token %lld) is out of range: "
                                         "expected ids < the file's vocab_size %u", name, id,
                                         (long long)(TOK_HEADER + i * tb), (long long)i, limit);
            goto fail;
        }
    }
    tok_data *d = adt_calloc(1, sizeof *d);
    d->name = adt_strdup(name);
    d->buf = *buf;
    memset(buf, 0, sizeof *buf);
    d->token_bytes = tb;
    d->n_tokens = n;
    d->T = shape->n_ctx;
    *src = (data_source){.n = data_windows(n, d->T), .layout = ADT_DATA_SEQ, .elems = {d->T, 0, d->T},
                         .vocab_size = (int)vocab, .impl = d, .fill = tok_fill, .free = tok_free};
    snprintf(src->what, sizeof src->what, "%lld tokens of %d bytes, vocab %u, windows of %d", (long long)n, tb, vocab,
             d->T);
    return ADT_OK;
fail:
    data_buf_free(buf);
    return rc;
}
