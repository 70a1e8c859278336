/*
 * wire.c - checked JSON fields and the data job / lease objects of the master API, shared by
 * the master (parsing requests) and its clients (parsing replies).
 */
#include "elastic/wire_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"

int wj_int(const cJSON *o, const char *name, int64_t lo, int64_t hi, int optional, int64_t def, int64_t *out) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    *out = def;
    if (!v || cJSON_IsNull(v)) {
        if (optional) return ADT_OK;
        return adt_error(ADT_ERR_ARG, "field '%s' is missing, expected an integer in [%lld, %lld]", name, (long long)lo,
                         (long long)hi);
    }
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    /* 2^53: beyond it a JSON number is not an exact integer any more */
    if (!(d == floor(d)) || fabs(d) > 9007199254740992.0 || d < (double)lo || d > (double)hi)
        return adt_error(ADT_ERR_ARG, "field '%s': expected an integer in [%lld, %lld]", name, (long long)lo,
                         (long long)hi);
    *out = (int64_t)d;
    return ADT_OK;
}

int wj_num(const cJSON *o, const char *name, double lo, double hi, int optional, double def, double *out) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    *out = def;
    if (!v || cJSON_IsNull(v)) {
        if (optional) return ADT_OK;
        return adt_error(ADT_ERR_ARG, "field '%s' is missing, expected a number in [%g, %g]", name, lo, hi);
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return adt_error(ADT_ERR_ARG, "field '%s': expected a number in [%g, %g]", name, lo, hi);
    *out = v->valuedouble;
    return ADT_OK;
}

int wj_str(const cJSON *o, const char *name, size_t maxlen, int optional, const char **out) {
    const cJSON *v = cJSON_IsObject(o) ? cJSON_GetObjectItemCaseSensitive(o, name) : NULL;
    *out = NULL;
    if (!v || cJSON_IsNull(v)) {
        if (optional) return ADT_OK;
        return adt_error(ADT_ERR_ARG, "field '%s' is missing, expected a string", name);
    }
    if (!cJSON_IsString(v) || !v->valuestring) return adt_error(ADT_ERR_ARG, "field '%s': expected a string", name);
    if (strlen(v->valuestring) > maxlen)
        return adt_error(ADT_ERR_ARG, "field '%s': longer than %zu bytes", name, maxlen);
    *out = v->valuestring;
    return ADT_OK;
}

cJSON *wj_job_to_json(const adt_ledger_job *job) {
    cJSON *o = cJSON_CreateObject();
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)job->seed);
    cJSON_AddNumberToObject(o, "samples", (double)job->samples);
    cJSON_AddStringToObject(o, "seed", seed);
    cJSON_AddNumberToObject(o, "shuffle", job->shuffle);
    cJSON_AddNumberToObject(o, "global_batch", (double)job->global_batch);
    cJSON_AddNumberToObject(o, "shard_size", (double)job->shard_size);
    cJSON_AddNumberToObject(o, "epochs", (double)job->epochs);
    cJSON_AddNumberToObject(o, "max_failures", job->max_failures);
    cJSON_AddNumberToObject(o, "max_leases", job->max_leases);
    cJSON_AddNumberToObject(o, "lease_timeout_s", job->lease_timeout_s);
    return o;
}

/* The seed is a string of decimal digits (a JSON number is exact only below 2^53), or a
 * number below 2^53. */
static int seed_from_json(const cJSON *o, uint64_t *seed) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, "seed");
    *seed = 0;
    if (!v || cJSON_IsNull(v)) return ADT_OK;
    if (cJSON_IsString(v) && v->valuestring && v->valuestring[0] >= '0' && v->valuestring[0] <= '9') {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v->valuestring, &end, 10);
        if (!*end && !errno) {
            *seed = s;
            return ADT_OK;
        }
    } else if (cJSON_IsNumber(v)) {
        int64_t s;
        if (wj_int(o, "seed", 0, INT64_MAX, 0, 0, &s) == ADT_OK) {
            *seed = (uint64_t)s;
            return ADT_OK;
        }
    }
    return adt_error(ADT_ERR_ARG, "field 'seed': expected a decimal string or an integer in [0, 2^53]");
}

