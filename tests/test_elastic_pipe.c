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
static adt_master *master_up_policy(const char *tag, int slots, char *dir, char *addr, long *agent,
                                   const char *policy, const char *config, int fresh) {
    snprintf(dir, 600, "%s", check_tmp_path(tag));
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = dir, .listen = "127.0.0.1:0", .max_wait_ms = 100, .join_wait_s = -1,
                             .heartbeat_s = 60, .data = &g_job, .ranks_per_replica = 1,
                             .ledger_flags = ADT_LEDGER_NOSYNC, .straggler_policy = policy,
                             .straggler_config = config, .max_restarts = policy ? 3 : 0 /* the split's test fails once */};
    if (!fresh) { /* a restarted master: it resumes the state, nothing to register */
        if (adt_master_create(&m, &cfg) || adt_master_start(m)) {
            CHECK(0, "master restart: %s", adt_error_message());
            adt_master_free(m);
            return NULL;
        }
        snprintf(addr, 64, "127.0.0.1:%d", adt_master_port(m));
        return m;
    }
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

static adt_master *master_up(const char *tag, int slots, char *dir, char *addr, long *agent) {
    return master_up_policy(tag, slots, dir, addr, agent, NULL, NULL, 1);
}

static adt_elastic *client_gen(const char *addr, int replica, int64_t gen) {
    adt_elastic *c = NULL;
    adt_elastic_config cfg = {.master = addr, .generation = gen, .replica = replica, .timeout_s = 10};
    CHECK(adt_elastic_open(&c, &cfg) == 0, "client: %s", adt_error_message());
    return c;
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

/* ---- the split the master drives -------------------------------------------------------------
 * Two replicas, replica 1 three times slower per sample (its compute seconds say so). Under
 * --straggler-policy dd the master moves samples to replica 0. Checked on the workers' side of
 * the wire only: every step's local batches sum to the global batch (the replicas agree), the
 * local batch of step s is the one known from the reply to the replica's report of step s-3
 * (nobody switches late), each replica leases and reports exactly its local batch, the split
 * changes mid-epoch, a commit stores the split in force, and after a failure the next
 * generation resumes that split at the commit's step (replica 0 turns slow there, so the split
 * turns round), and after a master restart the split its workers follow, not the generation's
 * first. The ledger's audit then finds every sample trained once. */
#define SPLIT_STEPS (480 / B)
#define SPLIT_FAIL_AT 23 /* steps 20..22 are reported, then rank 1 fails: rewound to 20 */

typedef struct sim_replica {
    adt_elastic *c;
    adt_ledger_lease held[8];
    int n_held;
    int64_t known[SPLIT_STEPS + 8]; /* local batch of step s as known 3 reports earlier, -1 none */
} sim_replica;

/* Leases until `need` positions are held; the ranges that consume them go to rg. */
static int sim_take(sim_replica *r, int64_t need, adt_ledger_range *rg, int *n_rg) {
    *n_rg = 0;
    while (need > 0) {
        if (!r->n_held) {
            int grant;
            if (adt_elastic_lease(r->c, need, &r->held[0], &grant) || grant != ADT_LEDGER_GRANTED) return -1;
            r->n_held = 1;
        }
        adt_ledger_lease *l = &r->held[0];
        int64_t k = l->end - l->cursor < need ? l->end - l->cursor : need;
        rg[(*n_rg)++] = (adt_ledger_range){l->id, l->cursor, l->cursor + k};
        l->cursor += k, need -= k;
        if (l->cursor == l->end) r->n_held = 0;
    }
    return 0;
}

/* Runs steps [from, to) of generation gen; *changed counts steps whose split differs from the
 * step before's; split_at[s] records step s's split. */
static void sim_run(adt_master *m, sim_replica *rp, adt_elastic *cc, int64_t from, int64_t to, int64_t split_at[][2],
                    int *changed, int slow) {
    for (int64_t s = from; s < to && !check_cur_failed; s++) {
        int64_t stop = adt_elastic_stop_at(rp[0].c) > adt_elastic_stop_at(rp[1].c) ? adt_elastic_stop_at(rp[0].c)
                                                                                     : adt_elastic_stop_at(rp[1].c);
        if (stop > 0 && s >= stop) { /* a planned change: commit the steps so far and end */
            CHECK(s == stop && adt_elastic_commit(cc, stop, "c-stop") == 0, "the stop at step %lld (now %lld): %s",
                  (long long)stop, (long long)s, adt_error_message());
            return;
        }
        int64_t b[2];
        for (int r = 0; r < 2; r++) {
            b[r] = adt_elastic_local_batch(rp[r].c, s);
            CHECK(b[r] > 0, "step %lld replica %d: no split in the replies", (long long)s, r);
            if (rp[r].known[s] >= 0)
                CHECK(b[r] == rp[r].known[s], "step %lld replica %d: local batch %lld, but %lld was known 3 reports "
                      "earlier: it switched late", (long long)s, r, (long long)b[r], (long long)rp[r].known[s]);
        }
        CHECK(b[0] + b[1] == B, "step %lld: local batches %lld + %lld, expected the global batch %d", (long long)s,
              (long long)b[0], (long long)b[1], B);
        if (check_cur_failed) return;
        if (s > from && (b[0] != split_at[s - 1][0])) (*changed)++;
        split_at[s][0] = b[0], split_at[s][1] = b[1];
        for (int r = 0; r < 2; r++) {
            adt_ledger_range rg[8];
            int n;
            CHECK(sim_take(&rp[r], b[r], rg, &n) == 0, "step %lld replica %d: lease: %s", (long long)s, r,
                  adt_error_message());
            if (check_cur_failed) return;
            double per_sample = r == slow ? 3e-3 : 1e-3;
            CHECK(adt_elastic_report_compute(rp[r].c, s, rg, n, per_sample * (double)b[r]) == 0,
                  "step %lld replica %d: report: %s", (long long)s, r, adt_error_message());
            rp[r].known[s + 3] = adt_elastic_local_batch(rp[r].c, s + 3);
        }
        if ((s + 1) % 5 == 0) {
            char name[32];
            snprintf(name, sizeof name, "c-%lld", (long long)s + 1);
            CHECK(adt_elastic_commit(cc, s + 1, name) == 0, "commit %lld: %s", (long long)s + 1, adt_error_message());
        }
    }
    (void)m;
}

static void test_split(void) {
    char dir[600], addr[64], body[300], *out = NULL;
    long agent;
    adt_master *m = master_up_policy("split", 2, dir, addr, &agent, "dd", "warmup=1,first=2,dd_after=3,cooldown=6", 1);
    if (!m) return;
    sim_replica rp[2];
    memset(rp, 0, sizeof rp);
    for (int r = 0; r < 2; r++) {
        rp[r].c = client(addr, r);
        for (int s = 0; s < SPLIT_STEPS + 8; s++) rp[r].known[s] = -1;
    }
    adt_elastic *cc = client(addr, 0);
    int64_t split_at[SPLIT_STEPS + 8][2];
    int changed = 0;
    adt_elastic_info info;
    for (int r = 0; r < 2; r++)
        CHECK(adt_elastic_get_info(rp[r].c, &info) == 0 && info.have_split && adt_elastic_local_batch(rp[r].c, 0) == B / 2,
              "generation 1 starts even: %s", adt_error_message());
    sim_run(m, rp, cc, 0, SPLIT_FAIL_AT, split_at, &changed, 1);
    CHECK(changed >= 1 && split_at[SPLIT_FAIL_AT - 1][0] > split_at[0][0],
          "the split did not move to the fast replica: %lld:%lld at step 0, %lld:%lld at step %d (%d changes)",
          (long long)split_at[0][0], (long long)split_at[0][1], (long long)split_at[SPLIT_FAIL_AT - 1][0],
          (long long)split_at[SPLIT_FAIL_AT - 1][1], SPLIT_FAIL_AT - 1, changed);
    CHECK(call(m, "GET", "/v1/events", NULL, &out) == 200 && out && strstr(out, "straggler_action"),
          "no straggler_action event: %s", out ? out : "");
    free(out);
    /* the controller's view of speed: replica 0 about three times replica 1 */
    CHECK(call(m, "GET", "/v1/straggler", NULL, &out) == 200 && out && strstr(out, "\"local_batch\""),
          "straggler view: %s", out ? out : "");
    free(out);
    if (check_cur_failed) goto out;

    /* rank 1 fails after step 22: the next generation restores the commit of step 20 and the split
     * stored with it, and the master is restarted in between (kill -9 keeps nothing in memory) */
    snprintf(body, sizeof body, "{\"agent\":%ld,\"kind\":\"rank_failed\",\"generation\":1,\"rank\":1,\"msg\":\"test\"}",
             agent);
    CHECK(call(m, "POST", "/v1/agents/event", body, &out) == 200, "rank_failed: %s", out ? out : "");
    free(out);
    for (int r = 0; r < 2; r++) adt_elastic_close(rp[r].c);
    adt_elastic_close(cc);
    adt_master_free(m);
    m = master_up_policy("split", 2, dir, addr, &agent, "dd", "warmup=1,first=2,dd_after=3,cooldown=6", 0);
    if (!m) return;
    snprintf(body, sizeof body,
             "{\"agent\":%ld,\"seq\":100,\"generation\":1,\"running\":0,\"world_ok\":0}", agent);
    int st = call(m, "POST", "/v1/agents/heartbeat", body, &out);
    free(out);
    st = call(m, "GET", "/v1/job", NULL, &out);
    CHECK(st == 200 && out && strstr(out, "\"generation\":2") && strstr(out, "\"state\":\"running\""),
          "generation 2 did not form: %d %s", st, out ? out : "");
    free(out);
    if (check_cur_failed) return;
    memset(rp, 0, sizeof rp);
    for (int r = 0; r < 2; r++) {
        rp[r].c = client_gen(addr, r, 2);
        for (int s = 0; s < SPLIT_STEPS + 8; s++) rp[r].known[s] = -1;
    }
    cc = client_gen(addr, 0, 2);
    CHECK(adt_elastic_get_info(rp[0].c, &info) == 0 && info.committed_steps == 20, "generation 2 resumes at %lld",
          (long long)info.committed_steps);
    for (int r = 0; r < 2; r++) {
        adt_elastic_get_info(rp[r].c, &info);
        CHECK(adt_elastic_local_batch(rp[r].c, 20) == split_at[20][r],
              "replica %d resumes step 20 at local batch %lld; the commit's split had %lld", r,
              (long long)adt_elastic_local_batch(rp[r].c, 20), (long long)split_at[20][r]);
    }
    /* now replica 0 is the slow one: the split turns round */
    sim_run(m, rp, cc, 20, 40, split_at, &changed, 0);
    if (check_cur_failed) goto out;
    CHECK(split_at[39][1] > split_at[39][0], "step 39: split %lld:%lld; replica 0 is the slow one since step 20",
          (long long)split_at[39][0], (long long)split_at[39][1]);
    /* the master restarted mid-generation serves the split its workers follow, not the first */
    int64_t before[2] = {adt_elastic_local_batch(rp[0].c, 40), adt_elastic_local_batch(rp[1].c, 40)};
    for (int r = 0; r < 2; r++) adt_elastic_close(rp[r].c);
    adt_elastic_close(cc);
    adt_master_free(m);
    m = master_up_policy("split", 2, dir, addr, &agent, "dd", "warmup=1,first=2,dd_after=3,cooldown=6", 0);
    if (!m) return;
    for (int r = 0; r < 2; r++) rp[r].c = client_gen(addr, r, 2);
    cc = client_gen(addr, 0, 2);
    for (int r = 0; r < 2; r++) {
        adt_elastic_get_info(rp[r].c, &info);
        CHECK(adt_elastic_local_batch(rp[r].c, 40) == before[r], "replica %d: step 40's local batch %lld after a "
              "master restart, %lld before", r, (long long)adt_elastic_local_batch(rp[r].c, 40), (long long)before[r]);
    }
    sim_run(m, rp, cc, 40, SPLIT_STEPS, split_at, &changed, 0);
    if (check_cur_failed) goto out;
    adt_ledger_audit a;
    memset(&a, 0, sizeof a);
    CHECK(audit(dir, &a) == 0, "audit: %s", adt_error_message());
    CHECK(a.ok && a.committed_steps == SPLIT_STEPS && a.steps_bad == 0 && a.n_epochs == 1 &&
              a.epoch[0].trained == (int64_t)SPLIT_STEPS * B && a.epoch[0].duplicated == 0 &&
              a.epoch[0].missing == 0 && a.retrained == 3 * B,
          "audit: ok %d, committed %lld, bad steps %lld, trained %lld, duplicated %lld, missing %lld, retrained %lld "
          "(expected steps 20..22, %d samples)", a.ok, (long long)a.committed_steps, (long long)a.steps_bad,
          a.n_epochs ? (long long)a.epoch[0].trained : -1LL, a.n_epochs ? (long long)a.epoch[0].duplicated : -1LL,
          a.n_epochs ? (long long)a.epoch[0].missing : -1LL, (long long)a.retrained, 3 * B);
    adt_ledger_audit_free(&a);
out:
    for (int r = 0; r < 2; r++) adt_elastic_close(rp[r].c);
    adt_elastic_close(cc);
    adt_master_free(m);
}

/* ND's restart elsewhere acts through world generations: a persistent straggler's node is put
 * on the blacklist's cooldown, the generation stops at a step boundary (every step committed:
 * nothing trained twice), and the next world forms without that node, on the spare one. */
static int64_t register_agent(adt_master *m, const char *node) {
    char body[200], *out = NULL;
    snprintf(body, sizeof body, "{\"node\":\"%s\",\"host\":\"%s\",\"slots\":1,\"pid\":%d}", node, node,
             (int)getpid());
    int st = call(m, "POST", "/v1/agents", body, &out);
    long id = json_num(out, "agent");
    CHECK(st == 200 && id > 0, "register %s: %d %s", node, st, out ? out : "");
    free(out);
    return id;
}

static void test_nd_restart(void) {
    char dir[600], addr[64], body[300], *out = NULL;
    snprintf(dir, sizeof dir, "%s", check_tmp_path("nd"));
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = dir, .listen = "127.0.0.1:0", .max_wait_ms = 100, .join_wait_s = -1,
                             .heartbeat_s = 60, .data = &g_job, .ledger_flags = ADT_LEDGER_NOSYNC,
                             .nnodes_min = 2, .nnodes_max = 2, .cooldown_min_s = 300, .cooldown_max_s = 600,
                             .straggler_policy = "nd",
                             .straggler_config = "warmup=1,persist=2,nd_after=3,first=0,cooldown=4,restart_cost=0.001"};
    if (adt_master_create(&m, &cfg) || adt_master_start(m)) {
        CHECK(0, "master: %s", adt_error_message());
        adt_master_free(m);
        return;
    }
    snprintf(addr, sizeof addr, "127.0.0.1:%d", adt_master_port(m));
    int64_t a = register_agent(m, "a"), b = register_agent(m, "b");
    CHECK(call(m, "GET", "/v1/job", NULL, &out) == 200 && out && strstr(out, "\"generation\":1"), "generation 1: %s",
          out ? out : "");
    free(out);
    int64_t c_agent = register_agent(m, "c"); /* a spare: nnodes_max 2 leaves it out */
    sim_replica rp[2];
    memset(rp, 0, sizeof rp);
    for (int r = 0; r < 2; r++) {
        rp[r].c = client(addr, r);
        for (int k = 0; k < SPLIT_STEPS + 8; k++) rp[r].known[k] = -1;
    }
    adt_elastic *cc = client(addr, 0);
    int64_t split_at[SPLIT_STEPS + 8][2];
    int changed = 0;
    adt_elastic_info info;
    for (int r = 0; r < 2; r++) /* a worker's first call: the info, the split with it */
        CHECK(adt_elastic_get_info(rp[r].c, &info) == 0 && info.have_split, "info: %s", adt_error_message());
    sim_run(m, rp, cc, 0, 40, split_at, &changed, 1); /* rank 1 (node b) three times slower */
    int64_t stop = adt_elastic_stop_at(rp[0].c);
    CHECK(stop > 0 && stop < 40, "ND asked no stop for the persistent straggler (stop_at %lld)", (long long)stop);
    CHECK(call(m, "GET", "/v1/events", NULL, &out) == 200 && out && strstr(out, "restart elsewhere") &&
              strstr(out, "node b left out"),
          "events: %s", out ? out : "");
    free(out);
    for (int r = 0; r < 2; r++) adt_elastic_close(rp[r].c);
    adt_elastic_close(cc);
    if (check_cur_failed) goto out;
    /* the workers committed at the stop and exited 0: the agents say so */
    int64_t ids[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        snprintf(body, sizeof body, "{\"agent\":%lld,\"seq\":50,\"generation\":1,\"running\":0,\"world_ok\":1}",
                 (long long)ids[i]);
        CHECK(call(m, "POST", "/v1/agents/heartbeat", body, &out) == 200, "heartbeat: %s", out ? out : "");
        free(out);
    }
    CHECK(call(m, "GET", "/v1/job", NULL, &out) == 200 && out && strstr(out, "\"generation\":2") &&
              strstr(out, "\"planned_changes\":1") && strstr(out, "\"restarts\":0"),
          "generation 2 (a planned change): %s", out ? out : "");
    free(out);
    CHECK(call(m, "GET", "/v1/agents", NULL, &out) == 200 && out, "agents");
    /* the world of generation 2: agents a and c */
    char *gen_ev = NULL;
    char want[64];
    snprintf(want, sizeof want, "on a:1,c:1, from step %lld", (long long)stop);
    CHECK(call(m, "GET", "/v1/events", NULL, &gen_ev) == 200 && gen_ev && strstr(gen_ev, want),
          "generation 2 is not on nodes a and c from step %lld", (long long)stop);
    free(gen_ev);
    free(out);
    (void)c_agent;
    memset(rp, 0, sizeof rp);
    for (int r = 0; r < 2; r++) {
        rp[r].c = client_gen(addr, r, 2);
        for (int k = 0; k < SPLIT_STEPS + 8; k++) rp[r].known[k] = -1;
    }
    cc = client_gen(addr, 0, 2);
    for (int r = 0; r < 2; r++)
        CHECK(adt_elastic_get_info(rp[r].c, &info) == 0 && info.committed_steps == stop,
              "generation 2 resumes at %lld", (long long)info.committed_steps);
    sim_run(m, rp, cc, stop, SPLIT_STEPS, split_at, &changed, -1);
    for (int r = 0; r < 2; r++) adt_elastic_close(rp[r].c);
    adt_elastic_close(cc);
    adt_ledger_audit au;
    memset(&au, 0, sizeof au);
    CHECK(audit(dir, &au) == 0, "audit: %s", adt_error_message());
    CHECK(au.ok && au.committed_steps == SPLIT_STEPS && au.steps_bad == 0 && au.retrained == 0 && au.n_epochs == 1 &&
              au.epoch[0].trained == (int64_t)SPLIT_STEPS * B && au.epoch[0].duplicated == 0,
          "audit: ok %d, committed %lld, bad steps %lld, retrained %lld (a planned change loses nothing)", au.ok,
          (long long)au.committed_steps, (long long)au.steps_bad, (long long)au.retrained);
    adt_ledger_audit_free(&au);
out:
    adt_master_free(m);
}

