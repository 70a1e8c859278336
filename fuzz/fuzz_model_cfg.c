/*
 * fuzz_model_cfg.c - libFuzzer target for the JSON model config parser (adt_model_cfg_parse), and
 * for the builders on the configs it accepts.
 *
 * Any byte string must either parse or fail with ADT_ERR_ARG / ADT_ERR_FORMAT and a message that
 * starts with the config's name; never crash, leak or hang. A config that parses must validate,
 * have a positive parameter count, and - when it is small enough to build quickly - build into a
 * graph without error whose parameter count equals the closed form.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/models.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_ASSERT(cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) adt_abort(__FILE__, __LINE__, "fuzz invariant failed: %s", #cond);        \
    } while (0)

/* Building costs time in the number of layers and tables, not in tensor sizes (nothing is
 * allocated), but a cap on the parameters keeps every accepted input cheap. */
#define FUZZ_MAX_BUILD_PARAMS (INT64_C(1) << 22)

static void build(const adt_model_cfg *c, int64_t params) {
    adt_graph *g = adt_graph_create();
    adt_model_io io;
    int rc = adt_model_build(g, c, 2, &io);
    if (rc != ADT_OK) adt_abort(__FILE__, __LINE__, "an accepted config did not build: %s", adt_error_message());
    FUZZ_ASSERT(adt_graph_param_count(g) == params);
    FUZZ_ASSERT(io.input >= 0 && io.label >= 0 && io.logits >= 0 && io.loss >= 0);
    FUZZ_ASSERT(adt_value_numel(g, io.loss) == 1);
    adt_graph_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0; /* a NUL inside ends the text early, as it would in a file read as a string */
    adt_error_clear();
    adt_model_cfg c;
    int rc = adt_model_cfg_parse(&c, text, "fuzz.json");
    free(text);
    if (rc != ADT_OK) {
        FUZZ_ASSERT(rc == ADT_ERR_ARG || rc == ADT_ERR_FORMAT);
        FUZZ_ASSERT(strncmp(adt_error_message(), "fuzz.json: ", 11) == 0);
        return 0;
    }
    FUZZ_ASSERT(adt_model_cfg_validate(&c, "fuzz.json") == ADT_OK);
    int64_t params = adt_model_cfg_param_count(&c);
    FUZZ_ASSERT(params > 0);
    if (params <= FUZZ_MAX_BUILD_PARAMS) build(&c, params);
    return 0;
}