int wj_job_from_json(const cJSON *o, adt_ledger_job *job) {
    memset(job, 0, sizeof *job);
    if (!cJSON_IsObject(o)) return adt_error(ADT_ERR_ARG, "field 'job': expected an object");
    int64_t v[8];
    int rc;
    if ((rc = wj_int(o, "samples", 1, INT64_C(1) << 40, 0, 0, &v[0])) ||
        (rc = wj_int(o, "shuffle", 0, 1, 1, 1, &v[1])) ||
        (rc = wj_int(o, "global_batch", 1, INT64_C(1) << 40, 0, 0, &v[2])) ||
        (rc = wj_int(o, "shard_size", 1, INT64_C(1) << 40, 0, 0, &v[3])) ||
        (rc = wj_int(o, "epochs", 1, 1 << 20, 0, 0, &v[4])) ||
        (rc = wj_int(o, "max_failures", 0, 1 << 20, 1, 0, &v[5])) ||
        (rc = wj_int(o, "max_leases", 0, 1 << 20, 1, 0, &v[6])) || (rc = seed_from_json(o, &job->seed)))
        return rc;
    double timeout;
    if ((rc = wj_num(o, "lease_timeout_s", 0, 1e7, 1, 0, &timeout))) return rc;
    job->samples = v[0];
    job->shuffle = (int)v[1];
    job->global_batch = v[2];
    job->shard_size = v[3];
    job->epochs = v[4];
    job->max_failures = (int)v[5];
    job->max_leases = (int)v[6];
    job->lease_timeout_s = timeout;
    job->replicas = 1;
    return ADT_OK;
}

int wj_job_equal(const adt_ledger_job *a, const adt_ledger_job *b) {
    /* the ledger's defaults for 0 */
    int fa = a->max_failures ? a->max_failures : 3, fb = b->max_failures ? b->max_failures : 3;
    int la = a->max_leases ? a->max_leases : 2, lb = b->max_leases ? b->max_leases : 2;
    double ta = a->lease_timeout_s > 0 ? a->lease_timeout_s : 60, tb = b->lease_timeout_s > 0 ? b->lease_timeout_s : 60;
    return a->samples == b->samples && a->seed == b->seed && !a->shuffle == !b->shuffle &&
           a->global_batch == b->global_batch && a->shard_size == b->shard_size && a->epochs == b->epochs && fa == fb &&
           la == lb && ta == tb;
}

cJSON *wj_lease_to_json(const adt_ledger_lease *l) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "id", (double)l->id);
    cJSON_AddNumberToObject(o, "generation", (double)l->generation);
    cJSON_AddNumberToObject(o, "replica", l->replica);
    cJSON_AddNumberToObject(o, "state", l->state);
    cJSON_AddNumberToObject(o, "epoch", (double)l->epoch);
    cJSON_AddNumberToObject(o, "shard", (double)l->shard);
    cJSON_AddNumberToObject(o, "start", (double)l->start);
    cJSON_AddNumberToObject(o, "end", (double)l->end);
    cJSON_AddNumberToObject(o, "cursor", (double)l->cursor);
    cJSON_AddNumberToObject(o, "committed", (double)l->committed);
    cJSON_AddNumberToObject(o, "last_step", (double)l->last_step);
    cJSON_AddNumberToObject(o, "deadline", l->deadline);
    return o;
}

int wj_lease_from_json(const cJSON *o, adt_ledger_lease *l) {
    memset(l, 0, sizeof *l);
    int64_t v[11];
    static const char *const names[] = {"id",    "generation", "replica", "state",     "epoch",    "shard",
                                        "start", "end",        "cursor",  "committed", "last_step"};
    for (int i = 0; i < 11; i++) {
        int rc = wj_int(o, names[i], i == 10 ? -1 : 0, INT64_C(1) << 52, 0, 0, &v[i]);
        if (rc) return adt_error_prefix(rc, "lease: ");
    }
    l->id = v[0], l->generation = v[1], l->replica = (int)v[2], l->state = (int)v[3], l->epoch = v[4];
    l->shard = v[5], l->start = v[6], l->end = v[7], l->cursor = v[8], l->committed = v[9], l->last_step = v[10];
    wj_num(o, "deadline", -1e300, 1e300, 1, 0, &l->deadline);
    return ADT_OK;
}

