/*
 * cluster.c - the cluster object: its JSON form (docs/formats.md, "Cluster files"), the checks,
 * the compute rate of each op class, and the link a group of devices talks over.
 *
 * A cluster is `nodes` nodes of `devices_per_node` identical devices; devices are numbered node
 * by node. Link levels go from the innermost (span = devices_per_node or less) outwards, each
 * span a multiple of the one before and the last covering every device: a group of devices
 * communicates over the innermost level whose aligned blocks hold all of them, and a ring is as
 * slow as its slowest hop.
 */
#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "adtrain/base.h"
#include "adtrain/planner.h"
#include "models/cfg_internal.h"

#define CLUSTER_MAX_BYTES (1L << 20)
#define CLUSTER_MAX_DEVICES (1 << 20)

const char *adt_op_class_name(int c) {
    static const char *const n[] = {"matmul", "conv", "attention", "other"};
    return c >= 0 && c < ADT_OPCLASS_COUNT ? n[c] : "?";
}

int adt_op_class_of(int op) {
    switch (op) {
    case ADT_OP_MATMUL:
    case ADT_OP_EMBEDDING:
    case ADT_OP_EMBEDDING_BWD: return ADT_OPCLASS_MATMUL;
    case ADT_OP_CONV2D:
    case ADT_OP_CONV2D_BWD_DATA:
    case ADT_OP_CONV2D_BWD_WEIGHT: return ADT_OPCLASS_CONV;
    case ADT_OP_ATTENTION:
    case ADT_OP_ATTENTION_BWD: return ADT_OPCLASS_ATTENTION;
    default: return ADT_OPCLASS_OTHER;
    }
}

/* ---- reading ----------------------------------------------------------------------------------- */

static int get_number(const cJSON *obj, const char *field, const char *where, int required, double lo, double hi,
                      const char *name, double *out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!j) {
        if (!required) return ADT_OK;
        return adt_error(ADT_ERR_ARG, "%s: missing field \"%s%s\" (expected a number in [%g, %g])", name, where, field,
                         lo, hi);
    }
    if (!cJSON_IsNumber(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s%s\" is %s, expected a number in [%g, %g]", name, where, field,
                         adt_cfg_json_kind(j), lo, hi);
    if (!(j->valuedouble >= lo && j->valuedouble <= hi))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s%s\" is %g, expected a number in [%g, %g]", name, where, field,
                         j->valuedouble, lo, hi);
    *out = j->valuedouble;
    return ADT_OK;
}

static int get_int(const cJSON *obj, const char *field, const char *where, int required, int lo, int hi,
                   const char *name, int *out) {
    double d = *out;
    int rc = get_number(obj, field, where, required, lo, hi, name, &d);
    if (rc) return rc;
    if (d != floor(d))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s%s\" is %g, expected an integer in [%d, %d]", name, where, field,
                         d, lo, hi);
    *out = (int)d;
    return ADT_OK;
}

static int get_string(const cJSON *obj, const char *field, const char *where, int required, const char *name,
                      char *out, size_t cap) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    if (!j) {
        if (!required) return ADT_OK;
        return adt_error(ADT_ERR_ARG, "%s: missing field \"%s%s\" (expected a string)", name, where, field);
    }
    if (!cJSON_IsString(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s%s\" is %s, expected a string", name, where, field,
                         adt_cfg_json_kind(j));
    if (strlen(j->valuestring) >= cap)
        return adt_error(ADT_ERR_ARG, "%s: field \"%s%s\" is %zu characters long, expected at most %zu", name, where,
                         field, strlen(j->valuestring), cap - 1);
    snprintf(out, cap, "%s", j->valuestring);
    return ADT_OK;
}

static int get_object(const cJSON *obj, const char *field, const char *where, int required, const char *name,
                      const cJSON **out) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, field);
    *out = NULL;
    if (!j) {
        if (!required) return ADT_OK;
        return adt_error(ADT_ERR_ARG, "%s: missing field \"%s%s\" (expected an object)", name, where, field);
    }
    if (!cJSON_IsObject(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%s%s\" is %s, expected an object", name, where, field,
                         adt_cfg_json_kind(j));
    *out = j;
    return ADT_OK;
}

/* A comment, when present, must be a string (an array of strings would be silently lost). */
static int check_comment(const cJSON *obj, const char *where, const char *name) {
    const cJSON *j = cJSON_GetObjectItemCaseSensitive(obj, "comment");
    if (!j) return ADT_OK;
    if (!cJSON_IsString(j))
        return adt_error(ADT_ERR_ARG, "%s: field \"%scomment\" is %s, expected a string", name, where,
                         adt_cfg_json_kind(j));
    return ADT_OK;
}

/* device.<field>: FLOP/s per op class, {"matmul", "conv", "attention", "other"}, each optional. */
static int parse_rates(const cJSON *d, const char *field, const char *name, double *rate) {
    const cJSON *rates;
    char where[48];
    int rc = get_object(d, field, "device.", 0, name, &rates);
    if (rc || !rates) return rc;
    static const char *const r_fields[] = {"matmul", "conv", "attention", "other", "comment", NULL};
    snprintf(where, sizeof where, "device.%s", field);
    if ((rc = adt_cfg_check_fields(rates, r_fields, where, name))) return rc;
    snprintf(where, sizeof where, "device.%s.", field);
    if ((rc = check_comment(rates, where, name))) return rc;
    for (int k = 0; k < ADT_OPCLASS_COUNT; k++)
        if ((rc = get_number(rates, adt_op_class_name(k), where, 0, 1e3, 1e18, name, &rate[k]))) return rc;
    return ADT_OK;
}

/* An optional array field of objects, device.<field>: its size (0 when absent) once it is an
 * array of at most max objects; `what` describes an entry for the message. */
