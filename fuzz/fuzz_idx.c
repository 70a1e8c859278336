/*
 * fuzz_idx.c - libFuzzer target for the MNIST IDX reader (plain and gzip), opened from memory.
 *
 * Input layout: 2 bytes little-endian L, then L bytes of the images file, then the labels file
 * (L is clamped to what is there). Any input must either open - every pixel in [0, 1], every
 * label below the model's classes - or fail with a format or shape error naming the input; never
 * crash, leak, hang or read outside the buffers.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/data.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    size_t L = (size_t)data[0] | (size_t)data[1] << 8;
    if (L > size - 2) L = size - 2;
    const uint8_t *images = data + 2, *labels = data + 2 + L;
    size_t n_labels = size - 2 - L;
    adt_data_shape shape = {0};
    shape.classes = 10;
    adt_dataset *ds = fuzz_open_dataset("mnist", "fuzz", images, L, labels, n_labels, &shape,
                                        ADT_ERR_FORMAT, ADT_ERR_SHAPE);
    if (!ds) return 0;
    int64_t n = adt_dataset_samples(ds);
    FUZZ_ASSERT(n >= 1 && adt_dataset_layout(ds) == ADT_DATA_CLASS);
    size_t feats = (size_t)adt_dataset_sample_elems(ds, 0);
    FUZZ_ASSERT(feats >= 1 && adt_dataset_sample_elems(ds, 1) == 0 && adt_dataset_sample_elems(ds, 2) == 1);
    float *x = malloc(feats ? feats * sizeof *x : 1);
    for (int64_t i = 0; i < n && i < 256; i++) {
        int32_t y = -1;
        FUZZ_ASSERT(adt_dataset_fill(ds, &i, 1, x, NULL, &y) == ADT_OK);
        FUZZ_ASSERT(y >= 0 && y < shape.classes);
        for (size_t j = 0; j < feats; j++) FUZZ_ASSERT(x[j] >= 0.0f && x[j] <= 1.0f);
    }
    free(x);
    adt_dataset_free(ds);
    return 0;
}
