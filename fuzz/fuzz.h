/*
 * fuzz.h - what every libFuzzer target in fuzz/ shares: the invariant check that turns a broken
 * promise of the code under test into a crash libFuzzer records with its input.
 */
#ifndef ADTRAIN_FUZZ_H
#define ADTRAIN_FUZZ_H

#include "adtrain/base.h"

#define FUZZ_ASSERT(cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) adt_abort(__FILE__, __LINE__, "fuzz invariant failed: %s", #cond);        \
    } while (0)

#endif
