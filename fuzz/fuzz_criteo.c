/*
 * fuzz_criteo.c - libFuzzer target for the Criteo TSV/CSV parser, opened from memory.
 *
 * Any byte string must either open - every dense value finite and >= 0, every row inside its
 * table, every label 0 or 1 - or fail with a format error naming the input and line; never
 * crash, leak or read outside the buffer.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/data.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    adt_data_shape shape = {0};
    shape.n_dense = 13;
    shape.n_tables = 26;
    for (int t = 0; t < 26; t++) shape.table_rows[t] = 1 + 7 * t;
    adt_dataset *ds = fuzz_open_dataset("criteo", "fuzz.tsv", data, size, NULL, 0, &shape,
                                        ADT_ERR_FORMAT, ADT_ERR_FORMAT);
    if (!ds) return 0;
    int64_t n = adt_dataset_samples(ds);
    FUZZ_ASSERT(n >= 1 && adt_dataset_layout(ds) == ADT_DATA_CTR);
    for (int64_t i = 0; i < n; i++) {
        float x[13], y = -1;
        int32_t c[26];
        FUZZ_ASSERT(adt_dataset_fill(ds, &i, 1, x, c, &y) == ADT_OK);
        FUZZ_ASSERT(y == 0.0f || y == 1.0f);
        for (int j = 0; j < 13; j++) FUZZ_ASSERT(isfinite(x[j]) && x[j] >= 0.0f);
        for (int t = 0; t < 26; t++) FUZZ_ASSERT(c[t] >= 0 && c[t] < shape.table_rows[t]);
    }
    adt_dataset_free(ds);
    return 0;
}
