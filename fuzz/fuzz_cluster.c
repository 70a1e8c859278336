/*
 * fuzz_cluster.c - libFuzzer target for cluster files (adt_cluster_parse).
 *
 * Any byte string must either parse or fail with ADT_ERR_ARG / ADT_ERR_FORMAT and a message that
 * starts with the file's name; never crash, leak or hang. A cluster that parses validates, its
 * JSON form reads back to the same object, every rate is positive, every mesh over its devices
 * (up to a few thousand) gets positive link prices, and removing and adding a node keeps it valid.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = malloc(size + 1);
    memcpy(text, data, size);
    text[size] = 0;
    adt_error_clear();
    adt_cluster c;
    int rc = adt_cluster_parse(&c, text, "fuzz.json");
    free(text);
    if (rc != ADT_OK) {
        FUZZ_ASSERT(rc == ADT_ERR_ARG || rc == ADT_ERR_FORMAT);
        FUZZ_ASSERT(strncmp(adt_error_message(), "fuzz.json: ", 11) == 0);
        return 0;
    }
    FUZZ_ASSERT(adt_cluster_validate(&c, "fuzz.json") == ADT_OK);
    char *json = adt_cluster_to_json(&c);
    adt_cluster d;
    FUZZ_ASSERT(adt_cluster_parse(&d, json, "again") == ADT_OK);
    FUZZ_ASSERT(d.nodes == c.nodes && d.devices_per_node == c.devices_per_node && d.n_links == c.n_links);
    FUZZ_ASSERT(d.memory_bytes == c.memory_bytes && d.compute_dtype == c.compute_dtype);
    free(json);
    for (int k = 0; k < ADT_OPCLASS_COUNT; k++) FUZZ_ASSERT(adt_cluster_rate(&c, k) > 0);
    int n = adt_cluster_devices(&c);
    if (n <= 4096) {
        int dims[2] = {n / c.devices_per_node, c.devices_per_node};
        adt_mesh m;
        FUZZ_ASSERT(adt_mesh_init(&m, 2, dims) == ADT_OK);
        adt_comm_cost k = adt_cluster_mesh_cost(&c, &m);
        FUZZ_ASSERT(k.beta[0] > 0 && k.beta[1] > 0 && k.alpha[0] >= 0 && k.alpha[1] >= 0);
        for (int a = 0; a < n && a < 64; a++) FUZZ_ASSERT(adt_cluster_level(&c, 0, a) < c.n_links);
    }
    if (c.nodes > 1) FUZZ_ASSERT(adt_cluster_remove_node(&c, 0) == ADT_OK);
    /* adding a node needs a level that can join nodes: the innermost one lies inside a node */
    int joins = c.n_links >= 2;
    if (adt_cluster_devices(&c) + c.devices_per_node <= (1 << 20))
        FUZZ_ASSERT((adt_cluster_add_nodes(&c, 1) == ADT_OK) == joins);
    return 0;
}