static int object_array(const cJSON *a, const char *field, int max, const char *what, const char *name, int *n) {
    *n = 0;
    if (!a) return ADT_OK;
    if (!cJSON_IsArray(a))
        return adt_error(ADT_ERR_ARG, "%s: field \"device.%s\" is %s, expected an array of %s", name, field,
                         adt_cfg_json_kind(a), what);
    *n = cJSON_GetArraySize(a);
    if (*n > max)
        return adt_error(ADT_ERR_ARG, "%s: field \"device.%s\" has %d entries, expected at most %d", name, field, *n,
                         max);
    int i = 0;
    for (const cJSON *e = a->child; e; e = e->next, i++)
        if (!cJSON_IsObject(e))
            return adt_error(ADT_ERR_ARG, "%s: field \"device.%s[%d]\" is %s, expected an object", name, field, i,
                             adt_cfg_json_kind(e));
    return ADT_OK;
}

/* device.slowdown[i].sync_curve: up to ADT_SYNC_POINTS [segment_s, loss_s] pairs, segments
 * ascending above 0 (at most 100 s), losses in [0, 10] s. */
static int parse_sync_curve(adt_cluster *c, int i, const cJSON *a, const char *w, const char *name) {
    if (!a) return ADT_OK;
    int n = cJSON_IsArray(a) ? cJSON_GetArraySize(a) : -1;
    if (n < 1 || n > ADT_SYNC_POINTS)
        return adt_error(ADT_ERR_ARG, "%s: field \"%ssync_curve\" is %s, expected an array of 1 to %d [segment_s, "
                         "loss_s] pairs", name, w, n < 0 ? adt_cfg_json_kind(a) : "an array of another length",
                         ADT_SYNC_POINTS);
    int k = 0;
    for (const cJSON *e = a->child; e; e = e->next, k++) {
        const cJSON *s0 = cJSON_GetArrayItem(e, 0), *l0 = cJSON_GetArrayItem(e, 1);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != 2 || !cJSON_IsNumber(s0) || !cJSON_IsNumber(l0))
            return adt_error(ADT_ERR_ARG, "%s: field \"%ssync_curve[%d]\": expected [segment_s, loss_s], two numbers",
                             name, w, k);
        double seg = s0->valuedouble, loss = l0->valuedouble, prev = k ? c->slowdown[i].sync_curve[k - 1][0] : 0;
        if (!(seg > prev && seg <= 100) || !(loss >= 0 && loss <= 10))
            return adt_error(ADT_ERR_ARG, "%s: field \"%ssync_curve[%d]\" is [%g, %g], expected a segment in (%g, 100] "
                             "seconds (ascending) and a loss in [0, 10] seconds", name, w, k, seg, loss, prev);
        c->slowdown[i].sync_curve[k][0] = seg, c->slowdown[i].sync_curve[k][1] = loss;
    }
    c->slowdown[i].n_sync = n;
    return ADT_OK;
}

/* device.slowdown: [{"ranks", "factor", "sync_s", "coll_factor", "relay_factor", "relay_segment_s",
 * "relay_long_factor", "relay_long_segment_s", "sync_curve"}],
 * compute time
 * with that many busy ranks on a node over one rank's, the seconds a rank loses at each
 * collective it blocks on, a collective's time inside a step over its back-to-back time where the
 * cores move it, and one rank's compute while the others wait for its messages over its own. */
static int parse_slowdown(adt_cluster *c, const cJSON *a, const char *name) {
    c->n_slowdown = 0;
    memset(c->slowdown, 0, sizeof c->slowdown); /* sync_s is optional */
    int n, i = 0, rc = object_array(a, "slowdown", ADT_CLUSTER_MAX_SLOWDOWN, "{ranks, factor}", name, &n);
    if (rc || !n) return rc;
    static const char *const fields[] = {"ranks",           "factor",           "sync_s",
                                         "coll_factor",     "relay_factor",     "relay_segment_s",
                                         "relay_long_factor", "relay_long_segment_s", "sync_curve",
                                         "comment",         NULL};
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        char w[48];
        snprintf(w, sizeof w, "device.slowdown[%d].", i);
        if ((rc = adt_cfg_check_fields(e, fields, "slowdown", name)) || (rc = check_comment(e, w, name)) ||
            (rc = get_int(e, "ranks", w, 1, 1, 1 << 20, name, &c->slowdown[i].ranks)) ||
            (rc = get_number(e, "factor", w, 1, 0.1, 1e3, name, &c->slowdown[i].factor)) ||
            (rc = get_number(e, "sync_s", w, 0, 0, 1, name, &c->slowdown[i].sync_s)) ||
            (rc = get_number(e, "coll_factor", w, 0, 0, 1e3, name, &c->slowdown[i].coll_factor)) ||
            (rc = get_number(e, "relay_factor", w, 0, 0, 1e3, name, &c->slowdown[i].relay_factor)) ||
            (rc = get_number(e, "relay_segment_s", w, 0, 0, 10, name, &c->slowdown[i].relay_segment_s)) ||
            (rc = get_number(e, "relay_long_factor", w, 0, 0, 1e3, name, &c->slowdown[i].relay_long_factor)) ||
            (rc = get_number(e, "relay_long_segment_s", w, 0, 0, 10, name, &c->slowdown[i].relay_long_segment_s)) ||
            (rc = parse_sync_curve(c, i, cJSON_GetObjectItemCaseSensitive(e, "sync_curve"), w, name)))
            return rc;
        for (int j = 0; j < i; j++)
            if (c->slowdown[j].ranks == c->slowdown[i].ranks)
                return adt_error(ADT_ERR_ARG, "%s: field \"%sranks\": a second slowdown for %d ranks", name, w,
                                 c->slowdown[i].ranks);
    }
    c->n_slowdown = n;
    return ADT_OK;
}

