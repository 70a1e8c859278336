/*
 * test_elastic_pipe.c - the worker client's request thread (adt_elastic_pipe_*: leases asked
 * ahead, reports queued behind) against a real master on a loopback port.
 *
 * Ordering: two replicas run 20 steps the way `adtrain train` does (the next step's lease asked
 * for once both hold this step's, the report queued, every 5th step drained and committed by a
 * third client). Each step's leased positions must be exactly the step's positions of the
 * sampler's order ([B(s-1), Bs), the identity order), the prefetched lease must be the one
 * returned (no second grant), and the ledger's audit - an independent replay of the report
 * and commit events - must find every committed step complete (B samples, none twice). What
 * the drain guards against is shown to fail: a commit while one replica's report of the step is
 * unsent is refused by the ledger.
 *
 * One call per step: the pipe sends a report and the lease asked after it as one call
 * (POST /v1/data/step); the master's counters show it did, and that each report and each lease
 * was one call either way. The combined call itself: the report applied first, a retry of a
 * call whose reply was lost answered as a duplicate with the same lease handed out again, a
 * refused report leasing nothing, and a malformed lease part refused before the report counts.
 *
 * Fencing: a report queued after the generation ended (a rank failure) is refused as stale;
 * the refusal comes back from the next call (drain, report, lease, prefetch), every one of them,
 * and the ledger holds no report of that step.
 */
#include "check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "adtrain/ledger.h"

#define B 8
#define STEPS 20

static int call(adt_master *m, const char *method, const char *path, const char *body, char **out) {
    adt_http_request rq = {.method = method, .path = path, .body = body, .body_len = body ? strlen(body) : 0};
    adt_http_reply rp;
    adt_master_handle(m, &rq, &rp);
    *out = rp.body;
    return rp.status;
}

static adt_ledger_job g_job = {.samples = 480, .seed = 7, .shuffle = 0, .global_batch = B, .shard_size = 32,
                               .epochs = 1, .max_leases = 4, .max_failures = 3, .lease_timeout_s = 60};

/* A master of job directory dir (600 bytes: tmp/tag) serving on a loopback port (addr, 64
 * bytes) with a world of `slots` ranks in generation 1, one replica per rank; *agent is the
 * agent's id. */
static adt_master *master_up(const char *tag, int slots, char *dir, char *addr, long *agent) {
    snprintf(dir, 600, "%s", check_tmp_path(tag));
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = dir, .listen = "127.0.0.1:0", .max_wait_ms = 100, .join_wait_s = -1,
                             .heartbeat_s = 60, .data = &g_job, .ranks_per_replica = 1,
                             .ledger_flags = ADT_LEDGER_NOSYNC};
    if (adt_master_create(&m, &cfg) || adt_master_start(m)) {
        CHECK(0, "master: %s", adt_error_message());
        adt_master_free(m);
        return NULL;
    }
    char body[160], *out = NULL;
    snprintf(body, sizeof body, "{\"node\":\"n0\",\"host\":\"h0\",\"slots\":%d,\"pid\":%d}", slots, (int)getpid());
    int st = call(m, "POST", "/v1/agents", body, &out);
    const char *id = out ? strstr(out, "\"agent\":") : NULL;
    *agent = id ? strtol(id + 8, NULL, 10) : -1;
    CHECK(st == 200 && *agent >= 0, "register: %d %s", st, out ? out : "");
    free(out);
    CHECK(call(m, "GET", "/v1/job", NULL, &out) == 200 && out && strstr(out, "\"generation\":1"),
          "generation 1 did not form: %s", out ? out : "");
    free(out);
    snprintf(addr, 64, "127.0.0.1:%d", adt_master_port(m));
    return m;
}

static adt_elastic *client(const char *addr, int replica) {
    adt_elastic *c = NULL;
    adt_elastic_config cfg = {.master = addr, .generation = 1, .replica = replica, .timeout_s = 10};
    CHECK(adt_elastic_open(&c, &cfg) == 0, "client: %s", adt_error_message());
    return c;
}

static int cmp_i64(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int audit(const char *dir, adt_ledger_audit *a) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, ADT_LEDGER_FILE);
    adt_ledger *L = NULL;
    int rc = adt_ledger_open(&L, path, ADT_LEDGER_READONLY);
    if (!rc) rc = adt_ledger_audit_run(L, a);
    adt_ledger_close(L);
    return rc;
}

