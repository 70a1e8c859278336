/*
 * test_dashboard.c - the master's straggler endpoints and its dashboard page.
 *
 * The endpoints through adt_master_handle (no socket): a world of two ranks where rank 1 turns
 * three times slower must get a rebalance from a DD master whose split matches
 * adt_straggler_split of the measured speeds; reports of another generation are refused (409),
 * malformed ones name the field (400); GET /v1/straggler shows states, actions and the loss. Idle
 * replicas (parameter servers) take no part in a world's split.
 *
 * The page in a real headless Chromium (Debian's `chromium`, scripts/install-deps.sh): the
 * master serves on a loopback port, the browser loads /dashboard, runs its JavaScript against
 * the JSON endpoints, and the DOM it dumps must hold what the endpoints said (the run id, both
 * ranks with their states, the action, the loss curve drawn as a path). A screenshot is kept as
 * an artefact in the test's temp directory; its path is printed.
 */
#include "check.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "adtrain/straggler.h"

static int call(adt_master *m, const char *method, const char *path, const char *body, char **out) {
    adt_http_request rq = {.method = method, .path = path, .body = body, .body_len = body ? strlen(body) : 0};
    adt_http_reply rp;
    adt_master_handle(m, &rq, &rp);
    *out = rp.body;
    return rp.status;
}

/* Steps 1..steps of two ranks of generation gen, rank 1 taking slow x as long per sample from
 * step 6 on; the master's split is fed back. Returns the step of the first action (-1: none). */
static long feed_gen(adt_master *m, int gen, int steps, double slow, int64_t split[2], char *last_action, size_t n) {
    long first = -1;
    for (int s = 1; s <= steps; s++) {
        double per[2] = {1e-3, s >= 6 ? slow * 1e-3 : 1e-3};
        char body[512], *out = NULL;
        snprintf(body, sizeof body, "{\"generation\":%d,\"step\":%d,\"loss\":%g,\"remaining_steps\":%d,"
                 "\"compute_s\":[%g,%g],\"samples\":[%lld,%lld],\"split\":[%lld,%lld]}", gen, s, 2.0 / (1 + 0.1 * s),
                 1000 - s, per[0] * (double)split[0], per[1] * (double)split[1], (long long)split[0],
                 (long long)split[1], (long long)split[0], (long long)split[1]);
        int st = call(m, "POST", "/v1/straggler/report", body, &out);
        CHECK(st == 200, "step %d: %d %s", s, st, out ? out : "");
        long a = 0, b = 0;
        const char *p = out ? strstr(out, "\"split\":[") : NULL;
        if (p && sscanf(p + 9, "%ld,%ld", &a, &b) == 2) split[0] = a, split[1] = b;
        if (out && !strstr(out, "\"action\":null")) {
            if (first < 0) first = s;
            snprintf(last_action, n, "%s", out);
        }
        free(out);
    }
    return first;
}

static long feed(adt_master *m, int steps, double slow, int64_t split[2], char *last_action, size_t n) {
    return feed_gen(m, 0, steps, slow, split, last_action, n);
}

/* ND with a world of two agents: a persistent straggler whose restart pays (cost 0.5 s against
 * 1000 remaining steps) has its node put on cooldown and the generation ended at once (no
 * ledger: nothing to stop at a step boundary). */
static void test_nd_restart_in_a_world(void) {
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = ":memory:", .max_wait_ms = 100, .nnodes_min = 2, .join_wait_s = -1,
                             .straggler_policy = "nd",
                             .straggler_config = "warmup=0,persist=3,restart_cost=0.5,cooldown=0"};
    CHECK(adt_master_create(&m, &cfg) == 0, "%s", adt_error_message());
    if (!m) return;
    char *out = NULL;
    const char *reg[2] = {"{\"node\":\"n0\",\"host\":\"h0\",\"slots\":1,\"pid\":101}",
                          "{\"node\":\"n1\",\"host\":\"h1\",\"slots\":1,\"pid\":102}"};
    for (int i = 0; i < 2; i++) {
        CHECK(call(m, "POST", "/v1/agents", reg[i], &out) == 200, "register: %s", out ? out : "");
        free(out);
    }
    CHECK(call(m, "GET", "/v1/job", NULL, &out) == 200 && strstr(out, "\"generation\":1") &&
          strstr(out, "\"world_size\":2") && strstr(out, "\"state\":\"running\""), "the world of two: %s", out);
    free(out);
    CHECK(call(m, "GET", "/v1/workers", NULL, &out) == 200, "workers");
    /* which node runs rank 1 */
    const char *r1 = out ? strstr(out, "\"rank\":1,") : NULL, *node = r1 ? strstr(r1, "\"node\":\"") : NULL;
    char slow_node[8] = "?";
    if (node) snprintf(slow_node, sizeof slow_node, "%.2s", node + 8);
    free(out);
    int64_t split[2] = {32, 32};
    char act[4096] = "";
    long first = feed_gen(m, 1, 12, 3.0, split, act, sizeof act);
    CHECK(first > 0 && strstr(act, "\"kind\":\"restart\"") && strstr(act, "\"applied\":true") &&
          strstr(act, "\"rank\":1"), "no applied restart of rank 1 (first action at %ld): %s", first, act);
    CHECK(call(m, "GET", "/v1/events", NULL, &out) == 200 && out && strstr(out, "straggler") &&
          strstr(out, "left out"), "events: %s", out ? out : "");
    char want[64];
    snprintf(want, sizeof want, "node %s left out", slow_node);
    CHECK(out && strstr(out, want), "the event names rank 1's node %s: %s", slow_node, out ? out : "");
    free(out);
    CHECK(call(m, "GET", "/v1/job", NULL, &out) == 200 && out && !strstr(out, "\"state\":\"running\""),
          "the generation still runs: %s", out ? out : "");
    free(out);
    adt_master_free(m);
}

