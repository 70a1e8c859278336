/*
 * client.c - the worker side of the master API (adtrain/elastic.h): lease, report, commit and
 * the stop a planned change asks for, each call under one deadline.
 *
 * A call retries while the master cannot be reached or answers 5xx (it may be restarting),
 * and never retries once the master refused it (4xx). Retrying is safe because the master
 * recognises a repeated report or commit (one whose reply was lost) and answers it again
 * without counting it twice, and hands a lease whose grant was lost out again: the client says
 * which leases it holds, and the master returns an unconsumed lease of this replica that is not
 * among them before it grants a new one.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "elastic/http_internal.h"
#include "elastic/wire_internal.h"

#define HELD_MAX 64

struct adt_elastic {
    eh_req req;
    char master[300];
    char *token;
    int64_t generation;
    int replica;
    int idle;       /* replicas that take no samples, declared with the data job */
    int64_t run_steps; /* the run's steps, declared with the data job; 0: the ledger's */
    double timeout_s;
    int64_t stop_at;
    int64_t held[HELD_MAX]; /* leases granted to this client, not yet reported to their end */
    int64_t held_end[HELD_MAX];
    int n_held;
    wj_split split; /* as the last reply that carried one said */
    double srv[ADT_ELASTIC_MAX_SERVERS]; /* the next report's server answer times */
    int n_srv;
};

static const char *env_or(const char *name, const char *def) {
    const char *v = getenv(name);
    return v && *v ? v : def;
}

int adt_elastic_open(adt_elastic **out, const adt_elastic_config *cfg) {
    *out = NULL;
    adt_elastic_config c = cfg ? *cfg : (adt_elastic_config){.replica = -1};
    adt_elastic *e = adt_calloc(1, sizeof *e);
    if (c.master) {
        snprintf(e->master, sizeof e->master, "%s", c.master);
    } else if (getenv("ADT_MASTER")) {
        snprintf(e->master, sizeof e->master, "%s", getenv("ADT_MASTER"));
    } else if (getenv("MASTER_ADDR") && getenv("MASTER_PORT")) {
        snprintf(e->master, sizeof e->master, "%s:%s", getenv("MASTER_ADDR"), getenv("MASTER_PORT"));
    } else {
        free(e);
        return adt_error(ADT_ERR_ARG, "elastic client: no master address (ADT_MASTER or MASTER_ADDR/MASTER_PORT)");
    }
    char host[256];
    int port;
    int rc = eh_parse_hostport(e->master, host, sizeof host, &port, "elastic client: master address");
    if (rc) {
        free(e);
        return rc;
    }
    const char *tok = c.token ? c.token : getenv("ADT_JOB_TOKEN");
    e->token = tok && *tok ? adt_strdup(tok) : NULL;
    e->generation = c.generation;
    e->idle = c.idle_replicas > 0 ? c.idle_replicas : 0;
    e->run_steps = c.run_steps > 0 ? c.run_steps : 0;
    if (!e->generation) {
        const char *g = env_or("ADT_GENERATION", NULL);
        e->generation = g ? strtoll(g, NULL, 10) : 0;
        if (e->generation < 1) {
            adt_elastic_close(e);
            return adt_error(ADT_ERR_ARG, "elastic client: ADT_GENERATION '%s', expected a generation >= 1",
                             g ? g : "(unset)");
        }
    }
    e->replica = c.replica;
    e->timeout_s = c.timeout_s > 0 ? c.timeout_s : 30;
    *out = e;
    return ADT_OK;
}

void adt_elastic_close(adt_elastic *c) {
    if (!c) return;
    eh_req_free(&c->req);
    free(c->token);
    free(c);
}

int64_t adt_elastic_generation(const adt_elastic *c) { return c->generation; }
int adt_elastic_replica(const adt_elastic *c) { return c->replica; }
int64_t adt_elastic_stop_at(const adt_elastic *c) { return c->stop_at; }