/* device.accumulate: [{"bytes", "bytes_per_s"}], sizes ascending. */
static int parse_accumulate(adt_cluster *c, const cJSON *a, const char *name) {
    c->n_accumulate = 0;
    int n, i = 0, rc = object_array(a, "accumulate", ADT_CLUSTER_MAX_ACCUMULATE, "{bytes, bytes_per_s}", name, &n);
    if (rc || !n) return rc;
    static const char *const fields[] = {"bytes", "bytes_per_s", "comment", NULL};
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        char w[48];
        snprintf(w, sizeof w, "device.accumulate[%d].", i);
        if ((rc = adt_cfg_check_fields(e, fields, "accumulate", name)) || (rc = check_comment(e, w, name)) ||
            (rc = get_number(e, "bytes", w, 1, 1, 1e15, name, &c->accumulate[i].bytes)) ||
            (rc = get_number(e, "bytes_per_s", w, 1, 1e3, 1e15, name, &c->accumulate[i].bytes_per_s)))
            return rc;
        if (i && !(c->accumulate[i].bytes > c->accumulate[i - 1].bytes))
            return adt_error(ADT_ERR_ARG, "%s: field \"%sbytes\" is %g, expected more than the entry before's (%g): "
                             "sizes ascend", name, w, c->accumulate[i].bytes, c->accumulate[i - 1].bytes);
    }
    c->n_accumulate = n;
    return ADT_OK;
}

/* device.op_factors: {"<op kind>": [one factor per decade of FLOPs], ...}, 0: not measured. */
static int parse_op_factors(adt_cluster *c, const cJSON *d, const char *name) {
    const cJSON *o;
    int rc = get_object(d, "op_factors", "device.", 0, name, &o);
    if (rc || !o) return rc;
    for (const cJSON *e = o->child; e; e = e->next) {
        if (!strcmp(e->string, "comment")) {
            if ((rc = check_comment(o, "device.op_factors.", name))) return rc;
            continue;
        }
        int k = 0;
        while (k < ADT_OP_COUNT && strcmp(adt_op_name(k), e->string)) k++;
        if (k == ADT_OP_COUNT)
            return adt_error(ADT_ERR_ARG, "%s: field \"device.op_factors.%s\": no op kind of that name (the names are "
                             "those of `adtrain graph`, e.g. \"matmul\", \"conv2d\")", name, e->string);
        if (!cJSON_IsArray(e) || cJSON_GetArraySize(e) != ADT_OP_FACTOR_BUCKETS)
            return adt_error(ADT_ERR_ARG, "%s: field \"device.op_factors.%s\" is %s, expected an array of %d numbers "
                             "(FLOPs below 1e4, 1e4 to 1e5, ..., 1e10 and above)", name, e->string,
                             cJSON_IsArray(e) ? "an array of another length" : adt_cfg_json_kind(e), ADT_OP_FACTOR_BUCKETS);
        for (int sc = 0; sc < ADT_OP_FACTOR_BUCKETS; sc++) {
            const cJSON *x = cJSON_GetArrayItem(e, sc);
            if (!cJSON_IsNumber(x) || !(x->valuedouble == 0 || (x->valuedouble >= 1e-3 && x->valuedouble <= 1e3)))
                return adt_error(ADT_ERR_ARG, "%s: field \"device.op_factors.%s[%d]\": expected 0 (not measured) or a "
                                 "number in [0.001, 1000]", name, e->string, sc);
            c->op_factor[sc][k] = x->valuedouble;
        }
    }
    return ADT_OK;
}

static int parse_device(adt_cluster *c, const cJSON *d, const char *name) {
    static const char *const fields[] = {"kind", "peak_flops", "compute_dtype", "efficiency", "matmul_fraction",
                                         "memory_fraction", "rates",
                                         "memory_bytes", "memory_bw", "launch_s", "rates_small", "small_flops", "byte_rates", "byte_rates_small",
                                         "slowdown", "op_factors", "accumulate", "comment", NULL};
    int rc;
    if ((rc = adt_cfg_check_fields(d, fields, "device", name)) || (rc = check_comment(d, "device.", name)) ||
        (rc = get_string(d, "kind", "device.", 1, name, c->device_kind, sizeof c->device_kind)))
        return rc;
    const cJSON *pf;
    if ((rc = get_object(d, "peak_flops", "device.", 1, name, &pf))) return rc;
    static const char *const pf_fields[] = {"f32", "bf16", "f16", "comment", NULL};
    if ((rc = adt_cfg_check_fields(pf, pf_fields, "device.peak_flops", name)) ||
        (rc = check_comment(pf, "device.peak_flops.", name)) ||
        (rc = get_number(pf, "f32", "device.peak_flops.", 1, 1e6, 1e18, name, &c->peak_flops[ADT_F32])) ||
        (rc = get_number(pf, "bf16", "device.peak_flops.", 0, 1e6, 1e18, name, &c->peak_flops[ADT_BF16])) ||
        (rc = get_number(pf, "f16", "device.peak_flops.", 0, 1e6, 1e18, name, &c->peak_f16)))
        return rc;
    char dt[16] = "f32";
    if ((rc = get_string(d, "compute_dtype", "device.", 0, name, dt, sizeof dt))) return rc;
    if (!strcmp(dt, "f32")) c->compute_dtype = ADT_F32;
    else if (!strcmp(dt, "bf16")) c->compute_dtype = ADT_BF16;
    else return adt_error(ADT_ERR_ARG, "%s: field \"device.compute_dtype\" is \"%s\", expected \"f32\" or \"bf16\"", name, dt);
    if (!c->peak_flops[c->compute_dtype])
        return adt_error(ADT_ERR_ARG, "%s: field \"device.compute_dtype\" is \"%s\", but \"device.peak_flops.%s\" is not "
                         "given", name, dt, dt);
    /* matmul_fraction: the published achievable share of peak on large matrix products; where a
     * file gives it and no efficiency, the graph model's uncalibrated rates take it too. */
    c->memory_fraction = 1.0;
    if ((rc = get_number(d, "matmul_fraction", "device.", 0, 1e-3, 1.0, name, &c->matmul_fraction)) ||
        (rc = get_number(d, "memory_fraction", "device.", 0, 1e-3, 1.0, name, &c->memory_fraction)))
        return rc;
    c->efficiency = c->matmul_fraction > 0 ? c->matmul_fraction : 0.5;
    if ((rc = get_number(d, "efficiency", "device.", 0, 1e-3, 1.0, name, &c->efficiency))) return rc;
    if ((rc = parse_rates(d, "rates", name, c->rate)) || (rc = parse_rates(d, "rates_small", name, c->rate_small)) ||
        (rc = parse_rates(d, "byte_rates", name, c->byte_rate)) ||
        (rc = parse_rates(d, "byte_rates_small", name, c->byte_rate_small)))
        return rc;
    if ((rc = get_number(d, "small_flops", "device.", 0, 0, 1e18, name, &c->small_flops))) return rc;
    if ((rc = parse_slowdown(c, cJSON_GetObjectItemCaseSensitive(d, "slowdown"), name))) return rc;
    if ((rc = parse_op_factors(c, d, name))) return rc;
    if ((rc = parse_accumulate(c, cJSON_GetObjectItemCaseSensitive(d, "accumulate"), name))) return rc;
    if ((rc = get_number(d, "memory_bytes", "device.", 1, 1e6, 1e15, name, &c->memory_bytes)) ||
        (rc = get_number(d, "memory_bw", "device.", 1, 1e6, 1e15, name, &c->memory_bw)) ||
        (rc = get_number(d, "launch_s", "device.", 0, 0, 1, name, &c->launch_s)))
        return rc;
    return ADT_OK;
}