const char *wj_grant_name(int grant) {
    return grant == ADT_LEDGER_GRANTED ? "granted" : grant == ADT_LEDGER_DONE ? "done" : "wait";
}

int wj_grant_parse(const char *s) {
    if (s && !strcmp(s, "granted")) return ADT_LEDGER_GRANTED;
    if (s && !strcmp(s, "done")) return ADT_LEDGER_DONE;
    if (s && !strcmp(s, "wait")) return ADT_LEDGER_WAIT;
    return -1;
}

/* ---- the split ------------------------------------------------------------------------------ */
static cJSON *i64_array(const int64_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

void wj_split_to_json(cJSON *o, const wj_split *s) {
    if (s->n < 1) return;
    cJSON_AddItemToObject(o, "split", i64_array(s->cur, s->n));
    cJSON_AddNumberToObject(o, "from_step", (double)s->from);
    cJSON_AddItemToObject(o, "split_before", i64_array(s->before, s->n));
}

static int i64_array_from(const cJSON *a, int64_t *v, int max) {
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (n < 1 || n > max) return -1;
    int i = 0;
    for (const cJSON *x = a->child; x; x = x->next, i++) {
        if (!cJSON_IsNumber(x) || x->valuedouble < 0 || x->valuedouble > 4503599627370496.0 ||
            x->valuedouble != (double)(int64_t)x->valuedouble)
            return -1;
        v[i] = (int64_t)x->valuedouble;
    }
    return n;
}

int wj_split_from_json(const cJSON *o, wj_split *s) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "split");
    if (!a) return 0;
    int64_t from;
    int n = i64_array_from(a, s->cur, WJ_SPLIT_MAX);
    if (n < 1 || wj_int(o, "from_step", 0, INT64_C(1) << 52, 0, 0, &from) ||
        i64_array_from(cJSON_GetObjectItemCaseSensitive(o, "split_before"), s->before, WJ_SPLIT_MAX) != n) {
        s->n = 0;
        return -1;
    }
    s->n = n, s->from = from;
    return 1;
}

int64_t wj_split_at(const wj_split *s, int r, int64_t step) {
    if (r < 0 || r >= s->n) return 0;
    return step >= s->from ? s->cur[r] : s->before[r];
}

/* ---- the job spec --------------------------------------------------------------------------- */
cJSON *wj_spec_to_json(const adt_elastic_job_spec *s) {
    cJSON *o = cJSON_CreateObject();
    if (s->have & ADT_SPEC_MODEL) {
        cJSON_AddStringToObject(o, "model", s->model);
        if (s->model_json) cJSON_AddStringToObject(o, "model_json", s->model_json);
    }
    if (s->have & ADT_SPEC_BATCH) cJSON_AddNumberToObject(o, "batch", (double)s->batch);
    if (s->have & ADT_SPEC_OPTIMIZER) cJSON_AddStringToObject(o, "optimizer", s->optimizer);
    if (s->have & ADT_SPEC_LR) cJSON_AddNumberToObject(o, "lr", s->lr);
    if (s->have & ADT_SPEC_MOMENTUM) cJSON_AddNumberToObject(o, "momentum", s->momentum);
    if (s->have & ADT_SPEC_WEIGHT_DECAY) cJSON_AddNumberToObject(o, "weight_decay", s->weight_decay);
    if (s->have & ADT_SPEC_STEPS) cJSON_AddNumberToObject(o, "steps", (double)s->steps);
    if (s->have & ADT_SPEC_SEED) {
        char b[24];
        snprintf(b, sizeof b, "%llu", (unsigned long long)s->seed);
        cJSON_AddStringToObject(o, "seed", b); /* a string: above 2^53 a number would round */
    }
    if (s->have & ADT_SPEC_DATA) cJSON_AddStringToObject(o, "data", s->data);
    if (s->have & ADT_SPEC_STRAGGLER) {
        cJSON_AddStringToObject(o, "straggler_policy", s->straggler_policy);
        cJSON_AddStringToObject(o, "straggler_config", s->straggler_config);
    }
    if (s->have & ADT_SPEC_CHECKPOINT_DIR) cJSON_AddStringToObject(o, "checkpoint_dir", s->checkpoint_dir);
    return o;
}