/* Re-planning on measured speeds: the plan_world hook of a new world gets the samples/s each
 * device was measured at (from the compute times of the step reports), and a plan's
 * batch_split is the split the new world starts from when the commit's split does not fit it
 * (another number of replicas). */
typedef struct hook_seen {
    int calls, world;
    double speed[8];
    int have_speed;
} hook_seen;

static int test_plan_hook(void *ctx, const adt_world_shape *w, adt_world_plan *out) {
    hook_seen *h = ctx;
    h->calls++;
    h->world = w->world;
    h->have_speed = w->speed != NULL;
    for (int i = 0; i < w->world && i < 8; i++) h->speed[i] = w->speed ? w->speed[i] : 0;
    /* a plan text of our own with the split a planner would make: 3 replicas, 8 samples */
    out->json = adt_strdup("{\"strategy\":\"dp\",\"batch_split\":[4,1,3]}");
    snprintf(out->strategy, sizeof out->strategy, "dp");
    snprintf(out->mesh, sizeof out->mesh, "(%d)", w->world);
    if (w->world == 3) {
        out->batch_split = adt_calloc(3, sizeof *out->batch_split);
        out->batch_split[0] = 4, out->batch_split[1] = 1, out->batch_split[2] = 3;
        out->n_split = 3;
    }
    return 0;
}

