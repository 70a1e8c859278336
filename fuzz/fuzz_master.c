/*
 * fuzz_master.c - libFuzzer target for the master's request handler (adt_master_handle).
 *
 * The input bytes are read as a sequence of requests against an in-memory master (master state
 * and ledger both in memory, long-polls never held): mostly plausible ones - agents registering,
 * heartbeating, reporting events, workers leasing, reporting and committing with generations,
 * replicas, leases and steps taken from the master's own state or made up - and some with
 * arbitrary bytes as the body, path or query. Whatever the sequence, no request may crash or
 * leak, and every reply must be well formed: a status in 200..599, a NUL-terminated body of the
 * stated length, JSON (an object or array) except /metrics and /v1/events, and every 4xx a JSON
 * object with an "error" string. The master must still answer GET /v1/job after each request.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/elastic.h"

#include <cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

/* A number near the interesting values: small, or one of the master's own. */
static long pick(fuzz_input *in, long mine) {
    unsigned b = fuzz_take(in);
    if (b < 128) return mine + (long)(b % 3) - 1;
    if (b < 224) return (long)(b % 8);
    return b == 255 ? -1 : (long)fuzz_take(in) * 1000003L;
}

static void check_reply(const adt_http_request *rq, const adt_http_reply *rp) {
    FUZZ_ASSERT(rp->status >= 200 && rp->status <= 599);
    FUZZ_ASSERT(rp->body && strlen(rp->body) == rp->len);
    FUZZ_ASSERT(rp->content_type && *rp->content_type);
    int text = rq->path && (!strcmp(rq->path, "/metrics") || !strcmp(rq->path, "/v1/events") ||
                            !strcmp(rq->path, "/dashboard")) && rp->status == 200;
    if (text) return;
    cJSON *j = cJSON_Parse(rp->body);
    FUZZ_ASSERT(cJSON_IsObject(j) || cJSON_IsArray(j));
    if (rp->status >= 400 && rp->status < 500) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(j, "error");
        FUZZ_ASSERT(cJSON_IsString(e) && e->valuestring[0]);
    }
    cJSON_Delete(j);
}

static cJSON *call(adt_master *m, const char *method, const char *path, const char *const *query, const char *body,
                   size_t len, int *status) {
    adt_http_request rq = {.method = method, .path = path, .query = query, .body = body, .body_len = len};
    adt_http_reply rp;
    adt_master_handle(m, &rq, &rp);
    check_reply(&rq, &rp);
    *status = rp.status;
    cJSON *j = cJSON_Parse(rp.body);
    adt_http_reply_free(&rp);
    return j;
}

static long num(const cJSON *o, const char *k) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? (long)v->valuedouble : 0;
}

static const char *const k_post[] = {
    "/v1/agents",    "/v1/agents/heartbeat", "/v1/agents/event", "/v1/agents/leave", "/v1/kvs",
    "/v1/data/init", "/v1/data/lease",       "/v1/data/report",  "/v1/data/commit",  "/v1/scale",
    "/v1/data/step"};