const char *adt_coll_kind_name(int kind) {
    return kind == ADT_COLL_SEND_RECV ? "send_recv" : adt_boxing_kind_name(kind);
}

static int coll_kind_of(const char *s) {
    static const int kinds[] = {ADT_BOXING_ALL_REDUCE, ADT_BOXING_REDUCE_SCATTER, ADT_BOXING_ALL_GATHER,
                                ADT_BOXING_ALL_TO_ALL, ADT_COLL_SEND_RECV};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(s, adt_coll_kind_name(kinds[i]))) return kinds[i];
    return -1;
}

/* links[i].collectives: [{"kind", "ranks", "alpha", "beta"}], one fit per kind and group size. */
static int parse_collectives(adt_link *k, const cJSON *a, const char *where, const char *name) {
    k->n_coll = 0;
    if (!a) return ADT_OK;
    if (!cJSON_IsArray(a))
        return adt_error(ADT_ERR_ARG, "%s: field \"%scollectives\" is %s, expected an array of {kind, ranks, alpha, "
                         "beta}", name, where, adt_cfg_json_kind(a));
    int n = cJSON_GetArraySize(a), i = 0, rc;
    if (n > ADT_LINK_MAX_COLL)
        return adt_error(ADT_ERR_ARG, "%s: field \"%scollectives\" has %d entries, expected at most %d", name, where, n,
                         ADT_LINK_MAX_COLL);
    static const char *const fields[] = {"kind", "ranks", "alpha", "beta", "comment", NULL};
    for (const cJSON *e = a->child; e; e = e->next, i++) {
        char w[64], kind[32];
        snprintf(w, sizeof w, "%scollectives[%d].", where, i);
        if (!cJSON_IsObject(e))
            return adt_error(ADT_ERR_ARG, "%s: field \"%.*s\" is %s, expected an object", name, (int)strlen(w) - 1, w,
                             adt_cfg_json_kind(e));
        adt_coll_fit *f = &k->coll[i];
        if ((rc = adt_cfg_check_fields(e, fields, "collective", name)) || (rc = check_comment(e, w, name)) ||
            (rc = get_string(e, "kind", w, 1, name, kind, sizeof kind)) ||
            (rc = get_int(e, "ranks", w, 1, 2, 4096, name, &f->ranks)) ||
            (rc = get_number(e, "alpha", w, 1, 0, 10, name, &f->alpha)) ||
            (rc = get_number(e, "beta", w, 1, 1e-15, 1e-3, name, &f->beta)))
            return rc;
        if ((f->kind = coll_kind_of(kind)) < 0)
            return adt_error(ADT_ERR_ARG, "%s: field \"%skind\" is \"%s\", expected all_reduce, reduce_scatter, "
                             "all_gather, all_to_all or send_recv", name, w, kind);
        for (int j = 0; j < i; j++)
            if (k->coll[j].kind == f->kind && k->coll[j].ranks == f->ranks)
                return adt_error(ADT_ERR_ARG, "%s: field \"%sranks\": a second %s fit for %d ranks", name, w, kind,
                                 f->ranks);
    }
    k->n_coll = n;
    return ADT_OK;
}

static int parse_links(adt_cluster *c, const cJSON *links, const char *name) {
    if (!links) return adt_error(ADT_ERR_ARG, "%s: missing field \"links\" (expected an array of link levels, innermost "
                                 "first)", name);
    if (!cJSON_IsArray(links))
        return adt_error(ADT_ERR_ARG, "%s: field \"links\" is %s, expected an array of link levels, innermost first", name,
                         adt_cfg_json_kind(links));
    int n = cJSON_GetArraySize(links);
    if (n < 1 || n > ADT_CLUSTER_MAX_LINKS)
        return adt_error(ADT_ERR_ARG, "%s: field \"links\" has %d levels, expected 1 to %d", name, n,
                         ADT_CLUSTER_MAX_LINKS);
    static const char *const fields[] = {"name", "span", "bandwidth", "latency", "coll_fraction", "collectives", "comment", NULL};
    int i = 0, rc;
    for (const cJSON *l = links->child; l; l = l->next, i++) {
        char where[32];
        snprintf(where, sizeof where, "links[%d].", i);
        if (!cJSON_IsObject(l))
            return adt_error(ADT_ERR_ARG, "%s: field \"links[%d]\" is %s, expected an object", name, i,
                             adt_cfg_json_kind(l));
        adt_link *k = &c->link[i];
        if ((rc = adt_cfg_check_fields(l, fields, "link", name)) || (rc = check_comment(l, where, name)) ||
            (rc = get_string(l, "name", where, 1, name, k->name, sizeof k->name)) ||
            (rc = get_int(l, "span", where, 1, 1, CLUSTER_MAX_DEVICES, name, &k->span)) ||
            (rc = get_number(l, "bandwidth", where, 1, 1e3, 1e15, name, &k->bandwidth)) ||
            (rc = get_number(l, "latency", where, 1, 0, 10, name, &k->latency)) ||
            (k->coll_fraction = 1.0, rc = get_number(l, "coll_fraction", where, 0, 1e-3, 1.0, name, &k->coll_fraction)) ||
            (rc = parse_collectives(k, cJSON_GetObjectItemCaseSensitive(l, "collectives"), where, name)))
            return rc;
    }
    c->n_links = n;
    return ADT_OK;
}

