/*
 * fuzz_gemm_routes.c - libFuzzer target for a line of the GEMM layer's routes file
 * (adt_gemm_route_parse).
 *
 * Any byte string must either parse or fail with ADT_ERR_FORMAT and a message that starts with
 * the place given; never crash or read past the line. A line that parses holds sizes in 1..2^40,
 * flags of 0 or 1, at most 4096 threads and a known backend, and is exactly the line the layer
 * would write for that entry.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/gemm.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *line = malloc(size + 1);
    memcpy(line, data, size);
    line[size] = 0;
    adt_error_clear();
    adt_gemm_route_entry e;
    int rc = adt_gemm_route_parse(line, "fuzz.routes:2", &e);
    if (rc != ADT_OK) {
        FUZZ_ASSERT(rc == ADT_ERR_FORMAT);
        FUZZ_ASSERT(strncmp(adt_error_message(), "fuzz.routes:2: ", 15) == 0);
        free(line);
        return 0;
    }
    FUZZ_ASSERT(e.M >= 1 && e.N >= 1 && e.K >= 1 && e.M <= (1ll << 40) && e.N <= (1ll << 40) && e.K <= (1ll << 40));
    FUZZ_ASSERT((e.ta == 0 || e.ta == 1) && (e.tb == 0 || e.tb == 1) && e.threads >= 0 && e.threads <= 4096);
    FUZZ_ASSERT((unsigned)e.backend < ADT_GEMM_N_BACKENDS);
    char again[160];
    snprintf(again, sizeof again, "%lld %lld %lld %d %d %d %s", (long long)e.M, (long long)e.N, (long long)e.K, e.ta,
             e.tb, e.threads, adt_gemm_backend_str(e.backend));
    /* leading zeros are the only other spelling a parsed line may have */
    if (!strchr(line, '0')) FUZZ_ASSERT(strcmp(again, line) == 0);
    adt_gemm_route_entry f;
    FUZZ_ASSERT(adt_gemm_route_parse(again, "again", &f) == ADT_OK);
    FUZZ_ASSERT(f.M == e.M && f.N == e.N && f.K == e.K && f.ta == e.ta && f.tb == e.tb && f.threads == e.threads &&
                f.backend == e.backend);
    free(line);
    return 0;
}