/* A master of cfg with one agent of `slots` registered (node n0): its world forms; NULL (a
 * failed check) if it could not be made. */
static adt_master *master_one_agent(const adt_master_config *cfg, int slots) {
    adt_master *m = NULL;
    CHECK(adt_master_create(&m, cfg) == 0, "%s", adt_error_message());
    if (!m) return NULL;
    char body[128], *out = NULL;
    snprintf(body, sizeof body, "{\"node\":\"n0\",\"host\":\"h0\",\"slots\":%d,\"pid\":101}", slots);
    CHECK(call(m, "POST", "/v1/agents", body, &out) == 200, "register: %s", out ? out : "");
    free(out);
    return m;
}

/* Idle replicas (a --mode ps job's servers) through adt_master_handle: a world of 4 ranks whose
 * data job declares 2 idle replicas gets a split [0, 0, b, b]; as many idle replicas as replicas
 * are refused naming idle_replicas (422), a later declaration that differs too, and a report's
 * malformed server_s names the field (400). */
static void test_idle_replicas(void) {
    adt_master_config cfg = {.job_dir = ":memory:", .max_wait_ms = 100, .join_wait_s = -1, .straggler_policy = "dd"};
    adt_master *m = master_one_agent(&cfg, 4);
    if (!m) return;
    char *out = NULL;
    const char *job = "\"job\":{\"samples\":640,\"global_batch\":32,\"shard_size\":64,\"epochs\":1}";
    char body[512];
    snprintf(body, sizeof body, "{\"generation\":1,\"replica\":0,\"idle_replicas\":4,%s}", job);
    int st = call(m, "POST", "/v1/data/init", body, &out);
    CHECK(st == 422 && out && strstr(out, "idle_replicas 4"), "4 idle of 4 replicas: %d %s", st, out ? out : "");
    free(out);
    snprintf(body, sizeof body, "{\"generation\":1,\"replica\":0,\"idle_replicas\":2,%s}", job);
    st = call(m, "POST", "/v1/data/init", body, &out);
    CHECK(st == 200 && out && strstr(out, "\"split\":[0,0,16,16]"), "2 idle of 4: %d %s", st, out ? out : "");
    free(out);
    snprintf(body, sizeof body, "{\"generation\":1,\"replica\":2,\"idle_replicas\":1,%s}", job);
    st = call(m, "POST", "/v1/data/init", body, &out);
    CHECK(st == 422 && out && strstr(out, "idle_replicas"), "a second declaration of 1 idle: %d %s", st, out ? out : "");
    free(out);
    st = call(m, "POST", "/v1/data/report",
              "{\"generation\":1,\"replica\":2,\"step\":0,\"ranges\":[[1,0,16]],\"server_s\":[0.1,\"x\"]}", &out);
    CHECK(st == 400 && out && strstr(out, "server_s"), "malformed server_s: %d %s", st, out ? out : "");
    free(out);
    adt_master_free(m);
}

/* The run's steps as the trainer declares them with the data job (run_steps, its --steps): the
 * whole run the master shows and ND prices a restart's gain over, where it is below the ledger's
 * job of whole epochs (640 samples of 32: 20 steps); above it, the ledger's; a negative count is
 * refused naming the field. */