static const char *const k_get[] = {"/v1/job",    "/v1/generation", "/v1/agents",    "/v1/workers", "/v1/shards",
                                    "/v1/events", "/metrics",       "/v1/data/info", "/",           "/v1/agents/",
                                    "/v1/plan"};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int once;
    if (!once) adt_log_set_level(ADT_LOG_ERROR), once = 1;
    fuzz_input in = {data, size};
    adt_ledger_job job = {.samples = 16 + fuzz_take(&in) % 48,
                          .seed = fuzz_take(&in),
                          .shuffle = 1,
                          .global_batch = 1 + fuzz_take(&in) % 8,
                          .shard_size = 1 + fuzz_take(&in) % 16,
                          .epochs = 1 + fuzz_take(&in) % 2,
                          .replicas = 1,
                          .max_failures = 2,
                          .max_leases = 2,
                          .lease_timeout_s = 60};
    adt_master_config cfg = {.job_dir = ":memory:",
                             .nnodes_min = 1,
                             .join_wait_s = -1,
                             .max_wait_ms = -1,
                             .max_restarts = 1000,
                             .ledger_flags = ADT_LEDGER_NOSYNC,
                             .data = (fuzz_take(&in) & 1) ? &job : NULL,
                             /* the split in the data replies, driven by compute_s */
                             .straggler_policy = (fuzz_take(&in) & 1) ? "dd" : NULL};
    adt_master *m;
    FUZZ_ASSERT(adt_master_create(&m, &cfg) == ADT_OK);
    long lease_ids[8] = {0};
    for (int ops = 0; in.n > 0 && ops < 64; ops++) {
        int st;
        cJSON *g = call(m, "GET", "/v1/generation", NULL, NULL, 0, &st);
        FUZZ_ASSERT(st == 200);
        long gen = num(g, "generation"), world = num(g, "world_size"), next = num(g, "max_reported_step") + 1;
        cJSON_Delete(g);
        unsigned op = fuzz_take(&in) % 16;
        char body[1024], after[16];
        const char *path = NULL, *method = "POST";
        const char *query[5] = {NULL};
        size_t len = 0;
        if (op < 10) {
            path = k_post[op];
            if (fuzz_take(&in) >= 224) { /* arbitrary bytes as the body */
                len = fuzz_take(&in) % 64;
                if (len > in.n) len = in.n;
                memcpy(body, in.p, len);
                in.p += len, in.n -= len;
            } else {
                long agent = pick(&in, 1), a = pick(&in, 0), b = pick(&in, 2), lease = lease_ids[fuzz_take(&in) % 8];
                switch (op) {
                case 0:
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"node\":\"n%ld\",\"slots\":%ld,\"pid\":%ld,\"agent\":%ld,"
                                           "\"seq\":%ld,\"generation\":%ld,\"running\":%ld}",
                                           agent % 3, 1 + b % 4, a, agent, a, gen, b & 1);
                    break;
                case 1:
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"agent\":%ld,\"version\":%ld,\"seq\":%ld,\"generation\":%ld,"
                                           "\"running\":%ld,\"pids\":[%ld,%ld],\"wait_ms\":%ld}",
                                           agent, a, b, gen, a & 1, a, b, b);
                    break;
                case 2: {
                    static const char *const kinds[] = {"started", "rank_failed", "world_done", "bogus"};
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"agent\":%ld,\"kind\":\"%s\",\"generation\":%ld,\"rank\":%ld,"
                                           "\"ok\":%ld,\"seq\":%ld,\"running\":%ld,\"msg\":\"x\","
                                           "\"exit_code\":%ld,\"stderr\":\"usage: y\"}",
                                           agent, kinds[fuzz_take(&in) % 4], gen + (a == -1), a % (world + 1), b & 1, b,
                                           a & 1, (long)(fuzz_take(&in) % 4) - 1);
                    break;
                }
                case 3: len = (size_t)snprintf(body, sizeof body, "{\"agent\":%ld}", agent); break;
                case 4:
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"agent\":%ld,\"generation\":%ld,\"epoch\":%ld,"
                                           "\"entries\":[[\"k%ld\",\"v\"]],\"wait_ms\":5}",
                                           agent, gen, a, b);
                    break;
                case 5:
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"generation\":%ld,\"ranks_per_replica\":%ld,\"job\":"
                                           "{\"samples\":%ld,\"global_batch\":%ld,\"shard_size\":%ld,\"epochs\":%ld,"
                                           "\"seed\":\"%lu\",\"max_leases\":4}}",
                                           gen, 1 + (a & 1), (long)job.samples, (long)job.global_batch + (b == 7),
                                           (long)job.shard_size, (long)job.epochs, (unsigned long)job.seed);
                    break;
                case 6:
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"generation\":%ld,\"replica\":%ld,\"max_samples\":%ld,"
                                           "\"held\":[%ld]}",
                                           gen + (a == -1), a % (world + 1), b, lease);
                    break;
                case 7:
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"generation\":%ld,\"replica\":%ld,\"step\":%ld,"
                                           "\"ranges\":[[%ld,%ld,%ld]],\"compute_s\":%g}",
                                           gen, a % (world + 1), next + (b % 3) - 1, lease, (long)(fuzz_take(&in) % 64),
                                           (long)(fuzz_take(&in) % 64), (double)(fuzz_take(&in) % 16) * 1e-3);
                    break;
                case 8:
                    len = (size_t)snprintf(body, sizeof body,
                                           "{\"generation\":%ld,\"steps\":%ld,\"checkpoint\":\"c%ld\"}", gen,
                                           next + (a % 2), b);
                    break;
                default: len = (size_t)snprintf(body, sizeof body, "{\"workers\":%ld,\"nodes\":%ld}", a, b); break;
                }
            }
        } else if (op < 15) {
            method = (fuzz_take(&in) & 7) ? "GET" : "PUT";
            path = k_get[fuzz_take(&in) % (sizeof k_get / sizeof k_get[0])];
            snprintf(after, sizeof after, "%d", (int)fuzz_take(&in) - 8);
            query[0] = (fuzz_take(&in) & 1) ? "after" : "leases", query[1] = (fuzz_take(&in) & 1) ? after : "all";
        } else {
            adt_master_tick(m);
            continue;
        }
        cJSON *r = call(m, method, path, query, body, len, &st);
        /* remember granted leases, to report on them later */
        const cJSON *l = cJSON_GetObjectItemCaseSensitive(r, "lease");
        if (st == 200 && l) lease_ids[fuzz_take(&in) % 8] = num(l, "id");
        cJSON_Delete(r);
        cJSON *j = call(m, "GET", "/v1/job", NULL, NULL, 0, &st);
        FUZZ_ASSERT(st == 200 && cJSON_IsObject(j));
        cJSON_Delete(j);
    }
    adt_master_free(m);
    return 0;
}
