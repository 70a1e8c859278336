/*
 * fuzz_tokens.c - libFuzzer target for the token-file reader (tokens:FILE, opened from memory).
 *
 * Any byte string must either open, with every window's ids inside the declared vocabulary and
 * the model's, or fail with a format error naming the input; never crash, leak or read outside
 * the buffer. The window length and the model's vocabulary vary with the input's size, so one
 * corpus exercises both limits.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/data.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    adt_data_shape shape = {0};
    shape.n_ctx = 1 + (int)(size % 5);
    shape.vocab_size = size % 3 == 0 ? 0 : 300;
    adt_dataset *ds = fuzz_open_dataset("tokens", "fuzz.tok", data, size, NULL, 0, &shape,
                                        ADT_ERR_FORMAT, ADT_ERR_FORMAT);
    if (!ds) return 0;
    int T = shape.n_ctx;
    int64_t n = adt_dataset_samples(ds);
    int limit = adt_dataset_vocab_size(ds);
    if (shape.vocab_size > 0 && shape.vocab_size < limit) limit = shape.vocab_size;
    FUZZ_ASSERT(n >= 1 && adt_dataset_layout(ds) == ADT_DATA_SEQ && limit >= 1);
    enum { MAXB = 64 };
    int64_t ids[MAXB];
    int32_t *x = malloc(MAXB * (size_t)T * sizeof *x), *y = malloc(MAXB * (size_t)T * sizeof *y);
    for (int64_t first = 0; first < n; first += MAXB) {
        int b = n - first < MAXB ? (int)(n - first) : MAXB;
        for (int k = 0; k < b; k++) ids[k] = first + k;
        FUZZ_ASSERT(adt_dataset_fill(ds, ids, b, x, NULL, y) == ADT_OK);
        for (int i = 0; i < b * T; i++) {
            FUZZ_ASSERT(x[i] >= 0 && x[i] < limit && y[i] >= 0 && y[i] < limit);
            if (i % T + 1 < T) FUZZ_ASSERT(y[i] == x[i + 1]); /* targets are the inputs shifted by one */
        }
    }
    free(x);
    free(y);
    int64_t past = n;
    int32_t one[8];
    FUZZ_ASSERT(adt_dataset_fill(ds, &past, 1, one, NULL, one) == ADT_ERR_ARG);
    adt_dataset_free(ds);
    return 0;
}