/* Leases the ledger of job directory dir ever granted; -1 when it cannot be read. */
static int64_t leases_granted(const char *dir) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, ADT_LEDGER_FILE);
    adt_ledger *L = NULL;
    adt_ledger_lease *all = NULL;
    int64_t n = -1;
    if (adt_ledger_open(&L, path, ADT_LEDGER_READONLY) || adt_ledger_leases(L, 0, &all, &n)) {
        fprintf(stderr, "leases of %s: %s\n", path, adt_error_message());
        n = -1;
    }
    free(all);
    adt_ledger_close(L);
    return n;
}

/* adtrain_data_calls_total{call="NAME"} from the master's /metrics; -1 when absent. */
static long data_calls(adt_master *m, const char *name) {
    char *out = NULL, key[64];
    long v = -1;
    snprintf(key, sizeof key, "adtrain_data_calls_total{call=\"%s\"} ", name);
    if (call(m, "GET", "/metrics", NULL, &out) == 200 && out && strstr(out, key)) v = strtol(strstr(out, key) + strlen(key), NULL, 10);
    free(out);
    return v;
}

/* The integer after "key": in text (the first one), or -1. */
static long json_num(const char *text, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\":", key);
    const char *p = text ? strstr(text, k) : NULL;
    return p ? strtol(p + strlen(k), NULL, 10) : -1;
}

static void test_order_and_commits(void) {
    char dir[600], addr[64];
    long agent;
    adt_master *m = master_up("order", 2, dir, addr, &agent);
    if (!m) return;
    adt_elastic *c[2] = {client(addr, 0), client(addr, 1)}, *cc = client(addr, 0);
    adt_elastic_pipe *p[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++) CHECK(c[r] && adt_elastic_pipe_start(&p[r], c[r]) == 0, "pipe: %s", adt_error_message());
    if (check_cur_failed) goto out;
    for (int s = 1; s <= STEPS && !check_cur_failed; s++) {
        adt_ledger_lease ls[2];
        int64_t pos[B], k = 0;
        for (int r = 0; r < 2; r++) {
            int grant;
            int rc = adt_elastic_pipe_lease(p[r], B / 2, &ls[r], &grant);
            CHECK(rc == 0 && grant == ADT_LEDGER_GRANTED && ls[r].end - ls[r].cursor == B / 2,
                  "step %d replica %d: lease rc %d grant %d (%s)", s, r, rc, grant, adt_error_message());
            if (check_cur_failed) break;
            for (int64_t q = ls[r].cursor; q < ls[r].end && k < B; q++) pos[k++] = q;
        }
        if (check_cur_failed) break;
        qsort(pos, (size_t)k, sizeof *pos, cmp_i64);
        int in_order = k == B;
        for (int64_t i = 0; i < k; i++) in_order &= pos[i] == (int64_t)(s - 1) * B + i;
        CHECK(in_order, "step %d: the leased positions are not [%d, %d) (first %lld)", s, (s - 1) * B, s * B,
              (long long)pos[0]);
        for (int r = 0; r < 2; r++)
            if (s < STEPS) CHECK(adt_elastic_pipe_prefetch(p[r], B / 2) == 0, "prefetch: %s", adt_error_message());
        for (int r = 0; r < 2; r++) {
            adt_ledger_range rg = {ls[r].id, ls[r].cursor, ls[r].end};
            CHECK(adt_elastic_pipe_report(p[r], s - 1, &rg, 1) == 0, "step %d report: %s", s, adt_error_message());
        }
        if (s % 5 == 0) {
            for (int r = 0; r < 2; r++) CHECK(adt_elastic_pipe_drain(p[r]) == 0, "drain: %s", adt_error_message());
            char name[32];
            snprintf(name, sizeof name, "c-%d", s);
            CHECK(adt_elastic_commit(cc, s, name) == 0, "commit %d: %s", s, adt_error_message());
        }
    }
    for (int r = 0; r < 2; r++) {
        adt_elastic_pipe_free(p[r]);
        p[r] = NULL;
    }
    /* a lease asked ahead is the one handed over: the ledger granted one lease per replica and
     * step, no more */
    int64_t n_all = leases_granted(dir);
    CHECK(n_all == 2 * STEPS, "%lld leases granted for %d steps of 2 replicas", (long long)n_all, STEPS);
    /* each report and each lease went in one call, most of them sharing one */
    long n_lease = data_calls(m, "lease"), n_report = data_calls(m, "report"), n_step = data_calls(m, "step");
    CHECK(n_step >= 1 && n_report + n_step == 2 * STEPS && n_lease + n_step == 2 * STEPS,
          "data calls: %ld leases, %ld reports, %ld both in one; expected %d of each in all, some in one", n_lease,
          n_report, n_step, 2 * STEPS);
    adt_ledger_audit a;
    memset(&a, 0, sizeof a);
    CHECK(audit(dir, &a) == 0, "audit: %s", adt_error_message());
    CHECK(a.ok && a.committed_steps == STEPS && a.replayed_steps == STEPS && a.steps_bad == 0 &&
          a.reports == 2 * STEPS && a.n_epochs == 1 && a.epoch[0].trained == (int64_t)STEPS * B &&
          a.epoch[0].duplicated == 0 && a.epoch[0].missing == 0,
          "audit after %d pipelined steps: ok %d, committed %lld (replayed %lld), bad steps %lld, reports %lld, "
          "trained %lld", STEPS, a.ok, (long long)a.committed_steps, (long long)a.replayed_steps,
          (long long)a.steps_bad, (long long)a.reports, a.n_epochs ? (long long)a.epoch[0].trained : -1LL);
    adt_ledger_audit_free(&a);

    /* What the drain before a commit protects: a commit that overtakes a report (replica 1's
     * report of step 21 not sent) is refused by the ledger, and the audit stays clean. */
    adt_ledger_lease ls[2];
    int grant[2];
    for (int r = 0; r < 2; r++)
        CHECK(adt_elastic_lease(c[r], B / 2, &ls[r], &grant[r]) == 0 && grant[r] == ADT_LEDGER_GRANTED, "lease: %s",
              adt_error_message());
    adt_ledger_range rg = {ls[0].id, ls[0].cursor, ls[0].end};
    CHECK(adt_elastic_report(c[0], STEPS, &rg, 1) == 0, "report: %s", adt_error_message());
    CHECK(adt_elastic_commit(cc, STEPS + 1, "c-overtaken") == ADT_ERR_ARG &&
          strstr(adt_error_message(), "expected the global batch"),
          "a commit of step %d before replica 1's report: %s", STEPS + 1, adt_error_message());
    rg = (adt_ledger_range){ls[1].id, ls[1].cursor, ls[1].end};
    CHECK(adt_elastic_report(c[1], STEPS, &rg, 1) == 0 && adt_elastic_commit(cc, STEPS + 1, "c-21") == 0,
          "step %d once both reported: %s", STEPS + 1, adt_error_message());
    memset(&a, 0, sizeof a);
    CHECK(audit(dir, &a) == 0, "audit: %s", adt_error_message());
    CHECK(a.ok && a.committed_steps == STEPS + 1 && a.steps_bad == 0, "audit after step %d: ok %d, committed %lld",
          STEPS + 1, a.ok, (long long)a.committed_steps);
    adt_ledger_audit_free(&a);
out:
    for (int r = 0; r < 2; r++) {
        adt_elastic_pipe_free(p[r]);
        adt_elastic_close(c[r]);
    }
    adt_elastic_close(cc);
    adt_master_free(m);
}