static void test_replan_speeds(void) {
    char dir[600], addr[64], body[300], *out = NULL;
    snprintf(dir, sizeof dir, "%s", check_tmp_path("speeds"));
    hook_seen h;
    memset(&h, 0, sizeof h);
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = dir, .listen = "127.0.0.1:0", .max_wait_ms = 100, .join_wait_s = -1,
                             .heartbeat_s = 60, .data = &g_job, .ledger_flags = ADT_LEDGER_NOSYNC,
                             .straggler_policy = "dd", .straggler_config = "warmup=1,first=2,dd_after=3,cooldown=6",
                             .plan_world = test_plan_hook, .plan_ctx = &h};
    if (adt_master_create(&m, &cfg) || adt_master_start(m)) {
        CHECK(0, "master: %s", adt_error_message());
        adt_master_free(m);
        return;
    }
    snprintf(addr, sizeof addr, "127.0.0.1:%d", adt_master_port(m));
    snprintf(body, sizeof body, "{\"node\":\"a\",\"host\":\"a\",\"slots\":2,\"pid\":%d}", (int)getpid());
    CHECK(call(m, "POST", "/v1/agents", body, &out) == 200, "register: %s", out ? out : "");
    long a = json_num(out, "agent");
    free(out);
    CHECK(h.calls == 1 && h.world == 2 && !h.have_speed, "the first world's hook: %d calls, world %d, speeds %d",
          h.calls, h.world, h.have_speed);
    sim_replica rp[2];
    memset(rp, 0, sizeof rp);
    adt_elastic_info info;
    for (int r = 0; r < 2; r++) {
        rp[r].c = client(addr, r);
        for (int k = 0; k < SPLIT_STEPS + 8; k++) rp[r].known[k] = -1;
        CHECK(adt_elastic_get_info(rp[r].c, &info) == 0, "info: %s", adt_error_message());
    }
    adt_elastic *cc = client(addr, 0);
    int64_t split_at[SPLIT_STEPS + 8][2];
    int changed = 0;
    sim_run(m, rp, cc, 0, 10, split_at, &changed, 1);
    /* a node joins: a planned change at a step boundary, then a world of 3 */
    register_agent(m, "c");
    sim_run(m, rp, cc, 10, 30, split_at, &changed, 1);
    int64_t stop = adt_elastic_stop_at(rp[0].c);
    CHECK(stop > 10 && stop < 30, "the join asked no stop (stop_at %lld)", (long long)stop);
    for (int r = 0; r < 2; r++) adt_elastic_close(rp[r].c);
    adt_elastic_close(cc);
    if (check_cur_failed) goto out;
    snprintf(body, sizeof body, "{\"agent\":%ld,\"seq\":50,\"generation\":1,\"running\":0,\"world_ok\":1}", a);
    CHECK(call(m, "POST", "/v1/agents/heartbeat", body, &out) == 200, "heartbeat: %s", out ? out : "");
    free(out);
    CHECK(h.calls == 2 && h.world == 3 && h.have_speed, "the second world's hook: %d calls, world %d, speeds %d",
          h.calls, h.world, h.have_speed);
    /* rank 1 took three times as long per sample; rank 2's device was never measured */
    double ratio = h.speed[1] > 0 ? h.speed[0] / h.speed[1] : 0;
    CHECK(ratio > 2.7 && ratio < 3.3 && h.speed[2] == 0, "speeds passed to the hook: %g %g %g (ratio %g, expected 3)",
          h.speed[0], h.speed[1], h.speed[2], ratio);
    adt_elastic *c2 = client_gen(addr, 0, 2);
    CHECK(c2 && adt_elastic_get_info(c2, &info) == 0 && info.committed_steps == stop && info.replicas == 3,
          "generation 2: %s", adt_error_message());
    int64_t sp[3] = {0, 0, 0};
    CHECK(adt_elastic_split(c2, stop, sp, 3) == 3 && sp[0] == 4 && sp[1] == 1 && sp[2] == 3,
          "generation 2 starts at the plan's batch_split [4,1,3]: [%lld,%lld,%lld]", (long long)sp[0], (long long)sp[1],
          (long long)sp[2]);
    adt_elastic_close(c2);
out:
    adt_master_free(m);
}

int main(void) {
    if (check_tmpdir_make("elastic_pipe")) return 1;
    RUN(test_replan_speeds);
    RUN(test_split);
    RUN(test_nd_restart);
    RUN(test_order_and_commits);
    RUN(test_step_call);
    RUN(test_stale_while_queued);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_tmpdir());
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", check_tmpdir());
    return check_finish();
}
