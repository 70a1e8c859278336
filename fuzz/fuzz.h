/*
 * fuzz.h - what every libFuzzer target in fuzz/ shares: the invariant check that turns a broken
 * promise of the code under test into a crash libFuzzer records with its input.
 */
#ifndef ADTRAIN_FUZZ_H
#define ADTRAIN_FUZZ_H

#include <stdint.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/data.h"

#define FUZZ_ASSERT(cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) adt_abort(__FILE__, __LINE__, "fuzz invariant failed: %s", #cond);        \
    } while (0)

/* The input read as a stream of bytes; past its end every byte is 0. */
typedef struct fuzz_input {
    const uint8_t *p;
    size_t n;
} fuzz_input;

static inline unsigned fuzz_take(fuzz_input *in) {
    if (!in->n) return 0;
    in->n--;
    return *in->p++;
}

/* Opens a dataset from memory. On failure checks the contract every reader keeps - *out reset
 * to NULL, the status one of the two expected, the message starting with the input's name - and
 * returns NULL. */
static inline adt_dataset *fuzz_open_dataset(const char *kind, const char *name, const void *data, size_t n,
                                             const void *data2, size_t n2, const adt_data_shape *shape, int code,
                                             int code2) {
    adt_error_clear();
    adt_dataset *ds = (adt_dataset *)&ds;
    int rc = adt_dataset_open_memory(&ds, kind, name, data, n, data2, n2, shape, NULL);
    if (rc == ADT_OK) return ds;
    FUZZ_ASSERT(ds == NULL);
    FUZZ_ASSERT(rc == code || rc == code2);
    FUZZ_ASSERT(strncmp(adt_error_message(), name, strlen(name)) == 0);
    return NULL;
}

#endif