static void test_step_call(void) {
    char dir[600], addr[64], body[300], *out = NULL;
    long agent;
    adt_master *m = master_up("step", 1, dir, addr, &agent);
    if (!m) return;
    int st = call(m, "POST", "/v1/data/lease", "{\"generation\":1,\"replica\":0,\"max_samples\":4}", &out);
    long l1 = json_num(out, "id");
    CHECK(st == 200 && l1 > 0 && json_num(out, "start") == 0, "first lease: %d %s", st, out ? out : "");
    free(out);
    /* a malformed lease part: refused before the report is applied */
    snprintf(body, sizeof body,
             "{\"generation\":1,\"replica\":0,\"step\":0,\"ranges\":[[%ld,0,4]],\"max_samples\":4,\"held\":%ld}",
             l1, l1);
    st = call(m, "POST", "/v1/data/step", body, &out);
    CHECK(st == 400 && out && strstr(out, "'held'"), "a step call whose held is no array: %d %s", st,
          out ? out : "");
    free(out);
    /* report [0, 4) of lease 1 at step 0 and lease the next 4 */
    snprintf(body, sizeof body,
             "{\"generation\":1,\"replica\":0,\"step\":0,\"ranges\":[[%ld,0,4]],\"max_samples\":4,\"held\":[%ld]}",
             l1, l1);
    st = call(m, "POST", "/v1/data/step", body, &out);
    long l2 = json_num(out, "id");
    CHECK(st == 200 && strstr(out, "\"ok\":true") && !strstr(out, "duplicate") && strstr(out, "\"granted\"") &&
              l2 > l1 && json_num(out, "start") == 4 && json_num(out, "end") == 8,
          "report and lease: %d %s", st, out ? out : "");
    free(out);
    /* the same call again (its reply lost): the report is a duplicate, the lease handed out again */
    st = call(m, "POST", "/v1/data/step", body, &out);
    CHECK(st == 200 && out && strstr(out, "\"duplicate\":true") && json_num(out, "id") == l2,
          "the call repeated: %d %s (lease %ld expected again)", st, out ? out : "", l2);
    free(out);
    /* a refused report (a range outside its lease) leases nothing */
    snprintf(body, sizeof body,
             "{\"generation\":1,\"replica\":0,\"step\":1,\"ranges\":[[%ld,4,12]],\"max_samples\":4,\"held\":[%ld]}",
             l2, l2);
    st = call(m, "POST", "/v1/data/step", body, &out);
    CHECK(st == 422 && out && strstr(out, "outside the lease") && !strstr(out, "grant"), "a bad report: %d %s", st,
          out ? out : "");
    free(out);
    int64_t n_all = leases_granted(dir);
    CHECK(n_all == 2, "%lld leases granted; expected 2 (the refused call granted none)", (long long)n_all);
    CHECK(data_calls(m, "step") == 2 && data_calls(m, "lease") == 1 && data_calls(m, "report") == 0,
          "data calls counted: step %ld, lease %ld, report %ld", data_calls(m, "step"), data_calls(m, "lease"),
          data_calls(m, "report"));
    adt_master_free(m);
}

