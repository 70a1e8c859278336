/*
 * fuzz_straggler.c - libFuzzer target for the straggler controller's inputs: the
 * "key=value,..." config (adt_straggler_cfg_parse), the master's POST /v1/straggler/report body,
 * and the monitor fed arbitrary timings.
 *
 * The input is split at its first NUL: the part before is the config, the rest the JSON body of
 * a report to an in-memory master (then the same bytes read as a stream of timings for a
 * monitor of 1..8 ranks). Whatever the bytes: no crash or leak; a refused config leaves the
 * config as it was and names a key or value; every reply is a JSON object, 4xx ones with an
 * "error"; a split the monitor returns always sums to what it was given, each part >= min_local.
 */
// Build and run: `make fuzz-smoke` (each target briefly, as CI does) or `sh scripts/fuzz.sh 600`.
#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "adtrain/straggler.h"

#include <cJSON.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"

static void fuzz_config(const char *spec) {
    adt_straggler_cfg c = adt_straggler_defaults(ADT_STRAGGLER_ND), before = c;
    if (adt_straggler_cfg_parse(&c, spec) != ADT_OK) {
        FUZZ_ASSERT(memcmp(&c, &before, sizeof c) == 0);
        FUZZ_ASSERT(adt_error_message()[0]);
    }
}

static void fuzz_report(adt_master *m, const char *body, size_t len) {
    adt_http_request rq = {.method = "POST", .path = "/v1/straggler/report", .body = body, .body_len = len};
    adt_http_reply rp;
    adt_master_handle(m, &rq, &rp);
    FUZZ_ASSERT(rp.status >= 200 && rp.status <= 599 && rp.body && strlen(rp.body) == rp.len);
    cJSON *j = cJSON_Parse(rp.body);
    FUZZ_ASSERT(cJSON_IsObject(j));
    if (rp.status >= 400 && rp.status < 500) FUZZ_ASSERT(cJSON_IsString(cJSON_GetObjectItemCaseSensitive(j, "error")));
    cJSON_Delete(j);
    adt_http_reply_free(&rp);
    rq.method = "GET", rq.path = "/v1/straggler", rq.body = NULL, rq.body_len = 0;
    adt_master_handle(m, &rq, &rp);
    FUZZ_ASSERT(rp.status == 200);
    j = cJSON_Parse(rp.body);
    FUZZ_ASSERT(cJSON_IsObject(j));
    cJSON_Delete(j);
    adt_http_reply_free(&rp);
}

static void fuzz_monitor(fuzz_input *in) {
    int n = 1 + (int)(fuzz_take(in) % 8);
    adt_straggler_cfg c = adt_straggler_defaults((adt_straggler_policy)(fuzz_take(in) % 3));
    c.warmup_steps = (int)(fuzz_take(in) % 4), c.cooldown = (int)(fuzz_take(in) % 8);
    c.dd_after = 1 + (int)(fuzz_take(in) % 4), c.nd_after = 1 + (int)(fuzz_take(in) % 3);
    adt_straggler *mon = adt_straggler_create(n, &c);
    FUZZ_ASSERT(mon);
    int64_t split[8], total = 0;
    for (int i = 0; i < n; i++) split[i] = 1 + fuzz_take(in) % 64, total += split[i];
    for (long step = 1; in->n && step < 200; step++) {
        double comp[8];
        int64_t samples[8];
        for (int i = 0; i < n; i++) {
            unsigned b = fuzz_take(in);
            comp[i] = b == 255 ? 0 : (double)(b + 1) * 1e-3 * (double)split[i];
            samples[i] = b == 254 ? 0 : split[i];
        }
        adt_straggler_action a;
        FUZZ_ASSERT(adt_straggler_observe(mon, step, (adt_straggler_phase)(fuzz_take(in) % ADT_PHASE_COUNT), comp,
                                          samples, split, 100, &a) == ADT_OK);
        int64_t sum = 0;
        for (int i = 0; i < n; i++) {
            FUZZ_ASSERT(split[i] >= 1);
            sum += split[i];
        }
        FUZZ_ASSERT(sum == total);
    }
    adt_straggler_free(mon);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int once;
    if (!once) adt_log_set_level(ADT_LOG_ERROR), once = 1;
    const uint8_t *nul = memchr(data, 0, size);
    size_t cut = nul ? (size_t)(nul - data) : size;
    char *spec = malloc(cut + 1);
    memcpy(spec, data, cut), spec[cut] = 0;
    fuzz_config(spec);
    free(spec);
    const char *body = (const char *)data + (nul ? cut + 1 : size);
    size_t len = nul ? size - cut - 1 : 0;
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = ":memory:", .max_wait_ms = -1, .straggler_policy = "nd",
                             .straggler_config = "warmup=0,nd_after=1,cooldown=0"};
    FUZZ_ASSERT(adt_master_create(&m, &cfg) == ADT_OK);
    fuzz_report(m, body, len);
    fuzz_report(m, body, len); /* twice: the second one meets the monitor the first one made */
    adt_master_free(m);
    fuzz_input in = {(const uint8_t *)body, len};
    fuzz_monitor(&in);
    return 0;
}
