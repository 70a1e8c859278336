/*
 * fuzz_safetensors.c - libFuzzer target for the safetensors reader (and, on inputs it accepts,
 * the writer).
 *
 * Any byte string must either open cleanly or fail with a message that names the input; never
 * crash, leak or read outside the buffer. An input that opens must also survive a round trip:
 * every tensor and metadata entry written back and re-read unchanged.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/safetensors.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

/* Element count; 0 as soon as any dimension is 0, so huge sibling dimensions cannot overflow. */
static uint64_t elem_count(const adt_st_tensor *t) {
    for (int d = 0; d < t->ndim; d++)
        if (t->shape[d] == 0) return 0;
    uint64_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (uint64_t)t->shape[d];
    return n;
}

/* Touches every byte the reader hands out, so ASan sees any view that is out of bounds, and
 * checks the typed readers agree with the raw view. */
static void touch(const adt_st_file *f) {
    for (int i = 0; i < adt_st_count(f); i++) {
        const adt_st_tensor *t = adt_st_get(f, i);
        FUZZ_ASSERT(t && t->name && t->data);
        FUZZ_ASSERT(adt_st_find(f, t->name) == t);
        FUZZ_ASSERT(t->ndim >= 0 && t->ndim <= ADT_ST_MAX_DIMS);
        FUZZ_ASSERT(elem_count(t) * adt_st_dtype_size(t->dtype) == t->nbytes);
        volatile unsigned char sink = 0;
        const unsigned char *p = t->data;
        for (size_t k = 0; k < t->nbytes; k++) sink ^= p[k];
        (void)sink;

        /* typed reads, only for tensors small enough to be cheap */
        if (t->nbytes > (1u << 20)) continue;
        size_t n = (size_t)elem_count(t);
        if (t->dtype == ADT_ST_F32 || t->dtype == ADT_ST_BF16 || t->dtype == ADT_ST_F16) {
            float *dst = malloc(n ? n * sizeof(float) : 1);
            FUZZ_ASSERT(adt_st_read_f32(f, t->name, dst, t->ndim, t->shape) == ADT_OK);
            if (t->dtype == ADT_ST_F32) FUZZ_ASSERT(memcmp(dst, t->data, t->nbytes) == 0);
            free(dst);
        } else if (t->dtype == ADT_ST_I32 || t->dtype == ADT_ST_I64) {
            int32_t *dst = malloc(n ? n * sizeof(int32_t) : 1);
            int rc = adt_st_read_i32(f, t->name, dst, t->ndim, t->shape);
            FUZZ_ASSERT(rc == ADT_OK || (t->dtype == ADT_ST_I64 && rc == ADT_ERR_FORMAT));
            free(dst);
        } else {
            float one;
            FUZZ_ASSERT(adt_st_read_f32(f, t->name, &one, t->ndim, t->shape) == ADT_ERR_FORMAT);
        }
    }
    for (int i = 0; i < adt_st_metadata_count(f); i++) {
        const char *k, *v;
        FUZZ_ASSERT(adt_st_metadata_get(f, i, &k, &v) == ADT_OK && k && v);
        FUZZ_ASSERT(adt_st_metadata(f, k) != NULL);
    }
}

/* Writes f back out and re-reads it: same tensors (by name), same bytes, same metadata. */
static void round_trip(const adt_st_file *f) {
    adt_st_writer *w = adt_st_writer_create();
    for (int i = 0; i < adt_st_count(f); i++) {
        const adt_st_tensor *t = adt_st_get(f, i);
        int rc = adt_st_writer_add(w, t->name, t->dtype, t->ndim, t->shape, t->data);
        /* the reader accepts an empty name, which the writer refuses on purpose */
        if (rc != ADT_OK) {
            FUZZ_ASSERT(t->name[0] == 0);
            adt_st_writer_free(w);
            return;
        }
    }
    for (int i = 0; i < adt_st_metadata_count(f); i++) {
        const char *k, *v;
        adt_st_metadata_get(f, i, &k, &v);
        /* with a repeated key the reader reports the first value; write only that one */
        if (adt_st_metadata(f, k) == v) FUZZ_ASSERT(adt_st_writer_set_metadata(w, k, v) == ADT_OK);
    }
    void *buf;
    size_t n;
    FUZZ_ASSERT(adt_st_writer_serialize(w, &buf, &n) == ADT_OK);
    adt_st_writer_free(w);

    adt_st_file *g;
    int rc = adt_st_open_memory(&g, "round trip", buf, n);
    if (rc != ADT_OK) adt_abort(__FILE__, __LINE__, "re-reading failed: %s", adt_error_message());
    FUZZ_ASSERT(adt_st_count(g) == adt_st_count(f));
    for (int i = 0; i < adt_st_count(f); i++) {
        const adt_st_tensor *a = adt_st_get(f, i), *b = adt_st_find(g, a->name);
        FUZZ_ASSERT(b && a->dtype == b->dtype && a->ndim == b->ndim && a->nbytes == b->nbytes);
        FUZZ_ASSERT(memcmp(a->shape, b->shape, (size_t)a->ndim * sizeof a->shape[0]) == 0);
        FUZZ_ASSERT(a->nbytes == 0 || memcmp(a->data, b->data, a->nbytes) == 0);
    }
    for (int i = 0; i < adt_st_metadata_count(f); i++) {
        const char *k, *v;
        adt_st_metadata_get(f, i, &k, &v);
        const char *v2 = adt_st_metadata(g, k);
        FUZZ_ASSERT(v2 && strcmp(adt_st_metadata(f, k), v2) == 0);
    }
    adt_st_close(g);
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    adt_error_clear();
    adt_st_file *f = (adt_st_file *)&f; /* must be reset to NULL on failure */
    int rc = adt_st_open_memory(&f, "fuzz.safetensors", data, size);
    if (rc != ADT_OK) {
        FUZZ_ASSERT(f == NULL);
        FUZZ_ASSERT(rc == ADT_ERR_FORMAT);
        FUZZ_ASSERT(strncmp(adt_error_message(), "fuzz.safetensors: ", 18) == 0);
        return 0;
    }
    touch(f);
    round_trip(f);
    adt_st_close(f);
    return 0;
}