int adt_cluster_parse(adt_cluster *c, const char *text, const char *name) {
    memset(c, 0, sizeof *c);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
    if (!root) return adt_cfg_json_error(text, end, name);
    static const char *const fields[] = {"name",   "comment", "nodes", "devices_per_node", "cores_per_node",
                                         "device", "links",   NULL};
    int rc;
    const cJSON *dev = NULL;
    if (!cJSON_IsObject(root))
        rc = adt_error(ADT_ERR_ARG, "%s: expected a JSON object at the top level, got %s", name, adt_cfg_json_kind(root));
    else if (!(rc = adt_cfg_check_fields(root, fields, "cluster", name)) && !(rc = check_comment(root, "", name)) &&
             !(rc = get_string(root, "name", "", 1, name, c->name, sizeof c->name)) &&
             !(rc = get_int(root, "nodes", "", 1, 1, CLUSTER_MAX_DEVICES, name, &c->nodes)) &&
             !(rc = get_int(root, "devices_per_node", "", 1, 1, 4096, name, &c->devices_per_node)) &&
             !(rc = get_int(root, "cores_per_node", "", 0, 1, 1 << 20, name, &c->cores_per_node)) &&
             !(rc = get_object(root, "device", "", 1, name, &dev)) && !(rc = parse_device(c, dev, name)))
        rc = parse_links(c, cJSON_GetObjectItemCaseSensitive(root, "links"), name);
    cJSON_Delete(root);
    if (!rc) rc = adt_cluster_validate(c, name);
    return rc;
}

int adt_cluster_validate(const adt_cluster *c, const char *name) {
    if (c->nodes < 1 || c->devices_per_node < 1 || (long)c->nodes * c->devices_per_node > CLUSTER_MAX_DEVICES)
        return adt_error(ADT_ERR_ARG, "%s: %d nodes of %d devices, expected at least one device and at most %d", name,
                         c->nodes, c->devices_per_node, CLUSTER_MAX_DEVICES);
    if (!(c->memory_bytes > 0) || !(c->memory_bw > 0) || !(c->peak_flops[c->compute_dtype] > 0))
        return adt_error(ADT_ERR_ARG, "%s: field \"device\": memory_bytes, memory_bw and the peak FLOP/s of the compute "
                         "dtype must be positive", name);
    if (c->n_slowdown < 0 || c->n_slowdown > ADT_CLUSTER_MAX_SLOWDOWN)
        return adt_error(ADT_ERR_ARG, "%s: field \"device.slowdown\": %d entries, expected 0 to %d", name, c->n_slowdown,
                         ADT_CLUSTER_MAX_SLOWDOWN);
    for (int i = 0; i < c->n_slowdown; i++)
        if (c->slowdown[i].ranks < 1 || !(c->slowdown[i].factor > 0) || !(c->slowdown[i].sync_s >= 0) ||
            !(c->slowdown[i].coll_factor >= 0) || !(c->slowdown[i].relay_factor >= 0) ||
            !(c->slowdown[i].relay_segment_s >= 0) || !(c->slowdown[i].relay_long_factor >= 0) ||
            !(c->slowdown[i].relay_long_segment_s >= 0) || c->slowdown[i].n_sync < 0 ||
            c->slowdown[i].n_sync > ADT_SYNC_POINTS)
            return adt_error(ADT_ERR_ARG, "%s: field \"device.slowdown[%d]\": expected ranks >= 1, a positive factor, sync_s >= 0, coll_factor >= 0, relay_factor, relay_segment_s, relay_long_factor and relay_long_segment_s >= 0, and 0 to %d sync_curve points",
                             name, i, ADT_SYNC_POINTS);
        else
            for (int k = 0; k < c->slowdown[i].n_sync; k++)
                if (!(c->slowdown[i].sync_curve[k][0] > (k ? c->slowdown[i].sync_curve[k - 1][0] : 0)) ||
                    !(c->slowdown[i].sync_curve[k][1] >= 0))
                    return adt_error(ADT_ERR_ARG, "%s: field \"device.slowdown[%d].sync_curve[%d]\": expected segments "
                                     "ascending above 0 and losses >= 0", name, i, k);
    if (c->n_accumulate < 0 || c->n_accumulate > ADT_CLUSTER_MAX_ACCUMULATE)
        return adt_error(ADT_ERR_ARG, "%s: field \"device.accumulate\": %d entries, expected 0 to %d", name,
                         c->n_accumulate, ADT_CLUSTER_MAX_ACCUMULATE);
    for (int i = 0; i < c->n_accumulate; i++)
        if (!(c->accumulate[i].bytes > (i ? c->accumulate[i - 1].bytes : 0)) || !(c->accumulate[i].bytes_per_s > 0))
            return adt_error(ADT_ERR_ARG, "%s: field \"device.accumulate[%d]\": expected sizes ascending from above 0 "
                             "and a positive bytes_per_s", name, i);
    if (c->cores_per_node < 0 || !(c->small_flops >= 0))
        return adt_error(ADT_ERR_ARG, "%s: cores_per_node and device.small_flops must not be negative", name);
    if (c->n_links < 1 || c->n_links > ADT_CLUSTER_MAX_LINKS)
        return adt_error(ADT_ERR_ARG, "%s: %d link levels, expected 1 to %d", name, c->n_links, ADT_CLUSTER_MAX_LINKS);
    int total = c->nodes * c->devices_per_node;
    for (int i = 0; i < c->n_links; i++) {
        const adt_link *l = &c->link[i];
        if (l->n_coll < 0 || l->n_coll > ADT_LINK_MAX_COLL)
            return adt_error(ADT_ERR_ARG, "%s: field \"links[%d].collectives\": %d entries, expected 0 to %d", name, i,
                             l->n_coll, ADT_LINK_MAX_COLL);
        for (int j = 0; j < l->n_coll; j++)
            if (l->coll[j].ranks < 2 || !(l->coll[j].alpha >= 0) || !(l->coll[j].beta > 0) || l->coll[j].kind < 0 ||
                (l->coll[j].kind > ADT_BOXING_ALL_TO_ALL && l->coll[j].kind != ADT_COLL_SEND_RECV))
                return adt_error(ADT_ERR_ARG, "%s: field \"links[%d].collectives[%d]\": expected a collective kind, "
                                 "ranks >= 2, alpha >= 0 and beta > 0", name, i, j);
        if (l->span < 1 || !(l->bandwidth > 0) || !(l->latency >= 0))
            return adt_error(ADT_ERR_ARG, "%s: field \"links[%d]\": span, bandwidth must be positive and latency not "
                             "negative", name, i);
        if (i && (l->span <= c->link[i - 1].span || l->span % c->link[i - 1].span))
            return adt_error(ADT_ERR_ARG, "%s: field \"links[%d].span\" is %d, expected a multiple of links[%d].span "
                             "(%d) larger than it: levels go from the innermost outwards", name, i, l->span, i - 1,
                             c->link[i - 1].span);
        if (!i && (c->devices_per_node % l->span))
            return adt_error(ADT_ERR_ARG, "%s: field \"links[0].span\" is %d, expected a divisor of devices_per_node "
                             "(%d): the innermost level lies inside a node", name, l->span, c->devices_per_node);
    }
    if (c->link[c->n_links - 1].span < total && c->nodes > 1)
        return adt_error(ADT_ERR_ARG, "%s: field \"links[%d].span\" is %d, but the cluster has %d devices; expected the "
                         "outermost level to span them all", name, c->n_links - 1, c->link[c->n_links - 1].span, total);
    return ADT_OK;
}

