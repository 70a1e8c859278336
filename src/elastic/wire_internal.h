/*
 * wire_internal.h - the JSON both ends of the master API agree on: reading checked fields out
 * of request and reply objects (each error names the field and what was expected), and the data
 * job and lease objects.
 */
#ifndef ADTRAIN_ELASTIC_WIRE_INTERNAL_H
#define ADTRAIN_ELASTIC_WIRE_INTERNAL_H

#include <cJSON.h>
#include <stdint.h>

#include "adtrain/ledger.h"

/* Integer field `name` of object o in [lo, hi]. Missing: *out = def and ADT_OK if `optional`,
 * else ADT_ERR_ARG. A non-integer or an out-of-range number is ADT_ERR_ARG naming the field. */
int wj_int(const cJSON *o, const char *name, int64_t lo, int64_t hi, int optional, int64_t def, int64_t *out);
/* String field; NULL when missing and optional. At most maxlen bytes. */
int wj_str(const cJSON *o, const char *name, size_t maxlen, int optional, const char **out);
/* Number field (seconds etc.) in [lo, hi]. */
int wj_num(const cJSON *o, const char *name, double lo, double hi, int optional, double def, double *out);

/* The ledger job as {"samples":..,"seed":"..","shuffle":..,"global_batch":..,"shard_size":..,
 * "epochs":..,"max_failures":..,"max_leases":..,"lease_timeout_s":..}; replicas is left out. */
cJSON *wj_job_to_json(const adt_ledger_job *job);
int wj_job_from_json(const cJSON *o, adt_ledger_job *job);
/* Two jobs describe the same data (replicas aside). */
int wj_job_equal(const adt_ledger_job *a, const adt_ledger_job *b);

cJSON *wj_lease_to_json(const adt_ledger_lease *l);
int wj_lease_from_json(const cJSON *o, adt_ledger_lease *l);

const char *wj_grant_name(int grant);
int wj_grant_parse(const char *s);

#endif