/* One call with retries until the deadline; *reply is the parsed JSON of a 2xx answer. */
static int call(adt_elastic *c, const char *method, const char *path, cJSON *body, cJSON **reply, const char *what) {
    char *txt = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    double end = adt_now_s() + c->timeout_s, pause = 0.05;
    int rc;
    *reply = NULL;
    for (;;) {
        double left = end - adt_now_s();
        long ms = left > 0.001 ? (long)(left * 1000) : 1;
        if ((rc = eh_req_setup(&c->req, c->master, c->token, method, path, txt, ms))) break;
        CURLcode cc = curl_easy_perform(c->req.e);
        long status = eh_req_status(&c->req);
        if (cc == CURLE_OK && status > 0 && status < 500) {
            rc = eh_reply_status(status, eh_req_reply(&c->req), what);
            if (!rc) {
                *reply = cJSON_Parse(eh_req_reply(&c->req));
                if (!*reply) rc = adt_error(ADT_ERR_FORMAT, "%s: the master's reply is not JSON", what);
            }
            break;
        }
        rc = cc != CURLE_OK ? eh_transport_error(&c->req, cc, c->master, what)
                            : eh_reply_status(status, eh_req_reply(&c->req), what);
        if (adt_now_s() + pause >= end) break;
        struct timespec ts = {0, (long)(pause * 1e9)};
        nanosleep(&ts, NULL);
        pause = pause * 2 > 0.5 ? 0.5 : pause * 2;
    }
    free(txt);
    return rc;
}

/* The fields every data call carries, and what every reply says back. */
static cJSON *data_body(adt_elastic *c, int with_replica) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddNumberToObject(b, "generation", (double)c->generation);
    if (with_replica) cJSON_AddNumberToObject(b, "replica", c->replica);
    return b;
}

static void take_control(adt_elastic *c, const cJSON *reply) {
    int64_t s;
    if (wj_int(reply, "stop_at", 0, INT64_MAX, 1, 0, &s) == ADT_OK) c->stop_at = s;
    wj_split_from_json(reply, &c->split); /* a malformed one clears it: the even division */
}

const wj_split *wj_client_split(const adt_elastic *c) { return &c->split; }

int64_t adt_elastic_local_batch(const adt_elastic *c, int64_t step) { return wj_split_at(&c->split, c->replica, step); }

int adt_elastic_split(const adt_elastic *c, int64_t step, int64_t *split, int n) {
    if (c->split.n < 1 || n < c->split.n) return 0;
    for (int r = 0; r < c->split.n; r++) split[r] = wj_split_at(&c->split, r, step);
    return c->split.n;
}

int adt_elastic_client_job(adt_elastic *c, adt_elastic_job_spec *out) {
    memset(out, 0, sizeof *out);
    cJSON *r;
    int rc = call(c, "GET", "/v1/job", NULL, &r, "job");
    if (rc) return rc;
    rc = wj_spec_from_json(cJSON_GetObjectItemCaseSensitive(r, "spec"), out);
    cJSON_Delete(r);
    return rc ? adt_error_prefix(rc, "job reply: ") : ADT_OK;
}

/* The replica index, once: from RANK and the master's ranks per replica. */
static int ensure_replica(adt_elastic *c) {
    if (c->replica >= 0) return ADT_OK;
    adt_elastic_info info;
    int rc = adt_elastic_get_info(c, &info);
    if (rc) return rc;
    const char *r = getenv("RANK");
    long rank = r ? strtol(r, NULL, 10) : -1;
    if (rank < 0) return adt_error(ADT_ERR_ARG, "elastic client: no replica given and RANK is not set");
    c->replica = (int)(rank / (info.ranks_per_replica > 0 ? info.ranks_per_replica : 1));
    return ADT_OK;
}

int adt_elastic_get_info(adt_elastic *c, adt_elastic_info *out) {
    memset(out, 0, sizeof *out);
    cJSON *r;
    int rc = call(c, "GET", "/v1/data/info", NULL, &r, "data info");
    if (rc) return rc;
    int64_t v[7];
    const char *ckpt = NULL;
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(r, "running");
    if ((rc = wj_int(r, "generation", 0, INT64_MAX, 0, 0, &v[0])) ||
        (rc = wj_int(r, "world_size", 0, 1 << 20, 0, 0, &v[1])) ||
        (rc = wj_int(r, "replicas", 0, 1 << 20, 0, 0, &v[2])) ||
        (rc = wj_int(r, "ranks_per_replica", 1, 1 << 20, 0, 0, &v[3])) ||
        (rc = wj_int(r, "restarts", 0, INT32_MAX, 0, 0, &v[4])) ||
        (rc = wj_int(r, "committed_steps", 0, INT64_MAX, 0, 0, &v[5])) ||
        (rc = wj_int(r, "stop_at", 0, INT64_MAX, 0, 0, &v[6])) || (rc = wj_str(r, "checkpoint", 255, 0, &ckpt))) {
        cJSON_Delete(r);
        return adt_error_prefix(ADT_ERR_FORMAT, "data info reply: ");
    }
    out->generation = v[0];
    out->running = cJSON_IsTrue(run);
    out->world_size = (int)v[1];
    out->replicas = (int)v[2];
    out->ranks_per_replica = (int)v[3];
    out->restarts = (int)v[4];
    out->committed_steps = v[5];
    out->stop_at = v[6];
    snprintf(out->checkpoint, sizeof out->checkpoint, "%s", ckpt);
    const cJSON *job = cJSON_GetObjectItemCaseSensitive(r, "job");
    if (cJSON_IsObject(job) && wj_job_from_json(job, &out->job) == ADT_OK) out->have_job = 1;
    if (out->generation == c->generation) {
        c->stop_at = out->stop_at;
        wj_split_from_json(r, &c->split);
        out->have_split = c->split.n > 0;
    }
    cJSON_Delete(r);
    return ADT_OK;
}