int adt_cluster_load(adt_cluster *c, const char *path) {
    char *text = NULL;
    memset(c, 0, sizeof *c);
    int rc = adt_cfg_read_text(path, "cluster file", CLUSTER_MAX_BYTES, &text);
    if (rc) return rc;
    rc = adt_cluster_parse(c, text, path);
    free(text);
    return rc;
}

/* {"<op class>": rate, ...} of the classes with one, if any */
static void add_rates(cJSON *dev, const char *field, const double *rate) {
    cJSON *r = NULL;
    for (int k = 0; k < ADT_OPCLASS_COUNT; k++)
        if (rate[k] > 0) {
            if (!r) r = cJSON_CreateObject();
            cJSON_AddNumberToObject(r, adt_op_class_name(k), rate[k]);
        }
    if (r) cJSON_AddItemToObject(dev, field, r);
}

char *adt_cluster_to_json(const adt_cluster *c) {
    cJSON *root = cJSON_CreateObject(), *dev = cJSON_CreateObject(), *pf = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "name", c->name);
    cJSON_AddNumberToObject(root, "nodes", c->nodes);
    cJSON_AddNumberToObject(root, "devices_per_node", c->devices_per_node);
    if (c->cores_per_node > 0) cJSON_AddNumberToObject(root, "cores_per_node", c->cores_per_node);
    cJSON_AddStringToObject(dev, "kind", c->device_kind);
    cJSON_AddNumberToObject(pf, "f32", c->peak_flops[ADT_F32]);
    if (c->peak_flops[ADT_BF16] > 0) cJSON_AddNumberToObject(pf, "bf16", c->peak_flops[ADT_BF16]);
    if (c->peak_f16 > 0) cJSON_AddNumberToObject(pf, "f16", c->peak_f16);
    cJSON_AddItemToObject(dev, "peak_flops", pf);
    cJSON_AddStringToObject(dev, "compute_dtype", adt_dtype_name(c->compute_dtype));
    cJSON_AddNumberToObject(dev, "efficiency", c->efficiency);
    if (c->matmul_fraction > 0) cJSON_AddNumberToObject(dev, "matmul_fraction", c->matmul_fraction);
    if (c->memory_fraction > 0 && c->memory_fraction != 1.0) cJSON_AddNumberToObject(dev, "memory_fraction", c->memory_fraction);
    add_rates(dev, "rates", c->rate);
    cJSON_AddNumberToObject(dev, "memory_bytes", c->memory_bytes);
    cJSON_AddNumberToObject(dev, "memory_bw", c->memory_bw);
    cJSON_AddNumberToObject(dev, "launch_s", c->launch_s);
    add_rates(dev, "rates_small", c->rate_small);
    add_rates(dev, "byte_rates", c->byte_rate);
    add_rates(dev, "byte_rates_small", c->byte_rate_small);
    if (c->small_flops > 0) cJSON_AddNumberToObject(dev, "small_flops", c->small_flops);
    if (c->n_slowdown > 0) {
        cJSON *a = cJSON_CreateArray();
        for (int i = 0; i < c->n_slowdown; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "ranks", c->slowdown[i].ranks);
            cJSON_AddNumberToObject(e, "factor", c->slowdown[i].factor);
            if (c->slowdown[i].sync_s > 0) cJSON_AddNumberToObject(e, "sync_s", c->slowdown[i].sync_s);
            if (c->slowdown[i].coll_factor > 0) cJSON_AddNumberToObject(e, "coll_factor", c->slowdown[i].coll_factor);
            if (c->slowdown[i].relay_factor > 0) cJSON_AddNumberToObject(e, "relay_factor", c->slowdown[i].relay_factor);
            if (c->slowdown[i].relay_segment_s > 0)
                cJSON_AddNumberToObject(e, "relay_segment_s", c->slowdown[i].relay_segment_s);
            if (c->slowdown[i].relay_long_factor > 0)
                cJSON_AddNumberToObject(e, "relay_long_factor", c->slowdown[i].relay_long_factor);
            if (c->slowdown[i].relay_long_segment_s > 0)
                cJSON_AddNumberToObject(e, "relay_long_segment_s", c->slowdown[i].relay_long_segment_s);
            if (c->slowdown[i].n_sync > 0) {
                cJSON *curve = cJSON_CreateArray();
                for (int k = 0; k < c->slowdown[i].n_sync; k++)
                    cJSON_AddItemToArray(curve, cJSON_CreateDoubleArray(c->slowdown[i].sync_curve[k], 2));
                cJSON_AddItemToObject(e, "sync_curve", curve);
            }
            cJSON_AddItemToArray(a, e);
        }
        cJSON_AddItemToObject(dev, "slowdown", a);
    }
    if (c->n_accumulate > 0) {
        cJSON *a = cJSON_CreateArray();
        for (int i = 0; i < c->n_accumulate; i++) {
            cJSON *e = cJSON_CreateObject();
            cJSON_AddNumberToObject(e, "bytes", c->accumulate[i].bytes);
            cJSON_AddNumberToObject(e, "bytes_per_s", c->accumulate[i].bytes_per_s);
            cJSON_AddItemToArray(a, e);
        }
        cJSON_AddItemToObject(dev, "accumulate", a);
    }
    cJSON *of = NULL;
    for (int k = 0; k < ADT_OP_COUNT; k++) {
        int any_k = 0;
        for (int sc = 0; sc < ADT_OP_FACTOR_BUCKETS; sc++) any_k |= c->op_factor[sc][k] > 0;
        if (!any_k) continue;
        if (!of) of = cJSON_CreateObject();
        cJSON *a = cJSON_CreateArray();
        for (int sc = 0; sc < ADT_OP_FACTOR_BUCKETS; sc++) cJSON_AddItemToArray(a, cJSON_CreateNumber(c->op_factor[sc][k]));
        cJSON_AddItemToObject(of, adt_op_name(k), a);
    }
    if (of) cJSON_AddItemToObject(dev, "op_factors", of);
    cJSON_AddItemToObject(root, "device", dev);
    cJSON *links = cJSON_CreateArray();
    for (int i = 0; i < c->n_links; i++) {
        cJSON *l = cJSON_CreateObject();
        cJSON_AddStringToObject(l, "name", c->link[i].name);
        cJSON_AddNumberToObject(l, "span", c->link[i].span);
        cJSON_AddNumberToObject(l, "bandwidth", c->link[i].bandwidth);
        cJSON_AddNumberToObject(l, "latency", c->link[i].latency);
        if (c->link[i].coll_fraction > 0 && c->link[i].coll_fraction != 1.0) cJSON_AddNumberToObject(l, "coll_fraction", c->link[i].coll_fraction);
        if (c->link[i].n_coll > 0) {
            cJSON *a = cJSON_CreateArray();
            for (int j = 0; j < c->link[i].n_coll; j++) {
                const adt_coll_fit *f = &c->link[i].coll[j];
                cJSON *e = cJSON_CreateObject();
                cJSON_AddStringToObject(e, "kind", adt_coll_kind_name(f->kind));
                cJSON_AddNumberToObject(e, "ranks", f->ranks);
                cJSON_AddNumberToObject(e, "alpha", f->alpha);
                cJSON_AddNumberToObject(e, "beta", f->beta);
                cJSON_AddItemToArray(a, e);
            }
            cJSON_AddItemToObject(l, "collectives", a);
        }
        cJSON_AddItemToArray(links, l);
    }
    cJSON_AddItemToObject(root, "links", links);
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    return s;
}