static void test_stale_while_queued(void) {
    char dir[600], addr[64];
    long agent;
    adt_master *m = master_up("stale", 1, dir, addr, &agent);
    if (!m) return;
    adt_elastic *c = client(addr, 0);
    adt_elastic_pipe *p = NULL;
    CHECK(c && adt_elastic_pipe_start(&p, c) == 0, "pipe: %s", adt_error_message());
    if (check_cur_failed) goto out;
    adt_ledger_lease ls;
    int grant;
    CHECK(adt_elastic_pipe_lease(p, B, &ls, &grant) == 0 && grant == ADT_LEDGER_GRANTED, "lease: %s",
          adt_error_message());
    adt_ledger_range rg = {ls.id, ls.cursor, ls.cursor + B / 2};
    CHECK(adt_elastic_pipe_report(p, 0, &rg, 1) == 0 && adt_elastic_pipe_drain(p) == 0, "step 1: %s",
          adt_error_message());
    /* rank 0 fails: the generation ends while the next report is still to be queued */
    char body[200], *out = NULL;
    snprintf(body, sizeof body, "{\"agent\":%ld,\"kind\":\"rank_failed\",\"generation\":1,\"rank\":0,\"msg\":\"test\"}",
             agent);
    int st = call(m, "POST", "/v1/agents/event", body, &out);
    CHECK(st == 200, "rank_failed event: %d %s", st, out ? out : "");
    free(out);
    rg = (adt_ledger_range){ls.id, ls.cursor + B / 2, ls.end};
    CHECK(adt_elastic_pipe_report(p, 1, &rg, 1) == 0, "a report is queued without waiting for its reply: %s",
          adt_error_message());
    CHECK(adt_elastic_pipe_drain(p) == ADT_ERR_STALE, "drain after a stale report: %s", adt_error_message());
    CHECK(adt_elastic_pipe_report(p, 2, &rg, 1) == ADT_ERR_STALE, "a later report: %s", adt_error_message());
    CHECK(adt_elastic_pipe_lease(p, B, &ls, &grant) == ADT_ERR_STALE, "a later lease: %s", adt_error_message());
    CHECK(adt_elastic_pipe_prefetch(p, B) == ADT_ERR_STALE, "a later prefetch");
    CHECK(adt_elastic_pipe_status(p) == ADT_ERR_STALE, "status");
    adt_elastic_pipe_free(p);
    p = NULL;
    adt_ledger_audit a;
    memset(&a, 0, sizeof a);
    CHECK(audit(dir, &a) == 0, "audit: %s", adt_error_message());
    CHECK(a.reports == 1, "the ledger holds %lld reports; expected only step 1's", (long long)a.reports);
    adt_ledger_audit_free(&a);
out:
    adt_elastic_pipe_free(p);
    adt_elastic_close(c);
    adt_master_free(m);
}

int main(void) {
    if (check_tmpdir_make("elastic_pipe")) return 1;
    RUN(test_order_and_commits);
    RUN(test_step_call);
    RUN(test_stale_while_queued);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_tmpdir());
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", check_tmpdir());
    return check_finish();
}
