/*
 * fuzz_manifest.c - libFuzzer target for the manifest of a distributed checkpoint
 * (adt_dckpt_parse; docs/formats.md, "Distributed checkpoints").
 *
 * Any byte string must either parse or fail with ADT_ERR_FORMAT and a message that starts with
 * the manifest's name; never crash, leak or read outside the buffer. A manifest that parses must
 * keep every promise a loader relies on, checked here independently: every slice lies inside its
 * tensor, each file holds at most one slice of a tensor, file names are plain names, and the
 * slices of every tensor add up to exactly its element count (with disjointness, which the
 * parser also checks, that is an exact cover).
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/ckpt.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

static void check(const adt_dckpt *c) {
    int nt = adt_dckpt_tensor_count(c), nf = adt_dckpt_file_count(c);
    FUZZ_ASSERT(adt_dckpt_step(c) >= 0 && adt_dckpt_world(c) >= 1 && nf <= adt_dckpt_world(c));
    FUZZ_ASSERT(adt_dckpt_tensor_get(c, nt) == NULL && adt_dckpt_file_get(c, nf) == NULL);
    int64_t *have = calloc((size_t)nt + 1, sizeof *have);
    for (int i = 0; i < nf; i++) {
        const adt_dckpt_file *f = adt_dckpt_file_get(c, i);
        FUZZ_ASSERT(f->name[0] && f->name[0] != '.' && !strchr(f->name, '/') && f->bytes >= 8);
        for (int k = 0; k < f->n_slices; k++) {
            const adt_dckpt_slice *s = &f->slices[k];
            FUZZ_ASSERT(s->tensor >= 0 && s->tensor < nt);
            for (int q = 0; q < k; q++) FUZZ_ASSERT(f->slices[q].tensor != s->tensor);
            const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, s->tensor);
            int64_t n = 1;
            for (int d = 0; d < t->ndim; d++) {
                FUZZ_ASSERT(s->offset[d] >= 0 && s->shape[d] >= 1 && s->offset[d] + s->shape[d] <= t->shape[d]);
                n *= s->shape[d];
            }
            have[s->tensor] += n;
        }
    }
    for (int i = 0; i < nt; i++) {
        const adt_dckpt_tensor *t = adt_dckpt_tensor_get(c, i);
        FUZZ_ASSERT(t->name && t->name[0] && t->ndim >= 0 && t->ndim <= ADT_MAX_DIMS);
        int64_t n = 1;
        for (int d = 0; d < t->ndim; d++) n *= t->shape[d];
        FUZZ_ASSERT(have[i] == n);
    }
    free(have);
    for (int i = 0; i < adt_dckpt_metadata_count(c); i++) {
        const char *k, *v;
        FUZZ_ASSERT(adt_dckpt_metadata_get(c, i, &k, &v) == ADT_OK && adt_dckpt_metadata(c, k) == v);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    adt_error_clear();
    adt_dckpt *c = (adt_dckpt *)&c; /* must be reset to NULL on failure */
    int rc = adt_dckpt_parse(&c, NULL, "fuzz.json", (const char *)data, size);
    if (rc != ADT_OK) {
        FUZZ_ASSERT(c == NULL);
        FUZZ_ASSERT(rc == ADT_ERR_FORMAT);
        FUZZ_ASSERT(strncmp(adt_error_message(), "fuzz.json: ", 11) == 0);
        return 0;
    }
    check(c);
    adt_dckpt_close(c);
    return 0;
}