/* ---- using it ---------------------------------------------------------------------------------- */

int adt_cluster_devices(const adt_cluster *c) { return c->nodes * c->devices_per_node; }

double adt_cluster_rate(const adt_cluster *c, int k) {
    if (k >= 0 && k < ADT_OPCLASS_COUNT && c->rate[k] > 0) return c->rate[k];
    return c->peak_flops[c->compute_dtype] * c->efficiency;
}

double adt_cluster_op_rate(const adt_cluster *c, int k, double flops) {
    if (k >= 0 && k < ADT_OPCLASS_COUNT && flops < c->small_flops && c->rate_small[k] > 0) return c->rate_small[k];
    return adt_cluster_rate(c, k);
}

int adt_op_factor_bucket(double flops) {
    int b = flops >= 1e4 ? (int)floor(log10(flops)) - 3 : 0;
    return b < 0 ? 0 : b >= ADT_OP_FACTOR_BUCKETS ? ADT_OP_FACTOR_BUCKETS - 1 : b;
}

double adt_cluster_op_time(const adt_cluster *c, int op, double flops, double bytes) {
    int cls = adt_op_class_of(op);
    double tf = flops / adt_cluster_op_rate(c, cls, flops), tb = bytes / c->memory_bw, t;
    double br = cls < 0 || cls >= ADT_OPCLASS_COUNT ? 0 : flops < c->small_flops ? c->byte_rate_small[cls] : c->byte_rate[cls];
    t = (br > 0 ? tf + bytes / br : tf > tb ? tf : tb) + c->launch_s;
    double k = 0;
    if (op >= 0 && op < ADT_OP_COUNT) { /* this decade's factor, else the nearest measured one */
        int b = adt_op_factor_bucket(flops);
        for (int d = 0; d < ADT_OP_FACTOR_BUCKETS && !(k > 0); d++) {
            if (b - d >= 0 && c->op_factor[b - d][op] > 0) k = c->op_factor[b - d][op];
            else if (b + d < ADT_OP_FACTOR_BUCKETS && c->op_factor[b + d][op] > 0) k = c->op_factor[b + d][op];
        }
    }
    return k > 0 ? k * t : t;
}