/* A string field into a fixed buffer; *have gets `bit` when present. */
static int spec_str(const cJSON *o, const char *name, char *dst, size_t cap, unsigned bit, unsigned *have) {
    const char *v = NULL;
    int rc = wj_str(o, name, cap - 1, 1, &v);
    if (!rc && v) snprintf(dst, cap, "%s", v), *have |= bit;
    return rc;
}

int wj_spec_from_json(const cJSON *o, adt_elastic_job_spec *s) {
    memset(s, 0, sizeof *s);
    if (!cJSON_IsObject(o)) return adt_error(ADT_ERR_FORMAT, "field 'spec': expected an object");
    const char *mj = NULL, *seed = NULL;
    int64_t v;
    int rc;
    if ((rc = spec_str(o, "model", s->model, sizeof s->model, ADT_SPEC_MODEL, &s->have)) ||
        (rc = wj_str(o, "model_json", 64u << 20, 1, &mj)) ||
        (rc = spec_str(o, "optimizer", s->optimizer, sizeof s->optimizer, ADT_SPEC_OPTIMIZER, &s->have)) ||
        (rc = spec_str(o, "data", s->data, sizeof s->data, ADT_SPEC_DATA, &s->have)) ||
        (rc = spec_str(o, "straggler_policy", s->straggler_policy, sizeof s->straggler_policy, ADT_SPEC_STRAGGLER,
                       &s->have)) ||
        (rc = spec_str(o, "straggler_config", s->straggler_config, sizeof s->straggler_config, ADT_SPEC_STRAGGLER,
                       &s->have)) ||
        (rc = spec_str(o, "checkpoint_dir", s->checkpoint_dir, sizeof s->checkpoint_dir, ADT_SPEC_CHECKPOINT_DIR,
                       &s->have)) ||
        (rc = wj_str(o, "seed", 24, 1, &seed)))
        return adt_error_prefix(rc, "spec: ");
    if (mj) s->model_json = adt_strdup(mj);
    static const struct { const char *name; unsigned bit; } nums[] = {
        {"lr", ADT_SPEC_LR}, {"momentum", ADT_SPEC_MOMENTUM}, {"weight_decay", ADT_SPEC_WEIGHT_DECAY}};
    double *dst[] = {&s->lr, &s->momentum, &s->weight_decay};
    for (int i = 0; i < 3; i++) {
        if (!cJSON_GetObjectItemCaseSensitive(o, nums[i].name)) continue;
        if ((rc = wj_num(o, nums[i].name, 0, 1e6, 0, 0, dst[i]))) goto bad;
        s->have |= nums[i].bit;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, "batch")) {
        if ((rc = wj_int(o, "batch", 1, INT64_C(1) << 40, 0, 0, &v))) goto bad;
        s->batch = v, s->have |= ADT_SPEC_BATCH;
    }
    if (cJSON_GetObjectItemCaseSensitive(o, "steps")) {
        if ((rc = wj_int(o, "steps", 1, INT64_C(1) << 52, 0, 0, &v))) goto bad;
        s->steps = v, s->have |= ADT_SPEC_STEPS;
    }
    if (seed) {
        char *end;
        errno = 0;
        unsigned long long x = strtoull(seed, &end, 10);
        if (!*seed || *end || errno || *seed == '-') {
            rc = adt_error(ADT_ERR_FORMAT, "field 'seed': expected an unsigned integer as a string, got '%s'", seed);
            goto bad;
        }
        s->seed = x, s->have |= ADT_SPEC_SEED;
    }
    return ADT_OK;
bad:
    adt_elastic_job_spec_free(s);
    return adt_error_prefix(rc, "spec: ");
}

void adt_elastic_job_spec_free(adt_elastic_job_spec *s) {
    if (!s) return;
    free(s->model_json);
    s->model_json = NULL;
}