static void test_run_steps(void) {
    adt_master_config cfg = {.job_dir = ":memory:", .max_wait_ms = 100, .join_wait_s = -1};
    adt_master *m = master_one_agent(&cfg, 2);
    if (!m) return;
    char *out = NULL;
    const char *job = "\"job\":{\"samples\":640,\"global_batch\":32,\"shard_size\":64,\"epochs\":1}";
    char body[512];
    snprintf(body, sizeof body, "{\"generation\":1,\"replica\":0,\"run_steps\":-3,%s}", job);
    int st = call(m, "POST", "/v1/data/init", body, &out);
    CHECK(st == 400 && out && strstr(out, "run_steps"), "run_steps -3: %d %s", st, out ? out : "");
    free(out);
    static const struct { int declared, shown; } cases[] = {{7, 7}, {50, 20}, {12, 12}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(body, sizeof body, "{\"generation\":1,\"replica\":0,\"run_steps\":%d,%s}", cases[i].declared, job);
        st = call(m, "POST", "/v1/data/init", body, &out);
        CHECK(st == 200, "run_steps %d: %d %s", cases[i].declared, st, out ? out : "");
        free(out);
        char want[64];
        snprintf(want, sizeof want, "\"total_steps\":%d", cases[i].shown);
        CHECK(call(m, "GET", "/v1/job", NULL, &out) == 200 && out && strstr(out, want),
              "run_steps %d: expected %s in %s", cases[i].declared, want, out ? out : "");
        free(out);
    }
    adt_master_free(m);
}

static void test_endpoints(void) {
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = ":memory:", .max_wait_ms = 100, .straggler_policy = "dd",
                             .straggler_config = "warmup=2,dd_after=3,cooldown=10"};
    CHECK(adt_master_create(&m, &cfg) == 0, "%s", adt_error_message());
    if (!m) return;
    int64_t split[2] = {32, 32};
    char act[4096] = "";
    long first = feed(m, 20, 3.0, split, act, sizeof act);
    CHECK(first == 7, "first action at step %ld, expected 7 (slow from 6: 2 of the last 3 steps)", first);
    int64_t want[2];
    adt_straggler_split(64, 2, (double[]){1.0, 1.0 / 3.0}, 1, want);
    CHECK(split[0] == want[0] && split[1] == want[1], "split %lld/%lld, expected %lld/%lld", (long long)split[0],
          (long long)split[1], (long long)want[0], (long long)want[1]);
    CHECK(strstr(act, "\"kind\":\"rebalance\"") && strstr(act, "\"rank\":1"), "action: %s", act);
    char *out = NULL;
    CHECK(call(m, "GET", "/v1/straggler", NULL, &out) == 200, "GET");
    CHECK(out && strstr(out, "\"policy\":\"dd\"") && strstr(out, "\"state\":\"persistent\"") &&
          strstr(out, "\"actions_total\":1") && strstr(out, "\"loss\":[[1,"), "GET /v1/straggler: %s", out);
    free(out);
    /* refusals */
    struct {
        const char *method, *body;
        int status;
        const char *expect;
    } bad[] = {
        {"POST", "{\"generation\":4,\"step\":1,\"compute_s\":[1],\"samples\":[1],\"split\":[1]}", 409, "generation 4"},
        {"POST", "{\"generation\":0,\"step\":0,\"compute_s\":[1],\"samples\":[1],\"split\":[1]}", 400, "'step'"},
        {"POST", "{\"generation\":0,\"step\":1,\"compute_s\":[1,-2],\"samples\":[1,1],\"split\":[1,1]}", 400, "'compute_s'"},
        {"POST", "{\"generation\":0,\"step\":1,\"compute_s\":[1,2],\"samples\":[1],\"split\":[1,1]}", 400, "'samples'"},
        {"POST", "{\"generation\":0,\"step\":1,\"compute_s\":[1],\"samples\":[1],\"split\":[1],\"phase\":\"x\"}", 400,
         "'phase'"},
        {"POST", "[1,2", 400, "expected a JSON object"},
        {"GET", NULL, 405, "not allowed"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        int st = call(m, bad[i].method, "/v1/straggler/report", bad[i].body, &out);
        CHECK(st == bad[i].status && out && strstr(out, bad[i].expect), "case %zu: %d %s", i, st, out ? out : "");
        free(out);
    }
    CHECK(call(m, "POST", "/v1/straggler", "{}", &out) == 405, "POST /v1/straggler");
    free(out);
    CHECK(call(m, "GET", "/dashboard", NULL, &out) == 200 && out && strstr(out, "<script>") &&
          strstr(out, "/v1/straggler"), "dashboard page");
    free(out);
    adt_master_free(m);
    /* a bad policy or config is refused at creation, naming the flag */
    adt_master_config c2 = {.job_dir = ":memory:", .straggler_policy = "fast"};
    CHECK(adt_master_create(&m, &c2) != 0 && strstr(adt_error_message(), "--straggler-policy"), "%s",
          adt_error_message());
    adt_master_config c3 = {.job_dir = ":memory:", .straggler_policy = "dd", .straggler_config = "cooldown=x"};
    CHECK(adt_master_create(&m, &c3) != 0 && strstr(adt_error_message(), "cooldown"), "%s", adt_error_message());
    /* a config that cannot act: no policy to configure */
    adt_master_config c4 = {.job_dir = ":memory:", .straggler_config = "cooldown=40"};
    CHECK(adt_master_create(&m, &c4) != 0 && strstr(adt_error_message(), "--straggler-config: only acts with"), "%s",
          adt_error_message());
    adt_master_config c5 = {.job_dir = ":memory:", .straggler_policy = "off", .straggler_config = "cooldown=40"};
    CHECK(adt_master_create(&m, &c5) != 0, "--straggler-config with policy off");
}

