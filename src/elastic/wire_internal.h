/*
 * wire_internal.h - the JSON both ends of the master API agree on: reading checked fields out
 * of request and reply objects (each error names the field and what was expected), and the data
 * job and lease objects.
 */
#ifndef ADTRAIN_ELASTIC_WIRE_INTERNAL_H
#define ADTRAIN_ELASTIC_WIRE_INTERNAL_H

#include <cJSON.h>
#include <stdint.h>

#include "adtrain/elastic.h"
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

/* The split of the data calls' replies (adtrain/elastic.h, adt_elastic_local_batch):
 * "split": [...], "from_step": F, "split_before": [...]. n = 0: none. */
#define WJ_SPLIT_MAX 1024
typedef struct wj_split {
    int n;
    int64_t from;
    int64_t cur[WJ_SPLIT_MAX], before[WJ_SPLIT_MAX];
} wj_split;
void wj_split_to_json(cJSON *o, const wj_split *s);
/* 1 when o carries a well-formed split (into *s), 0 when it carries none, -1 malformed. */
int wj_split_from_json(const cJSON *o, wj_split *s);
/* Replica r's local batch at `step`; 0 without a split. */
int64_t wj_split_at(const wj_split *s, int r, int64_t step);
/* The split a worker client holds (client.c), for its pipe. */
const wj_split *wj_client_split(const adt_elastic *c);

/* The job spec (adt_elastic_job_spec) as GET /v1/job's "spec" object: told fields only. */
cJSON *wj_spec_to_json(const adt_elastic_job_spec *s);
int wj_spec_from_json(const cJSON *o, adt_elastic_job_spec *s);

const char *wj_grant_name(int grant);
int wj_grant_parse(const char *s);

#endif