double adt_cluster_accumulate_s(const adt_cluster *c, double bytes, int busy) {
    if (!(bytes > 0)) return 0;
    double rate = c->memory_bw / 3; /* read both, write one */
    int n = c->n_accumulate;
    if (n > 0) {
        int i = 0;
        while (i < n && c->accumulate[i].bytes < bytes) i++;
        if (i == 0 || i == n) rate = c->accumulate[i ? n - 1 : 0].bytes_per_s;
        else {
            double x0 = log(c->accumulate[i - 1].bytes), x1 = log(c->accumulate[i].bytes);
            double y0 = log(c->accumulate[i - 1].bytes_per_s), y1 = log(c->accumulate[i].bytes_per_s);
            rate = exp(y0 + (y1 - y0) * (log(bytes) - x0) / (x1 - x0));
        }
    }
    return bytes / rate * adt_cluster_share(c, busy);
}

/* The per-kind factors of alpha and of G beta in a collective's time (dist.h's boxing table). */
static void coll_factors(int kind, int n, double *fa, double *fb) {
    double k = n;
    switch (kind) {
    case ADT_BOXING_ALL_REDUCE: *fa = 2 * (k - 1), *fb = 2 * (k - 1) / k; break;
    case ADT_BOXING_REDUCE_SCATTER:
    case ADT_BOXING_ALL_GATHER: *fa = k - 1, *fb = (k - 1) / k; break;
    case ADT_BOXING_ALL_TO_ALL: *fa = k - 1, *fb = (k - 1) / (k * k); break;
    default: *fa = 1, *fb = 1; break; /* send / recv: one message */
    }
}

double adt_cluster_coll_time(const adt_cluster *c, int level, int kind, int n, double g, int busy) {
    if (level < 0) level = 0;
    if (level >= c->n_links) level = c->n_links - 1;
    const adt_link *l = &c->link[level];
    if (n < 2) return 0;
    int want = n;
    if (c->cores_per_node > 0 && busy > c->cores_per_node && busy > want) want = busy;
    const adt_coll_fit *best = NULL;
    for (int j = 0; j < l->n_coll; j++) {
        const adt_coll_fit *f = &l->coll[j];
        if (f->kind == kind && f->ranks <= want && (!best || f->ranks > best->ranks)) best = f;
    }
    double fa, fb;
    coll_factors(kind, n, &fa, &fb);
    if (best) return fa * best->alpha + fb * g * best->beta;
    return fa * l->latency + fb * g / l->bandwidth;
}

int adt_cluster_level(const adt_cluster *c, int a, int b) {
    for (int i = 0; i < c->n_links; i++)
        if (a / c->link[i].span == b / c->link[i].span) return i;
    return c->n_links - 1;
}

int adt_cluster_axis_level(const adt_cluster *c, const adt_mesh *m, int a) {
    int level = 0;
    /* every group along axis a: each coordinate compared with its neighbour along a */
    for (int i = 0; i < m->nranks; i++) {
        int coord[ADT_MAX_MESH_DIMS];
        adt_mesh_coord(m, i, coord);
        if (coord[a] + 1 >= m->dim[a]) continue;
        int r0 = adt_mesh_rank(m, coord);
        coord[a]++;
        int l = adt_cluster_level(c, r0, adt_mesh_rank(m, coord));
        if (l > level) level = l;
    }
    return level;
}

adt_comm_cost adt_cluster_mesh_cost(const adt_cluster *c, const adt_mesh *m) {
    adt_comm_cost cost = {.local = 1e-9};
    for (int a = 0; a < m->ndim; a++) {
        int level = adt_cluster_axis_level(c, m, a);
        cost.alpha[a] = c->link[level].latency;
        cost.beta[a] = 1.0 / c->link[level].bandwidth;
    }
    return cost;
}

/* After nodes were added: the outermost level spans every device again (rounded up to a multiple
 * of the level inside it). A cluster that shrank keeps its spans: a level may be larger than the
 * devices left. */
static void fit_outer(adt_cluster *c) {
    int total = adt_cluster_devices(c);
    adt_link *o = &c->link[c->n_links - 1];
    if (o->span >= total || c->n_links < 2) return;
    int inner = c->link[c->n_links - 2].span;
    o->span = (total + inner - 1) / inner * inner;
}

int adt_cluster_remove_node(adt_cluster *c, int node) {
    if (node < 0 || node >= c->nodes || c->nodes < 2)
        return adt_error(ADT_ERR_ARG, "cluster %s: cannot remove node %d of %d", c->name, node, c->nodes);
    c->nodes--;
    return adt_cluster_validate(c, c->name);
}

int adt_cluster_add_nodes(adt_cluster *c, int count) {
    if (count < 1 || (long)(c->nodes + count) * c->devices_per_node > CLUSTER_MAX_DEVICES)
        return adt_error(ADT_ERR_ARG, "cluster %s: cannot add %d nodes to %d", c->name, count, c->nodes);
    if (c->n_links < 2)
        return adt_error(ADT_ERR_ARG, "cluster %s: cannot add nodes: its one link level lies inside a node; expected a "
                         "second level joining nodes", c->name);
    c->nodes += count;
    fit_outer(c);
    return adt_cluster_validate(c, c->name);
}
