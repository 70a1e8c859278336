/*
 * test_master_restart.c - a master restarted on its job directory learns again what it had
 * acknowledged and not yet written: in-process masters driven through their HTTP handler
 * (adt_master_handle), two agents played by this test.
 *
 * The case it guards: the world of generation 1 runs on agents n0 and n1. n0's world ends (every
 * rank exited 0) and n0 reports it; the master acknowledges and is killed before anything makes it
 * save. A new master on the same directory must still end the job once n1's world ends too: n0
 * says it again in its heartbeat's world state (world_ok), since its event was acknowledged and
 * will not be sent again. A master that forgot it would wait for n0 forever.
 */
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "adtrain/base.h"
#include "adtrain/elastic.h"
#include "adtrain/ledger.h"

static int call(adt_master *m, const char *method, const char *path, const char *body, char **out) {
    adt_http_request rq = {.method = method, .path = path, .body = body, .body_len = body ? strlen(body) : 0};
    adt_http_reply rp;
    adt_master_handle(m, &rq, &rp);
    *out = rp.body;
    return rp.status;
}

static adt_master *master_on(const char *dir) {
    adt_master *m = NULL;
    adt_master_config cfg = {.job_dir = dir, .listen = "127.0.0.1:0", .max_wait_ms = -1, .join_wait_s = -1,
                             .nnodes_min = 2, .heartbeat_s = 60, .ledger_flags = ADT_LEDGER_NOSYNC};
    if (adt_master_create(&m, &cfg) || adt_master_start(m)) {
        CHECK(0, "master on %s: %s", dir, adt_error_message());
        adt_master_free(m);
        return NULL;
    }
    return m;
}

static long register_agent(adt_master *m, const char *node) {
    char body[200], *out = NULL;
    snprintf(body, sizeof body, "{\"node\":\"%s\",\"host\":\"h\",\"slots\":1,\"pid\":%d}", node, (int)getpid());
    int st = call(m, "POST", "/v1/agents", body, &out);
    const char *id = out ? strstr(out, "\"agent\":") : NULL;
    long agent = id ? strtol(id + 8, NULL, 10) : -1;
    CHECK(st == 200 && agent >= 0, "register %s: %d %s", node, st, out ? out : "");
    free(out);
    return agent;
}

/* The agent's world state as every message carries it (agent_main.c: add_world_state). */
static int post(adt_master *m, const char *path, long agent, int seq, int running, int world_ok, const char *event) {
    char body[400], *out = NULL;
    int k = snprintf(body, sizeof body, "{\"agent\":%ld,\"seq\":%d,\"pid\":%d,\"generation\":1,\"running\":%d,"
                                        "\"world_ok\":%d,\"pids\":[]",
                     agent, seq, (int)getpid(), running, world_ok);
    if (event) k += snprintf(body + k, sizeof body - (size_t)k, ",\"kind\":\"%s\",\"ok\":1", event);
    snprintf(body + k, sizeof body - (size_t)k, "}");
    int st = call(m, "POST", path, body, &out);
    CHECK(st == 200, "%s from agent %ld: %d %s", path, agent, st, out ? out : "");
    free(out);
    return st;
}

static int job_state_is(adt_master *m, const char *state) {
    char *out = NULL, want[64];
    snprintf(want, sizeof want, "\"state\":\"%s\"", state);
    int ok = call(m, "GET", "/v1/job", NULL, &out) == 200 && out && strstr(out, want);
    free(out);
    return ok;
}

static void test_acknowledged_world_end_survives_restart(void) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s", check_tmp_path("restart"));
    adt_master *m = master_on(dir);
    if (!m) return;
    long a0 = register_agent(m, "n0"), a1 = register_agent(m, "n1");
    char *out = NULL;
    CHECK(call(m, "GET", "/v1/job", NULL, &out) == 200 && out && strstr(out, "\"generation\":1"),
          "generation 1 did not form on two agents: %s", out ? out : "");
    free(out);
    post(m, "/v1/agents/event", a0, 1, 1, 0, "started");
    post(m, "/v1/agents/event", a1, 1, 1, 0, "started");
    post(m, "/v1/agents/event", a0, 2, 0, 1, "world_done"); /* acknowledged ... */
    CHECK(job_state_is(m, "running"), "one world of two ended: the job is not done yet");
    adt_master_free(m); /* ... and the master is gone */

    m = master_on(dir);
    if (!m) return;
    /* n0 has nothing left to send but heartbeats; n1's world ends now */
    post(m, "/v1/agents/heartbeat", a0, 3, 0, 1, NULL);
    CHECK(job_state_is(m, "running"), "n1's world still runs");
    post(m, "/v1/agents/event", a1, 2, 0, 1, "world_done");
    CHECK(job_state_is(m, "done"), "both worlds ended with every rank exiting 0, yet the restarted master "
                                   "does not end the job");
    adt_master_free(m);

    /* the same, n1's end first and n0's heartbeat last: the heartbeat ends the job */
    snprintf(dir, sizeof dir, "%s", check_tmp_path("restart2"));
    m = master_on(dir);
    if (!m) return;
    a0 = register_agent(m, "n0"), a1 = register_agent(m, "n1");
    post(m, "/v1/agents/event", a0, 1, 1, 0, "started");
    post(m, "/v1/agents/event", a1, 1, 1, 0, "started");
    post(m, "/v1/agents/event", a0, 2, 0, 1, "world_done");
    adt_master_free(m);
    m = master_on(dir);
    if (!m) return;
    post(m, "/v1/agents/event", a1, 2, 0, 1, "world_done");
    CHECK(job_state_is(m, "running"), "n0 has not spoken to this master yet");
    post(m, "/v1/agents/heartbeat", a0, 3, 0, 1, NULL);
    CHECK(job_state_is(m, "done"), "n0's heartbeat says its world ended well: the job is done");
    adt_master_free(m);
}

int main(void) {
    if (check_tmpdir_make("master_restart")) return 1;
    RUN(test_acknowledged_world_end_survives_restart);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", check_tmpdir());
    if (system(cmd)) fprintf(stderr, "could not remove %s\n", check_tmpdir());
    return check_finish();
}
