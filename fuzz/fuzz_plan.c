/*
 * fuzz_plan.c - libFuzzer target for plan files (adt_plan_parse, then the graph the plan names
 * and adt_plan_bind; a parameter-server plan through adt_ps_plan_parse).
 *
 * Any byte string must parse or fail with ADT_ERR_ARG / ADT_ERR_FORMAT and a message that starts
 * with the file's name; never crash, leak or hang. A plan that parses and is small enough to bind
 * quickly (a few devices, a small graph) must bind or be refused the same way; a plan that binds
 * validates, and written out and read back it binds again to the same text.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/dist.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FUZZ_ASSERT(cond)                                                                      \
    do {                                                                                       \
        if (!(cond)) adt_abort(__FILE__, __LINE__, "fuzz invariant failed: %s", #cond);        \
    } while (0)

/* Binding checks every signature on every device: keep accepted inputs cheap. */
#define FUZZ_MAX_RANKS 16
#define FUZZ_MAX_PARAMS (INT64_C(1) << 16)
#define FUZZ_MAX_NODES 2000

static void refused(int rc) {
    FUZZ_ASSERT(rc == ADT_ERR_ARG || rc == ADT_ERR_FORMAT);
    FUZZ_ASSERT(strncmp(adt_error_message(), "fuzz.json: ", 11) == 0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    adt_error_clear();
    /* a parameter-server plan ("mode": "ps") parses or is refused the same way */
    adt_ps_plan pp;
    int is_ps = 0, prc = adt_ps_plan_parse(&pp, text, "fuzz.json", &is_ps);
    if (prc) refused(prc);
    else if (is_ps) FUZZ_ASSERT(pp.servers >= 1 && pp.servers < pp.devices && pp.batch >= 1);
    adt_error_clear();
    adt_plan p;
    int rc = adt_plan_parse(&p, text, "fuzz.json");
    free(text);
    if (rc) {
        refused(rc);
        adt_plan_free(&p);
        return 0;
    }
    FUZZ_ASSERT(adt_plan_check(&p) == ADT_OK);
    adt_graph *g = NULL;
    if (p.mesh.nranks > FUZZ_MAX_RANKS || adt_model_cfg_param_count(&p.model) > FUZZ_MAX_PARAMS ||
        p.n_nodes > FUZZ_MAX_NODES || adt_plan_build_graph(&p, NULL, &g) || g->n_nodes > FUZZ_MAX_NODES) {
        adt_graph_free(g);
        adt_plan_free(&p);
        return 0;
    }
    rc = adt_plan_bind(&p, g);
    if (rc) refused(rc);
    else {
        FUZZ_ASSERT(adt_plan_validate(&p, g) == ADT_OK);
        char *out = adt_plan_to_json(&p, g);
        adt_plan q;
        FUZZ_ASSERT(adt_plan_parse(&q, out, "fuzz.json") == ADT_OK);
        FUZZ_ASSERT(adt_plan_bind(&q, g) == ADT_OK);
        char *again = adt_plan_to_json(&q, g);
        FUZZ_ASSERT(strcmp(out, again) == 0);
        free(again);
        free(out);
        adt_plan_free(&q);
    }
    adt_graph_free(g);
    adt_plan_free(&p);
    return 0;
}