int adt_elastic_data_init(adt_elastic *c, const adt_ledger_job *job, int ranks_per_replica) {
    cJSON *b = data_body(c, 0), *r;
    cJSON_AddItemToObject(b, "job", wj_job_to_json(job));
    cJSON_AddNumberToObject(b, "ranks_per_replica", ranks_per_replica > 0 ? ranks_per_replica : 1);
    if (c->idle > 0) cJSON_AddNumberToObject(b, "idle_replicas", c->idle);
    if (c->run_steps > 0) cJSON_AddNumberToObject(b, "run_steps", (double)c->run_steps);
    int rc = call(c, "POST", "/v1/data/init", b, &r, "data init");
    if (rc) return rc;
    take_control(c, r);
    cJSON_Delete(r);
    return ADT_OK;
}

/* A lease call's fields: how many samples at most, and the leases this client holds. */
static int add_lease_fields(adt_elastic *c, cJSON *b, int64_t max_samples) {
    if (c->n_held >= HELD_MAX) {
        cJSON_Delete(b);
        return adt_error(ADT_ERR_STATE, "lease: this client holds %d unfinished leases already", HELD_MAX);
    }
    cJSON_AddNumberToObject(b, "max_samples", (double)max_samples);
    cJSON *held = cJSON_AddArrayToObject(b, "held");
    for (int i = 0; i < c->n_held; i++)
        cJSON_AddItemToArray(held, cJSON_CreateNumber((double)c->held[i]));
    return ADT_OK;
}

/* The grant of a lease reply; a granted lease is held from now on. */
static int take_grant(adt_elastic *c, const cJSON *r, adt_ledger_lease *out, int *grant) {
    const char *g = NULL;
    wj_str(r, "grant", 16, 0, &g);
    int gr = wj_grant_parse(g);
    if (gr < 0 || (gr == ADT_LEDGER_GRANTED && wj_lease_from_json(cJSON_GetObjectItemCaseSensitive(r, "lease"), out)))
        return adt_error(ADT_ERR_FORMAT, "lease: the master's reply has no valid grant");
    *grant = gr;
    if (gr == ADT_LEDGER_GRANTED) {
        c->held[c->n_held] = out->id;
        c->held_end[c->n_held++] = out->end;
    }
    return ADT_OK;
}

void adt_elastic_set_server_times(adt_elastic *c, const double *s, int n) {
    c->n_srv = n > 0 ? (n < ADT_ELASTIC_MAX_SERVERS ? n : ADT_ELASTIC_MAX_SERVERS) : 0;
    for (int i = 0; i < c->n_srv; i++) c->srv[i] = s[i] > 0 ? s[i] : 0;
}

static void add_report_fields(adt_elastic *c, cJSON *b, int64_t step, const adt_ledger_range *rg, int n,
                              double compute_s) {
    cJSON_AddNumberToObject(b, "step", (double)step);
    if (compute_s >= 0) cJSON_AddNumberToObject(b, "compute_s", compute_s);
    if (c->n_srv > 0) { /* once: the times are of this report's step */
        cJSON *sv = cJSON_AddArrayToObject(b, "server_s");
        for (int i = 0; i < c->n_srv; i++) cJSON_AddItemToArray(sv, cJSON_CreateNumber(c->srv[i]));
        c->n_srv = 0;
    }
    cJSON *arr = cJSON_AddArrayToObject(b, "ranges");
    for (int i = 0; i < n; i++) {
        cJSON *x = cJSON_CreateArray();
        cJSON_AddItemToArray(x, cJSON_CreateNumber((double)rg[i].lease));
        cJSON_AddItemToArray(x, cJSON_CreateNumber((double)rg[i].a));
        cJSON_AddItemToArray(x, cJSON_CreateNumber((double)rg[i].b));
        cJSON_AddItemToArray(arr, x);
    }
}