static int find_chromium(char *out, size_t n) {
    const char *names[] = {"chromium", "chromium-browser", "google-chrome", NULL};
    const char *path = getenv("PATH");
    for (int i = 0; names[i]; i++) {
        char buf[4096];
        snprintf(buf, sizeof buf, "%s", path ? path : "/usr/bin:/bin");
        for (char *d = strtok(buf, ":"); d; d = strtok(NULL, ":")) {
            snprintf(out, n, "%s/%s", d, names[i]);
            if (access(out, X_OK) == 0) return 1;
        }
    }
    return 0;
}

static char *slurp_cmd(const char *cmd) {
    FILE *p = popen(cmd, "r");
    if (!p) return NULL;
    size_t cap = 1 << 16, k = 0, got;
    char *buf = malloc(cap);
    while ((got = fread(buf + k, 1, cap - 1 - k, p)) > 0) {
        k += got;
        if (k + 1 >= cap) buf = realloc(buf, cap *= 2);
    }
    buf[k] = 0;
    pclose(p);
    return buf;
}

static void test_page_in_chromium(void) {
    char chrome[1024];
    CHECK(find_chromium(chrome, sizeof chrome), "no chromium on PATH; install it with scripts/install-deps.sh "
          "(Debian package 'chromium')");
    if (check_cur_failed) return;
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = ":memory:", .listen = "127.0.0.1:0", .max_wait_ms = 100,
                             .straggler_policy = "nd", .straggler_config = "warmup=2,nd_after=3,cooldown=10",
                             .run_id = "dash-test-run"};
    CHECK(adt_master_create(&m, &cfg) == 0 && adt_master_start(m) == 0, "%s", adt_error_message());
    if (check_cur_failed) return;
    int64_t split[2] = {32, 32};
    char act[4096];
    feed(m, 30, 3.0, split, act, sizeof act);
    int port = adt_master_port(m);
    char shot[512], cmd[4096], profile[512];
    snprintf(shot, sizeof shot, "%s", check_tmp_path("dashboard.png"));
    snprintf(profile, sizeof profile, "%s", check_tmp_path("chromium-profile"));
    /* --virtual-time-budget lets the page's fetches and first redraw finish before the dump */
    const char *common = "--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run "
                         "--window-size=1280,900 --virtual-time-budget=5000";
    snprintf(cmd, sizeof cmd, "'%s' %s --user-data-dir='%s' --dump-dom http://127.0.0.1:%d/dashboard 2>/dev/null",
             chrome, common, profile, port);
    char *dom = slurp_cmd(cmd);
    CHECK(dom && strstr(dom, "dash-test-run"), "the page did not show the run id (its script did not run?):\n%.2000s",
          dom ? dom : "(no output)");
    CHECK(dom && strstr(dom, "class=\"persistent\"") && strstr(dom, "class=\"normal\""),
          "rank rows with their straggler states missing:\n%.3000s", dom ? dom : "");
    CHECK(dom && strstr(dom, "rebalance") && strstr(dom, "imbalanced over the last 3 steps"), "the action is not listed");
    CHECK(dom && strstr(dom, "<path d=\"M"), "no loss curve drawn");
    CHECK(dom && strstr(dom, "straggler policy <b>nd</b>"), "policy not shown");
    free(dom);
    snprintf(cmd, sizeof cmd, "'%s' %s --user-data-dir='%s' --screenshot='%s' http://127.0.0.1:%d/dashboard "
             ">/dev/null 2>&1", chrome, common, profile, shot, port);
    int rc = system(cmd);
    FILE *f = fopen(shot, "rb");
    long size = 0;
    if (f) fseek(f, 0, SEEK_END), size = ftell(f), fclose(f);
    CHECK(rc == 0 && size > 10000, "screenshot: exit %d, %ld bytes at %s", rc, size, shot);
    if (size > 0) printf("dashboard screenshot: %s\n", shot);
    adt_master_free(m);
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", profile);
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", profile);
}

int main(void) {
    if (check_tmpdir_make("dashboard")) return 1;
    RUN(test_endpoints);
    RUN(test_nd_restart_in_a_world);
    RUN(test_idle_replicas);
    RUN(test_run_steps);
    RUN(test_page_in_chromium);
    /* the temp directory stays: it holds the screenshot */
    return check_finish();
}