/* Leases reported to their end are no longer held. */
static void drop_reported(adt_elastic *c, const adt_ledger_range *rg, int n) {
    for (int i = 0; i < n; i++)
        for (int k = 0; k < c->n_held; k++)
            if (c->held[k] == rg[i].lease && rg[i].b >= c->held_end[k]) {
                c->held[k] = c->held[c->n_held - 1];
                c->held_end[k] = c->held_end[--c->n_held];
                break;
            }
}

int adt_elastic_lease(adt_elastic *c, int64_t max_samples, adt_ledger_lease *out, int *grant) {
    memset(out, 0, sizeof *out);
    *grant = ADT_LEDGER_WAIT;
    int rc = ensure_replica(c);
    if (rc) return rc;
    cJSON *b = data_body(c, 1), *r;
    if ((rc = add_lease_fields(c, b, max_samples)) || (rc = call(c, "POST", "/v1/data/lease", b, &r, "lease")))
        return rc;
    take_control(c, r);
    rc = take_grant(c, r, out, grant);
    cJSON_Delete(r);
    return rc;
}

int adt_elastic_report(adt_elastic *c, int64_t step, const adt_ledger_range *rg, int n) {
    return adt_elastic_report_compute(c, step, rg, n, -1);
}

int adt_elastic_report_compute(adt_elastic *c, int64_t step, const adt_ledger_range *rg, int n, double compute_s) {
    int rc = ensure_replica(c);
    if (rc) return rc;
    cJSON *b = data_body(c, 1), *r;
    add_report_fields(c, b, step, rg, n, compute_s);
    if ((rc = call(c, "POST", "/v1/data/report", b, &r, "report"))) return rc;
    take_control(c, r);
    cJSON_Delete(r);
    drop_reported(c, rg, n);
    return ADT_OK;
}

int adt_elastic_report_lease(adt_elastic *c, int64_t step, const adt_ledger_range *rg, int n, int64_t max_samples,
                             adt_ledger_lease *out, int *grant) {
    return adt_elastic_report_lease_compute(c, step, rg, n, -1, max_samples, out, grant);
}

int adt_elastic_report_lease_compute(adt_elastic *c, int64_t step, const adt_ledger_range *rg, int n,
                                     double compute_s, int64_t max_samples, adt_ledger_lease *out, int *grant) {
    memset(out, 0, sizeof *out);
    *grant = ADT_LEDGER_WAIT;
    int rc = ensure_replica(c);
    if (rc) return rc;
    cJSON *b = data_body(c, 1), *r;
    add_report_fields(c, b, step, rg, n, compute_s);
    if ((rc = add_lease_fields(c, b, max_samples)) ||
        (rc = call(c, "POST", "/v1/data/step", b, &r, "report and lease")))
        return rc;
    take_control(c, r);
    drop_reported(c, rg, n);
    rc = take_grant(c, r, out, grant);
    cJSON_Delete(r);
    return rc;
}

int adt_elastic_commit(adt_elastic *c, int64_t steps, const char *checkpoint) {
    cJSON *b = data_body(c, 0), *r;
    cJSON_AddNumberToObject(b, "steps", (double)steps);
    if (checkpoint) cJSON_AddStringToObject(b, "checkpoint", checkpoint);
    int rc = call(c, "POST", "/v1/data/commit", b, &r, "commit");
    if (rc) return rc;
    take_control(c, r);
    cJSON_Delete(r);
    return ADT_OK;
}

int adt_master_call(const char *master, const char *token, const char *method, const char *path, const char *body,
                    double timeout_s, int *status, char **reply) {
    *status = 0;
    *reply = NULL;
    eh_req r = {0};
    int rc = eh_req_setup(&r, master, token, method, path, body, (long)(timeout_s * 1000));
    if (!rc) {
        CURLcode cc = curl_easy_perform(r.e);
        if (cc == CURLE_OK) {
            *status = (int)eh_req_status(&r);
            *reply = adt_strdup(eh_req_reply(&r));
        } else {
            rc = eh_transport_error(&r, cc, master, path);
        }
    }
    eh_req_free(&r);
    return rc;
}
